"""FP8 MQA-logits kernels of the ``cutile`` backend (DeepSeek sparse-attention indexer), device side: the plain and
paged kernels with their shared tile math (weighted head sums, key tiles) and the ``-inf`` fill kernel. The host
paths that launch them (and the paged op's hot-lane replay) are :mod:`tilegemm.ops.cutile.mqa`.

Both ops compute ``logits[i, j] = kv_scale[j] * sum_h w[i, h] * relu(q[i, h, :] . k[j, :])``.

Layout of the work (both kernels): keys go on the MMA's M side and (query row, head) pairs on
its N side, ``scores[BK, R*HP] = k[BK, D] @ q[R*HP, D].T`` (FP8 x FP8, fp32 accumulate: QGMMA on
sm_90, tcgen05 on sm_100). The head reduction then runs along N, inside each thread's registers
plus a few warp shuffles, never through shared memory. ``HP`` is H rounded up to a power of two;
the padded heads load as zeros with zero weights.

* ``fp8_mqa_logits``: one CTA per tile of ``BQ`` query rows (``BQ * HP = 128``), heaviest tiles
  first; it loops only over the key tiles that meet the union of its rows' ``[ks, ke)`` windows,
  so cost follows the valid pairs. ``-inf`` outside the windows: the in-tile mask, and
  ``mqa_clean_logits_kernel`` on the tiles the kernel does not compute. On sm_90 two CTAs share an SM, so one's MMA
  runs during the other's head sum (:func:`plain_kernel_for`), and with two query rows per CTA each row has
  its own MMA, so one row's head sum runs during the other's MMA (:func:`key_tile_logits`).
* ``bf16_mqa_logits``: the same kernel on bf16 ``q`` and keys (BF16 MMAs), key scales of 1.
* ``get_paged_mqa_logits_metadata``: torch ops on the device (no host sync), the same balanced
  split as the reference backend (``ops.common.paged_mqa_schedule``).
* ``fp8_paged_mqa_logits``: a persistent kernel; ``parts`` CTAs share schedule row i (the splits
  from row i to row i + 1, round-robin), walked one batch row at a time: the row's length (and on sm_90
  its query rows, ``PagedMqaConfig.rows_outer``) once, then a branch-free loop over the CTA's chunks of
  that row, each gathering its KV-cache blocks with one indexed (TMA) load. A repeated call replays its
  launch (the registry's hot lane: ``checks.paged_mqa_logits_signature`` and the host module's replay).

Whatever the index values, no kernel reads or writes out of bounds: window bounds are clamped,
block ids are clamped into the cache, tile indices stay inside the arrays.
"""

from __future__ import annotations

import functools

import cuda.tile as ct

from tilegemm.ops.cutile import tile_lib

ZERO = ct.PaddingMode.ZERO
NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


def mma_init(CHAIN: bool) -> float:
    """The scores' MMA accumulator start: ``-0.0`` with the FFMA-chain head sum, else ``0.0`` (tile code).

    ``x + (-0.0) == x`` for every ``x``, so tileiras drops the add of the start tile; from ``+0.0`` it keeps
    one FADD per score (``-0.0 + 0.0`` is ``+0.0``). With ``ct.sum`` at N = 256 the ``-0.0`` start made
    tileiras 13.4 spill on sm_90, so that path keeps ``0.0``.
    """
    return -0.0 if CHAIN else 0.0


def weighted_head_sum(scores, w, ROWS: int, R: int, HP: int, CHAIN: bool):
    """``out[k, r] = sum_h w[0, r * HP + h] * relu(scores[k, r * HP + h])`` (tile code).

    ``scores`` fp32 ``[ROWS, R * HP]`` (an MMA result), ``w`` fp32 ``[1, R * HP]`` -> fp32 ``[ROWS, R]``.
    ``CHAIN``: the heads are summed as a chain over groups of 8 (an MMA accumulator's column atom,
    so each thread's values stay in its registers): ``acc += relu(s_g) * w_g`` contracts into one
    FFMA per score, where a ``ct.sum`` over all heads costs an FMUL and an FADD per score. Then
    the 8 columns of a group are summed (two in each thread, then across its quad).
    """
    if not CHAIN:
        return ct.sum(ct.reshape(ct.maximum(scores, 0.0) * w, (ROWS, R, HP)), axis=2)
    GW = 8 if HP >= 8 else HP  # heads per group
    G = HP // GW
    s = ct.reshape(ct.maximum(scores, 0.0), (ROWS, R, G, GW))
    w4 = ct.reshape(w, (1, R, G, GW))
    acc = ct.extract(s, (0, 0, 0, 0), shape=(ROWS, R, 1, GW)) * ct.extract(w4, (0, 0, 0, 0), shape=(1, R, 1, GW))
    for g in ct.static_iter(range(1, G)):
        s_g = ct.extract(s, (0, 0, g, 0), shape=(ROWS, R, 1, GW))
        acc = acc + s_g * ct.extract(w4, (0, 0, g, 0), shape=(1, R, 1, GW))
    return ct.reshape(ct.sum(acc, axis=3), (ROWS, R))


