"""A design for issue 51: the dense FP8 GEMM with its two MMA warpgroups in two partitions of their own (triton 3.6;
sm_90a). Not in ``src/``.

``D = A @ B.T`` with DeepGEMM's recipe, as ``tilegemm.ops.gluon.fp8_gemm_ws_kernel`` computes it. There the two MMA
warpgroups are one 8-warp partition: every wgmma, wait and promotion runs in both at once, so the tensor cores idle
while both promote. Here each warpgroup is a partition (the default one and a worker, each with its own
``setmaxnreg`` budget) that owns ``HALVES`` x 64 rows of the ``2 x HALVES x 64``-row tile: per K block it waits for
the slot, runs its halves one after the other (wgmma m64n128k32 x 4 into a fresh product tile, wait, promote
``acc += P * (sa * sb)``) and releases the slot on its own (``empty`` counts the two warpgroups). Nothing makes the
two warpgroups step together but the ring, so one's promotion can run under the other's wgmma, as DeepGEMM's math
warpgroups do. A third partition, one warp, loads A, B and A's scales by TMA.

Persistent over the output tiles in grouped order (``GROUP_M`` row tiles a sweep); the output leaves by TMA from a
staging tile per warpgroup.
"""

from __future__ import annotations

from pipelined import ov_tile, wave_product
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
)

from tilegemm.ops.gluon.tiles import release_stage, smem_view, store_tile, tile_coords, tma_load

