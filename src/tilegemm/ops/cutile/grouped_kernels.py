"""cuTile grouped GEMM kernels for MoE (device side): m-grouped contiguous / psum / masked and k-grouped, BF16 and
FP8, and :func:`get_kernel` (their ``@ct.kernel`` objects by name and compiler hints). The host paths that launch
them are :mod:`tilegemm.ops.cutile.grouped`.

One persistent scheduler serves every layout. The grid has at most ``SMs * ctas_per_sm`` CTAs (the
config's occupancy hint, 1 when unset; fewer when a bound on the tile count is smaller); each walks a
virtual list of (group, tile) pairs in strides of the grid size. A group is a range of
rows ``[start, end)`` of a 2-D row space (``a`` rows for m-grouped, ``d[g]`` rows for k-grouped)
and owns ``cdiv(end - start, BM) * cdiv(N, BN)`` tiles; the walk advances its group pointer
while the tile index passes the group's end, so empty groups cost one comparison and the total
tile count never has to be known on the host (no host sync, CUDA-graph capturable). Within a
group, tiles are swizzled in bands of ``GM`` row blocks so that neighbours share B in L2.

Layouts (``KIND``, a :class:`~tilegemm.heuristics.cutile.Kind`):

* ``Kind.INDICES``: ``m_indices[M]`` layout, one walk group of rows ``[0, M)``; each row block's
  expert is its first row's ``m_indices`` entry (-1: the tile is written as zeros; any other
  out-of-range id: the tile is skipped); rows of a computed tile whose own entry differs (the
  ``-1`` padding that ends a group's last block) are written as 0.
* ``Kind.PSUM``: ``offs[G]`` cumulative ends; group g is rows ``[align_up(offs[g-1], A), offs[g])``
  (``A`` = the ``align`` argument: DeepGEMM's psum layout uses 128, ``torch._grouped_mm`` offsets 1).
  A group's tiles run on to the next group's start (the last group's to ``M``), and those rows,
  which belong to no group, are written as zeros.
* ``Kind.MASKED``: group g is rows ``[g * Mmax, g * Mmax + masked_m[g])`` of ``a`` viewed as
  ``[G * Mmax, K]``; rows past it are never touched (tiles are stored element-wise under a row mask).
* ``Kind.K``: k-grouped; group g is all of ``d[g]``, its K range ``[koffs[g], koffs[g+1])``.

Every row range and index read from device memory is clamped into the arrays' bounds, so
no value of ``m_indices``/``offs``/``masked_m``/``ks`` makes a kernel access memory out of
bounds. Every tile starts on a tile boundary of a plain array (psum groups start on multiples of the
alignment, itself a multiple of BM; masked arrays are ``[G, Mmax, *]``; k-grouped K ranges start on
K blocks, ragged ones being repacked on the host), so loads and stores are plain TMA tile accesses
whose array ends stop loads (zero padding) and stores (dropped). No kernel slices an array at run
time: a dynamic ``Array.slice`` makes the kernel build TMA descriptors on the device in a runtime
workspace, and compute-sanitizer memcheck caught those writes out of bounds.

FP8 (docs/kernels.md): a 128-row tile is computed as two independent 64-row accumulators,
each block of 128 K promoted as ``acc += mma(a, b, 0) * sa[:, None] * sb``.

The walk is ``while g < groups: ...; if g < groups: <tile>``, not ``while True`` with a ``break``: with the
``break``, tileiras 13.4 made every m-grouped BF16 kernel (and the k-grouped one without C) wait for each warpgroup
MMA before issuing the next (``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each ``HGMMA``); without it the MMAs of a K
block go out in one group (docs/notes/kernels.md, "MMA groups and the walk loop"; the compile gate checks the grouping).
"""

from __future__ import annotations

import cuda.tile as ct

from tilegemm.heuristics.cutile import Kind
from tilegemm.ops.cutile import launch, tile_lib

__all__ = ["get_kernel"]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

_ZERO = ct.PaddingMode.ZERO

# ------------------------------------------------------------------------------------ scheduler


