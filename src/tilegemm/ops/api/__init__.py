"""Every public op as a ``@dispatch`` stub: DeepGEMM 2.6's signature, defaults and documentation.

The stubs hold no code: ``tilegemm.backend.registry.dispatch`` binds a call to the stub's
signature, runs the op's check from ``ops/checks/`` (one module per op family; it validates the call and
returns its logical form: one layout per family, resolved recipe and alignment) and routes that to a backend
(``ops/reference`` for ``pytorch``, ``ops/cutile`` for ``cutile``). Every op also takes a
keyword-only ``backend=`` that overrides the current backend for that call.

Names, argument names, positional order and defaults are DeepGEMM v2.6.1's (``fp8_fp4_*`` primary,
``fp8_*`` aliases). tilegemm's extensions (``alpha``, ``beta``, ``alignment``, ``stream``, and the
registry's ``backend``) are keyword-only, after DeepGEMM's parameters. Arguments that only steer
DeepGEMM's JIT (``compiled_dims``, ``disable_ue8m0_cast`` with fp32 scales, ``ensure_zero_padding``,
``expected_m_for_psum_layout``, ``use_cublaslt``) are validated and have no effect.

Conventions (DeepGEMM's): layout ``nt`` means A non-transposed, B transposed, so
``D = alpha * A @ B.T + beta * C``; shapes are nt a[M,K] b[N,K], nn a[M,K] b[K,N],
tn a[K,M] b[K,N], tt a[K,M] b[N,K]. An FP8 operand is a tuple ``(float8_e4m3fn data, float32
scales)`` whose scales are in the data's own orientation (a transposed operand's scales are
transposed too). ``c`` is not read when it is ``None`` or ``beta == 0``; ``c`` may be ``d``.
GEMM ops write the caller's ``d`` and return it.

One module per op family (``dense``, ``grouped``, ``mqa``, ``einsum``, ``moe``, ``norm``, ``attention``); every op
is also importable from here. ``__all__`` below is the one list of the public ops: ``tilegemm`` re-exports exactly these
(``tilegemm.__all__`` takes them from it) and the registry takes their aliases from it. ``moe_experts_forward`` and
``moe_experts_backward`` are ops too (``tilegemm.autograd.moe_experts``' two halves) but not public names.
"""

from __future__ import annotations

from tilegemm.backend import registry
from tilegemm.ops.api.attention import (
    sparse_decode_attention,
)
from tilegemm.ops.api.dense import (
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    cublaslt_gemm_nn,
    cublaslt_gemm_nt,
    cublaslt_gemm_tn,
    cublaslt_gemm_tt,
    fp8_fp4_gemm_nn,
    fp8_fp4_gemm_nt,
    fp8_fp4_gemm_tn,
    fp8_fp4_gemm_tt,
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_nt_skip_head_mid,
    fp8_gemm_tn,
    fp8_gemm_tt,
)
from tilegemm.ops.api.einsum import (
    einsum,
    fp8_einsum,
    tf32_hc_prenorm_gemm,
)
from tilegemm.ops.api.grouped import (
    bf16_m_grouped_gemm_nt_masked,
    fp8_m_grouped_gemm_nt_masked,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from tilegemm.ops.api.moe import (  # noqa: F401  (moe_experts_forward and _backward are ops, not public names)
    fp8_moe_experts,
    moe_experts,
    moe_experts_backward,
    moe_experts_forward,
)
from tilegemm.ops.api.mqa import (
    bf16_mqa_logits,
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    fp8_indexer_prepare,
    fp8_mqa_logits,
    fp8_paged_append,
    fp8_paged_mqa_logits,
    fp8_quantize_rows,
    get_paged_mqa_logits_metadata,
    indexer_decode_prepare,
    mqa_logits_batched,
)
from tilegemm.ops.api.norm import (
    rms_norm,
)

__all__ = [
    "bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn", "bf16_gemm_tt", "bf16_m_grouped_gemm_nt_masked", "bf16_mqa_logits",
    "cublaslt_gemm_nn", "cublaslt_gemm_nt", "cublaslt_gemm_tn", "cublaslt_gemm_tt", "einsum", "fp8_einsum",
    "fp8_fp4_gemm_nn", "fp8_fp4_gemm_nt", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt", "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits", "fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_nt_skip_head_mid", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_m_grouped_gemm_nt_masked", "fp8_moe_experts", "fp8_mqa_logits", "fp8_paged_append", "fp8_paged_mqa_logits",
    "fp8_indexer_prepare", "fp8_quantize_rows", "indexer_decode_prepare",
    "get_paged_mqa_logits_metadata", "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous", "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nn_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked", "moe_experts", "mqa_logits_batched", "rms_norm", "sparse_decode_attention",
    "tf32_hc_prenorm_gemm",
]  # fmt: skip

# DeepGEMM's other names of an op (fp8_gemm_nt for fp8_fp4_gemm_nt, ...) name that op wherever an op name is taken
registry.register_aliases({name: globals()[name] for name in __all__})
