"""cuTile MoE experts for training (``tilegemm.autograd.moe_experts``), BF16: a forward that keeps what the
backward needs, and the backward, both on the 128-row aligned layout of ``tilegemm.routing``.

The layout (``ops.common.MoETrainState``): ``M = max_padded_rows(T, k, E, 128)`` rows, expert e's rows starting
on a 128-row block in expert order, its slots in slot order; ``ends[e]`` is the row past its last slot. Both
GEMM families read it as it is: the m-grouped kernels of ``grouped.py`` as a psum layout with 128-row alignment
(rows between ``ends[e]`` and the next block come out 0), the k-grouped kernel with each expert's K range
``[start_e, start_{e+1})`` (padding rows are 0 in one operand, so they add nothing). No repacking, no host sync.

Forward (seven launches): routing (``moe_blocks.routing``'s two kernels); the row gather ``xs = x[row_token]``;
**gate/up** (``_gate_up_train``): the fused op's gate/up tile, storing ``gate``, ``up`` (bf16, for the backward)
and ``h = round(act(gate) * up)`` from the fp32 accumulators; **down**: ``y = round(h @ W2_e.T)``, unweighted
(m-grouped GEMM); **combine** (``_combine_weighted``): ``out[t] = round(sum_j w[t, j] * y[dest[t, j]])`` in fp32,
slots in order.

Backward, for ``dout [T, H]``:

1. ``_scale_rows``: ``dy[r] = round(row_weight[r] * dout[row_token[r]])`` (0 on padding rows: their weight is 0);
2. ``_slot_dots`` (when the routing weights need a gradient): ``dw[t, j] = sum_c dout[t, c] * y[dest[t, j], c]`` in
   fp32, column tiles in order;
3. ``_dgate_up``: ``dh = dy @ W2_e`` in fp32 with the activation's backward in the epilogue:
   ``dgate = round(dh * up * act'(gate))``, ``dup = round(dh * act(gate))``, written once as ``dgu [M, 2I]``;
4. ``dW2[e] = dy_e.T @ h_e`` and ``dW13[e] = dgu_e.T @ xs_e``: the k-grouped kernel, bf16 out (fp32 sums);
5. ``dxs = round(dgu @ W13_e)`` (m-grouped ``nn``) and ``dx[t] = round(sum_j dxs[dest[t, j]])`` (the fused op's
   combine kernel: fp32, slots in order).

Every sum runs in a fixed order (no atomics): reruns are bitwise identical. Config: ``heuristics.choose`` with
``family="moe_train"`` (the gate/up-shaped kernels, the down / input-gradient GEMM and the token tiles); the
k-grouped GEMMs take the ``grouped`` family's choice.
"""

from __future__ import annotations

from typing import Any

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.heuristics.cutile import Kind
from tilegemm.ops.common import MoETrainState, moe_train_empty, moe_train_is_empty, moe_train_zero_grads
from tilegemm.ops.cutile import grouped, launch, moe, moe_blocks, tile_lib
from tilegemm.routing import ALIGNED_ROWS, aligned_blocks, expert_counts, expert_ends, max_padded_rows

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO


def _activation_grad(g, ACT: int):
    """``(act(g), act'(g))`` in fp32 for ``moe.ACTIVATIONS``: silu ``s (1 + g (1 - s))`` with ``s = sigmoid(g)``; the
    tanh GELU ``0.5 (1 + t) + 0.5 g (1 - t^2) c (1 + 3 a g^2)``, ``t = tanh(c (g + a g^3))``."""
    if ACT == 0:
        s = 1.0 / (1.0 + ct.exp(-g))
        return g * s, s * (1.0 + g * (1.0 - s))
    c = tile_lib.GELU_C
    t = ct.tanh(c * (g + 0.044715 * g * g * g))
    return 0.5 * g * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * g * g)


def _gate_up_train(
    xs, w4, gate, up, h, block_expert, num_experts: int,
    ACT: ConstInt, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt,
):  # fmt: skip
    """Persistent over tiles of ``h [M, I]``: ``gate``, ``up`` and ``h`` of the row block (module docstring)."""
    moe.gate_up_walk(xs, w4, gate, up, h, block_expert, num_experts, ACT, BM, BN, BK, GM, True)


