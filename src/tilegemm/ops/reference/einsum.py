"""Einsum ops of the ``pytorch`` backend: DeepGEMM's BF16 ``einsum`` and ``fp8_einsum`` expressions.

Operands are upcast to fp32 (FP8 ones dequantized with their scales, in the data's orientation),
contracted exactly (:func:`exact_einsum`) and rounded once into ``d`` (plus ``c`` when given).
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import register_impl
from tilegemm.ops.reference._common import SCALE_K, SCALE_MN, dequant, epilogue, exact_einsum


@register_impl("einsum", "pytorch")
def einsum(expr, a, b, d, c, stream):
    """Reference BF16 einsum: fp32 contraction, ``+ c``, one rounding into ``d``."""
    return epilogue(d, exact_einsum(expr, a.float(), b.float()), c, 1.0, 1.0)


def _dequant_fp8_einsum(expr: str, a, b) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 values of ``fp8_einsum``'s operands (scale layouts: ``tilegemm.ops.api.fp8_einsum``)."""
    (a_data, sa), (b_data, sb) = a, b
    if expr == "bhd,bhr->hdr":  # K = b: 128 x 1 scales along the first dim, [B/128, H, X]
        a32 = (a_data.float().flatten(1).t(), sa.flatten(1).t())
        b32 = (b_data.float().flatten(1).t(), sb.flatten(1).t())
        return (
            dequant(*a32, 1, SCALE_K).t().reshape(a_data.shape),
            dequant(*b32, 1, SCALE_K).t().reshape(b_data.shape),
        )
    return dequant(a_data, sa, 1, SCALE_K), dequant(b_data, sb, SCALE_MN, SCALE_K)


@register_impl("fp8_einsum", "pytorch")
def fp8_einsum(expr, a, b, d, c, recipe, stream):
    """Reference FP8 einsum: fp32 contraction of the dequantized operands, ``+ c``, one rounding into ``d``."""
    a32, b32 = _dequant_fp8_einsum(expr, a, b)
    return epilogue(d, exact_einsum(expr, a32, b32), c, 1.0, 1.0)
