"""TMA descriptors and the fast relaunch shared by the gluon kernels' host code.

A kernel's first launch of a plan goes through triton's JIT with :class:`TensorDescriptor` arguments (it compiles
and caches the kernel); every later launch of the same plan goes straight to the compiled kernel's launcher
(:func:`launch`) with :class:`Bound` descriptors, skipping the JIT's specialization and cache lookup.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
from triton import knobs
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

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


def bound(x: torch.Tensor) -> Bound:
    """``x`` as a relaunch takes a descriptor over it (its box and layout are the compiled kernel's)."""
    return Bound(x, list(x.shape), tma_strides(x))


def launch(compiled: Any, grid: tuple[int, int, int], values: tuple, stream: torch.cuda.Stream | None) -> None:
    """Launch an already compiled kernel with every parameter's value, in order, on ``stream`` (the current stream
    when ``None``): straight to triton's launcher, without the JIT's per-call specialization and cache lookup."""
    stream = (torch.cuda.current_stream() if stream is None else stream).cuda_stream
    hooks = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    meta = compiled.launch_metadata(grid, stream, *values)
    compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, meta, *hooks, *values)
