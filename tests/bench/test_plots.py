"""--plot from a saved run: one PNG per family (needs matplotlib, which the dev extra installs)."""

from __future__ import annotations

import pytest

from tilegemm.bench import schema
from tilegemm.bench.__main__ import main

pytest.importorskip("matplotlib")


def test_plot_per_family_from_saved_json(tmp_path, doc):
    schema.save(doc, tmp_path / "run.json")
    assert main(["--from", str(tmp_path / "run.json"), "--plot", str(tmp_path / "plots")]) == 0
    for fam in ("dense", "masked", "mqa", "models"):
        png = tmp_path / "plots" / f"{fam}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def test_plot_survives_missing_ceilings_and_failed_rows(tmp_path, doc):
    from tilegemm.bench import plots

    doc["meta"]["ceilings"] = {}
    doc["rows"] = doc["rows"][:2]
    doc["rows"][0].update(ms=None, graph_ms=None, error="RuntimeError: x")
    paths = plots.plot_all(doc, tmp_path)
    assert [p.name for p in paths] == ["dense.png"] and paths[0].stat().st_size > 10_000


def test_rows_told_apart_by_op_only_get_the_op_in_their_label(doc):
    from tilegemm.bench import plots

    models = [r for r in doc["rows"] if r["family"] == "models"]
    labels = plots.row_labels(models)
    assert labels[0].startswith("decode bf16 model=qwen3-30b-a3b") and labels[1].startswith("prefill bf16 ")
    dense = [r for r in doc["rows"] if r["family"] == "dense"]
    assert plots.row_labels(dense)[0] == "bf16 m=1 n=4096 k=7168"  # distinct shapes: no op
