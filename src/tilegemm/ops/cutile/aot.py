"""Ahead-of-time (CPU-only) compilation of cuTile kernels to a cubin, for SASS checks.

No GPU is needed: ``cuda.tile.compilation.export_kernel`` runs ``tileiras`` on the host.
The JIT builds a kernel signature from the real launch arguments; here it is built by
hand, and what matters for the machine code (TMA above all) is that it promises what the
JIT would infer from real, contiguous, 16-byte-aligned tensors: unit stride on the last
dimension, row strides divisible by 16 bytes, a base address aligned to 16 bytes.

How to use it (other kernel families do the same)::

    from tilegemm.ops.cutile import aot
    import cuda.tile as ct

    params = [
        aot.array(ct.float8_e4m3fn, 2),          # an fp8 [M, K] tensor, row-major, 16B aligned
        aot.array(ct.float32, 2),                # an fp32 [M, K/128] tensor
        aot.array(ct.bfloat16, 3),               # a bf16 [G, M, N] tensor
        aot.scalar(ct.int32),                    # a runtime int argument
        aot.scalar(ct.float32),                  # a runtime float argument
        128,                                     # a ct.Constant[int] argument: pass the value
        True,                                    # a ct.Constant[bool] argument
    ]
    cubin = aot.compile_cubin(my_kernel, params, "sm_90")   # bytes; "sm_100" for Blackwell

    from tests.compile_gate.sass import sass_summary              # (tests/compile_gate/sass.py)
    summary = sass_summary(cubin)                            # counts of HGMMA, QGMMA, UTMALDG, LDL, ...

``params`` has one entry per kernel parameter, in order. Compiler options (``num_ctas``,
``occupancy``, ``num_worker_warps``) come from the ``@ct.kernel(...)`` decorator, so compile
each decorated variant you ship. ``compile_cubin`` takes 1-30 s per kernel on one core.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import cuda.tile as ct
from cuda.tile import compilation as cc

__all__ = ["array", "scalar", "signature", "compile_cubin", "ARCHS"]

ARCHS: tuple[str, ...] = ("sm_90", "sm_100")


def array(
    dtype: ct.DType,
    ndim: int,
    *,
    contiguous_last: bool = True,
    align_bytes: int = 16,
    index_dtype: ct.DType = ct.int32,
    alias_groups: Sequence[str] = (),
) -> cc.ArrayConstraint:
    """Constraint for an array argument as the JIT infers it from a real, aligned, row-major tensor.

    Args:
        dtype: element type (``ct.bfloat16``, ``ct.float8_e4m3fn``, ``ct.float32``, ...).
        ndim: rank.
        contiguous_last: promise stride 1 on the last dimension (row-major / K-major data).
        align_bytes: promise that every other stride (in bytes) and the base address are
            multiples of this (16 is what TMA needs).
        index_dtype: integer type of shapes/strides (``ct.int32`` as the JIT uses for
            tensors below 2**31 elements; ``ct.int64`` otherwise).
        alias_groups: arrays sharing a group may alias (``()``: aliases nothing).
    """
    elem_bytes = max(1, dtype.bitwidth // 8)
    div = max(1, align_bytes // elem_bytes)
    strides_div = [div] * ndim
    stride_const: list[int | None] | None = None
    if contiguous_last and ndim > 0:
        stride_const = [None] * (ndim - 1) + [1]
        strides_div[-1] = 1
    return cc.ArrayConstraint(
        dtype,
        ndim,
        index_dtype=index_dtype,
        stride_lower_bound_incl=0,
        alias_groups=tuple(alias_groups),
        may_alias_internally=False,
        stride_constant=stride_const,
        stride_divisible_by=strides_div,
        base_addr_divisible_by=align_bytes,
    )


def scalar(dtype: ct.DType) -> cc.ScalarConstraint:
    """Constraint for a runtime scalar argument (``ct.int32``, ``ct.float32``, ...)."""
    return cc.ScalarConstraint(dtype)


def signature(params: Sequence[Any]) -> cc.KernelSignature:
    """A ``cutile_python_v2`` kernel signature from one constraint (or constant value) per parameter."""
    return cc.KernelSignature(list(params), calling_convention=cc.CallingConvention.cutile_python_v2())


def compile_cubin(kernel: Any, params: Sequence[Any], arch: str) -> bytes:
    """Compile ``kernel`` (a ``@ct.kernel``) for ``arch`` (``"sm_90"``, ``"sm_100"``) and return the cubin.

    ``params``: one entry per kernel parameter, see :func:`array`, :func:`scalar`; a plain
    bool/int/float is the value of a ``ct.Constant`` parameter. Raises the compiler's error
    (``cuda.tile.TileError`` subclasses) if the kernel does not compile.
    """
    buf = io.BytesIO()
    cc.export_kernel(kernel, [signature(params)], buf, gpu_code=arch, output_format="cubin")
    return buf.getvalue()
