"""Checks of the MQA logits ops (ragged FP8 and BF16, paged), the paged metadata, and the paged ops' hot-lane keys."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tilegemm import config
from tilegemm.env import MQA_VARIANT
from tilegemm.ops.checks import hot
from tilegemm.ops.checks.base import (
    FP8,
    INT32_MAX,
    _bool,
    _describe,
    _dtype_arg,
    _fp8_operand,
    _int,
    _same_device,
    _shape,
    _stream,
    _tensor,
    value_checks_enabled,
)
from tilegemm.ops.common import paged_mqa_schedule

# ------------------------------------------------------------------------------ MQA logits

LOGITS_DTYPES = (torch.float32, torch.bfloat16)


def _q_operand(q: Any, ndim: int) -> torch.Tensor:
    """``q`` as an FP8 tensor: DeepGEMM's ``(q, None)`` tuple or the tensor itself; FP4 ``(q, sf)`` is refused."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2 or not (q[1] is None or isinstance(q[1], torch.Tensor)):
            raise TypeError(f"q: got {_describe(q)}, expected an fp8 tensor or a (fp8 tensor, None) tuple")
        if q[1] is not None:
            raise NotImplementedError("q: FP4 queries with scale factors are DeepGEMM's SM100 path; pass (q, None)")
        q = q[0]
    if isinstance(q, torch.Tensor) and q.dtype in (torch.int8, torch.uint8):
        raise NotImplementedError(f"q: FP4 queries (packed e2m1 in {q.dtype}) are DeepGEMM's SM100 path")
    return _tensor("q", q, (FP8,), ndim)


def _weights(weights: Any, shape: Sequence[int], meaning: str, logits_dtype: torch.dtype) -> None:
    _tensor("weights", weights, (torch.float32, torch.bfloat16), 2)
    _shape("weights", weights, shape, meaning)
    if weights.dtype == torch.bfloat16 and logits_dtype != torch.bfloat16:
        raise TypeError("weights: bf16 weights need logits_dtype=torch.bfloat16 (DeepGEMM's rule)")


def _windowed(operands, kv, ks, ke, clean_logits, max_seqlen_k, logits_dtype, stream, s, s_kv) -> dict[str, Any]:
    """The rest of an MQA-logits check once ``q``, ``kv`` and ``weights`` passed (``operands``: those tensors by
    the names errors give them): the int32 windows ``ks``/``ke`` [S] and their values, the flags, the stream, one
    device; returns the derived arguments."""
    for name, x in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        _tensor(name, x, (torch.int32,), 1)
        _shape(name, x, [s], "[S], one per query")
    _bool("clean_logits", clean_logits)
    _int("max_seqlen_k", max_seqlen_k, 0, INT32_MAX)
    _stream(stream)
    _same_device({**operands, "cu_seq_len_k_start": ks, "cu_seq_len_k_end": ke})
    _window_values(ks, ke, s, s_kv)
    return dict(
        q=operands["q"],
        kv=kv,
        weights=operands["weights"],
        cu_seq_len_k_start=ks,
        cu_seq_len_k_end=ke,
        clean_logits=clean_logits,
        max_seqlen_k=int(max_seqlen_k),
        logits_dtype=logits_dtype,
        stream=stream,
    )


def _window_values(ks: torch.Tensor, ke: torch.Tensor, s: int, s_kv: int) -> None:
    """Every query's window ``[ks, ke)`` lies in ``[0, S_kv]`` (a value check: reads device memory)."""
    if value_checks_enabled(ks.device) and s:
        bad = (ks < 0) | (ks > ke) | (ke > s_kv)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"cu_seq_len_k_start, cu_seq_len_k_end: query {i} has window [{int(ks[i])}, {int(ke[i])}), "
                f"expected 0 <= start <= end <= S_kv={s_kv}"
            )


