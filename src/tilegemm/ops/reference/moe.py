"""Fused MoE experts of the ``pytorch`` backend: the exact semantics of ``tilegemm.moe_experts``.

Per (token t, slot j) with expert ``e = topk_ids[t, j]`` in ``[0, E)`` (any other id drops the slot)::

    g, u = x[t] @ w13[e, :I].T, x[t] @ w13[e, I:].T          fp32 accumulation
    h    = round(act(g) * u)                                  act in fp32, rounded to x.dtype
    y_j  = round(w[t, j] * (h @ w2[e].T))                     fp32 accumulation, weight applied in fp32
    out[t] = round(sum_{j = 0..k-1} y_j)                      fp32 sum in slot order, one rounding

``moe_experts_forward`` computes the same output with the routing weight applied at the combine,
``out[t] = round(sum_j w[t, j] * round(h @ w2[e].T))``, and keeps the routed rows (``ops.common.MoETrainState``);
``moe_experts_backward`` is its gradient with the roundings of ``ops/cutile/moe_train.py`` (``dy``, ``dgate``,
``dup``, each input-gradient row and each weight gradient rounded once from fp32 sums).

``fp8_moe_experts`` is the same with DeepGEMM's FP8 recipe: ``x`` quantized per token (1x128 scales), the
weights' 128x128 blocks dequantized, ``h`` kept in fp32 and quantized 1x128 before the down projection (see
``tilegemm.ops.api.fp8_moe_experts``).

Built on the device-side routing (``tilegemm.routing``) and the m-grouped reference GEMM: no host sync.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tilegemm.backend.registry import register_impl
from tilegemm.ops.common import MoETrainState, moe_train_empty, moe_train_is_empty, moe_train_zero_grads
from tilegemm.ops.reference._common import dequant
from tilegemm.ops.reference.grouped import BLOCK_M, m_grouped_contiguous
from tilegemm.quant import per_token_cast_to_fp8
from tilegemm.routing import (
    ALIGNED_ROWS,
    aligned_blocks,
    expert_ends,
    max_padded_rows,
    moe_route,
    permute_tokens,
    unpermute_tokens,
)

#: Gated activations ``act(gate)``, fp32 in and out.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu": lambda g: F.gelu(g),
    "gelu_tanh": lambda g: 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3))),
}


def _gelu_tanh_grad(g: torch.Tensor) -> torch.Tensor:
    c = math.sqrt(2.0 / math.pi)
    t = torch.tanh(c * (g + 0.044715 * g**3))
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * g * g)


#: The derivatives ``act'(gate)`` of :data:`ACTIVATIONS`, fp32 in and out.
ACTIVATION_GRADS = {
    "silu": lambda g: torch.sigmoid(g) * (1.0 + g * (1.0 - torch.sigmoid(g))),
    "gelu": lambda g: (
        0.5 * (1.0 + torch.erf(g / math.sqrt(2.0))) + g * torch.exp(-0.5 * g * g) / math.sqrt(2 * math.pi)
    ),  # noqa: E501
    "gelu_tanh": _gelu_tanh_grad,
}


def _grouped(a32: torch.Tensor, w: torch.Tensor | tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor):
    """fp32 ``a32[r] @ w[m_indices[r]].T`` (rows of ``-1``: 0) for ``w [E, N, K]`` in any float dtype, or an FP8
    ``(data [E, N, K], 128x128 block scales [E, N/128, K/128])`` tuple, dequantized expert by expert."""
    data = w[0] if isinstance(w, tuple) else w
    d = torch.empty(a32.shape[0], data.shape[1], dtype=torch.float32, device=a32.device)
    if isinstance(w, tuple):
        load = lambda idx: dequant(w[0].index_select(0, idx), w[1].index_select(0, idx), 128)  # noqa: E731
    else:
        load = lambda idx: w.index_select(0, idx).float()  # noqa: E731
    return m_grouped_contiguous(a32, load, data.shape[0], d, m_indices, False, BLOCK_M)


def _weighted_combine(y: torch.Tensor, routing, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = round(sum_j round(w[t, j] * y[row(t, j)]))``: fp32 ``y`` [M, H] in the routed layout, the weight
    applied in fp32 and rounded to ``dtype`` per slot, the slots summed in fp32 in order (dropped slots: 0)."""
    valid = routing.src_slot >= 0
    w = topk_weights.reshape(-1).float().index_select(0, routing.src_slot.clamp(min=0))
    y = (y * torch.where(valid, w, torch.zeros((), device=w.device))[:, None]).to(dtype)
    return unpermute_tokens(y, routing, None, out_dtype=dtype)


