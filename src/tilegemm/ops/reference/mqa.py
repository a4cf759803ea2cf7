"""MQA-logits ops of the ``pytorch`` backend (DeepSeek sparse-attention indexer).

* ``fp8_fp4_mqa_logits`` / ``fp8_mqa_logits``: ``logits[i, j] = kv_scale[j] * sum_h w[i, h] *
  relu(q[i, h] . kv[j])`` inside each row's window ``[ks[i], ke[i])``; computed over chunks of query
  rows so the ``[chunk, H, S_kv]`` score temporary stays near ``CHUNK_BYTES``; compressed
  (``max_seqlen_k > 0``) and cast to ``logits_dtype`` (one rounding from fp32) at the end.
* ``bf16_mqa_logits``: the same formula on bf16 ``q`` and keys, without key scales.
* ``mqa_logits_batched``: either of them per sequence of a batch.
* ``get_paged_mqa_logits_metadata``: the balanced split schedule (``ops.common.paged_mqa_schedule``).
* ``fp8_fp4_paged_mqa_logits`` / ``fp8_paged_mqa_logits``: the same logits over a paged FP8 KV cache,
  chunked over key columns.
* ``fp8_quantize_rows``: ``ops.common.fp8_cast_rows``; ``fp8_paged_append``: that cast written into the cache's
  blocks by ``index_put`` at the positions the lengths give; ``fp8_indexer_prepare``: both, the query scales
  multiplied into the weights, and the mask rows' key window ends (``ops.common.last_visible_ends``);
  ``indexer_decode_prepare``: those weights and ends alone.

Nothing here synchronises the host, so the ops can be captured in CUDA graphs.
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import register_impl
from tilegemm.ops.common import (
    append_positions,
    fp8_cast_rows,
    last_visible_ends,
    logits_result,
    paged_mqa_schedule,
    paged_views,
)
from tilegemm.ops.reference._common import chunk_count, exact_matmul


def fp8_mqa_logits(
    q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype, stream
):
    """Reference MQA logits: [S, S_kv] (or [S, max_seqlen_k]) of ``logits_dtype``, ``-inf`` outside the
    windows when ``clean_logits``."""
    kv_data, kv_scale = kv
    return _mqa_logits(
        q, kv_data, kv_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype
    )


@register_impl("bf16_mqa_logits", "pytorch")
def bf16_mqa_logits(
    q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype, stream
):
    """Reference BF16 MQA logits: the FP8 formula on bf16 ``q``/``kv`` (exact fp32 products) with key scales of 1;
    memory stays near ``CHUNK_BYTES`` of scores whatever ``S`` and ``S_kv``."""
    return _mqa_logits(
        q, kv, None, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype
    )


@register_impl("mqa_logits_batched", "pytorch")
def mqa_logits_batched(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, stream):
    """Reference batched MQA logits: each sequence through the ragged reference (fp32 [B, S, T])."""
    kv_data, kv_scale = kv if isinstance(kv, tuple) else (kv, None)
    batch, s, _, _ = q.shape
    out = torch.empty(batch, s, kv_data.shape[1], dtype=torch.float32, device=q.device)
    for b in range(batch):
        scale = kv_scale[b] if kv_scale is not None else None
        ks, ke = cu_seq_len_k_start[b], cu_seq_len_k_end[b]
        out[b] = _mqa_logits(q[b], kv_data[b], scale, weights[b], ks, ke, clean_logits, 0, torch.float32)
    return out


def _mqa_logits(
    q, kv_data, kv_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype
):
    """The reference's loop over chunks of query rows (``kv_scale`` ``None``: no key scales)."""
    s, h, dim = q.shape
    s_kv = kv_data.shape[0]
    device = q.device
    out = torch.empty(s, s_kv, dtype=torch.float32, device=device)
    keys_t = kv_data.float().t()  # [D, S_kv]
    scale = kv_scale.float() if kv_scale is not None else None
    cols = torch.arange(s_kv, device=device)
    step = chunk_count(s, 4 * (2 * h * s_kv + h * dim + 2 * s_kv))
    for s0 in range(0, s, step):
        s1 = min(s, s0 + step)
        scores = exact_matmul(q[s0:s1].float().reshape(-1, dim), keys_t).view(s1 - s0, h, s_kv).relu_()
        logits = exact_matmul(weights[s0:s1].float().unsqueeze(1), scores).squeeze(1)
        if scale is not None:
            logits.mul_(scale)
        if clean_logits:
            inside = (cols >= cu_seq_len_k_start[s0:s1, None]) & (cols < cu_seq_len_k_end[s0:s1, None])
            logits = torch.where(inside, logits, float("-inf"))
        out[s0:s1] = logits
    return logits_result(out, cu_seq_len_k_start, max_seqlen_k, logits_dtype)


register_impl("fp8_fp4_mqa_logits", "pytorch")(fp8_mqa_logits)
register_impl("fp8_mqa_logits", "pytorch")(fp8_mqa_logits)


@register_impl("get_paged_mqa_logits_metadata", "pytorch")
def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
    """Reference schedule: int32 [num_sms + 1, 2], row i = (batch, split) where SM i starts
    (``ops.common.paged_mqa_schedule``)."""
    return paged_mqa_schedule(context_lens, block_kv, num_sms)


def _visible_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """int64 [B, next_n]: keys row t of batch b sees (``j < visible[b, t]``)."""
    if context_lens.dim() == 2:
        return context_lens.long()
    t = torch.arange(next_n, device=context_lens.device)
    return context_lens.long()[:, None] - next_n + t[None, :] + 1


