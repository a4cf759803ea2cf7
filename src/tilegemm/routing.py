"""MoE routing helpers for the m-grouped GEMMs: sort tokens by expert and back, on the device, no host sync.

From a router's top-k output (``topk_ids [T, k]``) :func:`moe_route` builds everything the
grouped GEMMs need, with sizes that depend only on ``(T, k, num_experts, alignment)`` (never on
the routing values), so a whole MoE expert path can be captured in one CUDA graph:

* the ``m_indices`` layout: a padded buffer of :func:`max_padded_rows` rows where each expert's
  rows start on an ``alignment`` (128) boundary; ``m_indices[r]`` is row r's expert, ``-1`` for
  padding (the kernels write padding rows as 0);
* the psum layout: a compact buffer of ``T * k`` rows sorted by expert and
  ``psum_offsets[E]`` (``torch._grouped_mm``'s ``offs``: cumulative row counts, unaligned);
  dropped slots (expert id ``-1`` or out of range) sort last, past ``psum_offsets[-1]``.

:func:`permute_tokens` gathers token rows into either buffer; :func:`unpermute_tokens` is the
inverse: ``out[t] = sum_j topk_weights[t, j] * y[row of (t, j)]``, a deterministic gather-and-sum
(no atomics, identical bits on rerun). Both are differentiable, and each one's backward is the other's gather
(no scatter-add), so training reruns are bitwise identical too. Everything is plain torch and runs on the CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "ALIGNED_ROWS",
    "MoERouting",
    "aligned_blocks",
    "expert_counts",
    "expert_ends",
    "max_padded_rows",
    "moe_route",
    "permute_tokens",
    "unpermute_tokens",
]

#: Row alignment of each expert's segment in the aligned (``m_indices``) layout: the grouped kernels' row tile.
ALIGNED_ROWS = 128


def max_padded_rows(num_tokens: int, top_k: int, num_experts: int, alignment: int = 128) -> int:
    """Worst-case row count of the aligned (``m_indices``) buffer, over every possible routing.

    Each non-empty expert pads its rows up to a multiple of ``alignment``, adding at most
    ``alignment - 1``; at most ``min(E, T * k)`` experts are non-empty. The padded total is a
    multiple of ``alignment``, so it is at most the largest multiple below that bound.
    """
    if min(num_tokens, top_k, num_experts) < 0 or alignment < 1:
        raise ValueError("max_padded_rows: sizes must be >= 0 and alignment >= 1")
    slots = num_tokens * top_k
    bound = slots + min(num_experts, slots) * (alignment - 1)
    return bound // alignment * alignment


def expert_counts(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int32 [E]: the slots routed to each expert (ids outside ``[0, E)`` count for none); on the device, no sync."""
    ids = topk_ids.reshape(-1).to(torch.int64)
    key = torch.where((ids >= 0) & (ids < num_experts), ids, torch.full_like(ids, num_experts))
    counts = torch.zeros(num_experts + 1, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))
    return counts[:num_experts]


def expert_ends(counts: torch.Tensor, alignment: int = ALIGNED_ROWS) -> torch.Tensor:
    """int32 [E]: in the aligned layout (each expert's rows starting on an ``alignment`` boundary, in expert
    order), the row past expert e's last slot: ``start_e + counts[e]``, ``start_e`` the sum of the earlier
    experts' counts each rounded up to ``alignment``. A psum layout with that alignment (DeepGEMM's meaning)."""
    padded = (counts.to(torch.int64) + alignment - 1) // alignment * alignment
    return (torch.cumsum(padded, 0) - padded + counts).to(torch.int32)


