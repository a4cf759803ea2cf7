"""``modeling/transformers/f64_check.py`` on the CPU: stock and patched bf16 logits against the float64 model."""

from __future__ import annotations

import json
import math

from modeling.transformers import f64_check


def test_cpu_run_writes_each_seed_and_both_sides_are_near_float64(tmp_path, capsys):
    out = tmp_path / "f64.json"
    args = ["--model", "tiny-qwen3-moe", "--layers", "2", "--prompt", "12", "--seeds", "0,1", "--device", "cpu"]
    assert f64_check.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert sorted(report) == ["tiny-qwen3-moe seed 0", "tiny-qwen3-moe seed 1"]
    for row in report.values():
        values = [row["stock_vs_f64"], row["patched_vs_f64"], row["patched_vs_stock"]]
        assert all(math.isfinite(v) and 0 <= v < 1e-3 for v in values), row  # bf16 logits of a 2-layer model
        assert row["stock_vs_f64"] > 0 and row["patched_vs_stock"] > 0  # bf16 is not float64; two roundings
        assert len(row["worst_positions"]) == 5
        assert row["worst_positions"][0]["patched_vs_stock"] >= row["worst_positions"][-1]["patched_vs_stock"]
    assert "patched vs stock" in capsys.readouterr().out


def test_deepseek_v3_stock_patched_and_fp8_against_float64(tmp_path, capsys):
    """DeepSeek-V3 (MLA, group-limited routing, a dense first layer): each variant's bf16 logits against float64."""
    out = tmp_path / "f64.json"
    args = ["--model", "tiny-deepseek-v3", "--layers", "3", "--prompt", "10", "--seeds", "0", "--device", "cpu"]
    assert f64_check.main([*args, "--impls", "patched,fp8", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text()).values()
    assert row["f64_device"] == "cpu"
    for key in ("stock_vs_f64", "patched_vs_f64", "fp8_vs_f64", "patched_vs_stock", "fp8_vs_stock"):
        assert math.isfinite(row[key]) and 0 < row[key] < 1e-3, (key, row)
    # FP8 experts quantize the weights (about 2**-4 relative): further from float64 than the bf16 model
    assert row["fp8_vs_f64"] > row["stock_vs_f64"]
    assert len(row["worst_positions"]) == len(row["worst_positions_fp8"]) == 5
    assert "| fp8 vs f64 | fp8 vs stock |" in capsys.readouterr().out