def key_tile_logits(k_t, q_t, w_t, BK: int, BQ: int, HP: int, HEAD_CHAIN: bool, TWO_CHAINS: bool, fast_acc: bool):
    """``[BK, BQ]`` weighted head sums of one key tile ``k_t`` fp8 ``[BK, D]`` against ``q_t`` fp8 ``[D, BQ * HP]``
    (``w_t`` fp32 ``[1, BQ * HP]``), before the key scales (tile code).

    ``TWO_CHAINS``: the query rows in two halves, two MMAs on the same key tile, each half's head sum after its own
    MMA: tileiras then runs the first half's head sum while the second half's MMA is in flight (sm_90 SASS: QGMMA
    chain 1 issued between chain 0's wait and its head sum). Each row's sum is the same either way.
    """
    if not TWO_CHAINS:
        acc = ct.mma(k_t, q_t, ct.full((BK, BQ * HP), mma_init(HEAD_CHAIN), dtype=ct.float32), use_fast_acc=fast_acc)
        return weighted_head_sum(acc, w_t, BK, BQ, HP, HEAD_CHAIN)
    R = BQ // 2
    start = ct.full((BK, R * HP), mma_init(HEAD_CHAIN), dtype=ct.float32)
    acc0 = ct.mma(k_t, ct.extract(q_t, (0, 0), shape=(q_t.shape[0], R * HP)), start, use_fast_acc=fast_acc)
    acc1 = ct.mma(k_t, ct.extract(q_t, (0, 1), shape=(q_t.shape[0], R * HP)), start, use_fast_acc=fast_acc)
    l0 = weighted_head_sum(acc0, ct.extract(w_t, (0, 0), shape=(1, R * HP)), BK, R, HP, HEAD_CHAIN)
    l1 = weighted_head_sum(acc1, ct.extract(w_t, (0, 1), shape=(1, R * HP)), BK, R, HP, HEAD_CHAIN)
    return ct.cat((l0, l1), axis=1)


