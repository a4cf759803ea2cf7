"""Input validation shared by all backends; runs in the dispatch wrapper before any backend.

One module per op family (``dense``, ``grouped``, ``mqa``, ``mqa_prep`` (the MQA ops' operands), ``einsum``,
``norm``, ``moe``), the checks of the library's other entry points (``autograd``, ``quant``, ``testing``), what they
are built from (``base``) and the hot-lane keys (``hot``); every name is also importable from here.

Each op's check validates the call and returns what it derived, which is what the backends
receive (they trust it and never check again):

* the logical form of the operands: every layout collapses here into one form per family, as
  DeepGEMM's own ``nn``/``tn``/``tt`` ops call ``nt`` on transposed views. A transposed operand's
  FP8 scales are in the data's own orientation, so the logical form is a plain transpose of data
  and scales together (dense: a [M, K], b [N, K]; m-grouped: b [G, N, K]; k-grouped: the ``tn``
  form a [K_sum, M], b [K_sum, N]);
* resolved settings: the FP8 recipe, the psum alignment;
* nothing that only steers DeepGEMM's JIT (``compiled_dims``, ...): those are validated and dropped.

Errors name the argument, what it got and what it needs: ``TypeError`` for a wrong type or
dtype, ``ValueError`` for shape, device, range and value faults, ``NotImplementedError`` for
DeepGEMM features tilegemm does not have (FP4 operands, packed UE8M0 scales, SM100-only paths).
Nothing is written before a check fails.

Two kinds of check:

* metadata (types, dtypes, shapes, devices): free, always on;
* values (index ranges, alignment, ``grouped_layout == ks_cpu``, MQA windows, block tables): they
  read tensor memory. On CPU tensors they always run (free). On CUDA tensors they cost a host
  sync, so they are off by default and run only with ``TILEGEMM_CHECK_VALUES=1``, never during
  CUDA-graph capture. Inside :func:`skip_value_checks` (internal callers that built the indices
  themselves) they never run.
"""

from tilegemm.ops.checks.attention import sparse_decode_attention_check, sparse_decode_attention_signature
from tilegemm.ops.checks.autograd import (
    GROUPED_MATMUL_DTYPES,
    fp8_linear_check,
    fp8_weight_check,
    grouped_matmul_check,
    matmul_check,
)
from tilegemm.ops.checks.base import (
    BLOCK,
    FLOATS,
    FP8,
    INT32_MAX,
    LAYOUT_SHAPES,
    LAYOUTS,
    M_ALIGNMENT,
    OUT_DTYPES,
    RECIPES,
    allow_float_operands,
    resolve_recipe,
    skip_value_checks,
    value_checks_enabled,
)
from tilegemm.ops.checks.dense import cublaslt_gemm_check, dense_gemm_check, dense_gemm_signature, skip_head_mid_check
from tilegemm.ops.checks.einsum import (
    EINSUM_EXPRS,
    FP8_EINSUM_EXPRS,
    einsum_check,
    fp8_einsum_check,
    tf32_hc_prenorm_gemm_check,
)
from tilegemm.ops.checks.grouped import (
    check_group_offsets,
    k_grouped_check,
    m_grouped_contiguous_check,
    m_grouped_contiguous_signature,
    m_grouped_masked_check,
    resolve_alignment,
)
from tilegemm.ops.checks.hot import HotLane
from tilegemm.ops.checks.moe import (
    MOE_ACTIVATIONS,
    fp8_moe_experts_check,
    moe_experts_backward_check,
    moe_experts_check,
)
from tilegemm.ops.checks.mqa import (
    LOGITS_DTYPES,
    bf16_mqa_logits_check,
    mqa_logits_batched_check,
    mqa_logits_batched_signature,
    mqa_logits_check,
    mqa_logits_signature,
    paged_mqa_logits_check,
    paged_mqa_logits_signature,
    paged_mqa_metadata_check,
    paged_mqa_metadata_signature,
    visible_lengths,
)
from tilegemm.ops.checks.mqa_prep import (
    fp8_indexer_prepare_check,
    fp8_indexer_prepare_signature,
    fp8_paged_append_check,
    fp8_quantize_rows_check,
    indexer_decode_prepare_check,
    indexer_decode_prepare_signature,
)
from tilegemm.ops.checks.norm import rms_norm_check
from tilegemm.ops.checks.quant import (
    ceil_to_ue8m0_check,
    k_grouped_ue8m0_check,
    pack_ue8m0_check,
    quant_input_check,
    scale_tensor_check,
    tma_aligned_size_check,
    transform_sf_check,
)
from tilegemm.ops.checks.testing import calc_diff_check

__all__ = [
    "BLOCK", "EINSUM_EXPRS", "FLOATS", "FP8", "FP8_EINSUM_EXPRS", "GROUPED_MATMUL_DTYPES", "INT32_MAX",
    "LAYOUTS", "LAYOUT_SHAPES", "LOGITS_DTYPES", "MOE_ACTIVATIONS", "M_ALIGNMENT", "OUT_DTYPES", "RECIPES",
    "HotLane", "allow_float_operands", "bf16_mqa_logits_check", "calc_diff_check", "ceil_to_ue8m0_check",
    "fp8_indexer_prepare_check", "fp8_indexer_prepare_signature",
    "indexer_decode_prepare_check", "indexer_decode_prepare_signature", "fp8_paged_append_check",
    "fp8_quantize_rows_check",
    "check_group_offsets",
    "cublaslt_gemm_check", "dense_gemm_check", "dense_gemm_signature", "einsum_check", "fp8_einsum_check",
    "fp8_linear_check",
    "fp8_moe_experts_check", "fp8_weight_check", "grouped_matmul_check", "k_grouped_check", "k_grouped_ue8m0_check",
    "m_grouped_contiguous_check", "m_grouped_contiguous_signature", "m_grouped_masked_check", "matmul_check",
    "moe_experts_backward_check",
    "moe_experts_check", "mqa_logits_batched_check", "mqa_logits_batched_signature", "mqa_logits_check",
    "mqa_logits_signature", "pack_ue8m0_check", "paged_mqa_logits_check",
    "paged_mqa_logits_signature", "paged_mqa_metadata_check", "paged_mqa_metadata_signature", "quant_input_check",
    "resolve_alignment",
    "resolve_recipe", "rms_norm_check", "scale_tensor_check", "skip_head_mid_check", "skip_value_checks",
    "sparse_decode_attention_check", "sparse_decode_attention_signature",
    "tf32_hc_prenorm_gemm_check", "tma_aligned_size_check", "transform_sf_check", "value_checks_enabled",
    "visible_lengths",
]  # fmt: skip