def _fp8_operands(q: Any, kv: Any, weights: Any, logits_dtype: Any) -> tuple[dict[str, Any], Any, int, int]:
    """``q``, ``kv`` and ``weights`` of ``fp8_fp4_mqa_logits`` / ``fp8_mqa_logits`` (and ``logits_dtype``): fp8
    ``q`` [S, H, D], ``kv`` (fp8 [S_kv, D], fp32 [S_kv]); returns :func:`_windowed`'s ``operands`` and ``kv``, S and
    S_kv."""
    q = _q_operand(q, 3)
    kv_data, kv_scale = _fp8_operand("kv", kv, 2)
    s, h, dim = q.shape
    s_kv = kv_data.shape[0]
    _shape("kv[0] (data)", kv_data, [s_kv, dim], f"[S_kv, D={dim}]")
    _tensor("kv[1] (scales)", kv_scale, (torch.float32,), 1)
    _shape("kv[1] (scales)", kv_scale, [s_kv], "[S_kv], one per key")
    _dtype_arg("logits_dtype", logits_dtype, LOGITS_DTYPES)
    _weights(weights, [s, h], "[S, H]", logits_dtype)
    operands = {"q": q, "kv[0] (data)": kv_data, "kv[1] (scales)": kv_scale, "weights": weights}
    return operands, (kv_data, kv_scale), s, s_kv


def _bf16_operands(q: Any, kv: Any, weights: Any, logits_dtype: Any) -> tuple[dict[str, Any], Any, int, int]:
    """``q``, ``kv`` and ``weights`` of ``bf16_mqa_logits`` (and ``logits_dtype``), as :func:`_fp8_operands`'s."""
    if isinstance(q, (tuple, list)):
        raise TypeError(f"q: got {_describe(q)}, expected a bf16 torch.Tensor [S, H, D] (no scale tuple)")
    if isinstance(kv, (tuple, list)):
        raise TypeError(f"kv: got {_describe(kv)}, expected a bf16 torch.Tensor [S_kv, D] (no scale tuple)")
    _tensor("q", q, (torch.bfloat16,), 3)
    _tensor("kv", kv, (torch.bfloat16,), 2)
    s, h, dim = q.shape
    s_kv = kv.shape[0]
    _shape("kv", kv, [s_kv, dim], f"[S_kv, D={dim}]")
    _dtype_arg("logits_dtype", logits_dtype, LOGITS_DTYPES)
    _tensor("weights", weights, (torch.float32,), 2)
    _shape("weights", weights, [s, h], "[S, H]")
    return {"q": q, "kv": kv, "weights": weights}, kv, s, s_kv


def _logits_check(name: str, operands: Callable[..., tuple[dict[str, Any], Any, int, int]], doc: str) -> Any:
    """The check ``name`` of a ragged MQA-logits op: ``operands`` (:func:`_fp8_operands`, :func:`_bf16_operands`)
    checks ``q``, ``kv`` and ``weights``, :func:`_windowed` the rest."""

    def check(
        q,
        kv,
        weights,
        cu_seq_len_k_start,
        cu_seq_len_k_end,
        clean_logits=True,
        max_seqlen_k=0,
        logits_dtype=torch.float32,
        *,
        stream=None,
    ) -> dict[str, Any]:
        named, kv, s, s_kv = operands(q, kv, weights, logits_dtype)
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        return _windowed(named, kv, ks, ke, clean_logits, max_seqlen_k, logits_dtype, stream, s, s_kv)

    check.__name__ = check.__qualname__ = name
    check.__doc__ = doc
    return check


mqa_logits_check = _logits_check(
    "mqa_logits_check",
    _fp8_operands,
    """The check of ``fp8_fp4_mqa_logits`` / ``fp8_mqa_logits``.

    Derived: ``q`` (the fp8 tensor), ``kv``, ``weights``, ``cu_seq_len_k_start``, ``cu_seq_len_k_end``,
    ``clean_logits``, ``max_seqlen_k``, ``logits_dtype``, ``stream``.
    """,
)
bf16_mqa_logits_check = _logits_check(
    "bf16_mqa_logits_check",
    _bf16_operands,
    """The check of ``bf16_mqa_logits``: bf16 ``q`` [S, H, D] and ``kv`` [S_kv, D] (no scales), fp32 ``weights``
    [S, H], int32 windows; derived as :func:`mqa_logits_check`'s, with ``kv`` the bf16 tensor.""",
)


def _context_lens(context_lens: Any, batch: int | None, next_n: int | None) -> None:
    if not isinstance(context_lens, torch.Tensor):
        raise TypeError(f"context_lens: got {_describe(context_lens)}, expected an int32 torch.Tensor")
    if context_lens.dtype != torch.int32:
        raise TypeError(f"context_lens: got dtype {context_lens.dtype}, expected torch.int32")
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens: got shape {list(context_lens.shape)}, expected [B] or [B, next_n]")
    if batch is not None:
        expected = [batch] if context_lens.dim() == 1 else [batch, next_n]
        _shape("context_lens", context_lens, expected, "[B] or [B, next_n]")


