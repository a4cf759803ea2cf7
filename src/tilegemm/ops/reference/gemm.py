"""Dense GEMMs of the ``pytorch`` backend: BF16, FP8, skip-head-mid FP8, and the TF32 pre-norm GEMM.

Every layout reaches here in the logical ``nt`` form (``ops/checks/`` collapses them): A [M, K],
B [N, K], ``D = alpha * A @ B.T + beta * C`` computed in fp32 on the inputs' device and rounded
once into ``d``. FP8 operands are dequantized with their fp32 scales first (1x128 LHS; 128x128 or
1x128 RHS), which is the block-scaled formula of docs/design.md up to fp32 rounding.
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import register_impl
from tilegemm.ops.common import write_head_splits
from tilegemm.ops.reference._common import SCALE_K, dequant, epilogue, exact_matmul


def dense_bf16(a, b, d, c, alpha, beta, stream):
    """Reference BF16 GEMM (any layout, logical form): fp32 product of the inputs, one rounding into ``d``."""
    acc = exact_matmul(a.float(), b.float().t())
    return epilogue(d, acc, c, alpha, beta)


def fp8_product(a, b, recipe) -> torch.Tensor:
    """fp32 ``A @ B.T`` of the dequantized logical operands ``(data, scales)`` under ``recipe``."""
    (a_data, sa), (b_data, sb) = a, b
    return exact_matmul(dequant(a_data, sa, 1, SCALE_K), dequant(b_data, sb, recipe[1], SCALE_K).t())


def dense_fp8(a, b, d, c, recipe, alpha, beta, stream):
    """Reference FP8 GEMM (any layout, logical form): fp32 product of the dequantized operands."""
    return epilogue(d, fp8_product(a, b, recipe), c, alpha, beta)


for _op in ("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt"):
    register_impl(_op, "pytorch")(dense_bf16)
for _op in ("fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt"):
    register_impl(_op, "pytorch")(dense_fp8)
del _op


@register_impl("fp8_gemm_nt_skip_head_mid", "pytorch")
def fp8_gemm_nt_skip_head_mid(a, b, d, head_splits, recipe, stream):
    """Reference skip-head-mid GEMM: the FP8 ``nt`` product rounded once, placed around each head's gap."""
    return write_head_splits(d, fp8_product(a, b, recipe).to(d.dtype), head_splits)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` rounded to TF32 (10 mantissa bits), to nearest with ties away from zero (``cvt.rna``)."""
    bits = x.float().contiguous().view(torch.int32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = (bits + 0x1000) & ~0x1FFF
    return torch.where(finite, rounded, bits).view(torch.float32)


@register_impl("tf32_hc_prenorm_gemm", "pytorch")
def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits, stream):
    """Reference pre-norm GEMM: ``a @ tf32(b).T`` and ``sum_k a^2`` in fp32; K split evenly for ``num_splits``."""
    a32, b32 = a.float(), round_to_tf32(b)
    if num_splits is None:
        d.copy_(exact_matmul(a32, b32.t()))
        sqr_sum.copy_(a32.square().sum(-1))
        return d
    k = a.shape[1]
    step = -(-k // num_splits)
    for s in range(num_splits):
        k0, k1 = min(k, s * step), min(k, (s + 1) * step)
        d[s].copy_(exact_matmul(a32[:, k0:k1], b32[:, k0:k1].t()))
        sqr_sum[s].copy_(a32[:, k0:k1].square().sum(-1))
    return d
