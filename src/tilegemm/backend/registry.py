"""The op registry: ``@dispatch`` public stubs, ``@register_impl`` backends, fallback.

A call flows one way, public stub (``ops/api/``) -> dispatch wrapper -> backend implementation -> kernel; the wrapper
(:func:`dispatch`) does four steps:

* bind: the call's arguments against the stub's signature, so the stub's defaults and keyword names hold for every
  backend (:mod:`tilegemm.backend.binding`);
* check: the op's shared input check ``check(**arguments)``, which raises for bad input before any backend runs;
  when it returns a dict (what it derived: the logical form of the operands, a resolved recipe), that is what the
  backend receives;
* choose: the call's ``backend=`` (made the current choice for the call), else the current choice
  (:mod:`tilegemm.backend.selector`), else the automatic choice (:mod:`tilegemm.backend.choice`: the rules the
  backends register as they load);
* run: the chosen backend's implementation, every argument by keyword, with ``stream`` current when given. An
  implementation may raise :class:`Unsupported` before writing anything ("not this case": a dtype, arch or layout it
  lacks); the call then runs on ``pytorch``, with one ``FallbackWarning`` per (op, reason)
  (``TILEGEMM_DISABLE_FALLBACK=1``: a ``RuntimeError``).

Before binding, an op with a hot lane (:mod:`tilegemm.backend.hot_lane`) replays a call whose key has run before.
Dispatch decisions are logged at DEBUG level to the ``tilegemm.dispatch`` logger; ``TILEGEMM_DEBUG=1`` sets the
``tilegemm`` logger to DEBUG and gives it a stderr handler if it has none.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from tilegemm.backend import choice, selector
from tilegemm.backend.binding import binder
from tilegemm.backend.hot_lane import Lane
from tilegemm.env import DEBUG, env_flag

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("tilegemm.dispatch")

_BACKEND_MODULES = {
    "pytorch": "tilegemm.ops.reference",
    "cutile": "tilegemm.ops.cutile",
    "gluon": "tilegemm.ops.gluon",
}
_STUBS: dict[str, inspect.Signature] = {}
_ALIASES: dict[str, str] = {}  # a public alias -> the op it names (DeepGEMM's fp8_gemm_nt -> fp8_fp4_gemm_nt)
_IMPLS: dict[str, dict[str, Callable[..., Any]]] = {}
_IMPORT_ERRORS: dict[str, str] = {}
_LOCK = threading.Lock()
_loaded = False
_debug_configured = False


class Unsupported(Exception):
    """Raised by a backend implementation, before it writes anything, for a case it lacks."""


FallbackWarning = selector.FallbackWarning
reset_fallback_warnings = selector.reset_fallback_warnings


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
    reason = selector.unavailable_reason(backend)
    if reason is not None:
        return f"{backend} unavailable: {reason}"
    if any(_off_cuda(v) for v in arguments.values()):
        return f"{backend} needs CUDA tensors"
    return None


def call_checked(name: str, arguments: dict[str, Any], backend: str | None = None) -> Any:
    """Run op ``name`` (or an alias) with ``arguments`` its check has already derived (every parameter by name), on
    ``backend`` or the backend a call would choose; for callers that ran the check themselves."""
    return _route(canonical_op(name), backend, arguments)[0]


def _route(name: str, backend: str | None, arguments: dict[str, Any]) -> tuple[Any, str, str]:
    """Choose and run a checked call: ``backend`` (the call's ``backend=``, current for the call), else the current
    choice, else the automatic choice; a backend that cannot run the call falls back to ``pytorch`` with a warning
    (at the public call's caller). Returns the result, the backend chosen and the backend that ran."""
    _load_backends()  # the backends' automatic-choice rules are registered as they load
    with selector.CallScope(backend):
        target = choice.chosen()
        if target == choice.AUTO:
            target = choice.automatic(name, arguments, stacklevel=3)
        if target != "pytorch":
            reason = _unavailable_reason(name, target, arguments)
            if reason is None:
                try:
                    if arguments.get("stream") is None:
                        result = _IMPLS[name][target](**arguments)
                    else:
                        with _stream_context(arguments):
                            result = _IMPLS[name][target](**arguments)
                    if _debug_enabled():
                        log.debug("%s -> %s", name, target)
                    return result, target, target
                except Unsupported as exc:
                    reason = str(exc)
            selector.fall_back(name, target, reason, stacklevel=3)
            if _debug_enabled():
                log.debug("%s -> pytorch (fallback from %s: %s)", name, target, reason)
        elif _debug_enabled():
            log.debug("%s -> pytorch", name)
        with _stream_context(arguments):
            return _IMPLS[name]["pytorch"](**arguments), target, "pytorch"


def dispatch(
    name: str,
    *,
    check: Callable[..., Any] | None = None,
    signature: Callable[..., tuple[tuple, tuple] | None] | Any | None = None,
) -> Callable[[F], F]:
    """Turn ``stub`` into public op ``name``: bind, check, choose, run (see the module docstring).

    The returned function has the stub's signature plus a keyword-only ``backend`` (``None``, ``"gluon"``,
    ``"cutile"`` or ``"pytorch"``). ``check`` gets every bound argument by keyword. ``signature`` opens the hot lane
    for the op: a key function or a ``for_op`` builder (:mod:`tilegemm.backend.hot_lane`).
    """

    def decorator(stub: F) -> F:
        stub_signature = inspect.signature(stub)
        _STUBS[name] = stub_signature
        bind = binder(name, stub_signature)
        lane = Lane(name, signature, stub_signature) if signature is not None else None

        @functools.wraps(stub)
        def wrapper(*args: Any, backend: str | None = None, **kwargs: Any) -> Any:
            hot = lane.find(backend, args, kwargs) if lane is not None else None
            if hot is not None and hot[1] is not None:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s -> %s (hot lane)", name, hot[0][0])
                try:
                    return hot[1](*hot[2])
                except Unsupported:  # e.g. a JIT specialization tileiras rejects: the full path falls back
                    pass
            arguments = bind(args, kwargs)
            if check is not None:
                derived = check(**arguments)
                if derived is not None:
                    arguments = derived
            result, target, ran = _route(name, backend, arguments)
            if hot is not None and ran == target:
                lane.remember(hot[0], ran, arguments)
            return result

        params = [
            *stub_signature.parameters.values(),
            inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None),
        ]
        wrapper.__signature__ = stub_signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.op_name = name  # type: ignore[attr-defined]
        wrapper.hot_signature = lane.signature if lane is not None else None  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def list_ops() -> list[str]:
    """Names of every public op, sorted (their aliases, such as ``fp8_gemm_nt``, are not listed: see
    :func:`canonical_op`)."""
    _load_backends()
    return sorted(_STUBS)


def register_aliases(namespace: dict[str, Any]) -> None:
    """Accept every name of ``namespace`` that is bound to an op of another name (DeepGEMM's ``fp8_gemm_nt`` is
    ``fp8_fp4_gemm_nt``) wherever an op name is taken. ``tilegemm.ops.api`` passes its public names, so the
    aliases are exactly the public ones."""
    for alias, value in namespace.items():
        name = getattr(value, "op_name", None)
        if isinstance(name, str) and name != alias:
            _ALIASES[alias] = name


def canonical_op(name: str) -> str:
    """The op that ``name`` names: an op of :func:`list_ops`, or the op a public alias is bound to
    (``fp8_gemm_nt`` -> ``fp8_fp4_gemm_nt``, ``fp8_m_grouped_gemm_nt_masked`` -> ``m_grouped_fp8_fp4_gemm_nt_masked``).

    Raises:
        ValueError: ``name`` is neither, naming the ops and aliases.
    """
    _load_backends()
    op = _ALIASES.get(name, name) if isinstance(name, str) else name
    if op not in _STUBS:
        raise ValueError(f"op: got {name!r}, expected one of {sorted(_STUBS)} or of their aliases {sorted(_ALIASES)}")
    return op


def get_available_backends_for_op(name: str) -> list[str]:
    """Backends that implement op ``name`` (or an alias, see :func:`canonical_op`) and can run on this machine."""
    impls = _IMPLS.get(canonical_op(name), {})
    return [b for b in selector.BACKENDS if b in impls and selector.is_backend_available(b)]


def get_impl(name: str, backend: str) -> Callable[..., Any]:
    """Backend ``backend``'s registered implementation of op ``name`` (or an alias, see :func:`canonical_op`), for
    composing one op from another.

    It takes what the op's check derives, by keyword (``stream`` included), and skips the public checks:
    the caller vouches for its arguments (views such as a permuted ``d`` the public op would refuse are
    fine where the implementation allows them). It may raise :class:`Unsupported`.

    Raises:
        ValueError: no such op, or ``backend`` has no implementation of it.
    """
    name = canonical_op(name)
    impl = _IMPLS.get(name, {}).get(backend)
    if impl is None:
        raise ValueError(f"op {name!r}: no {backend!r} implementation (registered: {sorted(_IMPLS.get(name, {}))})")
    return impl


def get_registered_backends_for_op(name: str) -> list[str]:
    """Backends that implement op ``name`` (or an alias, see :func:`canonical_op`), whether or not they can run
    here."""
    impls = _IMPLS.get(canonical_op(name), {})
    return [b for b in selector.BACKENDS if b in impls]
