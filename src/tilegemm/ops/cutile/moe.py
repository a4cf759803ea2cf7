"""cuTile fused MoE experts (``tilegemm.moe_experts``), BF16: three kernels around the device-side routing.

The host entry below takes one of three paths (``heuristics.choose``, ``family="moe"``): per routed slot at
decode sizes (``moe_slots.py``, no routing), few-row expert blocks in swap-AB form (``moe_blocks.py``: the
routing and the combine below, its own two GEMM kernels), or the persistent tiles of this module (prefill).

Routing (the block path's two kernels, ``moe_blocks.routing``, with ``BT = BM``; sizes fixed by ``(T, k, E, BM)``):
``M`` rows where each expert's rows start on a BM-row block, per block its expert (``block_expert``, -1 for
none); per row its token (``tokens``, 0 for padding), its routing weight (``row_weight``, 0 for padding) and,
per (token, slot), the row holding its result (``dest`` [T, k], -1 for a dropped slot). It replaced
``tilegemm.routing.moe_route`` here (the same layout in about fifty torch launches, some 90 us in a CUDA graph).

1. **gate/up** (``_gate_up``): ``h[r] = act(x[tok(r)] @ Wg_e.T) * (x[tok(r)] @ Wu_e.T)`` for every row r of
   a block of expert e. The rows are gathered once into the aligned layout (``xs = x.index_select(0, tokens)``)
   and loaded by TMA: at prefill sizes that beat gathering them inside the kernel (``ct.gather``, which also
   capped the tile at two 128x64 accumulators) by up to 2.3x (``benchmarks/results/moe/paths_h100.md``).
   One fp32 accumulator ``[BM, 2 * BN]`` over a ``[2 * BN, BK]`` weight tile: the gate rows ``[n, n + BN)`` of
   ``w13[e]`` and the up rows ``[I + n, I + n + BN)``, loaded by one TMA from the ``[E, 2, I, H]`` view of ``w13``
   (:func:`gate_up_view`; each half is zero-filled past ``I``, so I need not be a multiple of BN). Each warpgroup
   MMA is then 64 x 2BN; as two BN-wide chains, one per half, tileiras issued one MMA per group and the kernel ran
   13% below the down GEMM. The gated activation runs on the accumulator's halves; ``h`` [M, I] bf16 is written once.
2. **down** (``_down``): ``y[r] = bf16(w(r) * (h[r] @ W2_e.T))``: the grouped GEMM of ``grouped.py`` with
   the routing weight applied to the fp32 accumulator before the rounding.
3. **combine** (``_combine``): ``out[t] = bf16(sum_{j=0..k-1} y[dest[t, j]])`` in fp32, slots in order:
   no atomics, reruns are bitwise identical. Dropped slots (``dest = -1``) gather 0.

Blocks whose expert id is -1 (the unused tail of the worst-case ``M``) are skipped by both GEMMs: no
one reads their rows. Padding rows inside a block (an expert's last block) are computed from token 0
and never read either (``dest`` never points at them). Every index is computed into range (tokens in
``[0, T)`` before the gather) or bounds-checked where it is read (expert ids, ``dest``), so no value makes a
kernel read out of bounds. No host synchronisation anywhere: the op is CUDA-graph capturable after its first
call.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.heuristics.cutile import Kind
from tilegemm.ops.cutile import launch, moe_blocks, moe_slots, tile_lib
from tilegemm.ops.cutile.grouped import check_tma_weight
from tilegemm.routing import max_padded_rows

ConstInt = ct.Constant[int]

_ZERO = ct.PaddingMode.ZERO

#: Activations of the gate/up epilogue: name -> kernel constant.
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def gate_up_view(w13: torch.Tensor) -> torch.Tensor:
    """``w13 [E, 2I, H]`` as ``[E, 2, I, H]`` (gate rows, up rows): the weight argument of :func:`gate_up_tile`."""
    return w13.unflatten(1, (2, w13.shape[1] // 2))


def gate_up_tile(xs, w4, e, mb, nb, nk, BM: int, BN: int, BK: int):
    """fp32 ``(gate, up)`` [BM, BN] of row block ``mb``, columns ``[nb * BN, +BN)`` of expert ``e``: ``xs[rows] @
    w4[e, 0].T`` and ``xs[rows] @ w4[e, 1].T`` over ``nk`` K blocks (xs [M, H]; w4 [E, 2, I, H], :func:`gate_up_view`),
    as the two halves of one ``[BM, 2 * BN]`` accumulator (module docstring)."""
    acc = ct.full((BM, 2 * BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        at = ct.load(xs, (mb, kb), shape=(BM, BK), padding_mode=_ZERO)
        wt = ct.load(w4, (e, 0, nb, kb), shape=(1, 2, BN, BK), padding_mode=_ZERO)
        acc = ct.mma(at, ct.transpose(ct.reshape(wt, (2 * BN, BK))), acc)
    return ct.extract(acc, (0, 0), (BM, BN)), ct.extract(acc, (0, 1), (BM, BN))


def gate_up_walk(
    xs, w4, gate, up, h, block_expert, num_experts: int, ACT: int, BM: int, BN: int, BK: int, GM: int, SAVE: bool
):  # fmt: skip
    """Persistent over (row block, column block) tiles of ``h [M, I]``: ``h = act(gate) * up`` from the fp32
    accumulators of :func:`gate_up_tile` (tile code); with ``SAVE`` also ``gate`` and ``up`` themselves (the training
    forward keeps them for the backward), else ``gate`` and ``up`` are never touched."""
    mblocks, n_tiles, nk, total, t, step = tile_lib.persistent_walk(h, xs, BM, BN, BK)
    while t < total:
        mb, nb, e, live = tile_lib.expert_tile(block_expert, t, mblocks, n_tiles, num_experts, GM)
        if live:
            acc_g, acc_u = gate_up_tile(xs, w4, e, mb, nb, nk, BM, BN, BK)
            if SAVE:
                ct.store(gate, (mb, nb), ct.astype(acc_g, gate.dtype))
                ct.store(up, (mb, nb), ct.astype(acc_u, up.dtype))
            ct.store(h, (mb, nb), ct.astype(tile_lib.activation(acc_g, ACT) * acc_u, h.dtype))
        t = t + step


def _gate_up(
    xs, w4, h, block_expert, num_experts: int, ACT: ConstInt, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt
):  # fmt: skip
    """Persistent over (row block, column block) tiles of ``h [M, I]``; see the module docstring."""
    gate_up_walk(xs, w4, h, h, h, block_expert, num_experts, ACT, BM, BN, BK, GM, False)


def _down(h, w2, y, block_expert, row_weight, num_experts: int, BM: ConstInt, BN: ConstInt, BK: ConstInt, GM: ConstInt):
    """Persistent over tiles of ``y [M, H]``: ``y[r] = bf16(row_weight[r] * (h[r] @ w2[e].T))``."""
    mblocks, n_tiles, nk, total, t, step = tile_lib.persistent_walk(y, h, BM, BN, BK)
    while t < total:
        mb, nb, e, live = tile_lib.expert_tile(block_expert, t, mblocks, n_tiles, num_experts, GM)
        if live:
            acc = tile_lib.mma_bf16(h, w2, 0, e, mb, nb, nk, BM, BN, BK, True, Kind.INDICES)
            wt = ct.reshape(ct.load(row_weight, (mb,), shape=(BM,), padding_mode=_ZERO), (BM, 1))
            ct.store(y, (mb, nb), ct.astype(acc * wt, y.dtype))
        t = t + step


def _combine(y, dest, out, TOPK: ConstInt, BT: ConstInt, BN: ConstInt):
    """``out`` tile (bid 0: BT tokens, bid 1: BN columns) = the fp32 sum over j = 0..k-1 of ``y[dest[t, j]]``."""
    tok = ct.bid(0) * BT + ct.arange(BT, dtype=ct.int32)
    cols = ct.reshape(ct.bid(1) * BN + ct.arange(BN, dtype=ct.int32), (1, BN))
    acc = ct.full((BT, BN), 0.0, dtype=ct.float32)
    for j in range(TOPK):
        acc = acc + slot_rows(y, dest, tok, j, cols, BT)
    ct.store(out, (ct.bid(0), ct.bid(1)), ct.astype(acc, out.dtype))


def slot_rows(y, dest, tok, j, cols, BT: int):
    """fp32 [BT, BN]: columns ``cols`` [1, BN] of ``y[dest[t, j]]`` for the tokens ``tok`` [BT]; 0 where the slot is
    dropped (``dest`` -1 or out of range) or the token is past the end of ``dest``."""
    rows = ct.reshape(ct.gather(dest, (tok, j), padding_value=-1), (BT, 1))
    live = (rows >= 0) & (rows < y.shape[0])
    vals = ct.gather(y, (ct.where(live, rows, 0), cols), mask=live, padding_value=0, check_bounds=False)
    return ct.astype(vals, ct.float32)


#: ``get_kernel(name, num_worker_warps, occupancy)``: the cached ``@ct.kernel`` of ``gate_up``, ``down``, ``combine``.
get_kernel = launch.kernel_factory({"gate_up": _gate_up, "down": _down, "combine": _combine})


# ------------------------------------------------------------------------------------- host side


def supported(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, activation: str) -> None:
    """Raise :class:`Unsupported` (before anything is written) for what the kernels do not take."""
    if activation not in ACTIVATIONS:
        raise Unsupported(f"activation {activation!r} (the kernels take {sorted(ACTIVATIONS)})")
    if any(t.dtype != torch.bfloat16 for t in (hidden, w13, w2)):
        raise Unsupported("the fused experts kernels take bf16 hidden states and weights")
    hidden_dim, inter = hidden.shape[1], w2.shape[2]
    if hidden_dim % 8 or inter % 8:
        raise Unsupported("H and I must be multiples of 8 (16-byte rows for TMA)")
    for t in (w13, w2):
        if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1] or t.stride(0) != t.shape[1] * t.shape[2]:
            raise Unsupported("w13 and w2 must be contiguous")
        if t.data_ptr() % 16:
            raise Unsupported("weights must be 16-byte aligned")
    check_tma_weight(w13)
    check_tma_weight(w2)


@register_impl("moe_experts", "cutile")
def moe_experts(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Fused BF16 MoE experts; see ``tilegemm.ops.api.moe_experts`` and the module docstring.

    One linear host function for the three paths: problem -> config (``heuristics.choose``, family ``moe``: its
    ``path``) -> operands (routing, buffers) -> the path's launches, every one on ``stream``.
    """
    supported(hidden, w13, w2, activation)
    num_tokens, hidden_dim = hidden.shape
    num_experts, top_k, inter = w13.shape[0], topk_ids.shape[1], w2.shape[2]
    out = torch.empty(num_tokens, hidden_dim, dtype=hidden.dtype, device=hidden.device)
    if num_tokens == 0 or hidden_dim == 0:
        return out
    if top_k == 0 or inter == 0 or num_experts == 0:
        return out.zero_()
    # problem -> config
    slots = num_tokens * top_k
    cfg = heuristics.choose(
        heuristics.problem("moe", "bf16", slots, hidden_dim, inter, launch.num_sms(), groups=num_experts)
    )
    shape = {"t": num_tokens, "k": top_k, "e": num_experts, "h": hidden_dim, "i": inter}
    act = ACTIVATIONS[activation]
    x = launch.as_row_major(hidden, pad_rows=False)
    combine_grid = (launch.cdiv(num_tokens, cfg.combine_bt), hidden_dim // cfg.combine_bn, 1)
    if cfg.path == "slots":  # moe_slots.py: one row per slot, no routing
        heuristics.print_once("moe_experts", shape, cfg.name)
        ids, weights = topk_ids.reshape(-1), topk_weights.reshape(-1)
        h = torch.empty(slots, inter, dtype=torch.bfloat16, device=hidden.device)
        y = torch.empty(slots, hidden_dim, dtype=torch.bfloat16, device=hidden.device)
        bw, bk, bt = cfg.bw, cfg.bk, cfg.bt
        args = (x, w13[:, :inter], w13[:, inter:], h, ids, num_experts, top_k, act, bw, bk, bt, hidden_dim % bk == 0)
        launch.launch(moe_slots.get_kernel("gate_up"), (slots, launch.cdiv(inter, bw), 1), args, stream)
        args = (h, w2, y, ids, weights, num_experts, bw, bk, bt, inter % bk == 0)
        launch.launch(moe_slots.get_kernel("down"), (slots, launch.cdiv(hidden_dim, bw), 1), args, stream)
        args = (y.view(num_tokens, top_k, hidden_dim), out, top_k, cfg.combine_bt, cfg.combine_bn)
        launch.launch(moe_slots.get_kernel("combine"), combine_grid, args, stream)
        return out
    align = cfg.row_align
    rows = max_padded_rows(num_tokens, top_k, num_experts, align)
    if rows * max(hidden_dim, inter) >= 2**31 or hidden.numel() >= 2**31:
        raise Unsupported("a buffer has >= 2**31 elements (int32 indexing)")
    heuristics.print_once("moe_experts", shape, cfg.name)
    # operands: the routing (blocks of ``align`` rows per expert), the sorted rows gathered once (TMA tiles), h, y
    routed = moe_blocks.routing(topk_ids, topk_weights, num_experts, align, rows)
    for kernel, grid, args in routed.launches:
        launch.launch(kernel, grid, args, stream)
    xs = x.index_select(0, routed.row_token)
    h = torch.empty(rows, inter, dtype=torch.bfloat16, device=hidden.device)
    y = torch.empty(rows, hidden_dim, dtype=torch.bfloat16, device=hidden.device)
    block_expert, row_weight = routed.block_expert, routed.row_weight
    if cfg.path == "blocks":  # moe_blocks.py: swap-AB, one CTA per (block, weight tile)
        blocks, bw, bk, bt = rows // cfg.bt, cfg.bw, cfg.bk, cfg.bt
        args = (xs, w13[:, :inter], w13[:, inter:], h, block_expert, num_experts, act, bw, bk, bt)
        launch.launch(moe_blocks.get_kernel("gate_up"), (blocks, launch.cdiv(inter, bw), 1), args, stream)
        args = (h, w2, y, block_expert, row_weight, num_experts, bw, bk, bt)
        launch.launch(moe_blocks.get_kernel("down"), (blocks, launch.cdiv(hidden_dim, bw), 1), args, stream)
    else:  # sorted: this module's persistent tiles
        up, down = cfg.up, cfg.down
        grid = launch.persistent_grid(rows // up.bm * launch.cdiv(inter, up.bn), up.ctas_per_sm)
        args = (xs, gate_up_view(w13), h, block_expert, num_experts, act, up.bm, up.bn, up.bk, up.gm)
        launch.launch(get_kernel("gate_up", up.num_worker_warps, up.occupancy), grid, args, stream)
        grid = launch.persistent_grid(rows // down.bm * launch.cdiv(hidden_dim, down.bn), down.ctas_per_sm)
        args = (h, w2, y, block_expert, row_weight, num_experts, down.bm, down.bn, down.bk, down.gm)
        launch.launch(get_kernel("down", down.num_worker_warps, down.occupancy), grid, args, stream)
    args = (y, routed.dest, out, top_k, cfg.combine_bt, cfg.combine_bn)
    launch.launch(get_kernel("combine"), combine_grid, args, stream)
    return out
