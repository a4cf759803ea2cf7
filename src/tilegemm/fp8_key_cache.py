"""An FP8 key cache for DeepSeek's sparse-attention indexer: keys quantized once, when they are appended.

:func:`tilegemm.indexer.index_scores` with ``fp8=True`` quantizes the whole key cache on every call (transformers'
cache holds bf16 keys). :class:`Fp8KeyCache` keeps the keys as DeepSeek's recipe stores them instead: Hadamard-rotated
(optional), cast to FP8 with one fp32 scale per token, in DeepGEMM's paged byte layout (``kv_cache`` of
:func:`tilegemm.fp8_paged_mqa_logits`, block ``b * blocks + i`` holding sequence b's keys ``i * block_kv ..``: an
identity block table), by :func:`tilegemm.fp8_paged_append` (one kernel on the GPU). :func:`score_fp8_key_cache`
scores queries against it, reading it in place, the queries cast by :func:`tilegemm.fp8_quantize_rows`:

* decode (at most :data:`PAGED_MAX_ROWS` query rows): :func:`tilegemm.fp8_paged_mqa_logits` without a schedule
  (each sequence's keys split over the SMs), each query row seeing its window's end ``ke`` (its mask row's last
  visible key + 1) as its context length; the step's new keys are appended, and the mask's rows reduced to those
  ends, by the kernel that casts its queries (:func:`tilegemm.fp8_indexer_prepare`): the step is two kernels of its
  own, as the BF16 step's (:func:`tilegemm.indexer_decode_prepare` of its weights and ends, then its decode kernel);
* prefill: :func:`tilegemm.fp8_mqa_logits` per sequence on its keys gathered out of the blocks (a copy of FP8 bytes,
  no quantization).

The mask is applied as :func:`tilegemm.indexer.index_scores` applies it. Nothing synchronises the host: positions
are device tensors, so an append and a score are captured in a CUDA graph (a static cache's decode step).
"""

from __future__ import annotations

import torch

from tilegemm.indexer_mask import apply_mask, clean_outside_windows, key_window_ends, key_windows
from tilegemm.ops import api

__all__ = ["BLOCK_KV", "PAGED_MAX_ROWS", "Fp8KeyCache", "score_fp8_key_cache"]

#: Tokens per cache block (one of the paged kernel's 16, 32, 64).
BLOCK_KV = 64
#: Up to this many query rows per sequence (the paged kernel's ``next_n``) a call scores with the paged op.
PAGED_MAX_ROWS = 4


