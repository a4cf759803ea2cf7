"""The ``models`` family without a GPU: its rows, its work counts, the static-cache decode step, registration.
(Its whole row on the CPU is in test_cpu_rows.py.)"""

from __future__ import annotations

import pytest
import torch

from tilegemm.bench import core, device, models, runner, schema, timing
from tilegemm.bench.__main__ import main
from tilegemm.transformers.presets import PRESETS

TINY_DECODE = {"dtype": "bf16", "model": "tiny-mixtral", "layers": 2, "phase": "decode", "batch": 1, "prompt": 8}


def test_quick_is_one_decode_step_and_full_every_model_batch_and_phase():
    quick, full = models.specs("quick"), models.specs("full")
    assert quick == [
        {"dtype": "bf16", "model": "qwen3-30b-a3b", "layers": 4, "phase": "decode", "batch": 1, "prompt": 512}
    ]
    expected = {
        (m, b, p)
        for m in ("qwen3-30b-a3b", "deepseek-v3", "deepseek-v3.2")
        for b in (1, 32)
        for p in ("prefill", "decode")
    }
    assert {(s["model"], s["batch"], s["phase"]) for s in full} == expected and len(full) == len(expected)
    assert all(not PRESETS[s["model"]].tiny for s in full)


def test_work_of_a_tiny_mixtral_decode_step():
    # tiny-mixtral: H=64, 4 heads of 16 (2 for k/v), 4 experts of I=128 top-2, vocab 256, 2 layers.
    attention = 64 * 64 + 2 * 64 * 32 + 64 * 64
    per_layer = attention + 4 * 64 + 2 * 64  # + router + two norms
    dense = 2 * per_layer + 64  # + final norm
    head = 256 * 64
    expert = 3 * 128 * 64
    case = models.case(TINY_DECODE)
    assert case.flops == 2 * (dense + head) + 2 * 2 * (2 * expert)
    assert case.bytes == 2 * (dense + head) + 2 * 2 * (2 * expert)  # batch 1: exactly top-k experts, bf16
    assert case.op == "decode" and case.shape == {"model": "tiny-mixtral", "layers": 2, "batch": 1, "prompt": 8}


def test_work_grows_with_tokens_and_saturates_at_every_expert():
    step = models.case({**TINY_DECODE, "batch": 1})
    big = models.case({**TINY_DECODE, "batch": 4096})
    prefill = models.case({**TINY_DECODE, "phase": "prefill", "batch": 2, "prompt": 8})
    assert step.bytes < big.bytes <= step.bytes + 2 * 2 * (2 * 3 * 128 * 64)  # at most the other 2 experts
    assert prefill.flops == pytest.approx(models.case({**TINY_DECODE, "batch": 16}).flops - 2 * 14 * 256 * 64)


def test_without_transformers_the_row_says_so(monkeypatch):
    from tilegemm.transformers import compat

    def missing():
        raise compat.UnsupportedTransformersError("transformers is not installed")

    monkeypatch.setattr(compat, "transformers_version", missing)
    case = models.case(TINY_DECODE)
    assert case.flops == 0.0
    row = core.measure_case(case, {})
    assert "transformers is not installed" in row["error"] and schema.validate_row(row) == []


def test_decode_step_repeats_and_greedy_matches_generate(monkeypatch):
    monkeypatch.setattr(timing, "DEVICE", "cpu")
    model = models.build_model({**TINY_DECODE, "model": "tiny-qwen3-moe"}, "cpu", seed=0).float()
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    decode = models.StaticDecode(model, prompt, 6)
    tokens = decode.greedy(6)
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(tokens, expected[:, 7:])
    decode.prefill()
    first = decode.step(tokens[:, :1], 7)
    assert torch.equal(decode.step(tokens[:, :1], 7), first)  # the write position is rewound every step
    counters = [getattr(layer, "cumulative_length", None) for layer in decode.cache.layers]
    assert all(c is None or int(c) == 8 for c in counters)  # transformers versions with a write counter


def test_models_is_a_registered_family_with_a_budget_share(capsys):
    assert runner.FAMILIES["models"] == "models"
    assert set(runner.BUDGET_SHARE) == set(runner.FAMILIES)
    assert sum(runner.BUDGET_SHARE.values()) == pytest.approx(1.0)
    assert main(["--list", "--full", "--family", "models"]) == 0
    assert "models: 12 rows" in capsys.readouterr().out


def test_no_gpu_message_for_the_models_family(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_gpu", lambda: False)
    assert main(["--quick", "--family", "models"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
