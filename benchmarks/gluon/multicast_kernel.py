"""Design (e) of issue 51: the warp-specialized dense FP8 GEMM over 2-CTA clusters, B multicast, each ring slot
released per stage by an mbarrier arrive on the other CTA's barrier (triton >= 3.7.1; sm_90a). Not in ``src/``.

``D = A @ B.T`` with DeepGEMM's recipe (A [M, K] and B [N, K] K-major e4m3, ``sa`` one fp32 per row and 128 of K
read as [ceil(K/128), M], ``sb`` one per 128x128 block of B), as ``tilegemm.ops.gluon.fp8_gemm_ws_kernel`` computes
it, with these differences:

* a cluster of two CTAs takes a cluster tile of ``WAVES`` x 256 rows and 128 columns: wave ``w`` covers rows
  ``256 w .. 256 w + 255`` of it, CTA ``r`` the 128 rows from ``256 w + 128 r`` (so every wave is one logical
  [256, 128] tensor split over the two CTAs, the way triton's CGA layouts split it: ``cga_layout=[[1, 0]]``);
* B's [128, 128] box of a K block is loaded once for the cluster, by TMA multicast (triton issues it from CTA 0
  with the mask of both CTAs); A's and A's scales' boxes by each CTA for its own rows;
* a slot's ``empty`` barrier counts two arrivals: the own CTA's MMA warps and the other CTA's (the loader of either
  CTA writes into both CTAs' slots: CTA 0 B by multicast; each its A). The MMA warps arrive on their own barrier
  with ``tiles.release_stage`` (a proxy fence, then ``mbarrier.arrive``) and on the other CTA's with inline PTX
  (``mapa.shared::cluster`` of the barrier's shared address, then ``mbarrier.arrive.shared::cluster``): Gluon 3.7.1
  has no remote arrive. The barrier's address is ``global_smem`` plus an offset that triton's allocator fixes, read
  from the PTX of the JIT's own compile of the call (``multicast_probe._jit_empty_offset``) and compiled in as
  ``EMPTY_OFF``;
* the loader is a warpgroup (``LOADER_WARPS``; one warp issues the copies) at 24 registers a thread, so the MMA
  warps keep 240;
* the walk is persistent over cluster tiles (``program_id`` is the cluster's), in grouped order; both CTAs of a
  cluster walk the same tiles. Each partition meets the other CTA's threads at a cluster barrier before its first
  barrier wait (the inits published) and after its last step (no CTA leaves while the other may still arrive on
  its barriers or multicast into its slots).

The host side is :mod:`multicast_probe`.
"""

from __future__ import annotations

from pipelined import ov_tile, wave_product
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    cluster,
    mbarrier,
    tma,
)

from tilegemm.ops.gluon.tiles import release_stage, smem_view, store_tile, tile_coords, tma_load

CLUSTER_M = gl.constexpr(256)  # rows of one wave of a cluster tile: 128 a CTA
BLOCK_N = gl.constexpr(128)
BLOCK_K = gl.constexpr(128)
MMA_WARPS = gl.constexpr(8)
#: The loader partition's warps (one issues the copies). A CTA's warps are whole warpgroups: a 1-warp loader would
#: leave 3 idle warps that never reach a cluster barrier, and the partitions' cluster syncs would never complete.
LOADER_WARPS = gl.constexpr(4)
#: A wave's accumulator: one logical [256, 128] tile, 128 rows a CTA (8 warps: m64n128 a warpgroup).
ACC_LAYOUT = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, 128, 32], cga_layout=[[1, 0]])
)
#: A's scales of a ring slot read as a flat [256] row vector (128 a CTA).
FLAT_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0], cga_layout=[[1]]))
#: One element a thread of the MMA warps, the same on both CTAs (the remote arrive's operand).
ARRIVE_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [8], [0], cga_layout=[[0]]))

#: One arrive, by thread 0 of the MMA warps, on the other CTA's barrier at ``global_smem + $1`` (ranks 0 and 1).
REMOTE_ARRIVE = gl.constexpr("""{ .reg .u32 a, p, rank, t; .reg .pred first;
    mov.u32 t, %tid.x; setp.eq.u32 first, t, 0;
    mov.u32 a, global_smem; add.u32 a, a, $1;
    mov.u32 rank, %cluster_ctarank; xor.b32 rank, rank, 1;
    mapa.shared::cluster.u32 p, a, rank;
    @first mbarrier.arrive.shared::cluster.b64 _, [p];
    mov.u32 $0, 0; }""")


#: Debug trace (``DEBUG``): lane 0 of each warp stores ``$2`` at ``$1 + 64 * %cluster_ctarank`` (an int32 slot of a
#: host-pinned buffer, read by the host while the kernel runs).
TRACE_STORE = gl.constexpr("""{ .reg .u32 r; .reg .u64 o; .reg .pred p;
    mov.u32 r, %tid.x; and.b32 r, r, 31; setp.eq.u32 p, r, 0;
    mov.u32 r, %cluster_ctarank; mul.wide.u32 o, r, 64; add.u64 o, o, $1;
    @p st.volatile.global.u32 [o], $2;
    mov.u32 $0, 0; }""")