class Fp8KeyCache:
    """FP8 keys of ``batch`` sequences of up to ``capacity`` tokens of ``dim`` (module docstring).

    Attributes:
        kv_cache: uint8 ``[batch * blocks, BLOCK_KV, 1, dim + 4]``, DeepGEMM's paged byte layout.
        block_table: int32 ``[batch, blocks]``: sequence b's blocks ``b * blocks ..``.
        hadamard: whether appended keys are rotated first (queries must be rotated alike).
    """

    def __init__(self, batch: int, capacity: int, dim: int, device: torch.device | str, hadamard: bool = True):
        self.batch, self.dim, self.hadamard = batch, dim, hadamard
        self.length = 0  # tokens per sequence appended in order (a dynamic cache's own count; see ``append``)
        self._allocate(capacity, torch.device(device))

    def _allocate(self, capacity: int, device: torch.device) -> None:
        """Zeroed blocks for ``capacity`` tokens per sequence and their identity block table."""
        self.blocks = max(1, -(-capacity // BLOCK_KV))
        rows = self.batch * self.blocks
        self.kv_cache = torch.zeros(rows, BLOCK_KV, 1, self.dim + 4, dtype=torch.uint8, device=device)
        self.block_table = torch.arange(rows, dtype=torch.int32, device=device).view(self.batch, self.blocks)

    @property
    def capacity(self) -> int:
        """Tokens per sequence the cache holds."""
        return self.blocks * BLOCK_KV

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 keys ``[batch, blocks, BLOCK_KV, dim]`` and fp32 scales ``[batch, blocks, BLOCK_KV]``, views of the
        cache's bytes."""
        raw = self.kv_cache.view(self.batch * self.blocks, -1)
        keys = raw[:, : BLOCK_KV * self.dim].view(self.batch, self.blocks, BLOCK_KV, self.dim)
        words = raw.view(torch.float32)
        scales = words[:, BLOCK_KV * self.dim // 4 :].view(self.batch, self.blocks, BLOCK_KV)
        return keys, scales

    def append(self, keys: torch.Tensor, end: torch.Tensor | int, backend: str | None = None) -> None:
        """Write ``keys`` (float ``[batch, S, dim]``, rotated first when :attr:`hadamard`) as each sequence's tokens
        ``end - S .. end - 1`` (``end``: an int, or an int tensor ``[]`` / ``[batch]`` on the cache's device, each
        ``S <= end <= capacity``), quantized by :func:`tilegemm.fp8_paged_append`."""
        self.check_keys(keys)
        api.fp8_paged_append(
            keys, self.kv_cache, self.block_table, self.end_tensor(end), hadamard=self.hadamard, backend=backend
        )

    def check_keys(self, keys: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``keys`` is ``[batch, S, dim]``: keys this cache can append."""
        if keys.dim() != 3 or keys.shape[0] != self.batch or keys.shape[2] != self.dim:
            raise ValueError(f"keys: got shape {list(keys.shape)}, expected [{self.batch}, S, {self.dim}]")

    def end_tensor(self, end: torch.Tensor | int) -> torch.Tensor:
        """An append's ``end`` as the ``context_lens`` of the append ops: a tensor as given, an int as an int64
        ``[]`` on the cache's device."""
        if isinstance(end, torch.Tensor):
            return end
        return torch.full((), end, dtype=torch.int64, device=self.kv_cache.device)

    def grow(self, capacity: int) -> None:
        """Make room for ``capacity`` tokens per sequence (at least doubling), keeping what is stored: a copy of the
        bytes, no quantization; a no-op if it fits."""
        if capacity <= self.capacity:
            return
        old_keys, old_scales = self._views()
        old_blocks = self.blocks
        self._allocate(max(capacity, 2 * self.capacity), self.kv_cache.device)
        keys, scales = self._views()
        keys[:, :old_blocks] = old_keys
        scales[:, :old_blocks] = old_scales

    def sequence(self, b: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence ``b``'s first ``length`` keys as ``(fp8 [length, dim], fp32 [length])`` (contiguous copies)."""
        keys, scales = self._views()
        data = keys[b].reshape(-1, self.dim)[:length].contiguous().view(torch.float8_e4m3fn)
        return data, scales[b].reshape(-1)[:length].contiguous()


def score_fp8_key_cache(
    q: torch.Tensor,
    cache: Fp8KeyCache,
    weights: torch.Tensor,
    attention_mask: torch.Tensor | None,
    softmax_scale: float,
    length: int,
    backend: str | None = None,
    append: tuple[torch.Tensor, torch.Tensor | int] | None = None,
) -> torch.Tensor:
    """The indexer's masked scores of ``q`` against the first ``length`` keys of each sequence in ``cache``.

    Args:
        q: queries ``[B, S, H, D]`` (any float dtype; rotated here when ``cache.hadamard``).
        cache: the sequences' FP8 keys (``B == cache.batch``, ``length <= cache.capacity``).
        weights: fp32 ``[B, S, H]`` head weights.
        attention_mask: ``[B, S, length]`` boolean or additive, or ``None`` (every key visible).
        softmax_scale: the positive scale of ``q . k``.
        length: keys per sequence to score (the mask's last dim).
        backend: the tilegemm backend of the MQA-logits calls (``None``: the current choice).
        append: ``(keys, end)``, keys not yet in ``cache`` that the scores see (:meth:`Fp8KeyCache.append`'s
            arguments), written first: at a decode step in the kernel that casts the queries
            (:func:`tilegemm.fp8_indexer_prepare`), otherwise by :meth:`Fp8KeyCache.append`.

    Returns:
        fp32 ``[B, S, length]``, as :func:`tilegemm.indexer.index_scores` with ``fp8=True`` on the same keys.
    """
    batch, rows, heads, _ = q.shape
    clean = clean_outside_windows(attention_mask)
    if rows > PAGED_MAX_ROWS:
        if append is not None:
            cache.append(*append, backend=backend)
        ks, ke = key_windows(attention_mask, batch, rows, length, q.device)
        q8, w = _cast_queries(q, weights, softmax_scale, cache.hadamard, backend)
        parts = []
        for b in range(batch):
            keys = cache.sequence(b, length)
            parts.append(api.fp8_mqa_logits(q8[b], keys, w[b].contiguous(), ks[b], ke[b], clean, backend=backend))
        return apply_mask(torch.stack(parts), attention_mask)
    if append is None:
        q8, w = _cast_queries(q, weights, softmax_scale, cache.hadamard, backend)
        ke = None
    else:
        keys, end = append
        cache.check_keys(keys)
        q8, w, ke = api.fp8_indexer_prepare(
            q,
            keys,
            weights,
            cache.kv_cache,
            cache.block_table,
            cache.end_tensor(end),
            hadamard=cache.hadamard,
            weight_scale=softmax_scale,
            attention_mask=attention_mask,
            backend=backend,
        )
    if ke is None:
        ke = key_window_ends(attention_mask, batch, rows, length, q.device)
    flat = api.fp8_paged_mqa_logits(
        q8, cache.kv_cache, w.reshape(batch * rows, heads), ke, cache.block_table, None, length, clean, backend=backend
    )
    return apply_mask(flat.view(batch, rows, length), attention_mask)


def _cast_queries(
    q: torch.Tensor, weights: torch.Tensor, softmax_scale: float, hadamard: bool, backend: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 queries and their weights ``weights * softmax_scale * q_scale`` (fp32), as ``fp8_indexer_prepare``
    gives them, for a call with no keys to append."""
    q8, q_scale = api.fp8_quantize_rows(q, hadamard=hadamard, backend=backend)
    return q8, weights.float() * softmax_scale * q_scale
