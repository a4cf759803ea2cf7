"""The RMSNorm swap: the families table holds each family's stock RMSNorm, the swap keeps parameters and
state_dict, patched models give the stock logits (bit for bit on the pytorch backend) and train."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch
from hf_models import FAMILIES, build, prompt

from tilegemm.testing import calc_diff
from tilegemm.transformers import (
    FAMILIES as MODEL_FAMILIES,
)
from tilegemm.transformers import (
    apply_tilegemm_kernel_to_model_type,
    apply_tilegemm_to_model,
    restore_rms_norms,
    revert_tilegemm_kernel_patches,
    revert_tilegemm_model,
    swap_rms_norms,
)
from tilegemm.transformers.norm import swapped_rms_norms, tilegemm_rms_norm_class
from tilegemm.transformers.presets import PRESETS

# The forward of transformers' LlamaRMSNorm: what tilegemm.rms_norm computes. A family whose RMSNorm reads
# otherwise must not be swapped (its row in families.py goes, or the op learns the new formula).
STOCK_FORWARD = """
input_dtype = hidden_states.dtype
hidden_states = hidden_states.to(torch.float32)
variance = hidden_states.pow(2).mean(-1, keepdim=True)
hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
return self.weight * hidden_states.to(input_dtype)
"""


def _body(fn) -> str:
    source = textwrap.dedent(inspect.getsource(fn))
    lines = [line.strip() for line in source.splitlines()[1:] if line.strip() and not line.strip().startswith("#")]
    return "\n".join(lines)


@pytest.mark.parametrize("family", MODEL_FAMILIES, ids=lambda f: f.model_type)
def test_family_rms_norm_is_the_stock_formula(family):
    cls = family.load_rms_norm_class()
    assert _body(cls.forward) == STOCK_FORWARD.strip()
    module = cls(24, eps=1e-5)
    assert module.weight.shape == (24,) and module.variance_epsilon == 1e-5


def _norms(model) -> list[str]:
    return [name for name, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")]


def test_swap_keeps_parameters_state_dict_and_restores():
    model = build("tiny-qwen3-moe")
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    norms = _norms(model)
    layers = model.config.num_hidden_layers
    names = swap_rms_norms(model)
    # input + post-attention + q_norm + k_norm per layer, and the final norm
    assert sorted(names) == sorted(norms) and len(names) == 4 * layers + 1
    assert "model.layers.0.self_attn.q_norm" in names
    stock = type(model.model.norm).__mro__[1]
    assert type(model.model.norm) is tilegemm_rms_norm_class(stock)
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert swap_rms_norms(model, backend="pytorch") == names  # again: new settings, same modules
    assert model.model.norm._tilegemm_backend == "pytorch"
    assert restore_rms_norms(model) == len(names)
    assert type(model.model.norm) is stock and "_tilegemm_backend" not in vars(model.model.norm)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_patched_norms_give_the_stock_logits(family, dtype):
    """On the CPU (pytorch backend) the swapped norms run the stock module's torch ops: identical logits."""
    model = build(family, dtype=dtype)
    ids = prompt()
    with torch.no_grad():
        ref = model(ids).logits
        apply_tilegemm_to_model(model, experts=False)
        assert len(_norms(model)) == len(swapped_rms_norms(model))
        out = model(ids).logits
    assert torch.equal(out, ref)
    revert_tilegemm_model(model)
    assert not swapped_rms_norms(model)


def test_norm_switch_off_leaves_the_norms_stock():
    model = build("tiny-mixtral")
    apply_tilegemm_to_model(model, norm=False)
    assert not swapped_rms_norms(model)
    assert model.config._experts_implementation == "tilegemm"


@pytest.mark.parametrize("norm", [True, False])
def test_family_patcher_swaps_the_norms(norm, restore_patches):
    apply_tilegemm_kernel_to_model_type(PRESETS["tiny-deepseek-v3"].model_type, norm=norm)
    model = build("tiny-deepseek-v3")
    swapped = swapped_rms_norms(model)
    assert len(swapped) == (len(_norms(model)) if norm else 0)
    assert not norm or "model.layers.0.self_attn.kv_a_layernorm" in dict(model.named_modules())
    assert revert_tilegemm_kernel_patches() == 1


def test_patched_norms_train_like_stock():
    """fp32 model, the whole forward + backward: the norm weights' gradients match stock autograd's."""
    ids = prompt()
    grads = []
    for patch in (False, True):
        model = build("tiny-qwen3-moe")
        if patch:
            swap_rms_norms(model)
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if "norm" in n})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        assert calc_diff(grads[1][name], grads[0][name]) < 1e-10, name
