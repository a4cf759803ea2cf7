"""cuTile dense GEMM kernels (device side of ``bf16_gemm_{nt,nn,tn,tt}`` and ``fp8_gemm_{nt,nn,tn,tt}``): the
persistent-tile BF16 and FP8 kernels and the split-K reduce kernel, their ``@ct.kernel`` objects and constants by
name. The host path that plans their launches is :mod:`tilegemm.ops.cutile.gemm`.

Kernels are persistent: ``grid = min(units, SMs * occupancy)`` CTAs walk the output tiles in a
grouped (swizzled) order, ``GROUP_M`` row-tiles at a time, so consecutive tiles share B in L2.

* BF16: one kernel for every layout; each operand is loaded in the orientation the MMA needs
  with ``ct.load(..., order=...)`` (TMA handles both K-major and MN-major 16-bit data).
* FP8: Hopper's FP8 tensor-core instructions take K-major operands only, so the host copies
  NN/TN/TT operands to NT form (as DeepGEMM does). Per 128-wide K block the kernel computes
  the raw product ``P = A_kb @ B_kb.T`` into a fresh accumulator and promotes it to fp32 as
  ``acc += P * sa[:, kb] * sb[kb]``. tileiras waits for every outstanding MMA before the
  promotion, so the overlap of one tile's promotion with tensor-core work comes from a second
  CTA on the SM (occupancy 2, 64x128 tiles) or, for small M, from two 128-column chains (NH=2).
* Grids smaller than half the machine are split along K; fp32 partials go to a workspace and a
  reduce kernel sums them in a fixed order (deterministic) and applies the epilogue.

The epilogue computes ``alpha * acc + beta * C`` in fp32 and rounds once to ``D.dtype`` (for FP8
with a ``c`` it runs in the reduce kernel). Config choice lives in
:mod:`tilegemm.heuristics.cutile`; the host path in :mod:`tilegemm.ops.cutile.gemm`.
Measurements and SASS findings: ``docs/kernels.md``.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.tile as ct

from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.cutile import launch, tile_lib

__all__ = ["get_kernel", "get_reduce_kernel", "kernel_constants", "REDUCE_ROWS", "reduce_rows", "reduce_constants"]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO

# ------------------------------------------------------------------------------- kernels


def _split_unit(v, tiles, splits, num_k):
    """Split-K unit ``v`` -> (output tile, first K block, end K block): K range ``v // tiles`` of tile
    ``v % tiles``, each tile cut into ``splits`` ranges."""
    per = ct.cdiv(num_k, splits)
    k_lo = (v // tiles) * per
    return v % tiles, k_lo, ct.minimum(num_k, k_lo + per)


def _unit(u, tiles, splits, num_m, num_n, num_k, GROUP_M: ConstInt, SPLITK: ConstBool):
    """Work unit ``u`` -> (row tile, column tile, first K block, end K block): output tile ``u`` whole, or with
    ``SPLITK`` split-K unit ``u`` (:func:`_split_unit`); the tiles in the grouped order of ``GROUP_M`` row tiles."""
    tile, k_lo, k_hi = u, 0, num_k
    if SPLITK:
        tile, k_lo, k_hi = _split_unit(u, tiles, splits, num_k)
    pm, pn = tile_lib.tile_coords(tile, num_m, num_n, GROUP_M)
    return pm, pn, k_lo, k_hi


def _store_split(W, acc, v, tiles, h: ConstInt):
    """Column part ``h`` of split-K unit ``v``'s fp32 partial sum to ``W[split, tile]``."""
    ct.store(W, (v // tiles, v % tiles, 0, h), ct.reshape(acc, (1, 1, acc.shape[0], acc.shape[1])))


def _bf16_gemm_body(
    A,
    B,
    D,
    C,
    W,
    alpha: float,
    beta: float,
    K: int,
    splits: int,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    GROUP_M: ConstInt,
    A_KMAJOR: ConstBool,
    B_KMAJOR: ConstBool,
    HAS_C: ConstBool,
    SPLITK: ConstBool,
):
    """D[M,N] = alpha * A @ B.T + beta * C. A is [M,K] (A_KMAJOR) or [K,M]; B is [N,K] (B_KMAJOR) or [K,N].

    Work units: the output tiles, or with SPLITK every tile cut into ``splits`` K ranges whose fp32
    partial sums go to ``W[split, tile]`` (summed in order by the reduce kernel, so results are
    deterministic). A kernel stores either to D or to W, never both: a split-K kernel that also
    kept whole tiles (a run-time choice of store per unit) had tileiras 13.4 wait for every HGMMA
    (docs/notes/kernels.md, "MMA groups and the walk loop").
    """
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    num_k = ct.cdiv(K, TK)
    tiles = num_m * num_n
    for u in range(ct.bid(0), tiles * splits if SPLITK else tiles, ct.num_blocks(0)):
        pm, pn, k_lo, k_hi = _unit(u, tiles, splits, num_m, num_n, num_k, GROUP_M, SPLITK)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for kb in range(k_lo, k_hi):
            a = tile_lib.load_mk(A, pm, kb, TM, TK, A_KMAJOR)
            b = tile_lib.load_kn(B, kb, pn, TK, TN, B_KMAJOR)
            acc = ct.mma(a, b, acc)
        if SPLITK:
            _store_split(W, acc, u, tiles, 0)
        else:
            _epilogue(D, C, acc, pm, pn, alpha, beta, HAS_C)


def _epilogue(D, C, acc, pm, pn, alpha, beta, HAS_C: ConstBool):
    """D tile = alpha * acc + beta * C tile, rounded once to D's dtype."""
    out = acc * alpha
    if HAS_C:
        out = out + ct.astype(ct.load(C, (pm, pn), acc.shape, padding_mode=_ZERO), ct.float32) * beta
    ct.store(D, (pm, pn), ct.astype(out, D.dtype))


def _fp8_gemm_body(
    A,
    B,
    SA,
    SB,
    D,
    C,
    W,
    alpha: float,
    beta: float,
    K: int,
    splits: int,
    TM: ConstInt,
    TN: ConstInt,
    NH: ConstInt,
    GROUP_M: ConstInt,
    SB_ROWS: ConstBool,
    FAST_ACC: ConstBool,
    SCALE_TMA: ConstBool,
    SPLITK: ConstBool,
):
    """FP8 block-scaled D = alpha * sum_kb sa*sb*(A_kb @ B_kb.T) + beta * C, K step 128.

    A fp8 [M,K] and B fp8 [N,K] (K-major); SA fp32 [KB, M] (MN-major); SB fp32 [NB, KB]
    (128x128 blocks: the N tile's parts are 128 wide) or, with SB_ROWS, [KB, N] (one scale per
    row of B). The TM x TN tile is computed as NH (1 or 2) column parts of TN / NH, each with
    its own MMA + promotion chain: per K block the raw product goes to a fresh accumulator
    and is promoted into the fp32 sum with its scales. Work units and split-K as in the BF16
    kernel. ``beta * C`` is never applied here: with a C the host routes every tile through
    the workspace and the reduce kernel's epilogue (a C tile read next to the two promotion
    accumulators made tileiras spill).
    """
    HN = TN // NH
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    num_k = ct.cdiv(K, 128)
    tiles = num_m * num_n
    for u in range(ct.bid(0), tiles * splits if SPLITK else tiles, ct.num_blocks(0)):
        pm, pn, k_lo, k_hi = _unit(u, tiles, splits, num_m, num_n, num_k, GROUP_M, SPLITK)
        acc0 = ct.zeros((TM, HN), dtype=ct.float32)
        acc1 = ct.zeros((TM, HN), dtype=ct.float32)
        for kb in range(k_lo, k_hi):
            a = ct.load(A, (pm, kb), (TM, 128), padding_mode=_ZERO)
            sa = ct.load(SA, (pm, kb), (TM, 1), order=(1, 0), padding_mode=_ZERO, allow_tma=SCALE_TMA)
            acc0 = _fp8_part(a, sa, B, SB, acc0, kb, pn * NH, HN, SB_ROWS, FAST_ACC, SCALE_TMA)
            if NH == 2:
                # The second part of the last N tile may lie wholly past N: never load it
                # (a tile entirely outside an array is undefined behaviour for ct.load).
                if (pn * NH + 1) * HN < D.shape[1]:
                    acc1 = _fp8_part(a, sa, B, SB, acc1, kb, pn * NH + 1, HN, SB_ROWS, FAST_ACC, SCALE_TMA)
        _fp8_store(D, C, W, acc0, u, tiles, pm, pn * NH, 0, alpha, beta, SPLITK)
        if NH == 2:
            if (pn * NH + 1) * HN < D.shape[1]:
                _fp8_store(D, C, W, acc1, u, tiles, pm, pn * NH + 1, 1, alpha, beta, SPLITK)


def _fp8_store(D, C, W, acc, u, tiles, pm, jn, h: ConstInt, alpha, beta, SPLITK: ConstBool):
    """Column part ``h`` of FP8 unit ``u``: its partial sum to the workspace (SPLITK), else through the epilogue."""
    if SPLITK:
        # Always true (pm < cdiv(M, TM)). Without the branch tileiras 13.4 spilled 88 words in the 64x128 FP8
        # kernel (occupancy 2), with it none; the SASS is otherwise the same. The BF16 kernel stores without it:
        # with the branch its split-K HGMMAs went back to groups of one (so the two kernels do not share this).
        if pm * acc.shape[0] < D.shape[0]:
            _store_split(W, acc, u, tiles, h)
    else:
        _epilogue(D, C, acc, pm, jn, alpha, beta, False)


def _fp8_part(a, sa, B, SB, acc, kb, jn, HN: ConstInt, SB_ROWS: ConstBool, FAST_ACC: ConstBool, SCALE_TMA: ConstBool):
    """acc + (a @ B[jn-th HN-column block, kb].T) * sa * sb: one K block of one column part."""
    b = ct.load(B, (kb, jn), (128, HN), order=(1, 0), padding_mode=_ZERO)
    if SB_ROWS:
        sb = ct.load(SB, (kb, jn), (1, HN), padding_mode=_ZERO, allow_tma=SCALE_TMA)
    else:
        # One word: never through TMA (too small, it becomes an LDGSTS that every thread of a warp issues to the
        # same shared-memory word, which racecheck reports as write-write hazards; docs/kernels.md, racecheck).
        sb = ct.load(SB, (jn, kb), (1, 1), padding_mode=_ZERO, allow_tma=False)
    p = ct.mma(a, b, ct.zeros(acc.shape, dtype=ct.float32), use_fast_acc=FAST_ACC)
    return acc + p * (sa * sb)


def _splitk_reduce_body(
    W,
    D,
    C,
    alpha: float,
    beta: float,
    splits: int,
    TM: ConstInt,
    TN: ConstInt,
    GROUP_M: ConstInt,
    HAS_C: ConstBool,
    RM: ConstInt,
):
    """Sum split-K partials: CTA ``bid`` takes RM rows of tile ``bid // (TM // RM)``.

    It adds the ``splits`` partial (RM, TN) tiles in split order (deterministic), then applies the epilogue
    (alpha, beta * C, rounding) to those rows.
    """
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    t = ct.bid(0) // (TM // RM)
    r = ct.bid(0) % (TM // RM)
    pm, pn = tile_lib.tile_coords(t, num_m, num_n, GROUP_M)
    row = pm * (TM // RM) + r
    if row * RM < D.shape[0]:  # rows wholly past M: nothing to write (and a store there is undefined)
        acc = ct.zeros((RM, TN), dtype=ct.float32)
        for s in range(splits):
            acc = acc + ct.reshape(ct.load(W, (s, t, r, 0), (1, 1, RM, TN), padding_mode=_ZERO), (RM, TN))
        _epilogue(D, C, acc, row, pn, alpha, beta, HAS_C)


@functools.cache
def get_kernel(cfg: heuristics.DenseConfig) -> Any:
    """The ``@ct.kernel`` for ``cfg`` (its compiler hints applied), built once per config."""
    body = _bf16_gemm_body if cfg.dtype == "bf16" else _fp8_gemm_body
    return ct.kernel(body, **cfg.compiler_options())


@functools.cache
def get_reduce_kernel() -> Any:
    """The split-K reduce kernel (one CTA per :func:`reduce_rows` rows of a tile)."""
    return ct.kernel(_splitk_reduce_body)


def kernel_constants(
    cfg: heuristics.DenseConfig,
    *,
    a_kmajor: bool = True,
    b_kmajor: bool = True,
    has_c: bool = False,
    sb_rows: bool = False,
    splitk: bool = False,
) -> list[Any]:
    """The ``ct.Constant`` arguments of ``cfg``'s kernel, in parameter order (``has_c``: BF16 only)."""
    if cfg.dtype == "bf16":
        return launch.trailing(
            _bf16_gemm_body, TM=cfg.bm, TN=cfg.bn, TK=cfg.bk, GROUP_M=cfg.gm, A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor,
            HAS_C=has_c, SPLITK=splitk,
        )  # fmt: skip
    return launch.trailing(
        _fp8_gemm_body, TM=cfg.bm, TN=cfg.bn, NH=cfg.nh, GROUP_M=cfg.gm, SB_ROWS=sb_rows, FAST_ACC=cfg.fast_acc,
        SCALE_TMA=cfg.scale_tma, SPLITK=splitk,
    )  # fmt: skip


#: Rows per split-K reduce CTA: a (32, TN) fp32 sum, four CTAs per 128-row tile.
REDUCE_ROWS = 32


def reduce_rows(cfg: heuristics.DenseConfig) -> int:
    """Rows per reduce CTA for ``cfg``'s tiles."""
    return min(cfg.bm, REDUCE_ROWS)


def reduce_constants(cfg: heuristics.DenseConfig, *, has_c: bool = False) -> list[Any]:
    """The ``ct.Constant`` arguments of the split-K reduce kernel for ``cfg``."""
    return launch.trailing(_splitk_reduce_body, TM=cfg.bm, TN=cfg.bn, GROUP_M=cfg.gm, HAS_C=has_c, RM=reduce_rows(cfg))
