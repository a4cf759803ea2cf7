"""TMA descriptors and the fast relaunch shared by the gluon kernels' host code.

A kernel's first launch of a plan goes through triton's JIT with :class:`TensorDescriptor` arguments (it compiles
and caches the kernel); every later launch of the same plan goes straight to the compiled kernel's C launcher
(:class:`Relaunch`), skipping the JIT's specialization and cache lookup and, for an address seen before, the
descriptor's encoding. A kernel that builds TMA descriptors on the device needs global scratch memory for them
(128 bytes a descriptor and CTA): its launches take it from torch's caching allocator (:func:`scratch_allocator`
around a launch through triton, the launcher's scratch argument on the direct path).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from triton import knobs
from triton.backends.nvidia.driver import make_tensordesc_arg
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime import _allocation

from tilegemm.ops import operands

GL_DTYPE = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}
"""The gluon element type of each torch dtype the kernels read or write."""

SCALE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
"""Shared layout of the scale boxes: unswizzled rows (a [1, width] box per stage)."""


@functools.cache
def _default_layout(block: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(list(block), GL_DTYPE[dtype])


def operand_layout(block: list[int], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The shared layout a [rows, cols] tile of ``dtype`` takes: the widest swizzle the box allows."""
    return _default_layout(tuple(block), dtype)


def tma_strides(x: torch.Tensor) -> list[int]:
    """``x``'s strides as a TMA descriptor takes them: the stride of a dimension of size 1 is never used, but
    must still be a multiple of 16 bytes."""
    strides = list(x.stride())
    per = operands.ALIGN_BYTES // x.element_size()
    for dim in range(x.dim() - 1):
        if x.shape[dim] == 1:
            strides[dim] = operands.cdiv(x.shape[dim + 1] * strides[dim + 1], per) * per
    return strides


def descriptor(x: torch.Tensor, block: list[int], layout: gl.NVMMASharedLayout | None = None) -> TensorDescriptor:
    """A TMA descriptor over TMA-ready ``x`` whose box is ``block`` (shared layout: ``layout``, else
    :func:`operand_layout`)."""
    layout = layout if layout is not None else operand_layout(block, x.dtype)
    return TensorDescriptor(x, list(x.shape), tma_strides(x), block, layout)


class Bound(NamedTuple):
    """What triton's launcher reads of a tensor descriptor (``TensorDescriptor``'s fields), for launches of an
    already compiled kernel: the block and layout are compiled in."""

    base: torch.Tensor
    shape: list[int]
    strides: list[int]
    padding: str = "zero"
    round_f32_to_tf32: bool = False  # read by triton 3.8's launcher


def scratch_buffer(nbytes: int, device: int) -> torch.Tensor:
    """``nbytes`` of global scratch for one launch on CUDA device ``device``, from torch's caching allocator:
    512-byte aligned (triton asks for at most 128), ordered on the current stream (a launch on another stream
    records it there), in the capturing graph's pool during a capture."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))


def torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator protocol over :func:`scratch_buffer`, on the current device (``alignment`` <= 512 and
    ``stream``, the current one, are implied)."""
    return scratch_buffer(size, torch.cuda.current_device())


@contextlib.contextmanager
def scratch_allocator() -> Iterator[None]:
    """Within the block, launches through triton take their global scratch from :func:`torch_scratch` (triton's
    allocator is a context variable: the caller's own choice, if any, is back after the block)."""
    token = _allocation._allocator.set(torch_scratch)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


def current_stream(device: int) -> int:
    """The handle of ``device``'s current CUDA stream, as triton's launcher takes it."""
    return torch._C._cuda_getCurrentRawStream(device)


