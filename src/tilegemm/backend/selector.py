"""Which backend runs an op: availability detection and the current choice.

Choice order (first match wins): the call's ``backend=``, ``use_backend(...)``, ``set_backend(...)``, env
``TILEGEMM_BACKEND``, then the automatic choice (:mod:`tilegemm.backend.choice`: the backends' rules for the op
and shape, else ``cutile`` when it is available, else ``pytorch``).

The current choice is carried one way. :func:`selected_backend` is its one reader (``None``: automatic), and what
sets it for a stretch of code is a scope in one :class:`contextvars.ContextVar`: :class:`BackendScope` for a block
(``use_backend`` is the public one, which also says when the backend cannot run here; tilegemm's own, such as a
patched module's backend, are plain ones) and :class:`CallScope` for one call (a call's ``backend=``: the dispatch
wrapper enters it). Code that keeps a backend for later (an autograd backward, a custom op under ``torch.compile``)
passes the name on as a call's ``backend=`` or enters a :class:`BackendScope` with it. Beneath every scope lies the
process-wide ``set_backend`` choice, then ``TILEGEMM_BACKEND``.

Being in a :class:`contextvars.ContextVar`, scopes follow the execution context: each thread and each asyncio task
sees only the scopes entered in it (a task created inside a scope inherits it, as ``contextvars`` do). Python runs a
generator in its caller's context, so a scope entered inside a generator is additionally tied to the generator's
frame: it applies only while that generator runs, not to its caller while the generator is suspended at a ``yield``.
Generators driven by ``contextlib`` (a ``@contextmanager`` that wraps ``use_backend``, ``ExitStack.enter_context``)
are transparent: the scope belongs to the code in their ``with`` block.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from types import FrameType, TracebackType

from tilegemm.env import BACKEND, DISABLE_FALLBACK, env_choice, env_flag

BACKENDS: tuple[str, ...] = ("gluon", "cutile", "pytorch")
"""Every backend name tilegemm knows, in order of preference."""

TRITON_TESTED = ((3, 6), (3, 10))
"""The triton versions the gluon backend is tested with: ``[low, high)`` as (major, minor)."""

_global_backend: str | None = None
_CONTEXTLIB_FILE = contextlib.__file__
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


class _Scope:
    """One entered ``use_backend``: the name, and the generator frame it is tied to (``None``: not in one)."""

    __slots__ = ("name", "generator_frame")

    def __init__(self, name: str, generator_frame: FrameType | None):
        self.name = name
        self.generator_frame = generator_frame


_WARNED: set[tuple[str, str]] = set()


class FallbackWarning(UserWarning):
    """Issued once per (op, reason) when a call falls back to the ``pytorch`` backend, and once per (selection,
    reason) when ``set_backend`` / ``use_backend`` choose a backend that cannot run here."""


def fall_back(subject: str, backend: str, reason: str, stacklevel: int = 1) -> None:
    """Say that ``subject`` (an op, or a backend selection) runs on ``pytorch`` instead of ``backend`` because of
    ``reason``: a :class:`FallbackWarning` once per (subject, reason) per process, issued ``stacklevel`` frames above
    the caller as ``warnings.warn`` counts them.

    Raises:
        RuntimeError: ``TILEGEMM_DISABLE_FALLBACK`` is on.
    """
    if env_flag(DISABLE_FALLBACK):
        raise RuntimeError(f"{subject}: backend {backend!r} cannot run here ({reason}) and fallback is disabled")
    key = (subject, reason)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"tilegemm.{subject}: falling back to pytorch: {reason}", FallbackWarning, stacklevel + 1)


def reset_fallback_warnings() -> None:
    """Forget which fallback warnings were issued, so they are issued again (for tests)."""
    _WARNED.clear()


_SCOPES: contextvars.ContextVar[tuple[_Scope, ...]] = contextvars.ContextVar("tilegemm_backend_scopes", default=())


def validate_backend_name(name: object) -> str:
    """Return ``name`` if it is a known backend, else raise ``ValueError`` listing the known ones."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend: got {name!r}, expected one of {list(BACKENDS)}")
    return name


def _find_tileiras() -> str | None:
    found = shutil.which("tileiras")
    if found:
        return found
    try:  # the pip package ships it inside site-packages (cuda-tile[tileiras])
        import nvidia.cu13  # type: ignore[import-not-found]

        for root in nvidia.cu13.__path__:
            path = os.path.join(root, "bin", "tileiras")
            if os.access(path, os.X_OK):
                return path
    except Exception:
        pass
    return None


