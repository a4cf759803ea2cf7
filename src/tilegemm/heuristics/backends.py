"""The automatic backend choice: which backend runs a call when the user has chosen none.

One rule per op family, each from the committed measurements; an op without a rule (or a call its rule
does not claim) runs on :func:`tilegemm.backend.selector.default_backend` (``cutile``, else ``pytorch``).
A backend chosen here still falls back to ``pytorch`` with a warning if it raises ``Unsupported``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from tilegemm import config
from tilegemm.backend import selector
from tilegemm.heuristics import gluon
from tilegemm.ops import operands


def _dense_fp8(arguments: dict[str, Any]) -> str | None:
    """Hopper dense FP8 GEMMs go to ``gluon`` where :func:`gluon.prefers_dense_fp8` says it is faster."""
    d = arguments["d"]
    if not d.is_cuda or selector.gluon_unavailable_reason() is not None:
        return None
    if d.dtype not in (torch.bfloat16, torch.float32) or not operands.tma_ready(d):
        return None
    (a_data, _), (b_data, _) = arguments["a"], arguments["b"]
    m, k = a_data.shape
    if gluon.prefers_dense_fp8(m, b_data.shape[0], k, config.get_num_sms()):
        return "gluon"
    return None


_RULES: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "fp8_fp4_gemm_nt": _dense_fp8,
    "fp8_fp4_gemm_nn": _dense_fp8,
    "fp8_fp4_gemm_tn": _dense_fp8,
    "fp8_fp4_gemm_tt": _dense_fp8,
}


class ReferenceOnGpuWarning(UserWarning):
    """Issued once per process when the automatic choice runs a call on CUDA tensors with the reference backend."""


_warned_reference_on_gpu = False


def _on_cuda(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    return isinstance(value, (tuple, list)) and any(_on_cuda(v) for v in value)


def _warn_reference_on_gpu(op: str, arguments: dict[str, Any]) -> None:
    """Say once, naming the reason and the fix, that CUDA tensors are about to run on the exact fp32 reference."""
    global _warned_reference_on_gpu
    if _warned_reference_on_gpu or not any(_on_cuda(v) for v in arguments.values()):
        return
    _warned_reference_on_gpu = True
    warnings.warn(
        f"tilegemm.{op}: CUDA tensors run on the pytorch reference backend (exact, slow) because cutile is "
        f"unavailable: {selector.cutile_unavailable_reason()}. Install the kernels with "
        '`pip install "tilegemm[cutile]"` (cuda-tile[tileiras]), or choose a backend with '
        "tilegemm.set_backend(...) to silence this.",
        ReferenceOnGpuWarning,
        stacklevel=5,
    )


def choose_backend(op: str, arguments: dict[str, Any]) -> str:
    """The backend that runs op ``op`` on ``arguments`` (what its check derived) under the automatic choice.

    When that is the ``pytorch`` reference for a call on CUDA tensors (no GPU backend can run here), a
    :class:`ReferenceOnGpuWarning` says so once per process, with the reason and the fix.
    """
    rule = _RULES.get(op)
    picked = rule(arguments) if rule is not None else None
    if picked is not None:
        return picked
    default = selector.default_backend()
    if default == "pytorch":
        _warn_reference_on_gpu(op, arguments)
    return default