class Relaunch:
    """The launches of one compiled kernel on one grid after its first (the plan's), for operands of the plan's
    metadata: ``relaunch(tma_bases, rest, stream)``.

    The kernel's first ``len(shapes)`` parameters are TMA descriptors, over tensors of the fixed ``shapes`` (shape,
    strides); a call gives their base tensors, then every other parameter's value (constexprs included) in order.
    A descriptor is a function of the base address once shape, strides, box and layout are fixed, so each
    parameter's encoded ``CUtensorMap`` is kept by address (up to :attr:`KEPT` a parameter): a weight, or an
    activation buffer a server reuses, is encoded once. The launch goes to triton's C launcher under its
    descriptor wrapper (:func:`_unwrapped`), on ``stream`` (``None``: the current stream of ``device``).

    A kernel with global scratch (descriptors built on the device) gets a fresh buffer of :attr:`scratch` bytes a
    launch from torch's caching allocator, ordered on the launch's stream. Where that wrapper is not one this knows
    (another triton), a launch hook is set (profilers), or the kernel needs profiling scratch, every launch takes
    triton's own path instead: the compiled kernel's ``run`` with :class:`Bound` descriptors (the same launch, each
    descriptor encoded again; its scratch from :func:`scratch_allocator`).
    """

    KEPT = 64

    def __init__(self, compiled: Any, grid: tuple[int, int, int], device: torch.device, shapes: list[tuple]):
        self.compiled, self.grid, self.shapes = compiled, grid, shapes
        self.device = device.index if device.index is not None else 0
        self.direct = _unwrapped(compiled, len(shapes))
        self.kept: list[dict[int, list]] = [{} for _ in shapes]
        per_cta = getattr(compiled.run, "global_scratch_size", 0) * getattr(compiled.run, "num_ctas", 1)
        self.scratch = per_cta * grid[0] * grid[1] * grid[2]
        """Bytes of global scratch a launch needs (0: none)."""

    def __call__(self, tma_bases: tuple[torch.Tensor, ...], rest: tuple, stream: torch.cuda.Stream | None) -> None:
        raw_stream = current_stream(self.device) if stream is None else stream.cuda_stream
        compiled, direct = self.compiled, self.direct
        hooks = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if direct is None or _hooked(hooks[0]) or _hooked(hooks[1]):
            values = (*(Bound(t, *shape) for t, shape in zip(tma_bases, self.shapes)), *rest)
            meta = compiled.launch_metadata(self.grid, raw_stream, *values)
            on_stream = contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
            with scratch_allocator() if self.scratch else contextlib.nullcontext(), on_stream:
                compiled.run(*self.grid, raw_stream, compiled.function, compiled.packed_metadata, meta, *hooks, *values)
            return
        scratch = None
        if self.scratch:
            scratch = scratch_buffer(self.scratch, self.device)
            if stream is not None:
                scratch.record_stream(stream)
        args = []
        for i, t in enumerate(tma_bases):
            kept = self.kept[i]
            expanded = kept.get(t.data_ptr())
            if expanded is None:
                if len(kept) >= self.KEPT:
                    kept.clear()
                expanded = kept[t.data_ptr()] = direct.encode(Bound(t, *self.shapes[i]), direct.meta[i])
            args += expanded
        run = compiled.run
        if direct.listed:
            direct.launcher(*self.grid, raw_stream, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                            compiled.packed_metadata, None, None, None, scratch, None, run.arg_annotations,
                            run.kernel_signature, [*args, *rest])  # fmt: skip
        else:
            direct.launcher(*self.grid, raw_stream, compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                            scratch, None, compiled.packed_metadata, None, None, None, *args, *rest)  # fmt: skip


def _hooked(hook: Any) -> bool:
    """Whether a launch hook would run: one is set (triton 3.6 keeps each as a chain of hooks, empty when none is)."""
    return hook is not None and bool(getattr(hook, "calls", True))


class DirectLaunch(NamedTuple):
    """How :class:`Relaunch` calls triton's C launcher of one compiled kernel without its descriptor wrapper."""

    launcher: Any
    """The C launcher the wrapper calls."""
    meta: list
    """The wrapper's metadata of each descriptor parameter, in order."""
    encode: Callable[[Bound, dict], list]
    """A descriptor's launcher arguments from its :class:`Bound` and metadata (``CUtensorMap``, shape, strides)."""
    listed: bool
    """The launcher takes the kernel's arguments as one list after the base ones, with the argument annotations and
    kernel signature before it (triton 3.7 to 3.9); else spread after them (3.6)."""


def _unwrapped(compiled: Any, descriptors: int) -> DirectLaunch | None:
    """How to launch ``compiled`` straight through triton's C launcher, when its first ``descriptors`` parameters are
    its only descriptors, every one with metadata, the kernel needs no profiling scratch (nor the sanitizer of 3.8
    and 3.9), and its launch wrapper is one of these: triton 3.6's ``wrap_handle_tensordesc`` (the kernel's arguments
    spread after the base ones: it reads ``_BASE_ARGS_FORMAT_LEN``), 3.7's (the same closure; the arguments as one
    list), the ``wrap_handle_tensordesc_impl`` of 3.8 and 3.9 (its own encoder; top-level descriptors only), or, for
    a kernel without descriptors, the launcher itself. Else ``None``: every launch takes triton's own path."""
    run = compiled.run
    wrapper = getattr(run, "launch", None)
    if wrapper is None or getattr(run, "profile_scratch_size", 1):
        return None
    if getattr(run, "gsan_enabled", False):
        return None
    listed = hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature")
    code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    if code is None:  # no wrapper: triton hands the launcher over as is when no parameter is a descriptor
        if descriptors or not callable(wrapper):
            return None
        return DirectLaunch(wrapper, [], make_tensordesc_arg, listed)
    if cells is None:
        return None
    found = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
    if set(found) == {"launcher", "tensordesc_indices", "tensordesc_meta"}:
        spread = "_BASE_ARGS_FORMAT_LEN" in code.co_names
        if spread == listed:  # 3.6's wrapper beside 3.7's launcher, or the reverse: not a known pair
            return None
        indices, encode = found["tensordesc_indices"], make_tensordesc_arg
    elif set(found) == {"launcher", "signature", "relevant_paths", "tensordesc_meta", "make_tensordesc_arg"}:
        paths, encode_with_base = found["relevant_paths"], found["make_tensordesc_arg"]
        if not listed or any(paths.values()):  # a descriptor inside a tuple parameter
            return None
        indices = set(paths)

        def encode(arg: Bound, meta: dict) -> list:
            return encode_with_base(arg, meta, None)  # the launcher's base arguments: unused by the CUDA backend

    else:
        return None
    meta = found["tensordesc_meta"]
    if indices != set(range(descriptors)) or not meta or any(m is None for m in meta):
        return None
    return DirectLaunch(found["launcher"], list(meta), encode, listed)
