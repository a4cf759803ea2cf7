"""Gluon warp-specialized FP8 block-scaled GEMM kernel for Hopper: ``D = A @ B.T`` with DeepGEMM's recipe.

A [M, K] and B [N, K] are K-major float8_e4m3fn. ``sa`` holds one fp32 scale per row of A and 128 of K, MN-major
(the kernel reads it as [ceil(K/128), M], row pitch a multiple of 16 bytes); ``sb`` one per 128x128 block of B,
[ceil(N/128), ceil(K/128)]. Each 128-wide K block's product is computed by wgmma into a fresh fp32 register tile
and promoted into the fp32 accumulator as ``acc += P * (sa * sb)``.

Layout of warps (``gl.warp_specialize``):

* the DEFAULT partition holds the MMA warps: 8 warps, two warpgroups. A 128-row wave is one ``warpgroup_mma``
  over the 8 warps (each warpgroup owns 64 of its rows); ``WAVES`` = 2 makes the tile 256 rows, each warpgroup
  running its two 64-row halves one after the other on the same B tile. A 64-row wave (A's box 64 rows: the one
  wave of a 128-wide tile) splits the tile's columns instead, each warpgroup 64 of them (m64n64k32, both reading
  the same A), which doubles the tiles of a short M. Launched with 4 warps, the default partition is one warpgroup
  and a 64-row wave is one m64nN ``warpgroup_mma`` over the whole tile (A read once a K block). The default
  partition gets every register the worker leaves (``setmaxnreg``), so the accumulators fit without spilling;
* one worker warp streams A, B and A's scales by TMA into a ``STAGES``-deep ring (``ready`` / ``empty``
  mbarriers), with ``LOADER_REGS`` registers.

``WG_PARTS`` = 2 (one 128-row wave of a 64-, 128- or 192-wide tile) makes each MMA warpgroup a partition of its own: the
default partition is warpgroup 0 (rows 0-63 of every tile), a 4-warp worker warpgroup 1 (rows 64-127, ``WG1_REGS``
registers). Each waits for a stage, runs its wgmma and promotion and releases the stage by itself (``empty`` counts
both), so the two drift apart and one's promotion runs under the other's wgmma, which the lockstep partition (both
promoting at once, the tensor cores idle) cannot do; with ``OVERLAP`` each also keeps its next wgmma in flight during
its own promotion. Each stores its 64 rows through a staging tile of its own.

``BLOCK_N`` = 64 (one 128-row wave, dense or m-grouped) halves the tile's width instead: each warpgroup 64 rows of
64 columns (m64n64k32), B's tile 64 rows (inside one 128-row scale block), for short-N calls whose 128-wide tiles
leave SMs idle. ``BLOCK_N`` = 192 is built from two sub-tiles, 128 and 64 wide (two B descriptors, two wgmma over
the same A tile). Their order alternates with the column tile's parity (128 + 64 on even tiles, 64 + 128 on odd
ones) so that each sub-tile lies inside one 128-column block of B and has a single B scale per K block.

``OVERLAP`` = N (0: off): the wgmma of the next step (a step: one wave of one K block) is issued before the current
step's promotion, which then waits with ``num_outstanding=1`` instead of 0: the promotion runs under an MMA, at the
cost of a second product tile of registers. A step's scales (A's rows from its stage, B's block scale) are read as
soon as its wgmma is issued, so the promotion does not wait for their loads. The steps of N K blocks form one run,
unrolled inside the K loop's body with the two product tiles in fixed roles (even and odd steps); no wgmma is in
flight at the loop's back edge, so the last promotion of each run is not overlapped. K blocks past a multiple of N go
as shorter runs (N/2, ..., 1).

``PERSISTENT``: the grid is at most one CTA per SM and each CTA walks the output tiles in a grouped order
(``GROUP_M`` row tiles per column sweep, for L2 reuse of B); otherwise one CTA per tile, in the same order.

Registers: ptxas overlaps a wave's promotion with the next wave's wgmma when it sees no dependence between them,
which at 256x128 needs two product tiles beside the two accumulators (256 registers a thread) and spills. With two
waves each wgmma is therefore given the other wave's accumulator as its input tile, with a ``use_acc`` that is
False at run time but not at compile time: the promotion must finish first (ptxas copies the tile: about 64 moves
a wave, no spills).

``GROUPING`` picks the problem (one wave a tile in both grouped forms):

* ``DENSE`` (0): one GEMM.
* ``M_GROUPED`` (1, m-grouped contiguous, DeepGEMM's ``m_indices`` layout): A is the rows of every group, B the
  groups' weights as one [G * N, K] matrix, ``sb`` [G, ceil(N/128), ceil(K/128)] (group pitch ``sb_group_stride``).
  Row tile ``pm``'s group is ``group_ptr[pm * 128]``: its B rows start at ``group * N`` and its B scales at
  ``group * sb_group_stride``. A tile of group -1 (padding) runs no K block and is stored as zeros; a tile of any
  other id outside ``[0, G)`` runs none and is not stored; rows of a computed tile whose own entry is not the
  tile's group (the -1 rows that end a group's last block) are stored as zeros. Columns past N read the next
  group's rows of B, and the store drops them. ``ROW_SCALE``: each stored row is first multiplied by its fp32
  entry of ``row_scale_ptr`` [M] (the fused experts' routing weight, applied before the rounding to D's dtype).
  ``GATED`` (the fused experts' gate/up projection, 128-wide tiles, no overlap): B is [G * 2N, K], each group's N gate
  rows then its N up rows; a tile loads the gate rows and the up rows of its 128 columns as its two B sub-tiles,
  keeps two fp32 accumulators ``g`` and ``u`` (per K block: the gate wgmma and its promotion, then the up wgmma
  into the same product tile and its promotion), and stores ``h = act(g) * u`` quantized 1x128 (DeepGEMM's
  activation recipe) into an FP8 D [M, N] and its scales into ``d_scale_ptr`` [N/128, M].
* ``K_GROUPED`` (2, k-grouped, the MoE weight gradient ``D[g] = A_g @ B_g.T``): A [M, K_sum] and B [N, K_sum]
  hold every group's K range side by side, ``group_ptr`` the [G + 1] offsets of those ranges (multiples of 128),
  D is [G * M, N] (M a multiple of 128, so no tile crosses a group). The walk runs over (group, row tile, column
  tile); a tile runs its group's K blocks. Both sides are scaled 1x128 (DeepGEMM's k-grouped recipe): A's scales
  as ever, B's [ceil(K_sum/128), N] come by TMA with the stage (``sb_desc``) and each step is promoted as
  ``acc += P * sa[:, None] * sb[None, :]``. ``ACCUMULATE``: the tile is added to D by a TMA reduce-add
  (:func:`tiles.add_tile`: D is not read into registers) instead of stored. ``IN_PLACE``: A and B are DeepGEMM's
  ``nt`` layout, ``a_blocks`` / ``b_blocks`` holding each group's K-major [M, K_g] / [N, K_g] block back to back; the
  loader builds the group's two descriptors on the device (``tma.make_tensor_descriptor``: written in shared memory,
  copied to the launch's global scratch, fenced) for the CTA's first tile and wherever its walk enters another
  group, and counts K from the group's start (``a_desc`` / ``b0_desc`` then give only the boxes and layouts).

``SPLITS`` > 1 (dense, persistent, one wave of a 128- or 64-wide tile): the split tail (:mod:`split_tail`). When the
last round of tiles is short, each of its tiles runs as ``SPLITS`` jobs over a share of the K blocks each, on CTAs
that round would leave idle, exactly as a k-grouped tile runs its group's K range (``_tile_job``'s first K block
and count); a split run's partial goes through :func:`split_tail.split_fixup` (partials in a workspace; the tile's
last run sums them in split order and stores the tile by TMA as any other). ``SPLITS`` = 1 compiles the kernel
without it.

B's scales are read by the MMA warps with a scalar global load one K block ahead; A's scales come with the stage.
The output leaves through shared memory by TMA stores (one staging buffer per sub-tile, reused wave by wave).
Tiles past M or N are handled by TMA (zero-filled loads, clipped stores); K past the last full block is
zero-filled.

The host side is :mod:`tilegemm.ops.gluon.fp8_gemm_ws`.

Over 600 lines: one kernel, its three problems (dense, m-grouped with the fused experts' two epilogues, k-grouped)
and its three K loops (with and without the overlap, gated), read top to bottom in one file.
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

from tilegemm.ops.gluon.split_tail import job_walk, split_fixup, split_job
from tilegemm.ops.gluon.tiles import (
    add_tile,
    block_scale,
    release_stage,
    ring_barriers,
    smem_view,
    store_tile,
    tile_coords,
    tile_range,
    tma_load,
    wgmma_layout,
)

WAVE_M = 128  # rows of one wave: 64 per MMA warpgroup
BLOCK_K = 128  # one scale block of K per step
NARROW_N = 64  # width of the second sub-tile of a 192-wide tile
MMA_WARPS = 8  # the MMA warps: two warpgroups (the default partition, or each a partition: WG_PARTS 2)
#: WG_PARTS 2: the registers of the worker MMA warpgroup (the default one gets what the workers leave: 248)
WG1_REGS = 232

DENSE, M_GROUPED, K_GROUPED = 0, 1, 2  # GROUPING: the problem the kernel computes
GATED_SILU, GATED_GELU_TANH = 1, 2  # GATED (m-grouped): the activation fused into the epilogue (0: none)

_WAVE_M = gl.constexpr(WAVE_M)
_DENSE = gl.constexpr(DENSE)
_M_GROUPED = gl.constexpr(M_GROUPED)
_K_GROUPED = gl.constexpr(K_GROUPED)
_GATED_SILU = gl.constexpr(GATED_SILU)
_BLOCK_K = gl.constexpr(BLOCK_K)
_WG1_REGS = gl.constexpr(WG1_REGS)


@gluon.jit
def _sub_cols(pn, BLOCK_N: gl.constexpr):
    """First column of column tile ``pn``'s wide (128) sub-tile and of its narrow (64) one (192-wide tiles; for
    128-wide tiles both are the tile's first column). Even tiles are wide then narrow, odd ones narrow then wide,
    so neither sub-tile crosses a 128-column scale block of B."""
    start = pn * BLOCK_N
    if BLOCK_N == 192:
        odd = pn % 2
        return start + 64 * odd, start + 128 - 128 * odd
    else:
        return start, start


@gluon.jit
def _b_cols(pn, N, BLOCK_N: gl.constexpr, GATED: gl.constexpr):
    """The first rows of B that column tile ``pn`` reads, for its two sub-tiles (:func:`_sub_cols`); gated: its gate
    rows and its up rows, ``N`` further on."""
    col0, col1 = _sub_cols(pn, BLOCK_N)
    if GATED:
        col1 = col0 + N
    return col0, col1


@gluon.jit
def _tile_job(
    tile, num_m, num_n, group_ptr, num_groups, K, BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr, GROUPING: gl.constexpr
):
    """What linear tile ``tile`` computes: (group, row tile, column tile, first K block, K blocks).

    Dense: group 0, every K block. m-grouped: the group ``group_ptr[pm * BLOCK_M]`` of its row block, every K block, or
    none for an id outside ``[0, num_groups)`` (-1: padding). k-grouped: the tile's group of the walk and that
    group's K range ``[group_ptr[g], group_ptr[g + 1])``, clamped into ``[0, K]``."""
    per_group = num_m * num_n
    walk = tile // per_group
    pm, pn = tile_coords(tile - walk * per_group, num_m, num_n, GROUP_M)
    num_k = gl.cdiv(K, _BLOCK_K)
    if GROUPING == _M_GROUPED:
        group = gl.load(group_ptr + pm * BLOCK_M)
        runs = (group >= 0) & (group < num_groups)
        return group, pm, pn, 0, num_k * runs.to(gl.int32)
    elif GROUPING == _K_GROUPED:
        k0 = gl.minimum(gl.maximum(gl.load(group_ptr + walk), 0), K)
        k1 = gl.minimum(gl.maximum(gl.load(group_ptr + walk + 1), k0), K)
        return walk, pm, pn, k0 // _BLOCK_K, (k1 - k0) // _BLOCK_K
    else:
        return 0, pm, pn, 0, num_k


