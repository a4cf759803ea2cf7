"""Fixtures shared by the per-op tests."""

from __future__ import annotations

import types

import pytest
import torch

from tilegemm.backend import hot_lane, registry
from tilegemm.ops.reference import mqa as reference_mqa


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


def _elementwise_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x @ y`` (batched, broadcasting) summed over K in order, one rounded product and one rounded addition at a
    time: each output element's bits do not depend on how many rows or columns are computed at once."""
    acc = x[..., :, 0:1] * y[..., 0:1, :]
    for i in range(1, x.shape[-1]):
        acc = acc + x[..., :, i : i + 1] * y[..., i : i + 1, :]
    return acc


@pytest.fixture
def elementwise_reference_matmul(monkeypatch):
    """The MQA references' products as :func:`_elementwise_matmul`, for tests of their chunking: a BLAS fp32 GEMM may
    sum in an order that follows the matrix sizes (MKL's does on some CPUs: the head-weighted sum, M 1 and K 4, over
    160 columns and over 16 differ in the last bit), so chunk-for-chunk equality holds only for products whose
    elements do not depend on each other."""
    monkeypatch.setattr(reference_mqa, "exact_matmul", _elementwise_matmul)
