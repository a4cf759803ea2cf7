"""Launch plans of every kernel backend: one cache, cleared by one call (torch only).

A host path turns a call into a plan once per key (the copies it needs, the config, the kernel, grid and
constants) and keeps it here: ``run = plans.find(key)``, else ``run = plans.keep(key, <built plan>)``. The key holds
everything the plan reads from a call (:func:`tensor_key` of each tensor, :func:`sms_key`, the config, the recipe, a
``TILEGEMM_*_VARIANT``), led by the backend's and the op's names. :func:`clear_plans` forgets every plan of every
backend with the hot-lane replays built on them (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tilegemm import config
from tilegemm.backend import hot_lane
from tilegemm.ops.operands import ALIGN_BYTES

__all__ = ["Runner", "find", "keep", "clear_plans", "tensor_key", "sms_key"]

#: A launch plan: ``run(*operands, stream=None)`` launches the call's kernels on ``stream`` (the current stream
#: when ``None``) and returns the output.
Runner = Callable[..., Any]

_PLANS: dict[tuple, Runner] = {}


def find(key: tuple) -> Runner | None:
    """The plan kept under ``key``, or ``None``."""
    return _PLANS.get(key)


def keep(key: tuple, plan: Runner) -> Runner:
    """Keep ``plan`` under ``key`` and return it."""
    _PLANS[key] = plan
    return plan


def clear_plans() -> None:
    """Forget every launch plan of every backend and every hot-lane replay (tests; plans are keyed by what they
    read, so this is never needed for correctness)."""
    _PLANS.clear()
    hot_lane.clear_hot_lane()


def tensor_key(x: torch.Tensor) -> tuple:
    """What a plan depends on in a tensor: shape, strides, dtype, 16-byte aligned base."""
    return (x.shape, x.stride(), x.dtype, x.data_ptr() % ALIGN_BYTES == 0)


def sms_key(device: torch.device) -> tuple:
    """What a plan depends on in the machine: the device and the ``set_num_sms`` setting."""
    return (device.index, config._num_sms)
