"""How every implementation in a benchmark row is timed: the same three numbers for tilegemm and each peer.

* ``first_call_ms``: wall time of the first call (JIT compile / autotune / plan building included),
  synchronised; what a user pays once per new shape.
* ``eager_ms``: the median of single calls as a user makes them (host overhead included), each
  preceded by an L2 flush (a 256 MB buffer zeroed outside the timed region), the calls cycling
  through several input sets (``triton.testing.do_bench``'s method, implemented here so triton is
  not needed).
* ``graph_ms``: kernel-only time: one CUDA graph captures ``calls`` calls cycling through the input
  sets; the replays are timed (L2 flushed before each) and divided by ``calls``.

The input sets are built by :func:`rotation_count`: enough independent copies that one pass over
them moves at least twice the L2 size, so weights are never L2-resident between calls.

:data:`DEVICE` is where the family modules build inputs: ``"cuda"`` for every real run; the CPU
tests set ``"cpu"`` to exercise the row logic through the pytorch backend (wall-clock timing, no
CUDA graphs, numbers meaningless).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Bytes assumed for the last-level cache when sizing input rotation (H100: 50 MB, H200: 60 MB).
L2_BYTES = 64 * 2**20
#: Bytes zeroed before each timed call to evict the L2.
FLUSH_BYTES = 256 * 2**20
#: At most this many input sets per row (memory bound for small problems).
MAX_SETS = 16

#: Device the benchmark inputs live on.
DEVICE = "cuda"

_flush_buf: torch.Tensor | None = None


def sync() -> None:
    """Wait for the device (no-op on the CPU)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    """Return cached device memory between rows (no-op on the CPU)."""
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def rotation_count(set_bytes: int, l2_bytes: int = L2_BYTES, max_sets: int = MAX_SETS) -> int:
    """Number of input sets so that cycling through them moves >= 2x ``l2_bytes`` (1 <= n <= ``max_sets``)."""
    return max(1, min(max_sets, math.ceil(2 * l2_bytes / max(1, set_bytes))))


def _flush() -> None:
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    _flush_buf.zero_()


class Cycler:
    """``fn()`` calls ``call(*sets[i])`` with ``i`` advancing through the sets on each call."""

    def __init__(self, sets: Sequence[Sequence[Any]], call: Callable[..., Any]) -> None:
        self.sets, self.call, self.i = list(sets), call, 0

    def __call__(self) -> Any:
        args = self.sets[self.i]
        self.i = (self.i + 1) % len(self.sets)
        return self.call(*args)


def first_call_ms(fn: Callable[[], Any]) -> float:
    """Wall milliseconds of one synchronised call of ``fn`` (the JIT / first-call cost)."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def _estimate_ms(fn: Callable[[], Any], calls: int = 5) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) / calls, 1e-4)


def _timed_reps(fn: Callable[[], Any], reps: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        _flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _reps_for(once_ms: float, budget_ms: float, min_reps: int = 10, max_reps: int = 300) -> int:
    return max(min_reps, min(max_reps, int(budget_ms / once_ms)))


def eager_ms(fn: Callable[[], Any], budget_ms: float = 60.0, warmup: int = 3) -> float:
    """Median milliseconds of one ``fn()`` call (L2 flushed before each; ``fn`` already warmed up)."""
    for _ in range(warmup):
        fn()
    if DEVICE != "cuda":
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    once = _estimate_ms(fn)
    return statistics.median(_timed_reps(fn, _reps_for(once, budget_ms)))


def graph_ms(fn: Callable[[], Any], calls: int, budget_ms: float = 60.0) -> float:
    """Kernel-only milliseconds per call: ``calls`` calls of ``fn`` captured in one CUDA graph, replays timed.

    Raises whatever capture raises (an implementation that cannot be captured); the caller records why.
    """
    if DEVICE != "cuda":
        raise RuntimeError("CUDA graphs need a GPU")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture stream (lazy init outside the capture)
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    once = _estimate_ms(graph.replay, calls=2)
    times = _timed_reps(graph.replay, _reps_for(once, budget_ms, min_reps=5, max_reps=100))
    del graph
    return statistics.median(times) / calls
