"""Gluon FP8 block-scaled GEMM kernel for Hopper (sm_90): ``D = alpha * A @ B.T (+ beta * C)``.

A [M, K] and B [N, K] are K-major float8_e4m3fn; ``sa`` holds one fp32 scale per row of A and 128 of K,
stored MN-major ([ceil(K/128), M]); ``sb`` one per 128x128 block of B ([ceil(N/128), ceil(K/128)]) or, with
``SB_ROWS``, one per row of B, MN-major ([ceil(K/128), N]). The scales travel with their K block: the loader
brings them by TMA ([1, width] boxes) into the same stage as the A and B tiles, so the MMA warpgroups read them
from shared memory and never wait on a global load.
Every 128-wide K block's product is computed into a fresh fp32 register tile by the tensor cores and
promoted into the fp32 accumulator as ``acc += P * (sa * sb)`` (DeepGEMM's numerics).

Warp roles (``gl.warp_specialize``), all walking the same persistent tile order:

* a loader warp streams A and B tiles by TMA into a ``STAGES``-deep shared-memory ring (``ready`` /
  ``empty`` mbarriers);
* two MMA warpgroups, each its own partition, each owns 64 rows of the 128-row output tile. Each reads
  its K block's scales, issues the block's wgmma asynchronously, waits for it, frees the stage (``empty``
  counts one arrival per warpgroup) and promotes, so one's promotion runs under the other's MMA. ``ORDER``
  sets how they share the tensor cores: 0, free issue; 1, they take turns issuing each K block's wgmma (the
  ``turn`` mbarrier pair); 2, each issues only after the other's MMA of the block has completed;
* each MMA warpgroup writes its 64 x BN part of the tile through shared memory with a TMA store, which
  runs under the next tile's main loop.

Tiles past M or N are handled by TMA (zero-filled loads, clipped stores); K past the last full block
is zero-filled, so partial K blocks need no mask.
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

from tilegemm.ops.gluon.tiles import release_stage, ring_barriers, smem_view, store_tile, tile_coords, tma_load

WG_ROWS = 64  # rows of the output tile one MMA warpgroup owns
SB_BOX = gl.constexpr(32)  # floats one 128x128-recipe B-scale load brings (a TMA destination is 128-byte aligned)
SB_ALIGN = gl.constexpr(4)  # a TMA box starts on 16 bytes: the B-scale box starts at kb - kb % 4


@gluon.jit
def _tile_counts(M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """Row tiles, column tiles and K blocks of the problem: ``(num_m, num_n, num_k)``."""
    return gl.cdiv(M, BM), gl.cdiv(N, BN), gl.cdiv(K, BK)


@gluon.jit
def _loader(
    a_desc,
    b_desc,
    sa_desc,
    sb_desc,
    ring,
    M,
    N,
    K,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SB_ROWS: gl.constexpr,
):
    """The TMA warp: A, B and their scales for every K block of every tile of this CTA, into ``ring`` (the kernel's
    stages)."""
    a_ring, b_ring, sa_ring, sb_ring, ready, empty = ring
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    nbytes: gl.constexpr = (
        a_desc.block_type.nbytes + b_desc.block_type.nbytes + sa_desc.block_type.nbytes + sb_desc.block_type.nbytes
    )
    num_m, num_n, num_k = _tile_counts(M, N, K, BM, BN, BK)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        for kb in range(num_k):
            s = it % STAGES
            bar = ready.index(s)
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(bar, nbytes)
            tma_load(a_desc, [pm * BM, kb * BK], bar, a_ring.index(s))
            tma_load(b_desc, [pn * BN, kb * BK], bar, b_ring.index(s))
            tma_load(sa_desc, [kb, pm * BM], bar, sa_ring.index(s))
            if SB_ROWS:
                tma_load(sb_desc, [kb, pn * BN], bar, sb_ring.index(s))
            else:
                tma_load(sb_desc, [pn, kb - kb % SB_ALIGN], bar, sb_ring.index(s))
            it += 1


@gluon.jit
def _stage_scales(sa_ring, sb_ring, s, kb, WG: gl.constexpr, layout: gl.constexpr, SB_ROWS: gl.constexpr):
    """Stage ``s`` (K block ``kb``)'s scales: this warpgroup's 64 row scales of A, and B's (a scalar, or one per
    column). The rings hold [1, width] TMA boxes; their rows are read through a flat view."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    STAGES: gl.constexpr = sa_ring.shape[0]
    sa_rows = smem_view(sa_ring, gl.float32, [STAGES, sa_ring.shape[2]], flat)
    sa = sa_rows.index(s).slice(WG * 64, 64).load(gl.SliceLayout(1, layout))
    sb_rows = smem_view(sb_ring, gl.float32, [STAGES, sb_ring.shape[2]], flat)
    if SB_ROWS:
        sb = sb_rows.index(s).load(gl.SliceLayout(0, layout))
    else:
        lanes: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        box = sb_rows.index(s).load(lanes)
        picked = gl.where(gl.arange(0, SB_BOX, layout=lanes) == kb % SB_ALIGN, box, 0.0)
        sb = gl.sum(picked, axis=0)
    return sa, sb


