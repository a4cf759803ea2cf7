"""The decode kernels of the MQA-logits ops, device side: the plain ops' (``fp8_mqa_logits``, ``bf16_mqa_logits``,
``mqa_logits_batched``) and the paged op's without a schedule (``fp8_paged_mqa_logits`` with ``schedule_meta=None``).

A decode step scores one or a few query rows against the whole key cache. The plain kernel
(:mod:`tilegemm.ops.cutile.mqa_kernels`) gives each block of ``BQ`` query rows one CTA, which then walks every key
tile alone: one CTA of the GPU's SMs works. This kernel splits the keys instead, as the paged kernel splits its
schedule rows: the grid is ``(row blocks, PARTS)``, and CTA ``(r, p)`` takes key tiles ``t_lo + p``,
``t_lo + p + PARTS``, ... of its rows' window, so consecutive CTAs read consecutive tiles of the cache, in place
(``kv`` is the caller's key tensor; no copy, no quantization). Each key tile is the plain kernel's math
(:func:`~tilegemm.ops.cutile.mqa_kernels.key_tile_logits`, keys on the MMA's M side, (row, head) pairs on N) on FP8
or BF16 operands (the dtype of ``q`` and ``kv``), and its ``[BQ, BK]`` logits tile is stored where the plain kernel
would store it: the tiles it computes are exactly :func:`~tilegemm.ops.cutile.mqa_kernels.window_tiles` with one
tile per iteration, so ``mqa_clean_logits_kernel`` fills the rest as it does for the plain kernel.

The paged decode kernel splits each sequence's visible keys the same way over ``PARTS`` CTAs (grid
``(row groups, PARTS, B)``), each chunk of ``CK`` keys the scheduled paged kernel's math
(:func:`~tilegemm.ops.cutile.mqa_kernels.paged_keys` / ``paged_logits``, so the same bits), with no schedule to read
and none to compute first: what a decode step of a few sequences wants (``heuristics.cutile.paged_decode_config``).

Whatever the index values, no tile is read or written out of bounds: window bounds are clamped by ``window_tiles``
and every tile index a CTA takes lies in ``[t_lo, t_hi)``, inside the keys; the paged decode kernel clamps lengths
to the table and the output, and block ids into the cache, as the scheduled kernel does.
"""

from __future__ import annotations

import functools

import cuda.tile as ct

from tilegemm.ops.cutile.mqa_kernels import (
    ZERO,
    batch_length,
    key_tile_logits,
    paged_keys,
    paged_logits,
    paged_rows,
    row_block,
    window_mask,
    window_tiles,
)


