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
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks
from tilegemm.ops.common import MoETrainState

Tensor = torch.Tensor
FP8Operand = tuple[torch.Tensor, torch.Tensor]
Recipe = tuple[int, int, int]

_DENSE_BF16_DOC = """BF16 dense GEMM, layout ``{layout}``: ``d = alpha * op(a) @ op(b) + beta * c``.

    Args:
        a: bf16 {a_shape}.
        b: bf16 {b_shape}.
        d: bf16 or fp32 [M, N], contiguous; written and returned.
        c: optional bf16/fp32 [M, N] added as ``beta * c`` (not read when ``beta == 0``); may be ``d``.
        compiled_dims: DeepGEMM's JIT hint; no effect.
        alpha, beta: real numbers a float can hold (BLAS meaning; keyword-only extensions).
        stream: CUDA stream to run on (``None``: the current stream).

    Math: ``d[m, n] = alpha * sum_k A[m, k] * B[n, k] + beta * c[m, n]`` accumulated in fp32,
    rounded once to ``d.dtype``. K may be 0 (then ``d = beta * c`` or 0).
    """

_DENSE_FP8_DOC = """FP8 block-scaled dense GEMM, layout ``{layout}`` (DeepGEMM's ``fp8_fp4_gemm_{layout}``).

    Args:
        a: ``(fp8 {a_shape}, fp32 {sa_shape})``: 1x128 LHS scales, one per row of A per 128 of K,
            in the data's orientation.
        b: ``(fp8 {b_shape}, fp32 scales)``: 128x128 blocks {sb_block} (recipe ``(1, 128, 128)``) or
            1x128 rows {sb_rows} (recipe ``(1, 1, 128)``), in the data's orientation.
        d: bf16 or fp32 [M, N], contiguous; written and returned.
        c: optional bf16/fp32 [M, N] added as ``beta * c``; may be ``d``.
        recipe: ``None`` (inferred from the RHS scale shape), ``(1, 128, 128)`` or ``(1, 1, 128)``.
        recipe_a, recipe_b: DeepGEMM's per-operand form, ``(1, 128)`` and ``(128, 128)`` or ``(1, 128)``
            (instead of ``recipe``).
        compiled_dims: DeepGEMM's JIT hint; no effect.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect on fp32 scales.
        alpha, beta: real numbers a float can hold (BLAS meaning; keyword-only extensions).
        stream: CUDA stream to run on (``None``: the current stream).

    Math: ``d[m, n] = alpha * sum_kb sa[m, kb] * sb[n or n // 128, kb] * sum_(k in kb) A[m, k] * B[n, k]
    + beta * c[m, n]``, accumulated in fp32 and rounded once. FP4 operands raise ``NotImplementedError``.
    """

_SCALE_SHAPES = {  # (sa, sb 128x128, sb 1x128) in the data's orientation
    "nt": ("[M, ceil(K/128)]", "[ceil(N/128), ceil(K/128)]", "[N, ceil(K/128)]"),
    "nn": ("[M, ceil(K/128)]", "[ceil(K/128), ceil(N/128)]", "[ceil(K/128), N]"),
    "tn": ("[ceil(K/128), M]", "[ceil(K/128), ceil(N/128)]", "[ceil(K/128), N]"),
    "tt": ("[ceil(K/128), M]", "[ceil(N/128), ceil(K/128)]", "[N, ceil(K/128)]"),
}


def _doc(template: str, layout: str) -> str:
    a_shape, b_shape = checks.LAYOUT_SHAPES[layout]
    sa, sb_block, sb_rows = _SCALE_SHAPES[layout]
    return template.format(
        layout=layout, a_shape=a_shape, b_shape=b_shape, sa_shape=sa, sb_block=sb_block, sb_rows=sb_rows
    )


# ---------------------------------------------------------------------------- dense BF16


