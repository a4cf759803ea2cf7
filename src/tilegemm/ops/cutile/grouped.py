"""cuTile grouped GEMMs for MoE: m-grouped contiguous / psum / masked and k-grouped, BF16 and FP8.

One persistent scheduler serves every layout. The grid has at most ``num_sms`` programs; each
walks a virtual list of (group, tile) pairs in strides of the grid size. A group is a range of
rows ``[start, end)`` of a 2-D row space (``a`` rows for m-grouped, ``d[g]`` rows for k-grouped)
and owns ``cdiv(end - start, BM) * cdiv(N, BN)`` tiles; the walk advances its group pointer
while the tile index passes the group's end, so empty groups cost one comparison and the total
tile count never has to be known on the host (no host sync, CUDA-graph capturable). Within a
group, tiles are swizzled in bands of ``GM`` row blocks so that neighbours share B in L2.

Layouts (``KIND``):

* ``KIND_INDICES``: ``m_indices[M]`` layout, one walk group of rows ``[0, M)``; each row block's
  expert is its first row's ``m_indices`` entry (-1: the tile is written as zeros; any other
  out-of-range id: the tile is skipped); rows of a computed tile whose own entry differs (the
  ``-1`` padding that ends a group's last block) are written as 0.
* ``KIND_PSUM``: ``offs[G]`` cumulative ends (``torch._grouped_mm`` meaning, unaligned);
  walk group ``G`` is the tail ``[offs[G-1], M)``, written as zeros.
* ``KIND_MASKED``: group g is rows ``[g * Mmax, g * Mmax + masked_m[g])`` of ``a`` viewed as
  ``[G * Mmax, K]``; rows past it are never touched.
* ``KIND_K``: k-grouped; group g is all of ``d[g]``, its K range ``[koffs[g], koffs[g+1])``.

Every row range and index read from device memory is clamped into the arrays' bounds, so
no value of ``m_indices``/``offs``/``masked_m``/``ks`` makes a kernel access memory out of
bounds. Partial tiles use views (``Array.slice``) whose ends stop loads (zero padding) and
stores (dropped) at the group's last row.

FP8 follows DESIGN.md: a 128-row tile is computed as two independent 64-row accumulators,
each block of 128 K promoted as ``acc += mma(a, b, 0) * sa[:, None] * sb``.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.tile as ct
import torch

from tilegemm import config
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.ops.cutile import heuristics

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

KIND_INDICES = 0
KIND_PSUM = 1
KIND_MASKED = 2
KIND_K = 3

_ZERO = ct.PaddingMode.ZERO
_FP8 = torch.float8_e4m3fn


# ------------------------------------------------------------------------------------ scheduler


def _clamp(x, lo, hi):
    return ct.minimum(ct.maximum(x, lo), hi)


def _group_rows(KIND: int, g, index, rows_total, mmax):
    """Rows ``[start, end)`` of walk group ``g`` in the row space, clamped to ``[0, rows_total]``."""
    if KIND == KIND_INDICES:
        return 0, rows_total
    if KIND == KIND_PSUM:
        num = index.shape[0]
        start = 0
        if g > 0:
            start = _clamp(ct.load(index, (g - 1,), shape=()), 0, rows_total)
        end = rows_total
        if g < num:
            end = _clamp(ct.load(index, (g,), shape=()), start, rows_total)
        return start, end
    if KIND == KIND_MASKED:
        start = g * mmax
        return start, start + _clamp(ct.load(index, (g,), shape=()), 0, mmax)
    return 0, rows_total  # KIND_K: every group is all of d[g]


def _num_walk_groups(KIND: int, index, num_groups):
    if KIND == KIND_INDICES:
        return 1
    if KIND == KIND_PSUM:
        return index.shape[0] + 1  # + the zero tail past offs[G-1]
    return num_groups


def _swizzle(lt, mblocks, n_tiles, GM: int):
    """Group-local tile ``lt`` -> (row block, col block), bands of ``GM`` row blocks, rows fastest."""
    band = lt // (GM * n_tiles)
    first = band * GM
    gm = ct.minimum(mblocks - first, GM)
    w = lt - band * GM * n_tiles
    return first + w % gm, w // gm


# ----------------------------------------------------------------------------------- tile math


def _mma_bf16(a_v, b, e, mb, nb, nk, BM: int, BN: int, BK: int, TRANS_B: bool):
    """fp32 [BM, BN] = a_v[mb rows, :] @ B_e[:, nb cols] over ``nk`` blocks of BK (zero padded)."""
    acc = ct.full((BM, BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        at = ct.load(a_v, (mb, kb), shape=(BM, BK), padding_mode=_ZERO)
        if TRANS_B:
            bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), order=(0, 2, 1), padding_mode=_ZERO)
        else:
            bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), padding_mode=_ZERO)
        acc = ct.mma(at, ct.reshape(bt, (BK, BN)), acc)
    return acc


def _mma_fp8_part(a_v, sa_v, bt, sbv, mrow, kb, kb0, BK: int, FAST: bool):
    """One 64-row promotion step: ``mma(a, b, 0) * sa[:, None] * sb`` (``sa_v`` is MN-major [K/128, rows]).

    ``FAST`` lets the tensor core accumulate the 128-wide block in its fast (reduced) mode; the
    promotion to the fp32 accumulator after every block keeps the error bounded (DeepGEMM's scheme).
    """
    at = ct.load(a_v, (mrow, kb), shape=(64, BK), padding_mode=_ZERO)
    sat = ct.load(sa_v, (kb0 + kb, mrow), shape=(1, 64), padding_mode=_ZERO)
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


def _load_b_fp8(b, sb, e, kb, nb, BN: int, BK: int, TRANS_B: bool):
    """B_e's [BK, BN] block (K-major storage for nt) and its 128x128 block scale as a (1, 1) tile."""
    if TRANS_B:
        bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), order=(0, 2, 1), padding_mode=_ZERO)
    else:
        bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), padding_mode=_ZERO)
    sbv = ct.reshape(ct.load(sb, (e, nb, kb), shape=(1, 1, 1), padding_mode=_ZERO), (1, 1))
    return ct.reshape(bt, (BK, BN)), sbv