def decode_tile_count(t_lo, t_hi, part, n_parts):
    """How many of the key tiles ``[t_lo, t_hi)`` CTA ``part`` of ``n_parts`` takes (every ``n_parts``-th from
    ``t_lo + part``; tile code, int32 scalars)."""
    return ct.maximum((t_hi - t_lo - part + n_parts - 1) // n_parts, 0)


def make_mqa_decode_kernel(**hints):
    """Build the decode kernel (``hints``: ct.kernel's, e.g. ``occupancy``)."""

    @ct.kernel(**hints)
    def mqa_decode_kernel(
        q,  # fp8 or bf16 [S, H, D]
        kv,  # fp8 or bf16 [S_kv, D] (the key cache, read in place)
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
    ):
        """CTA ``(r, p)`` of grid ``(ceil(S / BQ), PARTS)``: query rows ``r * BQ ..`` against every ``PARTS``-th key
        tile of their window, from tile ``t_lo + p``; ``-inf`` outside each row's ``[ks, ke)`` inside a tile."""
        pid = ct.bid(0)
        part = ct.bid(1)
        n_parts = ct.num_blocks(1)
        q_t, w_t, ks_r, ke_r, t_lo, t_hi = row_block(q, kv, w, ks, ke, pid, BQ, HP, D, BK, 1)
        for i in range(decode_tile_count(t_lo, t_hi, part, n_parts)):
            j = t_lo + part + i * n_parts
            k_t = ct.load(kv, (j, 0), shape=(BK, D), padding_mode=ZERO)
            sc = ct.reshape(ct.load(kv_scale, (j,), shape=(BK,), padding_mode=ZERO), (BK, 1))
            logit = key_tile_logits(k_t, q_t, w_t, BK, BQ, HP, HEAD_CHAIN, False, False) * sc  # [BK, BQ]
            logit = window_mask(logit, j, ks_r, ke_r, BK)
            ct.store(out, (pid, j), ct.transpose(logit), allow_tma=False)

    return mqa_decode_kernel


def make_mqa_decode_batched_kernel(**hints):
    """Build the batched decode kernel (``hints``: ct.kernel's): :func:`make_mqa_decode_kernel`'s math over ``B``
    sequences at once, each with its own keys, in one launch."""

    @ct.kernel(**hints)
    def mqa_decode_batched_kernel(
        q,  # fp8 or bf16 [B, S, H, D]
        kv,  # fp8 or bf16 [B, T, D] (the key cache, read in place)
        kv_scale,  # fp32 [B, T]
        w,  # fp32 [B, S, H]
        ks,  # int32 [B, S]
        ke,  # int32 [B, S]
        out,  # fp32 [B, S, T]
        BQ: ct.Constant[int],
        HP: ct.Constant[int],
        D: ct.Constant[int],
        BK: ct.Constant[int],
        HEAD_CHAIN: ct.Constant[bool],
    ):
        """CTA ``(r, p, b)`` of grid ``(ceil(S / BQ), PARTS, B)``: sequence ``b``'s query rows ``r * BQ ..`` against
        every ``PARTS``-th key tile of their windows in that sequence's keys, from tile ``t_lo + p``."""
        pid = ct.bid(0)
        part = ct.bid(1)
        b = ct.bid(2)
        n_parts = ct.num_blocks(1)
        q_rows = ct.reshape(ct.load(q, (b, pid, 0, 0), shape=(1, BQ, HP, D), padding_mode=ZERO), (BQ * HP, D))
        q_t = ct.transpose(q_rows)
        w_t = ct.reshape(ct.load(w, (b, pid, 0), shape=(1, BQ, HP), padding_mode=ZERO), (1, BQ * HP))
        ks_t = ct.reshape(ct.load(ks, (b, pid), shape=(1, BQ), padding_mode=ZERO), (BQ,))
        ke_t = ct.reshape(ct.load(ke, (b, pid), shape=(1, BQ), padding_mode=ZERO), (BQ,))
        t_lo, t_hi = window_tiles(ks_t, ke_t, pid * BQ, q.shape[1], kv.shape[1], BQ, BK, 1)
        ks_r, ke_r = ct.reshape(ks_t, (1, BQ)), ct.reshape(ke_t, (1, BQ))
        for i in range(decode_tile_count(t_lo, t_hi, part, n_parts)):
            j = t_lo + part + i * n_parts
            k_t = ct.reshape(ct.load(kv, (b, j, 0), shape=(1, BK, D), padding_mode=ZERO), (BK, D))
            sc = ct.reshape(ct.load(kv_scale, (b, j), shape=(1, BK), padding_mode=ZERO), (BK, 1))
            logit = key_tile_logits(k_t, q_t, w_t, BK, BQ, HP, HEAD_CHAIN, False, False) * sc  # [BK, BQ]
            logit = window_mask(logit, j, ks_r, ke_r, BK)
            ct.store(out, (b, pid, j), ct.reshape(ct.transpose(logit), (1, BQ, BK)), allow_tma=False)

    return mqa_decode_batched_kernel


def make_paged_decode_kernel(**hints):
    """Build the paged decode kernel (``hints``: ct.kernel's): ``fp8_paged_mqa_logits`` without a schedule, each
    sequence's keys split over ``PARTS`` CTAs as the decode kernel splits them."""

    @ct.kernel(**hints)
    def paged_decode_kernel(
        q,  # fp8 [B, NN, H, D]
        kv_keys,  # fp8 [num_blocks, BKV, D] view of the cache (block stride BKV * (D + 4) bytes)
        kv_scales,  # fp32 [num_blocks, BKV] view of the cache
        w,  # fp32 [B, NN, H]
        ctx,  # int32 [B] or [B, NN]
        block_table,  # int32 [B, max_blocks]
        out,  # fp32 [B, NN, W]
        NN: ct.Constant[int],
        NNP: ct.Constant[int],
        RG: ct.Constant[int],
        HP: ct.Constant[int],
        D: ct.Constant[int],
        BKV: ct.Constant[int],
        CK: ct.Constant[int],
        CTX2D: ct.Constant[bool],
        HEAD_CHAIN: ct.Constant[bool],
        ROWS_OUTER: ct.Constant[bool],
    ):
        """CTA ``(g, p, b)`` of grid ``(NNP / RG, PARTS, B)``: row group ``g`` of sequence ``b`` against every
        ``PARTS``-th chunk of ``CK`` keys of the sequence's visible keys, from chunk ``p``; ``-inf`` past each row's
        visible length inside a chunk, chunks past the sequence's length untouched. The rows are loaded once
        (``ROWS_OUTER``) or per chunk (where holding them through the loop spills: ``PagedMqaConfig.rows_outer``)."""
        rg = ct.bid(0)
        part = ct.bid(1)
        b = ct.bid(2)
        n_parts = ct.num_blocks(1)
        key_cap = ct.minimum(block_table.shape[1] * BKV, out.shape[2])
        length = batch_length(ctx, b, key_cap, NNP, CTX2D)
        chunks = decode_tile_count(0, ct.cdiv(length, CK), part, n_parts)
        if ROWS_OUTER:
            q_t, w_t, vis = paged_rows(q, w, ctx, b, rg, length, NN, RG, HP, D, CTX2D)
            for i in range(chunks):
                key0 = (part + i * n_parts) * CK
                keys, sc = paged_keys(kv_keys, kv_scales, block_table, b, key0, BKV, CK, D)
                paged_logits(out, keys, sc, q_t, w_t, vis, b, rg, key0, CK, RG, HP, HEAD_CHAIN)
        else:
            for i in range(chunks):
                key0 = (part + i * n_parts) * CK
                keys, sc = paged_keys(kv_keys, kv_scales, block_table, b, key0, BKV, CK, D)
                q_c, w_c, vis_c = paged_rows(q, w, ctx, b, rg, length, NN, RG, HP, D, CTX2D)
                paged_logits(out, keys, sc, q_c, w_c, vis_c, b, rg, key0, CK, RG, HP, HEAD_CHAIN)

    return paged_decode_kernel


@functools.cache
def paged_decode_kernel_for(occupancy: int):
    """The paged decode kernel with the sm_90 ``occupancy`` hint (``PagedMqaConfig.occupancy``; other targets get at
    most 4, as :func:`~tilegemm.ops.cutile.mqa_kernels.paged_kernel_for`)."""
    return make_paged_decode_kernel(occupancy=ct.ByTarget(sm_90=occupancy, default=min(occupancy, 4)))


@functools.cache
def decode_batched_kernel_for(occupancy: int):
    """The batched decode kernel with the sm_90 ``occupancy`` hint (as :func:`decode_kernel_for`)."""
    return make_mqa_decode_batched_kernel(occupancy=ct.ByTarget(sm_90=occupancy))


@functools.cache
def decode_kernel_for(occupancy: int):
    """The decode kernel with the sm_90 ``occupancy`` hint ``MqaConfig.occupancy`` (one kernel object, hence one JIT
    cache, per value; other targets get no hint). The output store is not TMA, as in the plain kernel, so that
    tileiras builds no store warpgroup and two CTAs fit an SM."""
    return make_mqa_decode_kernel(occupancy=ct.ByTarget(sm_90=occupancy))


def decode_constants(conf, d: int) -> tuple:
    """The decode kernel's constant arguments from its ``MqaConfig`` (``path == "decode"``), in its parameter order
    (``BQ`` .. ``HEAD_CHAIN``); the compile gate builds its signatures from it."""
    return (conf.bq, conf.hp, d, conf.bk, conf.head_chain)
