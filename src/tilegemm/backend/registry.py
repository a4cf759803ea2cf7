"""The op registry: ``@dispatch`` public stubs, ``@register_impl`` backends, fallback.

A call flows one way::

    public stub (ops/api.py) -> dispatch wrapper -> checks -> chosen backend impl -> kernel

* ``@dispatch(name, check=fn)`` wraps a stub. The wrapper binds the call to the stub's
  signature (so the stub's defaults and keyword names hold for every backend), runs the
  shared input check ``fn(**arguments)``, picks the backend and calls its implementation
  with every argument as a keyword. When the check returns a dict, that dict (what the
  check derived: the logical form of the operands, a resolved recipe) is what the backend
  receives instead. The wrapper also accepts ``backend=`` to override the choice.
* ``@register_impl(name, backend)`` registers an implementation. It may raise
  :class:`Unsupported` before writing anything to say "not this case" (a dtype, arch or
  layout it lacks); the call then falls back to ``pytorch``.
* Fallback to ``pytorch`` warns once per (op, reason); ``TILEGEMM_DISABLE_FALLBACK=1``
  turns it into a ``RuntimeError``.
* When ``stream`` is given, the implementation runs with that CUDA stream current.
* Dispatch decisions (which backend ran, why a call fell back) are logged at DEBUG level to the
  ``tilegemm.dispatch`` logger; ``TILEGEMM_DEBUG=1`` sets the ``tilegemm`` logger to DEBUG and gives it
  a stderr handler if it has none.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from tilegemm.backend import selector
from tilegemm.env import DEBUG, DISABLE_FALLBACK, env_flag

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("tilegemm.dispatch")

_BACKEND_MODULES = {"pytorch": "tilegemm.ops.reference", "cutile": "tilegemm.ops.cutile"}
_STUBS: dict[str, inspect.Signature] = {}
_IMPLS: dict[str, dict[str, Callable[..., Any]]] = {}
_IMPORT_ERRORS: dict[str, str] = {}
_WARNED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()
_loaded = False


class Unsupported(Exception):
    """Raised by a backend implementation, before it writes anything, for a case it lacks."""


class FallbackWarning(UserWarning):
    """Issued once per (op, reason) when a call falls back to the ``pytorch`` backend."""


_debug_configured = False


def _debug_enabled() -> bool:
    """True when dispatch decisions are logged: ``TILEGEMM_DEBUG`` on, or the logger set to DEBUG by the user."""
    global _debug_configured
    if not _debug_configured and env_flag(DEBUG):
        _debug_configured = True
        root = logging.getLogger("tilegemm")
        root.setLevel(logging.DEBUG)
        if not root.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
            root.addHandler(handler)
    return log.isEnabledFor(logging.DEBUG)


def _load_backends() -> None:
    """Import the backend packages once so their ``register_impl`` calls run."""
    global _loaded
    if _loaded:
        return
    with _LOCK:
        if _loaded:
            return
        _loaded = True
        for backend, module in _BACKEND_MODULES.items():
            try:
                importlib.import_module(module)
            except Exception as exc:
                if backend == "pytorch":
                    raise
                _IMPORT_ERRORS[backend] = f"{type(exc).__name__}: {exc}"


def register_impl(name: str, backend: str) -> Callable[[F], F]:
    """Register ``fn`` as backend ``backend``'s implementation of op ``name``."""
    selector.validate_backend_name(backend)

    def decorator(fn: F) -> F:
        _IMPLS.setdefault(name, {})[backend] = fn
        return fn

    return decorator


def _off_cuda(value: Any) -> bool:
    """True if ``value`` is, or (in tuples and lists) holds, a tensor that is not on a CUDA device."""
    import torch

    if isinstance(value, torch.Tensor):
        return not value.is_cuda
    if isinstance(value, (tuple, list)):
        return any(_off_cuda(v) for v in value)
    return False


def _stream_context(arguments: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    stream = arguments.get("stream")
    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(stream)


def _unavailable_reason(name: str, backend: str, arguments: dict[str, Any]) -> str | None:
    """Why ``backend`` cannot even try this call, or ``None``."""
    if backend in _IMPORT_ERRORS:
        return f"{backend} backend failed to import ({_IMPORT_ERRORS[backend]})"
    if backend not in _IMPLS.get(name, {}):
        return f"no {backend} implementation of {name}"
    if backend == "cutile":
        reason = selector.cutile_unavailable_reason()
        if reason is not None:
            return f"cutile unavailable: {reason}"
        if any(_off_cuda(v) for v in arguments.values()):
            return "cutile needs CUDA tensors"
    return None


def _fall_back(name: str, backend: str, reason: str) -> None:
    if env_flag(DISABLE_FALLBACK):
        raise RuntimeError(f"{name}: backend {backend!r} cannot run this call ({reason}) and fallback is disabled")
    key = (name, reason)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"tilegemm.{name}: falling back to pytorch: {reason}", FallbackWarning, stacklevel=4)