def aligned_blocks(ends: torch.Tensor, rows: int, alignment: int = ALIGNED_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """From :func:`expert_ends`: ``(starts, block_expert)`` of the aligned layout of ``rows`` rows.

    ``starts`` int32 [E + 1]: expert e's rows and padding are ``[starts[e], starts[e + 1])`` (``starts[E]``: the
    rows in use); ``block_expert`` int32 [rows / alignment]: each ``alignment``-row block's expert, -1 past
    ``starts[E]``. On the device, no sync.
    """
    padded_ends = (ends.to(torch.int64) + alignment - 1) // alignment * alignment
    starts = torch.cat([padded_ends.new_zeros(1), padded_ends]).to(torch.int32)
    first_rows = torch.arange(0, rows, alignment, device=ends.device)
    block = torch.searchsorted(padded_ends, first_rows, right=True)
    return starts, torch.where(block < ends.shape[0], block, -1).to(torch.int32)


@dataclass(frozen=True)
class MoERouting:
    """Expert-sorted layouts of one batch of routed tokens (all tensors on ``topk_ids``' device).

    Shapes (``S = T * k`` token slots, slot ``s = t * k + j``; ``M = max_padded_rows(T, k, E, alignment)``):

    * ``m_indices``: int32 [M], expert of each row of the aligned buffer, ``-1`` for padding.
    * ``src_slot``: int64 [M], the slot whose token fills each aligned row, ``-1`` for padding.
    * ``dest_row``: int64 [S], each slot's row in the aligned buffer, ``-1`` for a dropped slot.
    * ``psum_offsets``: int32 [E], cumulative expert row counts of the compact buffer.
    * ``sorted_slot``: int64 [S], the slot of each compact (psum layout) row; dropped slots last.
    * ``compact_row``: int64 [S], each slot's row in the compact buffer (the inverse of ``sorted_slot``).
    * ``counts``: int32 [E], valid slots per expert.
    """

    m_indices: torch.Tensor
    src_slot: torch.Tensor
    dest_row: torch.Tensor
    psum_offsets: torch.Tensor
    sorted_slot: torch.Tensor
    compact_row: torch.Tensor
    counts: torch.Tensor
    num_tokens: int
    top_k: int
    num_experts: int
    alignment: int


def moe_route(topk_ids: torch.Tensor, num_experts: int, alignment: int = 128) -> MoERouting:
    """Sort top-k routing slots by expert; no host synchronisation, value-independent output sizes.

    Args:
        topk_ids: int [T, k] expert id per (token, slot); ids outside ``[0, num_experts)`` (e.g. -1)
            drop the slot (it lands in no expert's rows and contributes 0 on the way back).
        num_experts: E.
        alignment: row alignment of each expert's segment in the aligned buffer (128 for the
            m-grouped kernels: ``get_mk_alignment_for_contiguous_layout()``).

    Returns:
        :class:`MoERouting`. Slots of one expert keep their token order (stable sort).
    """
    if topk_ids.dim() != 2:
        raise ValueError(f"moe_route: topk_ids must be 2-D [T, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise TypeError(f"moe_route: topk_ids must be an integer tensor, got {topk_ids.dtype}")
    if num_experts < 1 or alignment < 1:
        raise ValueError(f"moe_route: need num_experts >= 1 and alignment >= 1, got {num_experts}, {alignment}")
    num_tokens, top_k = topk_ids.shape
    dev = topk_ids.device
    slots = num_tokens * top_k
    rows = max_padded_rows(num_tokens, top_k, num_experts, alignment)

    ids = topk_ids.reshape(-1).to(torch.int64)
    valid = (ids >= 0) & (ids < num_experts)
    key = torch.where(valid, ids, torch.full_like(ids, num_experts))  # dropped slots: bucket E, sorted last
    counts_all = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    counts_all.scatter_add_(0, key, torch.ones_like(key))
    counts = counts_all[:num_experts]

    sorted_slot = torch.argsort(key, stable=True)
    sorted_key = key[sorted_slot]
    starts = torch.cumsum(counts_all, 0) - counts_all  # exclusive: first compact row of each bucket
    rank = torch.arange(slots, device=dev) - starts[sorted_key]  # position inside its expert

    padded_starts = expert_ends(counts, alignment).to(torch.int64) - counts
    # Dropped slots go to a scratch row ``rows`` that is cut off below.
    dest_sorted = torch.where(
        sorted_key < num_experts,
        padded_starts[sorted_key.clamp(max=num_experts - 1)] + rank,
        torch.full_like(rank, rows),
    )
    dest_row = torch.empty(slots, dtype=torch.int64, device=dev)
    dest_row.scatter_(0, sorted_slot, dest_sorted)
    compact_row = torch.empty(slots, dtype=torch.int64, device=dev)
    compact_row.scatter_(0, sorted_slot, torch.arange(slots, device=dev))

    src_slot = torch.full((rows + 1,), -1, dtype=torch.int64, device=dev)
    src_slot.scatter_(0, dest_sorted, sorted_slot)
    m_indices = torch.full((rows + 1,), -1, dtype=torch.int32, device=dev)
    m_indices.scatter_(0, dest_sorted, sorted_key.to(torch.int32))
    m_indices[rows:] = -1
    src_slot = src_slot[:rows]
    m_indices = m_indices[:rows]
    dest_row = torch.where(dest_row == rows, torch.full_like(dest_row, -1), dest_row)

    return MoERouting(
        m_indices=m_indices.contiguous(),
        src_slot=src_slot.contiguous(),
        dest_row=dest_row,
        psum_offsets=torch.cumsum(counts, 0).to(torch.int32),
        sorted_slot=sorted_slot,
        compact_row=compact_row,
        counts=counts.to(torch.int32),
        num_tokens=num_tokens,
        top_k=top_k,
        num_experts=num_experts,
        alignment=alignment,
    )


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` with rows of ``index < 0`` set to 0 (1-byte dtypes such as FP8 gathered as bytes)."""
    raw = x.view(torch.uint8) if x.element_size() == 1 else x
    out = raw.index_select(0, index.clamp(min=0))
    keep = (index >= 0).view(-1, *([1] * (x.dim() - 1)))
    out = torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.view(x.dtype) if x.element_size() == 1 else out


def _row_tokens(routing: MoERouting, layout: str, caller: str) -> torch.Tensor:
    """int64 [rows]: the token whose row fills each buffer row (``-1``: padding or a dropped slot)."""
    if layout == "indices":
        slot = routing.src_slot
    elif layout == "psum":
        slot = torch.where(routing.dest_row[routing.sorted_slot] >= 0, routing.sorted_slot, -1)
    else:
        raise ValueError(f"{caller}: layout must be 'indices' or 'psum', got {layout!r}")
    return torch.where(slot >= 0, torch.div(slot, routing.top_k, rounding_mode="floor"), slot)


def _slot_rows(routing: MoERouting, layout: str, caller: str) -> torch.Tensor:
    """int64 [T * k]: each slot's buffer row (``-1``: a dropped slot)."""
    if layout == "indices":
        return routing.dest_row
    if layout == "psum":
        return torch.where(routing.dest_row >= 0, routing.compact_row, routing.dest_row)
    raise ValueError(f"{caller}: layout must be 'indices' or 'psum', got {layout!r}")


def _sum_dtype(y: torch.Tensor) -> torch.dtype:
    """Where the k-sums run: fp32, float64 for float64 ``y``."""
    return torch.promote_types(y.dtype, torch.float32) if y.is_floating_point() else torch.float32


def _sum_slots(y: torch.Tensor, rows: torch.Tensor, t: int, k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j y[rows[t * k + j]]`` (rows ``-1`` add 0), summed in :func:`_sum_dtype` in slot order,
    rounded once."""
    gathered = _gather_rows(y, rows).to(_sum_dtype(y)).view(t, k, *y.shape[1:])
    return gathered.sum(dim=1).to(out_dtype)


class _Permute(torch.autograd.Function):
    """Row gather whose backward is its adjoint, the gather-and-sum of :func:`_sum_slots` (deterministic: no
    scatter-add of ``index_select``'s backward, whose atomics reorder the k additions per token on every run)."""

    @staticmethod
    def forward(ctx, x, tokens, rows, t, k):
        ctx.save_for_backward(rows)
        ctx.t, ctx.k = t, k
        return _gather_rows(x, tokens)

    @staticmethod
    def backward(ctx, grad):
        (rows,) = ctx.saved_tensors
        return _sum_slots(grad, rows, ctx.t, ctx.k, grad.dtype), None, None, None, None


class _Unpermute(torch.autograd.Function):
    """:func:`_sum_slots` whose backward is its adjoint, a row gather (each buffer row belongs to one slot)."""

    @staticmethod
    def forward(ctx, y, tokens, rows, t, k, out_dtype):
        ctx.save_for_backward(tokens)
        ctx.y_dtype = y.dtype
        return _sum_slots(y, rows, t, k, out_dtype)

    @staticmethod
    def backward(ctx, grad):
        (tokens,) = ctx.saved_tensors
        return _gather_rows(grad.to(ctx.y_dtype), tokens), None, None, None, None, None


def _differentiating(t: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and t.requires_grad


def permute_tokens(x: torch.Tensor, routing: MoERouting, layout: str = "indices") -> torch.Tensor:
    """Gather token rows into the expert-sorted buffer the grouped GEMM reads.

    Args:
        x: [T, ...] per-token rows (activations, or their per-token FP8 scales), any dtype.
        routing: from :func:`moe_route` for these T tokens.
        layout: ``"indices"``: the aligned buffer [M, ...] (padding rows 0; pair it with
            ``routing.m_indices``); ``"psum"``: the compact buffer [T * k, ...] (dropped slots' rows 0;
            pair it with ``routing.psum_offsets`` and ``use_psum_layout=True``).

    Returns:
        A new tensor, row r holding ``x[slot // k]`` for the slot routed to row r. Differentiable: the gradient
        of ``x[t]`` is the sum of its k rows' gradients, in fp32 in slot order, rounded once (deterministic).
    """
    if x.shape[0] != routing.num_tokens:
        raise ValueError(f"permute_tokens: x has {x.shape[0]} rows, routing has {routing.num_tokens} tokens")
    tokens = _row_tokens(routing, layout, "permute_tokens")
    if _differentiating(x):
        rows = _slot_rows(routing, layout, "permute_tokens")
        return _Permute.apply(x, tokens, rows, routing.num_tokens, routing.top_k)
    return _gather_rows(x, tokens)


def unpermute_tokens(
    y: torch.Tensor,
    routing: MoERouting,
    topk_weights: torch.Tensor | None = None,
    layout: str = "indices",
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Combine expert outputs back per token: ``out[t] = sum_j w[t, j] * y[row(t, j)]``.

    Args:
        y: [M, N] (``"indices"``) or [T * k, N] (``"psum"``) expert-sorted outputs.
        routing: the :class:`MoERouting` that built the buffer.
        topk_weights: float [T, k] router weights (``None``: all ones). Dropped slots add 0.
        layout: as in :func:`permute_tokens`.
        out_dtype: result dtype (default ``y.dtype``); the sum over k runs in fp32 (float64 for float64 ``y``).

    Returns:
        [T, N]. A gather then a sum in slot order: deterministic, no atomics. Differentiable; without
        ``topk_weights`` the gradient of ``y`` is a row gather of the output's gradient.
    """
    t, k = routing.num_tokens, routing.top_k
    rows = _slot_rows(routing, layout, "unpermute_tokens")
    out_dtype = out_dtype or y.dtype
    if topk_weights is None:
        if _differentiating(y):
            return _Unpermute.apply(y, _row_tokens(routing, layout, "unpermute_tokens"), rows, t, k, out_dtype)
        return _sum_slots(y, rows, t, k, out_dtype)
    if tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"unpermute_tokens: topk_weights must be [{t}, {k}], got {tuple(topk_weights.shape)}")
    gathered = _gather_rows(y, rows).to(_sum_dtype(y)).view(t, k, *y.shape[1:])
    w = topk_weights.to(gathered.dtype).view(t, k, *([1] * (y.dim() - 1)))
    return (gathered * w).sum(dim=1).to(out_dtype)
