"""Shared pytest setup: the `gpu` marker skips cleanly on machines without CUDA."""

import json
import os
import sys

import gpu_suite
import pytest
import torch

from tilegemm.backend import registry


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        items[:] = gpu_suite.early_first(items)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make test-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: Set by tests/gpu_suite.py: a file that every test report is appended to as it arrives (JSON lines), each failure
#: also printed at once, so that a run stopped by its time budget still says what ran and what failed.
OUTCOMES = "TILEGEMM_TEST_OUTCOMES"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(OUTCOMES)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):  # under xdist the controller sees every report once
        return
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "seconds": report.duration}
    line.update((k, v) for k, v in report.user_properties if k == "gpu_peak_bytes")
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
    if report.failed:
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n")
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def _gpu_peak_memory(request):
    """On a CUDA machine: the test's peak GPU memory as the property ``gpu_peak_bytes`` (the GPU suite's record
    lists the largest, tests/gpu_suite.py), and the cached blocks handed back afterwards so that parallel workers
    share the GPU's memory."""
    if not torch.cuda.is_available():
        yield
        return
    torch.cuda.reset_peak_memory_stats()
    yield
    request.node.user_properties.append(("gpu_peak_bytes", torch.cuda.max_memory_allocated()))
    torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _fresh_fallback_warnings():
    """Each test sees fallback warnings afresh."""
    registry.reset_fallback_warnings()
    yield


@pytest.fixture
def strict(monkeypatch):
    """A fallback from cutile to pytorch would make a test's cutile cases meaningless: make it an error."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
