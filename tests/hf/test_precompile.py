"""tilegemm.precompile: the token counts reach every kernel config the chooser gives, and the warm-up forwards are
harmless (CPU: the reference path)."""

from __future__ import annotations

import threading

import pytest
import torch
from hf_models import build, prompt

import tilegemm
from tilegemm import warmup
from tilegemm.heuristics import cutile as heuristics
from tilegemm.heuristics import gluon
from tilegemm.heuristics.cutile import Kind, Problem
from tilegemm.transformers import apply_tilegemm_to_model
from tilegemm.warmup import token_buckets

SMS = 132
MOE_SHAPES = [(8, 128, 2048, 768), (8, 256, 7168, 2048), (2, 8, 4096, 14336), (4, 60, 2048, 1408)]
"""(top_k, experts, H, I): Qwen3-30B-A3B, DeepSeek-V3, Mixtral-8x7B, Qwen1.5-MoE-A2.7B."""


def _configs(tokens: int, top_k: int, experts: int, hidden: int, inter: int) -> tuple:
    """Every config the choice gives the layers of a model for one forward of ``tokens`` tokens: dense GEMMs of every
    width a decoder layer has (attention-sized, the dense MLP's, a vocabulary head), BF16 and FP8, cutile and gluon;
    the fused experts; both grouped GEMMs of the unfused path."""
    slots = tokens * top_k
    dense = [(hidden, hidden), (2 * inter, hidden), (hidden, inter), (151936, hidden)]
    grouped = [(2 * inter, hidden), (hidden, inter)]
    return (
        *(heuristics.choose(Problem("dense", dt, tokens, n, k, SMS)) for n, k in dense for dt in ("bf16", "fp8")),
        *(gluon.dense_fp8_config(tokens, n, k, SMS) for n, k in dense),
        heuristics.choose(Problem("moe", "bf16", slots, hidden, inter, SMS, groups=experts)),
        heuristics.choose(Problem("moe_fp8", "fp8", slots, hidden, inter, SMS, groups=experts)),
        *(heuristics.choose(Problem("grouped", "bf16", slots, n, k, SMS, groups=experts, kind=Kind.PSUM))
          for n, k in grouped),
    )  # fmt: skip


@pytest.mark.parametrize("max_tokens", [1, 7, 300, 4096])
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=["qwen3", "deepseek-v3", "mixtral", "qwen2-moe"])
def test_buckets_reach_every_config_up_to_max_tokens(shape, max_tokens):
    buckets = token_buckets(max_tokens, [shape], sms=SMS)
    assert buckets[0] == 1 and buckets[-1] == max_tokens and buckets == sorted(set(buckets))
    every = {_configs(t, *shape) for t in range(1, max_tokens + 1)}
    reached = {_configs(t, *shape) for t in buckets}
    assert reached == every, f"{len(every - reached)} config sets no bucket reaches"
    assert len(buckets) <= 3 * max_tokens.bit_length() + 3


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        (dict(max_tokens=2.5), TypeError, "max_tokens"),
        (dict(max_tokens=True), TypeError, "max_tokens"),
        (dict(max_tokens=0), ValueError, "max_tokens"),
        (dict(max_tokens=8, moe_shapes=[(8, 0, 64, 64)]), ValueError, "moe_shapes"),
        (dict(max_tokens=8, moe_shapes=[(8, 16)]), ValueError, "moe_shapes"),
    ],
)
def test_token_buckets_bad_input(kwargs, error, name):
    with pytest.raises(error, match=f"^{name}: got"):
        token_buckets(**kwargs)


def test_precompile_runs_every_bucket_then_generate_and_changes_nothing(monkeypatch):
    model = apply_tilegemm_to_model(build("tiny-qwen3-moe", dtype=torch.bfloat16))
    model.train()
    ids = prompt()
    with torch.no_grad():
        before = model.eval()(ids).logits
    model.train()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    seen = []
    forward = type(model).forward

    def spy(self, input_ids=None, **kwargs):
        seen.append((tuple(input_ids.shape), torch.is_grad_enabled(), self.training, kwargs.get("use_cache")))
        return forward(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    torch.manual_seed(5)
    rng = torch.get_rng_state()
    times = tilegemm.precompile(model, max_tokens=40)
    assert torch.equal(torch.get_rng_state(), rng), "the torch random state is restored"
    expected = token_buckets(40, [(2, 8, 64, 32)])
    assert list(times) == expected and all(t >= 0 for t in times.values())
    forwards = [((1, t), False, False, False) for t in expected]
    # generate: an 8-token prefill with a KV cache, then one decode step of one token
    assert seen == [*forwards, ((1, 8), False, False, True), ((1, 1), False, False, True)]
    assert model.training, "the training flag is restored"
    monkeypatch.undo()
    assert all(torch.equal(p, params[name]) for name, p in model.named_parameters())
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, before)


