"""Dense nn.Linear swap: parameters, state_dict and weight tying kept; outputs match."""

from __future__ import annotations

import torch
from hf_models import assert_within_one_bf16_step, bf16_gemms_round_once, build, prompt

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
        with torch.no_grad(), bf16_gemms_round_once():  # stock's bf16 GEMMs round once, as on every CPU
            ref = model(ids).logits
            apply_tilegemm_to_model(model, experts=False, linear=True)
            out = model(ids).logits
        if dtype == torch.float32:
            assert calc_diff(out, ref) < 1e-5
        else:
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


def test_bf16_gemms_round_once_pins_stock_gemms_and_restores_them():
    """The tests' stand-in for stock's CPU GEMMs: the fp32 product rounded once, grouped by offsets; torch's own
    functions back after the block."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g).bfloat16() for shape in ((5, 64), (24, 64), (24,)))
    grouped_w = torch.randn(3, 64, 16, generator=g).bfloat16()
    offs = torch.tensor([2, 2, 5], dtype=torch.int32)
    linear, grouped_mm = torch.nn.functional.linear, getattr(torch.nn.functional, "grouped_mm", None)
    with bf16_gemms_round_once():
        assert torch.equal(torch.nn.functional.linear(x, w, b), (x.float() @ w.float().T + b.float()).bfloat16())
        if grouped_mm is not None:
            out = torch.nn.functional.grouped_mm(x, grouped_w, offs=offs)
            expected = torch.cat([x[:2].float() @ grouped_w[0].float(), x[2:].float() @ grouped_w[2].float()])
            assert torch.equal(out, expected.bfloat16())
    assert torch.nn.functional.linear is linear and getattr(torch.nn.functional, "grouped_mm", None) is grouped_mm
