"""cuTile decode-size dense GEMMs (few rows): swap-AB tiles, split-K reduced in the same launch.

For ``D[M, N] = alpha * A[M, K] @ B[N, K].T + beta * C`` with small ``M`` the cost is reading the
weight ``B`` once. The kernels compute ``D.T = B @ A.T`` tile by tile: a ``[BW, BK]`` weight tile
(TMA) is the MMA's first operand (its 64/128 rows fill the tensor core's M side) and the
``[BM, BK]`` activation tile, loaded transposed as ``[BK, BM]``, the second (its few rows become
the MMA's N side, 8..128 wide). The ``[BW, BM]`` fp32 accumulator is stored transposed.

Work units: one CTA per (weight tile ``pn``, K split ``s``, activation tile ``pm``), ``pm``
fastest so the CTAs that share a weight chunk run together and read it from L2. With ``SPLITK``
each unit writes its fp32 partial to ``W[s * tiles + t]`` and increments the tile's counter
(acq_rel, device scope); the unit that sees ``splits - 1`` is the last of its tile: it sums the
partials in split order ``0, 1, ..`` (the same order whoever is last: bitwise-reproducible),
applies the epilogue, and puts the counter back to zero, so the next launch (or a CUDA-graph
replay) finds the counters as it expects. One launch, no reduce kernel.

FP8 (DeepGEMM's block scaling): per 128-wide K block ``kb`` the raw product of the block is
promoted as ``acc += P * sb * sa`` with ``sa[m, kb]`` (1x128 activation scales) and ``sb`` the
weight's 128x128 block scale (one per tile and block, ``BW <= 128``) or its per-row 1x128 scale.
Scales are read in place whatever their strides (row-major [rows, KB] or MN-major), bounds-checked unless every
scale tile lies inside them (``INSIDE``: :func:`swap_scales_inside`, :func:`narrow_scales_inside`, the K index
through :func:`tile_lib.clamp_index`).
``KU`` K blocks are loaded per step (one TMA load of ``[BW, 128 * KU]``).

Pipeline depth: ``LAT`` (``DecodePlan.latency``), when above 0, is the ``latency`` hint of the weight and
activation loads. tileiras sizes its load stages from it: the lean FP8 kernel with a 64-row activation tile gets
one 32 KiB stage without a hint and two with ``LAT = 2`` (``docs/decode.md``).

Narrow tiles (no swap): from 17 rows on, :func:`_narrow_bf16_gemm_body` / :func:`_narrow_fp8_gemm_body` compute
``D`` itself in ``[64, BN]`` tiles, ``BN`` 16..128 weight rows (the MMA's N side) against 64 activation rows (its M
side), the whole of K per CTA, no split-K and no ``c``. A tile of 16-32 weight rows leaves enough tiles to fill the
SMs where a 64-row weight tile needs split-K, and each CTA is small (64 registers at occupancy 4) with a deep load
pipeline; at M >= 128 the 128-row weight tiles halve the activation re-reads, and BF16 above 128 rows takes
``[128, 128]`` tiles (one warpgroup holding the 128x128 accumulator, one CTA per SM). BF16 tiles of 32 weight rows
that fit one wave run one CTA per SM too, for a deeper load pipeline (~9 stages). A tile's K walk may start at a
rotated block and wraps with a compare (:func:`_wrap`), never a ``%``. (H100 sweeps: ``docs/decode.md``.)

Config choice: :func:`tilegemm.heuristics.cutile.decode_plan` (swap-AB) and
:func:`tilegemm.heuristics.cutile.narrow_config` (narrow); host path: ``gemm.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.tile as ct

from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.common import cdiv
from tilegemm.ops.cutile import launch, tile_lib

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO
_ACQ_REL = ct.MemoryOrder.ACQ_REL
_RELAXED = ct.MemoryOrder.RELAXED
_DEVICE = ct.MemoryScope.DEVICE


def _unit(num_m, splits, per, num_steps, SPLITK: ConstBool):
    """This CTA's (activation tile, weight tile, split, first step, end step)."""
    u = ct.bid(0)
    pm = u % num_m
    rest = u // num_m
    s = 0
    pn = rest
    k_lo = 0
    k_hi = num_steps
    if SPLITK:
        s = rest % splits
        pn = rest // splits
        k_lo = s * per
        k_hi = ct.minimum(num_steps, k_lo + per)
    return pm, pn, s, k_lo, k_hi


