"""Host-side definitions both backends share (neither imports the other, nor ``checks``).

* :func:`cdiv`: ceiling division of sizes (defined in :mod:`tilegemm.ops.operands`, the ground floor).
* :func:`paged_mqa_split_kv`: keys per split of the paged-MQA schedule.
* :func:`paged_mqa_schedule`: the paged-MQA schedule itself (``get_paged_mqa_logits_metadata``).
* :func:`write_head_splits`: the output placement of ``fp8_gemm_nt_skip_head_mid``.
* :func:`compress_logits`: the ``max_seqlen_k > 0`` form of the MQA logits; :func:`logits_result`, an MQA-logits
  op's result in that form and its dtype.
* :class:`MoETrainState`: what the MoE experts training forward keeps for its backward.
* :func:`cached_constant`: a read-only 1-D constant per device (unit key scales, key numbers), safe under CUDA-graph
  capture.
* DeepSeek's FP8 recipe of the indexer's rows: :func:`hadamard_matrix`, :func:`hadamard_rotate`,
  :func:`fp8_cast_rows` (the ``fp8_quantize_rows`` reference), :func:`paged_views` (the paged cache's keys and scales),
  :func:`append_positions` (the keys an append writes).
* An attention mask's keys: :func:`mask_visible` (where it shows a key), :func:`last_visible_ends` (each row's last
  visible key + 1: the key window ends of ``fp8_indexer_prepare`` and of the indexer's decode rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from tilegemm.ops.operands import cdiv  # noqa: F401  (the ground floor's; imported from here by the checks)


class MoETrainState(NamedTuple):
    """What ``moe_experts_forward`` keeps for ``moe_experts_backward``: the routed rows in the aligned layout of
    ``tilegemm.routing`` (``M = max_padded_rows(T, k, E, ALIGNED_ROWS)`` rows; expert e's rows start on a
    128-row block in expert order and end at ``ends[e]``, its slots in slot order; the rest is padding).

    * ``row_token`` int32 [M]: each row's token (0 on padding rows);
    * ``row_weight`` fp32 [M]: each row's routing weight (0 on padding rows);
    * ``dest`` int32 [T, k]: each slot's row (-1: a dropped slot);
    * ``ends`` int32 [E]: :func:`tilegemm.routing.expert_ends` of the routing;
    * ``gate_up`` [M, 2I], ``h`` [M, I], ``y`` [M, H] in the hidden dtype: each row's ``x @ w13[e].T`` (gate columns
      then up), ``act(gate) * up`` and ``h @ w2[e].T`` (before the routing weight), each rounded once from fp32.
      Rows past ``ends[e]`` of an expert's last block hold finite values that no result reads; rows past the
      last expert's block are unspecified.
    """

    row_token: torch.Tensor
    row_weight: torch.Tensor
    dest: torch.Tensor
    ends: torch.Tensor
    gate_up: torch.Tensor
    h: torch.Tensor
    y: torch.Tensor


def moe_train_is_empty(hidden: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """True when a size of the experts op is 0 (T, H, k, E or I): the output is 0 and so is every gradient."""
    return min(*hidden.shape, topk_ids.shape[1], w13.shape[0], w2.shape[2]) == 0


def moe_train_empty(
    hidden: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, rows: int
) -> tuple[torch.Tensor, MoETrainState]:
    """``moe_experts_forward`` when :func:`moe_train_is_empty`: a zero output and a state of ``rows`` zero rows
    whose slots are all dropped."""
    num_tokens, hidden_dim = hidden.shape
    experts, inter = w13.shape[0], w2.shape[2]
    dev, dtype = hidden.device, hidden.dtype
    state = MoETrainState(
        row_token=torch.zeros(rows, dtype=torch.int32, device=dev),
        row_weight=torch.zeros(rows, dtype=torch.float32, device=dev),
        dest=torch.full(tuple(topk_ids.shape), -1, dtype=torch.int32, device=dev),
        ends=torch.zeros(experts, dtype=torch.int32, device=dev),
        gate_up=torch.zeros(rows, 2 * inter, dtype=dtype, device=dev),
        h=torch.zeros(rows, inter, dtype=dtype, device=dev),
        y=torch.zeros(rows, hidden_dim, dtype=dtype, device=dev),
    )
    return torch.zeros(num_tokens, hidden_dim, dtype=dtype, device=dev), state


def moe_train_zero_grads(hidden, topk_weights, w13, w2, needs) -> tuple[torch.Tensor | None, ...]:
    """``moe_experts_backward`` when :func:`moe_train_is_empty`: zero gradients for the inputs in ``needs``."""
    inputs = (hidden, topk_weights, w13, w2)
    return tuple(torch.zeros_like(t) if need else None for t, need in zip(inputs, needs, strict=True))


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


def logits_result(
    full: torch.Tensor, starts: torch.Tensor, max_seqlen_k: int, logits_dtype: torch.dtype
) -> torch.Tensor:
    """A ragged MQA-logits op's result from its fp32 [S, S_kv] logits ``full``: the compressed form
    (:func:`compress_logits`, from ``starts``) when ``max_seqlen_k``, cast to ``logits_dtype``."""
    if max_seqlen_k:
        full = compress_logits(full, starts, max_seqlen_k)
    return full.to(logits_dtype)


_CONSTANTS: dict[tuple[str, torch.device], torch.Tensor] = {}
_RETIRED_CONSTANTS: list[torch.Tensor] = []


def cached_constant(
    name: str, n: int, device: torch.device, make: Callable[[int, torch.device], torch.Tensor]
) -> torch.Tensor:
    """The first ``n`` elements of ``make(size, device)``, a 1-D constant (unit scales, key numbers) that calls read
    and never write: a view of one buffer per ``name`` and device, made outside CUDA-graph capture (at least 4096
    elements, at least doubled when it grows; a grown-out buffer is kept alive for the graphs that captured it), or
    ``make(n, device)`` anew during capture (a tensor made there is written only when the graph replays). Making
    or growing a buffer on a GPU waits for it (one host sync), so that a kernel on any stream reads it written."""
    key = (name, device)
    buf = _CONSTANTS.get(key)
    if buf is None or buf.numel() < n:
        on_gpu = device.type == "cuda"
        if on_gpu and torch.cuda.is_current_stream_capturing():
            return make(n, device)
        if buf is not None:
            _RETIRED_CONSTANTS.append(buf)
        buf = make(max(n, 2 * buf.numel() if buf is not None else 0, 4096), device)
        if on_gpu:
            torch.cuda.synchronize(device)  # written before a kernel on any stream reads it
        _CONSTANTS[key] = buf
    return buf[:n]


#: Largest finite ``float8_e4m3fn`` value.
FP8_MAX = 448.0
#: Lower clamp of a row's absolute maximum before it becomes a scale (an all-zero row gets a finite scale).
AMAX_EPS = 1e-4


def _hadamard_signs(dim: int) -> torch.Tensor:
    """The Sylvester-Hadamard matrix of ``dim`` (a power of two): fp32 ``[dim, dim]`` of +-1."""
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def hadamard_matrix(dim: int, device: torch.device, dtype: torch.dtype = torch.float32, signs: bool = False):
    """The orthonormal Hadamard matrix ``[dim, dim]`` (``H @ H.T = I``, entries ``+-dim**-0.5``) in ``dtype`` on
    ``device``, or with ``signs`` its +-1 pattern (exact in any float dtype): a cached constant (one host-to-device
    copy per ``dim``, dtype and device, made outside CUDA-graph capture as :func:`cached_constant` makes them)."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"hadamard: the head dim must be a power of two, got {dim}")
    scale = 1.0 if signs else dim**-0.5

    def make(size: int, dev: torch.device) -> torch.Tensor:
        flat = torch.zeros(size, dtype=dtype)
        flat[: dim * dim] = (_hadamard_signs(dim) * scale).reshape(-1).to(dtype)
        return flat.to(dev)

    name = f"hadamard_{dim}_{dtype}_{'signs' if signs else 'orthonormal'}"
    return cached_constant(name, dim * dim, torch.device(device), make).view(dim, dim)


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """``x @ H`` in fp32 for the orthonormal Hadamard ``H`` over the last dim (a power of two): the reference
    indexer's ``rotate_activation``; ``(x H) . (y H) == x . y``."""
    return x.float() @ hadamard_matrix(x.shape[-1], x.device)


