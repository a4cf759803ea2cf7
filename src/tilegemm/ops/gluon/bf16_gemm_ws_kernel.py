"""Gluon warp-specialized BF16 GEMM kernel for Hopper: ``D = A @ B.T``.

A [M, K] and B [N, K] are K-major bf16; D [M, N] bf16 or fp32. The warps as in :mod:`fp8_gemm_ws_kernel`: the
DEFAULT partition holds two MMA warpgroups (8 warps; each owns 64 rows of a 128-row tile, or half the columns of a
64-row one, which doubles the tiles of a short M) and gets the registers
the TMA loader warp gives up (``setmaxnreg``); the loader streams A's and B's ``BLOCK_K``-deep tiles into a
``STAGES``-deep ring (``ready`` / ``empty`` mbarriers). Without block scales there is no promotion: each K block's
wgmma accumulates into the tile's fp32 accumulator, with the previous block's wgmma left in flight
(``num_outstanding=1``) and its stage released once it completes. The grid is persistent: at most one CTA per SM,
each walking the output tiles in a grouped order (``GROUP_M`` row tiles per column sweep, for L2 reuse of B).

``SPLITS`` > 1 (a power of two; 128- and 64-wide tiles): the split tail (:mod:`split_tail`). When the last round of
tiles is short, each of its tiles runs as ``SPLITS`` jobs over a share of the K blocks each, on CTAs that round
would leave idle; the loader loads a job's K blocks only, and a split run's tile leaves through
:func:`split_tail.split_store` (partials in a workspace, summed in split order, stored to D by pointer) instead of
the TMA store. ``SPLITS`` = 1 compiles the kernel without it.

Tiles past M or N are handled by TMA (zero-filled loads, clipped stores), K past the last block is zero-filled. The
host side is :mod:`tilegemm.ops.gluon.bf16_gemm_ws`.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from tilegemm.ops.gluon.split_tail import num_jobs, split_job, split_store, tail_start
from tilegemm.ops.gluon.tiles import store_tile, tile_coords, tile_range, wgmma_layout

BLOCK_K = 64  # 128 bytes of bf16: one 128-byte swizzled row
MMA_WARPS = 8

_BLOCK_K = gl.constexpr(BLOCK_K)


@gluon.jit
def _loader(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M: gl.constexpr, SPLITS: gl.constexpr):
    """The TMA warp: A's and B's tiles of every K block of every output tile of this CTA (``SPLITS`` > 1: of every
    job, a split run's K blocks only)."""
    STAGES: gl.constexpr = a_ring.shape[0]
    TILE_M: gl.constexpr = a_desc.block_type.shape[0]
    TILE_N: gl.constexpr = b_desc.block_type.shape[0]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    first, num_tiles, step, num_m, num_n = tile_range(M, N, 1, TILE_M, TILE_N, True)
    num_k = gl.cdiv(K, _BLOCK_K)
    jobs = num_tiles
    if SPLITS > 1:
        full = tail_start(num_tiles, step, SPLITS)
        jobs = num_jobs(num_tiles, step, SPLITS)
    it = 0
    for job in range(first, jobs, step):
        tile = job
        kb0 = 0
        tile_k = num_k
        if SPLITS > 1:
            tile, _, kb0, tile_k = split_job(job, full, num_k, SPLITS)
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        for kb in range(kb0, kb0 + tile_k):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(a_desc, [pm * TILE_M, kb * _BLOCK_K], bar, a_ring.index(s))
            tma.async_copy_global_to_shared(b_desc, [pn * TILE_N, kb * _BLOCK_K], bar, b_ring.index(s))
            it += 1


@gluon.jit
def _mma_partition(
    a_ring, b_ring, ready, empty, d_desc, out, tail, M, N, K, GROUP_M: gl.constexpr, SPLITS: gl.constexpr
):
    """The two MMA warpgroups: every output tile of this CTA, each K block's wgmma accumulating under the previous
    one's completion, the tile stored through ``out`` by TMA. A 256-wide tile is two 128-wide halves: two
    accumulators, two wgmma a K block on the same A stage, each half stored through a 128-wide ``out``.
    ``SPLITS`` > 1: every job, a split run's K blocks only, its tile stored by :func:`split_store` with ``tail``
    (``d_ptr, d_stride, work_ptr, counter_ptr``)."""
    STAGES: gl.constexpr = a_ring.shape[0]
    TILE_M: gl.constexpr = a_ring.shape[1]
    TILE_N: gl.constexpr = b_ring.shape[1]
    SUB_N: gl.constexpr = d_desc.block_type.shape[1]
    acc_l: gl.constexpr = wgmma_layout(TILE_M, SUB_N, gl.num_warps(), 16)
    first, num_tiles, step, num_m, num_n = tile_range(M, N, 1, TILE_M, TILE_N, True)
    num_k = gl.cdiv(K, _BLOCK_K)
    jobs = num_tiles
    if SPLITS > 1:
        d_ptr, d_stride, work_ptr, counter_ptr = tail
        full = tail_start(num_tiles, step, SPLITS)
        jobs = num_jobs(num_tiles, step, SPLITS)
    it = 0
    for job in range(first, jobs, step):
        tile = job
        tile_k = num_k
        if SPLITS > 1:
            tile, split, _, tile_k = split_job(job, full, num_k, SPLITS)
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        acc = gl.zeros([TILE_M, SUB_N], gl.float32, acc_l)
        acc_hi = gl.zeros([TILE_M, SUB_N], gl.float32, acc_l)
        for kb in range(tile_k):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            a = a_ring.index(s)
            b = b_ring.index(s)
            if TILE_N == SUB_N:
                acc = warpgroup_mma(a, b.permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            else:
                acc = warpgroup_mma(a, b.slice(0, SUB_N).permute((1, 0)), acc, is_async=True)
                acc_hi = warpgroup_mma(a, b.slice(SUB_N, SUB_N).permute((1, 0)), acc_hi, is_async=True)
                acc, acc_hi = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_hi))
            if kb > 0:  # the previous block's wgmma is complete: its stage may be refilled
                mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
            it += 1
        if TILE_N == SUB_N:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        else:
            acc, acc_hi = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_hi))
        if tile_k > 0:
            mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
        if SPLITS > 1:
            row = pm * TILE_M
            col = pn * TILE_N
            if tile >= full:
                split_store(acc, d_ptr, d_stride, work_ptr, counter_ptr, tile - full, split, row, col, M, N, SPLITS)
            else:
                store_tile(acc, d_desc, out, row, col)
        else:
            store_tile(acc, d_desc, out, pm * TILE_M, pn * TILE_N)
            if TILE_N != SUB_N:
                store_tile(acc_hi, d_desc, out, pm * TILE_M, pn * TILE_N + SUB_N)
    tma.store_wait(pendings=0)


