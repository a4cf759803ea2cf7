"""Checks of the ops that make the MQA ops' operands (``ops/cutile/mqa_prep.py``): the FP8 row cast, the paged
append, the indexer's decode-step prepare ops, and their hot-lane keys."""

from __future__ import annotations

import math
from typing import Any

import torch

from tilegemm.ops.checks import hot
from tilegemm.ops.checks.base import (
    FLOATS,
    _bool,
    _same_device,
    _scalar,
    _shape,
    _stream,
    _tensor,
    value_checks_enabled,
)
from tilegemm.ops.common import append_positions


def _fp8_rows(name: str, x: Any, ndim: int | None, shape: str, hadamard: Any) -> int:
    """A float ``x`` of ``ndim`` dims (``None``: at least 1), rows of ``D >= 1`` (a power of two with ``hadamard``, a
    bool); returns ``D``."""
    _tensor(name, x, FLOATS, ndim)
    _bool("hadamard", hadamard)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name}: got shape {list(x.shape)}, expected {shape} with D >= 1")
    dim = x.shape[-1]
    if hadamard and dim & (dim - 1):
        raise ValueError(f"{name}: got rows of {dim} elements; the Hadamard rotation needs a power of two")
    return dim


def fp8_quantize_rows_check(x, *, hadamard=False, stream=None) -> dict[str, Any]:
    """The check of ``fp8_quantize_rows``: a float ``x [..., D]`` (D a power of two with ``hadamard``), a bool
    ``hadamard``; derived: ``x``, ``hadamard``, ``stream``."""
    _fp8_rows("x", x, None, "[..., D]", hadamard)
    _stream(stream)
    return dict(x=x, hadamard=hadamard, stream=stream)


def fp8_paged_append_check(x, kv_cache, block_table, context_lens, *, hadamard=False, stream=None) -> dict[str, Any]:
    """The check of ``fp8_paged_append``: float ``x [B, S, D]``; a contiguous uint8 ``kv_cache [num_blocks,
    block_kv, 1, D + 4]``; int32 ``block_table [B, max_blocks]``; int32 or int64 ``context_lens`` ``[B]``, ``[1]``
    or ``[]``. Value checks: every written position ``context_lens[b] - S + s`` inside the table, every block it
    names inside the cache. Derived: every argument by name."""
    dim = _fp8_rows("x", x, 3, "[B, S, D]", hadamard)
    batch, count = x.shape[0], x.shape[1]
    _tensor("kv_cache", kv_cache, (torch.uint8,), 4)
    if kv_cache.shape[2] != 1 or kv_cache.shape[3] != dim + 4 or kv_cache.shape[1] % 4:
        raise ValueError(
            f"kv_cache: got shape {list(kv_cache.shape)}, expected [num_blocks, block_kv (a multiple of 4), 1, "
            f"D + 4 = {dim + 4}]"
        )
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous (its bytes hold keys then scales per block)")
    _tensor("block_table", block_table, (torch.int32,), 2)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: got shape {list(block_table.shape)}, expected [B={batch}, max_blocks]")
    _tensor("context_lens", context_lens, (torch.int32, torch.int64), None)
    if context_lens.numel() not in (1, batch) or context_lens.dim() > 1:
        raise ValueError(
            f"context_lens: got shape {list(context_lens.shape)}, expected [B={batch}], [1] or [] (one length for all)"
        )
    _stream(stream)
    tensors = dict(x=x, kv_cache=kv_cache, block_table=block_table, context_lens=context_lens)
    _same_device(tensors)
    if count and batch and value_checks_enabled(x.device):
        _append_values(context_lens, block_table, count, kv_cache.shape[0], kv_cache.shape[1])
    return dict(tensors, hadamard=hadamard, stream=stream)


#: The dtypes of an attention mask: boolean (True: visible) or additive float.
MASK_DTYPES = (torch.bool, *FLOATS)


def _mask_check(attention_mask: Any, batch: int, count: int) -> None:
    """``attention_mask``: ``None`` or ``[B, S, T]`` of :data:`MASK_DTYPES`."""
    if attention_mask is not None:
        _tensor("attention_mask", attention_mask, MASK_DTYPES, 3)
        if list(attention_mask.shape[:2]) != [batch, count]:
            raise ValueError(
                f"attention_mask: got shape {list(attention_mask.shape)}, expected [B={batch}, S={count}, T]"
            )


def indexer_decode_prepare_check(weights, attention_mask=None, *, weight_scale=1.0, stream=None) -> dict[str, Any]:
    """The check of ``indexer_decode_prepare``: float ``weights [B, S, H]``, ``attention_mask`` ``None`` or
    ``[B, S, T]`` of :data:`MASK_DTYPES` on its device, a finite ``weight_scale``. Derived: every argument by name
    (``weight_scale`` a float)."""
    _tensor("weights", weights, FLOATS, 3)
    _mask_check(attention_mask, weights.shape[0], weights.shape[1])
    scale = _scalar("weight_scale", weight_scale)
    if not math.isfinite(scale):
        raise ValueError(f"weight_scale: got {weight_scale}, expected a finite number")
    _stream(stream)
    _same_device(dict(weights=weights, attention_mask=attention_mask))
    return dict(weights=weights, attention_mask=attention_mask, weight_scale=scale, stream=stream)


