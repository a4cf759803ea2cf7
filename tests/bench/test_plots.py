"""Plots from a saved run: one PNG per family, tilegemm's speedup over each peer by shape, README-width."""

from __future__ import annotations

import struct

import pytest

from tilegemm.bench import report, schema
from tilegemm.bench.__main__ import main

pytest.importorskip("matplotlib")


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_per_family_from_saved_json(tmp_path, doc, capsys):
    schema.save(doc, tmp_path / "run.json")
    assert main(["--from", str(tmp_path / "run.json"), "--plot", str(tmp_path / "plots")]) == 0
    for fam in ("dense", "masked", "mqa", "models"):
        png = tmp_path / "plots" / f"{fam}.png"
        width, height = _png_size(png)
        assert width == 1000 and 250 <= height <= 1000 and png.stat().st_size > 10_000
    err = capsys.readouterr().err
    assert "plot dense" in err and "plot models" in err  # progress, one step per family


def test_plot_survives_missing_ceilings_and_failed_rows(tmp_path, doc):
    from tilegemm.bench import plots

    doc["meta"]["ceilings"] = {}
    doc["rows"] = doc["rows"][:2]
    doc["rows"][0].update(ms=None, graph_ms=None, error="RuntimeError: x")
    paths = plots.plot_all(doc, tmp_path)
    assert [p.name for p in paths] == ["dense.png"] and paths[0].stat().st_size > 10_000


def _figure(doc, family):
    from tilegemm.bench import plots

    rows = [r for r in doc["rows"] if r["family"] == family]
    return rows, plots.ratio_figure(rows, doc["meta"], family)


def test_points_are_the_speedups_and_nothing_joins_them(doc):
    """Each peer's points are (GFLOP, peer time / tilegemm time) of the rows both ran correctly; no line runs
    through data (only the dashed 1.0 line), one panel per dtype."""
    rows, fig = _figure(doc, "dense")
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == ["bf16: speedup", "fp8: speedup"]
    fp8 = [r for r in rows if r["dtype"] == "fp8"]
    points = sorted(tuple(p) for c in axes[1].collections for p in c.get_offsets().tolist())
    pairs = [(r["flops"] / 1e9, report.speedup(r, peer)) for r in fp8 for peer in ("cublas", "deepgemm")]
    expect = sorted(e for e in pairs if e[1] is not None)  # cuBLAS refused M=1: no point there
    assert len(expect) == 3
    assert [v for p in points for v in p] == pytest.approx([v for e in expect for v in e])
    for ax in axes:
        lines = ax.get_lines()
        assert len(lines) == 1 and list(lines[0].get_ydata()) == [1.0, 1.0] and lines[0].get_linestyle() == "--"


def test_peers_have_distinct_colours_and_the_legend_is_off_the_data(doc):
    import matplotlib

    rows, fig = _figure(doc, "dense")
    colors = {}
    for ax in fig.axes:
        for c in ax.collections:
            colors.setdefault(matplotlib.colors.to_hex(c.get_edgecolor()[0]), set()).add(id(c))
    assert len(colors) == 2  # cublas and deepgemm, each its own colour in both panels
    legend = fig.legends[0]
    fig.canvas.draw()
    box = legend.get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent())
    labels = [t.get_text() for t in legend.get_texts()]
    assert any(t.startswith("deepgemm (fp8: geomean") for t in labels)


def test_rows_without_graph_times_are_drawn_hollow_from_eager_times(doc):
    for r in doc["rows"]:
        if r["family"] == "models":
            r["graph_ms"] = None
    rows, fig = _figure(doc, "models")
    (ax,) = fig.axes
    (points,) = ax.collections
    assert points.get_facecolor().size == 0 or points.get_facecolor()[0][3] == 0  # hollow
    assert sorted(y for _, y in points.get_offsets().tolist()) == pytest.approx(
        sorted(report.speedup(r, "transformers", "ms") for r in rows)
    )
    assert any("hollow: eager" in t.get_text() for t in fig.legends[0].get_texts())


def test_rows_told_apart_by_op_only_get_the_op_in_their_label(doc):
    from tilegemm.bench import plots

    models = [r for r in doc["rows"] if r["family"] == "models"]
    labels = plots.row_labels(models)
    assert labels[0].startswith("decode bf16 model=qwen3-30b-a3b") and labels[1].startswith("prefill bf16 ")
    dense = [r for r in doc["rows"] if r["family"] == "dense"]
    assert plots.row_labels(dense)[0] == "bf16 m=1 n=4096 k=7168"  # distinct shapes: no op