@gluon.jit
def _promote(acc, part, sa, sb, SB_ROWS: gl.constexpr):
    """``acc + P * sa * sb``: the fp32 promotion of one K block's product ``P``."""
    if SB_ROWS:
        return acc + (part * sa[:, None]) * sb[None, :]
    else:
        return acc + part * (sa * sb)[:, None]


@gluon.jit
def _mma_warpgroup(
    ring,
    turn,
    epilogue,
    out_smem,
    M,
    N,
    K,
    WG: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SB_ROWS: gl.constexpr,
    HAS_C: gl.constexpr,
    ORDER: gl.constexpr,
):
    """One MMA warpgroup: rows ``[WG * 64, WG * 64 + 64)`` of every tile of this CTA, from ``ring`` (the kernel's
    stages); ``epilogue``: ``(d_desc, c_ptr, c_stride, alpha, beta)``, its stores go through ``out_smem``."""
    a_ring, b_ring, sa_ring, sb_ring, ready, empty = ring
    d_desc, c_ptr, c_stride, alpha, beta = epilogue
    BM: gl.constexpr = a_ring.shape[1]
    BK: gl.constexpr = a_ring.shape[2]
    BN: gl.constexpr = b_ring.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    num_m, num_n, num_k = _tile_counts(M, N, K, BM, BN, BK)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        acc = gl.zeros([64, BN], gl.float32, layout)
        for kb in range(num_k):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            if ORDER != 0:
                mbarrier.wait(turn.index(WG), it & 1)  # the other warpgroup's MMA of this block went first
            part = warpgroup_mma(
                a_ring.index(s).slice(WG * 64, 64), b_ring.index(s).permute((1, 0)), acc, use_acc=False, is_async=True
            )
            if ORDER == 1:
                mbarrier.arrive(turn.index(1 - WG))
            sa, sb = _stage_scales(sa_ring, sb_ring, s, kb, WG, layout, SB_ROWS)
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
            if ORDER == 2:
                mbarrier.arrive(turn.index(1 - WG))
            release_stage(empty.index(s))
            acc = _promote(acc, part, sa, sb, SB_ROWS)
            it += 1
        out = acc * alpha
        if HAS_C:
            rows = pm * BM + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
            cols = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
            ptrs = c_ptr + rows.to(gl.int64)[:, None] * c_stride + cols[None, :]
            c_tile = gl.load(ptrs, mask=(rows < M)[:, None] & (cols < N)[None, :], other=0.0)
            out = out + beta * c_tile.to(gl.float32)
        store_tile(out, d_desc, out_smem, pm * BM + WG * 64, pn * BN)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_gemm_kernel(
    a_desc,
    b_desc,
    sa_desc,
    sb_desc,
    d_desc,
    c_ptr,
    M,
    N,
    K,
    c_stride,
    alpha,
    beta,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    SB_ROWS: gl.constexpr,
    HAS_C: gl.constexpr,
    ORDER: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    MMA_REGS: gl.constexpr,
):
    """Persistent warp-specialized FP8 GEMM (see the module docstring); launch with ``num_warps=4``."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    sa_ring = gl.allocate_shared_memory(gl.float32, [STAGES] + sa_desc.block_type.shape, sa_desc.layout)
    sb_ring = gl.allocate_shared_memory(gl.float32, [STAGES] + sb_desc.block_type.shape, sb_desc.layout)
    out0 = gl.allocate_shared_memory(d_desc.dtype, d_desc.block_type.shape, d_desc.layout)
    out1 = gl.allocate_shared_memory(d_desc.dtype, d_desc.block_type.shape, d_desc.layout)
    ready, empty = ring_barriers(STAGES, 2)  # one arrival per MMA warpgroup
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    if ORDER != 0:
        mbarrier.arrive(turn.index(0))  # warpgroup 0's MMA goes first
    fence_async_shared()
    # The stages every partition takes, and the MMA warpgroups' epilogue operands: groups without constexprs.
    # Each partition's arguments are spelled out around them: a tuple built by concatenation inside the kernel turns
    # its constexprs (WG, GROUP_M, ...) into runtime values, which the partitions' static branches need.
    ring = (a_ring, b_ring, sa_ring, sb_ring, ready, empty)
    epilogue = (d_desc, c_ptr, c_stride, alpha, beta)
    gl.warp_specialize(
        [
            (_mma_warpgroup, (ring, turn, epilogue, out0, M, N, K, 0, GROUP_M, STAGES, SB_ROWS, HAS_C, ORDER)),
            (_mma_warpgroup, (ring, turn, epilogue, out1, M, N, K, 1, GROUP_M, STAGES, SB_ROWS, HAS_C, ORDER)),
            (_loader, (a_desc, b_desc, sa_desc, sb_desc, ring, M, N, K, GROUP_M, STAGES, SB_ROWS)),
        ],
        [4, 1],
        [MMA_REGS, LOADER_REGS],
    )