def _indices(indices: Any, batch: int) -> None:
    """DeepGEMM's varlen ``indices`` (int32 [B], each row's sequence): validated; the math does not depend on it."""
    if indices is None:
        return
    _tensor("indices", indices, (torch.int32,), 1)
    _shape("indices", indices, [batch], "[B], the sequence of each row")


def mqa_logits_batched_check(
    q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, *, stream=None
) -> dict[str, Any]:
    """The check of ``mqa_logits_batched``: ``q`` fp8 or bf16 [B, S, H, D]; ``kv`` bf16 [B, T, D] (bf16 ``q``) or
    (fp8 [B, T, D], fp32 [B, T]) (fp8 ``q``); ``weights`` fp32 [B, S, H]; int32 windows [B, S] inside ``[0, T]``
    (a value check). Derived: the same, ``kv`` as given."""
    _tensor("q", q, (FP8, torch.bfloat16), 4)
    batch, s, h, dim = q.shape
    if q.dtype == torch.bfloat16:
        if isinstance(kv, (tuple, list)):
            raise TypeError(f"kv: got {_describe(kv)}, expected a bf16 torch.Tensor [B, T, D] with bf16 q")
        _tensor("kv", kv, (torch.bfloat16,), 3)
        keys = kv.shape[1]
        _shape("kv", kv, [batch, keys, dim], f"[B={batch}, T, D={dim}]")
        named = {"q": q, "kv": kv}
    else:
        kv_data, kv_scale = _fp8_operand("kv", kv, 3)
        keys = kv_data.shape[1]
        _shape("kv[0] (data)", kv_data, [batch, keys, dim], f"[B={batch}, T, D={dim}]")
        _tensor("kv[1] (scales)", kv_scale, (torch.float32,), 2)
        _shape("kv[1] (scales)", kv_scale, [batch, keys], "[B, T], one per key")
        named = {"q": q, "kv[0] (data)": kv_data, "kv[1] (scales)": kv_scale}
    _tensor("weights", weights, (torch.float32,), 3)
    _shape("weights", weights, [batch, s, h], "[B, S, H]")
    for name, x in (("cu_seq_len_k_start", cu_seq_len_k_start), ("cu_seq_len_k_end", cu_seq_len_k_end)):
        _tensor(name, x, (torch.int32,), 2)
        _shape(name, x, [batch, s], "[B, S], one per query")
    _bool("clean_logits", clean_logits)
    _stream(stream)
    _same_device(
        {**named, "weights": weights, "cu_seq_len_k_start": cu_seq_len_k_start, "cu_seq_len_k_end": cu_seq_len_k_end}
    )
    _window_values(cu_seq_len_k_start.reshape(-1), cu_seq_len_k_end.reshape(-1), batch * s, keys)
    derived = dict(q=q, kv=kv, weights=weights, clean_logits=clean_logits, stream=stream)
    return dict(derived, cu_seq_len_k_start=cu_seq_len_k_start, cu_seq_len_k_end=cu_seq_len_k_end)


def mqa_logits_batched_signature() -> hot.HotLane:
    """The hot-lane key of ``mqa_logits_batched``: as :func:`mqa_logits_signature`'s, over its arguments (fp8 ``q``
    with ``(keys, fp32 scales)`` or bf16 ``q`` and keys, all contiguous); the replay takes ``(q, kv, weights,
    cu_seq_len_k_start, cu_seq_len_k_end)``."""
    i32 = hot.packed(torch.int32)
    kinds = dict(q=hot.packed(FP8, torch.bfloat16), kv=_batched_keys, weights=hot.packed(torch.float32))
    kinds.update(cu_seq_len_k_start=i32, cu_seq_len_k_end=i32, clean_logits=hot.exact(bool), stream=hot.none)
    operands = _replay_operands(("q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end"), False)
    return hot.HotLane(kinds, operands, setting=_mqa_settings, value_checks=True)


_FP8_KEYS = hot.packed_pair(FP8, torch.float32)
_BF16_KEYS = hot.packed(torch.bfloat16)


