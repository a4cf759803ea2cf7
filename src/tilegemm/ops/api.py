"""Every public op as a ``@dispatch`` stub: its signature, defaults and documentation.

The stubs hold no code: ``tilegemm.backend.registry.dispatch`` binds a call to the stub's
signature, runs the shared input check from ``ops/checks.py`` and routes it to a backend
(``ops/reference`` for ``pytorch``, ``ops/cutile`` for ``cutile``). Every op also takes a
keyword-only ``backend=`` that overrides the current backend for that call.

Conventions (DeepGEMM's): layout ``nt`` means A non-transposed, B transposed, so
``D = alpha * A @ B.T + beta * C``; shapes are nt a[M,K] b[N,K], nn a[M,K] b[K,N],
tn a[K,M] b[K,N], tt a[K,M] b[N,K]. ``c`` is not read when it is ``None`` or ``beta == 0``;
``c`` may be ``d``. An FP8 operand is a tuple ``(float8_e4m3fn data, float32 scales)``.
GEMM ops write the caller's ``d`` and return it.
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks

Tensor = torch.Tensor
FP8Operand = tuple[torch.Tensor, torch.Tensor]

_DENSE_BF16_DOC = """BF16 dense GEMM, layout ``{layout}``: ``d = alpha * op(a) @ op(b) + beta * c``.

    Args:
        a: bf16 {a_shape}.
        b: bf16 {b_shape}.
        d: bf16 or fp32 [M, N], contiguous; written and returned.
        c: optional bf16/fp32 [M, N] added as ``beta * c`` (not read when ``beta == 0``); may be ``d``.
        alpha, beta: scalars (BLAS meaning).
        stream: CUDA stream to run on (``None``: the current stream).

    Math: ``d[m, n] = alpha * sum_k A[m, k] * B[n, k] + beta * c[m, n]`` accumulated in fp32,
    rounded once to ``d.dtype``. K may be 0 (then ``d = beta * c`` or 0).
    """

_DENSE_FP8_DOC = """FP8 block-scaled dense GEMM, layout ``{layout}``.

    Args:
        a: ``(fp8 {a_shape}, fp32 [M, ceil(K/128)])``: 1x128 LHS scales, one per row per 128 of K.
        b: ``(fp8 {b_shape}, fp32 scales)``: 128x128 blocks ``[ceil(N/128), ceil(K/128)]``
            (recipe ``(1, 128, 128)``) or 1x128 rows ``[N, ceil(K/128)]`` (recipe ``(1, 1, 128)``).
        d: bf16 or fp32 [M, N], contiguous; written and returned.
        c: optional bf16/fp32 [M, N] added as ``beta * c``; may be ``d``.
        alpha, beta: scalars (BLAS meaning).
        recipe: ``None`` (inferred from the RHS scale shape), ``(1, 128, 128)`` or ``(1, 1, 128)``.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect on fp32 scales.
        stream: CUDA stream to run on (``None``: the current stream).

    Math: ``d[m, n] = alpha * sum_kb sa[m, kb] * sb[n or n // 128, kb] * sum_(k in kb) A[m, k] * B[n, k]
    + beta * c[m, n]``, accumulated in fp32 and rounded once.
    """

_SHAPES = {
    "nt": ("[M, K]", "[N, K]"),
    "nn": ("[M, K]", "[K, N]"),
    "tn": ("[K, M]", "[K, N]"),
    "tt": ("[K, M]", "[N, K]"),
}


def _doc(template: str, layout: str) -> str:
    a_shape, b_shape = _SHAPES[layout]
    return template.format(layout=layout, a_shape=a_shape, b_shape=b_shape)


# ---------------------------------------------------------------------------- dense BF16


@dispatch("bf16_gemm_nt", check=checks.dense_gemm_check("nt", fp8=False))
def bf16_gemm_nt(
    a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, stream=None
) -> Tensor: ...


@dispatch("bf16_gemm_nn", check=checks.dense_gemm_check("nn", fp8=False))
def bf16_gemm_nn(
    a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, stream=None
) -> Tensor: ...


@dispatch("bf16_gemm_tn", check=checks.dense_gemm_check("tn", fp8=False))
def bf16_gemm_tn(
    a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, stream=None
) -> Tensor: ...


@dispatch("bf16_gemm_tt", check=checks.dense_gemm_check("tt", fp8=False))
def bf16_gemm_tt(
    a: Tensor, b: Tensor, d: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, stream=None
) -> Tensor: ...


# ----------------------------------------------------------------------------- dense FP8


@dispatch("fp8_gemm_nt", check=checks.dense_gemm_check("nt", fp8=True))
def fp8_gemm_nt(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    recipe: tuple[int, int, int] | None = None,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor: ...


@dispatch("fp8_gemm_nn", check=checks.dense_gemm_check("nn", fp8=True))
def fp8_gemm_nn(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    recipe: tuple[int, int, int] | None = None,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor: ...


@dispatch("fp8_gemm_tn", check=checks.dense_gemm_check("tn", fp8=True))
def fp8_gemm_tn(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    recipe: tuple[int, int, int] | None = None,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor: ...


@dispatch("fp8_gemm_tt", check=checks.dense_gemm_check("tt", fp8=True))
def fp8_gemm_tt(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    c: Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    recipe: tuple[int, int, int] | None = None,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor: ...


for _layout in ("nt", "nn", "tn", "tt"):
    globals()[f"bf16_gemm_{_layout}"].__doc__ = _doc(_DENSE_BF16_DOC, _layout)
    globals()[f"fp8_gemm_{_layout}"].__doc__ = _doc(_DENSE_FP8_DOC, _layout)
del _layout

# ------------------------------------------------------------------ m-grouped contiguous

_M_GROUPED_INDEX_DOC = """
        m_indices: int32 on a's device. Default layout: ``[M_sum]``, row r's group, ``-1`` for
            padding rows (written as 0); every 128-row block is one group or all padding.
            With ``use_psum_layout=True``: ``[G]`` cumulative end rows (``torch._grouped_mm``'s
            ``offs``): group g is rows ``[offs[g-1], offs[g])``, unaligned; rows past ``offs[G-1]``
            are written as 0."""


@dispatch("m_grouped_bf16_gemm_nt_contiguous", check=checks.m_grouped_contiguous_check("nt", fp8=False))
def m_grouped_bf16_gemm_nt_contiguous(
    a: Tensor, b: Tensor, d: Tensor, m_indices: Tensor, use_psum_layout: bool = False, stream=None
) -> Tensor:
    """M-grouped BF16 GEMM (MoE forward), contiguous rows: ``d[r] = a[r] @ b[group(r)].T``.

    Args:
        a: bf16 [M_sum, K].
        b: bf16 [G, N, K].
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{index_doc}
        use_psum_layout: read ``m_indices`` as cumulative group ends.
        stream: CUDA stream (``None``: current).
    """


@dispatch("m_grouped_bf16_gemm_nn_contiguous", check=checks.m_grouped_contiguous_check("nn", fp8=False))
def m_grouped_bf16_gemm_nn_contiguous(
    a: Tensor, b: Tensor, d: Tensor, m_indices: Tensor, use_psum_layout: bool = False, stream=None
) -> Tensor:
    """M-grouped BF16 GEMM, contiguous rows, B non-transposed: ``d[r] = a[r] @ b[group(r)]``.

    Args:
        a: bf16 [M_sum, K].
        b: bf16 [G, K, N].
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{index_doc}
        use_psum_layout: read ``m_indices`` as cumulative group ends.
        stream: CUDA stream (``None``: current).
    """


@dispatch("m_grouped_fp8_gemm_nt_contiguous", check=checks.m_grouped_contiguous_check("nt", fp8=True))
def m_grouped_fp8_gemm_nt_contiguous(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    m_indices: Tensor,
    use_psum_layout: bool = False,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor:
    """M-grouped FP8 GEMM (MoE forward), contiguous rows, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [M_sum, K], fp32 [M_sum, ceil(K/128)])``.
        b: ``(fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)])``.
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{index_doc}
        use_psum_layout: read ``m_indices`` as cumulative group ends.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
        stream: CUDA stream (``None``: current).

    Math: ``d[r, n] = sum_kb sa[r, kb] * sb[g, n // 128, kb] * sum_(k in kb) A[r, k] * B[g, n, k]``, g = group(r).
    """


@dispatch("m_grouped_fp8_gemm_nn_contiguous", check=checks.m_grouped_contiguous_check("nn", fp8=True))
def m_grouped_fp8_gemm_nn_contiguous(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    m_indices: Tensor,
    use_psum_layout: bool = False,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor:
    """M-grouped FP8 GEMM, contiguous rows, B non-transposed, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [M_sum, K], fp32 [M_sum, ceil(K/128)])``.
        b: ``(fp8 [G, K, N], fp32 [G, ceil(N/128), ceil(K/128)])`` (scales in logical N/K order).
        d: bf16 or fp32 [M_sum, N], contiguous; written and returned.{index_doc}
        use_psum_layout: read ``m_indices`` as cumulative group ends.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
        stream: CUDA stream (``None``: current).
    """


for _fn in (
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nn_contiguous,
):
    _fn.__doc__ = _fn.__doc__.replace("{index_doc}", _M_GROUPED_INDEX_DOC)
del _fn

# ---------------------------------------------------------------------- m-grouped masked


@dispatch("m_grouped_bf16_gemm_nt_masked", check=checks.m_grouped_masked_check(fp8=False))
def m_grouped_bf16_gemm_nt_masked(
    a: Tensor, b: Tensor, d: Tensor, masked_m: Tensor, expected_m: int, stream=None
) -> Tensor:
    """M-grouped BF16 GEMM, masked layout (CUDA-graph MoE decode): ``d[g, :m_g] = a[g, :m_g] @ b[g].T``.

    Args:
        a: bf16 [G, Mmax, K].
        b: bf16 [G, N, K].
        d: bf16 or fp32 [G, Mmax, N], contiguous; rows ``>= masked_m[g]`` are not written.
        masked_m: int32 [G] on the device, valid rows per group, each in ``[0, Mmax]``.
        expected_m: host-side hint of the typical ``masked_m`` (picks the kernel config).
        stream: CUDA stream (``None``: current).
    """


@dispatch("m_grouped_fp8_gemm_nt_masked", check=checks.m_grouped_masked_check(fp8=True))
def m_grouped_fp8_gemm_nt_masked(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    masked_m: Tensor,
    expected_m: int,
    disable_ue8m0_cast: bool = False,
    stream=None,
) -> Tensor:
    """M-grouped FP8 GEMM, masked layout, 1x128 LHS / 128x128 RHS scales.

    Args:
        a: ``(fp8 [G, Mmax, K], fp32 [G, Mmax, ceil(K/128)])``.
        b: ``(fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)])``.
        d: bf16 or fp32 [G, Mmax, N], contiguous; rows ``>= masked_m[g]`` are not written.
        masked_m: int32 [G] on the device, valid rows per group, each in ``[0, Mmax]``.
        expected_m: host-side hint of the typical ``masked_m``.
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; no effect.
        stream: CUDA stream (``None``: current).
    """


# ----------------------------------------------------------------------------- k-grouped


@dispatch("k_grouped_bf16_gemm_tn_contiguous", check=checks.k_grouped_check(fp8=False))
def k_grouped_bf16_gemm_tn_contiguous(
    a: Tensor,
    b: Tensor,
    d: Tensor,
    ks: list[int],
    ks_tensor: Tensor | None = None,
    c: Tensor | None = None,
    stream=None,
) -> Tensor:
    """K-grouped BF16 GEMM (MoE weight gradient): ``d[g] = a_g.T @ b_g (+ c[g])``.

    Group g owns rows ``[sum(ks[:g]), sum(ks[:g+1]))`` of ``a`` and ``b``.

    Args:
        a: bf16 [K_sum, M].
        b: bf16 [K_sum, N].
        d: fp32 [G, M, N], contiguous; written and returned (a group with ``ks[g] == 0`` gets ``c[g]`` or 0).
        ks: host list of per-group K (0 allowed), ``sum(ks) == K_sum``.
        ks_tensor: optional int32 [G] device mirror of ``ks`` (checked against it).
        c: optional fp32 [G, M, N] accumulated into the result; may be ``d``.
        stream: CUDA stream (``None``: current).
    """


@dispatch("k_grouped_fp8_gemm_tn_contiguous", check=checks.k_grouped_check(fp8=True))
def k_grouped_fp8_gemm_tn_contiguous(
    a: FP8Operand,
    b: FP8Operand,
    d: Tensor,
    ks: list[int],
    ks_tensor: Tensor | None = None,
    c: Tensor | None = None,
    stream=None,
) -> Tensor:
    """K-grouped FP8 GEMM (MoE weight gradient), 1x128 scales along K on both sides.

    Args:
        a: ``(fp8 [K_sum, M], fp32 [K_sum/128, M])``.
        b: ``(fp8 [K_sum, N], fp32 [K_sum/128, N])``.
        d: fp32 [G, M, N], contiguous; written and returned.
        ks: host list of per-group K, each a multiple of 128 (0 allowed).
        ks_tensor: optional int32 [G] device mirror of ``ks``.
        c: optional fp32 [G, M, N] accumulated into the result; may be ``d``.
        stream: CUDA stream (``None``: current).

    Math: ``d[g, m, n] = sum_kb sa[kb, m] * sb[kb, n] * sum_(k in kb) A[k, m] * B[k, n] (+ c[g, m, n])``.
    """


# ---------------------------------------------------------------------------- MQA logits


@dispatch("fp8_mqa_logits", check=checks.mqa_logits_check)
def fp8_mqa_logits(
    q: Tensor,
    kv: FP8Operand,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    stream=None,
) -> Tensor:
    """FP8 MQA logits of DeepSeek's sparse-attention indexer; returns a new fp32 [S, S_kv].

    ``logits[i, j] = kv_scale[j] * sum_h weights[i, h] * relu(q[i, h, :] . kv[j, :])`` for
    ``ks[i] <= j < ke[i]``; ``-inf`` elsewhere when ``clean_logits`` (unspecified otherwise).

    Args:
        q: fp8 [S, H, D].
        kv: ``(fp8 [S_kv, D], fp32 [S_kv])`` keys and per-key scales.
        weights: fp32 [S, H].
        cu_seq_len_k_start: int32 [S], ``ks``; ``0 <= ks <= ke``.
        cu_seq_len_k_end: int32 [S], ``ke``; ``ke <= S_kv``.
        clean_logits: write ``-inf`` outside each row's window.
        stream: CUDA stream (``None``: current).
    """


@dispatch("get_paged_mqa_logits_metadata", check=checks.paged_mqa_metadata_check)
def get_paged_mqa_logits_metadata(context_lens: Tensor, block_kv: int, num_sms: int) -> Tensor:
    """Balanced split of the paged MQA work over ``num_sms`` SMs; returns int32 [num_sms + 1, 2].

    The work of batch b is cut into splits of a fixed number of keys (the implementation's
    split size, a multiple of ``block_kv``). Row i is where SM i starts, as (batch index,
    split index within that batch); SMs get counts of splits that differ by at most one;
    the last row is (B, 0).

    Args:
        context_lens: int32 [B] or [B, next_n] (the row's own length; the max over rows counts).
        block_kv: tokens per KV-cache block.
        num_sms: SMs to spread the work over (>= 1).
    """


@dispatch("fp8_paged_mqa_logits", check=checks.paged_mqa_logits_check)
def fp8_paged_mqa_logits(
    q: Tensor,
    kv_cache: Tensor,
    weights: Tensor,
    context_lens: Tensor,
    block_table: Tensor,
    schedule_meta: Tensor,
    max_context_len: int,
    clean_logits: bool = True,
    stream=None,
) -> Tensor:
    """FP8 MQA logits over a paged KV cache (decode); returns a new fp32 [B * next_n, max_context_len].

    Row ``b * next_n + t`` holds ``kv_scale[j] * sum_h weights[row, h] * relu(q[b, t, h] . k[j])`` for
    the keys it sees: ``j < ctx[b] - next_n + t + 1`` with 1-D ``context_lens``, ``j < ctx[b, t]`` with
    2-D; ``-inf`` past that when ``clean_logits``. Key j of batch b lives in block
    ``block_table[b, j // block_kv]`` at slot ``j % block_kv``.

    Args:
        q: fp8 [B, next_n, H, D].
        kv_cache: uint8 [num_blocks, block_kv, 1, D + 4]; each block's bytes are ``block_kv * D`` fp8 key
            bytes (token-major) followed by ``block_kv`` fp32 scales (DeepGEMM's layout).
        weights: fp32 [B * next_n, H].
        context_lens: int32 [B] or [B, next_n].
        block_table: int32 [B, max_blocks].
        schedule_meta: int32 [num_sms + 1, 2] from :func:`get_paged_mqa_logits_metadata`.
        max_context_len: output width (>= every visible length).
        clean_logits: write ``-inf`` past each row's visible length.
        stream: CUDA stream (``None``: current).
    """
