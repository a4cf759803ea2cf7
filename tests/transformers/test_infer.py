"""``python -m tilegemm.infer`` on the CPU: the comparison table and JSON, and the no-download rule."""

from __future__ import annotations

import json

from tilegemm import infer


def test_compare_tiny_preset_json(tmp_path, capsys):
    path = tmp_path / "out.json"
    args = ["--model", "tiny-qwen2-moe", "--compare", "--new-tokens", "4", "--prompt-tokens", "8", "--json", str(path)]
    assert infer.main(args) == 0
    table = capsys.readouterr().out
    assert "tiny-qwen2-moe" in table and "prefill tok/s" in table
    (row,) = json.loads(path.read_text())
    assert row["model_type"] == "qwen2_moe" and row["backend"] == "pytorch" and row["dtype"] == "float32"
    assert row["stock"]["prefill_tok_s"] > 0 and row["patched"]["decode_tok_s"] > 0
    assert row["calc_diff"] < 1e-5 and row["top1_agreement"] == 1.0 and row["token_agreement"] == 1.0


def test_fp8_cuda_graph_flags_on_cpu(capsys):
    args = ["--model", "tiny-mixtral", "--fp8", "--cuda-graphs", "--compare", "--new-tokens", "3"]
    args += ["--prompt-tokens", "8", "--dtype", "bf16"]
    assert infer.main(args) == 0
    out = capsys.readouterr().out
    assert "-> " in out and " static (" in out  # --cuda-graphs on the CPU: static cache, no graph


def test_hub_name_is_refused_without_download(capsys):
    assert infer.main(["--model", "Qwen/Qwen3-30B-A3B"]) == 2
    err = capsys.readouterr().err
    assert "never downloads" in err and "weights must be local" in err


def test_local_checkpoint_directory(tmp_path, capsys):
    from hf_models import build

    build("tiny-qwen3-moe").save_pretrained(tmp_path)
    args = ["--model", str(tmp_path), "--compare", "--linear", "--new-tokens", "3", "--prompt-tokens", "8"]
    assert infer.main(args) == 0
    out = capsys.readouterr().out
    assert tmp_path.name in out and "linear True" in out
