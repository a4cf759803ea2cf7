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
def _fresh_fallback_warnings():
    """Each test sees fallback warnings afresh."""
    registry.reset_fallback_warnings()
    yield


@pytest.fixture
def strict(monkeypatch):
    """A fallback from cutile to pytorch would make a test's cutile cases meaningless: make it an error."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
