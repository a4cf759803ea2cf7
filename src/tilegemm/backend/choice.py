"""Which backend a call runs on: the current choice (:mod:`tilegemm.backend.selector`), else the automatic choice.

:func:`chosen` reads the current choice: the call's ``backend=`` (current for that call), ``use_backend``,
``set_backend``, ``TILEGEMM_BACKEND``; :data:`AUTO` when there is none. Under :data:`AUTO`, :func:`automatic` picks
per call: the first rule registered for the op that claims the call, else
:func:`~tilegemm.backend.selector.default_backend` (``cutile`` when available, else ``pytorch``).

Rules come from the backends: a backend's modules call :func:`register_rule` when they load (the gluon backend's
dense FP8 rule is in ``tilegemm.heuristics.gluon``), so this module, like the registry, imports no backend. A
backend a rule picks still falls back to ``pytorch`` with a warning if it raises ``Unsupported``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from tilegemm.backend import selector

AUTO = "auto"
"""What :func:`chosen` returns when no backend is chosen: :func:`automatic` decides per call."""

Rule = Callable[[dict[str, Any]], str | None]
"""``rule(arguments)``: the backend that should run a call (``arguments``: what its check derived), or ``None``."""

_RULES: dict[str, list[Rule]] = {}


def chosen(backend: str | None = None) -> str:
    """The backend a call runs on as far as the user said: ``backend`` (a call's ``backend=`` not yet made current),
    else the current choice (:func:`~tilegemm.backend.selector.selected_backend`), else :data:`AUTO`.

    Raises:
        ValueError: ``backend`` or ``TILEGEMM_BACKEND`` is not a backend name.
    """
    if backend is not None:
        return selector.validate_backend_name(backend)
    selected = selector.selected_backend()
    return AUTO if selected is None else selected


def register_rule(*ops: str) -> Callable[[Rule], Rule]:
    """Register ``rule`` for the automatic choice of ``ops``: it may claim a call for a backend from the call's
    arguments (rules of one op are asked in the order they were registered; the first non-``None`` answer wins)."""

    def decorator(rule: Rule) -> Rule:
        for op in ops:
            if rule not in _RULES.setdefault(op, []):
                _RULES[op].append(rule)
        return rule

    return decorator


class ReferenceOnGpuWarning(UserWarning):
    """Issued once per process when the automatic choice runs a call on CUDA tensors with the reference backend."""


_warned_reference_on_gpu = False


def _on_cuda(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return value.is_cuda
    return isinstance(value, (tuple, list)) and any(_on_cuda(v) for v in value)


def _warn_reference_on_gpu(op: str, arguments: dict[str, Any], stacklevel: int) -> None:
    """Say once, naming the reason and the fix, that CUDA tensors are about to run on the exact fp32 reference."""
    global _warned_reference_on_gpu
    if _warned_reference_on_gpu or not any(_on_cuda(v) for v in arguments.values()):
        return
    _warned_reference_on_gpu = True
    warnings.warn(
        f"tilegemm.{op}: CUDA tensors run on the pytorch reference backend (exact, slow) because cutile is "
        f"unavailable: {selector.cutile_unavailable_reason()}. Install the kernels with "
        '`pip install "tilegemm[cutile]"` (cuda-tile[tileiras]), or choose a backend with '
        "tilegemm.set_backend(...) to silence this.",
        ReferenceOnGpuWarning,
        stacklevel=stacklevel + 1,
    )


def automatic(op: str, arguments: dict[str, Any], stacklevel: int = 1) -> str:
    """The backend that runs op ``op`` on ``arguments`` (what its check derived) under the automatic choice, by the
    rules of the backends loaded so far (the registry loads them all before it chooses).

    When that is the ``pytorch`` reference for a call on CUDA tensors (no GPU backend can run here), a
    :class:`ReferenceOnGpuWarning` says so once per process, with the reason and the fix, where a
    ``warnings.warn(..., stacklevel=stacklevel)`` in the caller would.
    """
    for rule in _RULES.get(op, ()):
        picked = rule(arguments)
        if picked is not None:
            return picked
    default = selector.default_backend()
    if default == "pytorch":
        _warn_reference_on_gpu(op, arguments, stacklevel + 1)
    return default