def _clamp(x, lo, hi):
    return ct.minimum(ct.maximum(x, lo), hi)


def _align_up(x, align):
    return (x + align - 1) // align * align


def _group_start(g, index, rows_total, align):
    """First row of psum group ``g``: its predecessor's end rounded up to ``align``, clamped to ``rows_total``."""
    start = 0
    if g > 0:
        prev = _clamp(ct.load(index, (g - 1,), shape=()), 0, rows_total)
        start = ct.minimum(_align_up(prev, align), rows_total)
    return start


def _group_rows(KIND: int, g, index, rows_total, mmax, align, zero_tail):
    """Rows of walk group ``g``: ``(start, end, store_end)``, clamped into ``[0, rows_total]``.

    The group's tiles cover ``[start, store_end)``: rows ``[start, end)`` get the product, rows
    ``[end, store_end)`` belong to no group and are written 0. For psum, ``store_end`` is the next
    group's start, a multiple of ``align`` (the last group's: the end of ``d`` when ``zero_tail``, else
    its own end rounded up to ``align``); with ``align % BM == 0`` every tile starts on a row block.
    Masked: rows ``[0, masked_m[g])`` of ``d[g]``.
    """
    if KIND == Kind.PSUM:
        start = _group_start(g, index, rows_total, align)
        end = _clamp(ct.load(index, (g,), shape=()), start, rows_total)
        store_end = ct.minimum(_align_up(end, align), rows_total)
        if g + 1 < index.shape[0]:
            store_end = ct.maximum(_group_start(g + 1, index, rows_total, align), end)
        elif zero_tail != 0:
            store_end = rows_total
        return start, end, store_end
    if KIND == Kind.MASKED:  # rows of d[g]
        end = _clamp(ct.load(index, (g,), shape=()), 0, mmax)
        return 0, end, end
    return 0, rows_total, rows_total  # Kind.INDICES: one walk group, every row block names its expert


def _num_walk_groups(KIND: int, num_groups):
    if KIND == Kind.INDICES:
        return 1
    return num_groups


def _load_sa(sa, g, kb, rb, ROWS: int, KIND: int):
    """LHS scales of a ROWS-row block as a ``(1, ROWS)`` tile: ``sa`` is MN-major ``[K/128, rows]`` (masked:
    ``[G, K/128, Mmax]``)."""
    if KIND == Kind.MASKED:
        return ct.reshape(ct.load(sa, (g, kb, rb), shape=(1, 1, ROWS), padding_mode=_ZERO), (1, ROWS))
    return ct.load(sa, (kb, rb), shape=(1, ROWS), padding_mode=_ZERO)


def _store_rows(d, g, rb, nb, tile, end, KIND: int):
    """Store a ``[ROWS, BN]`` tile at row block ``rb`` (masked: inside group ``g``, rows ``>= end`` untouched).

    A TMA store writes whole rows up to the array's end, so masked tiles are stored element-wise under a row
    mask (the rows past ``masked_m`` are left as they were). Only the group's last block needs the mask, but a
    kernel with both kinds of store failed to compile for the 128x256 BF16 and 64-row FP8 configs (tileiras
    13.4, exit 5, no message).
    """
    if KIND == Kind.MASKED:
        rows = tile.shape[0]
        cols = tile.shape[1]
        r = ct.reshape(rb * rows + ct.arange(rows, dtype=ct.int32), (rows, 1))
        c = ct.reshape(nb * cols + ct.arange(cols, dtype=ct.int32), (1, cols))
        ct.scatter(d, (g, r, c), tile, mask=r < end)
    else:
        ct.store(d, (rb, nb), tile)


def _zero_rows_from(acc, row0, end):
    """``acc`` (rows ``row0 ..``) with the rows ``>= end`` set to 0."""
    rows = acc.shape[0]
    keep = ct.reshape(row0 + ct.arange(rows, dtype=ct.int32) < end, (rows, 1))
    return ct.where(keep, acc, ct.full(acc.shape, 0.0, dtype=ct.float32))


# ----------------------------------------------------------------------------------- tile math