def _gpu_reason(capability_reason: Callable[[tuple[int, int]], str | None]) -> str | None:
    """Why the current CUDA device does not suit a backend: no GPU, a failed query, or ``capability_reason`` of
    its compute capability; ``None`` when it suits. Never raises."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU"
        return capability_reason(tuple(torch.cuda.get_device_capability()))
    except Exception as exc:  # pragma: no cover - broken driver
        return f"CUDA query failed: {exc}"


@functools.cache
def cutile_unavailable_reason() -> str | None:
    """Why the ``cutile`` backend cannot run here, or ``None`` when it can. Never raises."""
    reason = _gpu_reason(lambda cap: None if cap[0] >= 8 else f"GPU compute capability {cap[0]}.x < 8.0")
    if reason is not None:
        return reason
    try:
        import cuda.tile  # noqa: F401
    except Exception as exc:
        return f"cuda.tile not importable ({type(exc).__name__}: {exc})"
    if _find_tileiras() is None:
        return "tileiras compiler not found"
    return None


@functools.cache
def triton_version() -> tuple[int, int] | None:
    """The installed triton's (major, minor), or ``None`` where triton does not import or its version is not
    understood. The gluon backend's choices read it where a design compiles differently under one triton."""
    try:
        import triton

        major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    except Exception:
        return None
    return major, minor


def triton_version_reason(version: str) -> str | None:
    """Why triton ``version`` is outside the gluon backend's tested range, or ``None``."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"triton version {version!r} not understood"
    low, high = TRITON_TESTED
    if not low <= (major, minor) < high:
        return f"triton {version} is outside the tested range [{low[0]}.{low[1]}, {high[0]}.{high[1]})"
    return None


@functools.cache
def gluon_unavailable_reason() -> str | None:
    """Why the ``gluon`` backend cannot run here, or ``None`` when it can. Never raises.

    It needs a Hopper GPU (sm_90: its kernels are wgmma / TMA / warp-specialized) and a triton in
    :data:`TRITON_TESTED` whose Gluon Hopper module imports.
    """
    reason = _gpu_reason(
        lambda cap: (
            None if cap == (9, 0) else f"GPU compute capability {cap[0]}.{cap[1]} (the gluon kernels are for 9.0)"
        )
    )
    if reason is not None:
        return reason
    try:
        import triton
    except Exception as exc:
        return f"triton not importable ({type(exc).__name__}: {exc})"
    reason = triton_version_reason(triton.__version__)
    if reason is not None:
        return reason
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except Exception as exc:
        return f"Gluon's Hopper module not importable ({type(exc).__name__}: {exc})"
    return None


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot run on this machine, or ``None``."""
    validate_backend_name(name)
    if name == "cutile":
        return cutile_unavailable_reason()
    if name == "gluon":
        return gluon_unavailable_reason()
    return None


def is_backend_available(name: str) -> bool:
    """True when backend ``name`` can run on this machine."""
    return unavailable_reason(name) is None


def get_available_backends() -> list[str]:
    """Backends that can run on this machine, in order of preference."""
    return [b for b in BACKENDS if is_backend_available(b)]


def _chosen(caller: str, name: str) -> str:
    """``name`` validated; when that backend cannot run on this machine, :func:`fall_back` says so (with the reason)
    at the line that called ``caller`` (``set_backend`` or ``use_backend``)."""
    reason = unavailable_reason(validate_backend_name(name))
    if reason is not None:
        fall_back(f"{caller}({name!r})", name, f"{name} unavailable: {reason}", stacklevel=3)
    return name


def set_backend(name: str | None) -> None:
    """Select the backend for all later calls (``None`` restores automatic choice).

    A backend that cannot run on this machine (``cutile`` or ``gluon`` without a suitable GPU) is still selected, so
    :func:`get_current_backend` names it, but its calls fall back to ``pytorch``: a :class:`FallbackWarning` says so at
    once, with the reason (once per process).

    Raises:
        ValueError: ``name`` is not a backend name.
        RuntimeError: the backend cannot run here and ``TILEGEMM_DISABLE_FALLBACK`` is on (nothing is selected).
    """
    global _global_backend
    _global_backend = None if name is None else _chosen("set_backend", name)


def _owner_frame(frame: FrameType) -> FrameType:
    """The frame whose ``with`` block a scope entered from ``frame`` belongs to (skipping contextlib's)."""
    while frame.f_back is not None:
        if frame.f_code.co_filename == _CONTEXTLIB_FILE:
            frame = frame.f_back
        elif frame.f_code.co_flags & _GENERATOR_FLAGS and frame.f_back.f_code.co_filename == _CONTEXTLIB_FILE:
            frame = frame.f_back  # the body of a @contextmanager: the scope belongs to its user
        else:
            break
    return frame


