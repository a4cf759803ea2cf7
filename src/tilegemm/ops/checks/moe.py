"""Checks of the fused MoE experts ops (``moe_experts``, its forward/backward pair, ``fp8_moe_experts``)."""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.ops.checks.base import FLOATS, _describe, _fp8_operand, _same_device, _shape, _stream, _tensor

#: Gated activations ``moe_experts`` knows (the reference implements all of them).
MOE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _moe_tokens_check(hidden, topk_ids, topk_weights, hidden_dtypes) -> int:
    """The token side of both experts ops: ``hidden [T, H]`` of ``hidden_dtypes``, int ``topk_ids [T, k]``, float
    ``topk_weights [T, k]``; returns H."""
    _tensor("hidden", hidden, hidden_dtypes, 2)
    tokens, hidden_dim = hidden.shape
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), 2)
    if topk_ids.shape[0] != tokens:
        raise ValueError(f"topk_ids: got shape {list(topk_ids.shape)}, expected [T={tokens}, k] to match hidden")
    _tensor("topk_weights", topk_weights, FLOATS, 2)
    _shape("topk_weights", topk_weights, [tokens, topk_ids.shape[1]], "[T, k], like topk_ids")
    return hidden_dim


def _moe_activation_check(activation: str) -> None:
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"activation: got {activation!r}, expected one of {list(MOE_ACTIVATIONS)}")


def moe_experts_check(hidden, topk_ids, topk_weights, w13, w2, activation="silu", *, stream=None) -> dict[str, Any]:
    """The check of ``moe_experts`` (shapes, dtypes, devices; no value checks: any expert id is allowed)."""
    hidden_dim = _moe_tokens_check(hidden, topk_ids, topk_weights, FLOATS)
    _tensor("w13", w13, (hidden.dtype,), 3)
    experts, two_inter, h13 = w13.shape
    if two_inter % 2 or h13 != hidden_dim:
        raise ValueError(f"w13: got shape {list(w13.shape)}, expected [E, 2I, H={hidden_dim}] (gate rows then up rows)")
    _tensor("w2", w2, (hidden.dtype,), 3)
    _shape("w2", w2, [experts, hidden_dim, two_inter // 2], "[E, H, I] to match w13 [E, 2I, H]")
    _moe_activation_check(activation)
    _stream(stream)
    _same_device(dict(hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w2=w2))
    return dict(
        hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w2=w2, activation=activation,
        stream=stream,
    )  # fmt: skip


def moe_experts_backward_check(
    grad_out, hidden, topk_weights, w13, w2, state, activation="silu", needs=(True, True, True, True), *, stream=None
) -> dict[str, Any]:
    """The check of ``moe_experts_backward``: the forward's operands, ``grad_out`` like the output and a
    ``MoETrainState`` of matching shapes (its values are the forward's own: not read here)."""
    from tilegemm.ops.common import MoETrainState
    from tilegemm.routing import ALIGNED_ROWS, max_padded_rows

    if not isinstance(state, MoETrainState):
        raise TypeError(f"state: got {_describe(state)}, expected the MoETrainState of moe_experts_forward")
    _tensor("state.dest", state.dest, (torch.int32,), 2)
    moe_experts_check(hidden, state.dest, topk_weights, w13, w2, activation)
    _tensor("grad_out", grad_out, (hidden.dtype,), 2)
    _shape("grad_out", grad_out, list(hidden.shape), "[T, H], like the output")
    (tokens, hidden_dim), top_k = hidden.shape, state.dest.shape[1]
    experts, inter = w13.shape[0], w2.shape[2]
    rows = max_padded_rows(tokens, top_k, experts, ALIGNED_ROWS)
    expected = {
        "row_token": ((torch.int32,), [rows]), "row_weight": ((torch.float32,), [rows]),
        "ends": ((torch.int32,), [experts]), "gate_up": ((hidden.dtype,), [rows, 2 * inter]),
        "h": ((hidden.dtype,), [rows, inter]), "y": ((hidden.dtype,), [rows, hidden_dim]),
    }  # fmt: skip
    for name, (dtypes, shape) in expected.items():
        _tensor(f"state.{name}", getattr(state, name), dtypes, len(shape))
        _shape(f"state.{name}", getattr(state, name), shape, "as moe_experts_forward made it")
    if not (isinstance(needs, (tuple, list)) and len(needs) == 4 and all(isinstance(n, bool) for n in needs)):
        raise TypeError(f"needs: got {_describe(needs)}, expected four bools (hidden, topk_weights, w13, w2)")
    _same_device(dict(grad_out=grad_out, hidden=hidden, **state._asdict()))
    return dict(
        grad_out=grad_out, hidden=hidden, topk_weights=topk_weights, w13=w13, w2=w2, state=state,
        activation=activation, needs=tuple(needs), stream=stream,
    )  # fmt: skip


def fp8_moe_experts_check(hidden, topk_ids, topk_weights, w13, w2, activation="silu", *, stream=None) -> dict[str, Any]:
    """The check of ``fp8_moe_experts``: bf16 ``hidden [T, H]``, FP8 ``w13`` / ``w2`` tuples with 128x128 block
    scales, H and I multiples of 128 (the 1x128 activation blocks); no value checks (any expert id is allowed)."""
    hidden_dim = _moe_tokens_check(hidden, topk_ids, topk_weights, (torch.bfloat16,))
    w13_data, w13_scales = _fp8_operand("w13", w13, 3)
    experts, two_inter, h13 = w13_data.shape
    if two_inter % 2 or h13 != hidden_dim:
        raise ValueError(
            f"w13[0]: got shape {list(w13_data.shape)}, expected [E, 2I, H={hidden_dim}] (gate rows then up rows)"
        )
    inter = two_inter // 2
    if hidden_dim % 128:
        raise ValueError(
            f"hidden: got H={hidden_dim} (shape {list(hidden.shape)}), expected H a multiple of 128 (the 1x128 "
            "activation blocks of fp8_moe_experts); w13 [E, 2I, H] and w2 [E, H, I] share it"
        )
    if inter % 128:
        raise ValueError(
            f"w13[0]: got shape {list(w13_data.shape)} (I={inter}), expected I a multiple of 128 (the 1x128 blocks of "
            "fp8_moe_experts' intermediate); w2 [E, H, I] shares it"
        )
    _shape("w13[1]", w13_scales, [experts, two_inter // 128, hidden_dim // 128], "128x128 block scales of w13")
    w2_data, w2_scales = _fp8_operand("w2", w2, 3)
    _shape("w2[0]", w2_data, [experts, hidden_dim, inter], "[E, H, I] to match w13 [E, 2I, H]")
    _shape("w2[1]", w2_scales, [experts, hidden_dim // 128, inter // 128], "128x128 block scales of w2")
    _moe_activation_check(activation)
    _stream(stream)
    _same_device(
        {
            "hidden": hidden, "topk_ids": topk_ids, "topk_weights": topk_weights, "w13[0]": w13_data,
            "w13[1]": w13_scales, "w2[0]": w2_data, "w2[1]": w2_scales,
        }
    )  # fmt: skip
    return dict(
        hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=(w13_data, w13_scales),
        w2=(w2_data, w2_scales), activation=activation, stream=stream,
    )  # fmt: skip