def fp8_paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits, logits_dtype, stream
):
    """Reference paged MQA logits: [B * next_n, max_context_len] of ``logits_dtype`` (rounded once from fp32).

    The KV cache is read in DeepGEMM's byte layout: block ``blk`` holds ``block_kv * D`` FP8 key bytes
    (token-major) and then ``block_kv`` fp32 scales. Block-table entries past a row's visible keys are
    only clamped into range (their logits are ``-inf`` or unspecified); ``schedule_meta`` only matters
    to kernels.
    """
    batch, next_n, h, dim = q.shape
    num_blocks, block_kv = kv_cache.shape[0], kv_cache.shape[1]
    width = int(max_context_len)
    device = q.device
    out = torch.empty(batch * next_n, width, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out.to(logits_dtype)
    raw = kv_cache.reshape(num_blocks, -1)
    key_bytes = raw[:, : block_kv * dim]
    key_scales = raw[:, block_kv * dim : block_kv * (dim + 4)].contiguous().view(torch.float32)  # [blocks, block_kv]

    blocks_needed = -(-width // block_kv)
    table = block_table[:, :blocks_needed]
    if table.shape[1] < blocks_needed:
        table = torch.nn.functional.pad(table, (0, blocks_needed - table.shape[1]))
    table = table.long().clamp(0, max(num_blocks - 1, 0))

    visible = _visible_lengths(context_lens, next_n)  # [B, next_n]
    q32 = q.float().reshape(batch, next_n * h, dim)
    w32 = weights.float().reshape(batch, next_n, 1, h)
    bytes_per_block = 4 * block_kv * (2 * batch * next_n * h + batch * dim + 3 * batch * next_n)
    step = chunk_count(blocks_needed, bytes_per_block)
    for b0 in range(0, blocks_needed, step):
        b1 = min(blocks_needed, b0 + step)
        j0, j1 = b0 * block_kv, min(width, b1 * block_kv)
        ids = table[:, b0:b1].reshape(-1)
        keys = key_bytes.index_select(0, ids).view(torch.float8_e4m3fn).float()
        keys = keys.view(batch, (b1 - b0) * block_kv, dim)[:, : j1 - j0]
        scales = key_scales.index_select(0, ids).view(batch, -1)[:, : j1 - j0]
        scores = exact_matmul(q32, keys.transpose(1, 2)).view(batch, next_n, h, j1 - j0).relu_()
        logits = exact_matmul(w32, scores).squeeze(2).mul_(scales[:, None, :])  # [B, next_n, W]
        if clean_logits:
            cols = torch.arange(j0, j1, device=device)
            logits = torch.where(cols < visible[..., None], logits, float("-inf"))
        out[:, j0:j1] = logits.reshape(batch * next_n, j1 - j0)
    return out.to(logits_dtype)


register_impl("fp8_fp4_paged_mqa_logits", "pytorch")(fp8_paged_mqa_logits)
register_impl("fp8_paged_mqa_logits", "pytorch")(fp8_paged_mqa_logits)


@register_impl("fp8_quantize_rows", "pytorch")
def fp8_quantize_rows(x, hadamard, stream):
    """Reference FP8 rows: ``(fp8 [..., D], fp32 [...])``, the rotation an fp32 matmul."""
    return fp8_cast_rows(x, hadamard)


@register_impl("fp8_paged_append", "pytorch")
def fp8_paged_append(x, kv_cache, block_table, context_lens, hadamard, stream):
    """Reference append: the keys' FP8 rows and scales written into their blocks (``index_put``, no host sync:
    every position must be inside the table, as the check's value checks say)."""
    batch, count, dim = x.shape
    if batch == 0 or count == 0:
        return kv_cache
    data, scale = fp8_cast_rows(x, hadamard)
    block_kv = kv_cache.shape[1]
    pos = append_positions(context_lens, batch, count)
    blocks = block_table.long().gather(1, torch.div(pos, block_kv, rounding_mode="floor"))
    slots = pos % block_kv
    kv_keys, kv_scales = paged_views(kv_cache, dim)
    kv_keys.view(torch.uint8)[blocks, slots] = data.view(torch.uint8)
    kv_scales[blocks, slots] = scale
    return kv_cache


@register_impl("indexer_decode_prepare", "pytorch")
def indexer_decode_prepare(weights, attention_mask, weight_scale, stream):
    """Reference decode operands: ``weights * weight_scale`` in fp32 and the mask rows' ``last_visible_ends``."""
    ends = None if attention_mask is None else last_visible_ends(attention_mask)
    return weights.float() * weight_scale, ends


@register_impl("fp8_indexer_prepare", "pytorch")
def fp8_indexer_prepare(
    q, k, weights, kv_cache, block_table, context_lens, hadamard, weight_scale, attention_mask, stream
):
    """Reference prepare: :func:`fp8_paged_append` of ``k``, :func:`fp8_quantize_rows` of ``q``,
    ``weights * weight_scale * q_scale`` in fp32 (that order), and the mask rows' ``last_visible_ends``."""
    fp8_paged_append(k, kv_cache, block_table, context_lens, hadamard, stream)
    q8, q_scale = fp8_cast_rows(q, hadamard)
    ends = None if attention_mask is None else last_visible_ends(attention_mask)
    return q8, weights.float() * weight_scale * q_scale, ends
