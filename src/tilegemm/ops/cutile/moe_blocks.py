"""cuTile fused MoE experts between decode and prefill: expert-sorted blocks of a few rows, swap-AB weight streams.

With a few routed rows per expert (16-512 tokens of a 128-256-expert model) neither other path fits: the
per-slot path (``moe_slots.py``) reads an expert's weights once per slot routed to it, and the sorted path's
64-row tiles (``moe.py``) spend the MMA's wide side on padding next to two or three real rows, after a routing
of some fifty small torch launches. Here the slots are sorted by expert into ``BT``-row blocks and every
(block, ``BW`` weight rows) pair is one CTA of the decode kernels' swap-AB form (``decode.py``): the
``[BW, BK]`` weight tile (TMA) is the MMA's first operand and the block's ``BT`` rows, loaded transposed as
``[BK, BT]`` (TMA), the second, so an expert's weights are streamed once per block. Five launches in all:

1. **routing** (``_route_count``, ``_route_place``; one CTA per ``EC`` experts and chunk of slots, no sort, no
   atomics): the first counts each expert's slots per chunk and zeroes every row's token and weight; the second
   lays the experts out in ``M = max_padded_rows(T, k, E, BT)`` rows, each expert's ``count`` rows starting on a
   ``BT`` boundary in expert order, the slots of one expert in slot order (the counts of the earlier chunks plus
   a running count inside the chunk: the same ranks as a stable sort), and writes per row its token and routing
   weight, per slot its row (``dest`` [T, k], -1 for an expert id outside ``[0, E)``) and per block its expert
   (-1: no expert). The chunks give the machine about two CTAs per SM: with one CTA per 8 experts walking every
   slot, the 131k slots of 16384 Qwen3 tokens took 0.80 ms on an H100; in chunks, 0.15 ms.
2. **gather** (in ``moe.moe_experts``, as on the sorted path): ``xs[r] = x[tok(r)]`` (``index_select``; rows
   holding no slot copy token 0, never read back).
3. **gate/up** (``_block_gate_up``): ``h[r] = act(xs[r] @ Wg_e.T) * (xs[r] @ Wu_e.T)`` for the block's rows,
   two ``[BW, BT]`` fp32 accumulators, ``h`` [M, I] bf16 written once (transposed store).
4. **down** (``_block_down``): ``y[r] = bf16(w(r) * (h[r] @ W2_e.T))``, ``w(r)`` the row's routing weight.
5. **combine** (``moe.py``, shared with the sorted path): ``out[t] = bf16(sum_j y[dest[t, j]])`` in fp32.

The GEMM grids' fastest index is the block, so the blocks of one expert (adjacent) run together and share
each weight tile through L2. Blocks without an expert return at once. Every index read from device memory is
range-checked before use (expert ids against ``[0, E)``; rows and blocks are computed, not read). The
roundings are those of the other two paths (``h`` and ``y`` in bf16, the combine in fp32), so all three
compute the same function; reruns are bitwise identical. Config: ``heuristics.moe_blocks_config``; the choice
among the paths: ``heuristics.choose`` (``family="moe"``). The host path is ``moe.moe_experts``: it launches these
kernels (the routing's from :func:`routing`, which builds its buffers and launch arguments).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cuda.tile as ct
import torch

from tilegemm.ops.cutile import launch, tile_lib

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO


def _block_gate_up(
    xs, wg, wu, h, block_expert, num_experts: int, ACT: ConstInt, BW: ConstInt, BK: ConstInt, BT: ConstInt
):  # fmt: skip
    """``h [M, I]`` rows of block ``bid(0)``, columns ``[bid(1) * BW, +BW)``; xs [M, H]; wg, wu [E, I, H]."""
    mb = ct.bid(0)
    pn = ct.bid(1)
    e, live = tile_lib.block_expert(block_expert, mb, num_experts)
    if live:
        acc_g = ct.zeros((BW, BT), dtype=ct.float32)
        acc_u = ct.zeros((BW, BT), dtype=ct.float32)
        for kb in range(ct.cdiv(xs.shape[1], BK)):
            a = ct.load(xs, (kb, mb), (BK, BT), order=(1, 0), padding_mode=_ZERO)
            g = ct.reshape(ct.load(wg, (e, pn, kb), shape=(1, BW, BK), padding_mode=_ZERO), (BW, BK))
            u = ct.reshape(ct.load(wu, (e, pn, kb), shape=(1, BW, BK), padding_mode=_ZERO), (BW, BK))
            acc_g = ct.mma(g, a, acc_g)
            acc_u = ct.mma(u, a, acc_u)
        ct.store(h, (pn, mb), ct.astype(tile_lib.activation(acc_g, ACT) * acc_u, h.dtype), order=(1, 0))


def _block_down(h, w2, y, block_expert, row_weight, num_experts: int, BW: ConstInt, BK: ConstInt, BT: ConstInt):
    """``y [M, H]`` rows of block ``bid(0)``, columns ``[bid(1) * BW, +BW)``; h [M, I]; w2 [E, H, I]; row_weight [M]."""
    mb = ct.bid(0)
    pn = ct.bid(1)
    e, live = tile_lib.block_expert(block_expert, mb, num_experts)
    if live:
        acc = ct.zeros((BW, BT), dtype=ct.float32)
        for kb in range(ct.cdiv(h.shape[1], BK)):
            a = ct.load(h, (kb, mb), (BK, BT), order=(1, 0), padding_mode=_ZERO)
            w = ct.reshape(ct.load(w2, (e, pn, kb), shape=(1, BW, BK), padding_mode=_ZERO), (BW, BK))
            acc = ct.mma(w, a, acc)
        wt = ct.reshape(ct.load(row_weight, (mb,), shape=(BT,), padding_mode=_ZERO), (1, BT))
        ct.store(y, (pn, mb), ct.astype(acc * wt, y.dtype), order=(1, 0))


#: Experts per routing CTA and the routing kernels' tiles: slots per step, rows zeroed per step, blocks per step.
ROUTE_EC = 8
ROUTE_SC = 256
ROUTE_RC = 1024
ROUTE_BC = 16


def _slot_lanes(ids, j, lane0, num_experts: int, SC: int, EC: int):
    """``(s, hot, dropped)`` of slots ``[j * SC, +SC)``: their indices; ``hot [SC, EC]`` int32, 1 where slot i
    routes to expert ``lane0 + c``; ``dropped``, whether slot i's id is outside ``[0, E)`` (slots past the end too)."""
    s = j * SC + ct.arange(SC, dtype=ct.int32)
    e = ct.gather(ids, s, padding_value=-1)
    ok = (e >= 0) & (e < num_experts)
    e32 = ct.reshape(ct.where(ok, ct.astype(e, ct.int32), -1), (SC, 1))
    lanes = lane0 + ct.reshape(ct.arange(EC, dtype=ct.int32), (1, EC))
    return s, ct.astype(e32 == lanes, ct.int32), (e < 0) | (e >= num_experts)


