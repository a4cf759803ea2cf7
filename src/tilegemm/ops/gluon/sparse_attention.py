"""Gluon sparse decode attention: one query row per sequence attends to the keys its indices select.

``out[b, h] = sum_j p_j * v[b, h // G, idx[b, j]]`` with ``p = softmax_j(scale * q[b, h] . k[b, h // G, idx[b, j]]
+ mask[b, idx[b, j]])`` (``G`` query heads per key head). The selected keys and values are read in place, row by
row, and never copied: each program takes one query head and one split of the indices, loads ``BLOCK_N`` selected
key rows and value rows at a time (vector loads along the head dim), and keeps an online softmax in fp32 per row
slot (``exp2`` with ``log2(e)`` folded into the scale). One split per program writes the output; more write fp32
partials (``acc``, max, sum) that :func:`sparse_decode_combine_kernel` merges, so few heads still spread over the
SMs (flash-decoding's split). CUDA cores only: a decode row is a matrix-vector product per head, bound by the
bytes it reads.

An index outside ``[0, T)`` (``-1`` padding) selects no key; a row whose selected keys are all hidden gets zeros.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from tilegemm import config
from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import register_impl
from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.gluon.tma import Relaunch
from tilegemm.ops.operands import cdiv

LOG2E = gl.constexpr(math.log2(math.e))

#: Selected rows a program loads per step, its warps, and the rows a warp spans at once (its 32 lanes split between
#: them along the head dim).
BLOCK_N = 32
NUM_WARPS = 4
ROW_LANES = 1
#: Programs per SM the split of the indices aims at: the loads in flight per SM come from many programs (each
#: program's step loads its rows, then computes on them; loading the next step's rows first was slower).
PROGRAMS_PER_SM = 8
#: Warps of the kernel that merges the splits.
COMBINE_WARPS = 4


@gluon.jit
def _selected_rows(
    idx_row,
    mask_row,
    k_base,
    v_base,
    k_st,
    v_st,
    end,
    num_keys,
    j,
    dk,
    dv,
    DK: gl.constexpr,
    DV: gl.constexpr,
    MASK: gl.constexpr,
    VL: gl.constexpr,
):
    """The key rows, value rows and logit terms (log2 units: the mask's; ``-inf`` past ``end`` and for an index
    outside ``[0, num_keys)``) of the index positions ``j``."""
    idx = gl.load(idx_row + j, mask=j < end, other=-1).to(gl.int64)
    live = (idx >= 0) & (idx < num_keys)  # an index outside [0, T) selects no key (and reads nothing)
    idx = gl.where(live, idx, 0)
    extra = gl.where(live, 0.0, float("-inf"))
    if MASK == 1:
        extra = gl.where(gl.load(mask_row + idx, mask=live, other=0) != 0, extra, float("-inf"))
    elif MASK == 2:
        extra += gl.load(mask_row + idx, mask=live, other=0.0).to(gl.float32) * LOG2E
    idx_v = gl.convert_layout(idx, gl.SliceLayout(1, VL))
    live_v = gl.convert_layout(live, gl.SliceLayout(1, VL))
    values = gl.load(v_base + idx_v[:, None] * v_st + dv[None, :], mask=live_v[:, None] & (dv < DV)[None, :], other=0.0)
    keys = gl.load(k_base + idx[:, None] * k_st + dk[None, :], mask=live[:, None] & (dk < DK)[None, :], other=0.0)
    return keys, values, extra


@gluon.jit
def sparse_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    idx_ptr,
    mask_ptr,
    o_ptr,
    part_ptr,
    stat_ptr,
    heads,
    num_keys,
    count,
    per_split,
    q_sb,
    q_sh,
    k_sb,
    k_sh,
    k_st,
    v_sb,
    v_sh,
    v_st,
    idx_sb,
    mask_sb,
    o_sb,
    o_sh,
    scale_log2,
    GROUPS: gl.constexpr,
    DK: gl.constexpr,
    DV: gl.constexpr,
    DK_PAD: gl.constexpr,
    DV_PAD: gl.constexpr,
    BLOCK: gl.constexpr,
    ROW_LANES: gl.constexpr,
    SPLITS: gl.constexpr,
    MASK: gl.constexpr,
    WARPS: gl.constexpr,
):
    """Program ``(b * heads + h, s)``: head ``h`` of sequence ``b`` over indices ``[s * per_split, ...)``.

    Each of the ``BLOCK`` row slots keeps its own online softmax (max, sum, ``acc`` row) over the indices
    ``slot, slot + BLOCK, ...`` of the split, so a step needs no exchange between warps; the slots merge once at the
    end. ``MASK``: 0 none, 1 a boolean (uint8) mask row read at the selected keys, 2 an additive float one."""
    KL: gl.constexpr = gl.BlockedLayout([1, DK_PAD * ROW_LANES // 32], [ROW_LANES, 32 // ROW_LANES], [WARPS, 1], [1, 0])
    VL: gl.constexpr = gl.BlockedLayout([1, DV_PAD * ROW_LANES // 32], [ROW_LANES, 32 // ROW_LANES], [WARPS, 1], [1, 0])
    ROWS: gl.constexpr = gl.SliceLayout(1, KL)
    bh = gl.program_id(0)
    split = gl.program_id(1)
    b = (bh // heads).to(gl.int64)
    h = bh % heads
    hk = (h // GROUPS).to(gl.int64)

    dk = gl.arange(0, DK_PAD, layout=gl.SliceLayout(0, KL))
    dv = gl.arange(0, DV_PAD, layout=gl.SliceLayout(0, VL))
    rows = gl.arange(0, BLOCK, layout=ROWS)
    q = gl.load(q_ptr + b * q_sb + h.to(gl.int64) * q_sh + dk, mask=dk < DK, other=0.0).to(gl.float32)
    k_base = k_ptr + b * k_sb + hk * k_sh
    v_base = v_ptr + b * v_sb + hk * v_sh

    start = split * per_split
    end = gl.minimum(start + per_split, count)
    m_i = gl.full([BLOCK], float("-inf"), gl.float32, layout=ROWS)
    l_i = gl.zeros([BLOCK], gl.float32, layout=ROWS)
    acc = gl.zeros([BLOCK, DV_PAD], gl.float32, layout=VL)
    rows_at = (idx_ptr + b * idx_sb, mask_ptr + b * mask_sb, k_base, v_base, k_st, v_st, end, num_keys)
    for j0 in range(start, end, BLOCK):
        keys, values, extra = _selected_rows(*rows_at, j0 + rows, dk, dv, DK, DV, MASK, VL)
        s = gl.sum(keys.to(gl.float32) * q[None, :], axis=1) * scale_log2 + extra
        m_new = gl.maximum(m_i, s)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe)
        l_i = l_i * alpha + p
        alpha_v = gl.convert_layout(alpha, gl.SliceLayout(1, VL))
        p_v = gl.convert_layout(p, gl.SliceLayout(1, VL))
        acc = acc * alpha_v[:, None] + p_v[:, None] * values.to(gl.float32)
        m_i = m_new

    m_all = gl.max(m_i, axis=0)
    m_top = gl.where(m_all == float("-inf"), 0.0, m_all)
    w = gl.exp2(m_i - m_top)
    total = gl.sum(l_i * w, axis=0)
    out = gl.sum(acc * gl.convert_layout(w, gl.SliceLayout(1, VL))[:, None], axis=0)
    if SPLITS == 1:
        out = gl.where(total > 0.0, out / total, 0.0)
        gl.store(o_ptr + b * o_sb + h.to(gl.int64) * o_sh + dv, out.to(o_ptr.dtype.element_ty), mask=dv < DV)
    else:
        slot = bh.to(gl.int64) * SPLITS + split
        gl.store(part_ptr + slot * DV_PAD + dv, out)
        gl.store(stat_ptr + slot * 2, m_all)
        gl.store(stat_ptr + slot * 2 + 1, total)


@gluon.jit
def sparse_decode_combine_kernel(
    o_ptr,
    part_ptr,
    stat_ptr,
    heads,
    o_sb,
    o_sh,
    DV: gl.constexpr,
    DV_PAD: gl.constexpr,
    SPLITS: gl.constexpr,
    SPLITS_PAD: gl.constexpr,
    WARPS: gl.constexpr,
):
    """Program ``b * heads + h``: merge the ``SPLITS`` partial softmaxes of that head into its output row."""
    PL: gl.constexpr = gl.BlockedLayout([1, DV_PAD // 32], [1, 32], [WARPS, 1], [1, 0])
    bh = gl.program_id(0)
    b = (bh // heads).to(gl.int64)
    h = (bh % heads).to(gl.int64)
    sp = gl.arange(0, SPLITS_PAD, layout=gl.SliceLayout(1, PL))
    dv = gl.arange(0, DV_PAD, layout=gl.SliceLayout(0, PL))
    slot = bh.to(gl.int64) * SPLITS + sp
    m = gl.load(stat_ptr + slot * 2, mask=sp < SPLITS, other=float("-inf"))
    l_s = gl.load(stat_ptr + slot * 2 + 1, mask=sp < SPLITS, other=0.0)
    m_all = gl.max(m, axis=0)
    m_safe = gl.where(m_all == float("-inf"), 0.0, m_all)
    w = gl.exp2(m - m_safe)
    total = gl.sum(w * l_s, axis=0)
    parts = gl.load(part_ptr + slot[:, None] * DV_PAD + dv[None, :], mask=(sp < SPLITS)[:, None], other=0.0)
    acc = gl.sum(w[:, None] * parts, axis=0)
    out = gl.where(total > 0.0, acc / total, 0.0)
    gl.store(o_ptr + b * o_sb + h * o_sh + dv, out.to(o_ptr.dtype.element_ty), mask=dv < DV)


def _pad(n: int) -> int:
    """The power of two >= ``n`` and >= 32 (a warp spans a padded row)."""
    return max(32, 1 << (n - 1).bit_length())


def _pad_splits(splits: int) -> int:
    """The power of two >= ``splits`` and >= 2: the combine kernel's rows of partials."""
    return max(2, 1 << (splits - 1).bit_length())


