"""The peers tilegemm is measured against, in the same process: cuBLAS through torch, and the real DeepGEMM.

DeepGEMM is found by :func:`load_deepgemm`: ``--deepgemm auto`` (default) uses it when it imports,
``off`` never, a path names the folder holding DeepGEMM's ``peer.py`` loader (on the GPU machine
``.devbundle/deepgemm``, built by ``.devbundle/deepgemm/build.sh``); ``TILEGEMM_BENCH_DEEPGEMM`` sets
the same. A peer that cannot run a row is recorded with the reason, never silently dropped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: Where ``auto`` looks for DeepGEMM's loader (``peer.py``), relative to the working directory.
DEFAULT_DEEPGEMM_DIRS = (".devbundle/deepgemm",)

_DG: dict[str, Any] = {}


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def load_deepgemm(mode: str = "auto") -> tuple[Any | None, str]:
    """Import the real DeepGEMM; returns ``(module, description)`` or ``(None, why not)``.

    Args:
        mode: ``"off"``; ``"auto"`` (``$TILEGEMM_BENCH_DEEPGEMM`` if set, else the default loader
            folders, else an installed ``deep_gemm`` package); or a folder holding ``peer.py``.
    """
    mode = os.environ.get("TILEGEMM_BENCH_DEEPGEMM", mode) if mode == "auto" else mode
    if mode == "off":
        return None, "disabled (--deepgemm off)"
    if mode in _DG:
        return _DG[mode]
    dirs = DEFAULT_DEEPGEMM_DIRS if mode == "auto" else (mode,)
    result: tuple[Any | None, str] = (None, "not found (build it with .devbundle/deepgemm/build.sh)")
    for folder in dirs:
        if not (Path(folder) / "peer.py").is_file():
            continue
        try:
            sys.path.insert(0, str(Path(folder).resolve()))
            import peer  # the loader shipped next to DeepGEMM's build

            dg = peer.setup()
            result = (dg, f"deep_gemm {getattr(dg, '__version__', '?')} from {os.path.dirname(dg.__file__)}")
        except Exception as exc:
            result = (None, f"import failed: {_short(exc)}")
        break
    else:
        if mode == "auto":
            try:
                import deep_gemm as dg

                if hasattr(dg, "m_grouped_bf16_gemm_nt_masked") and "tilegemm" not in (dg.__file__ or ""):
                    result = (dg, f"deep_gemm {getattr(dg, '__version__', '?')} from {os.path.dirname(dg.__file__)}")
            except Exception:
                pass
    _DG[mode] = result
    return result


def casts_note(same: bool) -> str | None:
    """The note of a DeepGEMM row: ``None`` when DeepGEMM's own casts gave tilegemm's FP8 inputs (``same``)."""
    return None if same else "DeepGEMM's casts differ from tilegemm's; calc_diff is vs tilegemm's inputs"


def writes_d(fn: Callable[..., Any], *extra: Any, c_is_d: bool = False, **kw: Any) -> Callable[..., torch.Tensor]:
    """DeepGEMM's GEMMs return None: ``call(a, b, d, *rest)`` runs ``fn(a, b, d, *rest, *extra, **kw)``
    (with ``c=d`` when ``c_is_d``) and returns ``d``, so its output is checked like tilegemm's."""

    def call(a: Any, b: Any, d: torch.Tensor, *rest: Any) -> torch.Tensor:
        fn(a, b, d, *rest, *extra, **({"c": d, **kw} if c_is_d else kw))
        return d

    return call


def dg_sfa(dg: Any, sfa: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's SM90 LHS-scale layout (MN-major, TMA-aligned), made once outside the timed region."""
    return dg.get_mn_major_tma_aligned_tensor(sfa)


def dg_quant_a(dg: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's own 1x128 cast of ``x [.., M, K]`` -> ``(e4m3, fp32 [.., M, ceil(K/128)])``."""
    if x.dim() == 2:
        return dg.utils.per_token_cast_to_fp8(x, use_ue8m0=False)
    q, s = dg.utils.per_token_cast_to_fp8(x.reshape(-1, x.shape[-1]), use_ue8m0=False)
    return q.view(x.shape), s.view(*x.shape[:-1], -1)


def dg_quant_b(dg: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's own 128x128 cast of ``x [.., N, K]`` -> ``(e4m3, fp32 [.., ceil(N/128), ceil(K/128)])``."""
    if x.dim() == 2:
        return dg.utils.per_block_cast_to_fp8(x, use_ue8m0=False)
    pairs = [dg.utils.per_block_cast_to_fp8(x[i], use_ue8m0=False) for i in range(x.shape[0])]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


# ------------------------------------------------------------------------------------ cuBLAS


def cublas_fp8_blockwise(
    qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype
) -> Callable[[], torch.Tensor] | str:
    """torch's blockwise-scaled FP8 GEMM (cuBLAS) ``qa [M,K] @ qb[N,K].T`` with 1x128 ``sa`` / 128x128 ``sb``.

    Returns a no-argument callable (scales already laid out the way torch wants: ``sa`` MN-major
    ``[M, K/128]``, ``sb`` as ``[round4(K/128), N/128]`` MN-major) or a string saying why this
    torch cannot (no blockwise support, or cuBLAS refuses the shape, e.g. M=1).
    """
    import torch.nn.functional as F

    m, kb = sa.shape
    sa_t = torch.empty_strided((m, kb), (1, m), dtype=torch.float32, device=sa.device)
    sa_t.copy_(sa)
    l4 = -(-kb // 4) * 4
    buf = torch.zeros(sb.shape[0], l4, device=sb.device, dtype=torch.float32)
    buf[:, :kb] = sb
    sb_t = buf.t()
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        ra, rb = F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128

        def call() -> torch.Tensor:
            return F.scaled_mm(qa, qb.t(), sa_t, ra, sb_t, rb, output_dtype=out_dtype)

    else:

        def call() -> torch.Tensor:
            return torch._scaled_mm(qa, qb.t(), scale_a=sa_t, scale_b=sb_t, out_dtype=out_dtype)

    try:
        call()
        torch.cuda.synchronize()
    except Exception as exc:
        return f"cuBLAS blockwise refuses M={m}: {_short(exc)}"
    return call


def mm_fp32_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """``out += a @ b`` for bf16 ``a``/``b`` and fp32 ``out`` (cuBLAS, fp32 accumulate and output where torch can)."""
    try:
        out.add_(torch.mm(a, b, out_dtype=torch.float32))
    except (TypeError, RuntimeError, NotImplementedError):  # no out_dtype= here: bf16 product, then added
        out.add_(torch.mm(a, b).float())
