"""FP8 experts: accuracy against the unquantized math and the exact dequantized formula; the weight cache."""

from __future__ import annotations

import torch
from hf_models import build, reference_experts, routing

from tilegemm.fp8_weights import weight_fp8_blocks
from tilegemm.quant import per_token_cast_to_fp8
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token
from tilegemm.transformers import clear_fp8_cache, tilegemm_fp8_experts_forward
from tilegemm.transformers.monkey_patch import experts_modules


def dequantized_formula(module, x, index, weights) -> torch.Tensor:
    """The FP8 path's math in float64 on the dequantized operands, with its fp32 roundings in between."""
    w_up = dequant_per_block(*weight_fp8_blocks(module.gate_up_proj))
    w_down = dequant_per_block(*weight_fp8_blocks(module.down_proj))
    xq = dequant_per_token(*per_token_cast_to_fp8(x))
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            gate_up = (w_up[e] @ xq[t]).float()  # the op writes fp32 for an fp32 model
            h = module._apply_gate(gate_up[None])  # fp32 activation
            hq = dequant_per_token(*per_token_cast_to_fp8(h))[0]
            out[t] += float(weights[t, j]) * (w_down[e] @ hq).float().double()
    return out


def _module():
    # K = 64 / 32 and N = 64 / 64: partial 128-blocks on every axis of the tiny model.
    return experts_modules(build("tiny-qwen3-moe"))[0]


# Against the unquantized math the bar is the FP8-experts bar (1e-2): the experts chain two FP8
# GEMMs and quantize four operands (x, W_up, h, W_down), about twice one FP8 GEMM's ~7e-4 on random data.
# The exact formula on the dequantized operands is what tests the implementation (1e-6, fp32 out).
FP8_EXPERTS_BAR = 1e-2


def test_fp8_experts_accuracy():
    module = _module()
    x = torch.randn(17, module.hidden_dim)
    index, weights = routing(module, 17)
    with torch.no_grad():
        out = tilegemm_fp8_experts_forward(module, x, index, weights)
    assert out.dtype == torch.float32
    assert calc_diff(out, reference_experts(module, x, index, weights)) < FP8_EXPERTS_BAR
    assert calc_diff(out, dequantized_formula(module, x, index, weights)) < 1e-6


def test_fp8_bf16_model_output_dtype_and_accuracy():
    module = experts_modules(build("tiny-mixtral", dtype=torch.bfloat16))[0]
    x = torch.randn(9, module.hidden_dim).bfloat16()
    index, weights = routing(module, 9)
    with torch.no_grad():
        out = tilegemm_fp8_experts_forward(module, x, index, weights)
    assert out.dtype == torch.bfloat16
    assert calc_diff(out, reference_experts(module, x, index, weights)) < FP8_EXPERTS_BAR


def test_weight_cache_reused_and_invalidated():
    module = _module()
    x = torch.randn(6, module.hidden_dim)
    index, weights = routing(module, 6)
    with torch.no_grad():
        first = tilegemm_fp8_experts_forward(module, x, index, weights)
        cached = weight_fp8_blocks(module.gate_up_proj)
        tilegemm_fp8_experts_forward(module, x, index, weights)
        assert weight_fp8_blocks(module.gate_up_proj) is cached, "second call must reuse the quantized weight"

        module.gate_up_proj.mul_(-1)  # in place: bumps the version counter
        flipped = tilegemm_fp8_experts_forward(module, x, index, weights)
        assert weight_fp8_blocks(module.gate_up_proj) is not cached
        assert calc_diff(flipped, reference_experts(module, x, index, weights)) < FP8_EXPERTS_BAR
        assert calc_diff(flipped, first) > 1e-2

        module.down_proj.data = module.down_proj.data * 2  # new storage
        doubled = tilegemm_fp8_experts_forward(module, x, index, weights)
        assert calc_diff(doubled, 2 * flipped) < 1e-6

    assert clear_fp8_cache(module) == 1
    assert not any("_tilegemm_fp8_blocks" in p.__dict__ for p in module.parameters())
    assert not any("fp8" in k for k in module.state_dict())


def test_fp8_inference_on_the_plain_gated_form_runs_the_fused_op():
    """A bf16 experts module with H and I multiples of 128 runs ``tilegemm.fp8_moe_experts`` on its cached FP8
    weights (bitwise the op's result); with I = 64 it keeps the unfused FP8 path, which rounds h to bf16 first."""
    import tilegemm
    from tilegemm.bench.moe import experts_module

    g = torch.Generator().manual_seed(0)
    for inter, fused in ((128, True), (64, False)):
        w13 = (torch.randn(4, 2 * inter, 256, generator=g) / 16).bfloat16()
        w2 = (torch.randn(4, 256, inter, generator=g) / 8).bfloat16()
        module = experts_module("qwen3_moe", w13, w2)
        x = torch.randn(6, 256, generator=g).bfloat16()
        index = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(6)])
        weights = torch.softmax(torch.randn(6, 2, generator=g), dim=-1)
        with torch.no_grad():
            out = tilegemm_fp8_experts_forward(module, x, index, weights)
        w_up, w_down = weight_fp8_blocks(module.gate_up_proj), weight_fp8_blocks(module.down_proj)
        if fused:
            assert torch.equal(out, tilegemm.fp8_moe_experts(x, index, weights, w_up, w_down, backend="pytorch"))
        else:
            assert calc_diff(out, reference_experts(module, x, index, weights)) < FP8_EXPERTS_BAR