def _route_count(
    ids, counts, row_token, row_weight, row_group, num_experts: int, steps: int, SC: ConstInt, EC: ConstInt,
    RC: ConstInt,
):  # fmt: skip
    """CTA (c, j): ``counts[j, c * EC + i]`` = the slots of chunk j (``steps * SC`` slots) routed to expert
    ``c * EC + i``; ``RC``-row chunks of ``row_token`` and ``row_weight`` set to 0 and of ``row_group`` to
    ``num_experts``, strided over all CTAs. ids [S] (any integer dtype); counts int32 [chunks, G * EC]."""
    c = ct.bid(0)
    j = ct.bid(1)
    total = ct.zeros((1, EC), dtype=ct.int32)
    for i in range(steps):
        _, hot, _ = _slot_lanes(ids, j * steps + i, c * EC, num_experts, SC, EC)
        total = total + ct.sum(hot, axis=0, keepdims=True)
    ct.store(counts, (j, c), total)
    r = c + j * ct.num_blocks(0)
    while r < ct.cdiv(row_token.shape[0], RC):
        ct.store(row_token, (r,), ct.zeros((RC,), dtype=ct.int32))
        ct.store(row_weight, (r,), ct.zeros((RC,), dtype=ct.float32))
        ct.store(row_group, (r,), ct.full((RC,), num_experts, dtype=ct.int32))
        r = r + ct.num_blocks(0) * ct.num_blocks(1)


