"""transformers-native use: importing tilegemm.transformers registers the experts functions, and
``apply_tilegemm_to_model`` takes any model with transformers' fused experts (OLMoE, gpt-oss), not only the
families table's."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hf_models import OTHER_FUSED, build, prompt

from tilegemm.testing import calc_diff
from tilegemm.transformers import (
    EXPERTS_NAME,
    FP8_EXPERTS_NAME,
    TileGemmLinear,
    apply_tilegemm_to_model,
    experts,
    revert_tilegemm_model,
    swapped_rms_norms,
)
from tilegemm.transformers.monkey_patch import experts_modules


def test_import_registers_both_experts_functions_in_a_fresh_process():
    """No register_experts_functions() call: ``import tilegemm.transformers`` is enough for
    ``from_config(..., experts_implementation="tilegemm")`` and ``set_experts_implementation("tilegemm_fp8")``."""
    script = """
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.moe import ExpertsInterface
import tilegemm.transformers
from tilegemm.transformers.presets import PRESETS

print(sorted(n for n in ExpertsInterface._global_mapping if n.startswith("tilegemm")))
model = AutoModelForCausalLM.from_config(PRESETS["tiny-qwen3-moe"].config(), experts_implementation="tilegemm")
print(model.config._experts_implementation)
model.set_experts_implementation("tilegemm_fp8")
with torch.no_grad():
    assert torch.isfinite(model(torch.randint(0, 256, (1, 5))).logits).all()
print(model.config._experts_implementation)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["['tilegemm',", "'tilegemm_fp8']", EXPERTS_NAME, FP8_EXPERTS_NAME]


def test_import_pulls_no_transformers_module_and_registers_when_transformers_imports_its_moe():
    """``import tilegemm.transformers`` imports no transformers module (transformers.integrations.moe imports its
    DeepGEMM and hub-kernels integrations: about a second); the experts functions are registered when that module is
    imported (transformers imports it before any model can ask for them), and fused_activation gets it."""
    script = """
import sys
import tilegemm.transformers
from tilegemm.transformers import experts

pulled = sorted(m for m in sys.modules if m.split(".")[0] == "transformers")
assert not pulled, pulled
assert experts._hf_moe is None
from transformers.integrations.moe import ExpertsInterface

assert experts._hf_moe is sys.modules["transformers.integrations.moe"]
print(sorted(n for n in ExpertsInterface._global_mapping if n.startswith("tilegemm")))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["['tilegemm',", "'tilegemm_fp8']"]


@pytest.mark.parametrize("family", sorted(OTHER_FUSED))
def test_model_outside_the_families_table_runs_tilegemm_experts(family, monkeypatch):
    """fp32: the patched model equals stock to fp32 rounding (the unfused path computes the module's own activation,
    biases and interleaved gate); every experts call went through tilegemm; the norms stay stock."""
    model = build(family)
    for p in model.parameters():  # larger than the default init, so the experts move the logits
        torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(p.numel()))
    ids = prompt()
    with torch.no_grad():
        stock = model(ids).logits
    calls = []
    unfused = experts.unfused_experts_forward
    monkeypatch.setattr(experts, "unfused_experts_forward", lambda m, h, *a: calls.append(len(h)) or unfused(m, h, *a))
    apply_tilegemm_to_model(model, linear=True)
    assert model.config._experts_implementation == EXPERTS_NAME
    assert all(m._tilegemm_backend is None for m in experts_modules(model))
    assert not swapped_rms_norms(model), "no norm class is known for this family"
    assert isinstance(model.lm_head, TileGemmLinear)
    with torch.no_grad():
        patched = model(ids).logits
    assert len(calls) == model.config.num_hidden_layers
    assert calc_diff(patched, stock) < 1e-10
    assert (patched - stock).abs().max() <= 1e-5 * stock.abs().max()
    revert_tilegemm_model(model)
    assert model.config._experts_implementation == "grouped_mm"


def test_olmoe_bf16_runs_the_fused_op(monkeypatch):
    """OLMoE's experts are the plain gated form: bf16 inference runs tilegemm.moe_experts."""
    from tilegemm import custom_ops

    model = apply_tilegemm_to_model(build("tiny-olmoe", dtype=torch.bfloat16))
    calls = []
    fused = custom_ops.api.moe_experts
    monkeypatch.setattr(custom_ops.api, "moe_experts", lambda h, *a, **kw: calls.append(len(h)) or fused(h, *a, **kw))
    ids = prompt()
    with torch.no_grad():
        out = model(ids).logits
    assert len(calls) == 2 and torch.isfinite(out).all()