@gluon.jit
def _job(job, full, num_m, num_n, group_ptr, num_groups, K, BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr,
         GROUPING: gl.constexpr, SPLITS: gl.constexpr):  # fmt: skip
    """What job ``job`` of a walk whose split tail starts at tile ``full`` (:func:`split_tail.job_walk`) computes:
    (tile, group, row tile, column tile, first K block, K blocks, split). The tile's :func:`_tile_job`, with
    ``SPLITS`` > 1 the tile and K share of :func:`split_tail.split_job` (a whole tile before ``full``)."""
    if SPLITS > 1:
        tile, split, kb0, tile_k = split_job(job, full, gl.cdiv(K, _BLOCK_K), SPLITS)
        group, pm, pn, _, _ = _tile_job(tile, num_m, num_n, group_ptr, num_groups, K, BLOCK_M, GROUP_M, GROUPING)
        return tile, group, pm, pn, kb0, tile_k, split
    else:
        group, pm, pn, kb0, tile_k = _tile_job(job, num_m, num_n, group_ptr, num_groups, K, BLOCK_M, GROUP_M, GROUPING)
        return job, group, pm, pn, kb0, tile_k, 0


@gluon.jit
def _group_blocks(a_blocks, b_blocks, a_desc, b_desc, group_ptr, group, M, N, K):
    """K-grouped, read in place: TMA descriptors over group ``group``'s K-major [M, K_g] block of A and [N, K_g] block
    of B (``a_blocks`` / ``b_blocks``: every group's block back to back, group g's at ``K_prefix(g) * M`` / ``* N``),
    built on the device with ``a_desc``'s / ``b_desc``'s box and layout. An empty group's pair spans one K block (a
    descriptor has no empty dimension); it is never read."""
    k0 = gl.minimum(gl.maximum(gl.load(group_ptr + group), 0), K)
    k1 = gl.minimum(gl.maximum(gl.load(group_ptr + group + 1), k0), K)
    k_g = gl.maximum(k1 - k0, _BLOCK_K)
    a_g = tma.make_tensor_descriptor(
        a_blocks + k0.to(gl.int64) * M, [M, k_g], [k_g, 1], a_desc.block_type.shape, a_desc.layout
    )
    b_g = tma.make_tensor_descriptor(
        b_blocks + k0.to(gl.int64) * N, [N, k_g], [k_g, 1], b_desc.block_type.shape, b_desc.layout
    )
    return a_g, b_g