def reset_fallback_warnings() -> None:
    """Forget which fallback warnings were issued, so they are issued again (for tests)."""
    _WARNED.clear()


def call_backend(name: str, backend: str, arguments: dict[str, Any]) -> Any:
    """Run op ``name`` on ``backend`` with bound ``arguments``, falling back to ``pytorch``."""
    _load_backends()
    if backend != "pytorch":
        reason = _unavailable_reason(name, backend, arguments)
        if reason is None:
            try:
                if arguments.get("stream") is None:
                    result = _IMPLS[name][backend](**arguments)
                else:
                    with _stream_context(arguments):
                        result = _IMPLS[name][backend](**arguments)
                if _debug_enabled():
                    log.debug("%s -> %s", name, backend)
                return result
            except Unsupported as exc:
                reason = str(exc)
        _fall_back(name, backend, reason)
        if _debug_enabled():
            log.debug("%s -> pytorch (fallback from %s: %s)", name, backend, reason)
    elif _debug_enabled():
        log.debug("%s -> pytorch", name)
    with _stream_context(arguments):
        return _IMPLS[name]["pytorch"](**arguments)


def _fast_binder(name: str, signature: inspect.Signature) -> Callable[[tuple, dict], dict[str, Any]]:
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


def dispatch(name: str, *, check: Callable[..., None] | None = None) -> Callable[[F], F]:
    """Turn ``stub`` into public op ``name``: bind, check, route to a backend.

    The returned function has the stub's signature plus a keyword-only ``backend``
    (``None``, ``"cutile"`` or ``"pytorch"``). ``check`` receives every bound argument by
    keyword and raises ``TypeError``/``ValueError`` for bad input before any backend runs; when
    it returns a dict, the backend implementation is called with that dict instead.
    """

    def decorator(stub: F) -> F:
        signature = inspect.signature(stub)
        _STUBS[name] = signature
        bind = _fast_binder(name, signature)

        @functools.wraps(stub)
        def wrapper(*args: Any, backend: str | None = None, **kwargs: Any) -> Any:
            arguments = bind(args, kwargs)
            if check is not None:
                derived = check(**arguments)
                if derived is not None:
                    arguments = derived
            chosen = selector.validate_backend_name(backend) if backend is not None else selector.get_current_backend()
            return call_backend(name, chosen, arguments)

        params = [
            *signature.parameters.values(),
            inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None),
        ]
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.op_name = name  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def list_ops() -> list[str]:
    """Names of every public op, sorted."""
    _load_backends()
    return sorted(_STUBS)


def get_available_backends_for_op(name: str) -> list[str]:
    """Backends that implement op ``name`` and can run on this machine."""
    _load_backends()
    if name not in _STUBS:
        raise ValueError(f"op: got {name!r}, expected one of {sorted(_STUBS)}")
    impls = _IMPLS.get(name, {})
    return [b for b in selector.BACKENDS if b in impls and selector.is_backend_available(b)]


def get_impl(name: str, backend: str) -> Callable[..., Any]:
    """Backend ``backend``'s registered implementation of op ``name``, for composing one op from another.

    It takes what the op's check derives, by keyword (``stream`` included), and skips the public checks:
    the caller vouches for its arguments (views such as a permuted ``d`` the public op would refuse are
    fine where the implementation allows them). It may raise :class:`Unsupported`.

    Raises:
        ValueError: no such op, or ``backend`` has no implementation of it.
    """
    _load_backends()
    impl = _IMPLS.get(name, {}).get(backend)
    if impl is None:
        raise ValueError(f"op {name!r}: no {backend!r} implementation (registered: {sorted(_IMPLS.get(name, {}))})")
    return impl


def get_registered_backends_for_op(name: str) -> list[str]:
    """Backends that implement op ``name``, whether or not they can run here."""
    _load_backends()
    return [b for b in selector.BACKENDS if b in _IMPLS.get(name, {})]
