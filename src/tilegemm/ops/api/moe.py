"""Fused MoE experts stubs: inference, the training forward/backward pair, FP8 (see the package docstring)."""

from __future__ import annotations

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks
from tilegemm.ops.api._stubs import FP8Operand, Tensor, op, retyped  # noqa: F401  (FP8Operand: a retyped annotation)
from tilegemm.ops.common import MoETrainState

# ------------------------------------------------------------------------------- MoE experts


_EXPERTS_DOC = """Fused MoE experts (tilegemm's extension; no DeepGEMM counterpart): routing, gated MLPs and combine.

    Args:
        hidden: [T, H] token hidden states, bf16 (the ``pytorch`` backend also takes fp16/fp32).
        topk_ids: int32/int64 [T, k] expert of each (token, slot); ids outside ``[0, E)`` (expert-parallel
            sentinels such as -1 or E) drop the slot.
        topk_weights: float [T, k] routing weights (fp32 or the hidden dtype).
        w13: [E, 2I, H], ``hidden.dtype``: each expert's gate rows ``[0, I)`` then up rows ``[I, 2I)``
            (transformers' ``gate_up_proj`` of Qwen3-MoE, DeepSeek-V3, Mixtral).
        w2: [E, H, I], ``hidden.dtype``: each expert's down projection (transformers' ``down_proj``).
        activation: the gated activation ``act(gate) * up``: ``"silu"``, ``"gelu"`` (erf; the ``pytorch``
            backend only) or ``"gelu_tanh"`` (tanh approximation).
        stream: CUDA stream (``None``: current).

    Returns:
        A new [T, H] tensor in ``hidden.dtype``. Per slot with expert e: ``h = round(act(x @ w13[e, :I].T) *
        (x @ w13[e, I:].T))``, ``y_j = round(w[t, j] * (h @ w2[e].T))``, both accumulated in fp32; then
        ``out[t] = round(sum_j y_j)``, an fp32 sum in slot order (no atomics: reruns are bitwise identical).

    No host synchronisation: routing (sort by expert, counts, offsets) runs on the device, buffer sizes
    depend only on ``(T, k, E)``, so the call is CUDA-graph capturable.
    """

_FORWARD_DOC = """The training forward of :func:`moe_experts` (the first half of ``tilegemm.autograd.moe_experts``).

    Arguments as :func:`moe_experts`. Returns ``(out, state)``: ``out`` [T, H] in ``hidden.dtype`` is
    ``round(sum_j w[t, j] * y_j)`` with ``y_j = round(h @ w2[e].T)`` and ``h`` as in :func:`moe_experts` (the
    routing weight applied in the fp32 combine, not before the rounding of ``y``); ``state`` is the
    :class:`tilegemm.ops.common.MoETrainState` that :func:`moe_experts_backward` takes (the routing in the
    128-row aligned layout, the gate/up products, ``h`` and ``y``). No host synchronisation.
    """

_FP8_EXPERTS_DOC = """Fused FP8 MoE experts (tilegemm's extension): :func:`moe_experts` with DeepGEMM's FP8 recipe.

    Args:
        hidden: bf16 [T, H], H a multiple of 128; quantized inside, one scale per token per 128 of H.
        topk_ids: int32/int64 [T, k]; ids outside ``[0, E)`` drop the slot (as in :func:`moe_experts`).
        topk_weights: float [T, k] routing weights.
        w13: ``(float8_e4m3fn [E, 2I, H], fp32 [E, 2I/128, H/128])``: gate rows ``[0, I)`` then up rows, with
            128x128 block scales (``tilegemm.per_block_cast_to_fp8(gate_up_proj)``); I a multiple of 128.
        w2: ``(float8_e4m3fn [E, H, I], fp32 [E, H/128, I/128])``: the down projections, 128x128 block scales.
        activation: ``"silu"``, ``"gelu"`` (erf; the ``pytorch`` backend only) or ``"gelu_tanh"``.
        stream: CUDA stream (``None``: current).

    Returns:
        A new bf16 [T, H] tensor. With ``q(v)`` the 1x128 quantization of ``tilegemm.per_token_cast_to_fp8``
        (scale = max(amax, 1e-4) / 448 per 128 values, stored dequantized here) and ``W`` the dequantized
        weights, per slot with expert e::

            g, u = q(x[t]) @ W13[e, :I].T, q(x[t]) @ W13[e, I:].T     fp32 (per-128-K block products, promoted)
            h    = act(g) * u                                         fp32, not rounded
            y_j  = round_bf16(w[t, j] * (q(h) @ W2[e].T))              fp32
            out[t] = round_bf16(sum_{j=0..k-1} y_j)                    fp32 sum in slot order

    No host synchronisation; CUDA-graph capturable; reruns are bitwise identical.
    """


def _experts(
    hidden: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    activation: str = "silu",
    *,
    stream=None,
) -> Tensor: ...


moe_experts = op("moe_experts", _experts, _EXPERTS_DOC, checks.moe_experts_check)
moe_experts_forward = op(
    "moe_experts_forward",
    retyped(_experts, returns="tuple[Tensor, MoETrainState]"),
    _FORWARD_DOC,
    checks.moe_experts_check,
)


@dispatch("moe_experts_backward", check=checks.moe_experts_backward_check)
def moe_experts_backward(
    grad_out: Tensor,
    hidden: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    state: MoETrainState,
    activation: str = "silu",
    needs: tuple[bool, bool, bool, bool] = (True, True, True, True),
    *,
    stream=None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of :func:`moe_experts_forward`'s output: ``(d_hidden, d_topk_weights, d_w13, d_w2)``.

    Args:
        grad_out: [T, H] in ``hidden.dtype``, the gradient of ``out``.
        hidden, topk_weights, w13, w2, activation: the forward's arguments.
        state: the forward's :class:`tilegemm.ops.common.MoETrainState`.
        needs: which of the four gradients to compute (the others come back ``None``).

    Returns, each in its input's dtype and shape, with ``dy[r] = round(w_r * grad_out[t_r])`` per routed row
    ``r`` (token ``t_r``, expert ``e``, weight ``w_r``), ``dh = dy @ w2[e]`` (fp32), ``g, u`` the saved gate/up::

        d_topk_weights[t, j] = sum_c grad_out[t, c] * y[dest[t, j], c]           (fp32 sums)
        dgate = round(dh * u * act'(g)),  dup = round(dh * act(g))
        d_w2[e]  = round(sum_r dy[r].T h[r]),  d_w13[e] = round(sum_r [dgate, dup][r].T x[t_r])
        d_hidden[t] = round(sum_j round([dgate, dup] @ w13[e])[dest[t, j]])      (slots in order)

    Dropped slots get zero gradients. Every sum has a fixed order: reruns are bitwise identical.
    """


fp8_moe_experts = op(
    "fp8_moe_experts",
    retyped(_experts, w13="FP8Operand", w2="FP8Operand"),
    _FP8_EXPERTS_DOC,
    checks.fp8_moe_experts_check,
)
