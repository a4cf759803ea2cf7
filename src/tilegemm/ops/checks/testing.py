"""The check of ``tilegemm.testing.calc_diff``."""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.ops.checks.base import _describe


def calc_diff_check(x: Any, y: Any) -> None:
    """The check of ``calc_diff``: two tensors of one shape on one device, with values (not meta)."""
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"calc_diff: {name}: got {_describe(t)}, expected a torch.Tensor")
    if x.device != y.device:
        raise ValueError(f"calc_diff: x is on {x.device} but y is on {y.device}, expected one device")
    for name, t in (("x", x), ("y", y)):
        if t.device.type == "meta":
            raise ValueError(f"calc_diff: {name}: a meta tensor has no values")
    if x.shape != y.shape:
        raise ValueError(f"calc_diff: x has shape {list(x.shape)} but y has {list(y.shape)}, expected one shape")
