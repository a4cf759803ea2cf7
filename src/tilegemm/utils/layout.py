"""DeepGEMM's ``deep_gemm.utils.layout``: TMA-aligned scale layouts and the contiguous-layout alignment.

The same objects as ``tilegemm``'s top-level names (``tilegemm.quant``, ``tilegemm.config``), under DeepGEMM's module.
"""

from tilegemm.config import (  # noqa: F401  (re-exported: DeepGEMM's deep_gemm.utils.layout names)
    get_mk_alignment_for_contiguous_layout,
    get_theoretical_mk_alignment_for_contiguous_layout,
    set_mk_alignment_for_contiguous_layout,
)
from tilegemm.quant import (  # noqa: F401  (re-exported: DeepGEMM's deep_gemm.utils.layout names)
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
)

#: DeepGEMM's aliases of the contiguous-layout alignment.
get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout

#: This module's names, in order: ``tilegemm.utils`` and ``tilegemm`` export every one of them.
NAMES: tuple[str, ...] = (
    "get_k_alignment_for_contiguous_layout",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_mn_major_tma_aligned_tensor",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "get_tma_aligned_size",
    "set_mk_alignment_for_contiguous_layout",
)
