"""cuTile fused FP8 MoE experts (``tilegemm.fp8_moe_experts``): the block path of ``moe_blocks.py`` on FP8 operands,
and a row form for prefill.

DeepGEMM's recipe: activations with one fp32 scale per row per 128 columns (1x128), weights with one per
128x128 block. The slots are laid out by expert in blocks of ``BT`` rows (block form) or 64 rows (row form) by the
block path's routing (``moe_blocks.routing``), then four kernels:

1. **gather + quantize** (``_gather_quant``): ``xq[r], sx[r] = q(x[tok(r)])``, one CTA per (``BR`` rows, 128
   columns): the 1x128 quantization of ``tilegemm.per_token_cast_to_fp8`` (``scale = max(amax, 1e-4) / 448``,
   ``clamp(v / scale, -448, 448)`` rounded to e4m3), with the gather of the sorted rows folded in; blocks without
   an expert (the unused tail of the worst-case rows) are skipped.
2. **gate/up**, per (block, 128 intermediate columns). Per 128-K block the raw FP8 product is promoted,
   ``acc += (P * sx) * sw``, for gate and up; then ``h = act(g) * u`` in fp32 is quantized 1x128 in the epilogue
   (the tile's 128 columns are one block) and written once: ``hq`` fp8 [M, I] and ``sh`` fp32 [M, I/128].

   - block form (``_block_gate_up``, few rows per expert): swap-AB as in ``decode.py``, the ``[128, 128]`` weight
     block (TMA) is the MMA's first operand and the block's rows ``[128, BT]`` (transposed TMA tile) the second;
   - row form (``_tile_gate_up``, from ``heuristics.MOE_FP8_TILE_MIN_ROWS`` rows per expert): the block's 64 rows
     ``[64, 128]`` are the first operand and the weight block, a transposed ``[128 K, 128 N]`` view, the second,
     so the MMA's wide side holds rows of tokens, not padding.
3. **down** (``_block_down`` / ``_tile_down``): ``y[r] = bf16(w(r) * sum_kb (hq_kb @ W2_kb.T) * sh * sw2)``, in
   the same form as gate/up.
4. **combine** (``moe.py``'s kernel): ``out[t] = bf16(sum_j y[dest[t, j]])`` in fp32, slots in order.

Both forms round at the same points (each 128-deep block's product promoted in fp32, ``h`` quantized from fp32,
``y`` rounded once, the combine in fp32); on an H100 their outputs had the same calc_diff to every digit on each
shape tried.
Blocks without an expert return at once (their rows are never read); every index read from memory is
range-checked (expert ids) or clamped (tokens). No host sync: CUDA-graph capturable; reruns bitwise identical.
The form and its tiles: ``heuristics.moe_fp8_config``.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.cutile import launch, moe, moe_blocks, tile_lib
from tilegemm.routing import max_padded_rows

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO
#: Rows per CTA of the gather-quantize kernel, and its occupancy hint: 40 registers, six CTAs' loads in flight per
#: SM (at 8, 32 registers, it spills 3 words). Without the hint tileiras takes 255 registers, one CTA per SM: 4-6x
#: slower from 512 tokens on (H100, Qwen3 dimensions).
QUANT_BR = 16
QUANT_OCCUPANCY = 6


def _gather_quant(x, row_token, xq, sx, block_expert, num_experts: int, BR: ConstInt, BT: ConstInt):
    """``xq [M, H]`` fp8 and ``sx [M, H/128]`` fp32 rows ``[bid(0) * BR, +BR)``, columns block ``bid(1)``: the 1x128
    quantization of ``x [T, H]`` bf16 row ``row_token[r]`` (clamped into ``[0, T)``). Rows of a ``BT``-row block
    without an expert (``block_expert``) are skipped: the GEMMs skip their blocks. Those blocks are the tail of the
    rows, so a CTA whose first row's block has none has no row in a live one (``BT`` may be below ``BR``)."""
    _, live = tile_lib.block_expert(block_expert, ct.bid(0) * BR // BT, num_experts)
    if live:
        rows = ct.bid(0) * BR + ct.arange(BR, dtype=ct.int32)
        tok = _row_tokens(row_token, rows, x.shape[0], BR)
        cols = ct.reshape(ct.bid(1) * 128 + ct.arange(128, dtype=ct.int32), (1, 128))
        v = ct.astype(ct.gather(x, (tok, cols), padding_value=0), ct.float32)
        q, scale = tile_lib.fp8_quantize(v, 1)
        ct.store(xq, (ct.bid(0), ct.bid(1)), q)
        ct.store(sx, (ct.bid(0), ct.bid(1)), scale)


def _row_tokens(row_token, rows, num_tokens: int, BR: int):
    """``[BR, 1]``: the tokens of ``rows`` (``row_token`` int32 [M]), clamped into ``[0, num_tokens)``."""
    tok = ct.gather(row_token, rows, padding_value=0)
    return ct.reshape(ct.minimum(ct.maximum(tok, 0), num_tokens - 1), (BR, 1))


def _quant(x, xq, sx, BR: ConstInt):
    """``xq [T, H]`` fp8 and ``sx [T, H/128]`` fp32 rows ``[bid(0) * BR, +BR)``, columns block ``bid(1)``: the 1x128
    quantization of ``x [T, H]`` bf16, once per token (the gluon form gathers the quantized rows after)."""
    v = ct.astype(ct.load(x, (ct.bid(0), ct.bid(1)), shape=(BR, 128), padding_mode=_ZERO), ct.float32)
    q, scale = tile_lib.fp8_quantize(v, 1)
    ct.store(xq, (ct.bid(0), ct.bid(1)), q)
    ct.store(sx, (ct.bid(0), ct.bid(1)), scale)


def _gather_rows(xt, st, row_token, xq, sx, block_expert, num_experts: int, BR: ConstInt, BT: ConstInt):
    """``xq [M, H]`` (bytes of fp8) and ``sx [H/128, M]`` fp32 (MN-major) rows ``[bid(0) * BR, +BR)``, columns block
    ``bid(1)``: token ``row_token[r]``'s row of the quantized tokens ``xt [T, H]`` and its scale in ``st [T, H/128]``
    (:func:`_quant`); blocks without an expert skipped as in :func:`_gather_quant`."""
    _, live = tile_lib.block_expert(block_expert, ct.bid(0) * BR // BT, num_experts)
    if live:
        rows = ct.bid(0) * BR + ct.arange(BR, dtype=ct.int32)
        tok = _row_tokens(row_token, rows, xt.shape[0], BR)
        cols = ct.reshape(ct.bid(1) * 128 + ct.arange(128, dtype=ct.int32), (1, 128))
        ct.store(xq, (ct.bid(0), ct.bid(1)), ct.gather(xt, (tok, cols), padding_value=0))
        scale = ct.gather(st, (tok, ct.bid(1)), padding_value=0.0)
        ct.store(sx, (ct.bid(0), ct.bid(1)), scale, order=(1, 0))


def _promote(w, a, sa, sw, acc):
    """``acc + (w @ a) * sa * sw``: one 128-K block's raw FP8 product (fast accumulation) promoted with the row
    scales ``sa`` (``[1, BT]`` in swap-AB form, ``[64, 1]`` in row form) and the weight block's scale ``sw [1, 1]``."""
    p = ct.mma(w, a, ct.zeros(acc.shape, dtype=ct.float32), use_fast_acc=True)
    return acc + (p * sa) * sw


def _block_operands(xq, sx, mb, kb, BT: int):
    """Block ``mb``'s rows, K block ``kb``: fp8 ``[128, BT]`` (transposed) and their fp32 scales ``[1, BT]``."""
    a = ct.load(xq, (kb, mb), (128, BT), order=(1, 0), padding_mode=_ZERO)
    sa = ct.load(sx, (kb, mb), (1, BT), order=(1, 0), padding_mode=_ZERO, allow_tma=False)
    return a, sa


def _weight_block(w, s, e, pn, kb):
    """Expert ``e``'s 128x128 weight block (``pn``, ``kb``): fp8 ``[128, 128]`` (TMA) and its scale ``[1, 1]``."""
    blk = ct.reshape(ct.load(w, (e, pn, kb), shape=(1, 128, 128), padding_mode=_ZERO), (128, 128))
    sw = ct.reshape(ct.load(s, (e, pn, kb), shape=(1, 1, 1), padding_mode=_ZERO, allow_tma=False), (1, 1))
    return blk, sw


def _block_gate_up(
    xq, sx, wg, wu, sg, su, hq, sh, block_expert, num_experts: int, ACT: ConstInt, BT: ConstInt
):  # fmt: skip
    """``hq [M, I]`` / ``sh [M, I/128]`` of block ``bid(0)``, intermediate columns ``[bid(1) * 128, +128)``.

    xq fp8 [M, H] and sx fp32 [M, H/128]: the sorted rows; wg, wu fp8 [E, I, H] (the halves of w13) and
    sg, su fp32 [E, I/128, H/128] their block scales.
    """
    mb = ct.bid(0)
    pn = ct.bid(1)
    e, live = tile_lib.block_expert(block_expert, mb, num_experts)
    if live:
        acc_g = ct.zeros((128, BT), dtype=ct.float32)
        acc_u = ct.zeros((128, BT), dtype=ct.float32)
        for kb in range(xq.shape[1] // 128):
            a, sa = _block_operands(xq, sx, mb, kb, BT)
            g, sgw = _weight_block(wg, sg, e, pn, kb)
            u, suw = _weight_block(wu, su, e, pn, kb)
            acc_g = _promote(g, a, sa, sgw, acc_g)
            acc_u = _promote(u, a, sa, suw, acc_u)
        q, scale = tile_lib.fp8_quantize(tile_lib.activation(acc_g, ACT) * acc_u, 0)
        ct.store(hq, (pn, mb), q, order=(1, 0))
        ct.store(sh, (pn, mb), scale, order=(1, 0))


def _block_down(hq, sh, w2, s2, y, block_expert, row_weight, num_experts: int, BT: ConstInt):
    """``y [M, H]`` bf16 of block ``bid(0)``, columns ``[bid(1) * 128, +128)``: ``w(r) * (q(h) @ W2_e.T)``.

    hq fp8 [M, I] and sh fp32 [M, I/128]; w2 fp8 [E, H, I] and s2 fp32 [E, H/128, I/128]; row_weight fp32 [M].
    """
    mb = ct.bid(0)
    pn = ct.bid(1)
    e, live = tile_lib.block_expert(block_expert, mb, num_experts)
    if live:
        acc = ct.zeros((128, BT), dtype=ct.float32)
        for kb in range(hq.shape[1] // 128):
            a, sa = _block_operands(hq, sh, mb, kb, BT)
            w, sw = _weight_block(w2, s2, e, pn, kb)
            acc = _promote(w, a, sa, sw, acc)
        wt = ct.reshape(ct.load(row_weight, (mb,), shape=(BT,), padding_mode=_ZERO), (1, BT))
        ct.store(y, (pn, mb), ct.astype(acc * wt, y.dtype), order=(1, 0))


def _row_operands(xq, sx, mb, kb):
    """64-row block ``mb``, K block ``kb``: fp8 ``[64, 128]`` (TMA) and the rows' scales as a column ``[64, 1]``."""
    a = ct.load(xq, (mb, kb), shape=(64, 128), padding_mode=_ZERO)
    sa = ct.load(sx, (mb, kb), shape=(64, 1), padding_mode=_ZERO, allow_tma=False)
    return a, sa


def _weight_block_kn(w, s, e, pn, kb):
    """:func:`_weight_block` as the MMA's second operand: ``[128 K, 128 N]`` (transposed TMA view of ``[N, K]``)."""
    blk = ct.reshape(ct.load(w, (e, kb, pn), shape=(1, 128, 128), order=(0, 2, 1), padding_mode=_ZERO), (128, 128))
    sw = ct.reshape(ct.load(s, (e, pn, kb), shape=(1, 1, 1), padding_mode=_ZERO, allow_tma=False), (1, 1))
    return blk, sw


def _tile_gate_up(xq, sx, wg, wu, sg, su, hq, sh, block_expert, num_experts: int, ACT: ConstInt):
    """Row form of :func:`_block_gate_up`: the 64 rows of block ``bid(0)``, intermediate columns
    ``[bid(1) * 128, +128)``; the rows ``[64, 128]`` are the MMA's first operand, the weight block its second."""
    mb = ct.bid(0)
    pn = ct.bid(1)
    e, live = tile_lib.block_expert(block_expert, mb, num_experts)
    if live:
        acc_g = ct.zeros((64, 128), dtype=ct.float32)
        acc_u = ct.zeros((64, 128), dtype=ct.float32)
        for kb in range(xq.shape[1] // 128):
            g, sgw = _weight_block_kn(wg, sg, e, pn, kb)
            u, suw = _weight_block_kn(wu, su, e, pn, kb)
            a, sa = _row_operands(xq, sx, mb, kb)
            acc_g = _promote(a, g, sa, sgw, acc_g)
            acc_u = _promote(a, u, sa, suw, acc_u)
        q, scale = tile_lib.fp8_quantize(tile_lib.activation(acc_g, ACT) * acc_u, 1)
        ct.store(hq, (mb, pn), q)
        ct.store(sh, (mb, pn), scale)


def _tile_down(hq, sh, w2, s2, y, block_expert, row_weight, num_experts: int):
    """Row form of :func:`_block_down`: the 64 rows of block ``bid(0)``, columns ``[bid(1) * 128, +128)``."""
    mb = ct.bid(0)
    pn = ct.bid(1)
    e, live = tile_lib.block_expert(block_expert, mb, num_experts)
    if live:
        acc = ct.zeros((64, 128), dtype=ct.float32)
        for kb in range(hq.shape[1] // 128):
            w, sw = _weight_block_kn(w2, s2, e, pn, kb)
            a, sa = _row_operands(hq, sh, mb, kb)
            acc = _promote(a, w, sa, sw, acc)
        wt = ct.reshape(ct.load(row_weight, (mb,), shape=(64,), padding_mode=_ZERO), (64, 1))
        ct.store(y, (mb, pn), ct.astype(acc * wt, y.dtype))


#: ``get_kernel(name, num_worker_warps, occupancy)``: the cached ``@ct.kernel`` of each kernel of this module.
get_kernel = launch.kernel_factory(
    {
        "gather_quant": _gather_quant,
        "quant": _quant,
        "gather_rows": _gather_rows,
        "block_gate_up": _block_gate_up,
        "block_down": _block_down,
        "tile_gate_up": _tile_gate_up,
        "tile_down": _tile_down,
    }
)


# ------------------------------------------------------------------------------------- host side


def _supported(w13: tuple[torch.Tensor, torch.Tensor], w2: tuple[torch.Tensor, torch.Tensor], activation: str) -> None:
    """Raise :class:`Unsupported` for what the kernels do not take (the op's check has run)."""
    if activation not in moe.ACTIVATIONS:
        raise Unsupported(f"activation {activation!r} (the kernels take {sorted(moe.ACTIVATIONS)})")
    for name, (data, scales) in (("w13", w13), ("w2", w2)):
        if not (data.is_contiguous() and scales.is_contiguous()):
            raise Unsupported(f"{name}: FP8 data and scales must be contiguous")
        if data.data_ptr() % 16:
            raise Unsupported(f"{name}: FP8 data must be 16-byte aligned")


@register_impl("fp8_moe_experts", "cutile")
def fp8_moe_experts(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Fused FP8 MoE experts; see ``tilegemm.ops.api.fp8_moe_experts`` and the module docstring.

    One linear host function: problem -> config (``heuristics.choose``, family ``moe_fp8``: the block or the row
    form) -> operands (routing, quantized rows, buffers) -> the launches, every one on ``stream``.
    """
    _supported(w13, w2, activation)
    num_tokens, hidden_dim = hidden.shape
    num_experts, top_k, inter = w13[0].shape[0], topk_ids.shape[1], w2[0].shape[2]
    out = torch.empty(num_tokens, hidden_dim, dtype=hidden.dtype, device=hidden.device)
    if num_tokens == 0:
        return out
    if top_k == 0 or num_experts == 0:
        return out.zero_()
    # problem -> config
    slots = num_tokens * top_k
    cfg = heuristics.choose(
        heuristics.problem("moe_fp8", "fp8", slots, hidden_dim, inter, launch.num_sms(), groups=num_experts)
    )
    align = cfg.row_align
    rows = max_padded_rows(num_tokens, top_k, num_experts, align)
    if rows * max(hidden_dim, inter) >= 2**31 or hidden.numel() >= 2**31:
        raise Unsupported("a buffer has >= 2**31 elements (int32 indexing)")
    shape = {"t": num_tokens, "k": top_k, "e": num_experts, "h": hidden_dim, "i": inter}
    heuristics.print_once("fp8_moe_experts", shape, cfg.name)
    # operands: the routing, the sorted rows gathered and quantized 1x128, hq / sh, y
    dev = hidden.device
    routed = moe_blocks.routing(topk_ids, topk_weights, num_experts, align, rows)
    for kernel, grid, args in routed.launches:
        launch.launch(kernel, grid, args, stream)
    xq = torch.empty(rows, hidden_dim, dtype=torch.float8_e4m3fn, device=dev)
    sx = torch.empty(rows, hidden_dim // 128, dtype=torch.float32, device=dev)
    x = launch.as_row_major(hidden, pad_rows=False)
    grid = (launch.cdiv(rows, QUANT_BR), hidden_dim // 128, 1)
    args = (x, routed.row_token, xq, sx, routed.block_expert, num_experts, QUANT_BR, align)
    launch.launch(get_kernel("gather_quant", occupancy=QUANT_OCCUPANCY), grid, args, stream)
    hq = torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=dev)
    sh = torch.empty(rows, inter // 128, dtype=torch.float32, device=dev)
    y = torch.empty(rows, hidden_dim, dtype=torch.bfloat16, device=dev)
    (w13q, s13), (w2q, s2) = w13, w2
    ib = inter // 128
    block_expert = routed.block_expert
    act = moe.ACTIVATIONS[activation]
    up = (xq, sx, w13q[:, :inter], w13q[:, inter:], s13[:, :ib], s13[:, ib:], hq, sh, block_expert, num_experts, act)
    down = (hq, sh, w2q, s2, y, block_expert, routed.row_weight, num_experts)
    if cfg.path == "blocks":
        launch.launch(get_kernel("block_gate_up"), (rows // align, ib, 1), (*up, align), stream)
        launch.launch(get_kernel("block_down"), (rows // align, hidden_dim // 128, 1), (*down, align), stream)
    else:
        kernel = get_kernel("tile_gate_up", cfg.up.num_worker_warps, cfg.up.occupancy)
        launch.launch(kernel, (rows // align, ib, 1), up, stream)
        kernel = get_kernel("tile_down", cfg.down.num_worker_warps, cfg.down.occupancy)
        launch.launch(kernel, (rows // align, hidden_dim // 128, 1), down, stream)
    grid = (launch.cdiv(num_tokens, cfg.combine_bt), hidden_dim // cfg.combine_bn, 1)
    args = (y, routed.dest, out, top_k, cfg.combine_bt, cfg.combine_bn)
    launch.launch(moe.get_kernel("combine"), grid, args, stream)
    return out
