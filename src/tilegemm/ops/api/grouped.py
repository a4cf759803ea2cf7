"""Grouped GEMM stubs: m-grouped contiguous and masked, k-grouped (see the package docstring)."""

from __future__ import annotations

import inspect
from typing import Any

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks
from tilegemm.ops.api._stubs import FP8Operand, Recipe, Tensor, fp8_form, op

# ------------------------------------------------------------------ m-grouped contiguous

_M_GROUPED_DOC = """
        grouped_layout: int32 on a's device. Default layout: ``[M_sum]``, row r's group, ``-1`` for
            padding rows; every 128-row block is one group or all padding. With ``use_psum_layout=True``:
            ``[G]`` cumulative group ends (DeepGEMM's psum layout): group g is rows
            ``[align(ends[g-1], alignment), ends[g])`` (group 0 starts at row 0).
        compiled_dims: DeepGEMM's JIT hint; no effect.
        use_psum_layout: read ``grouped_layout`` as cumulative group ends.
        ensure_zero_padding: accepted for DeepGEMM compatibility; rows of ``d`` that belong to no group
            (``-1`` rows, psum gaps before an aligned start, rows past the last group) are always written 0.
        alignment: keyword-only extension: the psum group-start alignment; ``None`` means
            ``get_mk_alignment_for_contiguous_layout()`` (128), ``1`` gives ``torch._grouped_mm``'s
            unaligned offsets (group g is exactly ``[ends[g-1], ends[g])``).
        stream: CUDA stream (``None``: current)."""


_M_GROUPED_DOCS = {  # (layout, fp8) -> docstring; {doc}: _M_GROUPED_DOC
    ("nt", False): """M-grouped BF16 GEMM (MoE forward), contiguous rows: ``d[r] = a[r] @ b[group(r)].T``.

    Args:
        a: bf16 [M_sum, K].
        b: bf16 [G, N, K].
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
        expected_m_for_psum_layout: DeepGEMM's host hint for the psum layout; no effect.
    """,
    ("nn", False): """M-grouped BF16 GEMM, contiguous rows, B non-transposed: ``d[r] = a[r] @ b[group(r)]``.

    Args:
        a: bf16 [M_sum, K].
        b: bf16 [G, K, N].
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
    """,
    ("nt", True): """M-grouped FP8 GEMM (MoE forward), contiguous rows, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [M_sum, K], fp32 [M_sum, ceil(K/128)])``.
        b: ``(fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)])``.
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
        recipe, recipe_a, recipe_b: as :func:`fp8_fp4_gemm_nt`; must resolve to ``(1, 128, 128)``.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
        expected_m_for_psum_layout: DeepGEMM's host hint for the psum layout; no effect.

    Math: ``d[r, n] = sum_kb sa[r, kb] * sb[g, n // 128, kb] * sum_(k in kb) A[r, k] * B[g, n, k]``, g = group(r).
    """,
    ("nn", True): """M-grouped FP8 GEMM, contiguous rows, B non-transposed, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [M_sum, K], fp32 [M_sum, ceil(K/128)])``.
        b: ``(fp8 [G, K, N], fp32 [G, ceil(K/128), ceil(N/128)])``: scales in the data's orientation.
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
        recipe, recipe_a, recipe_b: as :func:`fp8_fp4_gemm_nt`; must resolve to ``(1, 128, 128)``.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
    """,
}