def _mma_fp8_part(a, sa, bt, sbv, mrow, kb, BK: int, FAST: bool):
    """One 64-row promotion step: ``mma(a, b, 0) * sa[:, None] * sb`` (``a`` [rows, K], ``sa`` MN-major [K/128, rows]).

    ``FAST`` lets the tensor core accumulate the 128-wide block in its fast (reduced) mode; the
    promotion to the fp32 accumulator after every block keeps the error bounded (DeepGEMM's scheme).
    """
    at = ct.load(a, (mrow, kb), shape=(64, BK), padding_mode=_ZERO)
    sat = ct.load(sa, (kb, mrow), shape=(1, 64), padding_mode=_ZERO)
    part = ct.mma(at, bt, ct.full((64, bt.shape[1]), 0.0, dtype=ct.float32), use_fast_acc=FAST)
    return part * (ct.transpose(sat) * sbv)


def _mma_fp8_rows(a, sa, g, bt, sbv, rb, kb, FAST: bool, KIND: int):
    """:func:`_mma_fp8_part` for 64-row block ``rb`` of ``a`` (masked: inside group ``g``)."""
    at = tile_lib.load_rows(a, g, rb, kb, 64, bt.shape[0], KIND)
    sat = _load_sa(sa, g, kb, rb, 64, KIND)
    part = ct.mma(at, bt, ct.full((64, bt.shape[1]), 0.0, dtype=ct.float32), use_fast_acc=FAST)
    return part * (ct.transpose(sat) * sbv)


def _mask_padding_rows(acc, index, rb, e, ROWS: int):
    """Zero the rows of a ``ROWS``-row tile (row block ``rb``) whose ``m_indices`` entry is not ``e``.

    A group's last 128-row block ends in ``-1`` padding rows: they must read as 0 whatever ``a``
    holds there. One masked select per output tile, after the K loop (not on the MMA chain).
    """
    ids = ct.load(index, (rb,), shape=(ROWS,), padding_mode=_ZERO)
    keep = ct.reshape(ids == e, (ROWS, 1))
    return ct.where(keep, acc, ct.full(acc.shape, 0.0, dtype=ct.float32))


def _rows_of_group(acc, index, rb, e, end, KIND: int):
    """``acc`` (row block ``rb`` of its own height) with the rows of no group set to 0: ``m_indices`` rows not of
    expert ``e``, psum rows from ``end`` on. Masked rows past ``end`` are left to the store's row mask."""
    if KIND == Kind.INDICES:
        acc = _mask_padding_rows(acc, index, rb, e, acc.shape[0])
    elif KIND == Kind.PSUM:
        acc = _zero_rows_from(acc, rb * acc.shape[0], end)
    return acc


def _load_b_fp8(b, sb, e, kb, nb, BN: int, BK: int, TRANS_B: bool):
    """B_e's [BK, BN] block (K-major storage for nt) and its 128x128 block scale as a (1, 1) tile."""
    if TRANS_B:
        bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), order=(0, 2, 1), padding_mode=_ZERO)
    else:
        bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), padding_mode=_ZERO)
    sbv = ct.reshape(ct.load(sb, (e, nb, kb), shape=(1, 1, 1), padding_mode=_ZERO), (1, 1))
    return ct.reshape(bt, (BK, BN)), sbv


