"""Save / load round trip of a patched model: per-expert checkpoint keys, same logits after reloading."""

from __future__ import annotations

import os

import pytest
import torch
from hf_models import build, prompt
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from tilegemm.transformers import TileGemmLinear, apply_tilegemm_to_model, register_experts_functions


@pytest.mark.parametrize(
    ("family", "expert_key"),
    [
        ("tiny-qwen3-moe", "model.layers.0.mlp.experts.3.gate_proj.weight"),
        ("tiny-deepseek-v3", "model.layers.1.mlp.experts.7.down_proj.weight"),
        ("tiny-mixtral", "model.layers.1.block_sparse_moe.experts.2.w1.weight"),
    ],
)
def test_round_trip(tmp_path, family, expert_key):
    model = build(family)
    apply_tilegemm_to_model(model, linear=True)
    ids = prompt()
    with torch.no_grad():
        before = model(ids).logits
    model.save_pretrained(tmp_path)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    keys = set()
    for name in files:
        with safe_open(os.path.join(tmp_path, name), "pt") as f:
            keys |= set(f.keys())
    assert expert_key in keys, "checkpoints keep the per-expert layout"
    assert not any("gate_up_proj" in k or "fp8" in k for k in keys)

    register_experts_functions()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, experts_implementation="tilegemm")
    assert loaded.config._experts_implementation == "tilegemm"
    apply_tilegemm_to_model(loaded.eval(), linear=True)
    assert isinstance(loaded.lm_head, TileGemmLinear)
    with torch.no_grad():
        after = loaded(ids).logits
    assert torch.equal(before, after)
