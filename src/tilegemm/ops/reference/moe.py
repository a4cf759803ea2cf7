"""Fused MoE experts of the ``pytorch`` backend: the exact semantics of ``tilegemm.moe_experts``.

Per (token t, slot j) with expert ``e = topk_ids[t, j]`` in ``[0, E)`` (any other id drops the slot)::

    g, u = x[t] @ w13[e, :I].T, x[t] @ w13[e, I:].T          fp32 accumulation
    h    = round(act(g) * u)                                  act in fp32, rounded to x.dtype
    y_j  = round(w[t, j] * (h @ w2[e].T))                     fp32 accumulation, weight applied in fp32
    out[t] = round(sum_{j = 0..k-1} y_j)                      fp32 sum in slot order, one rounding

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
from tilegemm.ops.reference._common import dequant
from tilegemm.ops.reference.grouped import BLOCK_M, m_grouped_contiguous
from tilegemm.quant import per_token_cast_to_fp8
from tilegemm.routing import moe_route, permute_tokens, unpermute_tokens

#: Gated activations ``act(gate)``, fp32 in and out.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu": lambda g: F.gelu(g),
    "gelu_tanh": lambda g: 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3))),
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