HALF_M = gl.constexpr(64)  # rows of one wgmma (a warpgroup's m64)
BLOCK_N = gl.constexpr(128)
BLOCK_K = gl.constexpr(128)
#: A warpgroup's product and accumulator tiles: m64n128 over its 4 warps.
ACC_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32]))
FLAT_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def _loader(a_desc, b_desc, sa_desc, a_ring, b_ring, sa_ring, ready, empty, M, N, K,
            STAGES: gl.constexpr, GROUP_M: gl.constexpr):  # fmt: skip
    """The TMA warp: A's [BLOCK_M, 128] box, B's [128, 128] and A's scales' [1, BLOCK_M] of every K block of every
    tile of this CTA, into slot ``it % STAGES`` once both warpgroups released it."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + sa_desc.block_type.nbytes
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        for kb in range(num_k):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma_load(a_desc, [pm * BLOCK_M, kb * BLOCK_K], bar, a_ring.index(s))
            tma_load(b_desc, [pn * BLOCK_N, kb * BLOCK_K], bar, b_ring.index(s))
            tma_load(sa_desc, [kb, pm * BLOCK_M], bar, sa_ring.index(s))
            it += 1


@gluon.jit
def _release(empty, s, UNUSED: gl.constexpr):
    """Slot ``s`` released by this warpgroup (``pipelined.ov_tile``'s ``RELEASE``), after the proxy fence."""
    release_stage(empty.index(s))


@gluon.jit
def _warpgroup(a_ring, b_ring, sa_ring, ready, empty, d_desc, out, sb_ptr, sb_stride, M, N, K,
               WG: gl.constexpr, HALVES: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
               OVERLAP: gl.constexpr):  # fmt: skip
    """MMA warpgroup ``WG`` (0: the default partition, 1: a worker): rows ``WG * HALVES * 64`` on of each tile, its
    halves one after the other per K block, the slot released after its last half; its rows stored through
    ``out``."""
    BLOCK_M: gl.constexpr = a_ring.shape[1]
    rows: gl.constexpr = gl.SliceLayout(1, ACC_LAYOUT)
    sa_rows = smem_view(sa_ring, gl.float32, [STAGES, BLOCK_M], FLAT_LAYOUT)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    num_nb = gl.cdiv(N, 128)
    first: gl.constexpr = WG * HALVES * HALF_M
    chain = K < 0  # False at run time, not at compile time: each half's wgmma reads the other half's accumulator
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        acc0 = gl.zeros([HALF_M, BLOCK_N], gl.float32, ACC_LAYOUT)
        acc1 = gl.zeros([HALF_M, BLOCK_N], gl.float32, ACC_LAYOUT)
        spare = gl.zeros([HALF_M, BLOCK_N], gl.float32, ACC_LAYOUT)
        nb = pn * BLOCK_N // 128
        if OVERLAP > 0:
            ring = (a_ring, b_ring, sa_rows, ready, empty)
            scales = (sb_ptr, sb_stride, nb, num_nb)
            acc0, spare, it = ov_tile(ring, scales, acc0, spare, it, num_k, OVERLAP, first, rows, _release, 0, True)
        sb_next = gl.load(sb_ptr + nb * sb_stride, mask=nb < num_nb, other=0.0)
        for kb in range(num_k * (OVERLAP == 0)):
            s = it % STAGES
            sb = sb_next
            sb_next = gl.load(sb_ptr + nb * sb_stride + kb + 1, mask=(nb < num_nb) & (kb + 1 < num_k), other=0.0)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            for h in gl.static_range(HALVES):
                sa = sa_rows.index(s).slice(first + h * HALF_M, HALF_M).load(rows)
                a = a_ring.index(s).slice(first + h * HALF_M, HALF_M)
                p = wave_product(a, b_ring.index(s), acc0, acc1, spare, h, HALVES, chain)
                if h == HALVES - 1:
                    release_stage(empty.index(s))  # this warpgroup's wgmmas of slot s are complete
                if h == 0:
                    acc0 = acc0 + p * (sa * sb)[:, None]
                else:
                    acc1 = acc1 + p * (sa * sb)[:, None]
                spare = p
            it += 1
        row0 = pm * BLOCK_M + first
        store_tile(acc0, d_desc, out, row0, pn * BLOCK_N)
        if HALVES == 2:
            store_tile(acc1, d_desc, out, row0 + HALF_M, pn * BLOCK_N)
    tma.store_wait(pendings=0)


@gluon.jit
def _worker_wg(a_ring, b_ring, sa_ring, ready, empty, d_desc, out, sb_ptr, sb_stride, M, N, K,
               HALVES: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, OVERLAP: gl.constexpr):  # fmt: skip
    """Warpgroup 1 (a worker partition)."""
    _warpgroup(a_ring, b_ring, sa_ring, ready, empty, d_desc, out, sb_ptr, sb_stride, M, N, K,
               1, HALVES, STAGES, GROUP_M, OVERLAP)  # fmt: skip


@gluon.jit
def wg_split_fp8_kernel(a_desc, b_desc, sa_desc, d_desc, sb_ptr, sb_stride, M, N, K,
                        HALVES: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                        MMA_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, OVERLAP: gl.constexpr):  # fmt: skip
    """The kernel (module docstring); launch with ``num_warps=4`` (the default partition: warpgroup 0).

    ``a_desc``: A's [2 * HALVES * 64, 128] box; ``b_desc``: B's [128, 128]; ``sa_desc``: the [1, 2 * HALVES * 64]
    box of A's scales ([ceil(K/128), M] view); ``d_desc``: D's [64, 128] box. ``MMA_REGS``: warpgroup 1's
    registers (the default partition gets what the workers leave), ``LOADER_REGS`` the loader warp's. ``OVERLAP``
    (one half a warpgroup): K blocks a software-pipelined run, each warpgroup keeping its next wgmma in flight during
    its promotion (0: off)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(BLOCK_M == 2 * HALVES * HALF_M, "A's box: the tile's rows")
    gl.static_assert(OVERLAP == 0 or HALVES == 1, "OVERLAP: one half a warpgroup")
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    sa_ring = gl.allocate_shared_memory(gl.float32, [STAGES] + sa_desc.block_type.shape, sa_desc.layout)
    out0 = gl.allocate_shared_memory(d_desc.dtype, d_desc.block_type.shape, d_desc.layout)
    out1 = gl.allocate_shared_memory(d_desc.dtype, d_desc.block_type.shape, d_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # the two warpgroups
    fence_async_shared()
    # fmt: off
    gl.warp_specialize(
        [
            (_warpgroup, (a_ring, b_ring, sa_ring, ready, empty, d_desc, out0, sb_ptr, sb_stride, M, N, K,
                          0, HALVES, STAGES, GROUP_M, OVERLAP)),
            (_worker_wg, (a_ring, b_ring, sa_ring, ready, empty, d_desc, out1, sb_ptr, sb_stride, M, N, K,
                          HALVES, STAGES, GROUP_M, OVERLAP)),
            (_loader, (a_desc, b_desc, sa_desc, a_ring, b_ring, sa_ring, ready, empty, M, N, K, STAGES, GROUP_M)),
        ],
        [4, 1],
        [MMA_REGS, LOADER_REGS],
    )
    # fmt: on
