"""Device code the gluon design probes (``multicast_kernel.py``, ``wg_split_kernel.py``) share: one wave's product
tile of a K block, waited (:func:`wave_product`, the loops without the pipeline), and the software-pipelined K loop
of one wave of a tile, as ``tilegemm.ops.gluon.fp8_gemm_ws_kernel`` runs it (each step issues the next K block's
wgmma into the other product tile, then waits for its own with one in flight and promotes), with the slot release
each kernel passes in (``RELEASE(empty, slot, RELEASE_ARG)``, a gluon function)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from tilegemm.ops.gluon.fp8_gemm_ws_kernel import _ov_a_scales, _ov_issue, _ov_promote, _ov_wait, _pin


@gluon.jit
def wave_product(a, b, acc0, acc1, spare, W: gl.constexpr, WAVES: gl.constexpr, chain):
    """Wave ``W``'s product tile of one K block: the wgmma of its A tile ``a`` and B's slot ``b`` ([N, K], read
    transposed), waited. With two waves it takes the other wave's accumulator as its input tile under ``use_acc=chain``
    (False at run time, not at compile time), so ptxas cannot sink the previous promotion below it and the two waves'
    tiles fit without spills (as in ``fp8_gemm_ws_kernel``); with one, the ``spare`` product tile."""
    if WAVES == 2:
        if W == 0:
            tie = acc1
        else:
            tie = acc0
        t = warpgroup_mma(a, b.permute((1, 0)), tie, use_acc=chain, is_async=True)
    else:
        t = warpgroup_mma(a, b.permute((1, 0)), spare, use_acc=False, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(t,))


@gluon.jit
def ov_run(ring, scales, acc, qa, qb, kb, it, BLOCKS: gl.constexpr, ROW: gl.constexpr, rows: gl.constexpr,
           RELEASE: gl.constexpr, RELEASE_ARG: gl.constexpr, RELEASE_FIRST: gl.constexpr):  # fmt: skip
    """``BLOCKS`` K blocks from ``kb`` (ring slot ``it``) of the wave of A's rows from ``ROW`` as one run; even steps
    use the product tile ``qa``, odd ones ``qb``. Each slot is released once its wgmma is complete: before the
    promotion (``RELEASE_FIRST``) or after it. ``ring``: ``(a_ring, b_ring, sa_rows, ready, empty)``; ``scales``: B's
    ``(sb_ptr, sb_stride, column block, column blocks)``; ``rows``: the accumulator's row layout. Returns the
    accumulator and the product tiles."""
    a_ring, b_ring, sa_rows, ready, empty = ring
    sb_ptr, sb_stride, nb, num_nb = scales
    STAGES: gl.constexpr = b_ring.shape[0]
    ta, _ = _ov_issue(a_ring, b_ring, b_ring, ready, it, ROW, qa, qa, True)
    for i in gl.static_range(BLOCKS):
        blk = it + i
        sb = gl.load(sb_ptr + nb * sb_stride + kb + i, mask=nb < num_nb, other=0.0)
        if i + 1 < BLOCKS:
            if i % 2 == 0:
                tb, _ = _ov_issue(a_ring, b_ring, b_ring, ready, blk + 1, ROW, qb, qb, True)
                qa, _ = _ov_wait(ta, ta, 1, False)
            else:
                ta, _ = _ov_issue(a_ring, b_ring, b_ring, ready, blk + 1, ROW, qa, qa, True)
                qb, _ = _ov_wait(tb, tb, 1, False)
        else:
            if i % 2 == 0:
                qa, _ = _ov_wait(ta, ta, 0, False)
            else:
                qb, _ = _ov_wait(tb, tb, 0, False)
        if RELEASE_FIRST:
            RELEASE(empty, blk % STAGES, RELEASE_ARG)
        if i % 2 == 0:
            p = qa
        else:
            p = qb
        sa = _ov_a_scales(sa_rows, blk, ROW, acc.shape[0], rows)
        acc, _ = _ov_promote(acc, acc, p, p, sa, sb, sb, sa_rows, blk, rows, False, False)
        if not RELEASE_FIRST:
            RELEASE(empty, blk % STAGES, RELEASE_ARG)
    return acc, qa, qb


@gluon.jit
def ov_tile(ring, scales, acc, qa, it, num_k, RUN: gl.constexpr, ROW: gl.constexpr, rows: gl.constexpr,
            RELEASE: gl.constexpr, RELEASE_ARG: gl.constexpr, RELEASE_FIRST: gl.constexpr):  # fmt: skip
    """A wave's K loop (``num_k`` blocks from ring slot ``it``) as runs of ``RUN`` blocks (:func:`ov_run`), then the
    rest as runs of the powers of two below ``RUN`` (as ``fp8_gemm_ws_kernel._ov_k_loop``). Returns the accumulator,
    a spare product tile and the ring counter past the tile."""
    qb = _pin(gl.zeros_like(qa))
    for kb in range(0, num_k - (RUN - 1), RUN):
        acc, qa, qb = ov_run(ring, scales, acc, qa, qb, kb, it, RUN, ROW, rows, RELEASE, RELEASE_ARG, RELEASE_FIRST)
        it += RUN
    kb = num_k - num_k % RUN
    for j in gl.static_range(1, 4):
        if RUN >> j > 0:
            if (num_k % RUN) & (RUN >> j):
                acc, qa, qb = ov_run(
                    ring, scales, acc, qa, qb, kb, it, RUN >> j, ROW, rows, RELEASE, RELEASE_ARG, RELEASE_FIRST
                )
                it += RUN >> j
                kb += RUN >> j
    return acc, qa, it
