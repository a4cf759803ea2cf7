"""MQA logits stubs: ragged and paged, and the paged schedule (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks
from tilegemm.ops.api._stubs import FP8Operand, Tensor, op, retyped

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


_BF16_MQA_DOC = (
    "BF16 MQA logits (the indexer's scores without quantization); returns a new [S, S_kv] (or [S, max_seqlen_k]).\n"
    """
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
)

_FP4_Q = ", or DeepGEMM's ``(q, None)`` (FP4 ``(q, sf)`` raises ``NotImplementedError``)"
_LOGITS_DTYPE_DOC = "\n        logits_dtype: ``torch.float32`` or ``torch.bfloat16`` (rounded once from fp32)."


def _mqa_logits(
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


def _fp4_and_legacy_ops(
    name: str, stub: Any, doc: str, check: Any, signature: Callable[..., Any] | None = None
) -> tuple[Any, Any]:
    """The ops ``fp8_fp4_<name>`` (``q`` a tensor or DeepGEMM's ``(q, None)``; ``logits_dtype``) and ``fp8_<name>``,
    DeepGEMM's legacy form (``q`` a tensor, fp32 logits), from one stub and one docstring template (its fields
    ``q_tuple`` and ``dtype_doc``); ``signature``: the hot-lane key of a form (``fp4_form``), or None for none."""
    fp4 = op(
        f"fp8_fp4_{name}",
        stub,
        doc.format(q_tuple=_FP4_Q, dtype_doc=_LOGITS_DTYPE_DOC),
        check,
        None if signature is None else signature(fp4_form=True),
    )
    legacy = op(
        f"fp8_{name}",
        retyped(stub, drop=("logits_dtype",), q="Tensor"),
        doc.format(q_tuple="", dtype_doc="") + "\n    DeepGEMM's legacy form: fp32 logits.\n",
        check,
        None if signature is None else signature(fp4_form=False),
    )
    return fp4, legacy


fp8_fp4_mqa_logits, fp8_mqa_logits = _fp4_and_legacy_ops(
    "mqa_logits", _mqa_logits, _MQA_DOC, checks.mqa_logits_check, checks.mqa_logits_signature
)
bf16_mqa_logits = op(
    "bf16_mqa_logits",
    retyped(_mqa_logits, q="Tensor", kv="Tensor"),
    _BF16_MQA_DOC,
    checks.bf16_mqa_logits_check,
    checks.mqa_logits_signature(bf16=True),
)


@dispatch("mqa_logits_batched", check=checks.mqa_logits_batched_check, signature=checks.mqa_logits_batched_signature())
def mqa_logits_batched(
    q: Tensor,
    kv: Tensor | FP8Operand,
    weights: Tensor,
    cu_seq_len_k_start: Tensor,
    cu_seq_len_k_end: Tensor,
    clean_logits: bool = True,
    *,
    stream=None,
) -> Tensor:
    """MQA logits of ``B`` sequences in one call, each sequence's query rows against its own keys (tilegemm's
    extension: DeepGEMM's ragged ops score one key tensor per call); returns a new fp32 [B, S, T].

    ``logits[b, i, j] = kv_scale[b, j] * sum_h weights[b, i, h] * relu(q[b, i, h, :] . kv[b, j, :])`` for
    ``ks[b, i] <= j < ke[b, i]``, the products summed in fp32; ``-inf`` elsewhere when ``clean_logits``
    (unspecified otherwise). Sequence ``b`` is what ``fp8_mqa_logits`` / ``bf16_mqa_logits`` give for
    ``q[b]``, ``kv[b]``, ``weights[b]`` and its windows. A decode step of ``B`` sequences (the indexer's) runs as one
    launch of the decode kernel where that op would take it, the keys read in place.

    Args:
        q: fp8 or bf16 [B, S, H, D].
        kv: bf16 [B, T, D] with bf16 ``q``; ``(fp8 [B, T, D], fp32 [B, T])`` keys and per-key scales with fp8 ``q``.
        weights: fp32 [B, S, H].
        cu_seq_len_k_start: int32 [B, S], ``ks``; ``0 <= ks <= ke``.
        cu_seq_len_k_end: int32 [B, S], ``ke``; ``ke <= T``.
        clean_logits: write ``-inf`` outside each row's window.
        stream: CUDA stream (``None``: current).
    """


@dispatch(
    "get_paged_mqa_logits_metadata",
    check=checks.paged_mqa_metadata_check,
    signature=checks.paged_mqa_metadata_signature(),
)
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
            ``context_lens`` and ``block_kv`` (checked when value checks run); or ``None`` (tilegemm's extension:
            no schedule, each sequence's keys split over the SMs in a fixed round robin, what a decode step of a
            few sequences wants: no schedule kernel to run first).
        max_context_len: output width (>= every visible length).
        clean_logits: write ``-inf`` past each row's visible length.{dtype_doc}
        indices: DeepGEMM's varlen sequence index per row (int32 [B]); validated, no effect (the
            rows' ``context_lens`` and ``block_table`` already say everything).
        stream: CUDA stream (``None``: current).
    """


def _paged_mqa_logits(
    q: tuple[Tensor, Tensor | None] | Tensor,
    kv_cache: Tensor,
    weights: Tensor,
    context_lens: Tensor,
    block_table: Tensor,
    schedule_meta: Tensor | None,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: torch.dtype = torch.float32,
    indices: Tensor | None = None,
    *,
    stream=None,
) -> Tensor: ...


fp8_fp4_paged_mqa_logits, fp8_paged_mqa_logits = _fp4_and_legacy_ops(
    "paged_mqa_logits",
    _paged_mqa_logits,
    _PAGED_DOC,
    checks.paged_mqa_logits_check,
    checks.paged_mqa_logits_signature,
)


# ------------------------------------------------------------------------------------ FP8 operands of the MQA ops


@dispatch("fp8_quantize_rows", check=checks.fp8_quantize_rows_check)
def fp8_quantize_rows(x: Tensor, *, hadamard: bool = False, stream=None) -> tuple[Tensor, Tensor]:
    """DeepSeek's FP8 cast of the indexer's rows (tilegemm's extension): one scale per row of the last dimension,
    after the orthonormal Hadamard rotation with ``hadamard``; the ``q`` and ``kv`` operands of
    :func:`fp8_mqa_logits` and :func:`mqa_logits_batched` in one kernel.

    Args:
        x: [..., D] bf16, fp16 or fp32, any strides (D a power of two with ``hadamard``).
        hadamard: (keyword) rotate first: ``y = x @ H`` with ``H`` the orthonormal Sylvester-Hadamard matrix of D
            (``H @ H.T = I``, so ``(x H) . (k H) = x . k``); otherwise ``y = x``.
        stream: CUDA stream (``None``: current).

    Returns:
        ``(q, s)``: float8_e4m3fn of ``x``'s shape and fp32 ``x.shape[:-1]``, ``s = max(amax(|y|), 1e-4) / 448``
        and ``q = fp8(clamp(y / s, -448, 448))`` per row (``y ~= q * s``). The ``pytorch`` backend computes ``y``
        as an fp32 matmul; the ``cutile`` kernel sums the same exact products on the tensor cores in another
        order, so a value may round to the neighbouring FP8 value.
    """


@dispatch("fp8_paged_append", check=checks.fp8_paged_append_check)
def fp8_paged_append(
    x: Tensor, kv_cache: Tensor, block_table: Tensor, context_lens: Tensor, *, hadamard: bool = False, stream=None
) -> Tensor:
    """Append keys to a paged FP8 cache (tilegemm's extension): :func:`fp8_quantize_rows` of ``x`` written in place
    into DeepGEMM's layout (the ``kv_cache`` of :func:`fp8_paged_mqa_logits`), one kernel, no host sync.

    Args:
        x: [B, S, D] bf16, fp16 or fp32: S new keys per sequence.
        kv_cache: uint8 [num_blocks, block_kv, 1, D + 4], contiguous; block ``blk`` holds ``block_kv * D`` key
            bytes (token-major) then ``block_kv`` fp32 scales.
        block_table: int32 [B, max_blocks]: key j of sequence b lives in block ``block_table[b, j // block_kv]``,
            slot ``j % block_kv``.
        context_lens: int32 or int64 [B] (or [1] / [] for every sequence): each sequence's length after the
            append, so token s goes to key ``context_lens[b] - S + s`` (DeepGEMM's ``context_lens`` of the
            next decode step; a transformers static cache's ``indexer_cumulative_length`` after its update).
        hadamard: (keyword) rotate the keys first, as :func:`fp8_quantize_rows` does.
        stream: CUDA stream (``None``: current).

    Returns:
        ``kv_cache``, with those keys and scales written and nothing else. Every written key must lie inside the
        table (``S <= context_lens[b] <= max_blocks * block_kv``) and every block it names inside the cache:
        value checks say so on CPU tensors (or with ``TILEGEMM_CHECK_VALUES=1``); on the GPU the kernel writes
        nothing outside them.
    """


@dispatch(
    "indexer_decode_prepare",
    check=checks.indexer_decode_prepare_check,
    signature=checks.indexer_decode_prepare_signature(),
)
def indexer_decode_prepare(
    weights: Tensor,
    attention_mask: Tensor | None = None,
    *,
    weight_scale: float = 1.0,
    stream=None,
) -> tuple[Tensor, Tensor | None]:
    """The head weights and key window ends of a decode step of DeepSeek's indexer, in one kernel (tilegemm's
    extension): the operands :func:`mqa_logits_batched` takes beside the queries and keys (with window starts 0).

    Args:
        weights: [B, S, H] float head weights.
        attention_mask: ``None``, or the step's mask ``[B, S, T]``: boolean (True: visible) or additive float
            (visible where above its dtype's lowest value, as transformers marks hidden keys).
        weight_scale: (keyword) a factor of every weight (the softmax scale, say).
        stream: CUDA stream (``None``: current).

    Returns:
        ``(w, ends)``: fp32 ``[B, S, H]`` ``weights * weight_scale`` (fp32), and with a mask int32 ``[B, S]``, each
        mask row's last visible key + 1 (0 where it shows none), else ``None``: what :func:`fp8_indexer_prepare`
        gives for those two, without its queries and keys.
    """


@dispatch(
    "fp8_indexer_prepare", check=checks.fp8_indexer_prepare_check, signature=checks.fp8_indexer_prepare_signature()
)
def fp8_indexer_prepare(
    q: Tensor,
    k: Tensor,
    weights: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    *,
    hadamard: bool = False,
    weight_scale: float = 1.0,
    attention_mask: Tensor | None = None,
    stream=None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The operands of a decode step of DeepSeek's indexer over a paged FP8 key cache, in one kernel (tilegemm's
    extension): :func:`fp8_paged_append` of the step's keys ``k``, :func:`fp8_quantize_rows` of its queries ``q``,
    the query scales folded into the head weights, and the query rows' key window ends under an attention mask;
    then :func:`fp8_paged_mqa_logits` scores the step (the window ends as its ``context_lens``).

    Args:
        q: [B, S, H, D] bf16, fp16 or fp32 queries (D a power of two with ``hadamard``).
        k: [B, S', D] of ``q``'s float dtypes: the keys to append (``S'`` new tokens a sequence, ``S`` at a step).
        weights: [B, S, H] float head weights.
        kv_cache, block_table, context_lens: as :func:`fp8_paged_append` takes them (``context_lens``: the lengths
            after the append).
        hadamard: (keyword) rotate queries and keys first, as :func:`fp8_quantize_rows` does.
        weight_scale: (keyword) a factor of every weight (the softmax scale and ``H**-0.5``, say).
        attention_mask: (keyword) ``None``, or the step's mask ``[B, S, T]``: boolean (True: visible) or additive
            float (visible where above its dtype's lowest value, as transformers marks hidden keys).
        stream: CUDA stream (``None``: current).

    Returns:
        ``(q_fp8, w, ends)``: float8_e4m3fn ``[B, S, H, D]`` and fp32 ``[B, S, H]``, where ``(q_fp8, s) =
        fp8_quantize_rows(q, hadamard=hadamard)`` and ``w = weights * weight_scale * s`` (fp32, in that order); with
        a mask, ``ends`` int32 ``[B, S]``: each mask row's last visible key + 1 (0 where it shows none), else
        ``None``. The keys written into ``kv_cache`` as :func:`fp8_paged_append` writes them, under its conditions.
    """
