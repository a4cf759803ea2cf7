"""Gluon warp-specialized BF16 GEMM kernel for Hopper: ``D = A @ B.T``, dense or k-grouped.

Dense: A [M, K] and B [N, K] are K-major bf16; D [M, N] bf16 or fp32. ``K_GROUPED`` (the MoE weight gradient,
``D[g] (+)= A_g.T @ B_g``, DeepGEMM's ``k_grouped_bf16_gemm_tn_contiguous``): A [K_sum, M] and B [K_sum, N] are
read in place, MN-major (a stage holds [BLOCK_K, TILE_M] and [BLOCK_K, TILE_N] boxes and the wgmma reads them
transposed: HGMMA ``.tnspA.tnspB``, no transposing copy); ``group_ptr`` holds the [G + 1] offsets of the groups' K
ranges (multiples of ``BLOCK_K``), D is fp32 [G * M, N] (M a multiple of the tile's rows, so no tile crosses a
group). The walk runs over (group, row tile, column tile), a tile over its group's K blocks; ``ACCUMULATE``: the
tile is added to D by a TMA reduce-add through the staging buffer (:func:`tiles.add_tile`) instead of stored.

The warps as in :mod:`fp8_gemm_ws_kernel`: the DEFAULT partition holds two MMA warpgroups (8 warps; each owns 64 rows of
a 128-row tile, or half the columns of a 64-row one, which doubles the tiles of a short M), or one (``num_warps`` 4)
computing a whole 64-row tile, and gets the registers the TMA loader warp gives up (``setmaxnreg``); the loader streams
A's and B's ``BLOCK_K``-deep tiles into a ``STAGES``-deep ring (``ready`` / ``empty`` mbarriers). Without block scales
there is no promotion: each K block's wgmma accumulates into the tile's fp32 accumulator, with the previous block's
wgmma left in flight (``num_outstanding=1``) and its stage released once it completes. The grid is persistent: at most
one CTA per SM, each walking the output tiles in a grouped order (``GROUP_M`` row tiles per column sweep, for L2 reuse
of B).

``WG_PARTS`` = 2 (128-row tiles, unsplit) makes each MMA warpgroup a partition of its own, as in
:mod:`fp8_gemm_ws_kernel`: the default partition is warpgroup 0 (rows 0-63 of every tile), a 4-warp worker warpgroup 1
(rows 64-127, ``WG1_REGS`` registers); each waits for a stage, runs its wgmma and releases the stage by itself
(``empty`` counts both) and stores its rows through a staging tile of its own. The lockstep partition instead waits
for both warpgroups (a barrier of its 256 threads) before each release.

``SPLITS`` > 1 (a power of two; dense, 128- and 64-wide tiles): the split tail (:mod:`split_tail`). When the last
round of tiles is short, each of its tiles runs as ``SPLITS`` jobs over a share of the K blocks each, on CTAs that
round would leave idle; the loader loads a job's K blocks only, and a split run's partial goes through
:func:`split_tail.split_fixup` (partials in a workspace; the tile's last run sums them in split order and stores the
tile by TMA as any other). ``SPLITS`` = 1 compiles the kernel without it.

A last row tile that would reach past M is moved up to end at M (:func:`tiles.tile_row`: rows past M cost time
in TMA's zero fill) wherever its tiles run alike (:func:`split_tail.runs_alike`: unsplit, or every one split); tiles
past N, and past M otherwise, are handled by TMA (zero-filled loads, clipped stores); K past the last block is
zero-filled. The host side is :mod:`tilegemm.ops.gluon.bf16_gemm_ws`.
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

from tilegemm.heuristics.gluon import BF16_BLOCK_K as BLOCK_K
from tilegemm.ops.gluon.split_tail import job_walk, runs_alike, split_fixup, split_job
from tilegemm.ops.gluon.tiles import (
    add_tile,
    ring_barriers,
    store_tile,
    tile_coords,
    tile_range,
    tile_row,
    tma_load,
    wgmma_layout,
)

MMA_WARPS = 8
#: WG_PARTS 2: the registers of the worker MMA warpgroup (the default one gets what the workers leave)
WG1_REGS = 232
_WG1_REGS = gl.constexpr(WG1_REGS)

_BLOCK_K = gl.constexpr(BLOCK_K)


@gluon.constexpr_function
def _tile_side(shape, k_grouped, lead=0):
    """The tile's rows (columns) of A's (B's) box ``shape[lead:]`` (``lead`` 1: a ring's stage index first):
    [TILE, BLOCK_K] K-major, [BLOCK_K, TILE] k-grouped."""
    return shape[lead + 1] if k_grouped else shape[lead]


@gluon.jit
def _tile_job(job, full, num_m, num_n, group_ptr, K, GROUP_M: gl.constexpr, K_GROUPED: gl.constexpr,
              SPLITS: gl.constexpr):  # fmt: skip
    """What job ``job`` computes: (group, row tile, column tile, first K block, K blocks, split). Dense: group 0,
    every K block of tile ``job``, or with ``SPLITS`` > 1 the tile and K share of :func:`split_tail.split_job` (the
    tail from tile ``full``); k-grouped: the walk's group and its K range ``[group_ptr[g], group_ptr[g + 1])``,
    clamped into ``[0, K]``."""
    tile = job
    if SPLITS > 1:
        tile, split, kb0, tile_k = split_job(job, full, gl.cdiv(K, _BLOCK_K), SPLITS)
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        return 0, pm, pn, kb0, tile_k, split
    elif K_GROUPED:
        per_group = num_m * num_n
        group = tile // per_group
        pm, pn = tile_coords(tile - group * per_group, num_m, num_n, GROUP_M)
        k0 = gl.minimum(gl.maximum(gl.load(group_ptr + group), 0), K)
        k1 = gl.minimum(gl.maximum(gl.load(group_ptr + group + 1), k0), K)
        return group, pm, pn, k0 // _BLOCK_K, (k1 - k0) // _BLOCK_K, 0
    else:
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        return 0, pm, pn, 0, gl.cdiv(K, _BLOCK_K), 0


@gluon.jit
def _loader(a_desc, b_desc, a_ring, b_ring, ready, empty, group_ptr, walks, M, N, K, GROUP_M: gl.constexpr,
            K_GROUPED: gl.constexpr, SPLITS: gl.constexpr):  # fmt: skip
    """The TMA warp: A's and B's tiles of every K block of every output tile of this CTA (k-grouped: the tile's
    group's K blocks, as [BLOCK_K, TILE] boxes of the MN-major operands; ``SPLITS`` > 1: of every job, a split
    run's K blocks only)."""
    STAGES: gl.constexpr = a_ring.shape[0]
    TILE_M: gl.constexpr = _tile_side(a_desc.block_type.shape, K_GROUPED)
    TILE_N: gl.constexpr = _tile_side(b_desc.block_type.shape, K_GROUPED)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    first, num_tiles, step, num_m, num_n = tile_range(M, N, walks, TILE_M, TILE_N, True)
    jobs, full = job_walk(num_tiles, step, SPLITS)
    shift_last = runs_alike(num_tiles, full)
    it = 0
    for job in range(first, jobs, step):
        _, pm, pn, kb0, tile_k, _ = _tile_job(job, full, num_m, num_n, group_ptr, K, GROUP_M, K_GROUPED, SPLITS)
        row = tile_row(pm, TILE_M, M, shift_last)
        for kb in range(kb0, kb0 + tile_k):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            if K_GROUPED:
                tma_load(a_desc, [kb * _BLOCK_K, row], bar, a_ring.index(s))
                tma_load(b_desc, [kb * _BLOCK_K, pn * TILE_N], bar, b_ring.index(s))
            else:
                tma_load(a_desc, [row, kb * _BLOCK_K], bar, a_ring.index(s))
                tma_load(b_desc, [pn * TILE_N, kb * _BLOCK_K], bar, b_ring.index(s))
            it += 1


@gluon.jit
def _operands(a_ring, b_ring, s, K_GROUPED: gl.constexpr, ROW0: gl.constexpr, PART_M: gl.constexpr):
    """Stage ``s``'s A [PART_M, BLOCK_K] (the tile's rows from ``ROW0``) and B [BLOCK_K, TILE_N] as the wgmma reads
    them: K-major tiles as stored (B transposed), k-grouped ones' MN-major boxes (A transposed)."""
    if K_GROUPED:
        a = a_ring.index(s)
        if PART_M != a.shape[1]:
            a = a.slice(ROW0, PART_M, dim=1)
        return a.permute((1, 0)), b_ring.index(s)
    else:
        a = a_ring.index(s)
        if PART_M != a.shape[0]:
            a = a.slice(ROW0, PART_M)
        return a, b_ring.index(s).permute((1, 0))


@gluon.jit
def _mma_partition(a_ring, b_ring, ready, empty, d_desc, outs, tail, group_ptr, walks, M, N, K,
                   GROUP_M: gl.constexpr, K_GROUPED: gl.constexpr, ACCUMULATE: gl.constexpr, SPLITS: gl.constexpr,
                   WG_PARTS: gl.constexpr, WG: gl.constexpr):  # fmt: skip
    """The MMA warpgroups: every output tile of this CTA, each K block's wgmma accumulating under the previous
    one's completion, the tile stored through its staging tile (``outs[WG]``) by TMA. A 256-wide tile is two
    128-wide halves: two accumulators, two wgmma a K block on the same A stage, each half stored through a
    128-wide staging tile. ``WG_PARTS`` 2: this partition is MMA warpgroup ``WG`` alone, the tile's 64 rows from
    ``64 * WG`` (D's box is then 64 rows). k-grouped: the group's rows of D, the tile added to D's by a TMA
    reduce-add when ``ACCUMULATE`` (:func:`add_tile`). ``SPLITS`` > 1: every job, a
    split run's K blocks only, its partial handed to :func:`split_fixup` with ``tail`` (``work_ptr,
    counter_ptr``), which stores the tile in its last run."""
    STAGES: gl.constexpr = a_ring.shape[0]
    TILE_M: gl.constexpr = _tile_side(a_ring.shape, K_GROUPED, 1)
    TILE_N: gl.constexpr = _tile_side(b_ring.shape, K_GROUPED, 1)
    SUB_N: gl.constexpr = d_desc.block_type.shape[1]
    PART_M: gl.constexpr = TILE_M // WG_PARTS  # the tile's rows this partition computes...
    ROW0: gl.constexpr = WG * PART_M  # ... from this one
    acc_l: gl.constexpr = wgmma_layout(PART_M, SUB_N, gl.num_warps(), 16)
    out = outs.index(WG)
    first, num_tiles, step, num_m, num_n = tile_range(M, N, walks, TILE_M, TILE_N, True)
    jobs, full = job_walk(num_tiles, step, SPLITS)
    shift_last = runs_alike(num_tiles, full)
    it = 0
    for job in range(first, jobs, step):
        group, pm, pn, kb0, tile_k, split = _tile_job(job, full, num_m, num_n, group_ptr, K, GROUP_M, K_GROUPED, SPLITS)
        acc = gl.zeros([PART_M, SUB_N], gl.float32, acc_l)
        acc_hi = gl.zeros([PART_M, SUB_N], gl.float32, acc_l)
        for kb in range(tile_k):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            if TILE_N == SUB_N:
                a, b = _operands(a_ring, b_ring, s, K_GROUPED, ROW0, PART_M)
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            else:  # dense only: two 128-wide halves of B's [256, BLOCK_K] stage
                a, _ = _operands(a_ring, b_ring, s, K_GROUPED, ROW0, PART_M)
                b = b_ring.index(s)
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
        row = group * M + tile_row(pm, TILE_M, M, shift_last) + ROW0  # k-grouped: D is [G * M, N]
        if ACCUMULATE:  # k-grouped: one 128-wide half at most, unsplit
            add_tile(acc, d_desc, out, row, pn * TILE_N)
        elif SPLITS > 1:
            work_ptr, counter_ptr = tail
            if job >= full:  # split run of tail tile (job - full) // SPLITS
                slot = (job - full) // SPLITS
                split_fixup(acc, work_ptr, counter_ptr, slot, split, d_desc, out, row, pn * TILE_N, SPLITS)
            else:
                store_tile(acc, d_desc, out, row, pn * TILE_N)
        else:
            store_tile(acc, d_desc, out, row, pn * TILE_N)
            if TILE_N != SUB_N:
                store_tile(acc_hi, d_desc, out, row, pn * TILE_N + SUB_N)
    tma.store_wait(pendings=0)


@gluon.jit
def bf16_gemm_ws_kernel(
    a_desc,
    b_desc,
    d_desc,
    group_ptr,
    num_groups,
    M,
    N,
    K,
    work_ptr,
    counter_ptr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    K_GROUPED: gl.constexpr,
    ACCUMULATE: gl.constexpr,
    SPLITS: gl.constexpr,
    WG_PARTS: gl.constexpr,
):
    """Warp-specialized BF16 GEMM (see the module docstring); launch with ``num_warps`` 8 (two MMA warpgroups), or 4
    for one over 64-row tiles or for ``WG_PARTS`` 2, and a persistent grid.
    The descriptors' boxes: A [TILE_M, 64], B [TILE_N, 64] (k-grouped: [64, TILE_M], [64, TILE_N]), D [TILE_M //
    WG_PARTS, min(TILE_N, 128)] (``TILE_M`` 64 or 128, ``TILE_N`` 64, 128 or 256: a 256-wide tile is stored as two
    128-wide halves; k-grouped: at most 128). ``group_ptr`` (int32 [G + 1]) and ``num_groups`` are read by the
    k-grouped form only; K is then K_sum and M the rows of one group.

    ``WG_PARTS`` (1 or 2; 2 for 128-row tiles, unsplit): the MMA warpgroups as one partition, or each a partition of
    its own, the second with :data:`WG1_REGS` registers.

    ``SPLITS`` (1, 2, 4, 8 or 16; above 1 dense with 64- and 128-wide tiles): the split tail (:mod:`split_tail`),
    with the plan's ``work_ptr`` (fp32 workspace) and ``counter_ptr`` (int32 counters, zero between launches); with
    ``SPLITS`` 1 neither is read. The grid: one CTA per job (:func:`split_tail.split_grid`), at most one per SM."""
    TILE_M: gl.constexpr = _tile_side(a_desc.block_type.shape, K_GROUPED)
    TILE_N: gl.constexpr = _tile_side(b_desc.block_type.shape, K_GROUPED)
    gl.static_assert(TILE_M == 64 or TILE_M == 128, "TILE_M 64 or 128")
    gl.static_assert(
        (WG_PARTS == 1 and (gl.num_warps() == 8 or (gl.num_warps() == 4 and TILE_M == 64)))
        or (WG_PARTS == 2 and gl.num_warps() == 4 and TILE_M == 128 and SPLITS == 1),
        "8 warps, or 4: 64 rows, or 4 a partition: WG_PARTS 2 over 128 rows, unsplit",
    )
    gl.static_assert(TILE_N == 64 or TILE_N == 128 or TILE_N == 256, "TILE_N 64, 128 or 256")
    gl.static_assert(d_desc.block_type.shape[0] * WG_PARTS == TILE_M, "D's box: the rows of one MMA partition")
    gl.static_assert(d_desc.block_type.shape[1] == TILE_N or (TILE_N == 256 and d_desc.block_type.shape[1] == 128))
    gl.static_assert(not K_GROUPED or TILE_N <= 128, "k-grouped: tiles at most 128 wide")
    gl.static_assert(not ACCUMULATE or K_GROUPED, "ACCUMULATE: k-grouped only")
    gl.static_assert(
        SPLITS == 1 or SPLITS == 2 or SPLITS == 4 or SPLITS == 8 or SPLITS == 16, "SPLITS 1, 2, 4, 8 or 16"
    )
    gl.static_assert(SPLITS == 1 or (TILE_N <= 128 and not K_GROUPED), "the split tail: dense, tiles at most 128 wide")
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    outs = gl.allocate_shared_memory(d_desc.dtype, [WG_PARTS] + d_desc.block_type.shape, d_desc.layout)
    ready, empty = ring_barriers(STAGES, WG_PARTS)  # each MMA partition releases a stage
    fence_async_shared()
    walks = num_groups if K_GROUPED else 1
    tail = (work_ptr, counter_ptr)  # the split tail's workspace and counters
    if WG_PARTS == 2:
        gl.warp_specialize(
            [
                (_mma_partition, (a_ring, b_ring, ready, empty, d_desc, outs, tail, group_ptr, walks, M, N, K,
                                  GROUP_M, K_GROUPED, ACCUMULATE, SPLITS, WG_PARTS, 0)),
                (_mma_partition, (a_ring, b_ring, ready, empty, d_desc, outs, tail, group_ptr, walks, M, N, K,
                                  GROUP_M, K_GROUPED, ACCUMULATE, SPLITS, WG_PARTS, 1)),
                (_loader, (a_desc, b_desc, a_ring, b_ring, ready, empty, group_ptr, walks, M, N, K, GROUP_M,
                           K_GROUPED, SPLITS)),
            ],
            [4, 1],
            [_WG1_REGS, LOADER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_mma_partition, (a_ring, b_ring, ready, empty, d_desc, outs, tail, group_ptr, walks, M, N, K,
                                  GROUP_M, K_GROUPED, ACCUMULATE, SPLITS, WG_PARTS, 0)),
                (_loader, (a_desc, b_desc, a_ring, b_ring, ready, empty, group_ptr, walks, M, N, K, GROUP_M,
                           K_GROUPED, SPLITS)),
            ],
            [1],
            [LOADER_REGS],
        )  # fmt: skip
