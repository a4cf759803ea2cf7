"""RMSNorm: ``tilegemm.rms_norm(x, w, eps)`` over the rows of the MoE models it is patched into.

Rows x H: H = 128 (Qwen3's per-head q/k norms), 2048 (Qwen3-30B-A3B's hidden size), 1536 (DeepSeek-V3's q LoRA
rank), 7168 (DeepSeek-V3's hidden size); rows from one decode token to a 16384-token prefill. bf16 rows and
weight, eps 1e-6. Peers: ``transformers`` (the stock module's forward: ``Qwen3MoeRMSNorm``, eight torch kernels)
and ``torch_rms_norm`` (``torch.nn.functional.rms_norm``, fused in torch on CUDA; it applies the weight before
its one rounding, so it is not the stock module's math, a few bf16 steps apart). The float64 check repeats the
stock module's two roundings.
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.bench import inputs, timing
from tilegemm.bench.core import Built, Case, Impl, diff_check

FAMILY = "norm"
HIDDEN = (128, 2048, 1536, 7168)
ROWS = (1, 32, 512, 4096, 16384)
QUICK = [(32, 2048), (4096, 2048)]
EPS = 1e-6


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: ``{"dtype", "rows", "hidden"}``."""
    shapes = list(QUICK)
    if size != "quick":
        shapes += [(r, h) for h in HIDDEN for r in ROWS if (r, h) not in QUICK]
    return [{"dtype": "bf16", "rows": r, "hidden": h} for r, h in shapes]


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec (no DeepGEMM peer: DeepGEMM has no norm)."""
    rows, h = spec["rows"], spec["hidden"]
    nbytes = 2.0 * (2 * rows * h + h)  # read x and w, write y (bf16)
    shape = {"rows": rows, "hidden": h}
    return Case(FAMILY, "rms_norm", "bf16", shape, 4.0 * rows * h, nbytes, lambda: _build(rows, h))


def stock_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``Qwen3MoeRMSNorm.forward`` (and its copies in the other families), line by line."""
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def _build(rows: int, h: int) -> Built:
    import tilegemm
    from tilegemm.testing import rms_norm_float64

    seed = inputs.seed_of("norm", rows, h)
    w = 1 + 0.1 * inputs.randn((h,), torch.float32, seed - 1)
    w = w.to(torch.bfloat16)
    sets = [(inputs.randn((rows, h), torch.bfloat16, seed + i), w) for i in range(timing.rotation_count(4 * rows * h))]
    impls = [
        Impl("tilegemm", sets, lambda x, weight: tilegemm.rms_norm(x, weight, EPS)),
        Impl("transformers", sets, lambda x, weight: stock_rms_norm(x, weight, EPS), note="Qwen3MoeRMSNorm.forward"),
        Impl(
            "torch_rms_norm",
            sets,
            lambda x, weight: torch.nn.functional.rms_norm(x, (h,), weight, EPS),
            note="F.rms_norm: weight applied before its one rounding",
        ),
    ]
    x0 = sets[0][0]
    return Built(impls, diff_check(lambda: rms_norm_float64(x0, w, EPS)))