@dispatch(
    "bf16_gemm_nt",
    check=checks.dense_gemm_check("nt", fp8=False),
    signature=checks.dense_gemm_signature("nt", fp8=False),
)
def bf16_gemm_nt(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    c: Tensor | None = None,
    compiled_dims: str = "nk",
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


@dispatch(
    "bf16_gemm_nn",
    check=checks.dense_gemm_check("nn", fp8=False),
    signature=checks.dense_gemm_signature("nn", fp8=False),
)
def bf16_gemm_nn(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    c: Tensor | None = None,
    compiled_dims: str = "nk",
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


@dispatch(
    "bf16_gemm_tn",
    check=checks.dense_gemm_check("tn", fp8=False),
    signature=checks.dense_gemm_signature("tn", fp8=False),
)
def bf16_gemm_tn(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    c: Tensor | None = None,
    compiled_dims: str = "mn",
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


@dispatch(
    "bf16_gemm_tt",
    check=checks.dense_gemm_check("tt", fp8=False),
    signature=checks.dense_gemm_signature("tt", fp8=False),
)
def bf16_gemm_tt(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    c: Tensor | None = None,
    compiled_dims: str = "mn",
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


# ------------------------------------------------------------------------- cuBLASLt GEMMs

_CUBLASLT_DOC = """DeepGEMM's ``cublaslt_gemm_{layout}``: ``D = A @ B.T (+ C)`` by cuBLAS (DeepGEMM's baseline).

    ``a``, ``b``: bare tensors of one dtype, bf16 or float8_e4m3fn (FP8 data without scales, as DeepGEMM takes
    them), in the shapes of :func:`bf16_gemm_{layout}`; ``d`` bf16/fp32 [M, N]; ``c`` optional, of ``d``'s shape
    (``c`` may be ``d``). Accumulated in fp32 and rounded once into ``d``. Every backend runs it the same way:
    cuBLAS through torch on CUDA tensors (``torch.mm``; ``torch._scaled_mm`` with unit scales for FP8), the exact
    fp32 product on the CPU.
    """


def _cublaslt_stub(layout: str) -> Any:
    def stub(a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, *, stream=None) -> Tensor: ...

    stub.__name__ = stub.__qualname__ = f"cublaslt_gemm_{layout}"
    stub.__doc__ = _CUBLASLT_DOC.format(layout=layout)
    return dispatch(f"cublaslt_gemm_{layout}", check=checks.cublaslt_gemm_check(layout))(stub)


cublaslt_gemm_nt = _cublaslt_stub("nt")
cublaslt_gemm_nn = _cublaslt_stub("nn")
cublaslt_gemm_tn = _cublaslt_stub("tn")
cublaslt_gemm_tt = _cublaslt_stub("tt")


# ----------------------------------------------------------------------------- dense FP8


@dispatch(
    "fp8_fp4_gemm_nt",
    check=checks.dense_gemm_check("nt", fp8=True),
    signature=checks.dense_gemm_signature("nt", fp8=True),
)
def fp8_fp4_gemm_nt(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


@dispatch(
    "fp8_fp4_gemm_nn",
    check=checks.dense_gemm_check("nn", fp8=True),
    signature=checks.dense_gemm_signature("nn", fp8=True),
)
def fp8_fp4_gemm_nn(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


@dispatch(
    "fp8_fp4_gemm_tn",
    check=checks.dense_gemm_check("tn", fp8=True),
    signature=checks.dense_gemm_signature("tn", fp8=True),
)
def fp8_fp4_gemm_tn(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "mn",
    disable_ue8m0_cast: bool = False,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


@dispatch(
    "fp8_fp4_gemm_tt",
    check=checks.dense_gemm_check("tt", fp8=True),
    signature=checks.dense_gemm_signature("tt", fp8=True),
)
def fp8_fp4_gemm_tt(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "mn",
    disable_ue8m0_cast: bool = False,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream=None,
) -> Tensor: ...


for _layout in ("nt", "nn", "tn", "tt"):
    globals()[f"bf16_gemm_{_layout}"].__doc__ = _doc(_DENSE_BF16_DOC, _layout)
    globals()[f"fp8_fp4_gemm_{_layout}"].__doc__ = _doc(_DENSE_FP8_DOC, _layout)
del _layout

fp8_gemm_nt = fp8_fp4_gemm_nt
fp8_gemm_nn = fp8_fp4_gemm_nn
fp8_gemm_tn = fp8_fp4_gemm_tn
fp8_gemm_tt = fp8_fp4_gemm_tt


@dispatch("fp8_gemm_nt_skip_head_mid", check=checks.skip_head_mid_check)
def fp8_gemm_nt_skip_head_mid(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    head_splits: tuple[int, int, int],
    recipe: Recipe | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    *,
    stream=None,
) -> Tensor:
    """FP8 ``nt`` GEMM whose output skips a middle slice of every head: ``d`` is [M, N + N / (left + right) * mid].

    With ``head_splits = (left, mid, right)``, column ``h * (left + right) + j`` of ``a @ b.T`` goes to
    column ``h * (left + mid + right) + j`` (``j < left``) or ``+ mid`` (``j >= left``) of ``d``; the ``mid``
    columns of each head are not written. Operands, scales and recipe as :func:`fp8_fp4_gemm_nt`.
    """


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


@dispatch("m_grouped_bf16_gemm_nt_contiguous", check=checks.m_grouped_contiguous_check("nt", fp8=False))
def m_grouped_bf16_gemm_nt_contiguous(
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
) -> Tensor:
    """M-grouped BF16 GEMM (MoE forward), contiguous rows: ``d[r] = a[r] @ b[group(r)].T``.

    Args:
        a: bf16 [M_sum, K].
        b: bf16 [G, N, K].
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
        expected_m_for_psum_layout: DeepGEMM's host hint for the psum layout; no effect.
    """


@dispatch("m_grouped_bf16_gemm_nn_contiguous", check=checks.m_grouped_contiguous_check("nn", fp8=False))
def m_grouped_bf16_gemm_nn_contiguous(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    grouped_layout: Tensor,
    compiled_dims: str = "nk",
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    *,
    alignment: int | None = None,
    stream=None,
) -> Tensor:
    """M-grouped BF16 GEMM, contiguous rows, B non-transposed: ``d[r] = a[r] @ b[group(r)]``.

    Args:
        a: bf16 [M_sum, K].
        b: bf16 [G, K, N].
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
    """


@dispatch("m_grouped_fp8_fp4_gemm_nt_contiguous", check=checks.m_grouped_contiguous_check("nt", fp8=True))
def m_grouped_fp8_fp4_gemm_nt_contiguous(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    grouped_layout: Tensor,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    expected_m_for_psum_layout: int | None = None,
    *,
    alignment: int | None = None,
    stream=None,
) -> Tensor:
    """M-grouped FP8 GEMM (MoE forward), contiguous rows, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [M_sum, K], fp32 [M_sum, ceil(K/128)])``.
        b: ``(fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)])``.
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
        recipe, recipe_a, recipe_b: as :func:`fp8_fp4_gemm_nt`; must resolve to ``(1, 128, 128)``.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
        expected_m_for_psum_layout: DeepGEMM's host hint for the psum layout; no effect.

    Math: ``d[r, n] = sum_kb sa[r, kb] * sb[g, n // 128, kb] * sum_(k in kb) A[r, k] * B[g, n, k]``, g = group(r).
    """


@dispatch("m_grouped_fp8_fp4_gemm_nn_contiguous", check=checks.m_grouped_contiguous_check("nn", fp8=True))
def m_grouped_fp8_fp4_gemm_nn_contiguous(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    grouped_layout: Tensor,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    use_psum_layout: bool = False,
    ensure_zero_padding: bool = True,
    *,
    alignment: int | None = None,
    stream=None,
) -> Tensor:
    """M-grouped FP8 GEMM, contiguous rows, B non-transposed, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [M_sum, K], fp32 [M_sum, ceil(K/128)])``.
        b: ``(fp8 [G, K, N], fp32 [G, ceil(K/128), ceil(N/128)])``: scales in the data's orientation.
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{doc}
        recipe, recipe_a, recipe_b: as :func:`fp8_fp4_gemm_nt`; must resolve to ``(1, 128, 128)``.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
    """


for _fn in (
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
):
    _fn.__doc__ = _fn.__doc__.replace("{doc}", _M_GROUPED_DOC)
del _fn

m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous

# ---------------------------------------------------------------------- m-grouped masked


@dispatch("m_grouped_bf16_gemm_nt_masked", check=checks.m_grouped_masked_check(fp8=False))
def m_grouped_bf16_gemm_nt_masked(
    a: Tensor, b: Tensor, d: Tensor, masked_m: Tensor, expected_m: int, compiled_dims: str = "nk", *, stream=None
) -> Tensor:
    """M-grouped BF16 GEMM, masked layout (CUDA-graph MoE decode): ``d[g, :m_g] = a[g, :m_g] @ b[g].T``.

    Args:
        a: bf16 [G, Mmax, K].
        b: bf16 [G, N, K].
        d: bf16 or fp32 [G, Mmax, N], contiguous; rows ``>= masked_m[g]``
            are left as they were (DeepGEMM's kernels may write them).
        masked_m: int32 [G] on the device, valid rows per group, each in ``[0, Mmax]``.
        expected_m: host-side hint of the typical ``masked_m`` (picks the kernel config).
        compiled_dims: DeepGEMM's JIT hint; no effect.
        stream: CUDA stream (``None``: current).
    """


@dispatch("m_grouped_fp8_fp4_gemm_nt_masked", check=checks.m_grouped_masked_check(fp8=True))
def m_grouped_fp8_fp4_gemm_nt_masked(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    masked_m: Tensor,
    expected_m: int,
    recipe: Recipe | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    *,
    stream=None,
) -> Tensor:
    """M-grouped FP8 GEMM, masked layout, 1x128 LHS / 128x128 RHS scales.

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
    """


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


@dispatch("k_grouped_fp8_gemm_tn_contiguous", check=checks.k_grouped_check(fp8=True, layout="tn"))
def k_grouped_fp8_gemm_tn_contiguous(
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
) -> Tensor:
    """K-grouped FP8 GEMM (MoE weight gradient), MN-major operands, 1x128 scales along K on both sides.

    Args:
        a: ``(fp8 [K_sum, M], fp32 [K_sum/128, M])``.
        b: ``(fp8 [K_sum, N], fp32 [K_sum/128, N])``.
        d: fp32 [G, M, N], contiguous; written and returned.{doc}
        recipe: ``(1, 1, 128)`` (the only recipe); every ``ks_cpu[g]`` a multiple of 128.

    Math: ``d[g, m, n] = sum_kb sa[kb, m] * sb[kb, n] * sum_(k in kb) A[k, m] * B[k, n] (+ c[g, m, n])``.
    """


@dispatch("k_grouped_fp8_gemm_nt_contiguous", check=checks.k_grouped_check(fp8=True, layout="nt"))
def k_grouped_fp8_gemm_nt_contiguous(
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
) -> Tensor:
    """K-grouped FP8 GEMM with K-major groups (DeepGEMM's SM90 op): ``d[g] = A_g @ B_g.T (+ c[g])``.

    Args:
        a: ``(fp8 data, fp32 [M, K_sum/128])``: the data holds each group's ``[M, K_g]`` block row-major
            (K-major), groups back to back (``sum(ks_cpu) * M`` elements, any shape).
        b: ``(fp8 data, fp32 [N, K_sum/128])``: each group's ``[N, K_g]`` block, back to back.
        d: fp32 [G, M, N], contiguous; written and returned.{doc}
        recipe: ``(1, 1, 128)`` (the only recipe); every ``ks_cpu[g]`` a multiple of 128.
    """


for _fn in (k_grouped_bf16_gemm_tn_contiguous, k_grouped_fp8_gemm_tn_contiguous, k_grouped_fp8_gemm_nt_contiguous):
    _fn.__doc__ = _fn.__doc__.replace("{doc}", _K_GROUPED_DOC)
del _fn

# ---------------------------------------------------------------------------- MQA logits

_MQA_DOC = """FP8 MQA logits of DeepSeek's sparse-attention indexer; returns a new [S, S_kv] (or [S, max_seqlen_k]).

    ``logits[i, j] = kv_scale[j] * sum_h weights[i, h] * relu(q[i, h, :] . kv[j, :])`` for
    ``ks[i] <= j < ke[i]``; ``-inf`` elsewhere when ``clean_logits`` (unspecified otherwise).

    Args:
        q: fp8 [S, H, D]{q_tuple}.
        kv: ``(fp8 [S_kv, D], fp32 [S_kv])`` keys and per-key scales.
        weights: fp32 [S, H] (bf16 with ``logits_dtype=torch.bfloat16``).
        cu_seq_len_k_start: int32 [S], ``ks``; ``0 <= ks <= ke``.
        cu_seq_len_k_end: int32 [S], ``ke``; ``ke <= S_kv``.
        clean_logits: write ``-inf`` outside each row's window.
        max_seqlen_k: ``0``: the output is [S, S_kv]. ``> 0``: the compressed form [S, max_seqlen_k],
            ``out[i, j] = logits[i, ks[i] + j]``; columns at or past ``ke[i] - ks[i]`` are ``-inf`` when
            ``clean_logits`` (DeepGEMM requires ``clean_logits=False`` there), unspecified otherwise.{dtype_doc}
        stream: CUDA stream (``None``: current).
    """


@dispatch("fp8_fp4_mqa_logits", check=checks.mqa_logits_check)
def fp8_fp4_mqa_logits(
    q: tuple[Tensor, Tensor | None] | Tensor,
    kv: FP8Operand,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    logits_dtype: torch.dtype = torch.float32,
    *,
    stream=None,
) -> Tensor: ...


@dispatch("fp8_mqa_logits", check=checks.mqa_logits_check)
def fp8_mqa_logits(
    q: Tensor,
    kv: FP8Operand,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    *,
    stream=None,
) -> Tensor: ...


fp8_fp4_mqa_logits.__doc__ = _MQA_DOC.format(
    q_tuple=", or DeepGEMM's ``(q, None)`` (FP4 ``(q, sf)`` raises ``NotImplementedError``)",
    dtype_doc="\n        logits_dtype: ``torch.float32`` or ``torch.bfloat16`` (rounded once from fp32).",
)
fp8_mqa_logits.__doc__ = _MQA_DOC.format(q_tuple="", dtype_doc="") + "\n    DeepGEMM's legacy form: fp32 logits.\n"


@dispatch("bf16_mqa_logits", check=checks.bf16_mqa_logits_check)
def bf16_mqa_logits(
    q: Tensor,
    kv: Tensor,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
    logits_dtype: torch.dtype = torch.float32,
    *,
    stream=None,
) -> Tensor:
    """BF16 MQA logits (the indexer's scores without quantization); returns a new [S, S_kv] (or [S, max_seqlen_k]).

    ``logits[i, j] = sum_h weights[i, h] * relu(q[i, h, :] . kv[j, :])`` for ``ks[i] <= j < ke[i]``, the products
    of the bf16 inputs summed in fp32; ``-inf`` elsewhere when ``clean_logits`` (unspecified otherwise). The
    arguments are :func:`fp8_fp4_mqa_logits`'s (DeepGEMM's order and defaults) with bf16 ``q`` and ``kv`` and no
    key scales (a per-key scale of 1).

    Args:
        q: bf16 [S, H, D].
        kv: bf16 [S_kv, D].
        weights: fp32 [S, H].
        cu_seq_len_k_start: int32 [S], ``ks``; ``0 <= ks <= ke``.
        cu_seq_len_k_end: int32 [S], ``ke``; ``ke <= S_kv``.
        clean_logits: write ``-inf`` outside each row's window.
        max_seqlen_k: ``0``: the output is [S, S_kv]; ``> 0``: the compressed form [S, max_seqlen_k],
            ``out[i, j] = logits[i, ks[i] + j]``.
        logits_dtype: ``torch.float32`` or ``torch.bfloat16`` (rounded once from fp32).
        stream: CUDA stream (``None``: current).
    """


@dispatch("get_paged_mqa_logits_metadata", check=checks.paged_mqa_metadata_check)
def get_paged_mqa_logits_metadata(
    context_lens: Tensor, block_kv: int, num_sms: int, indices: Tensor | None = None
) -> Tensor:
    """Balanced split of the paged MQA work over ``num_sms`` SMs; returns int32 [num_sms + 1, 2].

    The work of batch b is cut into splits of a fixed number of keys (the implementation's
    split size, a multiple of ``block_kv``). Row i is where SM i starts, as (batch index,
    split index within that batch); SMs get counts of splits that differ by at most one;
    the last row is (B, 0).

    Args:
        context_lens: int32 [B] or [B, next_n] (the row's own length; the max over rows counts).
        block_kv: tokens per KV-cache block.
        num_sms: SMs to spread the work over (>= 1).
        indices: DeepGEMM's varlen sequence index per row (int32 [B]); validated, no effect.
    """


_PAGED_DOC = """FP8 MQA logits over a paged KV cache (decode); returns a new [B * next_n, max_context_len].

    Row ``b * next_n + t`` holds ``kv_scale[j] * sum_h weights[row, h] * relu(q[b, t, h] . k[j])`` for
    the keys it sees: ``j < ctx[b] - next_n + t + 1`` with 1-D ``context_lens``, ``j < ctx[b, t]`` with
    2-D; ``-inf`` past that when ``clean_logits`` (unspecified otherwise). Key j of batch b lives in block
    ``block_table[b, j // block_kv]`` at slot ``j % block_kv``.

    Args:
        q: fp8 [B, next_n, H, D]{q_tuple}.
        kv_cache: uint8 [num_blocks, block_kv, 1, D + 4]; each block's bytes are ``block_kv * D`` fp8 key
            bytes (token-major) followed by ``block_kv`` fp32 scales (DeepGEMM's layout).
        weights: fp32 [B * next_n, H] (bf16 with ``logits_dtype=torch.bfloat16``).
        context_lens: int32 [B] or [B, next_n].
        block_table: int32 [B, max_blocks].
        schedule_meta: int32 [num_sms + 1, 2] from :func:`get_paged_mqa_logits_metadata` for these
            ``context_lens`` and ``block_kv`` (checked when value checks run).
        max_context_len: output width (>= every visible length).
        clean_logits: write ``-inf`` past each row's visible length.{dtype_doc}
        indices: DeepGEMM's varlen sequence index per row (int32 [B]); validated, no effect (the
            rows' ``context_lens`` and ``block_table`` already say everything).
        stream: CUDA stream (``None``: current).
    """


@dispatch(
    "fp8_fp4_paged_mqa_logits",
    check=checks.paged_mqa_logits_check,
    signature=checks.paged_mqa_logits_signature(fp4_form=True),
)
def fp8_fp4_paged_mqa_logits(
    q: tuple[Tensor, Tensor | None] | Tensor,
    kv_cache: Tensor,
    weights: Tensor,
    context_lens: Tensor,
    block_table: Tensor,
    schedule_meta: Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: torch.dtype = torch.float32,
    indices: Tensor | None = None,
    *,
    stream=None,
) -> Tensor: ...


@dispatch(
    "fp8_paged_mqa_logits",
    check=checks.paged_mqa_logits_check,
    signature=checks.paged_mqa_logits_signature(fp4_form=False),
)
def fp8_paged_mqa_logits(
    q: Tensor,
    kv_cache: Tensor,
    weights: Tensor,
    context_lens: Tensor,
    block_table: Tensor,
    schedule_meta: Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    indices: Tensor | None = None,
    *,
    stream=None,
) -> Tensor: ...


fp8_fp4_paged_mqa_logits.__doc__ = _PAGED_DOC.format(
    q_tuple=", or DeepGEMM's ``(q, None)`` (FP4 ``(q, sf)`` raises ``NotImplementedError``)",
    dtype_doc="\n        logits_dtype: ``torch.float32`` or ``torch.bfloat16`` (rounded once from fp32).",
)
fp8_paged_mqa_logits.__doc__ = _PAGED_DOC.format(q_tuple="", dtype_doc="") + "\n    DeepGEMM's legacy form: fp32.\n"

# ------------------------------------------------------------------ einsum, hyperconnection


@dispatch("einsum", check=checks.einsum_check)
def einsum(
    expr: str, a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, use_cublaslt: bool = False, *, stream=None
) -> Tensor:
    """BF16 batched contractions by DeepGEMM's expression names; writes and returns ``d``.

    ``"bmk,bnk->mn"``: a [S, M, K], b [S, N, K], ``d [M, N] = sum_s a[s] @ b[s].T (+ c)``;
    ``"bhr,hdr->bhd"``: a [B, H, R], b [H, D, R], ``d[b, h] = b[h] @ a[b, h]``;
    ``"bhd,hdr->bhr"``: a [B, H, D], b [H, D, R], ``d[b, h] = a[b, h] @ b[h]``.
    Accumulated in fp32, rounded once into ``d`` (bf16, or fp32). ``c`` (``d``'s dtype and shape) is added
    when given (DeepGEMM takes it for ``bmk,bnk->mn`` only, fp32 with ``c`` = ``d``).
    ``use_cublaslt``: DeepGEMM's kernel choice; no effect.
    """


@dispatch("fp8_einsum", check=checks.fp8_einsum_check)
def fp8_einsum(
    expr: str,
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    recipe: Recipe = (1, 128, 128),
    *,
    stream=None,
) -> Tensor:
    """FP8 batched contractions (DeepGEMM's ``fp8_einsum``); writes and returns ``d``.

    ``"bhr,hdr->bhd"`` and ``"bhd,hdr->bhr"`` (recipe ``(1, 128, 128)``): a ``(fp8 [B, H, K], fp32
    [B, H, K/128])`` with K = R or D; b ``(fp8 [H, D, R], fp32 [H, D/128, R/128])``.
    ``"bhd,bhr->hdr"`` (recipe ``(1, 1, 128)``, K = B): a ``(fp8 [B, H, D], fp32 [B/128, H, D])``,
    b ``(fp8 [B, H, R], fp32 [B/128, H, R])``. Scales are in the data's orientation; ``/128`` is ceil.
    ``d = einsum(expr, A, B) (+ c)`` on the dequantized values, fp32 accumulation, rounded once.
    """


@dispatch("tf32_hc_prenorm_gemm", check=checks.tf32_hc_prenorm_gemm_check)
def tf32_hc_prenorm_gemm(
    a: Tensor, b: Tensor, d: Tensor, sqr_sum: Tensor, num_splits: int | None = None, *, stream=None
) -> Tensor:
    """Hyper-connection pre-norm GEMM: ``d = a @ tf32(b).T`` and ``sqr_sum = sum_k a^2``, fp32; returns ``d``.

    Args:
        a: bf16 [M, K].
        b: fp32 [N, K], rounded to TF32 (10 mantissa bits, to nearest) as DeepGEMM's tensor cores read it.
        d: fp32 [M, N], or [num_splits, M, N] of partial sums over K splits.
        sqr_sum: fp32 [M], or [num_splits, M] of partial sums.
        num_splits: ``None``, or the number of K splits (the split points are the implementation's;
            only the sum over splits is defined).
        stream: CUDA stream (``None``: current).
    """


# ------------------------------------------------------------------------------- MoE experts


@dispatch("moe_experts", check=checks.moe_experts_check)
def moe_experts(
    hidden: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    activation: str = "silu",
    *,
    stream=None,
) -> Tensor:
    """Fused MoE experts (tilegemm's extension; no DeepGEMM counterpart): routing, gated MLPs and combine.

    Args:
        hidden: [T, H] token hidden states, bf16 (the ``pytorch`` backend also takes fp16/fp32).
        topk_ids: int32/int64 [T, k] expert of each (token, slot); ids outside ``[0, E)`` (expert-parallel
            sentinels such as -1 or E) drop the slot.
        topk_weights: float [T, k] routing weights (fp32 or the hidden dtype).
        w13: [E, 2I, H], ``hidden.dtype``: each expert's gate rows ``[0, I)`` then up rows ``[I, 2I)``
            (transformers' ``gate_up_proj`` of Qwen3-MoE, DeepSeek-V3, Mixtral).
        w2: [E, H, I], ``hidden.dtype``: each expert's down projection (transformers' ``down_proj``).
        activation: the gated activation ``act(gate) * up``: ``"silu"``, ``"gelu"`` (erf; the ``pytorch``
            backend only) or ``"gelu_tanh"`` (tanh approximation).
        stream: CUDA stream (``None``: current).

    Returns:
        A new [T, H] tensor in ``hidden.dtype``. Per slot with expert e: ``h = round(act(x @ w13[e, :I].T) *
        (x @ w13[e, I:].T))``, ``y_j = round(w[t, j] * (h @ w2[e].T))``, both accumulated in fp32; then
        ``out[t] = round(sum_j y_j)``, an fp32 sum in slot order (no atomics: reruns are bitwise identical).

    No host synchronisation: routing (sort by expert, counts, offsets) runs on the device, buffer sizes
    depend only on ``(T, k, E)``, so the call is CUDA-graph capturable.
    """


@dispatch("moe_experts_forward", check=checks.moe_experts_check)
def moe_experts_forward(
    hidden: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    activation: str = "silu",
    *,
    stream=None,
) -> tuple[Tensor, MoETrainState]:
    """The training forward of :func:`moe_experts` (the first half of ``tilegemm.autograd.moe_experts``).

    Arguments as :func:`moe_experts`. Returns ``(out, state)``: ``out`` [T, H] in ``hidden.dtype`` is
    ``round(sum_j w[t, j] * y_j)`` with ``y_j = round(h @ w2[e].T)`` and ``h`` as in :func:`moe_experts` (the
    routing weight applied in the fp32 combine, not before the rounding of ``y``); ``state`` is the
    :class:`tilegemm.ops.common.MoETrainState` that :func:`moe_experts_backward` takes (the routing in the
    128-row aligned layout, the gate/up products, ``h`` and ``y``). No host synchronisation.
    """


@dispatch("moe_experts_backward", check=checks.moe_experts_backward_check)
def moe_experts_backward(
    grad_out: Tensor,
    hidden: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    state: MoETrainState,
    activation: str = "silu",
    needs: tuple[bool, bool, bool, bool] = (True, True, True, True),
    *,
    stream=None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of :func:`moe_experts_forward`'s output: ``(d_hidden, d_topk_weights, d_w13, d_w2)``.

    Args:
        grad_out: [T, H] in ``hidden.dtype``, the gradient of ``out``.
        hidden, topk_weights, w13, w2, activation: the forward's arguments.
        state: the forward's :class:`tilegemm.ops.common.MoETrainState`.
        needs: which of the four gradients to compute (the others come back ``None``).

    Returns, each in its input's dtype and shape, with ``dy[r] = round(w_r * grad_out[t_r])`` per routed row
    ``r`` (token ``t_r``, expert ``e``, weight ``w_r``), ``dh = dy @ w2[e]`` (fp32), ``g, u`` the saved gate/up::

        d_topk_weights[t, j] = sum_c grad_out[t, c] * y[dest[t, j], c]           (fp32 sums)
        dgate = round(dh * u * act'(g)),  dup = round(dh * act(g))
        d_w2[e]  = round(sum_r dy[r].T h[r]),  d_w13[e] = round(sum_r [dgate, dup][r].T x[t_r])
        d_hidden[t] = round(sum_j round([dgate, dup] @ w13[e])[dest[t, j]])      (slots in order)

    Dropped slots get zero gradients. Every sum has a fixed order: reruns are bitwise identical.
    """


@dispatch("fp8_moe_experts", check=checks.fp8_moe_experts_check)
def fp8_moe_experts(
    hidden: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    w13: FP8Operand,
    w2: FP8Operand,
    activation: str = "silu",
    *,
    stream=None,
) -> Tensor:
    """Fused FP8 MoE experts (tilegemm's extension): :func:`moe_experts` with DeepGEMM's FP8 recipe.

    Args:
        hidden: bf16 [T, H], H a multiple of 128; quantized inside, one scale per token per 128 of H.
        topk_ids: int32/int64 [T, k]; ids outside ``[0, E)`` drop the slot (as in :func:`moe_experts`).
        topk_weights: float [T, k] routing weights.
        w13: ``(float8_e4m3fn [E, 2I, H], fp32 [E, 2I/128, H/128])``: gate rows ``[0, I)`` then up rows, with
            128x128 block scales (``tilegemm.per_block_cast_to_fp8(gate_up_proj)``); I a multiple of 128.
        w2: ``(float8_e4m3fn [E, H, I], fp32 [E, H/128, I/128])``: the down projections, 128x128 block scales.
        activation: ``"silu"``, ``"gelu"`` (erf; the ``pytorch`` backend only) or ``"gelu_tanh"``.
        stream: CUDA stream (``None``: current).

    Returns:
        A new bf16 [T, H] tensor. With ``q(v)`` the 1x128 quantization of ``tilegemm.per_token_cast_to_fp8``
        (scale = max(amax, 1e-4) / 448 per 128 values, stored dequantized here) and ``W`` the dequantized
        weights, per slot with expert e::

            g, u = q(x[t]) @ W13[e, :I].T, q(x[t]) @ W13[e, I:].T     fp32 (per-128-K block products, promoted)
            h    = act(g) * u                                         fp32, not rounded
            y_j  = round_bf16(w[t, j] * (q(h) @ W2[e].T))              fp32
            out[t] = round_bf16(sum_{j=0..k-1} y_j)                    fp32 sum in slot order

    No host synchronisation; CUDA-graph capturable; reruns are bitwise identical.
    """


# ------------------------------------------------------------------------------------ RMSNorm


@dispatch("rms_norm", check=checks.rms_norm_check)
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, *, stream=None) -> Tensor:
    """RMSNorm over the last dimension (tilegemm's extension; no DeepGEMM counterpart): the norm of the MoE
    models tilegemm patches, in one kernel.

    Args:
        x: [..., H] bf16, fp16 or fp32, any strides.
        weight: [H] bf16, fp16 or fp32.
        eps: a finite float >= 0 added to the mean square.
        stream: CUDA stream (``None``: current).

    Returns:
        A new tensor of ``x``'s shape in ``torch.promote_types(x.dtype, weight.dtype)``:
        ``y = weight * round(x32 * rsqrt(mean(x32 ** 2, -1) + eps))`` with ``x32 = x.float()``, the mean and the
        scaling in fp32 and ``round`` to ``x.dtype``: the steps and roundings of transformers' ``LlamaRMSNorm``
        and its copies (``Qwen3MoeRMSNorm``, ``DeepseekV3RMSNorm``, ...). The ``pytorch`` backend runs those very
        torch ops (the stock module's result, bit for bit); the ``cutile`` kernel differs only in the order of the
        squares' sum. Rows longer than 8192 run the ``pytorch`` backend. Not differentiable: training uses
        :func:`tilegemm.autograd.rms_norm`.
    """
