"""Tiny random models of the supported families, and the accuracy helpers of tests/transformers."""

from __future__ import annotations

import functools

import torch

from tilegemm.transformers import presets
from tilegemm.transformers.families import FAMILIES as MODEL_FAMILIES

FAMILIES: tuple[str, ...] = tuple(presets.TINY_BY_MODEL_TYPE.get(f.model_type, f.model_type) for f in MODEL_FAMILIES)
"""The tiny preset of every family of ``tilegemm.transformers.families.FAMILIES`` (the model_type if it has none,
so that tests fail for a family without a preset)."""


_OTHER_COMMON = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
)  # fmt: skip

OTHER_FUSED: dict[str, dict] = {
    "tiny-olmoe": dict(_OTHER_COMMON, model_type="olmoe", num_experts=8, num_experts_per_tok=2),
    "tiny-gpt-oss": dict(
        _OTHER_COMMON,
        model_type="gpt_oss",
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
        layer_types=["full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),  # fmt: skip
}
"""Tiny configs of transformers families with fused experts that the families table does not list (no norm swap,
no before-creation patcher): ``apply_tilegemm_to_model`` takes them through the experts registry. gpt-oss has
biases, interleaved gate/up rows, transposed weights and a clamped SwiGLU: the unfused path."""


def build(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0, **overrides):
    """A tiny random-weight causal LM of preset ``name`` (or of :data:`OTHER_FUSED`) in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if name in OTHER_FUSED:
        kwargs = dict(OTHER_FUSED[name])
        config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    else:
        config = presets.PRESETS[name].config()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def prompt(batch: int = 2, length: int = 12, vocab: int = 256, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    """Random token ids ``[batch, length]``."""
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(device)


def bf16_step(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``|x|`` (8 significant bits), elementwise, as fp32."""
    mag = x.float().abs().clamp(min=torch.finfo(torch.bfloat16).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


@functools.cache
def cpu_bf16_linear_rounds_once() -> bool:
    """True when this CPU's stock bf16 ``F.linear`` equals the fp32 product rounded once to bf16 (what the
    tilegemm reference backend computes), on the tiny models' sizes and on a transposed 3-D input (attention's
    output). Tests that demand stock's bf16 rounding sequence bit for bit hold only then: on some x86 CPUs
    (AVX2 only, no bf16 dot instructions) torch's kernels round partial sums on the way."""
    g = torch.Generator().manual_seed(0)
    for m, k, n in ((24, 64, 256), (24, 128, 64), (24, 256, 128)):
        x = torch.randn(2, k, m // 2, generator=g).bfloat16().transpose(1, 2)  # a non-contiguous [2, m/2, k] view
        w = torch.randn(n, k, generator=g).bfloat16()
        once = (x.float() @ w.float().t()).bfloat16()
        if not torch.equal(torch.nn.functional.linear(x, w), once):
            return False
    return True


def require_bf16_linear_rounds_once() -> None:
    """Skip a test that compares bf16 results with stock's bit for bit where this CPU's stock GEMMs do not round
    once (see :func:`cpu_bf16_linear_rounds_once`): there the bar would measure the CPU, not the patch."""
    import pytest

    if not cpu_bf16_linear_rounds_once():
        pytest.skip("this CPU's stock bf16 F.linear rounds partial sums (not the fp32 product rounded once)")


def assert_within_one_bf16_step(test: torch.Tensor, ref: torch.Tensor) -> None:
    """Every element of ``test`` is ``ref`` or a bf16 neighbour of it."""
    diff = (test.float() - ref.float()).abs()
    bound = torch.maximum(bf16_step(test), bf16_step(ref))
    worst = (diff / bound).max().item()
    assert worst <= 1.0, f"max |test - ref| is {worst:.2f} bf16 steps (bar: 1)"


def assert_max_abs_within_one_bf16_step(test: torch.Tensor, ref: torch.Tensor) -> None:
    """``max |test - ref|`` is at most one bf16 step at the tensor's largest magnitude.

    For chains whose two sides round the same steps but accumulate GEMMs in different orders (cutile vs
    cuBLAS): a one-ulp change of an intermediate moves a result by a fraction of its *terms'* bf16 step, which
    exceeds the step of a result that cancels to near zero, so the elementwise bar does not apply there.
    """
    diff = (test.float() - ref.float()).abs().max()
    bound = bf16_step(torch.maximum(test.float().abs().max(), ref.float().abs().max()))
    assert diff <= bound, f"max |test - ref| = {diff.item():.3e} > one bf16 step at max |ref| ({bound.item():.3e})"


def reference_experts(module, x, index, weights) -> torch.Tensor:
    """float64 ``sum_j w[t,j] * down[e] @ act(gate_up[e] @ x[t])``; ids outside [0, E) contribute nothing."""
    x64 = x.double()
    out = torch.zeros_like(x64)
    w_up = module.gate_up_proj.double()
    w_down = module.down_proj.double()
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            if not 0 <= e < module.num_experts:
                continue
            gate, up = (w_up[e] @ x64[t]).chunk(2)
            h = module.act_fn(gate) * up
            out[t] += float(weights[t, j]) * (w_down[e] @ h)
    return out


def routing(module, tokens: int, top_k: int = 2, seed: int = 0, weight_dtype=torch.float32):
    """Random distinct top-k expert ids and positive weights for ``tokens`` tokens."""
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(module.num_experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g).to(weight_dtype)
    return index, weights
