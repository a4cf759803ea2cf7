"""DeepGEMM 2.6's ``deep_gemm.utils``: integer helpers, FP8/FP4 casts, scale layouts, distributed helpers.

Code written against ``deep_gemm.utils`` (DeepGEMM's tests, transformers' ``deepgemm`` integration) finds the
same names here: ``tilegemm.utils.math`` (``ceil_div``, ``align``, the FP8 and FP4 casts), ``tilegemm.utils.layout``
(TMA-aligned scale layouts, the contiguous-layout alignment) and ``tilegemm.utils.dist`` (``init_dist``,
``uneven_all_gather``, ``dist_print``).
"""

from tilegemm.utils import layout, math
from tilegemm.utils.dist import dist_print, init_dist, uneven_all_gather
from tilegemm.utils.layout import (  # noqa: F401  (exported as layout.NAMES)
    get_k_alignment_for_contiguous_layout,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_m_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_theoretical_mk_alignment_for_contiguous_layout,
    get_tma_aligned_size,
    set_mk_alignment_for_contiguous_layout,
)
from tilegemm.utils.math import (
    align,
    cast_back_from_fp4,
    ceil_div,
    ceil_to_ue8m0,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp4,
    per_token_cast_to_fp8,
    transpose_packed_fp4,
    unpack_ue8m0_from_int,
)

__all__ = [
    "align",
    "cast_back_from_fp4",
    "ceil_div",
    "ceil_to_ue8m0",
    "dist_print",
    "init_dist",
    "layout",
    "math",
    "pack_ue8m0_to_int",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
    "transpose_packed_fp4",
    "uneven_all_gather",
    "unpack_ue8m0_from_int",
]
__all__ += layout.NAMES
