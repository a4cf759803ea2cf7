"""Dense nn.Linear swap: parameters, state_dict and weight tying kept; outputs match."""

from __future__ import annotations

import torch
from hf_models import assert_within_one_bf16_step, build, prompt, require_bf16_linear_rounds_once

from tilegemm.testing import calc_diff
from tilegemm.transformers import TileGemmLinear, apply_tilegemm_to_model, restore_linear_layers, swap_linear_layers


def test_swap_keeps_parameters_state_dict_and_tying():
    model = build("tiny-qwen3-moe", tie_word_embeddings=True)
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    params = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    keys = list(model.state_dict())
    names = swap_linear_layers(model)
    assert "lm_head" in names and "model.layers.0.self_attn.q_proj" in names
    assert isinstance(model.lm_head, TileGemmLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters(remove_duplicate=False))
    assert restore_linear_layers(model) == len(names)
    assert type(model.lm_head) is torch.nn.Linear


def test_router_style_gates_stay_stock():
    model = build("tiny-qwen2-moe")
    swap_linear_layers(model)
    gate = model.model.layers[0].mlp.shared_expert_gate
    assert type(gate) is torch.nn.Linear  # out_features == 1


def test_linear_fp32_and_bf16_match_stock():
    ids = prompt()
    for dtype in (torch.float32, torch.bfloat16):
        model = build("tiny-mixtral", dtype=dtype)
        with torch.no_grad():
            ref = model(ids).logits
            apply_tilegemm_to_model(model, experts=False, linear=True)
            out = model(ids).logits
        if dtype == torch.float32:
            assert calc_diff(out, ref) < 1e-5
        else:
            require_bf16_linear_rounds_once()  # the fp32 half above has run
            assert_within_one_bf16_step(out, ref)


def test_linear_with_bias_and_fp8():
    torch.manual_seed(0)
    layer = torch.nn.Linear(200, 136, bias=True)
    x = torch.randn(3, 5, 200)
    with torch.no_grad():
        ref = layer(x)
        swap_linear_layers(layer)
        out = layer(x)
        assert calc_diff(out, ref) < 1e-5
        swap_linear_layers(layer, fp8=True)
        out8 = layer(x)
    assert out8.shape == ref.shape
    assert calc_diff(out8, ref) < 1e-3  # one FP8 GEMM
    y = layer(x.requires_grad_())  # gradients: stock F.linear
    y.sum().backward()
    assert layer.weight.grad is not None
