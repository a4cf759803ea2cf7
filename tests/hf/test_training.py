"""Training through the patched experts: gradients via tilegemm.autograd.moe_experts (bf16 plain gated experts),
tilegemm.grouped_matmul (the unfused path: bf16, fp16, fp32) and tilegemm.fp8_grouped_matmul (the FP8 variant)
match stock and float64, with no hand-off to transformers."""

from __future__ import annotations

import warnings

import pytest
import torch
from hf_models import build, routing
from transformers.integrations.moe import grouped_mm_experts_forward

import tilegemm.autograd
from tilegemm.fp8_weights import clear_fp8_cache
from tilegemm.testing import calc_diff
from tilegemm.transformers.experts import (
    tilegemm_experts_forward,
    tilegemm_fp8_experts_forward,
    unfused_experts_forward,
)
from tilegemm.transformers.monkey_patch import experts_modules

FAMILIES = ["tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v3"]
TOKENS = 40


def _run(forward, module, x, index, weights, grad):
    """Forward + backward; returns (out, dx, d gate_up, d down, d routing weights)."""
    module.zero_grad()
    x = x.clone().requires_grad_()
    weights = weights.clone().requires_grad_()
    out = forward(module, x, index, weights)
    out.backward(grad)
    return out.detach(), x.grad, module.gate_up_proj.grad.clone(), module.down_proj.grad.clone(), weights.grad


def _float64_truth(module, x, index, weights, grad):
    """The same quantities from autograd on the float64 formula."""
    x = x.double().requires_grad_()
    weights = weights.double().requires_grad_()
    up = module.gate_up_proj.detach().double().requires_grad_()
    down = module.down_proj.detach().double().requires_grad_()
    rows = []
    for t in range(x.shape[0]):
        acc = x.new_zeros(x.shape[1])
        for j in range(index.shape[1]):
            e = int(index[t, j])
            gate, lin = (up[e] @ x[t]).chunk(2)
            acc = acc + weights[t, j] * (down[e] @ (module.act_fn(gate) * lin))
        rows.append(acc)
    out = torch.stack(rows)
    out.backward(grad.double())
    return out.detach(), x.grad, up.grad, down.grad, weights.grad


