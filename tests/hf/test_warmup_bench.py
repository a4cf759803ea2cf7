"""modeling/transformers/warmup_bench.py's host side: cuTile cache entries counted from its SQLite file, the table."""

from __future__ import annotations

import pytest

from modeling.transformers import warmup_bench


def test_cutile_entries_counts_rows_of_the_cache_db(tmp_path):
    cache = pytest.importorskip("cutile_cache._cache")
    assert warmup_bench._cutile_entries(str(tmp_path)) is None
    for key in ("a", "b", "c"):
        cache.cache_store(str(tmp_path), key, b"cubin")
    assert warmup_bench._cutile_entries(str(tmp_path)) == 3
    assert warmup_bench._cache_files({"CUDA_TILE_CACHE_DIR": str(tmp_path)}) == {"CUDA_TILE_CACHE_DIR": 1}


def test_table_lists_every_scenario_last_line_explains_the_counts():
    jit = {"precompile": {"compiles": 40, "tileiras_runs": 38}, "first_request": {"compiles": 0, "tileiras_runs": 0}}
    scenarios = {
        "cold": {"first_request_s": 7.5, "second_request_s": 0.05, "jit": {}},
        "precompile_warm": {"precompile_s": 4.0, "first_request_s": 0.08, "second_request_s": 0.05, "jit": jit},
        "precompile_cold": {"skipped": "budget of 110 s spent"},
    }
    lines = warmup_bench._table(scenarios).splitlines()
    assert lines[0].split()[0] == "scenario" and len(lines) == 6
    assert lines[3].split() == ["precompile_warm", "4.00", "0.080", "0.050", "40/38", "0/0"]
    assert lines[4] == f"{'precompile_cold':<16} budget of 110 s spent"
    assert lines[-1].startswith("jit: ")