def _batched_keys(x: Any) -> Any:
    """``kv`` of a batched call: bf16 keys, or fp8 keys with fp32 scales (contiguous)."""
    return _FP8_KEYS(x) if type(x) is tuple else _BF16_KEYS(x)


def paged_mqa_metadata_check(context_lens, block_kv, num_sms, indices=None) -> dict[str, Any]:
    """The check of ``get_paged_mqa_logits_metadata``; derived: ``context_lens``, ``block_kv``, ``num_sms``."""
    _context_lens(context_lens, None, None)
    _int("block_kv", block_kv, 1, INT32_MAX)
    _int("num_sms", num_sms, 1, INT32_MAX)
    _indices(indices, context_lens.shape[0])
    _same_device(dict(context_lens=context_lens, indices=indices))
    if value_checks_enabled(context_lens.device):
        _nonnegative_lengths(context_lens)
    return dict(context_lens=context_lens, block_kv=block_kv, num_sms=num_sms)


def paged_mqa_metadata_signature() -> hot.HotLane:
    """The hot-lane key of ``get_paged_mqa_logits_metadata``: the replay takes ``(context_lens,)``; the key holds its
    shape and device, ``block_kv`` and ``num_sms``. Calls with ``indices``, lengths other than contiguous int32, or
    with value checks on take the full path."""
    kinds = dict(
        context_lens=hot.packed(torch.int32), block_kv=hot.exact(int), num_sms=hot.exact(int), indices=hot.none
    )
    return hot.HotLane(kinds, {"context_lens": None}, value_checks=True)


def _nonnegative_lengths(context_lens: torch.Tensor) -> None:
    if context_lens.numel() and bool((context_lens < 0).any()):
        raise ValueError(f"context_lens: got a negative length (min {int(context_lens.min())}), expected >= 0")


