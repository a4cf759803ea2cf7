"""The GPU suite's runner (tests/gpu_suite.py) on the CPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import gpu_suite
import pytest


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
    assert gpu_suite.workers_for(139 * gib, 16) == 4
    assert gpu_suite.workers_for(70 * gib, 16) == 2
    assert gpu_suite.workers_for(139 * gib, 8) == 2
    assert gpu_suite.workers_for(1 * gib, 1) == 1


def test_cases_read_outcomes_and_peak_memory(tmp_path):
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.ops.test_a" name="test_ok" time="1.5">'
        '<properties><property name="gpu_peak_bytes" value="1024"/></properties></testcase>'
        '<testcase classname="tests.ops.test_a" name="test_bad" time="0.1"><failure message="x"/></testcase>'
        '<testcase classname="tests.ops.test_a" name="test_off" time="0"><skipped message="y"/></testcase>'
        '<testcase classname="tests.ops.test_a" name="test_err" time="0"><error message="z"/></testcase>'
        "</testsuite></testsuites>"
    )
    cases = gpu_suite._cases(junit)
    assert [c["outcome"] for c in cases] == ["passed", "failed", "skipped", "errors"]
    assert cases[0] == {
        "test": "tests/ops/test_a.py::test_ok",
        "outcome": "passed",
        "seconds": 1.5,
        "gpu_peak_bytes": 1024,
    }