@gluon.jit
def _trace(trace, slot: gl.constexpr, value, WARPS: gl.constexpr, DEBUG: gl.constexpr):
    """``DEBUG``: store ``value`` into int32 slot ``slot`` of this CTA's row of the trace buffer at address
    ``trace``."""
    if DEBUG:
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0], cga_layout=[[0]])
        addr = gl.full([WARPS * 32], trace + 4 * slot, gl.int64, layout)
        val = gl.full([WARPS * 32], value, gl.int32, layout)
        gl.inline_asm_elementwise(TRACE_STORE, "=r,l,r", [addr, val], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _loader(a_desc, b_desc, sa_desc, a_ring, b_ring, sa_ring, ready, empty, M, N, K, trace,
            WAVES: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DEBUG: gl.constexpr):  # fmt: skip
    """The TMA warp of each CTA: per K block its rows of A and their scales for every wave, and (CTA 0, multicast)
    B's box, into slot ``it % STAGES`` once both CTAs' MMA warps released it."""
    # bytes landing in each CTA per slot: its half of every wave's A and scale boxes, all of B's box
    nbytes: gl.constexpr = (
        WAVES * (a_desc.block_type.nbytes + sa_desc.block_type.nbytes) // 2 + b_desc.block_type.nbytes
    )
    num_m = gl.cdiv(M, WAVES * CLUSTER_M)
    num_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    _trace(trace, 0, 1, LOADER_WARPS, DEBUG)
    _cluster_sync(True)  # both CTAs' barriers initialized
    _trace(trace, 1, 1, LOADER_WARPS, DEBUG)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        for kb in range(num_k):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            _trace(trace, 2, it + 1, LOADER_WARPS, DEBUG)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            for w in gl.static_range(WAVES):
                row = (pm * WAVES + w) * CLUSTER_M
                tma_load(a_desc, [row, kb * BLOCK_K], bar, a_ring.index(s * WAVES + w))
                tma_load(sa_desc, [kb, row], bar, sa_ring.index(s * WAVES + w))
            tma_load(b_desc, [pn * BLOCK_N, kb * BLOCK_K], bar, b_ring.index(s), multicast=True)
            it += 1
            _trace(trace, 3, it, LOADER_WARPS, DEBUG)
    _trace(trace, 4, 1, LOADER_WARPS, DEBUG)
    _cluster_sync(False)  # no CTA leaves while the other may still arrive on its barriers
    _trace(trace, 5, 1, LOADER_WARPS, DEBUG)


@gluon.jit
def _mma(a_ring, b_ring, sa_ring, ready, empty, d_desc, out, sb_ptr, sb_stride, M, N, K, trace,
         EMPTY_OFF: gl.constexpr, WAVES: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
         OVERLAP: gl.constexpr, DEBUG: gl.constexpr):  # fmt: skip
    """The two MMA warpgroups of each CTA: per K block one wgmma a wave (each warpgroup 64 of the CTA's 128 rows),
    waited, promoted as ``acc += P * (sa * sb)``; then the slot released on both CTAs' ``empty`` barriers."""
    acc_l: gl.constexpr = ACC_LAYOUT
    rows: gl.constexpr = gl.SliceLayout(1, acc_l)
    sa_rows = smem_view(sa_ring, gl.float32, [STAGES * WAVES, CLUSTER_M], FLAT_LAYOUT)
    num_m = gl.cdiv(M, WAVES * CLUSTER_M)
    num_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    num_nb = gl.cdiv(N, 128)
    chain = K < 0  # False at run time, not at compile time (see fp8_gemm_ws_kernel: no spills at two waves)
    _trace(trace, 8, 1, MMA_WARPS, DEBUG)
    _cluster_sync(True)  # both CTAs' barriers initialized
    _trace(trace, 9, 1, MMA_WARPS, DEBUG)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        acc0 = gl.zeros([CLUSTER_M, BLOCK_N], gl.float32, acc_l)
        acc1 = gl.zeros([CLUSTER_M, BLOCK_N], gl.float32, acc_l)
        spare = gl.zeros([CLUSTER_M, BLOCK_N], gl.float32, acc_l)
        nb = pn * BLOCK_N // 128
        if OVERLAP > 0:
            acc0, spare, it = ov_tile(
                (a_ring, b_ring, sa_rows, ready, empty), (sb_ptr, sb_stride, nb, num_nb), acc0, spare, it, num_k,
                OVERLAP, 0, rows, _release, EMPTY_OFF, False,
            )  # fmt: skip
        for kb in range(num_k * (OVERLAP == 0)):
            s = it % STAGES
            sb = gl.load(sb_ptr + nb * sb_stride + kb, mask=nb < num_nb, other=0.0)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            _trace(trace, 10, it + 1, MMA_WARPS, DEBUG)
            for w in gl.static_range(WAVES):
                sa = sa_rows.index(s * WAVES + w).load(rows)
                p = wave_product(a_ring.index(s * WAVES + w), b_ring.index(s), acc0, acc1, spare, w, WAVES, chain)
                if w == 0:
                    acc0 = acc0 + p * (sa * sb)[:, None]
                else:
                    acc1 = acc1 + p * (sa * sb)[:, None]
                spare = p
            _release(empty, s, EMPTY_OFF)
            it += 1
            _trace(trace, 11, it, MMA_WARPS, DEBUG)
        row = pm * WAVES * CLUSTER_M
        store_tile(acc0, d_desc, out, row, pn * BLOCK_N)
        if WAVES == 2:
            store_tile(acc1, d_desc, out, row + CLUSTER_M, pn * BLOCK_N)
    tma.store_wait(pendings=0)
    _trace(trace, 12, 1, MMA_WARPS, DEBUG)
    _cluster_sync(False)  # no CTA leaves while the other may still arrive on its barriers
    _trace(trace, 13, 1, MMA_WARPS, DEBUG)


@gluon.jit
def _release(empty, s, EMPTY_OFF: gl.constexpr):
    """Slot ``s`` released on both CTAs: every wgmma reading it is complete (``release_stage`` on the own ``empty``
    barrier, its proxy fence ordering the scale reads before either CTA's refill; inline PTX on the other CTA's)."""
    release_stage(empty.index(s))
    offset = gl.full([MMA_WARPS * 32], EMPTY_OFF + 8 * s, gl.int32, ARRIVE_LAYOUT)
    gl.inline_asm_elementwise(REMOTE_ARRIVE, "=r,r", [offset], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_sync(RELAXED: gl.constexpr):
    """Every thread of both CTAs meets: called by both partitions (the code outside ``warp_specialize`` runs in the
    MMA warps only, while the loader warp waits on a CTA barrier, so a cluster barrier there never completes)."""
    cluster.arrive(relaxed=RELAXED)
    cluster.wait()


@gluon.jit
def multicast_fp8_kernel(a_desc, b_desc, sa_desc, d_desc, sb_ptr, sb_stride, M, N, K, trace,
                         EMPTY_OFF: gl.constexpr, WAVES: gl.constexpr, STAGES: gl.constexpr,
                         GROUP_M: gl.constexpr, LOADER_REGS: gl.constexpr, OVERLAP: gl.constexpr,
                         DEBUG: gl.constexpr):  # fmt: skip
    """The kernel (module docstring); launch with ``num_warps=8``, ``num_ctas=2``, a grid of clusters.

    ``a_desc``: A's [256, 128] box split over the two CTAs (``cga_layout=[[1, 0]]``); ``b_desc``: B's [128, 128]
    box on both (``[[0, 0]]``); ``sa_desc``: the [1, 256] box of A's scales ([ceil(K/128), M] view), split
    (``[[0, 1]]``); ``d_desc``: D's [256, 128] box, split. ``EMPTY_OFF``: the shared-memory offset of the first
    ``empty`` barrier (:func:`multicast_probe.empty_offset`). ``DEBUG``: each partition stores its progress into the
    int32 row of its CTA (16 slots, 64 bytes a row) at address ``trace`` (int64; a host-pinned buffer)."""
    gl.static_assert(OVERLAP == 0 or WAVES == 1, "OVERLAP: one-wave tiles")
    # a ring's layout is its box's (the leading dimension indexes the slots)
    a_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES * WAVES, CLUSTER_M, BLOCK_K], a_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    sa_ring = gl.allocate_shared_memory(gl.float32, [STAGES * WAVES, 1, CLUSTER_M], sa_desc.layout)
    out = gl.allocate_shared_memory(d_desc.dtype, d_desc.block_type.shape, d_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # the own CTA's MMA warps and the other CTA's
    mbarrier.fence_init_release_cluster()  # published by each partition's first cluster sync
    _trace(trace, 15, 1, MMA_WARPS, DEBUG)
    # fmt: off
    gl.warp_specialize(
        [
            (_mma, (a_ring, b_ring, sa_ring, ready, empty, d_desc, out, sb_ptr, sb_stride, M, N, K, trace,
                    EMPTY_OFF, WAVES, STAGES, GROUP_M, OVERLAP, DEBUG)),
            (_loader, (a_desc, b_desc, sa_desc, a_ring, b_ring, sa_ring, ready, empty, M, N, K, trace,
                       WAVES, STAGES, GROUP_M, DEBUG)),
        ],
        [LOADER_WARPS],
        [LOADER_REGS],
    )
    # fmt: on
