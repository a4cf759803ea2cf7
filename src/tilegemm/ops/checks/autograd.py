"""Checks of the differentiable functions (``tilegemm.matmul``, ``grouped_matmul``, ``fp8_linear``)."""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.ops.checks.base import BLOCK, _fp8_operand, _same_device, _shape, _tensor
from tilegemm.ops.checks.grouped import check_group_offsets
from tilegemm.ops.common import cdiv


def matmul_check(a: Any, b: Any) -> None:
    """The check of ``tilegemm.matmul``: bf16 ``a [M, K]``, ``b [K, N]`` on one device."""
    _tensor("a", a, (torch.bfloat16,), 2)
    _tensor("b", b, (torch.bfloat16,), 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a [M, K] has shape {list(a.shape)} but b [K, N] has {list(b.shape)}: K differs")
    _same_device(dict(a=a, b=b))


#: The dtypes :func:`tilegemm.grouped_matmul` trains in (fp16/fp32 on the ``pytorch`` backend's exact ops).
GROUPED_MATMUL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def grouped_matmul_check(x: Any, w: Any, offs: Any, transposed: bool = False) -> None:
    """The check of ``tilegemm.grouped_matmul``: ``x [M, K]`` and ``w [G, N, K]`` (``[G, K, N]`` when
    ``transposed``) of one dtype among :data:`GROUPED_MATMUL_DTYPES`, int32 ``offs [G]``.

    The values of ``offs`` (non-decreasing, within ``0..M``) are checked when value checks run and the
    call is not being traced by ``torch.compile``.
    """
    _tensor("x", x, GROUPED_MATMUL_DTYPES, 2)
    _tensor("w", w, GROUPED_MATMUL_DTYPES, 3)
    if w.dtype != x.dtype:
        raise TypeError(f"w: got dtype {w.dtype}, expected x's dtype {x.dtype} (one dtype for x and w)")
    if not isinstance(transposed, bool):
        raise TypeError(f"transposed: got {type(transposed).__name__}, expected bool")
    k_dim, form = (1, "[G, K, N]") if transposed else (2, "[G, N, K]")
    if x.shape[1] != w.shape[k_dim]:
        raise ValueError(f"x [M, K] has shape {list(x.shape)} but w {form} has {list(w.shape)}: K differs")
    _tensor("offs", offs, (torch.int32,), 1)
    _same_device(dict(x=x, w=w, offs=offs))
    if torch.compiler.is_compiling():
        _shape("offs", offs, [w.shape[0]], "[G] cumulative group end rows")
    else:
        check_group_offsets(offs, x.shape[0], w.shape[0], name="offs")


def fp8_weight_check(w_fp8: Any, w: torch.Tensor) -> None:
    """``w_fp8`` is the 128x128-block FP8 copy of ``w [..., N, K]``: ``(float8_e4m3fn [..., N, K], fp32
    [..., ceil(N/128), ceil(K/128)])`` on ``w``'s device."""
    data, scale = _fp8_operand("w_fp8", w_fp8, w.dim())
    _shape("w_fp8[0]", data, list(w.shape), "the shape of w")
    blocks = [*w.shape[:-2], cdiv(w.shape[-2], BLOCK), cdiv(w.shape[-1], BLOCK)]
    _shape("w_fp8[1]", scale, blocks, "one fp32 scale per 128x128 block of w")
    _same_device({"w": w, "w_fp8[0]": data, "w_fp8[1]": scale})


def fp8_linear_check(x: Any, weight: Any, bias: Any) -> None:
    """The check of ``tilegemm.fp8_linear``: bf16 ``x [..., K]``, ``weight [N, K]``, ``bias`` None or bf16 [N]."""
    _tensor("x", x, (torch.bfloat16,), None)
    if x.dim() == 0:
        raise ValueError("x: got a 0-D tensor, expected [..., K]")
    _tensor("weight", weight, (torch.bfloat16,), 2)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., K] has shape {list(x.shape)} but weight [N, K] has {list(weight.shape)}: K differs")
    if bias is not None:
        _tensor("bias", bias, (torch.bfloat16,), 1)
        _shape("bias", bias, [weight.shape[0]], "[N], one per output feature")
    _same_device(dict(x=x, weight=weight, bias=bias))
