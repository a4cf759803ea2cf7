"""Dense GEMM stubs: BF16 and FP8 in four layouts, cuBLASLt, FP8 skip-head-mid (see the package docstring).

A family's four layouts are one stub, made per layout (``_dense_gemm``, ``_cublaslt_gemm``): the signature is
written once, the layout's shapes go into its docstring and its ``compiled_dims`` default is DeepGEMM's for it; the
FP8 GEMMs' is the BF16 one's in its FP8 form (``_stubs.fp8_form``).
"""

from __future__ import annotations

from typing import Any

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks
from tilegemm.ops.api._stubs import FP8Operand, Recipe, Tensor, fp8_form, op

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


_COMPILED_DIMS = {"nt": "nk", "nn": "nk", "tn": "mn", "tt": "mn"}  # DeepGEMM's defaults per layout


# ------------------------------------------------------------------------- dense BF16 and FP8


def _dense_gemm(layout: str, *, fp8: bool) -> Any:
    """``fp8_fp4_gemm_<layout>`` (``fp8``) or ``bf16_gemm_<layout>``."""

    def stub(
        a: Tensor,
        b: Tensor,
        d: Tensor,
        c: Tensor | None = None,
        compiled_dims: str = _COMPILED_DIMS[layout],
        *,
        alpha: float = 1.0,
        beta: float = 1.0,
        stream=None,
    ) -> Tensor: ...

    name, doc = ("fp8_fp4_gemm", _DENSE_FP8_DOC) if fp8 else ("bf16_gemm", _DENSE_BF16_DOC)
    check, signature = checks.dense_gemm_check(layout, fp8=fp8), checks.dense_gemm_signature(layout, fp8=fp8)
    return op(f"{name}_{layout}", fp8_form(stub) if fp8 else stub, _doc(doc, layout), check, signature)


bf16_gemm_nt = _dense_gemm("nt", fp8=False)
bf16_gemm_nn = _dense_gemm("nn", fp8=False)
bf16_gemm_tn = _dense_gemm("tn", fp8=False)
bf16_gemm_tt = _dense_gemm("tt", fp8=False)
fp8_fp4_gemm_nt = _dense_gemm("nt", fp8=True)
fp8_fp4_gemm_nn = _dense_gemm("nn", fp8=True)
fp8_fp4_gemm_tn = _dense_gemm("tn", fp8=True)
fp8_fp4_gemm_tt = _dense_gemm("tt", fp8=True)


# ------------------------------------------------------------------------- cuBLASLt GEMMs

_CUBLASLT_DOC = """DeepGEMM's ``cublaslt_gemm_{layout}``: ``D = A @ B.T (+ C)`` by cuBLAS (DeepGEMM's baseline).

    ``a``, ``b``: bare tensors of one dtype, bf16 or float8_e4m3fn (FP8 data without scales, as DeepGEMM takes
    them), in the shapes of :func:`bf16_gemm_{layout}`; ``d`` bf16/fp32 [M, N]; ``c`` optional, of ``d``'s shape
    (``c`` may be ``d``). Accumulated in fp32 and rounded once into ``d``. Every backend runs it the same way:
    cuBLAS through torch on CUDA tensors (``torch.mm``; ``torch._scaled_mm`` with unit scales for FP8), the exact
    fp32 product on the CPU.
    """


def _cublaslt_gemm(layout: str) -> Any:
    def stub(a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, *, stream=None) -> Tensor: ...

    name = f"cublaslt_gemm_{layout}"
    return op(name, stub, _CUBLASLT_DOC.format(layout=layout), checks.cublaslt_gemm_check(layout))


cublaslt_gemm_nt = _cublaslt_gemm("nt")
cublaslt_gemm_nn = _cublaslt_gemm("nn")
cublaslt_gemm_tn = _cublaslt_gemm("tn")
cublaslt_gemm_tt = _cublaslt_gemm("tt")

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