def _fp8_rows(a, sa, b, sb, g, e, rb, nb, nk, BN: int, BK: int, TRANS_B: bool, FAST: bool, KIND: int):
    """A 64-row FP8 tile (64-row block ``rb``): one promotion chain."""
    acc = ct.full((64, BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        bt, sbv = _load_b_fp8(b, sb, e, kb, nb, BN, BK, TRANS_B)
        acc = acc + _mma_fp8_rows(a, sa, g, bt, sbv, rb, kb, FAST, KIND)
    return acc


def _fp8_rows2(a, sa, b, sb, g, e, rb, nb, nk, BN: int, BK: int, TRANS_B: bool, FAST: bool, KIND: int):
    """A 128-row FP8 tile (64-row blocks ``rb``, ``rb + 1``) as two independent 64-row promotion chains."""
    acc0 = ct.full((64, BN), 0.0, dtype=ct.float32)
    acc1 = ct.full((64, BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        bt, sbv = _load_b_fp8(b, sb, e, kb, nb, BN, BK, TRANS_B)
        acc0 = acc0 + _mma_fp8_rows(a, sa, g, bt, sbv, rb, kb, FAST, KIND)
        acc1 = acc1 + _mma_fp8_rows(a, sa, g, bt, sbv, rb + 1, kb, FAST, KIND)
    return acc0, acc1


# -------------------------------------------------------------------------------- m-grouped


def _m_grouped_body(
    a, sa, b, sb, d, index, mmax, num_groups, align, zero_tail,
    KIND: int, FP8: bool, TRANS_B: bool, BM: int, BN: int, BK: int, GM: int, FAST: bool,
):  # fmt: skip
    rows_total = a.shape[0]  # masked: a is [G, Mmax, K] and rows are counted inside a group
    n_dim = d.shape[2] if KIND == Kind.MASKED else d.shape[1]
    k_dim = a.shape[2] if KIND == Kind.MASKED else a.shape[1]
    n_tiles = ct.cdiv(n_dim, BN)
    nk = ct.cdiv(k_dim, BK)
    num_walk = _num_walk_groups(KIND, num_groups)

    g = -1
    start = 0
    end = 0
    store_end = 0
    cum_end = 0
    cum = 0
    t = ct.bid(0)
    step = ct.num_blocks(0)
    while g < num_walk:  # no `while True` + `break`: see the module docstring
        # Advance the group pointer past every group that ends at or before tile t.
        while t >= cum_end and g < num_walk:
            g = g + 1
            cum = cum_end
            if g < num_walk:
                start, end, store_end = _group_rows(KIND, g, index, rows_total, mmax, align, zero_tail)
                cum_end = cum + ct.cdiv(store_end - start, BM) * n_tiles
        if g < num_walk:
            _m_grouped_tile(
                a, sa, b, sb, d, index, g, t - cum, start, end, store_end, rows_total, n_tiles, nk, num_groups,
                KIND, FP8, TRANS_B, BM, BN, BK, GM, FAST,
            )  # fmt: skip
            t = t + step


def _m_grouped_tile(
    a, sa, b, sb, d, index, g, lt, start, end, store_end, rows_total, n_tiles, nk, num_groups,
    KIND: int, FP8: bool, TRANS_B: bool, BM: int, BN: int, BK: int, GM: int, FAST: bool,
):  # fmt: skip
    """Tile ``lt`` of walk group ``g`` (rows ``[start, store_end)``, product rows ``[start, end)``): computed,
    zeroed or skipped, and stored."""
    mb, nb = tile_lib.swizzle(lt, ct.cdiv(store_end - start, BM), n_tiles, GM)
    rb = start // BM + mb  # starts are multiples of BM: psum (align % BM == 0), masked and m_indices (0)
    row0 = rb * BM

    # Which expert's B, and whether the tile is computed, zeroed or skipped.
    e = g
    zero = row0 >= end  # every row of the tile belongs to no group
    if KIND == Kind.INDICES:
        e = ct.load(index, (_clamp(row0, 0, rows_total - 1),), shape=())
        zero = e == -1
    valid = (e >= 0) & (e < num_groups)

    if zero:
        # One whole-tile store of zeros (two 64-row zero stores in a static loop lost the first one's
        # data on sm_90: that half of the rows read back as garbage).
        _store_rows(d, g, rb, nb, ct.full((BM, BN), 0.0, dtype=d.dtype), end, KIND)
    elif FP8:
        if valid:
            if BM == 128:
                acc0, acc1 = _fp8_rows2(a, sa, b, sb, g, e, 2 * rb, nb, nk, BN, BK, TRANS_B, FAST, KIND)
                acc0 = _rows_of_group(acc0, index, 2 * rb, e, end, KIND)
                acc1 = _rows_of_group(acc1, index, 2 * rb + 1, e, end, KIND)
                _store_rows(d, g, 2 * rb, nb, ct.astype(acc0, d.dtype), end, KIND)
                _store_rows(d, g, 2 * rb + 1, nb, ct.astype(acc1, d.dtype), end, KIND)
            else:
                acc0 = _rows_of_group(
                    _fp8_rows(a, sa, b, sb, g, e, rb, nb, nk, BN, BK, TRANS_B, FAST, KIND), index, rb, e, end, KIND
                )
                _store_rows(d, g, rb, nb, ct.astype(acc0, d.dtype), end, KIND)
    else:
        if valid:
            acc = _rows_of_group(
                tile_lib.mma_bf16(a, b, g, e, rb, nb, nk, BM, BN, BK, TRANS_B, KIND), index, rb, e, end, KIND
            )
            _store_rows(d, g, rb, nb, ct.astype(acc, d.dtype), end, KIND)


def _m_grouped_bf16_gemm_kernel(
    a, b, d, index, mmax: int, num_groups: int, align: int, zero_tail: int,
    KIND: ConstInt, TRANS_B: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt,
):  # fmt: skip
    _m_grouped_body(
        a, a, b, b, d, index, mmax, num_groups, align, zero_tail, KIND, False, TRANS_B, BM, BN, BK, GM, False
    )


def _m_grouped_fp8_gemm_kernel(
    a, sa, b, sb, d, index, mmax: int, num_groups: int, align: int, zero_tail: int,
    KIND: ConstInt, TRANS_B: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt, FAST: ConstBool,
):  # fmt: skip
    ct.static_assert((BM == 128 or BM == 64) and BK == 128 and BN == 128, "FP8 tiles: 64/128 rows x 128 x 128")
    _m_grouped_body(
        a, sa, b, sb, d, index, mmax, num_groups, align, zero_tail, KIND, True, TRANS_B, BM, BN, BK, GM, FAST
    )


# -------------------------------------------------------------------------------- k-grouped


def _k_store(c, d, g, mb, nb, acc, HAS_C: bool, C_IS_D: bool):
    """``d[g]`` tile (mb, nb) = acc (+ the same tile of ``c``; read from ``d`` itself when ``C_IS_D``), rounded to
    ``d``'s dtype (fp32 for the public ops; bf16 for the training weight gradients)."""
    rows = acc.shape[0]
    cols = acc.shape[1]
    if HAS_C:
        if C_IS_D:
            c_tile = ct.load(d, (g, mb, nb), shape=(1, rows, cols), padding_mode=_ZERO)
        else:
            c_tile = ct.load(c, (g, mb, nb), shape=(1, rows, cols), padding_mode=_ZERO)
        acc = acc + ct.reshape(c_tile, (rows, cols))
    ct.store(d, (g, mb, nb), ct.reshape(ct.astype(acc, d.dtype), (1, rows, cols)))


def _k_grouped_body(
    a, sa, b, sb, c, d, koffs, FP8: bool, HAS_C: bool, C_IS_D: bool, BM: int, BN: int, BK: int, GM: int, FAST: bool
):
    num_groups = d.shape[0]
    m_dim = d.shape[1]
    n_dim = d.shape[2]
    k_total = a.shape[1] if FP8 else a.shape[0]
    n_tiles = ct.cdiv(n_dim, BN)
    mblocks = ct.cdiv(m_dim, BM)
    per_group = mblocks * n_tiles

    g = -1
    cum_end = 0
    cum = 0
    t = ct.bid(0)
    step = ct.num_blocks(0)
    while g < num_groups:  # no `while True` + `break`: see the module docstring
        while t >= cum_end and g < num_groups:
            g = g + 1
            cum = cum_end
            cum_end = cum + per_group
        if g < num_groups:
            _k_grouped_tile(
                a, sa, b, sb, c, d, koffs, g, t - cum, k_total, mblocks, n_tiles,
                FP8, HAS_C, C_IS_D, BM, BN, BK, GM, FAST,
            )  # fmt: skip
            t = t + step


def _k_grouped_tile(
    a, sa, b, sb, c, d, koffs, g, lt, k_total, mblocks, n_tiles,
    FP8: bool, HAS_C: bool, C_IS_D: bool, BM: int, BN: int, BK: int, GM: int, FAST: bool,
):  # fmt: skip
    """Tile ``lt`` of ``d[g]``: the product over group ``g``'s K range (plus ``c``), stored."""
    mb, nb = tile_lib.swizzle(lt, mblocks, n_tiles, GM)
    # Group g's K range [k0, k1): every group starts on a K block (the host aligns ragged ks), so
    # its blocks are plain tile indices; the array's end stops the last one (zero padding).
    k0 = _clamp(ct.load(koffs, (g,), shape=()), 0, k_total)
    k1 = _clamp(ct.load(koffs, (g + 1,), shape=()), k0, k_total)
    kb0 = k0 // BK
    nkb = ct.cdiv(k1 - kb0 * BK, BK)
    if FP8:
        # a, b are K-major copies [M, K_sum], [N, K_sum] (Hopper FP8 MMAs take K-major operands).
        acc0 = ct.full((64, BN), 0.0, dtype=ct.float32)
        acc1 = ct.full((64, BN), 0.0, dtype=ct.float32)
        for kb in range(kb0, kb0 + nkb):
            bt = ct.load(b, (kb, nb), shape=(BK, BN), order=(1, 0), padding_mode=_ZERO)
            sbt = ct.load(sb, (kb, nb), shape=(1, BN), padding_mode=_ZERO)
            acc0 = acc0 + _mma_fp8_part(a, sa, bt, sbt, mb * 2, kb, BK, FAST)
            acc1 = acc1 + _mma_fp8_part(a, sa, bt, sbt, mb * 2 + 1, kb, BK, FAST)
        _k_store(c, d, g, mb * 2, nb, acc0, HAS_C, C_IS_D)
        _k_store(c, d, g, mb * 2 + 1, nb, acc1, HAS_C, C_IS_D)
    else:
        acc = ct.full((BM, BN), 0.0, dtype=ct.float32)
        for kb in range(kb0, kb0 + nkb):
            at = ct.load(a, (mb, kb), shape=(BM, BK), order=(1, 0), padding_mode=_ZERO)
            bt = ct.load(b, (kb, nb), shape=(BK, BN), padding_mode=_ZERO)
            acc = ct.mma(at, bt, acc)
        if HAS_C:
            # 32-row parts keep the C tile's registers small (a 128x128 fp32 C tile spills; 64-row halves spilled 6
            # words on sm_90 once the walk had no `break`).
            for h in ct.static_iter(range(BM // 32)):
                _k_store(c, d, g, mb * (BM // 32) + h, nb, ct.extract(acc, (h, 0), shape=(32, BN)), HAS_C, C_IS_D)
        else:
            _k_store(c, d, g, mb, nb, acc, HAS_C, C_IS_D)


def _k_grouped_bf16_gemm_kernel(
    a, b, c, d, koffs, HAS_C: ConstBool, C_IS_D: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt
):
    _k_grouped_body(a, a, b, b, c, d, koffs, False, HAS_C, C_IS_D, BM, BN, BK, GM, False)


def _k_grouped_fp8_gemm_kernel(
    a, sa, b, sb, c, d, koffs,
    HAS_C: ConstBool, C_IS_D: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt, FAST: ConstBool,
):  # fmt: skip
    ct.static_assert(BM == 128 and BK == 128, "FP8 tiles are 128 rows (two 64-row chains) x 128 of K")
    _k_grouped_body(a, sa, b, sb, c, d, koffs, True, HAS_C, C_IS_D, BM, BN, BK, GM, FAST)


#: ``get_kernel(name, num_worker_warps, occupancy)``: the cached ``@ct.kernel`` of each kernel with those hints.
get_kernel = launch.kernel_factory(
    {
        "m_bf16": _m_grouped_bf16_gemm_kernel,
        "m_fp8": _m_grouped_fp8_gemm_kernel,
        "k_bf16": _k_grouped_bf16_gemm_kernel,
        "k_fp8": _k_grouped_fp8_gemm_kernel,
    }
)
