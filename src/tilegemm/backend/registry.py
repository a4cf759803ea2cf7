"""The op registry: ``@dispatch`` public stubs, ``@register_impl`` backends, fallback.

A call flows one way::

    public stub (ops/api/) -> dispatch wrapper -> checks -> chosen backend impl -> kernel

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

The hot lane. A stub may also give ``signature=fn``: ``fn(*values)`` (the call's arguments in the stub's
parameter order) returns ``(key, operands)`` or ``None``; or an object with ``for_op(name, parameters)``
that builds that function for the stub (the checks' :class:`~tilegemm.ops.checks.hot.HotLane`). The op's
wrapper keeps the function as ``hot_signature``. The key must hold everything the check and the
backend read from the call (tensor metadata, scalar values, settings), so that a key which passed them once
passes them again. A backend may register, with ``@register_replay(name, backend)``, a factory that turns a
call it has just run (what its check derived) into ``replay(*operands)``, the same work without
the checks or the plan lookup. A later call with the same key whose backend (``backend=`` or the current
choice) is the one that ran it runs the replay directly. :func:`clear_hot_lane` forgets every replay.
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
from tilegemm.backend.binding import binder, flattener
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
_REPLAYS: dict[tuple[str, str], Callable[[dict[str, Any]], Callable[..., Any] | None]] = {}
_REPLAY_OPS: set[str] = set()  # the ops with a replay on some backend
_HOT: dict[tuple[str, tuple], Callable[..., Any]] = {}  # (backend, signature key) -> replay
_LOCK = threading.Lock()
_loaded = False


class Unsupported(Exception):
    """Raised by a backend implementation, before it writes anything, for a case it lacks."""


FallbackWarning = selector.FallbackWarning
reset_fallback_warnings = selector.reset_fallback_warnings


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
        _REPLAY_OPS.add(name)
        return factory

    return decorator


def _has_replay(name: str, chosen: str) -> bool:
    """True when a call of ``name`` on ``chosen`` (any backend for ``AUTO``) may take the hot lane."""
    return name in _REPLAY_OPS if chosen == choice.AUTO else (name, chosen) in _REPLAYS


def clear_hot_lane() -> None:
    """Forget every hot-lane replay (``tilegemm.ops.cutile.launch.clear_plans`` calls it with the plans)."""
    _HOT.clear()


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


def call_backend(name: str, backend: str, arguments: dict[str, Any]) -> Any:
    """Run op ``name`` (or an alias, see :func:`canonical_op`) on ``backend`` with bound ``arguments``, falling back
    to ``pytorch``."""
    return _run(canonical_op(name), backend, arguments)[0]


def call_checked(name: str, arguments: dict[str, Any], backend: str | None = None) -> Any:
    """Run op ``name`` (or an alias) with ``arguments`` its check has already derived (every parameter by name), on
    ``backend`` or the backend a call would choose; for callers that ran the check themselves."""
    name = canonical_op(name)
    return _run(name, _resolve(name, choice.chosen(backend), arguments), arguments)[0]


def _run(name: str, backend: str, arguments: dict[str, Any]) -> tuple[Any, str]:
    """:func:`call_backend`, and the backend that ran."""
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
                return result, backend
            except Unsupported as exc:
                reason = str(exc)
        selector.fall_back(name, backend, reason, stacklevel=3)
        if _debug_enabled():
            log.debug("%s -> pytorch (fallback from %s: %s)", name, backend, reason)
    elif _debug_enabled():
        log.debug("%s -> pytorch", name)
    with _stream_context(arguments):
        return _IMPLS[name]["pytorch"](**arguments), "pytorch"


def _resolve(name: str, chosen: str, arguments: dict[str, Any]) -> str:
    """The backend that runs a call: ``chosen``, or for :data:`~tilegemm.backend.choice.AUTO` the automatic choice for
    these arguments (the backends' rules, registered as they load)."""
    if chosen != choice.AUTO:
        return chosen
    _load_backends()
    return choice.automatic(name, arguments, stacklevel=3)


def dispatch(
    name: str,
    *,
    check: Callable[..., Any] | None = None,
    signature: Callable[..., tuple[tuple, tuple] | None] | Any | None = None,
) -> Callable[[F], F]:
    """Turn ``stub`` into public op ``name``: bind, check, route to a backend.

    The returned function has the stub's signature plus a keyword-only ``backend``
    (``None``, ``"gluon"``, ``"cutile"`` or ``"pytorch"``). ``check`` receives every bound argument by
    keyword and raises ``TypeError``/``ValueError`` for bad input before any backend runs; when
    it returns a dict, the backend implementation is called with that dict instead.
    ``signature`` opens the hot lane for the op: a function or a ``for_op`` builder (see the module docstring).
    """

    def decorator(stub: F) -> F:
        stub_signature = inspect.signature(stub)
        _STUBS[name] = stub_signature
        bind = binder(name, stub_signature)
        hot_signature = signature
        if hasattr(signature, "for_op"):  # a key built from per-argument kinds (tilegemm.ops.checks.hot)
            hot_signature = signature.for_op(name, tuple(stub_signature.parameters))
        flat = flattener(stub_signature) if hot_signature is not None else None

        @functools.wraps(stub)
        def wrapper(*args: Any, backend: str | None = None, **kwargs: Any) -> Any:
            hot_key = chosen = None
            if flat is not None:
                try:
                    chosen = choice.chosen(backend)
                except ValueError:  # raised again, in its turn, by the full path
                    chosen = None
                values = flat(args, kwargs) if _has_replay(name, chosen) else None
                found = hot_signature(*values) if values is not None else None
                if found is not None:
                    hot_key = (chosen, found[0])
                    replay = _HOT.get(hot_key)
                    if replay is not None:
                        if log.isEnabledFor(logging.DEBUG):
                            log.debug("%s -> %s (hot lane)", name, chosen)
                        try:
                            return replay(*found[1])
                        except Unsupported:  # e.g. a JIT specialization tileiras rejects: the full path falls back
                            pass
            arguments = bind(args, kwargs)
            if check is not None:
                derived = check(**arguments)
                if derived is not None:
                    arguments = derived
            if chosen is None:
                chosen = choice.chosen(backend)
            target = _resolve(name, chosen, arguments)
            result, ran = _run(name, target, arguments)
            if hot_key is not None and ran == target and (name, ran) in _REPLAYS:
                replay = _REPLAYS[(name, ran)](arguments)
                if replay is not None:
                    _HOT[hot_key] = replay
                    if chosen == choice.AUTO:  # the chooser's pick is a function of the signature key
                        _HOT[(ran, hot_key[1])] = replay
            return result

        params = [
            *stub_signature.parameters.values(),
            inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None),
        ]
        wrapper.__signature__ = stub_signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.op_name = name  # type: ignore[attr-defined]
        wrapper.hot_signature = hot_signature  # type: ignore[attr-defined]
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