def _active_scope(scopes: tuple[_Scope, ...]) -> str | None:
    """The innermost scope whose generator (if any) is running now."""
    running: set[int] | None = None
    for scope in reversed(scopes):
        if scope.generator_frame is None:
            return scope.name
        if running is None:
            running = set()
            frame: FrameType | None = sys._getframe(1)
            while frame is not None:
                running.add(id(frame))
                frame = frame.f_back
        if id(scope.generator_frame) in running:
            return scope.name
    return None


def selected_backend() -> str | None:
    """The current choice, the one reader of it: the innermost active scope (a call's ``backend=``, ``use_backend``,
    :class:`BackendScope`), else ``set_backend``'s, else ``TILEGEMM_BACKEND``; ``None`` when the choice is automatic.

    Raises:
        ValueError: ``TILEGEMM_BACKEND`` is set to an unknown name (the message names the variable).
    """
    scopes = _SCOPES.get()
    if scopes:
        scoped = _active_scope(scopes)
        if scoped is not None:
            return scoped
    if _global_backend is not None:
        return _global_backend
    return env_choice(BACKEND, BACKENDS)


def default_backend() -> str:
    """The automatic choice's backend for ops and cases no chooser rule claims: ``cutile`` when it is
    available, else ``pytorch``."""
    return "cutile" if cutile_unavailable_reason() is None else "pytorch"


def get_current_backend() -> str:
    """The backend a call without ``backend=`` would use now: the user's choice, else :func:`default_backend`.

    With no user choice, the automatic choice's rules (:mod:`tilegemm.backend.choice`) may still route a call to
    another backend (``gluon`` for Hopper FP8 GEMMs where the committed measurements show it faster).

    Raises:
        ValueError: ``TILEGEMM_BACKEND`` is set to an unknown name (the message names the variable).
    """
    selected = selected_backend()
    return selected if selected is not None else default_backend()


class BackendScope(contextlib.AbstractContextManager):
    """Context manager: calls inside the ``with`` block use backend ``name``; ``as`` gives ``name``. ``None``
    changes nothing (the block keeps the current choice; ``as`` gives ``None``).

    :class:`use_backend` without its availability warning, for tilegemm's own scopes of a backend the user chose
    elsewhere (a patched module's ``backend=``): their calls still warn per op when they fall back.
    """

    def __init__(self, name: str | None):
        self.name = None if name is None else validate_backend_name(name)
        self._entered: list[_Scope] = []

    def __enter__(self) -> str | None:
        if self.name is None:
            return None
        owner = _owner_frame(sys._getframe(1))
        scope = _Scope(self.name, owner if owner.f_code.co_flags & _GENERATOR_FLAGS else None)
        self._entered.append(scope)
        _SCOPES.set((*_SCOPES.get(), scope))
        return self.name

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.name is None:
            return
        scope = self._entered.pop()
        # Remove this scope by identity (not a token reset): exits may interleave with a generator's.
        _SCOPES.set(tuple(s for s in _SCOPES.get() if s is not scope))


class CallScope:
    """Context manager: a call's ``backend=`` (``None``: nothing) is the current choice for the call, as in a
    :class:`BackendScope`. The dispatch wrapper's: the scope opens and closes in one frame, so it needs none of
    :class:`BackendScope`'s generator tracking and costs a third of it."""

    __slots__ = ("name", "_token")

    def __init__(self, name: str | None):
        self.name = None if name is None else validate_backend_name(name)

    def __enter__(self) -> None:
        if self.name is not None:
            self._token = _SCOPES.set((*_SCOPES.get(), _Scope(self.name, None)))

    def __exit__(self, *exc_info: object) -> None:
        if self.name is not None:
            _SCOPES.reset(self._token)


class use_backend(BackendScope):  # noqa: N801 - a function-like public name
    """Context manager: calls inside the ``with`` block use backend ``name``; ``as`` gives ``name``.

    Scoped to the current thread / asyncio task and, inside a generator, to the generator's own
    execution (see the module docstring). A backend that cannot run here warns at once, as :func:`set_backend`
    does (``RuntimeError`` under ``TILEGEMM_DISABLE_FALLBACK``).
    """

    def __init__(self, name: str):
        super().__init__(_chosen("use_backend", name))