def _m_grouped_contiguous(layout: str, *, fp8: bool) -> Any:
    """``m_grouped_fp8_fp4_gemm_<layout>_contiguous`` (``fp8``) or ``m_grouped_bf16_gemm_<layout>_contiguous``;
    DeepGEMM's ``nn`` forms take no ``expected_m_for_psum_layout``."""

    def stub(
        a: Tensor,
        b: Tensor,
        d: Tensor,
        grouped_layout: Tensor,
        compiled_dims: str = "nk",
        use_psum_layout: bool = False,
        ensure_zero_padding: bool = True,
        expected_m_for_psum_layout: int | None = None,
        *,
        alignment: int | None = None,
        stream=None,
    ) -> Tensor: ...

    stub = fp8_form(stub) if fp8 else stub
    if layout == "nn":
        signature = inspect.signature(stub)
        kept = [p for p in signature.parameters.values() if p.name != "expected_m_for_psum_layout"]
        stub.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    name = f"m_grouped_{'fp8_fp4' if fp8 else 'bf16'}_gemm_{layout}_contiguous"
    doc = _M_GROUPED_DOCS[layout, fp8].replace("{doc}", _M_GROUPED_DOC)
    signature = checks.m_grouped_contiguous_signature(layout) if fp8 else None
    return op(name, stub, doc, checks.m_grouped_contiguous_check(layout, fp8=fp8), signature)


m_grouped_bf16_gemm_nt_contiguous = _m_grouped_contiguous("nt", fp8=False)
m_grouped_bf16_gemm_nn_contiguous = _m_grouped_contiguous("nn", fp8=False)
m_grouped_fp8_fp4_gemm_nt_contiguous = _m_grouped_contiguous("nt", fp8=True)
m_grouped_fp8_fp4_gemm_nn_contiguous = _m_grouped_contiguous("nn", fp8=True)

m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous

# ---------------------------------------------------------------------- m-grouped masked


_M_GROUPED_MASKED_DOCS = {  # fp8 -> docstring
    False: """M-grouped BF16 GEMM, masked layout (CUDA-graph MoE decode): ``d[g, :m_g] = a[g, :m_g] @ b[g].T``.

    Args:
        a: bf16 [G, Mmax, K].
        b: bf16 [G, N, K].
        d: bf16 or fp32 [G, Mmax, N], contiguous; rows ``>= masked_m[g]``
            are left as they were (DeepGEMM's kernels may write them).
        masked_m: int32 [G] on the device, valid rows per group, each in ``[0, Mmax]``.
        expected_m: host-side hint of the typical ``masked_m`` (picks the kernel config).
        compiled_dims: DeepGEMM's JIT hint; no effect.
        stream: CUDA stream (``None``: current).
    """,
    True: """M-grouped FP8 GEMM, masked layout, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [G, Mmax, K], fp32 [G, Mmax, ceil(K/128)])``.
        b: ``(fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)])``.
        d: bf16 or fp32 [G, Mmax, N], contiguous; rows ``>= masked_m[g]``
            are left as they were (DeepGEMM's kernels may write them).
        masked_m: int32 [G] on the device, valid rows per group, each in ``[0, Mmax]``.
        expected_m: host-side hint of the typical ``masked_m``.
        recipe, recipe_a, recipe_b: as :func:`fp8_fp4_gemm_nt`; must resolve to ``(1, 128, 128)``.
        compiled_dims: DeepGEMM's JIT hint; no effect.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
        stream: CUDA stream (``None``: current).
    """,
}


def _m_grouped_masked(*, fp8: bool) -> Any:
    """``m_grouped_fp8_fp4_gemm_nt_masked`` (``fp8``) or ``m_grouped_bf16_gemm_nt_masked``."""

    def stub(
        a: Tensor, b: Tensor, d: Tensor, masked_m: Tensor, expected_m: int, compiled_dims: str = "nk", *, stream=None
    ) -> Tensor: ...

    name = f"m_grouped_{'fp8_fp4' if fp8 else 'bf16'}_gemm_nt_masked"
    stub = fp8_form(stub) if fp8 else stub
    return op(name, stub, _M_GROUPED_MASKED_DOCS[fp8], checks.m_grouped_masked_check(fp8=fp8))


m_grouped_bf16_gemm_nt_masked = _m_grouped_masked(fp8=False)
m_grouped_fp8_fp4_gemm_nt_masked = _m_grouped_masked(fp8=True)

m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked

# ----------------------------------------------------------------------------- k-grouped