def test_precompile_prompt_lengths_run_one_generate_each(monkeypatch):
    """prompt_lengths= runs the short generate once per distinct length, in ascending order (prefill with a KV
    cache, then one decode step), after the forwards; bad lengths are refused before anything runs."""
    model = apply_tilegemm_to_model(build("tiny-qwen3-moe", dtype=torch.bfloat16))
    seen = []
    forward = type(model).forward

    def spy(self, input_ids=None, **kwargs):
        seen.append((tuple(input_ids.shape), kwargs.get("use_cache")))
        return forward(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    tilegemm.precompile(model, token_counts=[2], prompt_lengths=[12, 5, 12])
    assert seen == [((1, 2), False), ((1, 5), True), ((1, 1), True), ((1, 12), True), ((1, 1), True)]
    seen.clear()
    for bad, error in ((0, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="^prompt_lengths: got"):
            tilegemm.precompile(model, token_counts=[2], prompt_lengths=[4, bad])
    assert seen == []


def test_precompile_threads_run_the_same_forwards(monkeypatch):
    """workers=3: the same forwards as one after another (the smallest count first, alone), on worker threads, each
    count once; generate=False leaves out the generate."""
    model = apply_tilegemm_to_model(build("tiny-qwen3-moe", dtype=torch.bfloat16))
    seen, lock = [], threading.Lock()
    forward = type(model).forward

    def spy(self, input_ids=None, **kwargs):
        with lock:
            seen.append((input_ids.shape[1], threading.current_thread().name, torch.is_grad_enabled()))
        return forward(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    times = tilegemm.precompile(model, max_tokens=40, workers=3, generate=False)
    expected = token_buckets(40, [(2, 8, 64, 32)])
    assert list(times) == expected
    assert seen[0] == (expected[0], threading.current_thread().name, False)
    assert sorted(t for t, _, _ in seen) == expected, "each count once"
    assert {name.startswith("tilegemm-precompile") for _, name, _ in seen[1:]} == {True}
    assert not any(grad for _, _, grad in seen)


def test_precompile_outputs_of_threaded_forwards_equal_serial():
    """run_forwards on threads computes what it computes serially (the forwards share nothing but the model)."""
    model = apply_tilegemm_to_model(build("tiny-qwen3-moe", dtype=torch.float32))
    outputs = {}
    forward = model.forward

    def keep(input_ids=None, **kwargs):
        out = forward(input_ids=input_ids, **kwargs)
        outputs.setdefault(input_ids.shape[1], []).append(out.logits.detach().clone())
        return out

    model.forward = keep
    inputs = {t: torch.randint(0, 256, (1, t), generator=torch.Generator().manual_seed(t)) for t in (1, 5, 9, 17, 33)}
    warmup.run_forwards(model, inputs, torch.device("cpu"), workers=1)
    warmup.run_forwards(model, inputs, torch.device("cpu"), workers=4)
    assert sorted(outputs) == sorted(inputs)
    assert all(len(v) == 2 and torch.equal(v[0], v[1]) for v in outputs.values())


def test_precompile_workers_argument():
    assert warmup.default_workers(torch.device("cpu")) == 1
    assert 1 <= warmup.default_workers(torch.device("cuda")) <= 8
    model = apply_tilegemm_to_model(build("tiny-qwen3-moe", dtype=torch.bfloat16))
    for bad, error in ((0, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="^workers: got"):
            tilegemm.precompile(model, token_counts=[1], workers=bad)


def test_precompile_explicit_counts_and_fp8_cache():
    """token_counts= replaces the buckets; an FP8 model leaves the warm-up with its weight blocks quantized."""
    model = apply_tilegemm_to_model(build("tiny-mixtral", dtype=torch.bfloat16), fp8=True)
    assert list(tilegemm.precompile(model, token_counts=[3, 1, 3])) == [1, 3]
    from tilegemm.transformers.monkey_patch import experts_modules

    assert all("_tilegemm_fp8_blocks" in m.gate_up_proj.__dict__ for m in experts_modules(model))
    with pytest.raises(TypeError, match="^token_counts: got float"):
        tilegemm.precompile(model, token_counts=[1.5])
    with pytest.raises(ValueError, match="^vocab_size: got 0"):
        tilegemm.precompile(model, token_counts=[1], vocab_size=0)