@gluon.jit
def bf16_gemm_ws_kernel(
    a_desc,
    b_desc,
    d_desc,
    M,
    N,
    K,
    d_ptr,
    work_ptr,
    counter_ptr,
    d_stride,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    SPLITS: gl.constexpr,
):
    """Warp-specialized BF16 GEMM (see the module docstring); launch with ``num_warps=8`` and a persistent grid.
    The descriptors' boxes: A [TILE_M, 64], B [TILE_N, 64], D [TILE_M, min(TILE_N, 128)] (``TILE_M`` 64 or 128,
    ``TILE_N`` 64, 128 or 256: a 256-wide tile is stored as two 128-wide halves).

    ``SPLITS`` (1, 2, 4, 8 or 16; above 1 for 64- and 128-wide tiles): the split tail (:mod:`split_tail`), which
    stores its tiles through ``d_ptr`` (D, row pitch ``d_stride`` elements) and uses the plan's ``work_ptr``
    (fp32 workspace) and ``counter_ptr`` (int32 counters, zero between launches); with ``SPLITS`` 1 none of the
    four is read. The grid: one CTA per job (:func:`split_tail.split_grid`), at most one per SM."""
    TILE_M: gl.constexpr = a_desc.block_type.shape[0]
    TILE_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(TILE_M == 64 or TILE_M == 128, "TILE_M 64 or 128")
    gl.static_assert(TILE_N == 64 or TILE_N == 128 or TILE_N == 256, "TILE_N 64, 128 or 256")
    gl.static_assert(d_desc.block_type.shape[1] == TILE_N or (TILE_N == 256 and d_desc.block_type.shape[1] == 128))
    gl.static_assert(
        SPLITS == 1 or SPLITS == 2 or SPLITS == 4 or SPLITS == 8 or SPLITS == 16, "SPLITS 1, 2, 4, 8 or 16"
    )
    gl.static_assert(SPLITS == 1 or TILE_N <= 128, "the split tail: 64- and 128-wide tiles")
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    out = gl.allocate_shared_memory(d_desc.dtype, d_desc.block_type.shape, d_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    tail = (d_ptr, d_stride, work_ptr, counter_ptr)  # the split tail's epilogue
    gl.warp_specialize(
        [
            (_mma_partition, (a_ring, b_ring, ready, empty, d_desc, out, tail, M, N, K, GROUP_M, SPLITS)),
            (_loader, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, SPLITS)),
        ],
        [1],
        [LOADER_REGS],
    )
