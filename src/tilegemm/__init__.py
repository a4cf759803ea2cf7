"""tilegemm: DeepGEMM's MoE GEMM ops (dense, grouped, MQA logits) with cuTile kernels and a PyTorch reference.

Every op is dispatched to a backend (``cutile`` or ``pytorch``); see ``tilegemm.backend``.
This module only re-exports the public API.
"""

from tilegemm.autograd import fp8_linear, grouped_matmul, matmul
from tilegemm.backend.registry import get_available_backends_for_op, list_ops
from tilegemm.backend.selector import get_available_backends, get_current_backend, set_backend, use_backend
from tilegemm.config import get_num_sms, get_tc_util, set_num_sms, set_tc_util
from tilegemm.ops.api import (
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_tn,
    fp8_gemm_tt,
    fp8_mqa_logits,
    fp8_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from tilegemm.quant import (
    get_mk_alignment_for_contiguous_layout,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    per_block_cast_to_fp8,
    per_token_cast_to_fp8,
    transform_sf_into_required_layout,
)
from tilegemm.testing import calc_diff

__version__ = "0.1.0"

__all__ = [
    "bf16_gemm_nn",
    "bf16_gemm_nt",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "calc_diff",
    "fp8_gemm_nn",
    "fp8_linear",
    "fp8_gemm_nt",
    "fp8_gemm_tn",
    "fp8_gemm_tt",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_available_backends",
    "get_available_backends_for_op",
    "get_current_backend",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_tensor",
    "get_num_sms",
    "get_paged_mqa_logits_metadata",
    "get_tc_util",
    "get_tma_aligned_size",
    "grouped_matmul",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "list_ops",
    "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "matmul",
    "per_block_cast_to_fp8",
    "per_token_cast_to_fp8",
    "set_backend",
    "set_num_sms",
    "set_tc_util",
    "transform_sf_into_required_layout",
    "use_backend",
]