def _epilogue_t(D, C, acc, pm, pn, alpha, beta, HAS_C: ConstBool):
    """D[pm-th BM rows, pn-th BW columns] = (alpha * acc + beta * C).T for a [BW, BM] accumulator."""
    out = acc * alpha
    if HAS_C:
        c = ct.load(C, (pn, pm), acc.shape, order=(1, 0), padding_mode=_ZERO)
        out = out + ct.astype(c, ct.float32) * beta
    ct.store(D, (pn, pm), ct.astype(out, D.dtype), order=(1, 0))


def _finish_t(D, C, W, CNT, acc, pm, pn, s, num_m, splits, alpha, beta, HAS_C: ConstBool, SPLITK: ConstBool):
    """Epilogue of a whole tile, or (SPLITK) publish the partial and let the tile's last unit reduce."""
    if SPLITK:
        t = pn * num_m + pm
        tiles = ct.num_blocks(0) // splits
        shape3 = (1, acc.shape[0], acc.shape[1])
        # Plain (non-TMA) stores and loads: the same threads that release / acquire the counter move the data.
        ct.store(W, (s * tiles + t, 0, 0), ct.reshape(acc, shape3), check_bounds=False, allow_tma=False)
        done = ct.atomic_add(CNT, t, 1, memory_order=_ACQ_REL, memory_scope=_DEVICE)
        if done == splits - 1:
            total = ct.zeros(acc.shape, dtype=ct.float32)
            for j in range(splits):
                part = ct.load(W, (j * tiles + t, 0, 0), shape3, check_bounds=False, allow_tma=False)
                total = total + ct.reshape(part, acc.shape)
            ct.atomic_xchg(CNT, t, 0, memory_order=_RELAXED, memory_scope=_DEVICE)
            _epilogue_t(D, C, total, pm, pn, alpha, beta, HAS_C)
    else:
        _epilogue_t(D, C, acc, pm, pn, alpha, beta, HAS_C)


def _decode_bf16_gemm_body(
    B,
    A,
    D,
    C,
    W,
    CNT,
    alpha: float,
    beta: float,
    K: int,
    splits: int,
    per: int,
    BW: ConstInt,
    BM: ConstInt,
    BK: ConstInt,
    A_KMAJOR: ConstBool,
    B_KMAJOR: ConstBool,
    LAT: ConstInt,
    HAS_C: ConstBool,
    SPLITK: ConstBool,
):
    """BF16 ``D = alpha * A @ B.T + beta * C`` as ``D.T`` tiles ``[BW, BM] = B_tile @ A_tile.T``.

    B: weight, [N, K] (B_KMAJOR) or its [K, N] storage; A: activations, [M, K] (A_KMAJOR) or
    [K, M]; D (and C) [M, N]; W fp32 [splits * tiles, BW, BM] partials and CNT int32 [tiles]
    counters (SPLITK only). Grid: ``cdiv(N, BW) * splits * cdiv(M, BM)`` CTAs; split ``s`` takes
    K steps ``[s * per, (s + 1) * per)`` of ``BK``.
    """
    num_m = ct.cdiv(D.shape[0], BM)
    num_steps = ct.cdiv(K, BK)
    pm, pn, s, k_lo, k_hi = _unit(num_m, splits, per, num_steps, SPLITK)
    acc = ct.zeros((BW, BM), dtype=ct.float32)
    for kb in range(k_lo, k_hi):
        if B_KMAJOR:
            w = tile_lib.load_hinted(B, (pn, kb), (BW, BK), LAT)
        else:
            w = tile_lib.load_hinted(B, (pn, kb), (BW, BK), LAT, (1, 0))
        if A_KMAJOR:
            a = tile_lib.load_hinted(A, (kb, pm), (BK, BM), LAT, (1, 0))
        else:
            a = tile_lib.load_hinted(A, (kb, pm), (BK, BM), LAT)
        acc = ct.mma(w, a, acc)
    _finish_t(D, C, W, CNT, acc, pm, pn, s, num_m, splits, alpha, beta, HAS_C, SPLITK)