def visible_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Keys row ``(b, t)`` sees, as int64 [B, next_n]: ``ctx[b] - next_n + t + 1`` (1-D) or ``ctx[b, t]`` (2-D)."""
    if context_lens.dim() == 2:
        return context_lens.long()
    offsets = torch.arange(next_n, device=context_lens.device) - next_n + 1
    return context_lens.long()[:, None] + offsets[None, :]


def paged_mqa_logits_check(
    q,
    kv_cache,
    weights,
    context_lens,
    block_table,
    schedule_meta,
    max_context_len,
    clean_logits=False,
    logits_dtype=torch.float32,
    indices=None,
    *,
    stream=None,
) -> dict[str, Any]:
    """The check of ``fp8_fp4_paged_mqa_logits`` / ``fp8_paged_mqa_logits``.

    Derived: ``q`` (the fp8 tensor), ``kv_cache``, ``weights``, ``context_lens``, ``block_table``,
    ``schedule_meta``, ``max_context_len``, ``clean_logits``, ``logits_dtype``, ``stream``.
    """
    q = _q_operand(q, 4)
    batch, next_n, h, dim = q.shape
    _tensor("kv_cache", kv_cache, (torch.uint8,), 4)
    num_blocks, block_kv = kv_cache.shape[0], kv_cache.shape[1]
    if kv_cache.shape[2] != 1 or kv_cache.shape[3] != dim + 4:
        raise ValueError(
            f"kv_cache: got shape {list(kv_cache.shape)}, expected [num_blocks, block_kv, 1, D + 4 = {dim + 4}]"
        )
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous (its bytes hold keys then scales per block)")
    _dtype_arg("logits_dtype", logits_dtype, LOGITS_DTYPES)
    _weights(weights, [batch * next_n, h], "[B * next_n, H]", logits_dtype)
    _context_lens(context_lens, batch, next_n)
    _tensor("block_table", block_table, (torch.int32,), 2)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: got shape {list(block_table.shape)}, expected [B={batch}, max_blocks]")
    if schedule_meta is not None:
        _tensor("schedule_meta", schedule_meta, (torch.int32,), 2)
        if schedule_meta.shape[0] < 2 or schedule_meta.shape[1] != 2:
            raise ValueError(f"schedule_meta: got shape {list(schedule_meta.shape)}, expected [num_sms + 1, 2]")
    _int("max_context_len", max_context_len, 0, INT32_MAX)
    _bool("clean_logits", clean_logits)
    _indices(indices, batch)
    _stream(stream)
    tensors = dict(q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens)
    tensors.update(block_table=block_table, schedule_meta=schedule_meta)
    _same_device(dict(tensors, indices=indices))
    if value_checks_enabled(block_table.device):
        _paged_values(context_lens, block_table, schedule_meta, next_n, num_blocks, block_kv, max_context_len)
    return dict(
        tensors,
        max_context_len=max_context_len,
        clean_logits=clean_logits,
        logits_dtype=logits_dtype,
        stream=stream,
    )


def mqa_logits_signature(fp4_form: bool = False, bf16: bool = False) -> hot.HotLane:
    """The hot-lane key of ``fp8_fp4_mqa_logits`` (``fp4_form``), ``fp8_mqa_logits`` or ``bf16_mqa_logits``
    (``bf16``): the replay takes ``(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end)``.

    The key holds the shape, dtype and device of every tensor, ``clean_logits``, ``max_seqlen_k``, ``logits_dtype``
    and the settings the config reads (``set_num_sms``, ``$TILEGEMM_MQA_VARIANT``). Calls with a ``stream``, a
    non-contiguous tensor, dtypes other than the kernels' own (fp8 ``q`` and keys with fp32 key scales, or bf16
    ``q`` and keys; fp32 weights; int32 windows), or with value checks on take the full path.
    """
    i32 = hot.packed(torch.int32)
    if bf16:
        q_kind, kv_kind = hot.packed(torch.bfloat16), hot.packed(torch.bfloat16)
    else:
        q_kind = hot.packed_or_pair_with_none(FP8) if fp4_form else hot.packed(FP8)
        kv_kind = hot.packed_pair(FP8, torch.float32)
    kinds = dict(q=q_kind, kv=kv_kind, weights=hot.packed(torch.float32), stream=hot.none)
    kinds.update(cu_seq_len_k_start=i32, cu_seq_len_k_end=i32, max_seqlen_k=hot.exact(int))
    kinds.update(clean_logits=hot.exact(bool), logits_dtype=hot.one_of(LOGITS_DTYPES))
    operands = _replay_operands(("q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end"), fp4_form)
    return hot.HotLane(kinds, operands, setting=_mqa_settings, value_checks=True)


def _replay_operands(names: tuple[str, ...], fp4_form: bool) -> dict[str, Any]:
    """A replay's operands: the arguments ``names`` as given, ``q`` as its tensor in the fp8_fp4 form."""
    operands: dict[str, Any] = {name: None for name in names}
    if fp4_form:
        operands["q"] = hot.first_of_pair
    return operands


def _mqa_settings() -> tuple[int, str | None]:
    """The global settings the MQA configs read: ``set_num_sms`` (the decode kernel's grid) and
    ``$TILEGEMM_MQA_VARIANT``."""
    return config._num_sms, os.environ.get(MQA_VARIANT) or None


def paged_mqa_logits_signature(fp4_form: bool) -> hot.HotLane:
    """The hot-lane key of ``fp8_fp4_paged_mqa_logits`` (``fp4_form``) or ``fp8_paged_mqa_logits``: the replay
    takes ``(q, kv_cache, weights, context_lens, block_table, schedule_meta)``.

    The key holds the shape, dtype and device of every tensor (``schedule_meta`` may be ``None``),
    ``max_context_len``, ``clean_logits``, ``logits_dtype`` and the settings the config reads (``set_num_sms``: the
    grid without a schedule). Calls with a ``stream``, ``indices``, a non-contiguous tensor, dtypes other than the
    canonical ones (fp8 ``q``, uint8 cache, int32 lengths/table/schedule, fp32 weights, or bf16 in the fp8_fp4
    form, whose check pairs them with bf16 logits), or with value checks on (``TILEGEMM_CHECK_VALUES=1``)
    take the full path.
    """
    i32 = hot.packed(torch.int32)
    kinds = dict(
        q=hot.packed_or_pair_with_none(FP8) if fp4_form else hot.packed(FP8),
        kv_cache=hot.packed(torch.uint8),
        weights=hot.packed(torch.float32, torch.bfloat16) if fp4_form else hot.packed(torch.float32),
        context_lens=i32,
        block_table=i32,
        schedule_meta=hot.optional(i32),
        max_context_len=hot.exact(int),
        clean_logits=hot.exact(bool),
        logits_dtype=hot.one_of(LOGITS_DTYPES),
        indices=hot.none,
        stream=hot.none,
    )
    names = ("q", "kv_cache", "weights", "context_lens", "block_table", "schedule_meta")
    return hot.HotLane(kinds, _replay_operands(names, fp4_form), setting=_mqa_settings, value_checks=True)