def _dgate_up(
    dy, w2, gate, up, dgate, dup, block_expert, num_experts: int,
    ACT: ConstInt, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt,
):  # fmt: skip
    """Persistent over tiles of ``dgate [M, I]``: ``dh = dy @ w2[e]`` (dy [M, H], w2 [E, H, I]) and the activation's
    backward against the saved ``gate`` / ``up`` (module docstring, step 3)."""
    mblocks, n_tiles, nk, total, t, step = tile_lib.persistent_walk(dgate, dy, BM, BN, BK)
    while t < total:
        mb, nb, e, live = tile_lib.expert_tile(block_expert, t, mblocks, n_tiles, num_experts, GM)
        if live:
            dh = tile_lib.mma_bf16(dy, w2, 0, e, mb, nb, nk, BM, BN, BK, False, Kind.INDICES)
            # The epilogue in 64-row halves: the whole tile's gate, up and dh at once spill on sm_100.
            for half in ct.static_iter(range(BM // 64)):
                hb = mb * (BM // 64) + half
                part = ct.extract(dh, (half, 0), shape=(64, BN))
                g = ct.astype(ct.load(gate, (hb, nb), shape=(64, BN), padding_mode=_ZERO), ct.float32)
                u = ct.astype(ct.load(up, (hb, nb), shape=(64, BN), padding_mode=_ZERO), ct.float32)
                act, dact = _activation_grad(g, ACT)
                ct.store(dgate, (hb, nb), ct.astype(part * u * dact, dgate.dtype))
                ct.store(dup, (hb, nb), ct.astype(part * act, dup.dtype))
        t = t + step


def _combine_weighted(y, dest, weights, out, TOPK: ConstInt, BT: ConstInt, BN: ConstInt):
    """``out`` tile (bid 0: BT tokens, bid 1: BN columns) = ``sum_j w[t, j] * y[dest[t, j]]`` in fp32, j in order."""
    tok = ct.bid(0) * BT + ct.arange(BT, dtype=ct.int32)
    cols = ct.reshape(ct.bid(1) * BN + ct.arange(BN, dtype=ct.int32), (1, BN))
    acc = ct.full((BT, BN), 0.0, dtype=ct.float32)
    for j in range(TOPK):
        w = ct.reshape(ct.astype(ct.gather(weights, (tok, j), padding_value=0), ct.float32), (BT, 1))
        acc = acc + w * moe.slot_rows(y, dest, tok, j, cols, BT)
    ct.store(out, (ct.bid(0), ct.bid(1)), ct.astype(acc, out.dtype))


def _scale_rows(dout, row_token, row_weight, dy, BT: ConstInt, BN: ConstInt):
    """``dy`` tile (bid 0: BT rows, bid 1: BN columns) = ``round(row_weight[r] * dout[row_token[r]])``."""
    rows = ct.bid(0) * BT + ct.arange(BT, dtype=ct.int32)
    cols = ct.reshape(ct.bid(1) * BN + ct.arange(BN, dtype=ct.int32), (1, BN))
    tok = ct.reshape(ct.gather(row_token, rows, padding_value=0), (BT, 1))
    live = (tok >= 0) & (tok < dout.shape[0])
    vals = ct.gather(dout, (ct.where(live, tok, 0), cols), mask=live, padding_value=0, check_bounds=False)
    w = ct.reshape(ct.gather(row_weight, rows, padding_value=0), (BT, 1))
    ct.store(dy, (ct.bid(0), ct.bid(1)), ct.astype(ct.astype(vals, ct.float32) * w, dy.dtype))


def _slot_dots(dout, y, dest, dw, TOPK: ConstInt, BT: ConstInt, BN: ConstInt):
    """``dw [k, T]`` columns of BT tokens (bid 0): ``dw[j, t] = sum_c dout[t, c] * y[dest[t, j], c]`` in fp32, the
    BN-column tiles in order."""
    tok = ct.bid(0) * BT + ct.arange(BT, dtype=ct.int32)
    for j in range(TOPK):
        acc = ct.full((BT,), 0.0, dtype=ct.float32)
        for nb in range(ct.cdiv(dout.shape[1], BN)):
            cols = ct.reshape(nb * BN + ct.arange(BN, dtype=ct.int32), (1, BN))
            d = ct.astype(ct.load(dout, (ct.bid(0), nb), shape=(BT, BN), padding_mode=_ZERO), ct.float32)
            acc = acc + ct.sum(d * moe.slot_rows(y, dest, tok, j, cols, BT), axis=1)
        ct.store(dw, (j, ct.bid(0)), ct.reshape(acc, (1, BT)))


#: ``get_kernel(name, num_worker_warps, occupancy)``: the cached ``@ct.kernel`` of each kernel of this module.
get_kernel = launch.kernel_factory(
    {
        "gate_up": _gate_up_train,
        "dgate_up": _dgate_up,
        "combine_weighted": _combine_weighted,
        "scale_rows": _scale_rows,
        "slot_dots": _slot_dots,
    }
)


# ------------------------------------------------------------------------------------- host side


def _config(hidden_dim: int) -> heuristics.MoEConfig:
    return heuristics.choose(heuristics.Problem("moe_train", "bf16", 0, hidden_dim, 0, launch.num_sms()))


def _supported(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, activation: str, rows: int) -> None:
    """Raise :class:`Unsupported` (before anything is written) for what the kernels do not take."""
    moe.supported(hidden, w13, w2, activation)
    if rows * max(2 * w2.shape[2], hidden.shape[1]) >= 2**31 or hidden.numel() >= 2**31:
        raise Unsupported("a buffer has >= 2**31 elements (int32 indexing)")


def _weight_grad(a: torch.Tensor, b: torch.Tensor, starts: torch.Tensor, out: torch.Tensor) -> tuple[Any, ...]:
    """The launch ``(kernel, grid, args)`` of ``out[e] = a_e.T @ b_e`` (bf16, fp32 sums) over each expert's rows
    ``[starts[e], starts[e + 1])``: the k-grouped kernel with the ``grouped`` family's config."""
    num_experts, m_dim, n_dim = out.shape
    problem = heuristics.Problem(
        "grouped", "bf16", m_dim, n_dim, a.shape[0], launch.num_sms(), num_experts, Kind.K
    )  # fmt: skip
    cfg = heuristics.choose(problem)
    tiles = num_experts * launch.cdiv(m_dim, cfg.bm) * launch.cdiv(n_dim, cfg.bn)
    args = (a, b, out, out, starts, False, False, cfg.bm, cfg.bn, cfg.bk, cfg.gm)
    kernel = grouped.get_kernel("k_bf16", cfg.num_worker_warps, cfg.occupancy)
    return kernel, launch.persistent_grid(tiles, cfg.ctas_per_sm), args


def _token_grid(num_tokens: int, cols: int, cfg: heuristics.MoEConfig) -> tuple[int, int, int]:
    return launch.cdiv(num_tokens, cfg.combine_bt), cols // cfg.combine_bn, 1


@register_impl("moe_experts_forward", "cutile")
def moe_experts_forward(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Training forward of the BF16 fused experts; see ``tilegemm.ops.api.moe_experts_forward``. Linear: problem ->
    config (family ``moe_train``) -> operands (routing, gathered rows, buffers) -> launches on ``stream``."""
    num_tokens, hidden_dim = hidden.shape
    num_experts, top_k, inter = w13.shape[0], topk_ids.shape[1], w2.shape[2]
    rows = max_padded_rows(num_tokens, top_k, num_experts, ALIGNED_ROWS)
    if moe_train_is_empty(hidden, topk_ids, w13, w2):
        return moe_train_empty(hidden, topk_ids, w13, w2, rows)
    _supported(hidden, w13, w2, activation, rows)
    cfg = _config(hidden_dim)
    heuristics.print_once("moe_experts_forward", {"t": num_tokens, "k": top_k, "e": num_experts}, cfg.name)
    dev, dtype = hidden.device, hidden.dtype
    routed = moe_blocks.routing(topk_ids, topk_weights, num_experts, ALIGNED_ROWS, rows)
    for kernel, grid, args in routed.launches:
        launch.launch(kernel, grid, args, stream)
    ends = expert_ends(expert_counts(topk_ids, num_experts), ALIGNED_ROWS)
    xs = launch.as_row_major(hidden, pad_rows=False).index_select(0, routed.row_token)
    gate_up = torch.empty(rows, 2 * inter, dtype=dtype, device=dev)
    h = torch.empty(rows, inter, dtype=dtype, device=dev)
    up = cfg.up
    grid = launch.persistent_grid(rows // up.bm * launch.cdiv(inter, up.bn), up.ctas_per_sm)
    args = (xs, moe.gate_up_view(w13), gate_up[:, :inter], gate_up[:, inter:], h, routed.block_expert, num_experts)
    args = (*args, moe.ACTIVATIONS[activation], up.bm, up.bn, up.bk, up.gm)
    launch.launch(get_kernel("gate_up", up.num_worker_warps, up.occupancy), grid, args, stream)
    y = torch.empty(rows, hidden_dim, dtype=dtype, device=dev)
    # down: the m-grouped host path (grouped.py's psum layout, 128-row alignment: rows of no expert come out 0)
    grouped.m_grouped(
        "moe_train_gemm", h, w2, y, ends, kind=Kind.PSUM, trans_b=True, fp8=False, alignment=ALIGNED_ROWS,
        cfg=cfg.down, stream=stream,
    )  # fmt: skip
    out = torch.empty(num_tokens, hidden_dim, dtype=dtype, device=dev)
    args = (y, routed.dest, topk_weights, out, top_k, cfg.combine_bt, cfg.combine_bn)
    launch.launch(get_kernel("combine_weighted"), _token_grid(num_tokens, hidden_dim, cfg), args, stream)
    return out, MoETrainState(routed.row_token, routed.row_weight, routed.dest, ends, gate_up, h, y)


@register_impl("moe_experts_backward", "cutile")
def moe_experts_backward(grad_out, hidden, topk_weights, w13, w2, state, activation, needs, stream):
    """Backward of :func:`moe_experts_forward`; see ``tilegemm.ops.api.moe_experts_backward``. Linear: config ->
    operands -> the launches the requested gradients need (module docstring, steps 1-5), each on ``stream``."""
    num_tokens, hidden_dim = hidden.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    top_k = state.dest.shape[1]
    rows = state.gate_up.shape[0]
    if moe_train_is_empty(hidden, state.dest, w13, w2):
        return moe_train_zero_grads(hidden, topk_weights, w13, w2, needs)
    _supported(hidden, w13, w2, activation, rows)
    need_hidden, need_weights, need_w13, need_w2 = needs
    cfg = _config(hidden_dim)
    dev, dtype = hidden.device, hidden.dtype
    dout = launch.as_row_major(grad_out, pad_rows=False)
    tok_grid = _token_grid(rows, hidden_dim, cfg)
    dy = torch.empty(rows, hidden_dim, dtype=dtype, device=dev)
    args = (dout, state.row_token, state.row_weight, dy, cfg.combine_bt, cfg.combine_bn)
    launch.launch(get_kernel("scale_rows"), tok_grid, args, stream)
    d_weights = None
    if need_weights:
        padded_tokens = launch.cdiv(num_tokens, cfg.combine_bt) * cfg.combine_bt
        dw = torch.empty(top_k, padded_tokens, dtype=torch.float32, device=dev)
        args = (dout, state.y, state.dest, dw, top_k, cfg.combine_bt, cfg.combine_bn)
        launch.launch(get_kernel("slot_dots"), (launch.cdiv(num_tokens, cfg.combine_bt), 1, 1), args, stream)
        d_weights = dw[:, :num_tokens].t().to(topk_weights.dtype).contiguous()
    starts, block_expert = aligned_blocks(state.ends, rows, ALIGNED_ROWS)
    d_w2 = None
    if need_w2:
        d_w2 = torch.empty_like(w2)
        launch.launch(*_weight_grad(dy, state.h, starts, d_w2), stream)
    if not (need_hidden or need_w13):
        return None, d_weights, None, d_w2
    dgu = torch.empty(rows, 2 * inter, dtype=dtype, device=dev)
    up = cfg.up
    grid = launch.persistent_grid(rows // up.bm * launch.cdiv(inter, up.bn), up.ctas_per_sm)
    gate, up_half = state.gate_up[:, :inter], state.gate_up[:, inter:]
    args = (dy, w2, gate, up_half, dgu[:, :inter], dgu[:, inter:], block_expert, num_experts)
    args = (*args, moe.ACTIVATIONS[activation], up.bm, up.bn, up.bk, up.gm)
    launch.launch(get_kernel("dgate_up", up.num_worker_warps, up.occupancy), grid, args, stream)
    d_w13 = None
    if need_w13:
        d_w13 = torch.empty_like(w13)
        xs = launch.as_row_major(hidden, pad_rows=False).index_select(0, state.row_token)
        launch.launch(*_weight_grad(dgu, xs, starts, d_w13), stream)
    d_hidden = None
    if need_hidden:
        dxs = torch.empty(rows, hidden_dim, dtype=dtype, device=dev)
        grouped.m_grouped(
            "moe_train_gemm", dgu, w13, dxs, state.ends, kind=Kind.PSUM, trans_b=False, fp8=False,
            alignment=ALIGNED_ROWS, cfg=cfg.down, stream=stream,
        )  # fmt: skip
        d_hidden = torch.empty(num_tokens, hidden_dim, dtype=dtype, device=dev)
        args = (dxs, state.dest, d_hidden, top_k, cfg.combine_bt, cfg.combine_bn)
        launch.launch(moe.get_kernel("combine"), _token_grid(num_tokens, hidden_dim, cfg), args, stream)
    return d_hidden, d_weights, d_w13, d_w2
