"""DeepGEMM's ``cublaslt_gemm_*`` on the ``cutile`` backend: cuBLAS through torch, as on every backend
(``tilegemm.ops.reference.cublaslt``), so a call routed here never falls back."""

from tilegemm.backend.registry import register_impl
from tilegemm.ops.reference import cublaslt as shared


def cublaslt_gemm(a, b, d, c, stream):
    """``d = a @ b.T (+ c)`` of logical a [M, K], b [N, K] (bf16 or float8_e4m3fn): the shared implementation."""
    return shared.cublaslt_gemm(a, b, d, c, stream)


for _op in ("cublaslt_gemm_nt", "cublaslt_gemm_nn", "cublaslt_gemm_tn", "cublaslt_gemm_tt"):
    register_impl(_op, "cutile")(cublaslt_gemm)
del _op