def make_mqa_logits_kernel(fast_acc: bool = False, **hints):
    """Build the plain MQA-logits kernel (``fast_acc``: Hopper's FP8 fast accumulation; ``hints``: ct.kernel's)."""

    @ct.kernel(**hints)
    def mqa_logits_kernel(
        q,  # fp8 [S, H, D]
        kv,  # fp8 [S_kv, D]
        kv_scale,  # fp32 [S_kv]
        w,  # fp32 [S, H]
        ks,  # int32 [S]
        ke,  # int32 [S]
        out,  # fp32 [S, S_kv]
        BQ: ct.Constant[int],
        HP: ct.Constant[int],
        D: ct.Constant[int],
        BK: ct.Constant[int],
        HEAD_CHAIN: ct.Constant[bool],
        TWO_CHAINS: ct.Constant[bool],
        UNROLL: ct.Constant[int],
        INSIDE: ct.Constant[bool],
        SCALES_LDG: ct.Constant[bool],
        KEY_LATENCY: ct.Constant[int],
    ):
        """One CTA per ``BQ`` query rows; loops over the key tiles inside the rows' windows, ``UNROLL`` per
        iteration (each its own load, hence its own shared-memory slot: tileiras gives one load of the loop one).
        ``INSIDE``: the ``[BQ, BK]`` output tiles and the ``BK``-key tiles divide the output and the keys
        (:func:`tiles_inside`), so the output stores skip the bounds check. ``SCALES_LDG`` (only with ``INSIDE``):
        the key scales are plain unchecked loads instead of TMA loads (``MqaConfig.scales_ldg``). ``KEY_LATENCY``:
        the key load's latency hint (0: none; ``MqaConfig.key_latency``)."""
        pid = ct.num_blocks(0) - 1 - ct.bid(0)  # the last rows (longest causal windows) start first
        q_t, w_t, ks_r, ke_r, t_lo, t_hi = row_block(q, kv, w, ks, ke, pid, BQ, HP, D, BK, UNROLL)
        num_tiles = ct.cdiv(kv.shape[0], BK)
        for i in range((t_hi - t_lo) // UNROLL):
            for u in ct.static_iter(range(UNROLL)):
                # a widened range may end past the keys (window_tiles), and unchecked scale loads need the clamp
                j = tile_lib.clamp_index(t_lo + i * UNROLL + u, num_tiles, UNROLL > 1 or SCALES_LDG)
                k_t = tile_lib.load_hinted(kv, (j, 0), (BK, D), KEY_LATENCY)
                if SCALES_LDG:
                    sc = ct.load(kv_scale, (j,), shape=(BK,), check_bounds=False, allow_tma=False)
                else:
                    sc = ct.load(kv_scale, (j,), shape=(BK,), padding_mode=ZERO)
                sc = ct.reshape(sc, (BK, 1))
                logit = key_tile_logits(k_t, q_t, w_t, BK, BQ, HP, HEAD_CHAIN, TWO_CHAINS, fast_acc) * sc  # [BK, BQ]
                logit = window_mask(logit, j, ks_r, ke_r, BK)
                if INSIDE:
                    ct.store(out, (pid, j), ct.transpose(logit), allow_tma=False, check_bounds=False)
                else:
                    ct.store(out, (pid, j), ct.transpose(logit), allow_tma=False)

    return mqa_logits_kernel


@functools.cache
def plain_kernel_for(occupancy: int):
    """The plain kernel with the sm_90 ``occupancy`` hint ``MqaConfig.occupancy`` (one kernel object, hence one JIT
    cache, per value; other targets get no hint).

    Two or three CTAs per SM on sm_90: one's MMA runs while another reduces heads (one CTA issues both in turn, with
    the tensor core idle during its epilogue); the output store is not TMA so that tileiras drops the store
    warpgroup, and 256 threads x 128 registers fit twice (x 80 registers three times). Measured on an H100: two CTAs
    1.6-1.8x over one (docs/kernels.md), three 1.11-1.26x over two at D = 32 (``MqaConfig``).
    """
    return make_mqa_logits_kernel(occupancy=ct.ByTarget(sm_90=occupancy))


def row_block(q, kv, w, ks, ke, pid, BQ: int, HP: int, D: int, BK: int, UNROLL: int):
    """Query rows ``pid * BQ ..`` of the plain and decode kernels (tile code): ``(q_t, w_t, ks_r, ke_r, t_lo, t_hi)``,
    their queries ``[D, BQ * HP]`` (the MMA's B side), weights fp32 ``[1, BQ * HP]``, windows ``[ks, ke)`` int32
    ``[1, BQ]`` each, and the key tiles ``[t_lo, t_hi)`` of ``kv`` [S_kv, D] that meet them (:func:`window_tiles`)."""
    q_t = ct.transpose(ct.reshape(ct.load(q, (pid, 0, 0), shape=(BQ, HP, D), padding_mode=ZERO), (BQ * HP, D)))
    w_t = ct.reshape(ct.load(w, (pid, 0), shape=(BQ, HP), padding_mode=ZERO), (1, BQ * HP))
    ks_t = ct.load(ks, (pid,), shape=(BQ,), padding_mode=ZERO)
    ke_t = ct.load(ke, (pid,), shape=(BQ,), padding_mode=ZERO)
    t_lo, t_hi = window_tiles(ks_t, ke_t, pid * BQ, q.shape[0], kv.shape[0], BQ, BK, UNROLL)
    return q_t, w_t, ct.reshape(ks_t, (1, BQ)), ct.reshape(ke_t, (1, BQ)), t_lo, t_hi


def window_mask(logit, j, ks_r, ke_r, BK: int):
    """``logit`` ``[BK, BQ]`` of key tile ``j`` with ``-inf`` outside each row's window ``[ks_r, ke_r)`` (tile code)."""
    kidx = ct.reshape(ct.arange(BK, dtype=ct.int32) + j * BK, (BK, 1))
    return ct.where((kidx >= ks_r) & (kidx < ke_r), logit, NEG_INF)


def window_tiles(ks_t, ke_t, first_row, s_rows, s_kv, BQ: int, BK: int, UNROLL: int):
    """The key tiles ``[t_lo, t_hi)`` of ``BK`` keys that the plain kernel computes for ``BQ`` query rows (tile code):
    those that meet the union of the rows' windows, widened to a multiple of ``UNROLL`` tiles.

    ``ks_t``/``ke_t`` int32 ``[BQ]``: the ``[ks, ke)`` of rows ``first_row ..`` (rows past ``s_rows`` do not
    count); bounds clamped to ``[0, s_kv]``. The widening moves ``t_lo`` down, or where that would pass tile 0,
    ``t_hi`` up, by at most ``UNROLL - 1`` tiles past the last one: the plain kernel takes those as the last tile
    again (same values; a tile entirely outside an array is undefined behaviour for ``ct.load``/``ct.store``). The
    added tiles lie outside every window, so the plain kernel writes ``-inf`` there, as the clean kernel would. The
    plain kernel computes exactly these tiles and the clean kernel fills every other one: both call this, so the two
    never disagree.
    """
    valid = (ct.arange(BQ, dtype=ct.int32) + first_row) < s_rows
    lo = ct.maximum(ct.min(ct.where(valid, ks_t, s_kv)), 0)
    hi = ct.minimum(ct.max(ct.where(valid, ke_t, 0)), s_kv)
    t_hi = ct.maximum(ct.cdiv(hi, BK), lo // BK)
    span = ct.cdiv(t_hi - lo // BK, UNROLL) * UNROLL
    t_lo = ct.maximum(t_hi - span, 0)
    return t_lo, t_lo + span


@ct.kernel(occupancy=4)
def mqa_clean_logits_kernel(ks, ke, out, BQ: ct.Constant[int], BK: ct.Constant[int], UNROLL: ct.Constant[int]):
    """``-inf`` in every ``[BQ, BK]`` tile of ``out`` [S, S_kv] that the plain kernel (:func:`make_mqa_logits_kernel`)
    does not compute.

    One CTA per ``BQ`` query rows (the plain kernel's blocks): the key tiles before and after its
    :func:`window_tiles`. The two kernels write disjoint tiles, in either order; together they write every element,
    where a ``torch.full`` of the output would write all of it once more. The occupancy hint keeps it small: without
    it tileiras 13.4 gives blocks of 4-16 rows 256 threads at 255 registers (one CTA per SM).
    """
    pid = ct.bid(0)
    ks_t = ct.load(ks, (pid,), shape=(BQ,), padding_mode=ZERO)
    ke_t = ct.load(ke, (pid,), shape=(BQ,), padding_mode=ZERO)
    t_lo, t_hi = window_tiles(ks_t, ke_t, pid * BQ, out.shape[0], out.shape[1], BQ, BK, UNROLL)
    fill = ct.full((BQ, BK), NEG_INF, dtype=ct.float32)
    for t in range(t_lo):
        ct.store(out, (pid, t), fill, allow_tma=False)
    for t in range(t_hi, ct.cdiv(out.shape[1], BK)):
        ct.store(out, (pid, t), fill, allow_tma=False)


def paged_rows(q, w, ctx, b, rg, length, NN: int, RG: int, HP: int, D: int, CTX2D: bool):
    """Query row group ``rg`` of batch ``b`` (tile code): ``q`` fp8 [D, RG * HP] (MMA's B side), the weights
    fp32 [1, RG * HP] and each row's visible key count int32 [1, RG] (``ctx[b]`` rows, or causal from ``length``)."""
    q_t = ct.transpose(ct.reshape(ct.load(q, (b, rg, 0, 0), shape=(1, RG, HP, D), padding_mode=ZERO), (RG * HP, D)))
    w_t = ct.reshape(ct.load(w, (b, rg, 0), shape=(1, RG, HP), padding_mode=ZERO), (1, RG * HP))
    if CTX2D:
        vis = ct.load(ctx, (b, rg), shape=(1, RG), padding_mode=ZERO)
    else:
        vis = ct.reshape(length - NN + 1 + rg * RG + ct.arange(RG, dtype=ct.int32), (1, RG))
    return q_t, w_t, vis


def paged_keys(kv_keys, kv_scales, block_table, b, key0, BKV: int, CK: int, D: int):
    """Keys ``key0 .. key0 + CK`` of batch ``b`` (tile code): one indexed (TMA) load of their ``CK / BKV`` cache
    blocks, block ids clamped into the cache. Returns fp8 keys [CK, D] and fp32 scales [CK, 1]."""
    bidx = ct.arange(CK // BKV, dtype=ct.int32) + key0 // BKV
    blks = ct.gather(block_table, (b, bidx), padding_value=0)
    blks = ct.minimum(ct.maximum(blks, 0), kv_keys.shape[0] - 1)
    keys = ct.reshape(ct.load_advanced_indexing(kv_keys, (blks, ct.Slice(0, BKV), ct.Slice(0, D))), (CK, D))
    sc = ct.reshape(ct.load_advanced_indexing(kv_scales, (blks, ct.Slice(0, BKV))), (CK, 1))
    return keys, sc


def paged_logits(out, keys, sc, q_t, w_t, vis, b, rg, key0, CK: int, RG: int, HP: int, HEAD_CHAIN: bool):
    """Logits of ``CK`` keys for one query row group (tile code), ``-inf`` past each row's visible length, stored
    into ``out[b, rg * RG : (rg + 1) * RG, key0 : key0 + CK]``."""
    logit = key_tile_logits(keys, q_t, w_t, CK, RG, HP, HEAD_CHAIN, False, False) * sc  # [CK, RG]
    kidx = ct.reshape(ct.arange(CK, dtype=ct.int32) + key0, (CK, 1))
    logit = ct.where(kidx < vis, logit, NEG_INF)
    tile = ct.reshape(ct.transpose(logit), (1, RG, CK))
    ct.store(out, (b, rg, key0 // CK), tile, allow_tma=False)  # see docs/kernels.md


def batch_length(ctx, b, key_cap, NNP: int, CTX2D: bool):
    """Keys of batch ``b`` that any of its query rows sees, clamped to ``[0, key_cap]`` (tile code; ``ctx`` int32
    ``[B]`` or ``[B, next_n]``)."""
    if CTX2D:
        length = ct.max(ct.load(ctx, (b, 0), shape=(1, NNP), padding_mode=ZERO))
    else:
        length = ct.load(ctx, (b,), shape=())
    return ct.minimum(ct.maximum(length, 0), key_cap)


def paged_row_groups(out, keys, sc, q, w, ctx, b, key0, length, NN, NNP, RG, HP, D, CK, CTX2D, HEAD_CHAIN):
    """Logits of one chunk of keys (``keys``/``sc`` from :func:`paged_keys`) for every query row group of batch
    ``b``, each group's rows loaded here (tile code; the form without ``ROWS_OUTER``)."""
    for rg in range(NNP // RG):
        q_t, w_t, vis = paged_rows(q, w, ctx, b, rg, length, NN, RG, HP, D, CTX2D)
        paged_logits(out, keys, sc, q_t, w_t, vis, b, rg, key0, CK, RG, HP, HEAD_CHAIN)


def make_paged_mqa_logits_kernel(**hints):
    """Build the paged MQA-logits kernel (``hints``: ct.kernel's, e.g. ``occupancy``)."""

    @ct.kernel(**hints)
    def paged_mqa_logits_kernel(
        q,  # fp8 [B, NN, H, D]
        kv_keys,  # fp8 [num_blocks, BKV, D] view of the cache (block stride BKV * (D + 4) bytes)
        kv_scales,  # fp32 [num_blocks, BKV] view of the cache
        w,  # fp32 [B, NN, H]
        ctx,  # int32 [B] or [B, NN]
        block_table,  # int32 [B, max_blocks]
        meta,  # int32 [num_sms + 1, 2]
        out,  # fp32 [B, NN, W]
        NN: ct.Constant[int],
        NNP: ct.Constant[int],
        RG: ct.Constant[int],
        HP: ct.Constant[int],
        D: ct.Constant[int],
        BKV: ct.Constant[int],
        CK: ct.Constant[int],
        SPLIT: ct.Constant[int],
        CTX2D: ct.Constant[bool],
        HEAD_CHAIN: ct.Constant[bool],
        BATCH_MAJOR: ct.Constant[bool],
        ROWS_OUTER: ct.Constant[bool],
    ):
        """Persistent: CTAs (i, 0..P-1) share the splits from ``meta[i]`` up to ``meta[i + 1]`` (lexicographic).

        CTA (i, p) takes every P-th split of that range. ``BATCH_MAJOR`` (sm_90): it walks the range one batch
        row at a time, the row's length (and with ``ROWS_OUTER`` its query rows) once, then a loop over its chunks
        of that row with no branch inside, so tileiras's producer streams the next chunks' keys while the current
        one is reduced (with a branch per chunk, or rows loaded per split, it waited for the consumer at each;
        docs/kernels.md). Otherwise (sm_100, where that loop spills) one split per iteration, rows per chunk.
        """
        NCH = SPLIT // CK  # chunks per split
        part = ct.bid(1)
        n_parts = ct.num_blocks(1)
        n_batch = q.shape[0]
        key_cap = ct.minimum(block_table.shape[1] * BKV, out.shape[2])
        max_splits = ct.cdiv(key_cap, SPLIT)  # no overflow of split * SPLIT below
        sm = ct.bid(0)
        b = ct.maximum(ct.load(meta, (sm, 0), shape=()), 0)
        s = ct.minimum(ct.maximum(ct.load(meta, (sm, 1), shape=()), 0), max_splits)
        b_end = ct.minimum(ct.load(meta, (sm + 1, 0), shape=()), n_batch)
        s_end = ct.minimum(ct.maximum(ct.load(meta, (sm + 1, 1), shape=()), 0), max_splits)
        turn = part * 0  # which part takes the range's next split
        if BATCH_MAJOR:
            b_first = b
            while b <= ct.minimum(b_end, n_batch - 1):
                length = batch_length(ctx, b, key_cap, NNP, CTX2D)
                n_split = ct.cdiv(length, SPLIT)
                lo = ct.minimum(ct.where(b == b_first, s, 0), n_split)  # the range's splits of row b: [lo, hi)
                hi = ct.maximum(ct.where(b == b_end, ct.minimum(s_end, n_split), n_split), lo)
                first = lo + (part - turn + n_parts) % n_parts
                mine = ct.maximum(ct.cdiv(hi - first, n_parts), 0)
                if ROWS_OUTER:  # one row group (NNP == RG), loaded once per batch row
                    q_t, w_t, vis = paged_rows(q, w, ctx, b, 0, length, NN, RG, HP, D, CTX2D)
                for c in range(mine * NCH):  # past the length a chunk's logits are -inf
                    key0 = (first + (c // NCH) * n_parts) * SPLIT + (c % NCH) * CK
                    keys, sc = paged_keys(kv_keys, kv_scales, block_table, b, key0, BKV, CK, D)
                    if ROWS_OUTER:
                        paged_logits(out, keys, sc, q_t, w_t, vis, b, 0, key0, CK, RG, HP, HEAD_CHAIN)
                    else:
                        paged_row_groups(
                            out, keys, sc, q, w, ctx, b, key0, length, NN, NNP, RG, HP, D, CK, CTX2D, HEAD_CHAIN
                        )
                turn = (turn + (hi - lo)) % n_parts
                b = b + 1
        else:
            while ((b < b_end) | ((b == b_end) & (s < s_end))) & (b < n_batch):
                length = batch_length(ctx, b, key_cap, NNP, CTX2D)
                if (s * SPLIT < length) & (turn == part):
                    for g in range(NCH):
                        key0 = s * SPLIT + g * CK
                        if key0 < length:
                            keys, sc = paged_keys(kv_keys, kv_scales, block_table, b, key0, BKV, CK, D)
                            paged_row_groups(
                                out, keys, sc, q, w, ctx, b, key0, length, NN, NNP, RG, HP, D, CK, CTX2D, HEAD_CHAIN
                            )
                if s * SPLIT < length:
                    s = s + 1
                    turn = ct.where(turn + 1 == n_parts, 0, turn + 1)
                if s * SPLIT >= length:
                    b = b + 1
                    s = 0 * s

    return paged_mqa_logits_kernel


@functools.cache
def paged_kernel_for(occupancy: int):
    """The paged kernel with an ``occupancy`` hint (one kernel object, hence one JIT cache, per value).

    The hint was tuned on sm_90; other targets get at most 4 (tileiras 13.4 rejects 8 on sm_100
    for some tile shapes, see the compile gate).
    """
    return make_paged_mqa_logits_kernel(occupancy=ct.ByTarget(sm_90=occupancy, default=min(occupancy, 4)))
