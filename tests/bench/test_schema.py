"""The results file: required keys, strict JSON on save, malformed files refused on load."""

from __future__ import annotations

import json
import math

import pytest
from synthetic_run import make_doc

from tilegemm.bench import schema


def test_synthetic_doc_is_valid(doc):
    assert schema.validate(doc) == []


def test_every_required_key_is_checked(doc):
    for key in schema.REQUIRED_ROW_KEYS:
        row = dict(doc["rows"][0])
        del row[key]
        assert any(key in p for p in schema.validate_row(row))


def test_null_peer_needs_a_reason(doc):
    row = doc["rows"][1]
    assert row["peers"]["cublas"] is None
    row["peer_notes"] = {}
    assert any("cublas" in p for p in schema.validate_row(row))


def test_failed_row_needs_an_error(doc):
    row = doc["rows"][0]
    row["ms"] = None
    assert schema.validate_row(row)
    row["error"] = "RuntimeError: boom"
    assert schema.validate_row(row) == []


def test_save_load_roundtrip_writes_strict_json(tmp_path, doc):
    doc["rows"][0]["calc_diff"] = float("nan")
    path = tmp_path / "run.json"
    schema.save(doc, path)
    text = path.read_text()
    assert "NaN" not in text
    json.loads(text)  # strict JSON
    back = schema.load(path)
    assert back["rows"][0]["calc_diff"] is None
    assert back["rows"][1]["graph_ms"] == pytest.approx(doc["rows"][1]["graph_ms"])
    assert back["meta"]["ceilings"]["copy_gbps"] == 3000.0


def test_load_refuses_a_malformed_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"meta": {}, "rows": [{"family": "dense"}]}))
    with pytest.raises(ValueError, match="missing"):
        schema.load(path)


def test_row_key_is_stable_and_distinguishes_settings():
    a, b = make_doc()["rows"][0], make_doc()["rows"][0]
    assert schema.row_key(a) == schema.row_key(b)
    b["settings"] = {"c": "d"}
    assert schema.row_key(a) != schema.row_key(b)
    b["shape"] = dict(reversed(list(a["shape"].items())))
    b["settings"] = {}
    assert schema.row_key(a) == schema.row_key(b)


def test_best_ms_prefers_kernel_only():
    assert schema.best_ms({"ms": 2.0, "graph_ms": 1.0}) == 1.0
    assert schema.best_ms({"ms": 2.0, "graph_ms": None}) == 2.0
    assert schema.best_ms(None) is None
    assert not math.isnan(schema.best_ms({"ms": 2.0}))
