"""Fixtures shared by the per-op tests."""

from __future__ import annotations

import types

import pytest

from tilegemm.backend import registry


@pytest.fixture
def recorded_launches(monkeypatch):
    """The cutile host path on CPU tensors with ``cuda.tile.launch`` recorded instead of run."""
    ct = pytest.importorskip("cuda.tile")
    from tilegemm import config
    from tilegemm.ops.cutile import launch

    launches = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launches.append(args))
    monkeypatch.setattr(launch, "current_stream", lambda: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(registry, "_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(config, "get_num_sms", lambda: 132)
    monkeypatch.setattr(config, "_num_sms", 0)
    launch.clear_plans()
    yield launches
    launch.clear_plans()
