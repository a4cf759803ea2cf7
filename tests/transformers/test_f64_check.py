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
