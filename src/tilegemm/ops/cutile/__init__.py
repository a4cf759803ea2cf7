"""The ``cutile`` backend: cuTile Python kernels, one module per kernel family."""

import cuda.tile  # noqa: F401  (fail early: the registry records why cutile is unavailable)

# Each kernel-family module registers its cutile implementations when imported:
# gemm (dense GEMMs), grouped (m-/k-grouped GEMMs), moe / moe_fp8 (fused MoE experts, BF16 / FP8), moe_train (the
# BF16 experts' training forward and backward), mqa (MQA logits), mqa_prep (their FP8 operands and paged schedule),
# einsum / fp8_einsum (DeepGEMM's einsum expressions), prenorm (the TF32 hyper-connection pre-norm GEMM),
# norm (the RMSNorm of the transformers patch); DeepGEMM's cuBLAS baseline is the shared implementation below.
# A kernel's function name becomes its symbol, which profilers show: entry points of DeepGEMM's ops carry the
# substrings DeepGEMM's benchmarks filter on ("bf16_gemm", "gemm_", "mqa_logits", "clean_logits",
# "tf32_hc_prenorm_gemm", "bmn_bnk_mn_gemm_impl"); tests/ops/test_deepgemm_compat.py checks them.
from tilegemm.ops.cutile import (  # noqa: E402, F401
    einsum,
    fp8_einsum,
    gemm,
    grouped,
    moe,
    moe_fp8,
    moe_train,
    mqa,
    mqa_prep,
    norm,
    prenorm,
)
from tilegemm.ops.reference import cublaslt  # noqa: E402  (one implementation on every backend: cuBLAS via torch)

cublaslt.register("cutile")
