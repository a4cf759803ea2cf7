"""The launch layer every cutile kernel family goes through.

* Where and how wide: :func:`current_stream`, :func:`num_sms`, :func:`persistent_grid` (``SMs * ctas_per_sm``).
* Kernels: :func:`kernel_factory` (a module's cached ``@ct.kernel`` objects by name and compiler hints);
  :func:`trailing` (a kernel's trailing arguments, given by name, in its parameter order).
* Launching: :func:`launch` (a kernel ``tileiras`` rejects becomes :class:`Unsupported`, so the call falls back).
* Operands: one TMA contract, :func:`tma_ready`, and the copies that meet it (:func:`as_row_major`).
* Launch plans: :func:`cached_plan` builds a call's plan once per key (shapes, strides, config, SMs).
* Buffers: :func:`scratch`, cached per device and stream.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import cuda.tile as ct
import torch

from tilegemm import config
from tilegemm.backend import hot_lane
from tilegemm.backend.registry import Unsupported
from tilegemm.ops.common import cdiv
from tilegemm.ops.operands import ALIGN_BYTES as _ALIGN_BYTES
from tilegemm.ops.operands import aligned_copy, as_row_major, tma_ready

__all__ = [
    "current_stream",
    "num_sms",
    "persistent_grid",
    "launch",
    "kernel_factory",
    "trailing",
    "tma_ready",
    "aligned_copy",
    "as_row_major",
    "cached_plan",
    "clear_plans",
    "tensor_key",
    "sms_key",
    "cdiv",
    "scratch",
]


Runner = Callable[..., Any]


_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def current_stream() -> torch.cuda.Stream:
    """The stream kernels run on: the current CUDA stream (the registry has already made ``stream=`` current).

    ``torch.cuda.current_stream()`` without its per-call cost (device-index resolution and a new ``Stream``
    object, a fifth of a small call's host time on an H100 machine): the current stream's id on the current
    device, its ``Stream`` object made once per (id, device).
    """
    stream_id, index, device_type = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())
    stream = _STREAMS.get((stream_id, index))
    if stream is None:
        stream = torch.cuda.Stream(stream_id=stream_id, device_index=index, device_type=device_type)
        _STREAMS[(stream_id, index)] = stream
    return stream


def num_sms() -> int:
    """SMs that persistent kernels may use (``tilegemm.set_num_sms`` or the device's count)."""
    return max(1, config.get_num_sms())


def persistent_grid(units: int, ctas_per_sm: int = 1, sms: int | None = None) -> tuple[int, int, int]:
    """Grid of a persistent kernel over ``units`` work units: ``min(units, sms * ctas_per_sm)`` CTAs, at least one.

    ``sms``: :func:`num_sms` when ``None``.
    """
    sms = num_sms() if sms is None else sms
    return (max(1, min(units, sms * ctas_per_sm)), 1, 1)


def kernel_factory(bodies: dict[str, Callable[..., None]], *, hints: bool = True) -> Callable[..., Any]:
    """``get_kernel(name, num_worker_warps=None, occupancy=None)``: the ``@ct.kernel`` of ``bodies[name]`` with those
    compiler hints, made once per (name, hints). ``hints=False``: ``get_kernel(name)``, the compiler's own choices.
    ``get_kernel.bodies`` is ``bodies``."""

    if hints:

        @functools.cache
        def get_kernel(name: str, num_worker_warps: int | None = None, occupancy: int | None = None) -> Any:
            return ct.kernel(bodies[name], num_worker_warps=num_worker_warps, occupancy=occupancy)

    else:

        @functools.cache
        def get_kernel(name: str) -> Any:
            return ct.kernel(bodies[name])

    get_kernel.bodies = bodies  # type: ignore[attr-defined]  # the kernel functions by name (profiler names, tests)
    return get_kernel


@functools.cache
def _parameters(body: Callable[..., None]) -> tuple[str, ...]:
    return tuple(inspect.signature(body).parameters)


def trailing(body: Callable[..., None], **named: Any) -> list[Any]:
    """The values of ``body``'s last ``len(named)`` parameters (its ``ct.Constant`` tail, say), given by name, in
    the kernel's parameter order: a launch or a compile-gate signature never depends on remembering that order.

    Raises:
        TypeError: ``named`` is not exactly the kernel's last parameters (the message names both).
    """
    params = _parameters(body)
    tail = params[len(params) - len(named) :] if named else ()
    if set(tail) != set(named):
        raise TypeError(f"{body.__name__}: got arguments {sorted(named)}, expected its last parameters {list(tail)}")
    return [named[p] for p in tail]


def launch(kernel: Any, grid: tuple[int, int, int], args: tuple, stream: torch.cuda.Stream | None = None) -> None:
    """Launch a cuTile kernel on ``stream`` (the current stream when ``None``); capturable in CUDA graphs.

    The first launch of a variant JIT-compiles it, specialized on the arguments' strides and alignment,
    so a variant the CPU compile gate did not cover could still fail in ``tileiras``: that failure is
    raised as :class:`Unsupported`, before the kernel has written anything, and the call falls back.
    """
    try:
        ct.launch(current_stream() if stream is None else stream, grid, kernel, args)
    except ct.TileCompilerExecutionError as exc:
        raise Unsupported(f"tileiras could not compile this variant ({str(exc).splitlines()[0]})") from exc


# -------------------------------------------------------------------------------- launch plans

_PLANS: dict[tuple, Runner] = {}


def cached_plan(key: tuple, build: Callable[..., Runner], *args: Any) -> Runner:
    """The launch plan (a runner) stored under ``key``, built by ``build(*args)`` on the first call with it.

    The key must hold everything the plan depends on (see :func:`tensor_key`, :func:`sms_key`): a repeated
    call then only looks its plan up and launches.
    """
    run = _PLANS.get(key)
    if run is None:
        run = _PLANS[key] = build(*args)
    return run


def clear_plans() -> None:
    """Forget every cached launch plan and hot-lane replay (tests; plans are keyed by what they read)."""
    _PLANS.clear()
    hot_lane.clear_hot_lane()


def tensor_key(x: torch.Tensor) -> tuple:
    """What a plan depends on in a tensor: shape, strides, dtype, 16-byte aligned base."""
    return (x.shape, x.stride(), x.dtype, x.data_ptr() % _ALIGN_BYTES == 0)


def sms_key(device: torch.device) -> tuple:
    """What a plan depends on in the machine: the device and the ``set_num_sms`` setting."""
    return (device.index, config._num_sms)


# ------------------------------------------------------------------------------------- buffers

_SCRATCH: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def scratch(device: torch.device, stream: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A cached 1-D ``dtype`` buffer of at least ``numel`` elements for kernels on ``stream`` (its handle).

    Created zero-filled; kernels that use one as counters must leave it zero. One buffer per
    (device, stream, dtype), so kernels sharing it are ordered by their stream. Growing it
    allocates a larger one (at least twice the size) and keeps the old one alive: a CUDA graph
    captured with it still owns valid memory.
    """
    key = (str(device), stream, dtype)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        size = max(numel, 2 * buf.numel() if buf is not None else 0, 1024)
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(size, dtype=dtype, device=device)
        _SCRATCH[key] = buf
    return buf
