"""The hot lane: a call whose signature key has run on a backend replays without binding, checks or plan lookup.

A stub may give ``@dispatch(..., signature=fn)``: ``fn(*values)`` (the call's arguments in the stub's parameter
order) returns ``(key, operands)`` or ``None``; or an object with ``for_op(name, parameters)`` that builds that
function for the stub (the checks' :class:`~tilegemm.ops.checks.hot.HotLane`). The op's wrapper keeps the function
as ``hot_signature``. The key must hold everything the check and the backend read from the call (tensor metadata,
scalar values, settings), so that a key which passed them once passes them again.

A backend may register, with ``@register_replay(name, backend)``, a factory that turns a call it has just run (what
its check derived) into ``replay(*operands)``, the same work without the checks or the plan lookup. A later call
with the same key whose backend (``backend=`` or the current choice) is the one that ran it runs the replay
directly; a call under the automatic choice also stores its replay under the backend that ran it, so an explicit
``backend=`` of that backend shares it. :func:`clear_hot_lane` forgets every replay.

The registry asks an op's :class:`Lane` before binding (:meth:`Lane.find`) and tells it what the full path ran
(:meth:`Lane.remember`); a replay that raises the registry's ``Unsupported`` sends the call down the full path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from tilegemm.backend import choice, selector
from tilegemm.backend.binding import flattener

F = TypeVar("F", bound=Callable[..., Any])

_REPLAYS: dict[tuple[str, str], Callable[[dict[str, Any]], Callable[..., Any] | None]] = {}
_REPLAY_OPS: dict[str, set[str]] = {}  # op -> the backends with a replay of it
_HOT: dict[tuple[str, tuple], Callable[..., Any]] = {}  # (backend, signature key) -> replay


def register_replay(name: str, backend: str) -> Callable[[F], F]:
    """Register ``factory(derived)`` as backend ``backend``'s hot-lane replay of op ``name``.

    After a call of ``name`` has run on ``backend`` (no fallback), the factory gets what its check derived
    (the arguments the implementation received) and returns ``replay(*operands)`` (``operands`` as the op's
    signature function gives them) or ``None``. The replay must do what the backend implementation did for
    every call with the same signature key.
    """
    selector.validate_backend_name(backend)

    def decorator(factory: F) -> F:
        _REPLAYS[(name, backend)] = factory
        _REPLAY_OPS.setdefault(name, set()).add(backend)
        return factory

    return decorator


def clear_hot_lane() -> None:
    """Forget every hot-lane replay (``tilegemm.ops.cutile.launch.clear_plans`` calls it with the plans)."""
    _HOT.clear()


class Lane:
    """One op's hot lane: its signature function (``hot_signature``) over the stub's parameters."""

    __slots__ = ("name", "signature", "_flat")

    def __init__(self, name: str, signature: Any, stub_signature: inspect.Signature):
        if hasattr(signature, "for_op"):  # a key built from per-argument kinds (tilegemm.ops.checks.hot)
            signature = signature.for_op(name, tuple(stub_signature.parameters))
        self.name = name
        self.signature: Callable[..., tuple[tuple, tuple] | None] = signature
        self._flat = flattener(stub_signature)

    def find(
        self, backend: str | None, args: tuple, kwargs: dict
    ) -> tuple[tuple[str, tuple], Callable[..., Any] | None, tuple] | None:
        """``(key, replay, operands)`` of a call with ``backend=backend``: its hot-lane key, the replay stored under
        it (``None``: none yet) and the operands to replay with; ``None`` when the call cannot take the lane (no
        replay for its backend, no key for its arguments, a bad ``backend=`` that the full path reports)."""
        try:
            chosen = choice.chosen(backend)
        except ValueError:  # raised again, in its turn, by the full path
            return None
        if chosen == choice.AUTO:  # no key where no backend that could run the call has a replay of it
            if not any(selector.unavailable_reason(b) is None for b in _REPLAY_OPS.get(self.name, ())):
                return None
        elif (self.name, chosen) not in _REPLAYS:
            return None
        values = self._flat(args, kwargs)
        found = self.signature(*values) if values is not None else None
        if found is None:
            return None
        key = (chosen, found[0])
        return key, _HOT.get(key), found[1]

    def remember(self, key: tuple[str, tuple], ran: str, arguments: dict[str, Any]) -> None:
        """The full path ran a call of ``key`` on ``ran``, the backend it was sent to (no fallback), with ``arguments``
        (what the check derived): store ``ran``'s replay of it, if it has one."""
        factory = _REPLAYS.get((self.name, ran))
        replay = factory(arguments) if factory is not None else None
        if replay is None:
            return
        _HOT[key] = replay
        if key[0] == choice.AUTO:  # the automatic choice's pick is a function of the signature key
            _HOT[(ran, key[1])] = replay
