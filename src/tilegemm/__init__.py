"""tilegemm: DeepGEMM 2.6's API (dense, grouped, MQA-logits GEMMs) in cuTile and Gluon kernels, and a PyTorch reference.

``import tilegemm as deep_gemm`` gives DeepGEMM's names, arguments and defaults (each op's docstring says what
it accepts without effect and what raises; the project's docs/deepgemm.md in the source repository lists them all).
Every op is dispatched to a backend (``gluon``, ``cutile`` or ``pytorch``); see ``tilegemm.backend.selector``. This
module only re-exports the public API.
"""

from tilegemm import testing, utils  # DeepGEMM's deep_gemm.testing and deep_gemm.utils
from tilegemm.autograd import fp8_grouped_matmul, fp8_linear, grouped_matmul, matmul
from tilegemm.backend.registry import get_available_backends_for_op, list_ops
from tilegemm.backend.selector import get_available_backends, get_current_backend, set_backend, use_backend
from tilegemm.config import (  # noqa: F401  (the layout helpers among them: exported as utils.layout.NAMES)
    get_mk_alignment_for_contiguous_layout,
    get_num_sms,
    get_pdl,
    get_tc_util,
    get_theoretical_mk_alignment_for_contiguous_layout,
    set_block_size_multiple_of,
    set_ignore_compile_dims,
    set_mk_alignment_for_contiguous_layout,
    set_num_sms,
    set_pdl,
    set_tc_util,
)
from tilegemm.mega import bf16_mega_moe, fp8_fp4_mega_moe, get_symm_buffer_for_mega_moe, transform_weights_for_mega_moe
from tilegemm.ops import api as _api
from tilegemm.ops.api import *  # noqa: F403  (every public op; their one list is tilegemm.ops.api.__all__)
from tilegemm.quant import (  # noqa: F401  (the layout helpers among them: exported as utils.layout.NAMES)
    ceil_to_ue8m0,
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_token_cast_to_fp8,
    transform_sf_into_required_layout,
)
from tilegemm.testing import calc_diff
from tilegemm.warmup import precompile

#: DeepGEMM's aliases of the contiguous-layout alignment.
get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout

__version__ = "0.1.0"

#: Every public name: the ops (``tilegemm.ops.api.__all__``, where a new op is listed), DeepGEMM's layout helpers
#: (``tilegemm.utils.layout.NAMES``) and the rest, listed here.
__all__ = [
    "bf16_mega_moe",
    "calc_diff",
    "ceil_to_ue8m0",
    "fp8_fp4_mega_moe",
    "fp8_grouped_matmul",
    "fp8_linear",
    "get_available_backends",
    "get_available_backends_for_op",
    "get_current_backend",
    "get_num_sms",
    "get_pdl",
    "get_symm_buffer_for_mega_moe",
    "get_tc_util",
    "grouped_matmul",
    "list_ops",
    "matmul",
    "pack_ue8m0_to_int",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_token_cast_to_fp8",
    "precompile",
    "set_backend",
    "set_block_size_multiple_of",
    "set_ignore_compile_dims",
    "set_num_sms",
    "set_pdl",
    "set_tc_util",
    "testing",
    "transform_sf_into_required_layout",
    "transform_weights_for_mega_moe",
    "use_backend",
    "utils",
]
__all__ += _api.__all__
__all__ += utils.layout.NAMES
del _api
