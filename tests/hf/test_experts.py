"""The tilegemm experts function against transformers' stock experts and a float64 reference (CPU)."""

from __future__ import annotations

import pytest
import torch
from hf_models import FAMILIES, assert_within_one_bf16_step, build, reference_experts, routing
from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward, use_experts_implementation

import tilegemm.autograd
from tilegemm import custom_ops
from tilegemm.testing import calc_diff
from tilegemm.transformers import (
    EXPERTS_NAME,
    FP8_EXPERTS_NAME,
    experts,
    register_experts_functions,
    tilegemm_experts_forward,
)
from tilegemm.transformers.experts import fused_activation
from tilegemm.transformers.monkey_patch import experts_modules


def first_experts(model):
    return experts_modules(model)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_matches_reference_and_stock(family):
    module = first_experts(build(family))
    x = torch.randn(13, module.hidden_dim)
    index, weights = routing(module, 13)
    with torch.no_grad():
        out = tilegemm_experts_forward(module, x, index, weights)
        stock = grouped_mm_experts_forward(module, x, index, weights)
    ref = reference_experts(module, x, index, weights)
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert calc_diff(out, ref) < 1e-5
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert (out - stock).abs().max() <= 1e-5 * stock.abs().max()


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_fused_is_more_accurate_than_stock(family):
    """bf16 inference runs ``tilegemm.moe_experts`` (one rounding of the intermediate, one per weighted slot):
    closer to the float64 formula than transformers' path, with fp32 and bf16 routing weights (4 tokens x top-2 of 4
    or 8 experts; every fused path rounds the same way)."""
    module = first_experts(build(family, dtype=torch.bfloat16))
    x = torch.randn(4, module.hidden_dim).to(torch.bfloat16)
    assert fused_activation(module, x) == "silu"
    for weight_dtype in (torch.float32, torch.bfloat16):
        index, weights = routing(module, 4, weight_dtype=weight_dtype)
        with torch.no_grad():
            out = tilegemm_experts_forward(module, x, index, weights)
            stock = grouped_mm_experts_forward(module, x, index, weights)
        ref = reference_experts(module, x, index, weights)
        assert out.dtype == torch.bfloat16
        assert calc_diff(out, ref) < 1e-5
        assert calc_diff(out, ref) <= calc_diff(stock, ref)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_unfused_within_one_step_of_stock(family, monkeypatch):
    """The unfused path (sorted rows, two m-grouped GEMMs, the module's own activation: what models the fused op
    does not cover run) keeps transformers' rounding sequence: within one bf16 step of stock. bf16 hidden
    states with fp32 routing weights (the DeepSeek / Mixtral router quirk) and bf16 weights."""
    monkeypatch.setattr(experts, "fused_activation", lambda module, hidden_states: None)
    module = first_experts(build(family, dtype=torch.bfloat16))
    x = torch.randn(21, module.hidden_dim).to(torch.bfloat16)
    for weight_dtype in (torch.float32, torch.bfloat16):
        index, weights = routing(module, 21, weight_dtype=weight_dtype)
        with torch.no_grad():
            out = tilegemm_experts_forward(module, x, index, weights)
            stock = grouped_mm_experts_forward(module, x, index, weights)
        assert out.dtype == torch.bfloat16
        assert_within_one_bf16_step(out, stock)


def test_fp16_model_is_exact():
    module = first_experts(build("tiny-qwen3-moe", dtype=torch.float16))
    x = torch.randn(9, module.hidden_dim).half()
    index, weights = routing(module, 9)
    with torch.no_grad():
        out = tilegemm_experts_forward(module, x, index, weights)
    assert out.dtype == torch.float16
    assert calc_diff(out, reference_experts(module, x, index, weights)) < 1e-5


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_sentinel_ids_contribute_nothing(expert_parallel):
    module = first_experts(build("tiny-qwen3-moe"))
    module._is_expert_parallel = expert_parallel
    x = torch.randn(10, module.hidden_dim)
    index, weights = routing(module, 10)
    index[1, 0] = -1
    index[4, 1] = module.num_experts
    index[7] = module.num_experts + 5  # a token with no local expert at all
    with torch.no_grad():
        out = tilegemm_experts_forward(module, x, index, weights)
    ref = reference_experts(module, x, index, weights)
    assert torch.isfinite(out).all()
    assert out[7].abs().max() == 0
    assert calc_diff(out, ref) < 1e-5
    assert index[1, 0] == -1, "the caller's routing tensor must not be modified"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_calls_past_the_int32_bound_run_in_token_chunks(dtype, monkeypatch):
    """With the per-call bound lowered to 5 tokens' rows, a 23-token call runs as 5 chunks and gives the same bits
    as one call (every token's output depends on its own row only), gradients included."""
    module = first_experts(build("tiny-qwen3-moe", dtype=dtype))
    x = torch.randn(23, module.hidden_dim).to(dtype).requires_grad_(dtype == torch.float32)
    index, weights = routing(module, 23)
    whole = tilegemm_experts_forward(module, x, index, weights)
    top_k, width = index.shape[1], max(*module.gate_up_proj.shape[1:], *module.down_proj.shape[1:])
    monkeypatch.setattr(experts, "MAX_ROUTED_ELEMENTS", 5 * top_k * width)
    calls, unfused, fused = [], experts.unfused_experts_forward, custom_ops.api.moe_experts
    monkeypatch.setattr(experts, "unfused_experts_forward", lambda m, h, *a: calls.append(len(h)) or unfused(m, h, *a))
    monkeypatch.setattr(custom_ops.api, "moe_experts", lambda h, *a, **kw: calls.append(len(h)) or fused(h, *a, **kw))
    trained = tilegemm.autograd.moe_experts  # bf16 with gradients: the differentiable fused op
    monkeypatch.setattr(
        tilegemm.autograd, "moe_experts", lambda h, *a, **kw: calls.append(len(h)) or trained(h, *a, **kw)
    )
    chunked = tilegemm_experts_forward(module, x, index, weights)
    assert calls == [5, 5, 5, 5, 3]
    assert torch.equal(chunked, whole)
    if x.requires_grad:
        (g_whole,) = torch.autograd.grad(whole.sum(), x)
        (g_chunked,) = torch.autograd.grad(chunked.sum(), x)
        assert torch.equal(g_chunked, g_whole)