def fp8_cast_rows(x: torch.Tensor, hadamard: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's per-row FP8 cast over the last dim, after the Hadamard rotation with ``hadamard``:
    ``y = x @ H`` (or ``x``) in fp32, ``s = max(amax(|y|), AMAX_EPS) / FP8_MAX``, ``(fp8(clamp(y / s)), s)``:
    float8_e4m3fn of ``x``'s shape and fp32 ``x.shape[:-1]``."""
    y = hadamard_rotate(x) if hadamard else x.float()
    scale = y.abs().amax(dim=-1).clamp_min(AMAX_EPS) / FP8_MAX
    return (y / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def append_positions(context_lens: torch.Tensor, batch: int, count: int) -> torch.Tensor:
    """The keys an append of ``count`` tokens per sequence writes (``fp8_paged_append``): int64 ``[batch, count]``,
    token s of sequence b at ``context_lens[b] - count + s`` (``context_lens``: ``[batch]``, or one length ``[1]`` /
    ``[]``, the lengths after the append)."""
    ends = context_lens.reshape(-1).long().expand(batch)
    return ends[:, None] - count + torch.arange(count, device=context_lens.device)


def mask_visible(mask: torch.Tensor) -> torch.Tensor:
    """Where a boolean or additive attention mask shows its key: the mask itself, or where an additive one is above
    its float dtype's lowest value (transformers marks hidden keys with ``finfo.min`` or ``-inf``)."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min


def _count_from_one(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.int32, device=device)


def key_numbers(keys: int, device: torch.device) -> torch.Tensor:
    """int32 ``[1, 2, .., keys]`` (:func:`cached_constant`: read only)."""
    return cached_constant("key_numbers", keys, device, _count_from_one)


def last_visible_ends(mask: torch.Tensor) -> torch.Tensor:
    """int32 ``mask.shape[:-1]``: each mask row's last visible key + 1 (:func:`mask_visible`), 0 for a row that shows
    none. Two kernels on a GPU (a select and a max)."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[:-1], dtype=torch.int32, device=mask.device)
    return torch.where(mask_visible(mask), key_numbers(mask.shape[-1], mask.device), 0).amax(dim=-1)


def paged_views(kv_cache: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a contiguous DeepGEMM cache: keys fp8 [num_blocks, block_kv, D], scales fp32 [num_blocks, block_kv].

    A block is ``block_kv * D`` key bytes (token-major) then ``block_kv`` fp32 scales; four tensor ops in all
    (this runs on every call).
    """
    num_blocks, block_kv = kv_cache.shape[0], kv_cache.shape[1]
    block = block_kv * (d + 4)
    kv_keys = kv_cache.view(torch.float8_e4m3fn).as_strided((num_blocks, block_kv, d), (block, d, 1))
    words = kv_cache.view(torch.float32)
    kv_scales = words.as_strided((num_blocks, block_kv), (block // 4, 1), words.storage_offset() + block_kv * d // 4)
    return kv_keys, kv_scales
