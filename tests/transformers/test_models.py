"""Whole tiny models of every supported family: patched logits and greedy generations match stock (CPU)."""

from __future__ import annotations

import pytest
import torch
from hf_models import FAMILIES, assert_within_one_bf16_step, bf16_gemms_round_once, build, compare_with_flips, prompt

from modeling.transformers import measure
from tilegemm.testing import calc_diff
from tilegemm.transformers import apply_tilegemm_to_model, experts, revert_tilegemm_model


def teacher_forced(model, ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 logits [B, N, V] that predicted each of the ``N`` greedy ``tokens`` after ``ids`` (one forward)."""
    n = tokens.shape[1]
    return measure.teacher_forced_logits(model, torch.cat([ids, tokens], dim=1), n + 1)[:, :n]


def assert_greedy_agrees(tokens, stock_tokens, stock_logits, patched_logits) -> None:
    """Greedy tokens equal, or their first divergence is a near-tie: there, the stock logit gap between the two
    tokens is within the largest teacher-forced logit difference, patched against stock (same prefixes)."""
    if torch.equal(tokens, stock_tokens):
        return
    b, p = (tokens != stock_tokens).nonzero()[0].tolist()
    gap = stock_logits[b, p, stock_tokens[b, p]] - stock_logits[b, p, tokens[b, p]]
    assert patched_logits[b, p].argmax() == tokens[b, p]
    assert gap <= (patched_logits - stock_logits).abs().max(), f"greedy tokens diverge at step {p}, gap {gap:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_matches_stock(family, dtype):
    """fp32: the unfused experts path, to 1e-5 and the same greedy tokens, with no routing or indexer flip. bf16:
    the fused experts op, which rounds less often than transformers' path, so logits move by bf16 steps:
    teacher-forced ``calc_diff`` < 1e-5 on the positions downstream of no flip (a near-tie expert or key swapped by
    that rounding, ``hf_models.compare_with_flips``), and greedy tokens equal or diverging only at a near-tie. Stock's
    bf16 GEMMs round once (``bf16_gemms_round_once``), as on CPUs with bf16 dot instructions."""
    model = build(family, dtype=dtype)
    ids = prompt()
    with torch.no_grad(), bf16_gemms_round_once():
        stock_tokens = measure.generate_greedy(model, ids, 5).tokens
        stock_forced = teacher_forced(model, ids, stock_tokens)
        seen = compare_with_flips(model, ids, lambda: apply_tilegemm_to_model(model, linear=True))
        assert model.config._experts_implementation == "tilegemm"
        tokens = measure.generate_greedy(model, ids, 5).tokens
        patched_forced = teacher_forced(model, ids, stock_tokens)
    out, ref = seen.patched, seen.stock
    if dtype == torch.float32:
        assert seen.flips == 0
        assert calc_diff(out, ref) < 1e-5
        assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()
        assert torch.equal(tokens, stock_tokens)
    assert seen.clean[:, 0].all(), seen.describe()  # the first position of each sequence sees no other
    assert calc_diff(out[seen.clean], ref[seen.clean]) < 1e-5, seen.describe()
    assert_greedy_agrees(tokens, stock_tokens, stock_forced, patched_forced)
    revert_tilegemm_model(model)
    assert model.config._experts_implementation == "grouped_mm"


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_unfused_matches_stock_within_one_step(family, monkeypatch):
    """The unfused experts path keeps transformers' rounding sequence: bf16 logits within one bf16 step of stock's on
    every position downstream of no routing or indexer flip (``hf_models.compare_with_flips``), stock's GEMMs
    rounding once on any CPU (``bf16_gemms_round_once``)."""
    monkeypatch.setattr(experts, "fused_activation", lambda module, hidden_states: None)
    model = build(family, dtype=torch.bfloat16)
    ids = prompt()
    with torch.no_grad(), bf16_gemms_round_once():
        seen = compare_with_flips(model, ids, lambda: apply_tilegemm_to_model(model, linear=True))
    assert seen.clean[:, 0].all(), seen.describe()
    assert_within_one_bf16_step(seen.patched[seen.clean], seen.stock[seen.clean])


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
