"""The check of ``rms_norm``."""

from __future__ import annotations

import math
from typing import Any

from tilegemm.ops.checks.base import FLOATS, _same_device, _scalar, _shape, _stream, _tensor


def rms_norm_check(x, weight, eps=1e-6, *, stream=None) -> dict[str, Any]:
    """The check of ``rms_norm``: float ``x [..., H]`` (at least 1-D), float ``weight [H]``, ``eps`` a finite real
    number >= 0; derived: ``x``, ``weight``, ``eps`` (a float), ``stream``."""
    _tensor("x", x, FLOATS, None)
    if x.dim() < 1:
        raise ValueError("x: got a 0-D tensor, expected [..., H] (the norm runs over the last dimension)")
    _tensor("weight", weight, FLOATS, 1)
    _shape("weight", weight, [x.shape[-1]], "[H], one per element of x's last dimension")
    eps = _scalar("eps", eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: got {eps}, expected a finite number >= 0")
    _stream(stream)
    _same_device(dict(x=x, weight=weight))
    return dict(x=x, weight=weight, eps=eps, stream=stream)
