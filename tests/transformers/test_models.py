"""Whole tiny models of every supported family: patched logits and greedy generations match stock (CPU)."""

from __future__ import annotations

import pytest
import torch
from hf_models import FAMILIES, assert_within_one_bf16_step, build, prompt

from modeling.transformers import measure
from tilegemm.testing import calc_diff
from tilegemm.transformers import apply_tilegemm_to_model, revert_tilegemm_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_matches_stock(family, dtype):
    model = build(family, dtype=dtype)
    ids = prompt()
    with torch.no_grad():
        ref = model(ids).logits.float()
        stock_tokens = measure.generate_greedy(model, ids, 5).tokens
        apply_tilegemm_to_model(model, linear=True)
        assert model.config._experts_implementation == "tilegemm"
        out = model(ids).logits.float()
        tokens = measure.generate_greedy(model, ids, 5).tokens
    if dtype == torch.float32:
        assert calc_diff(out, ref) < 1e-5
        assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()
    else:
        assert_within_one_bf16_step(out, ref)
    assert torch.equal(tokens, stock_tokens)
    revert_tilegemm_model(model)
    assert model.config._experts_implementation == "grouped_mm"


@pytest.mark.parametrize("family", ["tiny-deepseek-v3", "tiny-qwen3-moe"])
def test_static_cache_loop_matches_generate(family):
    """The decode loop of ``infer.py --cuda-graphs`` (here without a graph) is plain greedy decoding."""
    model = build(family)
    ids = prompt(batch=2, length=7)
    apply_tilegemm_to_model(model)
    expected = measure.generate_greedy(model, ids, 6).tokens
    result = measure.static_greedy(model, ids, 6, cuda_graph=False)
    assert torch.equal(result.tokens, expected)
    assert result.steps == 5 and result.tokens_per_second() > 0


def test_fp8_model_teacher_forced():
    model = build("tiny-deepseek-v3", dtype=torch.bfloat16)
    ids = prompt(length=16)
    ref = measure.teacher_forced_logits(model, ids, 16)
    apply_tilegemm_to_model(model, fp8=True)
    assert model.config._experts_implementation == "tilegemm_fp8"
    stats = measure.compare_logits(measure.teacher_forced_logits(model, ids, 16), ref)
    assert stats["calc_diff"] < 1e-2  # the bar for FP8 experts vs bf16 stock logits