_K_GROUPED_DOC = """
        ks_cpu: host list of per-group K (0 allowed), ``sum(ks_cpu) == K_sum``.
        grouped_layout: int32 [G] on the device, the mirror of ``ks_cpu`` (checked against it).
        c: optional fp32 [G, M, N] accumulated into the result; may be ``d``.
        compiled_dims: DeepGEMM's JIT hint; no effect.
        use_psum_layout: DeepGEMM's SM100 psum form; ``True`` raises ``NotImplementedError``.
        stream: CUDA stream (``None``: current)."""


@dispatch("k_grouped_bf16_gemm_tn_contiguous", check=checks.k_grouped_check(fp8=False))
def k_grouped_bf16_gemm_tn_contiguous(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    ks_cpu: list[int],
    grouped_layout: Tensor,
    c: Tensor | None = None,
    compiled_dims: str = "mn",
    use_psum_layout: bool = False,
    *,
    stream=None,
) -> Tensor:
    """K-grouped BF16 GEMM (MoE weight gradient): ``d[g] = a_g.T @ b_g (+ c[g])``.

    Group g owns rows ``[sum(ks_cpu[:g]), sum(ks_cpu[:g+1]))`` of ``a`` and ``b``.

    Args:
        a: bf16 [K_sum, M].
        b: bf16 [K_sum, N].
        d: fp32 [G, M, N], contiguous; written and returned (a group with K = 0 gets ``c[g]`` or 0).{doc}
    """


_K_GROUPED_FP8_DOCS = {  # layout -> docstring; {doc}: _K_GROUPED_DOC
    "tn": """K-grouped FP8 GEMM (MoE weight gradient), MN-major operands, 1x128 scales along K on both sides.

    Args:
        a: ``(fp8 [K_sum, M], fp32 [K_sum/128, M])``.
        b: ``(fp8 [K_sum, N], fp32 [K_sum/128, N])``.
        d: fp32 [G, M, N], contiguous; written and returned.{doc}
        recipe: ``(1, 1, 128)`` (the only recipe); every ``ks_cpu[g]`` a multiple of 128.

    Math: ``d[g, m, n] = sum_kb sa[kb, m] * sb[kb, n] * sum_(k in kb) A[k, m] * B[k, n] (+ c[g, m, n])``.
    """,
    "nt": """K-grouped FP8 GEMM with K-major groups (DeepGEMM's SM90 op): ``d[g] = A_g @ B_g.T (+ c[g])``.

    Args:
        a: ``(fp8 data, fp32 [M, K_sum/128])``: the data holds each group's ``[M, K_g]`` block row-major
            (K-major), groups back to back (``sum(ks_cpu) * M`` elements, any shape).
        b: ``(fp8 data, fp32 [N, K_sum/128])``: each group's ``[N, K_g]`` block, back to back.
        d: fp32 [G, M, N], contiguous; written and returned.{doc}
        recipe: ``(1, 1, 128)`` (the only recipe); every ``ks_cpu[g]`` a multiple of 128.
    """,
}


def _k_grouped_fp8(layout: str) -> Any:
    """``k_grouped_fp8_gemm_<layout>_contiguous``: ``tn`` (MN-major operands) or ``nt`` (K-major groups)."""

    def stub(
        a: FP8Operand,
        b: FP8Operand,
        d: Tensor,
        ks_cpu: list[int],
        grouped_layout: Tensor,
        c: Tensor | None = None,
        recipe: Recipe = (1, 1, 128),
        compiled_dims: str = "mn",
        use_psum_layout: bool = False,
        *,
        stream=None,
    ) -> Tensor: ...

    doc = _K_GROUPED_FP8_DOCS[layout].replace("{doc}", _K_GROUPED_DOC)
    return op(f"k_grouped_fp8_gemm_{layout}_contiguous", stub, doc, checks.k_grouped_check(fp8=True, layout=layout))


k_grouped_bf16_gemm_tn_contiguous.__doc__ = k_grouped_bf16_gemm_tn_contiguous.__doc__.replace("{doc}", _K_GROUPED_DOC)
k_grouped_fp8_gemm_tn_contiguous = _k_grouped_fp8("tn")
k_grouped_fp8_gemm_nt_contiguous = _k_grouped_fp8("nt")
