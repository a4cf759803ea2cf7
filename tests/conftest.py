"""Shared pytest setup: the `gpu` marker skips cleanly on machines without CUDA."""

import pytest
import torch

from tilegemm.backend import registry


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make test-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _gpu_peak_memory(request):
    """On a CUDA machine: the test's peak GPU memory as the junit property ``gpu_peak_bytes`` (the GPU suite's
    record lists the largest, tests/gpu_suite.py), and the cached blocks handed back afterwards so that parallel
    workers share the GPU's memory."""
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
