"""--compare ratios and the --fail-on-regression gate, from saved JSON on the CPU."""

from __future__ import annotations

import pytest
from synthetic_run import make_doc

from tilegemm.bench import compare, schema
from tilegemm.bench.__main__ import main


def test_same_run_compares_to_one():
    result = compare.compare(make_doc(), make_doc())
    assert len(result["rows"]) == 7
    assert all(c["ratio"] == pytest.approx(1.0) for c in result["rows"])
    assert result["geomean"] == pytest.approx(1.0)
    assert compare.regressions(result, 0.0) == []


def test_slower_run_is_flagged_per_row():
    result = compare.compare(make_doc(scale=1.2), make_doc())
    assert all(c["ratio"] == pytest.approx(1.2) for c in result["rows"])
    assert all(c["kind"] == "graph_ms" for c in result["rows"])
    assert len(compare.regressions(result, 10.0)) == 7
    assert compare.regressions(result, 25.0) == []
    md = compare.markdown(result, 10.0)
    assert md.count("REGRESSION") == 7 and "1.200" in md


def test_rows_only_on_one_side_are_counted_not_compared():
    new = make_doc()
    new["rows"] = new["rows"][:3]
    base = make_doc()
    base["rows"][0]["shape"] = {"m": 2, "n": 4096, "k": 7168}
    result = compare.compare(new, base)
    assert len(result["rows"]) == 2
    assert result["only_new"] == 1 and result["only_base"] == 5


def test_a_row_that_stopped_running_is_a_regression():
    new = make_doc()
    new["rows"][0].update(ms=None, graph_ms=None, error="RuntimeError: failed")
    result = compare.compare(new, make_doc())
    assert [c["key"] for c in compare.regressions(result, 50.0)] == [schema.row_key(new["rows"][0])]


def test_eager_ratio_used_when_graph_missing():
    new, base = make_doc(), make_doc()
    new["rows"][0]["graph_ms"] = None
    new["rows"][0]["ms"] = base["rows"][0]["ms"] * 2
    row = compare.compare(new, base)["rows"][0]
    assert row["kind"] == "ms" and row["ratio"] == pytest.approx(2.0)


@pytest.mark.parametrize(("scale", "code"), [(1.0, 0), (1.05, 0), (1.3, 1)])
def test_cli_gate_exit_code(tmp_path, scale, code, capsys):
    schema.save(make_doc(scale), tmp_path / "new.json")
    schema.save(make_doc(), tmp_path / "base.json")
    argv = [
        "--from",
        str(tmp_path / "new.json"),
        "--compare",
        str(tmp_path / "base.json"),
        "--fail-on-regression",
        "10",
    ]
    assert main(argv) == code
    out = capsys.readouterr().out
    assert "Compared 7 rows" in out
    assert ("regressed by more than 10.0%" in out) == bool(code)


def test_merge_runs_of_several_families(tmp_path, capsys):
    a, b = make_doc(), make_doc(scale=2.0)
    a["rows"] = [r for r in a["rows"] if r["family"] == "dense"]
    b["rows"] = [r for r in b["rows"] if r["family"] != "dense"] + [b["rows"][0]]
    schema.save(a, tmp_path / "a.json")
    schema.save(b, tmp_path / "b.json")
    argv = [
        "--from",
        str(tmp_path / "a.json"),
        "--from",
        str(tmp_path / "b.json"),
        "--save",
        str(tmp_path / "all.json"),
    ]
    assert main(argv) == 0
    merged = schema.load(tmp_path / "all.json")
    assert len(merged["rows"]) == 7 and len(merged["meta"]["merged_from"]) == 2
    first = next(r for r in merged["rows"] if schema.row_key(r) == schema.row_key(a["rows"][0]))
    assert first["graph_ms"] == pytest.approx(2 * a["rows"][0]["graph_ms"])  # the later run wins
    b["meta"]["gpu"] = "NVIDIA H200"
    with pytest.raises(ValueError, match="different GPUs"):
        schema.merge([a, b])


def test_merge_keeps_the_runs_of_a_merged_document_and_drops_skips_measured_elsewhere():
    a, b, c = make_doc(), make_doc(scale=2.0), make_doc(scale=3.0)
    for doc, date in ((a, "2026-11-22T10:00:00"), (b, "2026-11-23T10:00:00"), (c, "2026-11-24T10:00:00")):
        doc["meta"]["date"] = date
    dense_m1 = {"family": "dense", "spec": {"dtype": "bf16", "m": 1, "n": 4096, "k": 7168}, "reason": "time budget"}
    never = {"family": "dense", "spec": {"dtype": "bf16", "m": 3, "n": 5, "k": 7}, "reason": "time budget"}
    a["rows"] = [r for r in a["rows"] if not (r["family"] == "dense" and r["shape"]["m"] == 1)]
    a["skipped"] = [dense_m1, never]
    c["skipped"] = [dict(never)]
    merged = schema.merge([schema.merge([a, b]), c])
    assert [run["date"][:10] for run in merged["meta"]["merged_from"]] == ["2026-11-22", "2026-11-23", "2026-11-24"]
    assert merged["skipped"] == [never]  # b measured dense m=1; the two skips of m=3 are one row