@gluon.jit
def _loader(
    a_desc,
    b0_desc,
    b1_desc,
    sa_desc,
    sb_desc,
    ring,
    group_ptr,
    a_blocks,
    b_blocks,
    num_groups,
    M,
    N,
    K,
    BLOCK_N: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    PERSISTENT: gl.constexpr,
    GROUPING: gl.constexpr,
    GATED: gl.constexpr,
    SPLITS: gl.constexpr,
    IN_PLACE: gl.constexpr,
):
    """The TMA warp: A, B (one or two sub-tiles; gated: the gate and the up rows) and A's scales (k-grouped: and B's)
    of every K block of every tile of this CTA, into ``ring`` (the kernel's stages); m-grouped: B's rows of the tile's
    group; ``SPLITS`` > 1: of every job, a split run's K blocks only. ``IN_PLACE`` (k-grouped): A and B from the
    group's own blocks (:func:`_group_blocks`: descriptors built for the CTA's first tile and where its walk enters
    another group), K counted from the group's start."""
    a_ring, b0_ring, b1_ring, sa_ring, sb_ring, ready, empty = ring
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    TWO_B: gl.constexpr = BLOCK_N == 192 or GATED != 0
    SB_COLS: gl.constexpr = GROUPING == _K_GROUPED
    B1_BYTES: gl.constexpr = b1_desc.block_type.nbytes if TWO_B else 0
    SB_BYTES: gl.constexpr = sb_desc.block_type.nbytes if SB_COLS else 0
    nbytes: gl.constexpr = (
        a_desc.block_type.nbytes + b0_desc.block_type.nbytes + sa_desc.block_type.nbytes + B1_BYTES + SB_BYTES
    )
    walks = num_groups if GROUPING == _K_GROUPED else 1
    first, num_tiles, step, num_m, num_n = tile_range(M, N, walks, BLOCK_M, BLOCK_N, PERSISTENT)
    jobs, full = job_walk(num_tiles, step, SPLITS)
    it = 0
    if IN_PLACE:  # the group of the CTA's first tile; the next ones are built where the walk enters a group
        built = gl.minimum(first // (num_m * num_n), num_groups - 1)
        a_src, b_src = _group_blocks(a_blocks, b_blocks, a_desc, b0_desc, group_ptr, built, M, N, K)
    else:
        a_src, b_src = a_desc, b0_desc
    for job in range(first, jobs, step):
        _, group, pm, pn, kb0, tile_k, _ = _job(
            job, full, num_m, num_n, group_ptr, num_groups, K, BLOCK_M, GROUP_M, GROUPING, SPLITS
        )
        col0, col1 = _b_cols(pn, N, BLOCK_N, GATED)
        b_row = group * N * (2 if GATED else 1) if GROUPING == _M_GROUPED else 0  # m-grouped: the group's rows of B
        if IN_PLACE:
            if group != built:
                a_src, b_src = _group_blocks(a_blocks, b_blocks, a_desc, b0_desc, group_ptr, group, M, N, K)
                built = group
            k_base = kb0  # the group's blocks start at its first K block
        else:
            k_base = 0
        for kb in range(kb0, kb0 + tile_k):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma_load(a_src, [pm * BLOCK_M, (kb - k_base) * _BLOCK_K], bar, a_ring.index(s))
            tma_load(b_src, [b_row + col0, (kb - k_base) * _BLOCK_K], bar, b0_ring.index(s))
            if TWO_B:
                tma_load(b1_desc, [b_row + col1, kb * _BLOCK_K], bar, b1_ring.index(s))
            tma_load(sa_desc, [kb, pm * BLOCK_M], bar, sa_ring.index(s))
            if SB_COLS:
                tma_load(sb_desc, [kb, col0], bar, sb_ring.index(s))
            it += 1


@gluon.jit
def _group_rows(acc, m_index, row_scale, row, group, M, rows: gl.constexpr, ROW_SCALE: gl.constexpr):
    """``acc`` (its rows from ``row``) with the rows whose ``m_index`` entry is not ``group`` set to 0, and each
    row multiplied by its fp32 ``row_scale`` entry when ``ROW_SCALE``."""
    r = row + gl.arange(0, acc.shape[0], layout=rows)
    ids = gl.load(m_index + r, mask=r < M, other=-1)
    if ROW_SCALE:
        acc = acc * gl.load(row_scale + r, mask=r < M, other=0.0)[:, None]
    return gl.where((ids == group)[:, None], acc, 0.0)


@gluon.jit
def _gated(g, u, GATED: gl.constexpr):
    """``act(g) * u`` in fp32: ``GATED_SILU`` ``g / (1 + exp(-g))``, ``GATED_GELU_TANH`` the tanh GELU
    ``0.5 g (1 + tanh(t))`` with ``t = sqrt(2/pi) (g + 0.044715 g^3)``, computed as ``g / (1 + exp(-2t))`` (the same
    function: ``(1 + tanh(t)) / 2`` is the logistic of ``2t``), the silu form at ``2t``."""
    if GATED == _GATED_SILU:
        return g / (1.0 + gl.exp(-g)) * u
    else:
        t = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return g / (1.0 + gl.exp(-2.0 * t)) * u


@gluon.jit
def _store_quantized(h, d_desc, out_smem, d_scale_ptr, row, col, M, rows: gl.constexpr):
    """``h`` [128, 128] fp32 quantized 1x128 (``per_token_cast_to_fp8``'s formula: ``scale = max(amax, 1e-4) / 448``,
    ``q = clamp(h / scale, +-448)`` in e4m3) into D (FP8) at (row, col), its scales into row ``col / 128`` of the
    MN-major [N/128, M] fp32 ``d_scale_ptr``."""
    scale = gl.maximum(gl.max(gl.abs(h), axis=1), 1e-4) / 448.0
    q = gl.minimum(gl.maximum(gl.div_rn(h, gl.expand_dims(scale, 1)), -448.0), 448.0)
    store_tile(q, d_desc, out_smem, row, col)
    r = row + gl.arange(0, h.shape[0], layout=rows)
    gl.store(d_scale_ptr + (col // 128).to(gl.int64) * M + r, scale, mask=r < M)


@gluon.jit
def _pin(x):
    """``x`` through a side-effecting register move: what computes ``x`` stays before the next wgmma issue."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _pin_i32(x):
    """The int32 scalar ``x`` through a side-effecting register move, so that what is computed from it stays after
    this point of an unrolled run. In :func:`_ov_run` each K block's ring counter passes through it: without it,
    triton 3.8 and 3.9's LLVM computes the later steps' slots, phases and scale addresses early (the SLP vectorizer
    packs four steps' ``%`` and ``//``; 3.9's wgmma descriptors are built for steps 2-8 at once), and the values
    live across the promotions spill the 128x128 designs' registers (d_128x128_ov8 15-16 STL, g_128x128_ov4 2-10)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ov_issue(a_ring, b0_ring, b1_ring, ready, blk, row: gl.constexpr, q0, q1, WAIT: gl.constexpr):
    """Issue the wgmma of ring slot ``blk`` for the wave of A's tile from ``row``, into the product tiles
    ``q0`` (and ``q1``, the narrow sub-tile, when B has two), after waiting for the slot's data if ``WAIT``."""
    STAGES: gl.constexpr = a_ring.shape[0]
    SPLIT: gl.constexpr = b1_ring.shape[1] != b0_ring.shape[1]
    s = blk % STAGES
    if WAIT:
        mbarrier.wait(ready.index(s), (blk // STAGES) & 1)
    a = a_ring.index(s).slice(row, q0.shape[0])
    t0 = warpgroup_mma(a, b0_ring.index(s).permute((1, 0)), q0, use_acc=False, is_async=True)
    if SPLIT:
        t1 = warpgroup_mma(a, b1_ring.index(s).permute((1, 0)), q1, use_acc=False, is_async=True)
    else:
        t1 = t0
    return t0, t1


@gluon.jit
def _ov_wait(t0, t1, LEFT: gl.constexpr, SPLIT: gl.constexpr):
    """Wait for the product tiles ``t0`` (and ``t1``) of one step, leaving ``LEFT`` later steps in flight."""
    if SPLIT:
        p0, p1 = warpgroup_mma_wait(num_outstanding=2 * LEFT, deps=(t0, t1))
    else:
        p0 = warpgroup_mma_wait(num_outstanding=LEFT, deps=(t0,))
        p1 = p0
    return p0, p1


@gluon.jit
def _ov_a_scales(sa_rows, blk, row: gl.constexpr, rows: gl.constexpr, layout: gl.constexpr):
    """A's scales of the ``rows`` rows from ``row`` in ring slot ``blk``, as a [rows] vector in ``layout``."""
    STAGES: gl.constexpr = sa_rows.shape[0]
    return sa_rows.index(blk % STAGES).slice(row, rows).load(layout)


@gluon.jit
def _ov_b_scales(b_scales, kb, SPLIT: gl.constexpr, SB_COLS: gl.constexpr):
    """B's block scales of K block ``kb`` for the two sub-tiles (``SB_COLS``: 0, not read; the column scales come
    from the stage at the promotion)."""
    sb_ptr, sb_stride, col0, col1, num_k, num_nb = b_scales
    if SB_COLS:
        sb0 = 0.0
    else:
        sb0 = block_scale(sb_ptr, sb_stride, col0, kb, num_k, num_nb)
    if SPLIT:
        sb1 = block_scale(sb_ptr, sb_stride, col1, kb, num_k, num_nb)
    else:
        sb1 = sb0
    return sb0, sb1


@gluon.jit
def _ov_promote(acc0, acc1, p0, p1, sa, sb0, sb1, sb_cols, blk, rows1: gl.constexpr, SPLIT: gl.constexpr,
                SB_COLS: gl.constexpr):  # fmt: skip
    """``acc += p * (sa * sb)`` for one step, with A's scales ``sa`` and B's ``sb0`` / ``sb1`` read when the step
    was issued (:func:`_ov_a_scales`, :func:`_ov_b_scales`); ``SB_COLS``: B's column scales of ring slot ``blk``
    (``sb_cols``) read here, at the promotion, so the [128] vector is not live beside the next step's product tile
    (``acc += p * sa[:, None] * sb[None, :]``)."""
    if SB_COLS:
        STAGES: gl.constexpr = sb_cols.shape[0]
        sbv = sb_cols.index(blk % STAGES).load(gl.SliceLayout(0, acc0.type.layout))
        acc0 = _pin(acc0 + (p0 * sa[:, None]) * sbv[None, :])
    else:
        acc0 = _pin(acc0 + p0 * (sa * sb0)[:, None])
    if SPLIT:
        acc1 = _pin(acc1 + p1 * gl.convert_layout(sa * sb1, rows1)[:, None])
    return acc0, acc1


@gluon.jit
def _ov_run(
    ring,
    b_scales,
    accs,
    qa,
    qb,
    kb,
    it,
    BLOCKS: gl.constexpr,
    WAVES: gl.constexpr,
    ROW0: gl.constexpr,
    rows0: gl.constexpr,
    rows1: gl.constexpr,
    SB_COLS: gl.constexpr,
):
    """``BLOCKS`` K blocks from ``kb`` (ring slot ``it``) as one software-pipelined run of steps (a step: one wave
    of one K block): each step issues the next step's wgmma and reads that step's scales, then waits for its own
    wgmma with one left in flight and promotes, so every promotion but the run's last runs under an MMA and no
    promotion waits for a scale's load. Even steps use the product tiles ``qa``, odd ones ``qb`` (each a pair, one
    tile per sub-tile); the run is unrolled, so each tile keeps its registers, and no wgmma is in flight when it
    returns. ``ring``, ``b_scales``, ``accs`` and ``ROW0`` as :func:`_ov_k_loop` takes them. Returns the
    accumulators and the product tiles (for the next run to overwrite)."""
    a_ring, b0_ring, b1_ring, sa_rows, sb_cols, ready, empty = ring
    acc00, acc01, acc10 = accs
    qa0, qa1 = qa
    qb0, qb1 = qb
    STAGES: gl.constexpr = a_ring.shape[0]
    SPLIT: gl.constexpr = b1_ring.shape[1] != b0_ring.shape[1]
    STEPS: gl.constexpr = BLOCKS * WAVES
    WAVE_M: gl.constexpr = acc00.shape[0]
    sb0, sb1 = _ov_b_scales(b_scales, kb, SPLIT, SB_COLS)
    ta0, ta1 = _ov_issue(a_ring, b0_ring, b1_ring, ready, it, ROW0, qa0, qa1, True)
    sa = _ov_a_scales(sa_rows, it, ROW0, WAVE_M, rows0)
    blk = it
    for i in gl.static_range(STEPS):
        if i + 1 < STEPS:
            # the next step's B scales (read again only for a new K block), its wgmma into the other pair of product
            # tiles (waiting for its stage's data when it starts a K block) on its wave's A rows, then A's scales
            # from that stage; then this step's wgmma, one left in flight
            if (i + 1) % WAVES == 0:
                nxt = _pin_i32(blk + 1)  # the next K block's slot, computed here and not before (see _pin_i32)
                sb0_next, sb1_next = _ov_b_scales(b_scales, kb + (i + 1) // WAVES, SPLIT, SB_COLS)
            else:
                nxt = blk
                sb0_next = sb0
                sb1_next = sb1
            if i % 2 == 0:
                tb0, tb1 = _ov_issue(a_ring, b0_ring, b1_ring, ready, nxt, ROW0 + ((i + 1) % WAVES) * WAVE_M, qb0, qb1,
                                     (i + 1) % WAVES == 0)  # fmt: skip
            else:
                ta0, ta1 = _ov_issue(a_ring, b0_ring, b1_ring, ready, nxt, ROW0 + ((i + 1) % WAVES) * WAVE_M, qa0, qa1,
                                     (i + 1) % WAVES == 0)  # fmt: skip
            sa_next = _ov_a_scales(sa_rows, nxt, ROW0 + ((i + 1) % WAVES) * WAVE_M, WAVE_M, rows0)
            if i % 2 == 0:
                qa0, qa1 = _ov_wait(ta0, ta1, 1, SPLIT)
            else:
                qb0, qb1 = _ov_wait(tb0, tb1, 1, SPLIT)
        else:
            if i % 2 == 0:
                qa0, qa1 = _ov_wait(ta0, ta1, 0, SPLIT)
            else:
                qb0, qb1 = _ov_wait(tb0, tb1, 0, SPLIT)
        if i % 2 == 0:
            p0 = qa0
            p1 = qa1
        else:
            p0 = qb0
            p1 = qb1
        if i % WAVES == 0:
            acc00, acc01 = _ov_promote(acc00, acc01, p0, p1, sa, sb0, sb1, sb_cols, blk, rows1, SPLIT, SB_COLS)
        else:
            acc10, _ = _ov_promote(acc10, acc10, p0, p0, sa, sb0, sb0, sb_cols, blk, rows0, False, SB_COLS)
        if i % WAVES == WAVES - 1:
            release_stage(empty.index(blk % STAGES))  # every wgmma reading this stage is complete
        if i + 1 < STEPS:
            blk = nxt
            sa = sa_next
            sb0 = sb0_next
            sb1 = sb1_next
    return (acc00, acc01, acc10), (qa0, qa1), (qb0, qb1)


@gluon.jit
def _ov_k_loop(
    ring,
    b_scales,
    accs,
    qa,
    it,
    RUN: gl.constexpr,
    WAVES: gl.constexpr,
    ROW0: gl.constexpr,
    rows0: gl.constexpr,
    rows1: gl.constexpr,
    SB_COLS: gl.constexpr,
):
    """The K loop of one tile with the next step's wgmma issued before the current step's promotion (``OVERLAP``
    = ``RUN``, a power of two): runs of ``RUN`` K blocks (:func:`_ov_run`), then the remaining blocks as runs of
    the powers of two below ``RUN`` that make them up. A loop whose back edge a wgmma crosses in flight while the
    body reads that wgmma's tile makes ptxas serialize every wgmma of the kernel (C7514), hence whole runs per
    iteration. ``ring``: the stages ``(a_ring, b0_ring, b1_ring, sa_rows, sb_cols, ready, empty)``; ``b_scales``: what
    :func:`tiles.block_scale` reads, ``(sb_ptr, sb_stride, col0, col1, num_k, num_nb)``; ``accs``: the accumulators
    ``(acc00, acc01, acc10)`` (acc{wave}{sub-tile}); ``qa``: a pair of spare product tiles; ``ROW0``: the first
    row of each wave this partition computes (a split partition's: :func:`_mma_partition`). Returns the
    accumulators and the ring counter past the tile's K blocks."""
    num_k = b_scales[4]
    qb = (_pin(gl.zeros_like(qa[0])), _pin(gl.zeros_like(qa[1])))
    for kb in range(0, num_k - (RUN - 1), RUN):
        accs, qa, qb = _ov_run(ring, b_scales, accs, qa, qb, kb, it, RUN, WAVES, ROW0, rows0, rows1, SB_COLS)
        it += RUN
    kb = num_k - num_k % RUN
    for j in gl.static_range(1, 4):
        if RUN >> j > 0:
            if (num_k % RUN) & (RUN >> j):
                accs, qa, qb = _ov_run(
                    ring, b_scales, accs, qa, qb, kb, it, RUN >> j, WAVES, ROW0, rows0, rows1, SB_COLS
                )
                it += RUN >> j
                kb += RUN >> j
    return accs, it


@gluon.jit
def _gated_k_loop(ring, b_scales, acc_g, acc_u, spare, it, rows: gl.constexpr):
    """The K loop of one gated tile (``GATED``): per K block the gate wgmma, its promotion, then the up wgmma into
    the same product tile and its promotion. Two accumulators and one product tile stay within the registers; a
    second product tile in flight would not. ``ring``: ``(a_ring, b0_ring, b1_ring, sa_rows, ready, empty)``;
    ``b_scales``: what :func:`tiles.block_scale` reads for the gate rows and the up rows, ``(sb_ptr, sb_stride, col_g,
    col_u, num_k, num_nb)``. Returns the accumulators, the product tile and the ring counter past the tile."""
    a_ring, b0_ring, b1_ring, sa_rows, ready, empty = ring
    sb_ptr, sb_stride, col_g, col_u, num_k, num_nb = b_scales
    STAGES: gl.constexpr = a_ring.shape[0]
    next_g = block_scale(sb_ptr, sb_stride, col_g, 0, num_k, num_nb)
    next_u = block_scale(sb_ptr, sb_stride, col_u, 0, num_k, num_nb)
    for kb in range(num_k):
        s = it % STAGES
        sb_g = next_g
        sb_u = next_u
        next_g = block_scale(sb_ptr, sb_stride, col_g, kb + 1, num_k, num_nb)
        next_u = block_scale(sb_ptr, sb_stride, col_u, kb + 1, num_k, num_nb)
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        sa = sa_rows.index(s).load(rows)
        a = a_ring.index(s)
        t = warpgroup_mma(a, b0_ring.index(s).permute((1, 0)), spare, use_acc=False, is_async=True)
        p = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        acc_g = acc_g + p * (sa * sb_g)[:, None]
        t = warpgroup_mma(a, b1_ring.index(s).permute((1, 0)), p, use_acc=False, is_async=True)
        spare = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
        acc_u = acc_u + spare * (sa * sb_u)[:, None]
        release_stage(empty.index(s))  # both wgmma reading stage s are complete
        it += 1
    return acc_g, acc_u, spare, it


@gluon.jit
def _mma_partition(
    args,
    BLOCK_N: gl.constexpr,
    WAVES: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    PERSISTENT: gl.constexpr,
    OVERLAP: gl.constexpr,
    GROUPING: gl.constexpr,
    ACCUMULATE: gl.constexpr,
    ROW_SCALE: gl.constexpr,
    GATED: gl.constexpr,
    SPLITS: gl.constexpr,
    WG_PARTS: gl.constexpr,
    WG: gl.constexpr,
):
    """The MMA warps: every tile of this CTA, ``WAVES`` waves of 128 rows, from ``ring`` (the kernel's stages),
    stored through ``out`` (``d0_desc, d1_desc, out0, out1, out_wg1``); ``args``: ``(ring, out, sb_ptr, group_ptr,
    row_scale_ptr, d_scale_ptr, sb_stride, sb_group_stride, num_groups, M, N, K, tail)``, the kernel's.
    m-grouped: with the tile's group's B scales and the rows of no group zeroed (:func:`_group_rows`; times
    ``row_scale_ptr``'s entries when ``ROW_SCALE``; ``GATED``: the gated activation of the gate and up tiles,
    quantized into D and ``d_scale_ptr``); k-grouped: into the group's rows of D, added to D's tile when
    ``ACCUMULATE``. ``SPLITS`` > 1: every job, a split run's K blocks only (its B scales from its first K block), its
    tile stored by :func:`split_fixup` with ``tail`` (``work_ptr, counter_ptr``), which stores the tile in its last
    run.

    ``WG_PARTS`` 1: the two MMA warpgroups as one partition (the default, ``WG`` 0), each 64 rows of every wave
    (or half the columns of a 64-row wave). ``WG_PARTS`` 2: this partition is MMA warpgroup ``WG`` alone (the default
    partition or a worker), the wave's rows from ``WG * 64``; it waits for each stage, computes and promotes its 64
    rows and releases the stage on its own (``empty`` counts both warpgroups), so one warpgroup's promotion runs under
    the other's wgmma; its rows leave through its own staging tile."""
    # fmt: off
    ring, out, sb_ptr, group_ptr, row_scale_ptr, d_scale_ptr, sb_stride, sb_group_stride, num_groups, M, N, K, \
        tail = args
    # fmt: on
    a_ring, b0_ring, b1_ring, sa_ring, sb_ring, ready, empty = ring
    d0_desc, d1_desc, out0, out1, out_wg1, out1_wg1 = out
    if WG == 1:
        out0 = out_wg1
        out1 = out1_wg1
    NW: gl.constexpr = gl.num_warps()
    SPLIT: gl.constexpr = BLOCK_N == 192
    BN0: gl.constexpr = b0_ring.shape[1]
    BN1: gl.constexpr = b1_ring.shape[1]
    BLOCK_M: gl.constexpr = a_ring.shape[1]
    WAVE_M: gl.constexpr = BLOCK_M // WAVES
    PART_M: gl.constexpr = WAVE_M // WG_PARTS  # the rows of each wave this partition computes
    ROW0: gl.constexpr = WG * PART_M  # ... from this row of the wave
    l0: gl.constexpr = wgmma_layout(PART_M, BN0, NW, 32)
    l1: gl.constexpr = wgmma_layout(PART_M, BN1, NW, 32)
    rows0: gl.constexpr = gl.SliceLayout(1, l0)
    rows1: gl.constexpr = gl.SliceLayout(1, l1)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sa_rows = smem_view(sa_ring, gl.float32, [STAGES, BLOCK_M], flat)
    SB_COLS: gl.constexpr = GROUPING == _K_GROUPED
    cols0: gl.constexpr = gl.SliceLayout(0, l0)
    sb_cols = smem_view(sb_ring, gl.float32, [STAGES, BN0], flat) if SB_COLS else sa_rows
    walks = num_groups if GROUPING == _K_GROUPED else 1
    first, num_tiles, step, num_m, num_n = tile_range(M, N, walks, BLOCK_M, BLOCK_N, PERSISTENT)
    num_nb = gl.cdiv(N * (2 if GATED else 1), 128)  # B's 128-row blocks (gated: the gate and the up rows)
    # Always False, but unknown at compile time. With two waves, each wave's wgmma takes the OTHER wave's
    # accumulator as its (ignored) input tile: ptxas then sees a read of registers the previous promotion wrote and
    # cannot sink that promotion below the wgmma. With a constant False it interleaves the two waves' promotions
    # with the MMAs, holding two product tiles beside both accumulators, and spills (see the module docstring).
    chain = K < 0
    work_ptr, counter_ptr = tail
    jobs, full = job_walk(num_tiles, step, SPLITS)
    it = 0
    for job in range(first, jobs, step):
        tile, group, pm, pn, kb0, tile_k, split = _job(
            job, full, num_m, num_n, group_ptr, num_groups, K, BLOCK_M, GROUP_M, GROUPING, SPLITS
        )
        col0, col1 = _b_cols(pn, N, BLOCK_N, GATED)
        sb_tile = sb_ptr + group * sb_group_stride if GROUPING == _M_GROUPED else sb_ptr
        if SPLITS > 1:  # block_scale counts K blocks from the job's first
            sb_tile = sb_ptr + kb0
        # Accumulators acc{wave}{sub-tile}; spare{sub-tile}: the product tile the next wgmma overwrites.
        acc00 = gl.zeros([PART_M, BN0], gl.float32, l0)
        spare0 = gl.zeros([PART_M, BN0], gl.float32, l0)
        if WAVES == 2:
            acc10 = gl.zeros([PART_M, BN0], gl.float32, l0)
        if SPLIT:
            acc01 = gl.zeros([PART_M, BN1], gl.float32, l1)
            spare1 = gl.zeros([PART_M, BN1], gl.float32, l1)
        elif GATED:
            acc01 = gl.zeros([PART_M, BN1], gl.float32, l1)  # the up tile (acc00: the gate tile)
            spare1 = spare0  # not used: the up wgmma reuses the gate's product tile
        else:
            acc01 = acc00  # not used
            spare1 = spare0  # not used
        if WAVES == 1:
            acc10 = acc00  # not used
        if GATED:
            acc00, acc01, spare0, it = _gated_k_loop(
                (a_ring, b0_ring, b1_ring, sa_rows, ready, empty), (sb_tile, sb_stride, col0, col1, tile_k, num_nb),
                acc00, acc01, spare0, it, rows0,
            )  # fmt: skip
        elif OVERLAP:
            rows_ring = (a_ring, b0_ring, b1_ring, sa_rows, sb_cols, ready, empty)
            b_scales = (sb_tile, sb_stride, col0, col1, tile_k, num_nb)
            accs, it = _ov_k_loop(
                rows_ring, b_scales, (acc00, acc01, acc10), (spare0, spare1), it, OVERLAP, WAVES, ROW0, rows0, rows1,
                SB_COLS,
            )  # fmt: skip
            acc00, acc01, acc10 = accs
        else:
            sbn0 = block_scale(sb_tile, sb_stride, col0, 0, tile_k, num_nb)
            if SPLIT:
                sbn1 = block_scale(sb_tile, sb_stride, col1, 0, tile_k, num_nb)
            for kb in range(tile_k):
                s = it % STAGES
                sb0 = sbn0
                sbn0 = block_scale(sb_tile, sb_stride, col0, kb + 1, tile_k, num_nb)
                if SPLIT:
                    sb1 = sbn1
                    sbn1 = block_scale(sb_tile, sb_stride, col1, kb + 1, tile_k, num_nb)
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                if SB_COLS:  # the K block's column scales came with the stage
                    sbv = sb_cols.index(s).load(cols0)
                for w in gl.static_range(WAVES):
                    sa = sa_rows.index(s).slice(ROW0 + w * WAVE_M, PART_M).load(rows0)
                    a = a_ring.index(s).slice(ROW0 + w * WAVE_M, PART_M)
                    if WAVES == 2:
                        if w == 0:
                            tie = acc10
                        else:
                            tie = acc00
                        t0 = warpgroup_mma(a, b0_ring.index(s).permute((1, 0)), tie, use_acc=chain, is_async=True)
                    else:
                        t0 = warpgroup_mma(a, b0_ring.index(s).permute((1, 0)), spare0, use_acc=False, is_async=True)
                    if SPLIT:
                        t1 = warpgroup_mma(a, b1_ring.index(s).permute((1, 0)), spare1, use_acc=False, is_async=True)
                        p0, p1 = warpgroup_mma_wait(num_outstanding=0, deps=(t0, t1))
                    else:
                        p0 = warpgroup_mma_wait(num_outstanding=0, deps=(t0,))
                    if SB_COLS:
                        acc00 = acc00 + (p0 * sa[:, None]) * sbv[None, :]
                    elif w == 0:
                        acc00 = acc00 + p0 * (sa * sb0)[:, None]
                    else:
                        acc10 = acc10 + p0 * (sa * sb0)[:, None]
                    spare0 = p0
                    if SPLIT:
                        scale1 = gl.convert_layout(sa * sb1, rows1)[:, None]
                        acc01 = acc01 + p1 * scale1
                        spare1 = p1
                    if w == WAVES - 1:
                        release_stage(empty.index(s))  # every wgmma reading stage s is complete
                it += 1
        row = pm * BLOCK_M + ROW0
        if GATED:
            if (group >= -1) & (group < num_groups):  # other ids: the tile is not stored
                h = _group_rows(_gated(acc00, acc01, GATED), group_ptr, row_scale_ptr, row, group, M, rows0, False)
                _store_quantized(h, d0_desc, out0, d_scale_ptr, row, col0, M, rows0)
        elif GROUPING == _M_GROUPED:
            if (group >= -1) & (group < num_groups):  # other ids: the tile is not stored
                acc00 = _group_rows(acc00, group_ptr, row_scale_ptr, row, group, M, rows0, ROW_SCALE)
                store_tile(acc00, d0_desc, out0, row, col0)
                if SPLIT:
                    acc01 = _group_rows(acc01, group_ptr, row_scale_ptr, row, group, M, rows1, ROW_SCALE)
                    store_tile(acc01, d1_desc, out1, row, col1)
        elif GROUPING == _K_GROUPED:
            row += group * M  # D is [G * M, N], M a multiple of 128
            if ACCUMULATE:
                add_tile(acc00, d0_desc, out0, row, col0)
            else:
                store_tile(acc00, d0_desc, out0, row, col0)
        elif SPLITS > 1:
            if tile >= full:
                split_fixup(acc00, work_ptr, counter_ptr, tile - full, split, d0_desc, out0, row, col0, SPLITS)
            else:
                store_tile(acc00, d0_desc, out0, row, col0)
        else:
            store_tile(acc00, d0_desc, out0, row, col0)
            if SPLIT:
                store_tile(acc01, d1_desc, out1, row, col1)
            if WAVES == 2:
                store_tile(acc10, d0_desc, out0, row + WAVE_M, col0)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_gemm_ws_kernel(
    a_desc,
    b0_desc,
    b1_desc,
    sa_desc,
    sb_desc,
    d0_desc,
    d1_desc,
    sb_ptr,
    group_ptr,
    row_scale_ptr,
    d_scale_ptr,
    a_blocks,
    b_blocks,
    sb_stride,
    sb_group_stride,
    num_groups,
    M,
    N,
    K,
    work_ptr,
    counter_ptr,
    BLOCK_N: gl.constexpr,
    WAVES: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    PERSISTENT: gl.constexpr,
    OVERLAP: gl.constexpr,
    GROUPING: gl.constexpr,
    ACCUMULATE: gl.constexpr,
    ROW_SCALE: gl.constexpr,
    GATED: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    SPLITS: gl.constexpr,
    WG_PARTS: gl.constexpr,
    IN_PLACE: gl.constexpr,
):
    """Warp-specialized FP8 GEMM (see the module docstring); launch with ``num_warps=8 // WG_PARTS`` (4 for one
    MMA warpgroup on a 64-row wave).

    ``b1_desc`` / ``d1_desc`` are the narrow (64-column) sub-tile's descriptors when ``BLOCK_N`` is 192; for 128
    they are not read (pass the wide ones again). ``sb_desc`` (B's column scales) is read by the k-grouped form
    only (``ACCUMULATE``: its product added to D), ``row_scale_ptr`` (fp32 [M], read when ``ROW_SCALE``) and
    ``d_scale_ptr`` (fp32 [N/128, M], written when ``GATED``) by the m-grouped one; ``group_ptr`` (m-grouped: int32
    ``m_index`` [M]; k-grouped: int32 K offsets [G + 1]), ``sb_group_stride`` and ``num_groups`` by the grouped
    forms (dense: any descriptor or pointer, 0 and 1). ``sb_ptr`` / ``sb_stride``: B's block scales (not read
    k-grouped). ``a_blocks`` / ``b_blocks``: the ``IN_PLACE`` form's block buffers (else any pointer, not read).
    Gated: ``b1_desc`` is B's (the up rows' sub-tile), ``d0_desc`` D's FP8 one.

    ``SPLITS`` (1, 2, 4, 8 or 16; above 1 dense, persistent, one wave of a 128- or 64-wide tile): the split tail
    (:mod:`split_tail`), with the plan's ``work_ptr`` (fp32 workspace) and ``counter_ptr`` (int32 counters, zero
    between launches); with ``SPLITS`` 1 neither is read. The grid: one CTA per job (:func:`split_tail.split_grid`).

    ``WG_PARTS`` 2 (one 128-row wave of a 64-, 128- or 192-wide tile, no split tail, not gated): each MMA warpgroup a
    partition of its own (:func:`_mma_partition`), the second with :data:`WG1_REGS` registers; D's boxes are then 64
    rows.
    """
    gl.static_assert(BLOCK_N == 64 or BLOCK_N == 128 or BLOCK_N == 192, "BLOCK_N is 64, 128 or 192")
    gl.static_assert(
        BLOCK_N != 64 or (WAVES == 1 and GATED == 0),
        "a 64-wide tile: one wave (128 or 64 rows), not gated",
    )
    gl.static_assert(WAVES == 1 or WAVES == 2, "WAVES is 1 or 2")
    gl.static_assert(BLOCK_N == 128 or WAVES == 1, "a 192-wide tile runs one wave")
    gl.static_assert(GROUPING == _DENSE or WAVES == 1, "a grouped tile is one wave: one group")
    gl.static_assert(
        a_desc.block_type.shape[0] == _WAVE_M * WAVES
        or (a_desc.block_type.shape[0] == 64 and WAVES == 1 and BLOCK_N != 192),
        "A's box: 128 rows a wave, or one 64-row wave of a 128- or 64-wide tile",
    )
    gl.static_assert(GROUPING != _K_GROUPED or BLOCK_N == 128, "k-grouped: 128-wide tiles")
    gl.static_assert(not ACCUMULATE or GROUPING == _K_GROUPED, "ACCUMULATE: k-grouped only")
    gl.static_assert(not IN_PLACE or GROUPING == _K_GROUPED, "IN_PLACE: k-grouped only")
    gl.static_assert(not ROW_SCALE or GROUPING == _M_GROUPED, "ROW_SCALE: m-grouped only")
    gl.static_assert(
        GATED == 0 or (GROUPING == _M_GROUPED and BLOCK_N == 128 and OVERLAP == 0 and not ROW_SCALE),
        "GATED: m-grouped, 128-wide tiles, no overlap, no row scale",
    )
    gl.static_assert(
        OVERLAP == 0 or OVERLAP == 1 or OVERLAP == 2 or OVERLAP == 4 or OVERLAP == 8, "OVERLAP is 0, 1, 2, 4 or 8"
    )
    gl.static_assert(
        SPLITS == 1 or SPLITS == 2 or SPLITS == 4 or SPLITS == 8 or SPLITS == 16, "SPLITS 1, 2, 4, 8 or 16"
    )
    gl.static_assert(
        SPLITS == 1 or (GROUPING == _DENSE and PERSISTENT and WAVES == 1 and BLOCK_N != 192 and GATED == 0),
        "the split tail: dense, persistent, one wave of a 128- or 64-wide tile",
    )
    gl.static_assert(
        WG_PARTS == 1
        or (WG_PARTS == 2 and WAVES == 1 and SPLITS == 1 and GATED == 0
            and a_desc.block_type.shape[0] == _WAVE_M and d0_desc.block_type.shape[0] == _WAVE_M // 2),
        "WG_PARTS 2: one 128-row wave (64-row D boxes), no split tail, not gated",
    )  # fmt: skip
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    SPLIT: gl.constexpr = BLOCK_N == 192
    SB_COLS: gl.constexpr = GROUPING == _K_GROUPED
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, _BLOCK_K], a_desc.layout)
    b0_ring = gl.allocate_shared_memory(b0_desc.dtype, [STAGES] + b0_desc.block_type.shape, b0_desc.layout)
    if SPLIT or GATED != 0:
        b1_ring = gl.allocate_shared_memory(b1_desc.dtype, [STAGES] + b1_desc.block_type.shape, b1_desc.layout)
    if SPLIT:
        out1 = gl.allocate_shared_memory(d1_desc.dtype, d1_desc.block_type.shape, d1_desc.layout)
    sa_ring = gl.allocate_shared_memory(gl.float32, [STAGES] + sa_desc.block_type.shape, sa_desc.layout)
    if SB_COLS:
        sb_ring = gl.allocate_shared_memory(gl.float32, [STAGES] + sb_desc.block_type.shape, sb_desc.layout)
    else:
        sb_ring = sa_ring  # not read
    out0 = gl.allocate_shared_memory(d0_desc.dtype, d0_desc.block_type.shape, d0_desc.layout)
    if WG_PARTS == 2:  # the second warpgroup's staging tile
        out_wg1 = gl.allocate_shared_memory(d0_desc.dtype, d0_desc.block_type.shape, d0_desc.layout)
        if SPLIT:
            out1_wg1 = gl.allocate_shared_memory(d1_desc.dtype, d1_desc.block_type.shape, d1_desc.layout)
        else:
            out1_wg1 = out_wg1
    else:
        out_wg1 = out0  # not written
        out1_wg1 = out0
    if not SPLIT:
        out1 = out0  # not written
        if GATED == 0:
            b1_ring = b0_ring  # not read
    ready, empty = ring_barriers(STAGES, WG_PARTS)  # each MMA partition releases a stage
    fence_async_shared()
    # the stages every partition takes: A, B's sub-tiles, A's (and B's column) scales and the ring's barriers
    ring = (a_ring, b0_ring, b1_ring, sa_ring, sb_ring, ready, empty)
    # the MMA partitions' epilogue: D's descriptors and the shared tiles their stores go through
    out = (d0_desc, d1_desc, out0, out1, out_wg1, out1_wg1)
    # the MMA partitions' runtime arguments (a tuple assigned to a name holds no constexpr: those are passed inline)
    mma = (ring, out, sb_ptr, group_ptr, row_scale_ptr, d_scale_ptr, sb_stride, sb_group_stride, num_groups,
           M, N, K, (work_ptr, counter_ptr))  # fmt: skip
    if WG_PARTS == 2:
        gl.warp_specialize(
            [
                (_mma_partition, (mma, BLOCK_N, WAVES, GROUP_M, STAGES, PERSISTENT, OVERLAP, GROUPING, ACCUMULATE,
                                  ROW_SCALE, GATED, SPLITS, WG_PARTS, 0)),
                (_mma_partition, (mma, BLOCK_N, WAVES, GROUP_M, STAGES, PERSISTENT, OVERLAP, GROUPING, ACCUMULATE,
                                  ROW_SCALE, GATED, SPLITS, WG_PARTS, 1)),
                (_loader, (a_desc, b0_desc, b1_desc, sa_desc, sb_desc, ring, group_ptr, a_blocks, b_blocks, num_groups,
                           M, N, K, BLOCK_N, GROUP_M, STAGES, PERSISTENT, GROUPING, GATED, SPLITS, IN_PLACE)),
            ],
            [4, 1],
            [_WG1_REGS, LOADER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_mma_partition, (mma, BLOCK_N, WAVES, GROUP_M, STAGES, PERSISTENT, OVERLAP, GROUPING, ACCUMULATE,
                                  ROW_SCALE, GATED, SPLITS, WG_PARTS, 0)),
                (_loader, (a_desc, b0_desc, b1_desc, sa_desc, sb_desc, ring, group_ptr, a_blocks, b_blocks, num_groups,
                           M, N, K, BLOCK_N, GROUP_M, STAGES, PERSISTENT, GROUPING, GATED, SPLITS, IN_PLACE)),
            ],
            [1],
            [LOADER_REGS],
        )  # fmt: skip
