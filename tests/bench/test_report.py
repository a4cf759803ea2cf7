"""Markdown report and README rendering from a saved run (CPU only)."""

from __future__ import annotations

import pytest
from synthetic_run import make_doc

from tilegemm.bench import readme, report, schema
from tilegemm.bench.__main__ import main


def test_speedup_is_peer_over_tilegemm(doc):
    row = doc["rows"][0]  # tilegemm 20 us, cuBLAS 25 us, DeepGEMM 22 us (graph)
    assert report.speedup(row, "cublas") == pytest.approx(25 / 20)
    assert report.speedup(row, "deepgemm") == pytest.approx(22 / 20)
    assert report.speedup(row, "cublas", "ms") == pytest.approx(0.025 * 1.2 / 0.030)
    assert report.speedup(doc["rows"][1], "cublas") is None  # refused


def test_wrong_results_stay_out_of_the_means(doc):
    doc["rows"][0]["peers"]["cublas"]["correct"] = False
    assert report.speedup(doc["rows"][0], "cublas") is None
    doc["rows"][0]["correct"] = False
    assert report.speedup(doc["rows"][0], "deepgemm") is None


def test_summary_geomeans(doc):
    by = {(s["family"], s["dtype"], s["peer"]): s for s in report.summary(doc["rows"])}
    fp8_dg = by[("dense", "fp8", "deepgemm")]
    assert fp8_dg["rows"] == 2
    assert fp8_dg["geomean"] == pytest.approx(((0.013 / 0.013) * (0.090 / 0.110)) ** 0.5)
    assert fp8_dg["min"] == pytest.approx(0.090 / 0.110)
    assert by[("dense", "fp8", "cublas")]["rows"] == 1
    assert ("mqa", "fp8", "deepgemm") not in by  # never ran


def test_markdown_has_every_family_peer_and_reason(doc):
    md = report.markdown(doc)
    for text in ("## dense", "## masked", "## mqa", "NVIDIA H100", "copy 3000 GB/s", "cublas us (x)",
                 "deepgemm us (x)", "cuBLAS blockwise refuses M=1", "disabled (--deepgemm off)", "25.0 (1.25)",
                 "Not run (1 rows)", "## models", "transformers us (x)", "greedy tokens equal 0.938"):  # fmt: skip
        assert text in md, text
    table_lines = [ln for ln in md.splitlines() if ln.startswith("| dense |") or ln.startswith("| bf16_gemm_nt")]
    assert table_lines


def test_cli_markdown_from_saved_json(tmp_path, doc):
    schema.save(doc, tmp_path / "run.json")
    assert main(["--from", str(tmp_path / "run.json"), "--markdown", str(tmp_path / "out" / "run.md")]) == 0
    assert "## masked" in (tmp_path / "out" / "run.md").read_text()
    assert main(["--from", str(tmp_path / "run.json"), "--family", "mqa", "--markdown", str(tmp_path / "m.md")]) == 0
    assert "## dense" not in (tmp_path / "m.md").read_text()


def test_cli_refuses_a_bad_file(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--from", str(tmp_path / "bad.json")]) == 2
    assert "not a tilegemm-bench results file" in capsys.readouterr().err


def test_render_replaces_only_the_marked_section(tmp_path):
    run = tmp_path / "results" / "h100.json"
    schema.save(make_doc(), run)
    (tmp_path / "results" / "plots").mkdir()
    (tmp_path / "results" / "plots" / "dense.png").write_bytes(b"\x89PNG")
    text = f"# title\n\nbefore\n\n{readme.BEGIN}\nold results\n{readme.END}\n\nafter\n"
    (tmp_path / "README.md").write_text(text)
    assert main(["render", "--from", str(run), "--readme", str(tmp_path / "README.md")]) == 0
    out = (tmp_path / "README.md").read_text()
    assert out.startswith("# title\n\nbefore\n\n" + readme.BEGIN) and out.endswith(readme.END + "\n\nafter\n")
    assert "old results" not in out
    assert "![dense](results/plots/dense.png)" in out and "![masked]" not in out  # only plots that exist
    assert "(results/h100.md)" in out and "| dense | fp8 | deepgemm |" in out
    again = main(["render", "--from", str(run), "--readme", str(tmp_path / "README.md")])
    assert again == 0 and (tmp_path / "README.md").read_text() == out  # idempotent


def test_render_without_markers_fails(tmp_path, capsys):
    schema.save(make_doc(), tmp_path / "run.json")
    (tmp_path / "README.md").write_text("# no markers\n")
    assert main(["render", "--from", str(tmp_path / "run.json"), "--readme", str(tmp_path / "README.md")]) == 2
    assert "markers" in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == "# no markers\n"


def test_repository_readme_has_the_markers():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert text.count(readme.BEGIN) == 1 and text.count(readme.END) == 1
    assert text.index(readme.BEGIN) < text.index(readme.END)