def _route_place(
    ids, weights, counts, dest, row_token, row_weight, row_group, block_expert, num_experts: int, top_k: int,
    steps: int, BT: ConstInt, EP: ConstInt, SC: ConstInt, EC: ConstInt, BC: ConstInt,
):  # fmt: skip
    """CTA (c, j) places chunk j's slots of experts ``[c * EC, +EC)`` (``dest``, ``row_token``, ``row_weight``,
    ``row_group``) and
    sets the experts of ``BC``-block chunks strided over all CTAs; see the module docstring, step 1.

    Expert e's rows start at ``start[e] = sum_{e' < e} ceil(count[e'] / BT) * BT`` (``count``: ``counts`` summed over
    the chunks); a slot's row is its expert's start plus the number of earlier slots routed to the same expert (in
    earlier chunks, then earlier in its own). ``EP``: a power of two >= the row length of ``counts``.
    """
    c = ct.bid(0)
    j = ct.bid(1)
    lanes = ct.reshape(ct.arange(EP, dtype=ct.int32), (1, EP))
    every = ct.zeros((1, EP), dtype=ct.int32)
    earlier = ct.zeros((1, EP), dtype=ct.int32)
    for jj in range(counts.shape[0]):
        chunk = ct.load(counts, (jj, 0), shape=(1, EP), padding_mode=_ZERO)
        every = every + chunk
        earlier = earlier + ct.where(jj < j, chunk, 0)
    padded = (every + (BT - 1)) // BT * BT
    end = ct.cumsum(padded, axis=1)
    start = end - padded
    mine = ct.reshape(c * EC + ct.arange(EC, dtype=ct.int32), (EC, 1))
    first = ct.broadcast_to(start + earlier, (EC, EP))
    my_start = ct.reshape(ct.sum(ct.where(lanes == mine, first, 0), axis=1), (1, EC))
    seen = ct.zeros((1, EC), dtype=ct.int32)
    experts = ct.reshape(c * EC + ct.arange(EC, dtype=ct.int32), (1, EC))
    for i in range(steps):
        s, hot, dropped = _slot_lanes(ids, j * steps + i, c * EC, num_experts, SC, EC)
        before = ct.cumsum(hot, axis=0) - hot + seen
        row = ct.sum(hot * (my_start + before), axis=1)
        live = ct.sum(hot, axis=1) > 0
        ct.scatter(dest, s, row, mask=live)
        if c == 0:
            ct.scatter(dest, s, ct.full((SC,), -1, dtype=ct.int32), mask=dropped)
        ct.scatter(row_token, row, s // top_k, mask=live)
        ct.scatter(row_weight, row, ct.astype(ct.gather(weights, s), ct.float32), mask=live)
        ct.scatter(row_group, row, ct.sum(hot * experts, axis=1), mask=live)
        seen = seen + ct.sum(hot, axis=0, keepdims=True)
    b = c + j * ct.num_blocks(0)
    while b < ct.cdiv(block_expert.shape[0], BC):
        first_row = ct.reshape((b * BC + ct.arange(BC, dtype=ct.int32)) * BT, (BC, 1))
        inside = (first_row >= start) & (first_row < end)
        owner = ct.sum(ct.where(inside, ct.broadcast_to(lanes, (BC, EP)), 0), axis=1)
        has = ct.sum(ct.astype(inside, ct.int32), axis=1) > 0
        ct.store(block_expert, (b,), ct.where(has, owner, ct.full((BC,), -1, dtype=ct.int32)))
        b = b + ct.num_blocks(0) * ct.num_blocks(1)


#: ``get_kernel(name)``: the cached ``@ct.kernel`` of ``count``, ``place``, ``gate_up``, ``down``.
get_kernel = launch.kernel_factory(
    {"count": _route_count, "place": _route_place, "gate_up": _block_gate_up, "down": _block_down}, hints=False
)


class Routing(NamedTuple):
    """Step 1 of the module docstring for ``rows`` sorted rows: the buffers the routing kernels fill and their two
    launches ``(kernel, grid, args)``, for the host function to launch on its stream (in order).

    ``row_token`` int32 [rows] (0 where no slot lands), ``row_weight`` fp32 [rows] (0 there), ``row_group`` int32
    [rows] (each row's expert, E where no slot lands: the m-grouped GEMMs' ``m_index``, whose padding rows they
    neither compute nor store), ``dest`` int32 [T, k] (each slot's row, -1: dropped) and ``block_expert`` int32
    [rows / bt] (each block's expert, -1: none).
    """

    row_token: torch.Tensor
    row_weight: torch.Tensor
    row_group: torch.Tensor
    dest: torch.Tensor
    block_expert: torch.Tensor
    launches: tuple[tuple[Any, tuple[int, int, int], tuple[Any, ...]], ...]


def routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, bt: int, rows: int) -> Routing:
    """The routing's buffers and launches (:class:`Routing`): ``topk_ids`` int [T, k] (any integer dtype; ids outside
    ``[0, E)`` are dropped), ``topk_weights`` float [T, k]; ``rows`` = ``max_padded_rows(T, k, E, bt)``. Two launches,
    no host synchronisation."""
    dev = topk_ids.device
    groups = launch.cdiv(num_experts, ROUTE_EC)
    lanes = 1 << max(0, groups * ROUTE_EC - 1).bit_length()
    ids, weights = topk_ids.reshape(-1), topk_weights.reshape(-1)
    # Slot chunks: enough CTAs to fill the machine twice over, each walking ``steps`` SC-slot steps.
    total_steps = max(1, launch.cdiv(ids.numel(), ROUTE_SC))
    steps = launch.cdiv(total_steps, min(total_steps, launch.cdiv(2 * launch.num_sms(), groups)))
    chunks = launch.cdiv(total_steps, steps)
    counts = torch.empty(chunks, groups * ROUTE_EC, dtype=torch.int32, device=dev)
    row_token = torch.empty(rows, dtype=torch.int32, device=dev)
    row_weight = torch.empty(rows, dtype=torch.float32, device=dev)
    row_group = torch.empty(rows, dtype=torch.int32, device=dev)
    dest = torch.empty(topk_ids.shape, dtype=torch.int32, device=dev)
    block_expert = torch.empty(rows // bt, dtype=torch.int32, device=dev)
    grid = (groups, chunks, 1)
    count = (ids, counts, row_token, row_weight, row_group, num_experts, steps, ROUTE_SC, ROUTE_EC, ROUTE_RC)
    place = (ids, weights, counts, dest.view(-1), row_token, row_weight, row_group, block_expert, num_experts)
    place = (*place, topk_ids.shape[1])
    place = (*place, steps, bt, lanes, ROUTE_SC, ROUTE_EC, ROUTE_BC)
    launches = ((get_kernel("count"), grid, count), (get_kernel("place"), grid, place))
    return Routing(row_token, row_weight, row_group, dest, block_expert, launches)
