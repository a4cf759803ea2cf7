"""cuTile ``tf32_hc_prenorm_gemm``: ``d = a @ tf32(b).T`` and ``sqr_sum = sum_k a^2`` in one pass over ``a``.

One kernel, DeepGEMM's scheme: a unit is (K split, 64-row block, column block); it walks its split's K blocks,
feeding the bf16 ``a`` tile (exact in TF32) and the fp32 ``b`` tile rounded to TF32 (to nearest, ties away
from zero: the reference's rounding) to the tensor cores with fp32 accumulation, and accumulating ``a * a``
elementwise in fp32 beside them (summed over the tile's columns once, at the end). Split ``s`` writes
``d[s]`` and ``sqr_sum[s]``; without ``num_splits`` there is one split, written to ``d`` / ``sqr_sum``.

Splits: the ``cdiv(K, 64)`` K blocks are shared as evenly as possible, the first ``blocks % splits`` splits
taking one more (DeepGEMM's split points; the op defines only the sum over splits). A split without blocks
writes zeros. ``N`` is covered by column blocks of 16 or 32; the squared sums are stored by the units
of the first column block.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.tile as ct

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.ops.cutile import launch
from tilegemm.ops.cutile.einsum import check_sizes

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO
_RA = ct.RoundingMode.RA

#: Rows and K per tile (DeepGEMM's 64 x 64); columns: :func:`tile_n`.
TM = 64
TK = 64
#: Column tiles the kernel is compiled for (the CPU gate compiles each); 64 spills on sm_90.
TILE_NS = (16, 32)
#: Grid: up to this many CTAs per SM walk the units (the loads of one CTA leave the SM idle between them).
CTAS_PER_SM = 2


def tile_n(n: int) -> int:
    """The column tile for ``n`` columns: the smallest of :data:`TILE_NS` covering ``n``, else the largest."""
    for tn in TILE_NS:
        if n <= tn:
            return tn
    return TILE_NS[-1]


def split_blocks(blocks: int, splits: int) -> tuple[int, int]:
    """``(per, rem)``: split ``s`` takes ``per + (s < rem)`` K blocks starting at ``s * per + min(s, rem)``."""
    return divmod(blocks, splits)


def _tf32_hc_prenorm_gemm_body(A, B, D, SQ, splits: int, per: int, rem: int, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    """A bf16 ``[M, K]``, B fp32 ``[N, K]``; D fp32 ``[splits, M, N]``, SQ fp32 ``[splits, M]`` (see module doc)."""
    num_m = ct.cdiv(A.shape[0], TM)
    num_n = ct.cdiv(B.shape[0], TN)
    units = splits * num_m * num_n
    for u in range(ct.bid(0), units, ct.num_blocks(0)):
        sp = u % splits
        rest = u // splits
        pm = rest % num_m
        pn = rest // num_m
        kb0 = sp * per + ct.minimum(sp, rem)
        kb1 = kb0 + per
        if sp < rem:
            kb1 = kb1 + 1
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        sq = ct.zeros((TM, TK), dtype=ct.float32)
        for kb in range(kb0, kb1):
            a = ct.astype(ct.load(A, (pm, kb), (TM, TK), padding_mode=_ZERO), ct.float32)
            sq = sq + a * a
            b = ct.load(B, (kb, pn), (TK, TN), order=(1, 0), padding_mode=_ZERO)
            acc = ct.mma(ct.astype(a, ct.tfloat32), ct.astype(b, ct.tfloat32, rounding_mode=_RA), acc)
        ct.store(D, (sp, pm, pn), ct.reshape(acc, (1, TM, TN)))
        if pn == 0:
            ct.store(SQ, (sp, pm), ct.reshape(ct.sum(sq, axis=1), (1, TM)))


@functools.cache
def get_kernel() -> Any:
    """The ``@ct.kernel`` of the pre-norm GEMM."""
    return ct.kernel(_tf32_hc_prenorm_gemm_body)


def kernel_constants(n: int) -> list[Any]:
    """The ``ct.Constant`` arguments for ``n`` columns, in parameter order."""
    return launch.trailing(_tf32_hc_prenorm_gemm_body, TM=TM, TN=tile_n(n), TK=TK)


@register_impl("tf32_hc_prenorm_gemm", "cutile")
def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits, stream):
    """cuTile pre-norm GEMM (see the module docstring); ``d`` / ``sqr_sum`` per split with ``num_splits``."""
    m, k = a.shape
    n = b.shape[0]
    if m == 0:
        return d
    if n == 0:
        raise Unsupported("tf32_hc_prenorm_gemm with N == 0 (no GEMM, only the squared sums)")
    check_sizes(a, b, d)
    splits = 1 if num_splits is None else num_splits
    d3 = d if num_splits is not None else d.unsqueeze(0)
    sq2 = sqr_sum if num_splits is not None else sqr_sum.unsqueeze(0)
    per, rem = split_blocks(launch.cdiv(k, TK), splits)
    consts = kernel_constants(n)
    units = splits * launch.cdiv(m, TM) * launch.cdiv(n, consts[1])
    grid = launch.persistent_grid(units, CTAS_PER_SM)
    a, b = launch.as_row_major(a), launch.as_row_major(b)
    launch.launch(get_kernel(), grid, (a, b, d3, sq2, splits, per, rem, *consts), stream)
    return d
