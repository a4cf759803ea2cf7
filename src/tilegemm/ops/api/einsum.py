"""Einsum and hyperconnection stubs: BF16 and FP8 einsum, the TF32 pre-norm GEMM (see the package docstring)."""

from __future__ import annotations

import torch

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks

Tensor = torch.Tensor
FP8Operand = tuple[torch.Tensor, torch.Tensor]
Recipe = tuple[int, int, int]

# ------------------------------------------------------------------ einsum, hyperconnection


@dispatch("einsum", check=checks.einsum_check)
def einsum(
    expr: str, a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, use_cublaslt: bool = False, *, stream=None
) -> Tensor:
    """BF16 batched contractions by DeepGEMM's expression names; writes and returns ``d``.

    ``"bmk,bnk->mn"``: a [S, M, K], b [S, N, K], ``d [M, N] = sum_s a[s] @ b[s].T (+ c)``;
    ``"bhr,hdr->bhd"``: a [B, H, R], b [H, D, R], ``d[b, h] = b[h] @ a[b, h]``;
    ``"bhd,hdr->bhr"``: a [B, H, D], b [H, D, R], ``d[b, h] = a[b, h] @ b[h]``.
    Accumulated in fp32, rounded once into ``d`` (bf16, or fp32). ``c`` (``d``'s dtype and shape) is added
    when given (DeepGEMM takes it for ``bmk,bnk->mn`` only, fp32 with ``c`` = ``d``).
    ``use_cublaslt``: DeepGEMM's kernel choice; no effect.
    """


@dispatch("fp8_einsum", check=checks.fp8_einsum_check)
def fp8_einsum(
    expr: str,
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    recipe: Recipe = (1, 128, 128),
    *,
    stream=None,
) -> Tensor:
    """FP8 batched contractions (DeepGEMM's ``fp8_einsum``); writes and returns ``d``.

    ``"bhr,hdr->bhd"`` and ``"bhd,hdr->bhr"`` (recipe ``(1, 128, 128)``): a ``(fp8 [B, H, K], fp32
    [B, H, K/128])`` with K = R or D; b ``(fp8 [H, D, R], fp32 [H, D/128, R/128])``.
    ``"bhd,bhr->hdr"`` (recipe ``(1, 1, 128)``, K = B): a ``(fp8 [B, H, D], fp32 [B/128, H, D])``,
    b ``(fp8 [B, H, R], fp32 [B/128, H, R])``. Scales are in the data's orientation; ``/128`` is ceil.
    ``d = einsum(expr, A, B) (+ c)`` on the dequantized values, fp32 accumulation, rounded once.
    """


@dispatch("tf32_hc_prenorm_gemm", check=checks.tf32_hc_prenorm_gemm_check)
def tf32_hc_prenorm_gemm(
    a: Tensor, b: Tensor, d: Tensor, sqr_sum: Tensor, num_splits: int | None = None, *, stream=None
) -> Tensor:
    """Hyper-connection pre-norm GEMM: ``d = a @ tf32(b).T`` and ``sqr_sum = sum_k a^2``, fp32; returns ``d``.

    Args:
        a: bf16 [M, K].
        b: fp32 [N, K], rounded to TF32 (10 mantissa bits, to nearest) as DeepGEMM's tensor cores read it.
        d: fp32 [M, N], or [num_splits, M, N] of partial sums over K splits.
        sqr_sum: fp32 [M], or [num_splits, M] of partial sums.
        num_splits: ``None``, or the number of K splits (the split points are the implementation's;
            only the sum over splits is defined).
        stream: CUDA stream (``None``: current).
    """