@register_impl("moe_experts", "pytorch")
def moe_experts(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Reference fused experts (see the module docstring); returns [T, H] in ``hidden.dtype``."""
    num_tokens, hidden_dim = hidden.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    if num_tokens == 0 or topk_ids.shape[1] == 0 or num_experts == 0:
        return torch.zeros(num_tokens, hidden_dim, dtype=hidden.dtype, device=hidden.device)
    routing = moe_route(topk_ids, num_experts, alignment=BLOCK_M)
    a32 = permute_tokens(hidden, routing).float()
    gate_up = _grouped(a32, w13, routing.m_indices)
    h = (ACTIVATIONS[activation](gate_up[:, :inter]) * gate_up[:, inter:]).to(hidden.dtype)
    y = _grouped(h.float(), w2, routing.m_indices)
    return _weighted_combine(y, routing, topk_weights, hidden.dtype)


@register_impl("fp8_moe_experts", "pytorch")
def fp8_moe_experts(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Reference FP8 fused experts (``tilegemm.ops.api.fp8_moe_experts``); returns bf16 [T, H]."""
    num_tokens, hidden_dim = hidden.shape
    num_experts, inter = w13[0].shape[0], w2[0].shape[2]
    if num_tokens == 0 or topk_ids.shape[1] == 0 or num_experts == 0:
        return torch.zeros(num_tokens, hidden_dim, dtype=hidden.dtype, device=hidden.device)
    routing = moe_route(topk_ids, num_experts, alignment=BLOCK_M)
    x32 = dequant(*per_token_cast_to_fp8(hidden), 1)
    a32 = permute_tokens(x32, routing)
    gate_up = _grouped(a32, w13, routing.m_indices)
    h32 = ACTIVATIONS[activation](gate_up[:, :inter]) * gate_up[:, inter:]
    y = _grouped(dequant(*per_token_cast_to_fp8(h32), 1), w2, routing.m_indices)
    return _weighted_combine(y, routing, topk_weights, hidden.dtype)


def _slot_sum(rows: torch.Tensor, dest: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``round(sum_j scale[t, j] * rows[dest[t, j]])``: fp32, slots in order, dropped slots (``dest`` -1) 0."""
    acc = torch.zeros(dest.shape[0], rows.shape[1], dtype=torch.float32, device=rows.device)
    for j in range(dest.shape[1]):
        index = dest[:, j].long()
        part = rows.index_select(0, index.clamp(min=0)).float()
        if scale is not None:
            part = scale[:, j].float()[:, None] * part
        acc = acc + torch.where((index >= 0)[:, None], part, torch.zeros((), device=acc.device))
    return acc.to(dtype)


def _row_experts(ends: torch.Tensor, rows: int) -> torch.Tensor:
    """int32 [rows]: each row's expert in the aligned layout of ``ends``, -1 for padding rows."""
    starts, _ = aligned_blocks(ends, rows, ALIGNED_ROWS)
    r = torch.arange(rows, device=ends.device)
    e = torch.searchsorted(starts[1:].to(torch.int64), r, right=True).clamp(max=ends.shape[0] - 1)
    live = (r >= starts[e]) & (r < ends[e])
    return torch.where(live, e, -1).to(torch.int32)


def _weight_grads(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``round(a_e.T @ b_e)`` [E, a cols, b cols] over each expert's rows (fp32 sums)."""
    starts, _ = aligned_blocks(ends, a.shape[0], ALIGNED_ROWS)
    out = torch.zeros(ends.shape[0], a.shape[1], b.shape[1], dtype=torch.float32, device=a.device)
    for e, (start, end) in enumerate(zip(starts[:-1].tolist(), ends.tolist(), strict=True)):
        if end > start:
            out[e] = a[start:end].float().t() @ b[start:end].float()
    return out.to(dtype)


@register_impl("moe_experts_forward", "pytorch")
def moe_experts_forward(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Reference training forward (module docstring): ``(out [T, H], MoETrainState)``."""
    num_tokens, top_k = topk_ids.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    rows = max_padded_rows(num_tokens, top_k, num_experts, ALIGNED_ROWS)
    if moe_train_is_empty(hidden, topk_ids, w13, w2):
        return moe_train_empty(hidden, topk_ids, w13, w2, rows)
    dtype = hidden.dtype
    routing = moe_route(topk_ids, num_experts, alignment=ALIGNED_ROWS)
    slot = routing.src_slot
    live = slot >= 0
    row_token = torch.where(live, slot // top_k, 0).to(torch.int32)
    row_weight = torch.where(live, topk_weights.reshape(-1).float()[slot.clamp(min=0)], 0.0)
    gate_up = _grouped(permute_tokens(hidden, routing).float(), w13, routing.m_indices)
    h = (ACTIVATIONS[activation](gate_up[:, :inter]) * gate_up[:, inter:]).to(dtype)
    y = _grouped(h.float(), w2, routing.m_indices).to(dtype)
    dest = routing.dest_row.view(num_tokens, top_k).to(torch.int32)
    state = MoETrainState(row_token, row_weight, dest, expert_ends(routing.counts), gate_up.to(dtype), h, y)
    return _slot_sum(y, dest, topk_weights, dtype), state


@register_impl("moe_experts_backward", "pytorch")
def moe_experts_backward(grad_out, hidden, topk_weights, w13, w2, state, activation, needs, stream):
    """Reference backward of :func:`moe_experts_forward`: ``(d_hidden, d_topk_weights, d_w13, d_w2)``."""
    if moe_train_is_empty(hidden, state.dest, w13, w2):
        return moe_train_zero_grads(hidden, topk_weights, w13, w2, needs)
    need_hidden, need_weights, need_w13, need_w2 = needs
    dtype, inter = hidden.dtype, w2.shape[2]
    rows = state.gate_up.shape[0]
    dout = grad_out.float()
    dy = (dout.index_select(0, state.row_token.long()) * state.row_weight[:, None]).to(dtype)
    d_weights = d_w13 = d_w2 = d_hidden = None
    if need_weights:
        index = state.dest.long()
        y = state.y.index_select(0, index.clamp(min=0).reshape(-1)).float().view(*index.shape, -1)
        d_weights = torch.where(index >= 0, (y * dout[:, None, :]).sum(-1), 0.0).to(topk_weights.dtype)
    if need_w2:
        d_w2 = _weight_grads(dy, state.h, state.ends, dtype)
    if need_hidden or need_w13:
        m_indices = _row_experts(state.ends, rows)
        dh = _grouped(dy.float(), w2.transpose(1, 2), m_indices)
        gate, up = state.gate_up.float().split(inter, dim=1)
        dgu = torch.cat([dh * up * ACTIVATION_GRADS[activation](gate), dh * ACTIVATIONS[activation](gate)], dim=1)
        dgu = dgu.to(dtype)
        if need_w13:
            d_w13 = _weight_grads(dgu, hidden.index_select(0, state.row_token.long()), state.ends, dtype)
        if need_hidden:
            dxs = _grouped(dgu.float(), w13.transpose(1, 2), m_indices).to(dtype)
            d_hidden = _slot_sum(dxs, state.dest, None, dtype)
    return d_hidden, d_weights, d_w13, d_w2
