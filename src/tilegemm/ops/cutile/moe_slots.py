"""cuTile fused MoE experts at decode sizes: one weight stream per (token, slot), no routing.

When the ``S = T * k`` routed slots are few compared with the experts (decode), sorting them by expert
costs more than it saves: almost every slot has an expert of its own, and the sort, the counts and the
aligned layout are a dozen small launches. Here every slot is its own one-row GEMM, read straight from
``topk_ids`` (``ids``, flattened ``[S]``):

1. **gate/up** (``_slot_gate_up``), one CTA per (slot ``s``, ``BW`` intermediate columns ``pn``):
   ``h[s] = act(x[t] @ Wg_e.T) * (x[t] @ Wu_e.T)`` with ``t = s // k`` and ``e = ids[s]``. Swap-AB as
   in ``decode.py``: the ``[BW, BK]`` weight tile (TMA) is the MMA's first operand and the token's row,
   gathered transposed as ``[BK, BT]`` (all ``BT`` columns the same row; the MMA's N side is at least
   8 wide), the second; column 0 of the ``[BW, BT]`` accumulators is the result.
2. **down** (``_slot_down``), one CTA per (slot, ``BW`` hidden columns): ``y[s] = bf16(w[s] * (h[s] @ W2_e.T))``.
3. **combine** (``_slot_combine``): ``out[t] = bf16(sum_{j<k} y[t * k + j])`` in fp32, slots in order (no
   atomics: reruns are bitwise identical).

A slot whose id is outside ``[0, E)`` (expert parallelism's sentinel) writes zero rows and reads no weight.
The roundings are those of ``moe.py`` and ``moe_blocks.py`` (``h`` and ``y`` in bf16, the sum in fp32), so all
three paths compute the same function. Config and the choice among the paths: ``heuristics.choose``
(``family="moe"``), by ``heuristics.cutile.moe.moe_decode_sized``. The host path is ``moe.moe_experts``: it launches
these kernels (``ids`` and the routing weights flattened to ``[S]``, ``wg``/``wu`` the halves of ``w13``).
"""

from __future__ import annotations

import cuda.tile as ct

from tilegemm.ops.cutile import launch, tile_lib

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO


def _row_t(x, row, kb, BK: int, BT: int, EVEN_K: bool):
    """``x[row, kb*BK : (kb+1)*BK]`` as a ``[BK, BT]`` tile (every column the same row); past the end: 0."""
    rows = ct.full((1, BT), row, dtype=ct.int32)
    cols = ct.reshape(kb * BK + ct.arange(BK, dtype=ct.int32), (BK, 1))
    if EVEN_K:
        return ct.gather(x, (rows, cols), padding_value=0, check_bounds=False)
    return ct.gather(x, (rows, cols), padding_value=0)


def _expert(ids, s, num_experts: int):
    """``(e, live)``: slot ``s``'s expert clamped into ``[0, E)`` and whether it was in range."""
    e = ct.astype(ct.load(ids, (s,), shape=()), ct.int32)
    live = (e >= 0) & (e < num_experts)
    return ct.where(live, e, 0), live


def _slot_gate_up(
    x, wg, wu, h, ids, num_experts: int, top_k: int,
    ACT: ConstInt, BW: ConstInt, BK: ConstInt, BT: ConstInt, EVEN_K: ConstBool,
):  # fmt: skip
    """``h [S, I]`` row ``s``, columns ``[pn * BW, (pn + 1) * BW)``; x [T, H]; wg, wu [E, I, H] (the halves of w13)."""
    s = ct.bid(0)
    pn = ct.bid(1)
    e, live = _expert(ids, s, num_experts)
    out = ct.zeros((1, BW), dtype=h.dtype)
    if live:
        t = s // top_k
        acc_g = ct.zeros((BW, BT), dtype=ct.float32)
        acc_u = ct.zeros((BW, BT), dtype=ct.float32)
        for kb in range(ct.cdiv(x.shape[1], BK)):
            xt = _row_t(x, t, kb, BK, BT, EVEN_K)
            g = ct.reshape(ct.load(wg, (e, pn, kb), shape=(1, BW, BK), padding_mode=_ZERO), (BW, BK))
            u = ct.reshape(ct.load(wu, (e, pn, kb), shape=(1, BW, BK), padding_mode=_ZERO), (BW, BK))
            acc_g = ct.mma(g, xt, acc_g)
            acc_u = ct.mma(u, xt, acc_u)
        col_g = ct.extract(acc_g, (0, 0), (BW, 1))
        col_u = ct.extract(acc_u, (0, 0), (BW, 1))
        out = ct.reshape(ct.astype(tile_lib.activation(col_g, ACT) * col_u, h.dtype), (1, BW))
    ct.store(h, (s, pn), out)


def _slot_down(h, w2, y, ids, weights, num_experts: int, BW: ConstInt, BK: ConstInt, BT: ConstInt, EVEN_K: ConstBool):
    """``y [S, H]`` row ``s``, columns ``[pn * BW, (pn + 1) * BW)``; h [S, I]; w2 [E, H, I]; weights [S]."""
    s = ct.bid(0)
    pn = ct.bid(1)
    e, live = _expert(ids, s, num_experts)
    out = ct.zeros((1, BW), dtype=y.dtype)
    if live:
        acc = ct.zeros((BW, BT), dtype=ct.float32)
        for kb in range(ct.cdiv(h.shape[1], BK)):
            ht = _row_t(h, s, kb, BK, BT, EVEN_K)
            w = ct.reshape(ct.load(w2, (e, pn, kb), shape=(1, BW, BK), padding_mode=_ZERO), (BW, BK))
            acc = ct.mma(w, ht, acc)
        wt = ct.astype(ct.load(weights, (s,), shape=()), ct.float32)
        out = ct.reshape(ct.astype(ct.extract(acc, (0, 0), (BW, 1)) * wt, y.dtype), (1, BW))
    ct.store(y, (s, pn), out)


def _slot_combine(y, out, TOPK: ConstInt, BT: ConstInt, BN: ConstInt):
    """``out [T, H]`` tile (BT tokens, BN columns) = the fp32 sum over ``j < k`` of ``y [T, k, H]`` slot j."""
    acc = ct.zeros((BT, BN), dtype=ct.float32)
    for j in range(TOPK):
        part = ct.load(y, (ct.bid(0), j, ct.bid(1)), shape=(BT, 1, BN), padding_mode=_ZERO)
        acc = acc + ct.astype(ct.reshape(part, (BT, BN)), ct.float32)
    ct.store(out, (ct.bid(0), ct.bid(1)), ct.astype(acc, out.dtype))


#: ``get_kernel(name)``: the cached ``@ct.kernel`` of ``gate_up``, ``down``, ``combine``.
get_kernel = launch.kernel_factory(
    {"gate_up": _slot_gate_up, "down": _slot_down, "combine": _slot_combine}, hints=False
)
