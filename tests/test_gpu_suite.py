"""The GPU suite's runner (tests/gpu_suite.py) on the CPU, and the rule its records keep: every ``src`` tree that
lands has a complete GPU suite record with 0 failed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gpu_suite
import pytest

from tilegemm.backend import selector

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_tree_hash_is_gits(tmp_path):
    """Files, an executable, nested folders, a name that sorts differently as a folder, and ignored caches."""
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg-a.py").write_text("x = 1\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (src / "pkg" / "sub" / "run.sh").chmod(0o755)
    (src / "pkg" / "__pycache__").mkdir()
    (src / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    _git("init", "-q", cwd=tmp_path)
    _git("add", "-A", cwd=tmp_path)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t", cwd=tmp_path)
    assert gpu_suite.git_tree_hash(src) == _git("rev-parse", "HEAD:src", cwd=tmp_path)


def test_workers_follow_memory_and_cores():
    gib = 1 << 30
    assert gpu_suite.workers_for(139 * gib, 16) == 8
    assert gpu_suite.workers_for(70 * gib, 16) == 4
    assert gpu_suite.workers_for(139 * gib, 8) == 4
    assert gpu_suite.workers_for(1 * gib, 1) == 1
    assert gpu_suite.threads_per_worker(8, 16) == 2 and gpu_suite.threads_per_worker(4, 2) == 1


def test_cases_take_the_worst_phase_and_peak_memory(tmp_path):
    outcomes = tmp_path / "outcomes.jsonl"
    reports = [
        ("a", "setup", "passed", 0.5, None), ("a", "call", "passed", 1.0, None), ("a", "teardown", "passed", 0, 1024),
        ("b", "setup", "passed", 0, None), ("b", "call", "failed", 0.1, None), ("b", "teardown", "passed", 0, 0),
        ("c", "setup", "skipped", 0, None), ("c", "teardown", "passed", 0, None),
        ("d", "setup", "failed", 0, None), ("d", "teardown", "passed", 0, None),
        ("e", "setup", "passed", 0, None), ("e", "call", "passed", 0, None), ("e", "teardown", "failed", 0, None),
    ]  # fmt: skip
    lines = []
    for test, when, outcome, seconds, peak in reports:
        line = {"test": test, "when": when, "outcome": outcome, "seconds": seconds}
        lines.append(json.dumps(line if peak is None else {**line, "gpu_peak_bytes": peak}))
    outcomes.write_text("\n".join(lines) + "\n")
    found = {c["test"]: c for c in gpu_suite.cases(outcomes)}
    assert {t: c["outcome"] for t, c in found.items()} == {
        "a": "passed", "b": "failed", "c": "skipped", "d": "errors", "e": "errors"
    }  # fmt: skip
    assert found["a"]["seconds"] == 1.5 and found["a"]["gpu_peak_bytes"] == 1024
    assert gpu_suite.cases(tmp_path / "none.jsonl") == []


def test_conftest_appends_each_report_as_it_arrives(tmp_path):
    """What a run stopped at its budget leaves behind: the reports of the tests that ran (tests/conftest.py)."""
    outcomes = tmp_path / "outcomes.jsonl"
    test = "tests/test_gpu_suite.py::test_workers_follow_memory_and_cores"
    env = dict(os.environ, TILEGEMM_TEST_OUTCOMES=str(outcomes))
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", test],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [(c["test"], c["outcome"]) for c in gpu_suite.cases(outcomes)] == [(test, "passed")]


def test_early_tests_go_first_and_the_rest_keep_their_order():
    """The GPU suite's collection order: the ``early`` tests (the memcheck shards) first, each part as collected."""
    items = [SimpleNamespace(name=name, keywords={"early"} if early else set()) for name, early in
             [("a", False), ("shard0", True), ("b", False), ("c", False), ("shard1", True)]]  # fmt: skip
    assert [item.name for item in gpu_suite.early_first(items)] == ["shard0", "shard1", "a", "b", "c"]
    assert "gpu_suite.early_first(items)" in (ROOT / "tests" / "conftest.py").read_text()
    memcheck = ROOT / "tests" / "sanitize" / "test_memcheck.py"
    assert "pytest.mark.early" in memcheck.read_text()


def test_commit_is_named_only_for_the_tree_that_ran(monkeypatch):
    monkeypatch.delenv("TILEGEMM_COMMIT", raising=False)
    assert gpu_suite.commit("0" * 40) is None
    monkeypatch.setenv("TILEGEMM_COMMIT", "abc")
    assert gpu_suite.commit("0" * 40) == "abc"


def _records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(gpu_suite.RECORDS.glob("*.json"))]


def _green(record: dict) -> bool:
    return record["complete"] and record["failed"] == 0 and record["errors"] == 0 and record["passed"] > 0


def test_the_landed_src_tree_has_a_green_gpu_record():
    """Every change to ``src/`` lands with a complete GPU suite record (``make test-gpu`` on the CUDA machine) for
    its final tree, with no failed test."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    if _git("status", "--porcelain", "--", "src", cwd=ROOT):
        pytest.skip("src/ has uncommitted changes: a record is for a committed tree")
    tree = _git("rev-parse", "HEAD:src", cwd=ROOT)
    mine = [r for r in _records() if r["src_tree"] == tree]
    assert mine, f"no GPU suite record for src tree {tree} in {gpu_suite.RECORDS} (run `make test-gpu` on the GPU)"
    green = [r for r in mine if _green(r) and r.get("cuda-tile") and not r.get("pytest_args")]
    assert green, f"no complete GPU suite record with 0 failed, every backend, for src tree {tree}: {mine}"


def test_record_names_keep_runs_under_other_tritons_apart():
    base = {"date": "2026-12-01", "src_tree": "0123456789abcdef", "triton": "3.8.0"}
    assert gpu_suite.record_name({**base, "cuda-tile": "1.7.0"}) == "2026-12-01-0123456789ab.json"
    assert gpu_suite.record_name({**base, "cuda-tile": None}) == "2026-12-01-0123456789ab-triton3.8.0.json"


def test_every_triton_of_the_tested_range_has_run_the_gluon_tests():
    """The gluon backend's tested range (``selector.TRITON_TESTED``) holds only tritons under which the GPU tests of
    the gluon backend ran green: for each minor version in it, a complete record with 0 failed whose run was every
    test or the gluon ones (``-k gluon``, recorded as ``<date>-<tree>-triton<version>.json``)."""
    low, high = selector.TRITON_TESTED
    assert low[0] == high[0], "a range over two major versions: name the minors to check"
    runs = [r for r in _records() if _green(r) and r.get("pytest_args", []) in ([], ["-k", "gluon"])]
    for minor in range(low[1], high[1]):
        version = f"{low[0]}.{minor}."
        assert any((r.get("triton") or "").startswith(version) for r in runs), (
            f"triton {version}x is in the tested range but no green GPU record ran the gluon tests under it"
        )
