"""Host-side definitions both backends share (neither imports the other, nor ``checks``).

* :func:`paged_mqa_split_kv`: keys per split of the paged-MQA schedule.
* :func:`write_head_splits`: the output placement of ``fp8_gemm_nt_skip_head_mid``.
* :func:`compress_logits`: the ``max_seqlen_k > 0`` form of the MQA logits.
"""

from __future__ import annotations

import math

import torch

#: Keys per split of the paged-MQA schedule (DeepGEMM's ``SPLIT_KV``), before rounding to ``block_kv``.
PAGED_MQA_SPLIT_KV = 256


def paged_mqa_split_kv(block_kv: int) -> int:
    """Keys per split of the paged-MQA schedule: ``lcm(PAGED_MQA_SPLIT_KV, block_kv)``.

    That is 256 for every ``block_kv`` dividing 256 (16, 32, 64, 128, 256) and a whole number of
    KV-cache blocks otherwise, so a split never cuts a block.
    """
    return math.lcm(PAGED_MQA_SPLIT_KV, int(block_kv))


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