def _decode_fp8_gemm_body(
    B,
    A,
    SB,
    SA,
    D,
    C,
    W,
    CNT,
    alpha: float,
    beta: float,
    K: int,
    splits: int,
    per: int,
    BW: ConstInt,
    BM: ConstInt,
    KU: ConstInt,
    SB_ROWS: ConstBool,
    FAST_ACC: ConstBool,
    LAT: ConstInt,
    INSIDE: ConstBool,
    HAS_C: ConstBool,
    SPLITK: ConstBool,
):
    """FP8 block-scaled ``D = alpha * sum_kb sa * sb * (A_kb @ B_kb.T) + beta * C`` as ``D.T`` tiles.

    B fp8 [N, K] and A fp8 [M, K] (K-major). SA: fp32 1x128 activation scales [M, KB] (any
    strides: the MN-major layout is read in place). SB: 128x128 weight block scales
    [ceil(N/128), KB], or with SB_ROWS one scale per weight row, [N, KB] (any strides). ``KU``
    (1 or 2) 128-wide K blocks per step; split
    ``s`` takes steps ``[s * per, (s + 1) * per)``. ``INSIDE``: every scale tile lies inside SA and SB
    (:func:`swap_scales_inside`), so their loads skip the bounds check. D, C, W, CNT as in the BF16 kernel.
    """
    num_m = ct.cdiv(D.shape[0], BM)
    num_steps = ct.cdiv(ct.cdiv(K, 128), KU)
    pm, pn, s, k_lo, k_hi = _unit(num_m, splits, per, num_steps, SPLITK)
    acc = ct.zeros((BW, BM), dtype=ct.float32)
    for ks in range(k_lo, k_hi):
        w = tile_lib.load_hinted(B, (pn, ks), (BW, 128 * KU), LAT)
        a = tile_lib.load_hinted(A, (ks, pm), (128 * KU, BM), LAT, (1, 0))
        kc = tile_lib.clamp_index(ks, num_steps, INSIDE)
        sa = _scale_load(SA, (kc, pm), (KU, BM), INSIDE, (1, 0))
        if SB_ROWS:
            sb = _scale_load(SB, (pn, kc), (BW, KU), INSIDE)
        else:
            sb = _scale_load(SB, (pn * BW // 128, kc), (1, KU), INSIDE)
        if KU == 1:
            acc = _promote(w, a, sb, sa, acc, FAST_ACC)
        else:
            for j in range(KU):
                wj = ct.extract(w, (0, j), (BW, 128))
                aj = ct.extract(a, (j, 0), (128, BM))
                sbj = ct.extract(sb, (0, j), (sb.shape[0], 1))
                saj = ct.extract(sa, (j, 0), (1, BM))
                acc = _promote(wj, aj, sbj, saj, acc, FAST_ACC)
    _finish_t(D, C, W, CNT, acc, pm, pn, s, num_m, splits, alpha, beta, HAS_C, SPLITK)


# Lean entry points: a call without ``c`` and without split-K launches one of these, which pass the plain
# kernels D for C, W and CNT (never read there: HAS_C and SPLITK are off). Three array parameters fewer:
# ``ct.launch`` converts each array argument through DLPack, about 1 us of host time apiece on an H100
# machine (benchmarks/results/host/README.md), a tenth of a small call's host time.


def _decode_bf16_gemm_lean(
    B,
    A,
    D,
    alpha: float,
    K: int,
    BW: ConstInt,
    BM: ConstInt,
    BK: ConstInt,
    A_KMAJOR: ConstBool,
    B_KMAJOR: ConstBool,
    LAT: ConstInt,
):
    """:func:`_decode_bf16_gemm_body` without ``c`` or split-K: ``D = alpha * A @ B.T``."""
    _decode_bf16_gemm_body(B, A, D, D, D, D, alpha, 0.0, K, 1, 0, BW, BM, BK, A_KMAJOR, B_KMAJOR, LAT, False, False)


def _decode_fp8_gemm_lean(
    B,
    A,
    SB,
    SA,
    D,
    alpha: float,
    K: int,
    BW: ConstInt,
    BM: ConstInt,
    KU: ConstInt,
    SB_ROWS: ConstBool,
    FAST_ACC: ConstBool,
    LAT: ConstInt,
    INSIDE: ConstBool,
):
    """:func:`_decode_fp8_gemm_body` without ``c`` or split-K: ``D = alpha * sum_kb sa * sb * (A_kb @ B_kb.T)``."""
    _decode_fp8_gemm_body(
        B, A, SB, SA, D, D, D, D, alpha, 0.0, K, 1, 0, BW, BM, KU, SB_ROWS, FAST_ACC, LAT, INSIDE, False, False
    )


def _promote(w, a, sb, sa, acc, FAST_ACC: ConstBool):
    """acc + (w @ a) * sa * sb: one 128-wide K block, raw product promoted with its scales."""
    p = ct.mma(w, a, ct.zeros(acc.shape, dtype=ct.float32), use_fast_acc=FAST_ACC)
    return _scale_into(acc, p, sa, sb)


def _scale_into(acc, p, sa, sb):
    """``acc + (p * sa) * sb``: a K block's raw fp32 product ``p`` promoted with its activation and weight scales
    (tile code; every FP8 decode kernel's promotion).

    The order is measured: ``p * (sb * sa)`` spilled a register on sm_90 in the swap-AB kernel with per-row weight
    scales, and made the narrow kernel's 128-row weight tiles up to 1.27x slower (``docs/decode.md``).
    """
    return acc + (p * sa) * sb


def _narrow_unit(D, BM: ConstInt, num_k, ROTATE: ConstBool):
    """This CTA's (activation tile, weight tile, first of its ``num_k`` K blocks) in a narrow-tile grid: the
    activation tile fastest; with ``ROTATE`` weight tile ``pn`` starts at block ``pn % num_k`` (else 0)."""
    num_m = ct.cdiv(D.shape[0], BM)
    pm = ct.bid(0) % num_m
    pn = ct.bid(0) // num_m
    first = (pn % num_k) if ROTATE else 0
    return pm, pn, first


def _wrap(j, num_k, ROTATE: ConstBool):
    """K block ``j % num_k`` of a narrow tile's walk, for ``0 <= j < 2 * num_k`` (tile code). With ``ROTATE`` a compare
    and a select, where ``%`` by a runtime value costs an integer division (about 30 instructions per K block in the
    producer warp and again in the consumer warps on sm_90); without, ``j`` itself (then ``j < num_k``)."""
    if ROTATE:
        return j - num_k if j >= num_k else j
    return j


def _narrow_bf16_gemm_body(
    A,
    B,
    D,
    alpha: float,
    K: int,
    BM: ConstInt,
    BN: ConstInt,
    BK: ConstInt,
    A_KMAJOR: ConstBool,
    B_KMAJOR: ConstBool,
    ROTATE: ConstBool,
):
    """BF16 ``D = alpha * A @ B.T`` in ``[BM, BN]`` tiles, the whole of K per CTA (no swap, no split-K, no ``c``).

    A: activations, [M, K] (A_KMAJOR) or its [K, M] storage; B: weight, [N, K] (B_KMAJOR) or its [K, N] storage;
    D [M, N]. Grid: ``cdiv(M, BM) * cdiv(N, BN)`` CTAs, the activation tile fastest (the CTAs that read one
    weight tile run together). ``ROTATE`` as in :func:`_narrow_fp8_gemm_body`.
    """
    num_k = ct.cdiv(K, BK)
    pm, pn, first = _narrow_unit(D, BM, num_k, ROTATE)
    acc = ct.zeros((BM, BN), dtype=ct.float32)
    for i in range(num_k):
        kb = _wrap(first + i, num_k, ROTATE)
        a = tile_lib.load_mk(A, pm, kb, BM, BK, A_KMAJOR)
        w = tile_lib.load_kn(B, kb, pn, BK, BN, B_KMAJOR)
        acc = ct.mma(a, w, acc)
    ct.store(D, (pm, pn), ct.astype(acc * alpha, D.dtype))


def _scale_load(S, index, shape, INSIDE: ConstBool, order=(0, 1)):
    """A plain (non-TMA) load of a scale tile (tile code). ``INSIDE``: the caller knows the tile lies inside ``S``
    (its K index from :func:`tile_lib.clamp_index`), so the load skips the bounds check (sm_90, instructions per K
    step of the MMA loop: swap-AB with 16 activation rows 372 -> 231, narrow 64x64 pairs 301 -> 292); otherwise
    rows or columns past ``S`` read as zero."""
    if INSIDE:
        return ct.load(S, index, shape, order=order, check_bounds=False, allow_tma=False)
    return ct.load(S, index, shape, order=order, padding_mode=_ZERO, allow_tma=False)


def _narrow_fp8_block(
    A,
    B,
    SA,
    SB,
    pm,
    pn,
    kb,
    num_k,
    BM: ConstInt,
    BN: ConstInt,
    SB_ROWS: ConstBool,
    LAT: ConstInt,
    INSIDE: ConstBool,
):
    """K block ``kb`` (of ``num_k``) of a narrow FP8 tile: its raw ``[BM, BN]`` product and the activation / weight
    scales that promote it. ``INSIDE``: the tile's activation rows (and with ``SB_ROWS`` its weight rows) lie inside
    the operands (:func:`narrow_scales_inside`): the scale loads skip their bounds checks."""
    a = tile_lib.load_hinted(A, (pm, kb), (BM, 128), LAT)
    w = tile_lib.load_hinted(B, (kb, pn), (128, BN), LAT, (1, 0))
    kc = tile_lib.clamp_index(kb, num_k, INSIDE)
    sa = _scale_load(SA, (pm, kc), (BM, 1), INSIDE)
    if SB_ROWS:
        sb = ct.reshape(_scale_load(SB, (pn, kc), (BN, 1), INSIDE), (1, BN))
    else:
        sb = _scale_load(SB, (pn * BN // 128, kc), (1, 1), INSIDE)
    return ct.mma(a, w, ct.zeros((BM, BN), dtype=ct.float32), use_fast_acc=True), sa, sb


def _narrow_fp8_gemm_body(
    A,
    B,
    SA,
    SB,
    D,
    alpha: float,
    K: int,
    BM: ConstInt,
    BN: ConstInt,
    SB_ROWS: ConstBool,
    LAT: ConstInt,
    ROTATE: ConstBool,
    PAIR: ConstBool,
    INSIDE: ConstBool,
):
    """FP8 block-scaled ``D = alpha * sum_kb sa * sb * (A_kb @ B_kb.T)`` in ``[BM, BN]`` tiles (no swap, no split-K,
    no ``c``), promoted per 128-wide K block as the swap-AB kernel does.

    A fp8 [M, K], B fp8 [N, K] (K-major); SA fp32 [M, KB] and SB fp32 [ceil(N/128), KB] (128x128 blocks, ``BN``
    divides 128) or with SB_ROWS [N, KB], any strides; D [M, N]. Grid as in :func:`_narrow_bf16_gemm_body`. ``LAT``:
    the load latency hint (0: none); ``ROTATE``: weight tile ``pn`` starts at K block ``pn % KB`` and wraps
    around (``heuristics.NarrowConfig``). ``PAIR``: two K blocks per iteration, both MMAs issued before either
    promotion (tileiras then overlaps the first block's promotion with the second block's MMAs on sm_90); the sum
    order is the same as one block per iteration. ``INSIDE``: every scale tile lies inside SA and SB
    (:func:`narrow_scales_inside`): their loads skip the bounds check.
    """
    num_k = ct.cdiv(K, 128)
    pm, pn, first = _narrow_unit(D, BM, num_k, ROTATE)
    acc = ct.zeros((BM, BN), dtype=ct.float32)
    if PAIR:
        for i in range(num_k // 2):
            k0 = _wrap(first + 2 * i, num_k, ROTATE)
            p0, sa0, sb0 = _narrow_fp8_block(A, B, SA, SB, pm, pn, k0, num_k, BM, BN, SB_ROWS, LAT, INSIDE)
            p1, sa1, sb1 = _narrow_fp8_block(
                A, B, SA, SB, pm, pn, _wrap(k0 + 1, num_k, ROTATE), num_k, BM, BN, SB_ROWS, LAT, INSIDE
            )
            acc = _scale_into(acc, p0, sa0, sb0)
            acc = _scale_into(acc, p1, sa1, sb1)
        if num_k % 2 == 1:
            p, sa, sb = _narrow_fp8_block(
                A, B, SA, SB, pm, pn, _wrap(first + num_k - 1, num_k, ROTATE), num_k, BM, BN, SB_ROWS, LAT, INSIDE
            )
            acc = _scale_into(acc, p, sa, sb)
    else:
        for i in range(num_k):
            p, sa, sb = _narrow_fp8_block(
                A, B, SA, SB, pm, pn, _wrap(first + i, num_k, ROTATE), num_k, BM, BN, SB_ROWS, LAT, INSIDE
            )
            acc = _scale_into(acc, p, sa, sb)
    ct.store(D, (pm, pn), ct.astype(acc * alpha, D.dtype))


def narrow_scales_inside(cfg: heuristics.NarrowConfig, m: int, n: int, sb_rows: bool) -> bool:
    """Whether every scale tile of the narrow FP8 kernel of ``cfg`` on an ``m x n`` output lies inside the scales
    (its ``INSIDE``), for a config with ``unchecked_scales``: the activation tiles when ``bm`` divides ``m``, the
    per-row weight scales when ``bn`` divides ``n`` (a 128x128 block scale always does)."""
    return cfg.unchecked_scales and m % cfg.bm == 0 and (not sb_rows or n % cfg.bn == 0)


@functools.cache
def get_narrow_kernel(dtype: str, cfg: heuristics.NarrowConfig) -> Any:
    """The ``@ct.kernel`` of the narrow-tile ``dtype`` ("bf16"/"fp8") kernel with ``cfg``'s compiler hints."""
    return ct.kernel(_narrow_bf16_gemm_body if dtype == "bf16" else _narrow_fp8_gemm_body, **cfg.compiler_options())


def narrow_constants(
    dtype: str,
    cfg: heuristics.NarrowConfig,
    *,
    a_kmajor: bool,
    b_kmajor: bool,
    sb_rows: bool,
    inside: bool = False,
) -> list[Any]:
    """The ``ct.Constant`` tail of the narrow ``dtype`` kernel of ``cfg``, in parameter order (FP8 operands are
    K-major: ``a_kmajor`` / ``b_kmajor`` are BF16's; ``inside``: FP8's ``INSIDE``, see :func:`narrow_scales_inside`)."""
    if dtype == "bf16":
        return launch.trailing(
            _narrow_bf16_gemm_body, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk_bf16, A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor,
            ROTATE=cfg.rotate_k,
        )  # fmt: skip
    return launch.trailing(
        _narrow_fp8_gemm_body, BM=cfg.bm, BN=cfg.bn, SB_ROWS=sb_rows, LAT=cfg.latency, ROTATE=cfg.rotate_k,
        PAIR=cfg.pair_k, INSIDE=inside,
    )  # fmt: skip


@functools.cache
def get_kernel(
    dtype: str, cfg: heuristics.DecodeConfig, bm: int, lean: bool = False, occupancy: int | None = None
) -> Any:
    """The ``@ct.kernel`` for ``dtype`` ("bf16"/"fp8") with ``cfg``'s compiler hints for activation tile ``bm``
    (``lean``: the entry point of a call without ``c`` or split-K; ``occupancy``: the plan's CTAs-per-SM hint,
    ``None``: ``cfg``'s for ``bm``)."""
    if lean:
        body = _decode_bf16_gemm_lean if dtype == "bf16" else _decode_fp8_gemm_lean
    else:
        body = _decode_bf16_gemm_body if dtype == "bf16" else _decode_fp8_gemm_body
    return ct.kernel(body, **cfg.compiler_options(bm, occupancy))


def bf16_constants(
    plan: heuristics.DecodePlan, *, a_kmajor: bool, b_kmajor: bool, has_c: bool, splitk: bool, lean: bool = False
) -> list[Any]:
    """The ``ct.Constant`` tail of the BF16 decode kernel of ``plan`` (``lean``: of its lean entry point, which has
    no ``HAS_C`` / ``SPLITK``), in parameter order."""
    cfg = plan.cfg
    named = dict(BW=cfg.bw, BM=plan.bm, BK=cfg.bk_bf16, A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, LAT=plan.latency)
    if lean:
        return launch.trailing(_decode_bf16_gemm_lean, **named)
    return launch.trailing(_decode_bf16_gemm_body, **named, HAS_C=has_c, SPLITK=splitk)


def fp8_constants(
    plan: heuristics.DecodePlan, *, sb_rows: bool, has_c: bool, splitk: bool, inside: bool = False, lean: bool = False
) -> list[Any]:
    """The ``ct.Constant`` tail of the FP8 decode kernel of ``plan``, in parameter order, fast accumulation on
    (``lean``: of its lean entry point, which has no ``HAS_C`` / ``SPLITK``; ``inside``: :func:`swap_scales_inside`)."""
    named = dict(BW=plan.cfg.bw, BM=plan.bm, KU=plan.cfg.ku, SB_ROWS=sb_rows, FAST_ACC=True, LAT=plan.latency)
    if lean:
        return launch.trailing(_decode_fp8_gemm_lean, **named, INSIDE=inside)
    return launch.trailing(_decode_fp8_gemm_body, **named, INSIDE=inside, HAS_C=has_c, SPLITK=splitk)


def swap_scales_inside(plan: heuristics.DecodePlan, m: int, n: int, k: int, sb_rows: bool) -> bool:
    """Whether every scale tile of the swap-AB FP8 kernel of ``plan`` on an ``m x n x k`` problem lies inside the
    scales (its ``INSIDE``): the activation tile divides ``m``, the K step's blocks divide K's, and with per-row
    weight scales the weight tile divides ``n``."""
    cfg = plan.cfg
    return m % plan.bm == 0 and cdiv(k, 128) % cfg.ku == 0 and (not sb_rows or n % cfg.bw == 0)
