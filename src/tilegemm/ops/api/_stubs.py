"""What the op-family modules of ``tilegemm.ops.api`` share: the annotation aliases and :func:`op`."""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.backend.registry import dispatch

Tensor = torch.Tensor
FP8Operand = tuple[torch.Tensor, torch.Tensor]
Recipe = tuple[int, int, int]


def op(name: str, stub: Any, doc: str, check: Any, signature: Any = None) -> Any:
    """Public op ``name`` from ``stub``, a signature written once for several ops (a family's layouts): the stub under
    that name with docstring ``doc``, through ``dispatch(name, check=check, signature=signature)``."""
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = doc
    return dispatch(name, check=check, signature=signature)(stub)
