"""DeepGEMM's ``cublaslt_gemm_{nt,nn,tn,tt}``: cuBLAS through torch, on whichever backend the call is routed to.

DeepGEMM's op is its cuBLASLt baseline: ``D = A @ B.T (+ C)`` of bare bf16 or float8_e4m3fn operands (FP8 data
without scales), accumulated in fp32 and rounded once into ``d`` (bf16 or fp32). There is no kernel of ours to
run, so every backend registers this one implementation (:func:`register`: ``pytorch`` here, ``cutile`` and ``gluon``
when their packages import), and a call routed to any backend runs it and never falls back: on CUDA tensors it calls
cuBLAS through torch (``torch.mm`` with an fp32 output for bf16, ``torch._scaled_mm`` with unit scales for FP8); on
the CPU it is the exact fp32 product. Operands arrive in the logical ``nt`` form (``ops/checks/``): A [M, K],
B [N, K].
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import register_impl
from tilegemm.ops.reference._common import epilogue, exact_matmul

FP8 = torch.float8_e4m3fn


def _cuda_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 ``a @ b.T`` of bf16 CUDA tensors by cuBLAS (fp32 accumulation, no intermediate rounding)."""
    try:
        return torch.mm(a, b.t(), out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):  # a torch without mm's out_dtype
        return torch.mm(a, b.t()).float()


def _cuda_fp8(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 ``a @ b.T`` of float8_e4m3fn CUDA tensors by cuBLAS's FP8 GEMM with unit scales.

    cuBLAS's FP8 path wants A row-major and B column-major with M, N, K multiples of 16; other shapes, and GPUs
    without FP8 tensor cores, take the fp32 product of the upcast values (FP8 products are exact in fp32).
    """
    (m, k), n = a.shape, b.shape[0]
    if k % 16 == 0 and n % 16 == 0 and m % 16 == 0 and torch.cuda.get_device_capability(a.device) >= (8, 9):
        one = torch.ones((), dtype=torch.float32, device=a.device)
        try:
            return torch._scaled_mm(
                a.contiguous(), b.contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.float32
            )
        except RuntimeError:
            pass
    return exact_matmul(a.float(), b.float().t())


def cublaslt_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None, stream) -> torch.Tensor:
    """``d = a @ b.T (+ c)`` for logical ``a`` [M, K], ``b`` [N, K] (both bf16 or both float8_e4m3fn), rounded once.

    CUDA tensors go through cuBLAS (via torch); CPU tensors get the exact fp32 product. ``c`` may be ``d``.
    """
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    if m == 0 or n == 0:
        return d
    if k == 0:
        acc = torch.zeros((m, n), dtype=torch.float32, device=d.device)
    elif a.is_cuda:
        acc = _cuda_fp8(a, b) if a.dtype == FP8 else _cuda_bf16(a, b)
    else:
        acc = exact_matmul(a.float(), b.float().t())
    return epilogue(d, acc, c, 1.0, 1.0)


OPS = ("cublaslt_gemm_nt", "cublaslt_gemm_nn", "cublaslt_gemm_tn", "cublaslt_gemm_tt")


def register(backend: str) -> None:
    """Register :func:`cublaslt_gemm` as ``backend``'s implementation of every op of :data:`OPS` (each backend's
    package calls this when it imports)."""
    for op in OPS:
        register_impl(op, backend)(cublaslt_gemm)


register("pytorch")
