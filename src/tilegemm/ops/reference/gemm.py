"""Dense BF16 and FP8 GEMMs of the ``pytorch`` backend, in the four layouts nt/nn/tn/tt.

``D = alpha * A @ B.T + beta * C`` with A logical [M, K] and B logical [N, K], computed in fp32
on the inputs' device and rounded once into ``d``. FP8 operands are dequantized with their
fp32 scales first (1x128 LHS; 128x128 or 1x128 RHS), which is the block-scaled formula of
docs/design.md up to fp32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilegemm.backend.registry import register_impl
from tilegemm.ops.reference._common import SCALE_K, SCALE_MN, dequant, epilogue, exact_matmul

LAYOUTS = ("nt", "nn", "tn", "tt")


def logical_lhs(a: torch.Tensor, layout: str) -> torch.Tensor:
    """A as [M, K]: ``a`` for ``n*`` layouts, ``a.T`` for ``t*`` layouts (a view)."""
    return a if layout[0] == "n" else a.t()


def logical_rhs(b: torch.Tensor, layout: str) -> torch.Tensor:
    """B as [N, K]: ``b`` for ``*t`` layouts, ``b.T`` for ``*n`` layouts (a view)."""
    return b if layout[1] == "t" else b.t()


def rhs_scale_granularity(sb: torch.Tensor, n: int, recipe: tuple[int, int, int] | None) -> int:
    """Rows of B per RHS scale row: 1 for recipe (1, 1, 128), 128 for (1, 128, 128).

    With ``recipe=None`` it is inferred from ``sb``'s shape: ``[N, ...]`` means per-row unless
    ``N == ceil(N/128)`` (N <= 1), where both readings give the same math.
    """
    if recipe is not None:
        return int(recipe[1])
    return 1 if sb.shape[-2] == n and n > 1 else SCALE_MN


def _dense_bf16(layout: str) -> Callable[..., torch.Tensor]:
    def impl(a, b, d, c, alpha, beta, stream):
        acc = exact_matmul(logical_lhs(a, layout).float(), logical_rhs(b, layout).float().t())
        return epilogue(d, acc, c, alpha, beta)

    impl.__name__ = f"bf16_gemm_{layout}"
    impl.__doc__ = f"Reference ``bf16_gemm_{layout}``: fp32 product of the bf16 inputs, one rounding into ``d``."
    return impl


def _dense_fp8(layout: str) -> Callable[..., torch.Tensor]:
    def impl(a, b, d, c, alpha, beta, recipe, disable_ue8m0_cast, stream):
        (a_data, sa), (b_data, sb) = a, b
        lhs = logical_lhs(a_data, layout)
        rhs = logical_rhs(b_data, layout)
        gran_n = rhs_scale_granularity(sb, rhs.shape[0], recipe)
        acc = exact_matmul(dequant(lhs, sa, 1, SCALE_K), dequant(rhs, sb, gran_n, SCALE_K).t())
        return epilogue(d, acc, c, alpha, beta)

    impl.__name__ = f"fp8_gemm_{layout}"
    impl.__doc__ = f"Reference ``fp8_gemm_{layout}``: fp32 product of the dequantized operands."
    return impl


for _layout in LAYOUTS:
    register_impl(f"bf16_gemm_{_layout}", "pytorch")(_dense_bf16(_layout))
    register_impl(f"fp8_gemm_{_layout}", "pytorch")(_dense_fp8(_layout))
del _layout
