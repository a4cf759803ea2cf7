"""Host-side definitions both backends share (neither imports the other, nor ``checks``).

* :func:`cdiv`: ceiling division of sizes.
* :func:`paged_mqa_split_kv`: keys per split of the paged-MQA schedule.
* :func:`paged_mqa_schedule`: the paged-MQA schedule itself (``get_paged_mqa_logits_metadata``).
* :func:`write_head_splits`: the output placement of ``fp8_gemm_nt_skip_head_mid``.
* :func:`compress_logits`: the ``max_seqlen_k > 0`` form of the MQA logits.
"""

from __future__ import annotations

import math

import torch


def cdiv(x: int, y: int) -> int:
    """Ceiling division of non-negative ints: ``ceil(x / y)``."""
    return -(-x // y)


#: Keys per split of the paged-MQA schedule (DeepGEMM's ``SPLIT_KV``), before rounding to ``block_kv``.
PAGED_MQA_SPLIT_KV = 256


def paged_mqa_split_kv(block_kv: int) -> int:
    """Keys per split of the paged-MQA schedule: ``lcm(PAGED_MQA_SPLIT_KV, block_kv)``.

    That is 256 for every ``block_kv`` dividing 256 (16, 32, 64, 128, 256) and a whole number of
    KV-cache blocks otherwise, so a split never cuts a block.
    """
    return math.lcm(PAGED_MQA_SPLIT_KV, int(block_kv))


def paged_mqa_schedule(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """The balanced paged-MQA schedule on ``context_lens``' device (no host sync): int32 [num_sms + 1, 2].

    Batch b has ``ceil(max(len_b, 0) / split)`` splits, ``split = paged_mqa_split_kv(block_kv)``; ``len_b``
    is ``context_lens[b]``, or the row max for 2-D lengths. With ``total`` splits in all, SM i starts at
    global split ``i * (total // num_sms) + min(i, total % num_sms)``, so SM counts differ by at most one;
    that split is named by its batch and its index within the batch. Row ``num_sms`` is ``(B, 0)``.
    Batches with no splits are never a start.
    """
    if context_lens.dim() == 1:
        lens = context_lens
    elif context_lens.shape[1]:
        lens = context_lens.amax(dim=1)
    else:  # next_n == 0: no rows, no keys
        lens = context_lens.new_zeros(context_lens.shape[0])
    split = paged_mqa_split_kv(block_kv)
    counts = torch.div(lens.to(torch.int64).clamp_min(0) + (split - 1), split, rounding_mode="floor")
    ends = torch.cumsum(counts, 0)
    total = counts.sum()
    sm = torch.arange(num_sms + 1, device=lens.device, dtype=torch.int64)
    base = torch.div(total, num_sms, rounding_mode="floor")
    start = sm * base + torch.minimum(sm, total - base * num_sms)
    batch = torch.searchsorted(ends, start, right=True)
    first = torch.cat([ends - counts, total.reshape(1)])[batch]
    return torch.stack([batch, start - first], dim=1).to(torch.int32)


def write_head_splits(d: torch.Tensor, out: torch.Tensor, head_splits: tuple[int, int, int]) -> torch.Tensor:
    """Copy ``out [M, N]`` into ``d [M, N + N / (left + right) * mid]`` skipping each head's middle ``mid`` columns.

    Head h's columns ``[h * (left + right), (h + 1) * (left + right))`` of ``out`` go to ``d``'s columns
    ``[h * (left + mid + right), ...)`` with ``mid`` columns left untouched after the first ``left``.
    """
    left, mid, right = head_splits
    m, n = out.shape
    heads = n // (left + right)
    src = out.view(m, heads, left + right)
    dst = d.view(m, heads, left + mid + right)
    dst[:, :, :left].copy_(src[:, :, :left])
    dst[:, :, left + mid :].copy_(src[:, :, left:])
    return d


def compress_logits(full: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """The compressed MQA logits ``out[i, j] = full[i, starts[i] + j]`` for ``j < width`` (``-inf`` past ``S_kv``).

    ``full``: [S, S_kv]; ``starts``: int [S]. Returns a new [S, width] tensor of ``full``'s dtype.
    """
    s, s_kv = full.shape
    cols = starts.long()[:, None] + torch.arange(width, device=full.device)[None, :]
    if s_kv == 0:
        return full.new_full((s, width), float("-inf"))
    picked = full.gather(1, cols.clamp(max=s_kv - 1))
    return picked.masked_fill_(cols >= s_kv, float("-inf"))


#: Routed slots per expert, and routed slots in all, up to which an MoE call is decode-sized
#: (:func:`moe_decode_sized`). H100, 2026-11-23, kernel-only, bf16 (``tests/benchmark/results/moe/paths_h100.md``):
#: the per-slot path beat the sorted one up to 2 slots per expert (Mixtral 8 tokens: 988 vs 1472 us; Qwen3 32
#: tokens, 256 slots: 535 vs 677) and lost at 4 (Mixtral 16: 1562 vs 1452; Qwen3 64: 986 vs 749). DeepSeek-V3's
#: 88 MB experts tie at 256 slots (32 tokens: 6165 vs 6133 us) and lose beyond (64 tokens, 512 slots, 2 per
#: expert: 11902 vs 8573): past a few hundred slots, a slot that shares its expert no longer finds the weights
#: in L2, and the per-slot path reads them again from memory.
MOE_DECODE_SLOTS_PER_EXPERT = 2
MOE_DECODE_MAX_SLOTS = 256


def moe_decode_sized(tokens: int, top_k: int, experts: int) -> bool:
    """True when the ``tokens * top_k`` routed slots are at most :data:`MOE_DECODE_SLOTS_PER_EXPERT` per expert
    and :data:`MOE_DECODE_MAX_SLOTS` in all: reading each slot's expert weights directly (an expert shared by
    several slots is read again) costs less than sorting the slots by expert, which is a dozen small launches."""
    slots = tokens * top_k
    return slots <= MOE_DECODE_SLOTS_PER_EXPERT * experts and slots <= MOE_DECODE_MAX_SLOTS
