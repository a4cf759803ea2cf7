"""DeepGEMM's timing helpers (``deep_gemm.testing.bench`` / ``bench_kineto``): CUDA events or profiler kernel rows.

* :func:`bench`: seconds per call of ``fn`` from CUDA events around ``num_tests`` back-to-back calls (L2 flushed once).
* :func:`bench_kineto`: seconds per launch of the kernels whose names contain a given substring, read from
  ``torch.profiler``'s CUDA kernel rows over ``num_tests`` calls (L2 flushed before each call by default). A
  substring that no kernel matches gives 0, as in DeepGEMM; tilegemm names its kernels after their ops so that
  DeepGEMM's filters (``"bf16_gemm"``, ``"gemm_"``, ``"mqa_logits"``, ...) find them.
* :class:`suppress_stdout_stderr` / :class:`empty_suppress`: silence (or not) the process's stdout and stderr.

``DG_USE_NVIDIA_TOOLS=1`` (Nsight or compute-sanitizer running) makes :func:`bench_kineto` skip profiling and
return 1 per name, as DeepGEMM's does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch


def bench(fn: Callable[[], Any], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Mean seconds per call of ``fn`` (CUDA events around ``num_tests`` calls after ``num_warmups``).

    A 256 MB buffer is zeroed first (L2 flush); with ``high_precision`` an 8192^3 fp32 GEMM runs before the timed
    calls so that their launches queue behind it and host overhead drops out.
    """
    torch.cuda.synchronize()
    torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda").zero_()
    for _ in range(num_warmups):
        fn()
    if high_precision:
        x = torch.randn((8192, 8192), dtype=torch.float32, device="cuda")
        x @ x
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(num_tests):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / num_tests / 1e3


class empty_suppress:  # noqa: N801  (DeepGEMM's name)
    """A context manager that does nothing (the ``suppress_kineto_output=False`` case)."""

    def __enter__(self) -> empty_suppress:
        return self

    def __exit__(self, *_: Any) -> None:
        return None


class suppress_stdout_stderr:  # noqa: N801  (DeepGEMM's name)
    """Send the process's stdout and stderr (file descriptors 1 and 2 and ``sys.stdout``/``sys.stderr``) to
    ``/dev/null`` inside the block, so that output of native code (the profiler's) is silenced too."""

    def __enter__(self) -> suppress_stdout_stderr:
        self._null = open(os.devnull, "w")  # noqa: SIM115
        self._saved = [(fd, os.dup(fd)) for fd in (sys.stdout.fileno(), sys.stderr.fileno())]
        self._streams = sys.stdout, sys.stderr
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, _ in self._saved:
            os.dup2(self._null.fileno(), fd)
        sys.stdout = sys.stderr = self._null
        return self

    def __exit__(self, *_: Any) -> None:
        sys.stdout, sys.stderr = self._streams
        for fd, saved in self._saved:
            os.dup2(saved, fd)
            os.close(saved)
        self._null.close()


def kernel_rows(profiler: Any) -> list[tuple[str, float, int]]:
    """``(kernel name, total device seconds, launches)`` of every GPU kernel a finished ``torch.profiler`` saw."""
    rows = []
    for evt in profiler.key_averages():
        device_us = getattr(evt, "device_time_total", None)
        if device_us is None:
            device_us = getattr(evt, "cuda_time_total", 0.0)
        if evt.device_type == torch.autograd.DeviceType.CUDA and device_us > 0:
            rows.append((evt.key, device_us / 1e6, evt.count))
    return rows


def match_kernels(
    rows: list[tuple[str, float, int]], names: tuple[str, ...], with_multiple_kernels: bool = False
) -> list[float]:
    """Per substring of ``names``: total seconds / launches over the ``rows`` whose kernel name contains it (0 when
    none does). Unless ``with_multiple_kernels``, a substring found in two distinct kernel names is an error."""
    times = []
    for name in names:
        hits = [(t, n) for key, t, n in rows if name in key]
        if len(hits) > 1 and not with_multiple_kernels:
            found = [key for key, _, _ in rows if name in key]
            raise AssertionError(f"kernel name filter {name!r} matches {len(hits)} kernels: {found}")
        launches = sum(n for _, n in hits)
        times.append(sum(t for t, _ in hits) / launches if launches else 0.0)
    return times


def bench_kineto(
    fn: Callable[[], Any],
    kernel_names: str | tuple[str, ...],
    num_tests: int = 30,
    suppress_kineto_output: bool = False,
    trace_path: str | None = None,
    flush_l2: bool = True,
    with_multiple_kernels: bool = False,
    barrier: Callable[[], Any] | None = None,
) -> float | tuple[float, ...]:
    """Seconds per launch of the kernels whose names contain ``kernel_names`` (a str, or a tuple of them), over
    ``num_tests`` calls of ``fn`` under ``torch.profiler`` (one warm-up call first, one profiled warm-up round).

    ``flush_l2``: zero an 8 GB buffer before each call. ``barrier``: called before each call after a ~10 ms GPU
    sleep (multi-rank runs). ``trace_path``: also write a Chrome trace. Returns a float for a str, a tuple for a
    tuple.
    """
    if not isinstance(kernel_names, (str, tuple)):
        raise TypeError(f"kernel_names: got {type(kernel_names).__name__}, expected a str or a tuple of str")
    names = (kernel_names,) if isinstance(kernel_names, str) else kernel_names
    if int(os.environ.get("DG_USE_NVIDIA_TOOLS", "0")):
        return (1,) * len(names) if isinstance(kernel_names, tuple) else 1
    flush_elems = int(8e9 // 4)
    fn()
    suppress = suppress_stdout_stderr if suppress_kineto_output else empty_suppress
    with suppress():
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], schedule=schedule)
        with profiler:
            for _ in range(2):
                for _ in range(num_tests):
                    if flush_l2:
                        torch.empty(flush_elems, dtype=torch.int32, device="cuda").zero_()
                    if barrier is not None:
                        torch.cuda._sleep(int(2e7))
                        barrier()
                    fn()
                torch.cuda.synchronize()
                profiler.step()
    if trace_path is not None:
        profiler.export_chrome_trace(trace_path)
    times = match_kernels(kernel_rows(profiler), names, with_multiple_kernels)
    return tuple(times) if isinstance(kernel_names, tuple) else times[0]
