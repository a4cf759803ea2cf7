"""Patchers: before-creation family patchers, the model_type map, and their errors."""

from __future__ import annotations

import inspect

import pytest
import torch
from hf_models import FAMILIES, build, prompt

import tilegemm.transformers.compat as compat
from tilegemm.transformers import (
    TileGemmLinear,
    UnsupportedTransformersError,
    apply_tilegemm_kernel_to_model_type,
    apply_tilegemm_kernel_to_qwen3_moe,
    apply_tilegemm_to_model,
    revert_tilegemm_kernel_patches,
)
from tilegemm.transformers.monkey_patch import experts_modules
from tilegemm.transformers.presets import PRESETS


@pytest.mark.parametrize("family", FAMILIES)
def test_before_creation_patch(family, restore_patches):
    model_type = PRESETS[family].model_type
    apply_tilegemm_kernel_to_model_type(model_type, linear=True, fp8=True)
    model = build(family)
    assert model.config._experts_implementation == "tilegemm_fp8"
    assert isinstance(model.lm_head, TileGemmLinear) and model.lm_head._tilegemm_fp8
    with torch.no_grad():
        assert torch.isfinite(model(prompt()).logits).all()
    assert revert_tilegemm_kernel_patches() == 1
    assert build(family).config._experts_implementation == "grouped_mm"


@pytest.mark.parametrize("explicit", ["grouped_mm", "batched_mm", "eager", "tilegemm"])
def test_before_creation_patch_keeps_an_explicit_experts_implementation(explicit, restore_patches, tmp_path):
    """The family patcher changes the default; ``experts_implementation=`` passed by the user wins."""
    from transformers import AutoModelForCausalLM

    apply_tilegemm_kernel_to_qwen3_moe(fp8=True)
    config = PRESETS["tiny-qwen3-moe"].config()
    model = AutoModelForCausalLM.from_config(config, experts_implementation=explicit)
    assert model.config._experts_implementation == explicit
    backends = {getattr(m, "_tilegemm_backend", "unset") for m in experts_modules(model)}
    assert backends == ({None} if explicit == "tilegemm" else {"unset"})
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation=explicit)
    assert loaded.config._experts_implementation == explicit
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._experts_implementation == "tilegemm_fp8"
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_before_creation_patch_only_touches_its_family(restore_patches):
    apply_tilegemm_kernel_to_qwen3_moe()
    assert build("tiny-qwen3-moe").config._experts_implementation == "tilegemm"
    assert build("tiny-mixtral").config._experts_implementation == "grouped_mm"


def test_unsupported_model_type():
    from transformers import AutoModelForCausalLM, LlamaConfig

    llama = AutoModelForCausalLM.from_config(
        LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(ValueError, match="model_type 'llama'.* has no fused experts module"):
        apply_tilegemm_to_model(llama)
    with pytest.raises(ValueError, match="model_type 'llama' is not supported; supported: deepseek_v2"):
        apply_tilegemm_to_model(llama, experts=False)
    with pytest.raises(ValueError, match="not supported"):
        apply_tilegemm_kernel_to_model_type("gpt2")


def test_model_without_experts():
    model = build("tiny-deepseek-v3", first_k_dense_replace=3)  # every layer dense
    with pytest.raises(ValueError, match="no fused experts module"):
        apply_tilegemm_to_model(model)
    apply_tilegemm_to_model(model, experts=False, linear=True)  # the linear swap alone is fine
    assert isinstance(model.lm_head, TileGemmLinear)


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend"):
        apply_tilegemm_to_model(build("tiny-mixtral"), backend="triton")


def test_old_transformers_rejected(monkeypatch):
    import transformers

    major, minor = compat.MIN_TRANSFORMERS
    monkeypatch.setattr(transformers, "__version__", f"{major}.{minor - 1}.2")
    compat.transformers_version.cache_clear()
    try:
        with pytest.raises(
            UnsupportedTransformersError,
            match=rf"needs transformers >= {major}\.{minor}.*found {major}\.{minor - 1}\.2",
        ):
            apply_tilegemm_to_model(build("tiny-mixtral"))
        with pytest.raises(UnsupportedTransformersError):
            apply_tilegemm_kernel_to_qwen3_moe()
    finally:
        compat.transformers_version.cache_clear()


def test_cache_kwargs_follows_the_forward_signature():
    """``cache`` where the forward takes it (transformers >= 5.24), else ``past_key_values``; with the installed
    transformers, the keyword names a parameter of every family's causal-LM forward."""
    new, old = torch.nn.Module(), torch.nn.Module()
    new.forward = lambda input_ids=None, cache=None, use_cache=None: None
    old.forward = lambda input_ids=None, past_key_values=None, use_cache=None: None
    marker = object()
    assert compat.cache_kwargs(new, marker) == {"cache": marker}
    assert compat.cache_kwargs(old, marker) == {"past_key_values": marker}
    for family in FAMILIES:
        model = build(family)
        (key,) = compat.cache_kwargs(model, marker)
        assert key in inspect.signature(model.forward).parameters, (family, key)
