"""The check of ``sparse_decode_attention``."""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import torch

from tilegemm import config
from tilegemm.ops.checks import hot
from tilegemm.ops.checks.base import FLOATS, _same_device, _scalar, _shape, _stream, _tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def _last_dim_contiguous(name: str, x: torch.Tensor) -> None:
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name}: its last dimension must be contiguous (stride 1), got strides {list(x.stride())}")


def sparse_decode_attention_check(q, k, v, indices, scale, mask=None, *, stream=None) -> dict[str, Any]:
    """The check of ``sparse_decode_attention``: ``q [B, H, Dk]``, ``k [B, Hk, T, Dk]``, ``v [B, Hk, T, Dv]`` of one
    float dtype, each with a contiguous last dimension, ``H`` a multiple of ``Hk``; ``indices`` int32 or int64
    ``[B, K]`` (``K >= 1``; any values: one outside ``[0, T)`` selects no key); ``scale`` a finite real number > 0;
    ``mask`` ``None`` or bool or float ``[B, T]``. Derived: the same, ``mask`` with a contiguous last dimension."""
    _tensor("q", q, FLOATS, 3)
    _tensor("k", k, (q.dtype,), 4)
    _tensor("v", v, (q.dtype,), 4)
    batch, heads, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    _shape("k", k, [batch, kv_heads, keys, dim], "[B, Hk, T, Dk]: q's batch and head dim")
    _shape("v", v, [batch, kv_heads, keys, v.shape[3]], "[B, Hk, T, Dv]: k's batch, key heads and keys")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"k: got {kv_heads} key heads, expected a divisor of q's {heads} heads")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _last_dim_contiguous(name, x)
    _tensor("indices", indices, INDEX_DTYPES, 2)
    if indices.shape[0] != batch or indices.shape[1] < 1:
        raise ValueError(f"indices: got shape {list(indices.shape)}, expected [B={batch}, K] with K >= 1")
    scale = _scalar("scale", scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: got {scale}, expected a finite number > 0")
    if mask is not None:
        _tensor("mask", mask, (torch.bool, *FLOATS), 2)
        _shape("mask", mask, [batch, keys], "[B, T], one per key")
    _stream(stream)
    _same_device(dict(q=q, k=k, v=v, indices=indices, mask=mask))
    if mask is not None and mask.shape[1] > 1 and mask.stride(1) != 1:
        mask = mask.contiguous()
    return dict(q=q, k=k, v=v, indices=indices, scale=scale, mask=mask, stream=stream)


def _row_mask(x: Any) -> Hashable:
    """The ``mask`` part of the hot-lane key: ``None``, or a 16-byte aligned bool or float ``[B, T]`` whose last
    dimension the check leaves as it is (contiguous, or one key)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] > 1 and x.stride(1) != 1:
        raise hot.Miss
    return _MASK(x)


_MASK = hot.tensor(torch.bool, *FLOATS)


def sparse_decode_attention_signature() -> hot.HotLane:
    """The hot-lane key of ``sparse_decode_attention``: the replay takes ``(q, k, v, indices, scale, mask)``.

    The key holds the shape, strides, dtype and device of every tensor (16-byte aligned), ``scale`` and the
    ``set_num_sms`` setting (the split of the indices reads it). Calls with a ``stream``, a tensor off 16-byte
    alignment or a mask the check would copy take the full path.
    """
    kinds = dict(
        q=hot.tensor(*FLOATS),
        k=hot.tensor(*FLOATS),
        v=hot.tensor(*FLOATS),
        indices=hot.tensor(*INDEX_DTYPES),
        scale=hot.exact(float),
        mask=_row_mask,
        stream=hot.none,
    )
    operands = {name: None for name in ("q", "k", "v", "indices", "scale", "mask")}
    return hot.HotLane(kinds, operands, setting=_num_sms_setting)


def _num_sms_setting() -> int:
    """The ``set_num_sms`` setting."""
    return config._num_sms
