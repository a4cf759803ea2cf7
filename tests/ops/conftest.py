"""Fixtures shared by the per-op tests."""

from __future__ import annotations

import types

import pytest
import torch

from tilegemm.backend import hot_lane, registry


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


@pytest.fixture
def launches(monkeypatch):
    """Every cutile launch as ``(grid, kernel, args)``, recorded instead of run, on CPU tensors: an sm_90 device of
    132 SMs, an empty hot lane, fallback an error, no forced MQA variant."""
    ct = pytest.importorskip("cuda.tile")
    from tilegemm import config
    from tilegemm.ops.cutile import launch

    seen = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: seen.append((grid, kernel, args)))
    monkeypatch.setattr(launch, "current_stream", lambda: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(registry, "_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(config, "_num_sms", 132)
    monkeypatch.setattr(hot_lane, "_HOT", {})
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.delenv("TILEGEMM_MQA_VARIANT", raising=False)
    return seen
