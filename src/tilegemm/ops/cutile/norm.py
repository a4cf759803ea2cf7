"""cuTile ``rms_norm``: transformers' RMSNorm in one kernel, one pass over the rows.

``y = w * round(x * rsqrt(mean(x^2) + eps))``: a CTA loads ``rows`` whole rows as one fp32 tile (zero-padded
to ``cols``, a power of two), sums their squares, scales by ``rsqrt(sum * (1 / H) + eps)`` (fp32, the
mean as ``torch.mean`` forms it), rounds to ``x``'s dtype, multiplies by the weight in fp32 and rounds once to
the output dtype (``torch.promote_types(x.dtype, w.dtype)``), the steps and roundings of the stock module
(``Qwen3MoeRMSNorm`` and its copies), so only the order of the squares' sum differs from it.

Config choice: :func:`tilegemm.heuristics.cutile.rms_norm_config`.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.cutile import launch

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO


def _rms_norm_body(X, W, Y, eps: float, inv_h: float, ROWS: ConstInt, COLS: ConstInt):
    """X [R, H] (any float dtype, unit column stride), W [H], Y [R, H]: one ``[ROWS, COLS]`` tile per CTA."""
    pr = ct.bid(0)
    x = ct.astype(ct.load(X, (pr, 0), (ROWS, COLS), padding_mode=_ZERO), ct.float32)
    r = ct.rsqrt(ct.sum(x * x, axis=1, keepdims=True) * inv_h + eps)
    n = ct.astype(ct.astype(x * r, X.dtype), ct.float32)
    w = ct.astype(ct.load(W, (0,), (COLS,), padding_mode=_ZERO), ct.float32)
    ct.store(Y, (pr, 0), ct.astype(n * ct.reshape(w, (1, COLS)), Y.dtype))


@functools.cache
def get_kernel() -> Any:
    """The ``@ct.kernel`` of the RMSNorm (occupancy hint :data:`~tilegemm.heuristics.cutile.NORM_OCCUPANCY`)."""
    return ct.kernel(_rms_norm_body, occupancy=heuristics.NORM_OCCUPANCY)


def kernel_constants(cfg: heuristics.NormConfig) -> list[Any]:
    """The ``ct.Constant`` arguments of ``cfg``, in parameter order."""
    return launch.trailing(_rms_norm_body, ROWS=cfg.rows, COLS=cfg.cols)


@register_impl("rms_norm", "cutile")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, stream) -> torch.Tensor:
    """cuTile RMSNorm over the last dimension of ``x`` (see the module docstring)."""
    h = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if out.numel() == 0:
        return out
    cfg = heuristics.rms_norm_config(h)
    if cfg is None:
        raise Unsupported(f"rms_norm with rows of {h} elements (the kernel holds at most {heuristics.NORM_MAX_COLS})")
    heuristics.print_once("rms_norm", (x.numel() // h, h), cfg)
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    args = (x2, weight.contiguous(), out.view(-1, h), float(eps), 1.0 / h, *kernel_constants(cfg))
    launch.launch(get_kernel(), (launch.cdiv(x2.shape[0], cfg.rows), 1, 1), args, stream)
    return out
