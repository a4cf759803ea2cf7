"""``modeling/transformers/infer.py`` on the CPU: the comparison table and JSON, argument checks, no downloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeling.transformers import infer

ROOT = Path(__file__).resolve().parents[2]


def test_compare_tiny_preset_json(tmp_path, capsys):
    path = tmp_path / "out.json"
    args = ["--model", "tiny-qwen2-moe", "--compare", "--new-tokens", "4", "--prompt-tokens", "8", "--json", str(path)]
    assert infer.main(args) == 0
    table = capsys.readouterr().out
    assert "tiny-qwen2-moe" in table and "calc_diff" in table
    (row,) = json.loads(path.read_text())
    assert row["model_type"] == "qwen2_moe" and row["backend"] == "pytorch" and row["dtype"] == "float32"
    assert row["calc_diff"] < 1e-5 and row["top1_agreement"] == 1.0 and row["token_agreement"] == 1.0


def test_reference_backend_reports_agreement_only(capsys):
    """On the pytorch backend (the exact reference) a run shows no tokens/s and no ratios, in the table or the JSON,
    and points at the committed GPU numbers instead."""
    args = ["--model", "tiny-qwen3-moe", "--compare", "--new-tokens", "3", "--prompt-tokens", "8", "--json", "-"]
    assert infer.main(args) == 0
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    table = captured.err
    assert "tok/s" not in table and "x)" not in table and "Agreement only" in table
    assert "benchmarks/results/h100.md" in table and "README.md" in table
    for path in ("README.md", "benchmarks/results/h100.md", "benchmarks/results/norm/README.md"):
        assert (ROOT / path).is_file() and path in infer.GPU_NUMBERS
    assert not any(k in row for k in infer.SPEED_KEYS)
    assert not [k for side in ("patched", "stock") for k in row[side] if "tok_s" in k]
    assert row["speed"].startswith("not measured on the pytorch backend")
    assert row["calc_diff"] < 1e-5 and row["token_agreement"] == 1.0


def test_speed_rows_keep_their_ratios_off_the_reference_backend():
    """A row measured on a kernel backend keeps its speeds and gets the speed table."""
    row = {"model": "m", "batch": 1, "backend": "cutile", "dtype": "bfloat16", "device": "NVIDIA H100", "fp8": False}
    row.update(linear=False, prefill_ratio=1.5, decode_ratio=1.2, calc_diff=1e-6, max_logit_diff=0.01)
    row["patched"] = {"prefill_tok_s": 300.0, "decode_tok_s": 60.0, "decode_mode": "dynamic"}
    row["stock"] = {
        "prefill_tok_s": 200.0,
        "decode_tok_s": 50.0,
        "decode_peer_tok_s": 50.0,
        "decode_peer_mode": "dynamic",
    }
    assert infer.speed_measured(row)
    table = infer.format_table([row])
    assert "prefill tok/s" in table and "(1.50x)" in table and "(1.20x)" in table and "Agreement only" not in table


def test_json_to_stdout_is_only_json(capsys):
    args = ["--model", "tiny-mixtral", "--new-tokens", "2", "--prompt-tokens", "4", "--json", "-"]
    assert infer.main(args) == 0
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)  # the whole of stdout parses
    assert row["model"] == "tiny-mixtral" and row["patched"]["decode_mode"] == "dynamic"
    assert "calc_diff" in captured.err  # the table went to stderr


def test_fp8_cuda_graph_flags_on_cpu(capsys):
    args = ["--model", "tiny-mixtral", "--fp8", "--cuda-graphs", "--compare", "--new-tokens", "3"]
    args += ["--prompt-tokens", "8", "--dtype", "bf16"]
    assert infer.main(args) == 0
    out = capsys.readouterr().out
    assert "tiny-mixtral" in out and "fp8 True" in out and "Agreement only" in out


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


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        infer.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "option", ["--layers", "--batch-size", "--prompt-tokens", "--new-tokens", "--repeats"], ids=lambda o: o[2:]
)
@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_counts_must_be_positive(capsys, option, value):
    err = _usage_error(capsys, [option, value])
    assert f"argument {option}" in err and "positive integer" in err and value in err


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "meta"])
def test_bad_device(capsys, device):
    assert "argument --device" in _usage_error(capsys, ["--device", device])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_device_without_cuda(capsys):
    err = _usage_error(capsys, ["--device", "cuda"])
    assert "argument --device" in err and "CUDA is not available" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cutile_backend_that_cannot_run_is_an_error(capsys):
    err = _usage_error(capsys, ["--backend", "cutile"])
    assert "argument --backend" in err and "cutile backend cannot run" in err


def test_cutile_backend_needs_cuda_bf16(monkeypatch):
    """With cutile available, a CPU device or a non-bf16 model would still run the pytorch reference."""
    monkeypatch.setattr(infer, "cutile_unavailable_reason", lambda: None)
    cuda = torch.device("cuda")
    assert "needs --device cuda" in infer.backend_problem("cutile", torch.device("cpu"), torch.bfloat16)
    assert "--dtype fp32 would run pytorch" in infer.backend_problem("cutile", cuda, torch.float32)
    assert infer.backend_problem("cutile", cuda, torch.bfloat16) is None
    assert infer.backend_problem("pytorch", torch.device("cpu"), torch.float32) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the exit status of a CUDA request on a machine without CUDA")
def test_script_from_a_checkout_exits_2_without_traceback():
    """The CLI as users run it: a subprocess from the repository root."""
    cmd = [sys.executable, "modeling/transformers/infer.py", "--backend", "cutile"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "cutile backend cannot run" in proc.stderr


def test_decode_peer_is_the_same_loop():
    """Under CUDA graphs the ratio is against the stock experts in the graph loop, not generate()."""
    stock = {"decode_tok_s": 128.8, "decode_static_tok_s": 356.8, "decode_graph_tok_s": 576.4}
    out = infer._decode_peer(stock, 682.7, "static+cuda_graph")
    assert stock["decode_peer_mode"] == "static+cuda_graph" and stock["decode_peer_tok_s"] == 576.4
    assert out["decode_ratio"] == pytest.approx(682.7 / 576.4)
    assert out["decode_ratio_vs_generate"] == pytest.approx(682.7 / 356.8)
    # without the graph loop: the faster of transformers' dynamic and static-cache generate()
    stock = {"decode_tok_s": 128.8, "decode_static_tok_s": 356.8}
    out = infer._decode_peer(stock, 300.0, "dynamic")
    assert stock["decode_peer_mode"] == "static" and out == {"decode_ratio": pytest.approx(300.0 / 356.8)}
