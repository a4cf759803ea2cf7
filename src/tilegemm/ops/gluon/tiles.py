"""Device helpers the gluon GEMM kernels share: the wgmma accumulator layout of a tile over the MMA warps, the ring's
barriers, the grouped order of the output tiles, a CTA's persistent walk over them, a row tile's first row, the TMA
store (or reduce-add) of a tile through shared memory, the FP8 recipe's B scale of a 128x128 block, and a barrier of
the CTA's threads under every triton the backend compiles with."""

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

#: A barrier of every thread of the CTA (``bar.sync``): Gluon's ``thread_barrier`` in triton 3.6 and 3.7, named
#: ``barrier`` from 3.8.
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
#: The TMA copy of a box from global to shared memory (completing on an mbarrier) and back: ``async_load`` and
#: ``async_store`` from triton 3.8 (the only names from 3.9), ``async_copy_global_to_shared`` and
#: ``async_copy_shared_to_global`` in 3.6 and 3.7.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.constexpr_function
def wgmma_layout(rows, width, num_warps, instr_k):
    """The accumulator layout of a [``rows``, ``width``] wgmma tile over ``num_warps`` MMA warps (one or two
    warpgroups), the instruction ``instr_k`` deep (32 for FP8, 16 for BF16): 16 rows a warp (128 rows over two
    warpgroups, 64 over one), each warpgroup 64 of them (m64n``width``); else (64 rows over two warpgroups) each
    warpgroup half the columns (m64n``width/2``, both reading the same A)."""
    if rows == 16 * num_warps:
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, width, instr_k])
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps // 2, 2], instr_shape=[16, width // 2, instr_k]
    )


@gluon.jit
def ring_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The barriers of a ring of ``STAGES`` shared-memory stages, initialized: ``ready`` (one arrival each: the
    loader's, completed by its TMA bytes) and ``empty`` (``CONSUMERS`` arrivals each: every consumer releases the
    stage). The caller fences the inits (``fence_async_shared``) once its other barriers are initialized too."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)
    return ready, empty


@gluon.jit
def release_stage(bar):
    """Arrive on ``bar``, a ring stage's empty barrier, once this thread's reads of the stage are done, after a fence
    (``fence.proxy.async``): the stage's scales were read through the generic proxy (``load``), the TMA that refills
    the stage writes through the async proxy, and only such a fence orders the two. Without it a refill under load
    can land before a warp's read of the scales (a wrong 16x8 block of D)."""
    fence_async_shared()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def tile_coords(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """Row and column tile of linear tile ``tile`` in grouped order: ``GROUP_M`` row tiles per column sweep (so a
    column tile of B stays in L2 while its rows are walked)."""
    per_group = GROUP_M * num_n
    group = tile // per_group
    first_m = group * GROUP_M
    height = gl.minimum(num_m - first_m, GROUP_M)
    local = tile - group * per_group
    return first_m + local % height, local // height


@gluon.jit
def tile_range(M, N, walks, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PERSISTENT: gl.constexpr):
    """(first tile, tile count, step, row tiles, column tiles) of this CTA's walk over the output tiles of
    ``walks`` problems of [M, N] (the k-grouped groups; else 1): every ``num_programs``-th tile when
    ``PERSISTENT``, else the one tile of this CTA."""
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    num_tiles = walks * num_m * num_n
    if PERSISTENT:
        step = gl.num_programs(0)
    else:
        step = num_tiles
    return gl.program_id(0), num_tiles, step, num_m, num_n


@gluon.jit
def tile_row(pm, TILE_M: gl.constexpr, M, shift_last):
    """The first row of row tile ``pm`` over M rows. Where ``shift_last`` (a scalar i1), a last row tile that would
    reach past M moves up to end at row M: its A boxes then hold no rows past M, which TMA zero-fills at a cost
    (a 128x64 BF16 tile with 8 of its 128 rows in M ran twice a full one's time:
    benchmarks/results/gluon/bf16_partial_row_tiles_h200.json), and its first rows, which the
    tile before it also holds, are computed twice and stored twice. Only where both computations give the same
    bits: the same K blocks in the same order, so not where one of the two tiles is split and the other not."""
    last = gl.maximum(M - TILE_M, 0) + M * (1 - shift_last.to(gl.int32))  # past every tile's row when not shifting
    return gl.minimum(pm * TILE_M, last)


@gluon.jit
def store_tile(acc, d_desc, out_smem, row, col):
    """The register tile ``acc`` to D at (row, col) in D's dtype: through ``out_smem`` by a TMA store (clipped at
    D's edges), after the previous store from ``out_smem`` has read it."""
    tma.store_wait(pendings=0)
    out_smem.store(acc.to(d_desc.dtype))
    fence_async_shared()
    tma_store(d_desc, [row, col], out_smem)


@builtin
def smem_view(smem, dtype, shape, layout, _semantic=None):
    """The shared memory of ``smem`` read as ``dtype`` in ``shape`` and ``layout`` (no copy): Gluon's
    ``reinterpret`` from triton 3.9, ``_reinterpret`` before."""
    view = getattr(smem, "reinterpret", None) or smem._reinterpret
    return view(dtype, shape, layout, _semantic=_semantic)


@builtin
def _tma_add_shared_to_global(tensor_desc, coord, src, _semantic=None):
    """TMA reduce-add of the shared tile ``src`` into global memory at ``coord`` of ``tensor_desc``
    (``cp.reduce.async.bulk.tensor ... .add``; completes like a TMA store: :func:`tma.store_wait`). Gluon's builder
    has the op; its ``tma`` module has no wrapper."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def add_tile(acc, d_desc, out_smem, row, col):
    """D[row:, col:] += the fp32 register tile ``acc`` (D fp32: the sum is not rounded to a narrower dtype), through
    ``out_smem`` by a TMA reduce-add (clipped at D's edges; D is not read into registers), after the previous store
    from ``out_smem`` has read it."""
    tma.store_wait(pendings=0)
    out_smem.store(acc)
    fence_async_shared()
    _tma_add_shared_to_global(d_desc, [row, col], out_smem)


@gluon.jit
def block_scale(sb_ptr, sb_stride, col, kb, num_k, num_nb):
    """B's scale of the 128-column block holding ``col`` at K block ``kb`` (DeepGEMM's recipe: one fp32 per 128x128
    block, ``sb`` row pitch ``sb_stride``); 0 past the last block of N or K."""
    nb = col // 128
    return gl.load(sb_ptr + nb * sb_stride + kb, mask=(nb < num_nb) & (kb < num_k), other=0.0)
