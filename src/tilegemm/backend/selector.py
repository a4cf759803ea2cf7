"""Which backend runs an op: availability detection and the user's choice.

Choice order (first match wins, see ``registry.dispatch``): the call's ``backend=``,
``use_backend(...)``, ``set_backend(...)``, env ``TILEGEMM_BACKEND``, then ``cutile`` when
it is available, else ``pytorch``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from collections.abc import Iterator

BACKENDS: tuple[str, ...] = ("cutile", "pytorch")
"""Every backend name tilegemm knows, in order of preference."""

_state = threading.local()
_global_backend: str | None = None


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


@functools.cache
def cutile_unavailable_reason() -> str | None:
    """Why the ``cutile`` backend cannot run here, or ``None`` when it can. Never raises."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU"
        major, _ = torch.cuda.get_device_capability()
        if major < 8:
            return f"GPU compute capability {major}.x < 8.0"
    except Exception as exc:  # pragma: no cover - broken driver
        return f"CUDA query failed: {exc}"
    try:
        import cuda.tile  # noqa: F401
    except Exception as exc:
        return f"cuda.tile not importable ({type(exc).__name__}: {exc})"
    if _find_tileiras() is None:
        return "tileiras compiler not found"
    return None


def is_backend_available(name: str) -> bool:
    """True when backend ``name`` can run on this machine."""
    validate_backend_name(name)
    return name == "pytorch" or cutile_unavailable_reason() is None


def get_available_backends() -> list[str]:
    """Backends that can run on this machine, in order of preference."""
    return [b for b in BACKENDS if is_backend_available(b)]


def set_backend(name: str | None) -> None:
    """Select the backend for all later calls (``None`` restores automatic choice)."""
    global _global_backend
    _global_backend = None if name is None else validate_backend_name(name)


def get_current_backend() -> str:
    """The backend a call without ``backend=`` would use now."""
    scoped = getattr(_state, "stack", None)
    if scoped:
        return scoped[-1]
    if _global_backend is not None:
        return _global_backend
    env = os.environ.get("TILEGEMM_BACKEND")
    if env:
        return validate_backend_name(env)
    return "cutile" if is_backend_available("cutile") else "pytorch"


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[str]:
    """Context manager: calls inside use backend ``name`` (this thread only)."""
    validate_backend_name(name)
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(name)
    try:
        yield name
    finally:
        stack.pop()
