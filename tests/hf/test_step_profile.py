"""``modeling/transformers/step_profile.py`` on the CPU: rows and JSON, the experts ablation, the decode step."""

from __future__ import annotations

import json

import torch

from modeling.transformers import step_profile
from tilegemm.transformers import presets


def test_cpu_rows_and_json(tmp_path, capsys):
    out = tmp_path / "step.json"
    args = ["--model", "tiny-mixtral", "--batch-size", "2", "--prompt-tokens", "6", "--out", str(out)]
    assert step_profile.main(args) == 0
    report = json.loads(out.read_text())
    assert report["meta"]["layout"] == "1dev" and report["meta"]["layers"] == 2
    assert [r["impl"] for r in report["rows"]] == ["stock", "experts", "patched"]
    assert [r["experts"] for r in report["rows"]] == ["grouped_mm", "tilegemm", "tilegemm"]
    assert [r["norms"] for r in report["rows"]] == [0, 0, 2 * 2 + 1]  # two per layer and the final one
    for row in report["rows"]:
        assert row["eager_step_ms"] > 0 and "graph_step_ms" not in row  # no CUDA graph on the CPU
        assert row["kernels"] == 0 and row["nccl_ms"] == 0
    assert "| patched (tilegemm) | 5 | - | - | - |" in capsys.readouterr().out


def _tiny_model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(presets.PRESETS["tiny-qwen3-moe"].config()).eval()


@torch.no_grad()
def test_experts_removed_zeroes_the_experts_and_restores_them():
    model = _tiny_model()
    ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    ref = model(input_ids=ids).logits
    experts = step_profile.experts_modules(model)
    assert experts
    hidden = torch.randn(3, model.config.hidden_size)
    index = torch.zeros(3, 2, dtype=torch.long)
    with step_profile.experts_removed(model):
        assert torch.equal(experts[0](hidden, index, torch.ones(3, 2)), torch.zeros_like(hidden))
        assert not torch.allclose(model(input_ids=ids).logits, ref)
    assert all("forward" not in m.__dict__ for m in experts)
    assert torch.equal(model(input_ids=ids).logits, ref)


@torch.no_grad()
def test_decode_step_repeats_at_one_position():
    """The step rewinds the static cache, so repeated steps see the same cache and give the same token."""
    model = _tiny_model()
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(2))
    step = step_profile.DecodeStep(model, ids, slack=4)
    first = step()
    for _ in range(6):  # more steps than the slack: rewinds keep them in the cache
        step.rewind()
        assert torch.equal(step(), first)
    full = model(input_ids=torch.cat([ids, step.token], dim=1)).logits[:, -1].argmax(-1, keepdim=True)
    assert torch.equal(first, full)


def test_bad_counts_are_argparse_errors(tmp_path):
    import pytest

    for flag in ("--batch-size", "--prompt-tokens", "--layers", "--replays"):
        with pytest.raises(SystemExit) as exc:
            step_profile.main(["--model", "tiny-mixtral", flag, "0", "--out", str(tmp_path / "x.json")])
        assert exc.value.code == 2