def _paged_values(
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    next_n: int,
    num_blocks: int,
    block_kv: int,
    max_context_len: int,
) -> None:
    """The value checks of the paged MQA logits: lengths, the block table, the schedule."""
    _nonnegative_lengths(context_lens)
    visible = visible_lengths(context_lens, next_n)
    if visible.numel():
        _paged_block_table(visible, block_table, num_blocks, block_kv, max_context_len)
    if schedule_meta is None:
        return
    expected = paged_mqa_schedule(context_lens, block_kv, schedule_meta.shape[0] - 1)
    if not torch.equal(schedule_meta, expected):
        raise ValueError(
            "schedule_meta: does not match get_paged_mqa_logits_metadata(context_lens, block_kv="
            f"{block_kv}, num_sms={schedule_meta.shape[0] - 1}) (built for other lengths or another block size?)"
        )


def _paged_block_table(
    visible: torch.Tensor, block_table: torch.Tensor, num_blocks: int, block_kv: int, max_context_len: int
) -> None:
    """Every row's visible keys fit ``max_context_len`` and the table, whose used entries name real blocks."""
    longest = int(visible.max())
    if longest > max_context_len:
        raise ValueError(f"max_context_len: got {max_context_len}, but a row sees {longest} keys")
    if longest > block_table.shape[1] * block_kv:
        raise ValueError(
            f"block_table: {block_table.shape[1]} blocks of {block_kv} keys cover {block_table.shape[1] * block_kv} "
            f"keys, but a row sees {longest}"
        )
    used_blocks = (visible.max(dim=1).values.clamp(min=0) + block_kv - 1) // block_kv
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    used = cols[None, :] < used_blocks[:, None]
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        b, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"block_table: batch {b} slot {col} holds block {int(block_table[b, col])}, "
            f"expected 0..{num_blocks - 1} (kv_cache has {num_blocks} blocks)"
        )


# ------------------------------------------------------------------------------ the indexers' scoring


def index_scores_check(q, k, weights, attention_mask, softmax_scale) -> None:
    """The inputs of :func:`tilegemm.indexer.index_scores` (not an op: the transformers indexers' scoring), checked
    before any kernel runs: float ``q [B, S, H, D]``, ``k [B, T, D]``, ``weights [B, S, H]``, a bool or float
    ``attention_mask [B, S, T]`` or ``None``, ``softmax_scale > 0``."""
    for name, x, ndim in (("q", q, 4), ("k", k, 3), ("weights", weights, 3)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: got {type(x).__name__}, expected a torch.Tensor")
        if x.dim() != ndim:
            raise ValueError(f"{name}: got shape {list(x.shape)}, expected {ndim}-D")
        if not x.is_floating_point():
            raise TypeError(f"{name}: got dtype {x.dtype}, expected a float tensor")
    batch, rows, heads, dim = q.shape
    if k.shape[0] != batch or k.shape[2] != dim:
        raise ValueError(f"k: got shape {list(k.shape)}, expected [B={batch}, T, D={dim}]")
    if tuple(weights.shape) != (batch, rows, heads):
        raise ValueError(f"weights: got shape {list(weights.shape)}, expected [B, S, H] = {[batch, rows, heads]}")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"attention_mask: got {type(attention_mask).__name__}, expected a torch.Tensor or None")
        if attention_mask.dim() != 3 or tuple(attention_mask.shape) != (batch, rows, k.shape[1]):
            raise ValueError(
                f"attention_mask: got shape {list(attention_mask.shape)}, "
                f"expected [B, S, T] = {[batch, rows, k.shape[1]]}"
            )
        if attention_mask.dtype != torch.bool and not attention_mask.is_floating_point():
            raise TypeError(f"attention_mask: got dtype {attention_mask.dtype}, expected bool or a float dtype")
    if not softmax_scale > 0:
        raise ValueError(f"softmax_scale: got {softmax_scale}, expected a positive number")
