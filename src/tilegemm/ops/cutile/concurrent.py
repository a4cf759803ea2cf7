"""cuTile compiles from several threads at once: :func:`concurrent_tileiras`.

cuTile's JIT compiles a kernel under one process-wide lock (``cuda.tile._compile._compiler_lock``, taken by
``compile_tile``): the front end (Python, to TileIR bytecode), the disk-cache lookup and the ``tileiras`` run (a
subprocess, 0.5-30 s) alike, so threads that launch new kernels compile one after another. Inside
:func:`concurrent_tileiras`, ``cuda.tile._compile.compile_cubin`` (the ``tileiras`` run of one compile) runs with
that lock released: front ends and cache lookups still run one at a time, up to ``limit`` ``tileiras`` processes run
beside them. Two runs of the same bytecode with the same flags (two threads meeting one new kernel) share one
process. Every other step of ``compile_tile`` (cache key, cache store, the cubin it returns) is cuTile's own, so
the kernels and the disk cache entries are those of a serial compile.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda.tile import _compile

__all__ = ["concurrent_tileiras", "CompileStats"]


@dataclass
class CompileStats:
    """What the ``tileiras`` runs of one :func:`concurrent_tileiras` block did."""

    runs: int = 0
    """``tileiras`` processes started."""
    shared: int = 0
    """compiles that took the cubin of an identical run instead of starting one."""
    peak: int = 0
    """the most ``tileiras`` processes running at once."""
    keys: list[tuple] = field(default_factory=list)
    """one entry per process started, in start order: (the bytecode's length in bytes, the sm arch)."""


@dataclass
class _Run:
    done: threading.Event = field(default_factory=threading.Event)
    cubin: Path | None = None
    error: BaseException | None = None


_STATE = threading.Lock()
_depth = 0
_original: Any = None
_runs: dict[tuple, _Run] = {}
_slots: threading.BoundedSemaphore | None = None
_running = 0
_stats: CompileStats | None = None


def _run_key(fname_bytecode: Any, args: tuple, kwargs: dict) -> tuple:
    options, sm_arch = (args + (None, None))[:2]
    return (
        Path(fname_bytecode).read_bytes(),
        repr(options),
        sm_arch,
        tuple(kwargs.get("preview_features", ())),
        tuple(str(p) for p in kwargs.get("linker_inputs", ())),
    )


def _release(lock: Any) -> Any:
    """Release ``lock`` (an RLock) fully if this thread holds it; the state to restore, or ``None``."""
    is_owned = getattr(lock, "_is_owned", None)
    if is_owned is None or not hasattr(lock, "_release_save") or not is_owned():
        return None
    return lock._release_save()


def _compile_cubin(fname_bytecode: Any, *args: Any, **kwargs: Any) -> Path:
    global _running
    key = _run_key(fname_bytecode, args, kwargs)
    with _STATE:
        run = _runs.get(key)
        owner = run is None
        if owner:
            run = _runs[key] = _Run()
        slots, stats, original = _slots, _stats, _original
    state = _release(_compile._compiler_lock)
    try:
        if not owner:
            run.done.wait()
            if run.error is not None or run.cubin is None:
                return original(fname_bytecode, *args, **kwargs)
            target = Path(fname_bytecode).with_suffix(".cubin")
            shutil.copyfile(run.cubin, target)
            with _STATE:
                stats.shared += 1
            return target
        with slots:
            with _STATE:
                _running += 1
                stats.runs += 1
                stats.peak = max(stats.peak, _running)
                stats.keys.append((len(key[0]), key[2]))
            try:
                run.cubin = original(fname_bytecode, *args, **kwargs)
            except BaseException as exc:
                run.error = exc
                raise
            finally:
                with _STATE:
                    _running -= 1
                run.done.set()
        return run.cubin
    finally:
        if state is not None:
            _compile._compiler_lock._acquire_restore(state)


@contextlib.contextmanager
def concurrent_tileiras(limit: int) -> Iterator[CompileStats]:
    """Within the block, cuTile compiles on different threads run ``tileiras`` concurrently (at most ``limit`` at
    once, ``limit >= 1``), and identical ``tileiras`` runs happen once. Yields the block's :class:`CompileStats`.

    Nested blocks share the outermost block's limit and statistics; leaving the outermost restores cuTile's own
    ``compile_cubin``. Threads compiling when the block ends should be joined inside it.
    """
    global _depth, _original, _slots, _stats
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit: got {limit!r}, expected an int >= 1")
    with _STATE:
        if _depth == 0:
            _original = _compile.compile_cubin
            _slots = threading.BoundedSemaphore(limit)
            _stats = CompileStats()
            _runs.clear()
            _compile.compile_cubin = _compile_cubin
        _depth += 1
        stats = _stats
    try:
        yield stats
    finally:
        with _STATE:
            _depth -= 1
            if _depth == 0:
                _compile.compile_cubin = _original
                _runs.clear()
                _original = _slots = _stats = None
