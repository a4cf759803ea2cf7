"""compute-sanitizer memcheck over every kernel family (tests/sanitize/cases.py) as part of the GPU tests.

Skips cleanly without a CUDA GPU or without ``compute-sanitizer`` on the PATH; ``make test-gpu-sanitize``
runs the same cases (and the initcheck probe) outside pytest. The cases run in :data:`SHARDS` sanitizer processes
(``cases.py --shard I/N``, every N-th case), the first in the ``gpu_serial`` group and the others beside the rest of
the suite, so that the longest test of the suite is a fraction of the whole of cases.py; marked ``early``, every
shard starts when the suite does (``gpu_suite.early_first``), not after the tests collected before it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.early]

CASES = Path(__file__).with_name("cases.py")
SRC = Path(__file__).resolve().parents[2] / "src"
#: Sanitizer processes of the cases: the first runs in the serial group, whose tests run one after another, so its
#: share of the cases adds to that group's time (the GPU suite's records list the shards among the slowest tests).
SHARDS = 4


@pytest.mark.parametrize(
    "shard",
    [pytest.param(i, marks=[pytest.mark.xdist_group("gpu_serial")] if i == 0 else []) for i in range(SHARDS)],
)
def test_memcheck_every_kernel_family_clean(shard: int):
    """Every case of the shard passes (agrees with the reference or runs on garbage values) and memcheck reports 0
    errors."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not on the PATH")
    env = dict(os.environ, TILEGEMM_CHECK_VALUES="0", TILEGEMM_DISABLE_FALLBACK="1", PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", "--print-limit", "20", sys.executable, str(CASES)]
    cmd += ["--shard", f"{shard}/{SHARDS}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "ERROR SUMMARY: 0 errors" in log, log[-4000:]