def test_empty_batch():
    module = first_experts(build("tiny-mixtral"))
    x = torch.randn(0, module.hidden_dim)
    index = torch.zeros(0, 2, dtype=torch.long)
    with torch.no_grad():
        out = tilegemm_experts_forward(module, x, index, torch.zeros(0, 2))
    assert out.shape == (0, module.hidden_dim)


def test_gradients_of_mixed_dtype_weights_fall_back_to_stock_with_a_warning(monkeypatch):
    """The one module tilegemm cannot differentiate: weights of two dtypes. It warns and trains on stock."""
    monkeypatch.setattr(experts, "_warned_grad", False)
    module = first_experts(build("tiny-mixtral"))
    module.down_proj.data = module.down_proj.data.double()
    x = torch.randn(5, module.hidden_dim, requires_grad=True)
    index, weights = routing(module, 5)
    with pytest.warns(UserWarning, match=r"weights \['torch.float32', 'torch.float64'\].*grouped_mm path"):
        with pytest.raises(RuntimeError):  # stock has no mixed-dtype path either: the hand-off is visible
            tilegemm_experts_forward(module, x, index, weights)


class _Config:
    _experts_implementation = "grouped_mm"


@use_experts_implementation(is_transposed=True, has_bias=True)
class _TransposedBiasExperts(torch.nn.Module):
    """Fused experts stored [E, K, N] with biases (the layout of e.g. gpt-oss), to cover those flags."""

    def __init__(self, config, num_experts=4, hidden=32, inter=16):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = torch.nn.Parameter(torch.randn(num_experts, hidden, 2 * inter) * 0.1)
        self.gate_up_proj_bias = torch.nn.Parameter(torch.randn(num_experts, 2 * inter) * 0.1)
        self.down_proj = torch.nn.Parameter(torch.randn(num_experts, inter, hidden) * 0.1)
        self.down_proj_bias = torch.nn.Parameter(torch.randn(num_experts, hidden) * 0.1)
        self.act_fn = torch.nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):  # pragma: no cover - replaced by decorator
        raise NotImplementedError


def test_transposed_weights_with_bias_match_stock():
    torch.manual_seed(0)
    module = _TransposedBiasExperts(_Config())
    x = torch.randn(11, 32)
    index, weights = routing(module, 11)
    with torch.no_grad():
        out = tilegemm_experts_forward(module, x, index, weights)
        stock = grouped_mm_experts_forward(module, x, index, weights)
    assert calc_diff(out, stock) < 1e-5
    assert (out - stock).abs().max() <= 1e-5 * stock.abs().max()


def test_transposed_weights_with_bias_train_like_stock():
    torch.manual_seed(0)
    module = _TransposedBiasExperts(_Config())
    x = torch.randn(11, 32)
    index, weights = routing(module, 11)
    grads = []
    for forward in (tilegemm_experts_forward, grouped_mm_experts_forward):
        module.zero_grad()
        leaf = x.clone().requires_grad_()
        forward(module, leaf, index, weights).square().sum().backward()
        grads.append([leaf.grad, *(p.grad.clone() for p in module.parameters())])
    for mine, stock in zip(*grads):
        assert calc_diff(mine, stock) < 1e-10

    register_experts_functions()
    assert ExpertsInterface()[EXPERTS_NAME] is tilegemm_experts_forward
    assert FP8_EXPERTS_NAME in ExpertsInterface()
    model = build("tiny-qwen2-moe")
    model.set_experts_implementation(EXPERTS_NAME)
    assert model.config._experts_implementation == EXPERTS_NAME
