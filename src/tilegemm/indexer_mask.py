"""The attention mask of a sparse-attention indexer call (:func:`tilegemm.indexer.index_scores`).

* :func:`mask_windows` / :func:`key_windows`: each query row's key window ``[ks, ke)`` from its mask row, the windows
  the MQA-logits ops score (every visible key inside; decode rows from key 0); :func:`key_window_ends`: the ends
  alone (the paged op's lengths); :func:`zero_window_starts`: the starts of decode windows, filled once;
* :func:`apply_mask`: the mask applied to the windows' scores as stock transformers applies it, and
  :func:`clean_outside_windows`: whether the op must write ``-inf`` outside the windows for that.

Plain torch and CUDA-graph capturable. No host sync, but one when a cached constant, the key numbers or the zero
window starts, is made or grown (the first call on a device, a longer mask or more rows than any before:
:func:`~tilegemm.ops.common.cached_constant`).
"""

from __future__ import annotations

import torch

from tilegemm.ops.common import cached_constant, key_numbers, last_visible_ends, mask_visible

__all__ = [
    "DECODE_WINDOW_ROWS",
    "apply_mask",
    "clean_outside_windows",
    "key_window_ends",
    "key_windows",
    "mask_windows",
    "zero_window_starts",
]


def mask_windows(
    attention_mask: torch.Tensor, rows_per_chunk: int | None = None, from_key_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's key window from its mask row: ``ks`` = first visible key, ``ke`` = last visible key + 1.

    Args:
        attention_mask: ``[B, S, T]``, boolean (True: visible) or additive float (visible where above the
            dtype's lowest value, as transformers' ``min`` / ``-inf`` masks mark hidden keys).
        rows_per_chunk: query rows per pass (default: about 2**24 mask elements), bounding the temporaries.
        from_key_zero: every ``ks`` 0 (one pass over the mask: the ends only).

    Returns:
        int32 ``ks``, ``ke`` of shape ``[B, S]``; a row with no visible key gets ``[0, 0)``. Host syncs: the
        module docstring's one.
    """
    if attention_mask.dim() != 3:
        raise ValueError(f"attention_mask: got shape {list(attention_mask.shape)}, expected [B, S, T]")
    batch, rows, keys = attention_mask.shape
    step = rows_per_chunk or _rows_per_pass(attention_mask)
    if from_key_zero and step >= rows:  # one pass, no copies
        ke = last_visible_ends(attention_mask)
        return torch.zeros_like(ke), ke
    cols = key_numbers(keys, attention_mask.device)
    ks = torch.zeros(batch, rows, dtype=torch.int32, device=attention_mask.device)
    ke = torch.empty_like(ks)
    for r0 in range(0, rows, step):
        part = mask_visible(attention_mask[:, r0 : r0 + step])
        last = last_visible_ends(part)
        ke[:, r0 : r0 + step] = last
        if not from_key_zero:
            first = torch.where(part, cols, keys + 1).amin(dim=-1) - 1  # first visible, or T
            ks[:, r0 : r0 + step] = torch.minimum(first, last)
    return ks, ke


def _rows_per_pass(attention_mask: torch.Tensor) -> int:
    """Query rows of a ``[B, S, T]`` mask :func:`mask_windows` reads per pass: about 2**24 mask elements."""
    return max(1, (1 << 24) // max(1, attention_mask.shape[0] * attention_mask.shape[-1]))


#: Up to this many query rows per sequence (decode steps), key windows start at key 0 (one pass over the mask; the
#: hidden keys before the first visible one are scored, then masked). Longer calls (prefill) skip those keys.
DECODE_WINDOW_ROWS = 4


def key_windows(
    attention_mask: torch.Tensor | None, batch: int, rows: int, keys: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``ks``, ``ke`` key windows (int32 ``[B, S]``) an indexer call over ``keys`` keys scores: every key with no
    mask, else :func:`mask_windows` (from key 0 up to :data:`DECODE_WINDOW_ROWS` rows). Every visible key lies in its
    row's window; the caller applies the mask over the windows' scores."""
    if attention_mask is None:
        ks = torch.zeros(batch, rows, dtype=torch.int32, device=device)
        return ks, torch.full_like(ks, keys)
    return mask_windows(attention_mask, from_key_zero=rows <= DECODE_WINDOW_ROWS)


def zero_window_starts(batch: int, rows: int, device: torch.device) -> torch.Tensor:
    """int32 ``[B, S]`` zeros, the ``ks`` of decode windows (from key 0): a view of a cached constant
    (:func:`~tilegemm.ops.common.cached_constant`), so a decode step fills nothing for it. Read only."""
    return cached_constant("zero_starts", batch * rows, torch.device(device), _int32_zeros).view(batch, rows)


def _int32_zeros(n: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32, device=device)


def key_window_ends(
    attention_mask: torch.Tensor | None, batch: int, rows: int, keys: int, device: torch.device
) -> torch.Tensor:
    """The ``ke`` of :func:`key_windows` alone, for decode calls (at most :data:`DECODE_WINDOW_ROWS` rows, whose
    windows start at key 0): the visible lengths of the paged MQA op, without the zeros of ``ks``."""
    if rows > DECODE_WINDOW_ROWS:
        raise ValueError(f"key_window_ends: {rows} query rows; decode windows hold at most {DECODE_WINDOW_ROWS}")
    if attention_mask is None:
        return torch.full((batch, rows), keys, dtype=torch.int32, device=device)
    if attention_mask.dim() == 3 and _rows_per_pass(attention_mask) >= attention_mask.shape[1]:  # one pass
        return last_visible_ends(attention_mask)
    return mask_windows(attention_mask, from_key_zero=True)[1]


def clean_outside_windows(attention_mask: torch.Tensor | None) -> bool:
    """Whether the MQA op must write ``-inf`` outside :func:`key_windows` itself (its ``clean_logits``): only under an
    additive mask. With none the windows hold every key; a boolean mask hides every key outside them (apply_mask)."""
    return attention_mask is not None and attention_mask.dtype != torch.bool


def apply_mask(scores: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``scores`` (fp32 ``[B, S, T]``) under the mask as stock transformers applies it: ``-inf`` where a boolean
    mask hides a key (a new tensor), ``+ mask`` for an additive one (in place); unchanged with no mask."""
    if attention_mask is None:
        return scores
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, scores, float("-inf"))
    return scores.add_(attention_mask)
