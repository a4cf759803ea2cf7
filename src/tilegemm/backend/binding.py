"""A call's arguments against its stub's signature: bound with the defaults applied (the full path) or flattened
into one tuple in the stub's parameter order (the hot lane's key function reads that)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def binder(name: str, signature: inspect.Signature) -> Callable[[tuple, dict], dict[str, Any]]:
    """``signature.bind`` + ``apply_defaults`` for stubs of positional-or-keyword and keyword-only
    parameters, without its per-call cost.

    Any call it cannot bind (too many arguments, unknown or repeated names, a missing one) goes
    through ``inspect`` to raise the standard ``TypeError``.
    """
    params = signature.parameters.values()
    names = tuple(signature.parameters)
    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    defaults = {n: p.default for n, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    simple = all(p.kind in kinds for p in params)

    def slow(args: tuple, kwargs: dict) -> dict[str, Any]:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}: {exc}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        if not simple or len(args) > len(positional):
            return slow(args, kwargs)
        arguments = dict(zip(positional, args))
        for key, value in kwargs.items():
            if key in arguments or key not in signature.parameters:
                return slow(args, kwargs)
            arguments[key] = value
        if len(arguments) < len(names):
            for key in names:
                if key not in arguments:
                    if key not in defaults:
                        return slow(args, kwargs)
                    arguments[key] = defaults[key]
        return {key: arguments[key] for key in names}

    return bind


def flattener(signature: inspect.Signature) -> Callable[[tuple, dict], tuple | None]:
    """``(args, kwargs) -> values``: a call's arguments as one tuple in the stub's parameter order, defaults
    filled in, or ``None`` for a call it does not take (a required argument given by keyword, an unknown or
    repeated name): such a call takes the full path, which binds it or raises."""
    names = tuple(signature.parameters)
    index = {n: i for i, n in enumerate(names)}
    defaults = tuple(p.default for p in signature.parameters.values())
    required = sum(p.default is inspect.Parameter.empty for p in signature.parameters.values())
    positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in signature.parameters.values())

    def flat(args: tuple, kwargs: dict) -> tuple | None:
        given = len(args)
        if given < required or given > positional:
            return None
        if not kwargs:
            return args + defaults[given:]
        values = [*args, *defaults[given:]]
        for key, value in kwargs.items():
            i = index.get(key)
            if i is None or i < given:
                return None
            values[i] = value
        return tuple(values)

    return flat
