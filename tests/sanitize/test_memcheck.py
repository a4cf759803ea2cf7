"""compute-sanitizer memcheck over every kernel family (tests/sanitize/cases.py) as part of the GPU tests.

Skips cleanly without a CUDA GPU or without ``compute-sanitizer`` on the PATH; ``make test-gpu-sanitize``
runs the same cases (and the initcheck probe) outside pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("gpu_serial")]  # the whole of cases.py: one at a time

CASES = Path(__file__).with_name("cases.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_memcheck_every_kernel_family_clean():
    """Every case passes (agrees with the reference or runs on garbage values) and memcheck reports 0 errors."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not on the PATH")
    env = dict(os.environ, TILEGEMM_CHECK_VALUES="0", TILEGEMM_DISABLE_FALLBACK="1", PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", "--print-limit", "20", sys.executable, str(CASES)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "ERROR SUMMARY: 0 errors" in log, log[-4000:]