def _case(family: str, dtype: torch.dtype, backend: str = "pytorch"):
    """The first experts module of tiny model ``family`` in ``dtype`` on ``backend``, with random tokens,
    routing and output gradient: ``(module, x, index, weights, grad)``."""
    module = experts_modules(build(family, dtype=dtype))[0]
    module._tilegemm_backend = backend
    x = torch.randn(TOKENS, module.hidden_dim).to(dtype)
    index, weights = routing(module, TOKENS)
    grad = torch.randn(TOKENS, module.hidden_dim).to(dtype)
    return module, x, index, weights, grad


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_unfused_gradients_match_stock_and_float64(family):
    """The unfused path (fp16/fp32 models and modules the fused op does not cover) rounds where stock does."""
    module, x, index, weights, grad = _case(family, torch.bfloat16)
    ours = _run(unfused_experts_forward, module, x, index, weights, grad)
    stock = _run(grouped_mm_experts_forward, module, x, index, weights, grad)
    truth = _float64_truth(module, x, index, weights, grad)
    for name, mine, theirs, exact in zip(["out", "dx", "d_gate_up", "d_down", "d_routing"], ours, stock, truth):
        assert mine is not None, name
        # Element-wise the two bf16 paths may differ by a few bf16 steps where sums cancel; as wholes they are
        # equally close to float64 (~1e-5 from bf16 rounding of the intermediates, measured on these models).
        err, stock_err = calc_diff(mine, exact), calc_diff(theirs, exact)
        assert err < 5e-5, (name, err)
        assert err <= 1.1 * stock_err + 1e-7, (name, err, stock_err)
        assert calc_diff(mine, theirs) < 1e-5, name


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_fused_gradients_closer_to_float64_than_stock(family):
    """bf16 plain gated experts train through tilegemm.autograd.moe_experts, which rounds each intermediate once
    (stock rounds gate, up, the activation and the weighted product): every result is at least as close to the
    float64 formula as stock's (measured: 0.3-0.8x stock's calc_diff), and the two differ by no more than their
    two errors together (``sqrt(calc_diff)`` is a relative distance)."""
    module, x, index, weights, grad = _case(family, torch.bfloat16)
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        fused = tilegemm.autograd.moe_experts
        patch.setattr(tilegemm.autograd, "moe_experts", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
        ours = _run(tilegemm_experts_forward, module, x, index, weights, grad)
    assert calls, "bf16 training did not take the fused op"
    stock = _run(grouped_mm_experts_forward, module, x, index, weights, grad)
    truth = _float64_truth(module, x, index, weights, grad)
    for name, mine, theirs, exact in zip(["out", "dx", "d_gate_up", "d_down", "d_routing"], ours, stock, truth):
        err, stock_err = calc_diff(mine, exact), calc_diff(theirs, exact)
        assert err < 5e-5 and err <= stock_err, (name, err, stock_err)
        assert calc_diff(mine, theirs) ** 0.5 <= err**0.5 + stock_err**0.5, name


def _no_stock_hand_off(forward):
    """``forward`` with every warning an error: tilegemm's path warns when it hands training to transformers."""

    def run(*args):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return forward(*args)

    return run


# fp32 trains exactly (fp32 products and sums; float64 agreement is fp32 rounding); fp16 rounds the
# intermediates once each, as stock does.
@pytest.mark.parametrize("dtype,bar", [(torch.float32, 1e-9), (torch.float16, 1e-5)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_fp16_gradients_match_float64(family, dtype, bar):
    # fp16/fp32 run the pytorch backend's exact ops whatever backend the module asks for
    module, x, index, weights, grad = _case(family, dtype, backend="cutile")
    ours = _run(_no_stock_hand_off(tilegemm_experts_forward), module, x, index, weights, grad)
    truth = _float64_truth(module, x, index, weights, grad)
    for name, mine, exact in zip(["out", "dx", "d_gate_up", "d_down", "d_routing"], ours, truth):
        assert mine is not None and mine.dtype == (torch.float32 if name == "d_routing" else dtype), name
        assert calc_diff(mine, exact) < bar, (name, calc_diff(mine, exact))


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_training_is_the_fp8_forward_with_straight_through_gradients(family):
    module, x, index, weights, grad = _case(family, torch.bfloat16)
    out, *grads = _run(_no_stock_hand_off(tilegemm_fp8_experts_forward), module, x, index, weights, grad)
    with torch.no_grad():
        inference = tilegemm_fp8_experts_forward(module, x, index, weights)
    assert torch.equal(out, inference)  # the same FP8 forward as inference
    bf16 = _run(tilegemm_experts_forward, module, x, index, weights, grad)
    truth = _float64_truth(module, x, index, weights, grad)
    for name, mine, exact, plain in zip(["dx", "d_gate_up", "d_down", "d_routing"], grads, truth[1:], bf16[1:]):
        # Straight-through: the backward GEMMs are bf16's on the FP8 forward's intermediates, so the gradients
        # sit within FP8 quantization error (the FP8-experts bar, tests/hf/test_fp8.py) of float64.
        assert mine is not None and torch.isfinite(mine).all(), name
        assert calc_diff(mine, exact) < 1e-2, (name, calc_diff(mine, exact))
        assert calc_diff(mine, plain) < 1e-2, name


def test_fp8_training_requantizes_after_an_optimizer_step():
    module, x, index, weights, _ = _case("tiny-qwen3-moe", torch.bfloat16)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    tilegemm_fp8_experts_forward(module, x, index, weights).float().square().sum().backward()
    opt.step()
    with torch.no_grad():
        after = tilegemm_fp8_experts_forward(module, x, index, weights)
        assert clear_fp8_cache(module) == 1  # quantize the stepped weights from scratch
        fresh = tilegemm_fp8_experts_forward(module, x, index, weights)
    assert torch.equal(after, fresh)
