"""A transposing copy of one-byte (FP8) matrices on the GPU: ``transposed(x) == x.t().contiguous()``.

FP8 wgmma reads K-major tiles only, so an MN-major FP8 operand (the ``tn`` k-grouped op's A [K_sum, M] and B
[K_sum, N]) is transposed once before the GEMM. torch's copy of a transposed one-byte view moves a byte per
access; this kernel moves 16 bytes per thread each way: a CTA loads a [128, 128] tile with each thread's 16
bytes along the source rows, the layout conversion (through shared memory) gives each thread 16 bytes along the
destination rows, and it stores them. Edges are masked.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.operands import cdiv

TILE = 128  # rows and columns of one CTA's tile
WARPS = 4


@gluon.jit
def transpose_kernel(src, dst, rows, cols, TILE: gl.constexpr):
    """``dst[c, r] = src[r, c]`` for the [TILE, TILE] tile (``program_id`` 0: row tiles, 1: column tiles) of
    row-major uint8 ``src`` [rows, cols] into row-major ``dst`` [cols, rows]."""
    along_cols: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [gl.num_warps(), 1], [1, 0])
    along_rows: gl.constexpr = gl.BlockedLayout([16, 1], [8, 4], [1, gl.num_warps()], [0, 1])
    r = gl.program_id(0) * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, along_cols))
    c = gl.program_id(1) * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(0, along_cols))
    inside = (r < rows)[:, None] & (c < cols)[None, :]
    tile = gl.load(src + r.to(gl.int64)[:, None] * cols + c[None, :], mask=inside)
    tile = gl.convert_layout(tile, along_rows)
    r = gl.program_id(0) * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, along_rows))
    c = gl.program_id(1) * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(0, along_rows))
    inside = (r < rows)[:, None] & (c < cols)[None, :]
    gl.store(dst + c.to(gl.int64)[None, :] * rows + r[:, None], tile, mask=inside)


def transposed(x: torch.Tensor) -> torch.Tensor:
    """``x.t().contiguous()`` for a 2-D tensor of one-byte elements (FP8) on a Hopper GPU: [R, C] -> [C, R]
    row-major. ``x`` is read row-major (made contiguous first when it is not); off the GPU, torch's copy."""
    if x.dim() != 2 or x.element_size() != 1:
        raise ValueError(f"transposed: a 2-D tensor of one-byte elements, got {x.dtype} {tuple(x.shape)}")
    if not x.is_cuda:  # off the GPU (the host path's tests): torch's copy
        return x.t().contiguous()
    rows, cols = x.shape
    out = torch.empty(cols, rows, dtype=x.dtype, device=x.device)
    if x.numel():
        src = x.contiguous().view(torch.uint8)
        grid = (cdiv(rows, TILE), cdiv(cols, TILE))
        transpose_kernel[grid](src, out.view(torch.uint8), rows, cols, TILE, num_warps=WARPS, **COMPILE_OPTIONS)
    return out