def splits_for(programs: int, count: int, sms: int) -> int:
    """Splits of the ``count`` indices per head: enough for :data:`PROGRAMS_PER_SM` programs per SM over the
    ``programs`` (sequence, head) pairs, at most one per ``BLOCK_N`` indices."""
    want = cdiv(PROGRAMS_PER_SM * sms, max(1, programs))
    return max(1, min(want, cdiv(count, BLOCK_N)))


def sparse_decode_plan(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, mask: torch.Tensor | None
) -> Callable[..., torch.Tensor]:
    """The launch plan of calls shaped as this one (checked operands): ``run(q, k, v, indices, scale, mask) ->
    out [B, H, Dv]``, on the current stream.

    Problem -> splits of the indices (:func:`splits_for`) -> grids, strides and constants, settled once here: a run
    is valid for operands with this call's shapes, strides, dtypes and 16-byte alignment (the hot lane's key). The
    first run launches through triton's JIT (it compiles); later runs go straight to the compiled kernels
    (:class:`~tilegemm.ops.gluon.tma.Relaunch`), without the JIT's argument binding and cache lookup.
    """
    batch, heads, dk = q.shape
    kv_heads, dv = k.shape[1], v.shape[3]
    count = indices.shape[1]
    device, dtype = q.device, q.dtype
    splits = splits_for(batch * heads, count, max(1, config.get_num_sms()))
    per_split = cdiv(cdiv(count, splits), BLOCK_N) * BLOCK_N
    splits = cdiv(count, per_split)
    dv_pad = _pad(dv)
    mask_kind = 0 if mask is None else 1 if mask.dtype == torch.bool else 2
    idx_stride = indices.stride(0) if indices.stride(1) == 1 else indices.shape[1]
    strides = (*q.stride()[:2], *k.stride()[:3], *v.stride()[:3], idx_stride, mask.stride(0) if mask is not None else 0)
    sizes = (heads, k.shape[2], count, per_split, *strides, heads * dv, dv)  # the kernel's ints, in order
    shapes = (heads // kv_heads, dk, dv, _pad(dk), dv_pad, BLOCK_N, ROW_LANES, splits, mask_kind, NUM_WARPS)
    names = sparse_decode_kernel.arg_names
    fixed = dict(zip(names[names.index("heads") : names.index("scale_log2")], sizes, strict=True))
    fixed.update(zip(names[names.index("scale_log2") + 1 :], shapes, strict=True))  # the constexprs, GROUPS .. WARPS
    combine = dict(heads=heads, o_sb=heads * dv, o_sh=dv, DV=dv, DV_PAD=dv_pad, SPLITS=splits)
    combine.update(SPLITS_PAD=_pad_splits(splits), WARPS=COMBINE_WARPS)
    combine_rest = tuple(combine[name] for name in sparse_decode_combine_kernel.arg_names[3:])
    grid, combine_grid = (batch * heads, splits, 1), (batch * heads, 1, 1)
    relaunches: list[Relaunch] = []

    def run(q, k, v, indices, scale, mask) -> torch.Tensor:
        out = torch.empty(batch, heads, dv, dtype=dtype, device=device)
        if out.numel() == 0:
            return out
        if splits > 1:
            part = torch.empty(batch * heads * splits, dv_pad, dtype=torch.float32, device=device)
            stat = torch.empty(batch * heads * splits, 2, dtype=torch.float32, device=device)
        else:
            part = stat = out
        idx = indices if indices.stride(1) == 1 else indices.contiguous()
        mask_arg = out if mask is None else mask.view(torch.uint8) if mask_kind == 1 else mask
        pointers = (q, k, v, idx, mask_arg, out, part, stat)
        scale_log2 = float(scale) * LOG2E.value
        if relaunches:
            relaunches[0]((), (*pointers, *sizes, scale_log2, *shapes), None)
            if splits > 1:
                relaunches[1]((), (out, part, stat, *combine_rest), None)
            return out
        compiled = sparse_decode_kernel[grid[:2]](
            *pointers, scale_log2=scale_log2, **fixed, num_warps=NUM_WARPS, **COMPILE_OPTIONS
        )
        found = [Relaunch(compiled, grid, device, [])]
        if splits > 1:
            compiled = sparse_decode_combine_kernel[combine_grid[:1]](
                out, part, stat, **combine, num_warps=COMBINE_WARPS, **COMPILE_OPTIONS
            )
            found.append(Relaunch(compiled, combine_grid, device, []))
        relaunches.extend(found)
        return out

    return run


@register_impl("sparse_decode_attention", "gluon")
def sparse_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    stream,
) -> torch.Tensor:
    """The gluon kernel of :func:`tilegemm.sparse_decode_attention` (the module docstring), through its plan
    (:func:`sparse_decode_plan`); ``stream`` is current."""
    return sparse_decode_plan(q, k, v, indices, mask)(q, k, v, indices, scale, mask)


@register_replay("sparse_decode_attention", "gluon")
def _replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """The hot-lane replay of a call that ran here (``checks.sparse_decode_attention_signature``): its plan, which
    relaunches the compiled kernels."""
    q, k, v, indices, mask = (derived[name] for name in ("q", "k", "v", "indices", "mask"))
    return sparse_decode_plan(q, k, v, indices, mask)
