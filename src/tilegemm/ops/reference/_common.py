"""Shared pieces of the ``pytorch`` backend: exact fp32 matmul, scale expansion, the epilogue."""

from __future__ import annotations

import torch

#: K elements per FP8 scale (1x128 LHS scales, 128x128 or 1x128 RHS scales).
SCALE_K = 128
#: Rows/columns per 128x128 RHS scale block.
SCALE_MN = 128
#: Budget (bytes) for the temporaries of one chunk of a chunked reference computation.
CHUNK_BYTES = 256 * 1024 * 1024


def _cuda_tf32_enabled() -> bool:
    """Whether cuBLAS may round fp32 matmul inputs to TF32 (set by the user, e.g. for training)."""
    try:
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    except (AttributeError, RuntimeError):  # older torch without the fp32_precision API
        return bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))


def exact_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x @ y`` for fp32 ``x``/``y`` (batched allowed), with full fp32 products.

    On CUDA with TF32 enabled (a process-wide user setting) the product is taken in float64
    and rounded to fp32 instead, so the reference never silently drops to TF32 precision.
    """
    if x.is_cuda and _cuda_tf32_enabled():
        return torch.matmul(x.double(), y.double()).float()
    return torch.matmul(x, y)


def exact_einsum(expr: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``torch.einsum(expr, x, y)`` of fp32 inputs with full fp32 products (float64 where TF32 is enabled)."""
    if x.is_cuda and _cuda_tf32_enabled():
        return torch.einsum(expr, x.double(), y.double()).float()
    return torch.einsum(expr, x, y)


def expand_scales(sf: torch.Tensor, rows: int, cols: int, gran_rows: int, gran_cols: int) -> torch.Tensor:
    """Broadcast per-block scales ``[..., ceil(rows/gran_rows), ceil(cols/gran_cols)]`` to ``[..., rows, cols]``.

    Returns fp32. ``gran_rows``/``gran_cols`` of 1 means one scale per row/column.
    """
    out = sf.float()
    if gran_rows != 1:
        out = out.repeat_interleave(gran_rows, dim=-2)
    if gran_cols != 1:
        out = out.repeat_interleave(gran_cols, dim=-1)
    return out[..., :rows, :cols]


def dequant(data: torch.Tensor, sf: torch.Tensor, gran_rows: int, gran_cols: int = SCALE_K) -> torch.Tensor:
    """Dequantize FP8 ``data [..., R, C]`` with block scales ``sf [..., ceil(R/gran_rows), ceil(C/gran_cols)]``.

    Returns fp32 ``data * scale`` (the scale of element (r, c) is ``sf[r // gran_rows, c // gran_cols]``).
    """
    rows, cols = data.shape[-2], data.shape[-1]
    return data.float() * expand_scales(sf, rows, cols, gran_rows, gran_cols)


def epilogue(d: torch.Tensor, acc: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float) -> torch.Tensor:
    """Write ``alpha * acc + beta * c`` (fp32) into ``d``, rounding once; ``c`` is not read when ``beta == 0``.

    ``acc`` must be a fresh fp32 tensor (it is scaled in place); ``c`` may alias ``d`` because the
    full result exists before ``d`` is written.
    """
    if alpha != 1.0:
        acc.mul_(alpha)
    if c is not None and beta != 0:
        acc.add_(c.float(), alpha=beta)
    d.copy_(acc)
    return d


def chunk_count(total: int, bytes_per_item: int, budget: int | None = None) -> int:
    """Items per chunk so that ``items * bytes_per_item`` stays within ``budget`` (at least 1).

    ``budget`` defaults to the module's ``CHUNK_BYTES`` at call time (tests lower it to force chunking).
    """
    if budget is None:
        budget = CHUNK_BYTES
    if total <= 0:
        return 1
    return max(1, min(total, budget // max(1, bytes_per_item)))