def indexer_decode_prepare_signature() -> hot.HotLane:
    """The hot-lane key of ``indexer_decode_prepare``: the replay takes ``(weights, attention_mask)``; the key holds
    their shapes, dtypes and devices (the mask's, or ``None``) and ``weight_scale``. Calls with a ``stream`` or a
    non-contiguous tensor take the full path."""
    kinds = dict(weights=hot.packed(*FLOATS), attention_mask=hot.optional(hot.packed(*MASK_DTYPES)))
    kinds.update(weight_scale=hot.exact(float, int), stream=hot.none)
    return hot.HotLane(kinds, dict.fromkeys(("weights", "attention_mask")))


def fp8_indexer_prepare_check(
    q,
    k,
    weights,
    kv_cache,
    block_table,
    context_lens,
    *,
    hadamard=False,
    weight_scale=1.0,
    attention_mask=None,
    stream=None,
) -> dict[str, Any]:
    """The check of ``fp8_indexer_prepare``: float ``q [B, S, H, D]`` and ``weights [B, S, H]``; the keys ``k`` and
    the cache as :func:`fp8_paged_append_check` has them (``k [B, S', D]``, D the queries'); a finite
    ``weight_scale``; ``attention_mask`` ``None`` or ``[B, S, T]`` of :data:`MASK_DTYPES`. Derived: every argument
    by name (``weight_scale`` a float)."""
    dim = _fp8_rows("q", q, 4, "[B, S, H, D]", hadamard)
    batch, count, heads = q.shape[:3]
    _tensor("weights", weights, FLOATS, 3)
    _shape("weights", weights, [batch, count, heads], f"[B={batch}, S={count}, H={heads}]")
    _fp8_rows("k", k, 3, "[B, S, D]", hadamard)
    _shape("k", k, [batch, k.shape[1], dim], f"[B={batch}, S, D={dim}] (the queries' batch and D)")
    scale = _scalar("weight_scale", weight_scale)
    if not math.isfinite(scale):
        raise ValueError(f"weight_scale: got {weight_scale}, expected a finite number")
    _mask_check(attention_mask, batch, count)
    derived = fp8_paged_append_check(k, kv_cache, block_table, context_lens, hadamard=hadamard, stream=stream)
    _same_device(dict(q=q, weights=weights, k=k, attention_mask=attention_mask))
    derived.pop("x")
    return dict(derived, q=q, k=k, weights=weights, weight_scale=scale, attention_mask=attention_mask)


def fp8_indexer_prepare_signature() -> hot.HotLane:
    """The hot-lane key of ``fp8_indexer_prepare``: the replay takes ``(q, k, weights, kv_cache, block_table,
    context_lens, attention_mask)``; the key holds their shapes, dtypes and devices (the mask's, or ``None``),
    ``hadamard`` and ``weight_scale``. Calls with a ``stream``, a non-contiguous tensor or with value checks on
    (``TILEGEMM_CHECK_VALUES=1``) take the full path."""
    names = ("q", "k", "weights", "kv_cache", "block_table", "context_lens", "attention_mask")
    kinds = dict(q=hot.packed(*FLOATS), k=hot.packed(*FLOATS), weights=hot.packed(*FLOATS))
    kinds.update(kv_cache=hot.packed(torch.uint8), block_table=hot.packed(torch.int32))
    kinds.update(context_lens=hot.packed(torch.int32, torch.int64), hadamard=hot.exact(bool))
    kinds.update(attention_mask=hot.optional(hot.packed(*MASK_DTYPES)))
    kinds.update(weight_scale=hot.exact(float, int), stream=hot.none)
    return hot.HotLane(kinds, dict.fromkeys(names), value_checks=True)


def _append_values(
    context_lens: torch.Tensor, block_table: torch.Tensor, count: int, num_blocks: int, block_kv: int
) -> None:
    """Every position an append writes lies inside the block table, and every block it names inside the cache."""
    pos = append_positions(context_lens, block_table.shape[0], count)
    ends = pos[:, -1] + 1
    room = block_table.shape[1] * block_kv
    bad = (ends < count) | (ends > room)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise ValueError(
            f"context_lens: sequence {b} ends at {int(ends[b])}, but its {count} new tokens must end in "
            f"[{count}, {room}] ({block_table.shape[1]} blocks of {block_kv} tokens)"
        )
    blocks = block_table.long().gather(1, pos // block_kv)
    outside = (blocks < 0) | (blocks >= num_blocks)
    if bool(outside.any()):
        b, s = (int(v) for v in outside.nonzero()[0])
        raise ValueError(
            f"block_table: token {s} of sequence {b} goes to block {int(blocks[b, s])}, expected 0..{num_blocks - 1} "
            f"(kv_cache has {num_blocks} blocks)"
        )