def _fp8_tile1(a_v, sa_v, b, sb, e, mb, nb, nk, BN: int, BK: int, TRANS_B: bool, FAST: bool):
    """A 64-row FP8 tile: one promotion chain."""
    acc = ct.full((64, BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        bt, sbv = _load_b_fp8(b, sb, e, kb, nb, BN, BK, TRANS_B)
        acc = acc + _mma_fp8_part(a_v, sa_v, bt, sbv, mb, kb, 0, BK, FAST)
    return acc


def _fp8_tile2(a_v, sa_v, b, sb, e, mb, nb, nk, BN: int, BK: int, TRANS_B: bool, FAST: bool):
    """A 128-row FP8 tile as two independent 64-row promotion chains (DESIGN.md's lead)."""
    acc0 = ct.full((64, BN), 0.0, dtype=ct.float32)
    acc1 = ct.full((64, BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        bt, sbv = _load_b_fp8(b, sb, e, kb, nb, BN, BK, TRANS_B)
        acc0 = acc0 + _mma_fp8_part(a_v, sa_v, bt, sbv, 2 * mb, kb, 0, BK, FAST)
        acc1 = acc1 + _mma_fp8_part(a_v, sa_v, bt, sbv, 2 * mb + 1, kb, 0, BK, FAST)
    return acc0, acc1


# -------------------------------------------------------------------------------- m-grouped


def _m_grouped_body(
    a, sa, b, sb, d, index, mmax, num_groups,
    KIND: int, FP8: bool, TRANS_B: bool, BM: int, BN: int, BK: int, GM: int, FAST: bool,
):  # fmt: skip
    rows_total = a.shape[0]
    n_dim = d.shape[1]
    k_dim = a.shape[1]
    n_tiles = ct.cdiv(n_dim, BN)
    nk = ct.cdiv(k_dim, BK)
    num_walk = _num_walk_groups(KIND, index, num_groups)

    g = -1
    start = 0
    end = 0
    cum_end = 0
    cum = 0
    t = ct.bid(0)
    step = ct.num_blocks(0)
    while True:
        # Advance the group pointer past every group that ends at or before tile t.
        while t >= cum_end and g < num_walk:
            g = g + 1
            cum = cum_end
            if g < num_walk:
                start, end = _group_rows(KIND, g, index, rows_total, mmax)
                cum_end = cum + ct.cdiv(end - start, BM) * n_tiles
        if g >= num_walk:
            break
        mblocks = ct.cdiv(end - start, BM)
        mb, nb = _swizzle(t - cum, mblocks, n_tiles, GM)

        # Which expert's B, and whether the tile is computed, zeroed or skipped.
        e = g
        zero = False
        if KIND == KIND_INDICES:
            e = ct.load(index, (_clamp(mb * BM, 0, rows_total - 1),), shape=())
            zero = e == -1
        if KIND == KIND_PSUM:
            zero = g == num_groups
        valid = (e >= 0) & (e < num_groups)

        if KIND == KIND_INDICES:
            a_v = a
            d_v = d
        else:
            a_v = a.slice(0, start, end)
            d_v = d.slice(0, start, end)
        if zero:
            ct.store(d_v, (mb, nb), ct.full((BM, BN), 0.0, dtype=d.dtype))
        elif valid:
            if FP8:
                if KIND == KIND_INDICES:
                    sa_v = sa
                else:
                    sa_v = sa.slice(1, start, end)
                if BM == 128:
                    acc0, acc1 = _fp8_tile2(a_v, sa_v, b, sb, e, mb, nb, nk, BN, BK, TRANS_B, FAST)
                    if KIND == KIND_INDICES:
                        acc0 = _mask_padding_rows(acc0, index, 2 * mb, e, 64)
                        acc1 = _mask_padding_rows(acc1, index, 2 * mb + 1, e, 64)
                    ct.store(d_v, (2 * mb, nb), ct.astype(acc0, d.dtype))
                    ct.store(d_v, (2 * mb + 1, nb), ct.astype(acc1, d.dtype))
                else:
                    acc0 = _fp8_tile1(a_v, sa_v, b, sb, e, mb, nb, nk, BN, BK, TRANS_B, FAST)
                    if KIND == KIND_INDICES:
                        acc0 = _mask_padding_rows(acc0, index, mb, e, 64)
                    ct.store(d_v, (mb, nb), ct.astype(acc0, d.dtype))
            else:
                acc = _mma_bf16(a_v, b, e, mb, nb, nk, BM, BN, BK, TRANS_B)
                if KIND == KIND_INDICES:
                    acc = _mask_padding_rows(acc, index, mb, e, BM)
                ct.store(d_v, (mb, nb), ct.astype(acc, d.dtype))
        t = t + step


def _m_grouped_bf16(
    a, b, d, index, mmax: int, num_groups: int,
    KIND: ConstInt, TRANS_B: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt,
):  # fmt: skip
    _m_grouped_body(a, a, b, b, d, index, mmax, num_groups, KIND, False, TRANS_B, BM, BN, BK, GM, False)


def _m_grouped_fp8(
    a, sa, b, sb, d, index, mmax: int, num_groups: int,
    KIND: ConstInt, TRANS_B: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt, FAST: ConstBool,
):  # fmt: skip
    ct.static_assert((BM == 128 or BM == 64) and BK == 128 and BN == 128, "FP8 tiles: 64/128 rows x 128 x 128")
    _m_grouped_body(a, sa, b, sb, d, index, mmax, num_groups, KIND, True, TRANS_B, BM, BN, BK, GM, FAST)


# -------------------------------------------------------------------------------- k-grouped


def _k_store(c, d, g, mb, nb, acc, HAS_C: bool, C_IS_D: bool):
    """``d[g]`` tile (mb, nb) = acc (+ the same tile of ``c``; read from ``d`` itself when ``C_IS_D``)."""
    rows = acc.shape[0]
    cols = acc.shape[1]
    if HAS_C:
        if C_IS_D:
            c_tile = ct.load(d, (g, mb, nb), shape=(1, rows, cols), padding_mode=_ZERO)
        else:
            c_tile = ct.load(c, (g, mb, nb), shape=(1, rows, cols), padding_mode=_ZERO)
        acc = acc + ct.reshape(c_tile, (rows, cols))
    ct.store(d, (g, mb, nb), ct.reshape(acc, (1, rows, cols)))


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
    while True:
        while t >= cum_end and g < num_groups:
            g = g + 1
            cum = cum_end
            cum_end = cum + per_group
        if g >= num_groups:
            break
        mb, nb = _swizzle(t - cum, mblocks, n_tiles, GM)
        k0 = _clamp(ct.load(koffs, (g,), shape=()), 0, k_total)
        k1 = _clamp(ct.load(koffs, (g + 1,), shape=()), k0, k_total)
        if FP8:
            # a, b are K-major copies [M, K_sum], [N, K_sum] (Hopper FP8 MMAs take K-major operands);
            # every group's K range starts on a 128 boundary (ks multiples of 128, checked on the host).
            k0 = k0 // BK * BK  # a K range always starts on a scale block (a multiple of 128 for valid ks)
            acc0 = ct.full((64, BN), 0.0, dtype=ct.float32)
            acc1 = ct.full((64, BN), 0.0, dtype=ct.float32)
            if k1 > k0:
                a_v = a.slice(1, k0, k1)
                b_v = b.slice(1, k0, k1)
                kb0 = k0 // BK
                for kb in range(ct.cdiv(k1 - k0, BK)):
                    bt = ct.load(b_v, (kb, nb), shape=(BK, BN), order=(1, 0), padding_mode=_ZERO)
                    sbt = ct.load(sb, (kb0 + kb, nb), shape=(1, BN), padding_mode=_ZERO)
                    acc0 = acc0 + _mma_fp8_part(a_v, sa, bt, sbt, mb * 2, kb, kb0, BK, FAST)
                    acc1 = acc1 + _mma_fp8_part(a_v, sa, bt, sbt, mb * 2 + 1, kb, kb0, BK, FAST)
            _k_store(c, d, g, mb * 2, nb, acc0, HAS_C, C_IS_D)
            _k_store(c, d, g, mb * 2 + 1, nb, acc1, HAS_C, C_IS_D)
        else:
            acc = ct.full((BM, BN), 0.0, dtype=ct.float32)
            if k1 > k0:
                a_v = a.slice(0, k0, k1)
                b_v = b.slice(0, k0, k1)
                for kb in range(ct.cdiv(k1 - k0, BK)):
                    at = ct.load(a_v, (mb, kb), shape=(BM, BK), order=(1, 0), padding_mode=_ZERO)
                    bt = ct.load(b_v, (kb, nb), shape=(BK, BN), padding_mode=_ZERO)
                    acc = ct.mma(at, bt, acc)
            if HAS_C:
                # 64-row halves keep the C tile's registers small (a 128x128 fp32 C tile spills).
                for h in ct.static_iter(range(BM // 64)):
                    _k_store(c, d, g, mb * (BM // 64) + h, nb, ct.extract(acc, (h, 0), shape=(64, BN)), HAS_C, C_IS_D)
            else:
                _k_store(c, d, g, mb, nb, acc, HAS_C, C_IS_D)
        t = t + step


def _k_grouped_bf16(
    a, b, c, d, koffs, HAS_C: ConstBool, C_IS_D: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt
):
    _k_grouped_body(a, a, b, b, c, d, koffs, False, HAS_C, C_IS_D, BM, BN, BK, GM, False)


def _k_grouped_fp8(
    a, sa, b, sb, c, d, koffs,
    HAS_C: ConstBool, C_IS_D: ConstBool, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt, FAST: ConstBool,
):  # fmt: skip
    ct.static_assert(BM == 128 and BK == 128, "FP8 tiles are 128 rows (two 64-row chains) x 128 of K")
    _k_grouped_body(a, sa, b, sb, c, d, koffs, True, HAS_C, C_IS_D, BM, BN, BK, GM, FAST)


_KERNEL_FNS = {
    "m_bf16": _m_grouped_bf16,
    "m_fp8": _m_grouped_fp8,
    "k_bf16": _k_grouped_bf16,
    "k_fp8": _k_grouped_fp8,
}


@functools.cache
def get_kernel(name: str, num_worker_warps: int | None = None, occupancy: int | None = None) -> Any:
    """The ``@ct.kernel`` object for kernel family ``name`` with these compiler options (cached)."""
    return ct.kernel(_KERNEL_FNS[name], num_worker_warps=num_worker_warps, occupancy=occupancy)


# ------------------------------------------------------------------------------------- host side


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    """``x`` with unit last stride and 16-byte row strides (a copy only when needed)."""
    elem = x.element_size()
    ok = x.stride(-1) == 1 and all(s * elem % 16 == 0 for s in x.stride()[:-1]) and x.data_ptr() % 16 == 0
    return x if ok else x.contiguous()


def _check_sizes(*tensors: torch.Tensor) -> None:
    """The kernels index with int32: refuse (fall back) for tensors of 2**31 elements or more."""
    for t in tensors:
        if t.numel() >= 2**31:
            raise Unsupported("a tensor has >= 2**31 elements (int32 indexing)")


def _check_tma_weight(b: torch.Tensor) -> None:
    """The per-expert weight ``b [G, N, K]`` is only read by TMA (64-bit addresses from the tensor map), so
    its element count may pass 2**31 (DeepSeek-V3: 256 x 4096 x 7168); each of its sizes and element
    strides must still fit the int32 index type."""
    if max(*b.shape, *b.stride()) >= 2**31:
        raise Unsupported("a weight dimension or stride is >= 2**31 (int32 indexing)")


def _grid(cfg: heuristics.GroupedConfig, upper_tiles: int) -> tuple[int, int, int]:
    sms = config.get_num_sms() or 1
    return (max(1, min(sms * cfg.ctas_per_sm, upper_tiles)), 1, 1)


def _launch(kernel: Any, grid: tuple[int, int, int], args: tuple[Any, ...]) -> None:
    ct.launch(torch.cuda.current_stream(), grid, kernel, args)


def _m_grouped(
    op: str,
    a: Any,
    b: Any,
    d: torch.Tensor,
    index: torch.Tensor,
    kind: int,
    trans_b: bool,
    fp8: bool,
    expected_m: int,
    alignment: int = 128,
    cfg: heuristics.GroupedConfig | None = None,
) -> torch.Tensor:
    """Shared host path of the m-grouped ops (``a``/``b`` are tensors or (data, scale) tuples).

    ``alignment``: the psum layout's group-start alignment (not yet read: the kernel aligns to 128).
    ``cfg`` overrides the heuristic's choice (benchmarks and the compile gate use it).
    """
    if fp8:
        (a_data, sa), (b_data, sb) = a, b
    else:
        a_data, b_data, sa, sb = a, b, None, None
    num_groups = b_data.shape[0]
    if kind == KIND_MASKED:
        mmax = a_data.shape[1]
        flat = a_data.shape[0] * mmax  # explicit sizes: reshape(-1, 0) is ambiguous when K == 0
        a_data = a_data.reshape(flat, a_data.shape[-1])
        d2 = d.view(flat, d.shape[-1])
        if fp8:
            sa = sa.reshape(flat, sa.shape[-1])
    else:
        mmax = 0
        d2 = d
    rows, k_dim = a_data.shape
    n_dim = d2.shape[1]
    if rows == 0 or n_dim == 0:
        return d
    if k_dim == 0 or num_groups == 0:  # every written row is an empty sum (or padding): 0, no kernel
        if kind == KIND_MASKED:
            valid = torch.arange(mmax, device=d.device)[None, :, None] < index[:, None, None]
            return d.masked_fill_(valid, 0)
        return d.zero_()
    _check_sizes(a_data, d2)
    _check_tma_weight(b_data)
    if fp8 and sb.shape[-2] != -(-n_dim // 128):
        raise Unsupported("m-grouped FP8 takes 128x128 RHS scales only")
    if cfg is None:
        hint = expected_m if kind == KIND_MASKED else rows // num_groups
        cfg = heuristics.grouped_config(
            op, kind=kind, fp8=fp8, rows=rows, n=n_dim, k=k_dim, groups=num_groups, expected_m=hint
        )
    heuristics.maybe_print_grouped_config(op, {"rows": rows, "n": n_dim, "k": k_dim, "groups": num_groups}, cfg)
    if fp8 and not trans_b:
        # Hopper FP8 MMAs take K-major operands only: NN weights are copied to [G, N, K] (as DeepGEMM requires).
        b_data = b_data.transpose(1, 2).contiguous()
        trans_b = True
    a_data = _tma_ready(a_data)
    b_data = _tma_ready(b_data)
    index = index.contiguous()
    n_tiles = -(-n_dim // cfg.bn)
    if kind == KIND_MASKED:
        upper = num_groups * -(-mmax // cfg.bm) * n_tiles
    elif kind == KIND_PSUM:
        upper = (-(-rows // cfg.bm) + num_groups + 1) * n_tiles
    else:
        upper = -(-rows // cfg.bm) * n_tiles
    consts = (kind, trans_b, cfg.bm, cfg.bn, cfg.bk, cfg.gm)
    if fp8:
        sa_t = sa.t().contiguous()  # [K/128, rows]: MN-major LHS scales, one TMA row per 64-row part
        kernel = get_kernel("m_fp8", cfg.num_worker_warps, cfg.occupancy)
        args = (a_data, sa_t, b_data, sb.contiguous(), d2, index, mmax, num_groups, *consts, cfg.fast_acc)
    else:
        kernel = get_kernel("m_bf16", cfg.num_worker_warps, cfg.occupancy)
        args = (a_data, b_data, d2, index, mmax, num_groups, *consts)
    _launch(kernel, _grid(cfg, upper), args)
    return d


def _k_offsets(ks: list[int], ks_tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """int32 [G + 1] prefix sums of ``ks`` on ``device`` (from ``ks_tensor`` on the device when given)."""
    if ks_tensor is not None:
        sums = torch.cumsum(ks_tensor.to(device=device, dtype=torch.int32), 0, dtype=torch.int32)
        return torch.cat([sums.new_zeros(1), sums])
    return _cached_offsets(tuple(int(k) for k in ks), device)


@functools.lru_cache(maxsize=256)
def _cached_offsets(ks: tuple[int, ...], device: torch.device) -> torch.Tensor:
    prefix = [0]
    for k in ks:
        prefix.append(prefix[-1] + k)
    return torch.tensor(prefix, dtype=torch.int32).to(device)


def _k_grouped(
    op: str,
    a: Any,
    b: Any,
    d: torch.Tensor,
    ks: list[int],
    ks_tensor: torch.Tensor | None,
    c: torch.Tensor | None,
    fp8: bool,
    cfg: heuristics.GroupedConfig | None = None,
) -> torch.Tensor:
    """Shared host path of the k-grouped ops: ``d[g] = a_g.T @ b_g (+ c[g])`` in fp32."""
    if fp8:
        (a_data, sa), (b_data, sb) = a, b
    else:
        a_data, b_data, sa, sb = a, b, None, None
    num_groups, m_dim, n_dim = d.shape
    if num_groups == 0 or m_dim == 0 or n_dim == 0:
        return d
    k_sum = a_data.shape[0]
    if k_sum == 0:  # every group's product is an empty sum: d = c (or 0), no kernel
        return d.copy_(c) if c is not None else d.zero_()
    _check_sizes(a_data, b_data, d)
    has_c = c is not None
    if cfg is None:
        cfg = heuristics.grouped_config(
            op, kind=KIND_K, fp8=fp8, rows=m_dim, n=n_dim, k=k_sum, groups=num_groups, expected_m=m_dim, has_c=has_c
        )
    heuristics.maybe_print_grouped_config(op, {"m": m_dim, "n": n_dim, "k_sum": k_sum, "groups": num_groups}, cfg)
    koffs = _k_offsets(ks, ks_tensor, d.device)
    c_is_d = has_c and c.data_ptr() == d.data_ptr() and c.stride() == d.stride()
    # When c is d the kernel reads C from d itself (no aliased pair of arrays); otherwise a row-major c.
    c_arg = c.contiguous() if has_c and not c_is_d else d
    upper = num_groups * -(-m_dim // cfg.bm) * -(-n_dim // cfg.bn)
    consts = (has_c, c_is_d, cfg.bm, cfg.bn, cfg.bk, cfg.gm)
    if fp8:
        # Hopper FP8 MMAs take K-major operands only: copy a, b to [M, K_sum], [N, K_sum].
        a_k = _tma_ready(a_data.t().contiguous())
        b_k = _tma_ready(b_data.t().contiguous())
        kernel = get_kernel("k_fp8", cfg.num_worker_warps, cfg.occupancy)
        args = (a_k, sa.contiguous(), b_k, sb.contiguous(), c_arg, d, koffs, *consts, cfg.fast_acc)
    else:
        kernel = get_kernel("k_bf16", cfg.num_worker_warps, cfg.occupancy)
        args = (_tma_ready(a_data), _tma_ready(b_data), c_arg, d, koffs, *consts)
    _launch(kernel, _grid(cfg, upper), args)
    return d


# ------------------------------------------------------------------------------ registrations


def _contiguous_kind(use_psum_layout: bool) -> int:
    return KIND_PSUM if use_psum_layout else KIND_INDICES


def _stored_weights(b: Any) -> tuple[Any, bool]:
    """The logical [G, N, K] weights (or (data, scales)) as the kernel takes them: (operand, trans_b).

    A transposed view of [G, K, N] storage (the ``nn`` ops) goes in as that storage with
    ``trans_b=False``, so it is not copied; the scales stay logical.
    """
    data = b[0] if isinstance(b, tuple) else b
    if data.stride(-1) != 1 and data.stride(-2) == 1:
        stored = data.transpose(1, 2)
        return ((stored, b[1]) if isinstance(b, tuple) else stored), False
    return b, True


def _m_grouped_bf16(a, b, d, grouped_layout, use_psum_layout, alignment, stream):
    """BF16 m-grouped contiguous (nt and nn): ``d[r] = a[r] @ b[group(r)].T`` with logical b [G, N, K]."""
    op = "m_grouped_bf16_gemm_contiguous"
    b, trans_b = _stored_weights(b)
    kind = _contiguous_kind(use_psum_layout)
    return _m_grouped(op, a, b, d, grouped_layout, kind, trans_b, False, 0, alignment)


def _m_grouped_fp8(a, b, d, grouped_layout, use_psum_layout, alignment, stream):
    """FP8 m-grouped contiguous (nt and nn), 1x128 LHS / 128x128 RHS scales, logical b [G, N, K]."""
    op = "m_grouped_fp8_fp4_gemm_contiguous"
    b, trans_b = _stored_weights(b)
    kind = _contiguous_kind(use_psum_layout)
    return _m_grouped(op, a, b, d, grouped_layout, kind, trans_b, True, 0, alignment)


for _layout in ("nt", "nn"):
    register_impl(f"m_grouped_bf16_gemm_{_layout}_contiguous", "cutile")(_m_grouped_bf16)
    register_impl(f"m_grouped_fp8_fp4_gemm_{_layout}_contiguous", "cutile")(_m_grouped_fp8)
del _layout


@register_impl("m_grouped_bf16_gemm_nt_masked", "cutile")
def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, stream):
    """Masked BF16 m-grouped NT: rows ``>= masked_m[g]`` untouched; see ``tilegemm.ops.api``."""
    return _m_grouped("m_grouped_bf16_gemm_nt_masked", a, b, d, masked_m, KIND_MASKED, True, False, expected_m)


@register_impl("m_grouped_fp8_fp4_gemm_nt_masked", "cutile")
def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, stream):
    """Masked FP8 m-grouped NT: rows ``>= masked_m[g]`` untouched; see ``tilegemm.ops.api``."""
    return _m_grouped("m_grouped_fp8_fp4_gemm_nt_masked", a, b, d, masked_m, KIND_MASKED, True, True, expected_m)


@register_impl("k_grouped_bf16_gemm_tn_contiguous", "cutile")
def k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c, stream):
    """``d[g] = a_g.T @ b_g (+ c[g])``, fp32 out; see ``tilegemm.ops.api``."""
    return _k_grouped("k_grouped_bf16_gemm_tn_contiguous", a, b, d, ks_cpu, grouped_layout, c, False)


def _k_grouped_fp8(a, b, d, ks_cpu, grouped_layout, c, stream):
    """FP8 k-grouped in the ``tn`` form (the ``nt`` op's groups gathered by the checks), 1x128 scales along K."""
    return _k_grouped("k_grouped_fp8_gemm_contiguous", a, b, d, ks_cpu, grouped_layout, c, True)


register_impl("k_grouped_fp8_gemm_tn_contiguous", "cutile")(_k_grouped_fp8)
register_impl("k_grouped_fp8_gemm_nt_contiguous", "cutile")(_k_grouped_fp8)
