"""The device-side library every cutile kernel module imports (tile code only; host code lives beside each kernel
family): the swizzled tile order, tile loads (a logical BF16 operand from either storage order, since TMA reads
16-bit data K-major or MN-major alike; a load with a latency hint; the index clamp an unchecked load in a loop
needs; a grouped operand's row block), the per-block FP8 cast, the grouped BF16 MMA loop, the gated activations,
an expert block's lookup and the MoE kernels' persistent walk over expert row blocks. A helper used by more than
one kernel module lives here, not as another module's private name."""

from __future__ import annotations

import math

import cuda.tile as ct

from tilegemm.heuristics.cutile import Kind
from tilegemm.ops.common import AMAX_EPS, FP8_MAX

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO
#: ``sqrt(2 / pi)``, the tanh GELU's constant.
GELU_C = math.sqrt(2.0 / math.pi)


def _fp8_scale(v, axis: int):
    """The e4m3 scale of fp32 ``v`` along ``axis`` (extent 1 kept): ``max(amax, AMAX_EPS) / FP8_MAX``."""
    amax = ct.max(ct.abs(v), axis=axis, keepdims=True)
    return ct.maximum(amax, AMAX_EPS) / FP8_MAX


def _fp8_clamped(quotient):
    """``quotient`` clamped to e4m3's range and cast."""
    q = ct.minimum(ct.maximum(quotient, -FP8_MAX), FP8_MAX)
    return ct.astype(q, ct.float8_e4m3fn)


def fp8_quantize(v, axis: int):
    """``(q, scale)``: fp32 ``v`` cast to e4m3 with one scale along ``axis`` (``scale = max(amax, AMAX_EPS) /
    FP8_MAX``, ``q = clamp(v / scale)``): ``tilegemm.per_token_cast_to_fp8``'s formula for a tile whose extent along
    ``axis`` is one block. ``scale`` keeps ``axis`` with extent 1."""
    scale = _fp8_scale(v, axis)
    return _fp8_clamped(v / scale), scale


def fp8_quantize_padded(v, axis: int):
    """:func:`fp8_quantize` for a tile that is mostly zero padding (a decode step's one key in a 16-row tile): the
    same bits, but a zero ``v`` gives its own signed zero, the division's value, without dividing. The IEEE division
    takes its slow path (sm_90: ``FCHK``, then a ``CALL``) for a zero dividend, so the padding rows of a partial
    tile would cost more than a full tile's cast (``benchmarks/append_probe.py``); in a full tile the select costs
    a little, so dense casts use :func:`fp8_quantize`."""
    scale = _fp8_scale(v, axis)
    zero = v == 0.0
    return _fp8_clamped(ct.where(zero, v, ct.where(zero, scale, v) / scale)), scale


def load_mk(A, pm, kb, TM: int, TK: int, KMAJOR: bool):
    """Tile ``(pm, kb)`` ``[TM, TK]`` of the logical ``[M, K]`` operand, zero past the edges.

    ``A`` is that ``[M, K]`` array (``KMAJOR``) or its ``[K, M]`` storage, read transposed (``order=(1, 0)``).
    """
    if KMAJOR:
        tile = ct.load(A, (pm, kb), (TM, TK), padding_mode=_ZERO)
    else:
        tile = ct.load(A, (pm, kb), (TM, TK), order=(1, 0), padding_mode=_ZERO)
    return tile


def load_kn(B, kb, pn, TK: int, TN: int, KMAJOR: bool):
    """Tile ``(kb, pn)`` ``[TK, TN]`` of the logical ``[K, N]`` operand ``B.T``, zero past the edges.

    ``B`` is the ``[N, K]`` weight (``KMAJOR``, read transposed with ``order=(1, 0)``) or its ``[K, N]`` storage.
    """
    if KMAJOR:
        tile = ct.load(B, (kb, pn), (TK, TN), order=(1, 0), padding_mode=_ZERO)
    else:
        tile = ct.load(B, (kb, pn), (TK, TN), padding_mode=_ZERO)
    return tile


def load_hinted(X, index, shape, LAT: int, order=(0, 1)):
    """A zero-padded tile load; ``LAT > 0`` passes it as the load's latency hint (0: the compiler's choice).

    tileiras sizes a loop's load pipeline (stages, shared-memory slots) from the hint: the decode kernels'
    ``DecodePlan.latency`` / ``NarrowConfig.latency``, the plain MQA kernel's ``MqaConfig.key_latency``.
    """
    if LAT > 0:
        return ct.load(X, index, shape, order=order, padding_mode=_ZERO, latency=LAT)
    return ct.load(X, index, shape, order=order, padding_mode=_ZERO)


def clamp_index(k, count, CLAMP: bool):
    """Tile index ``k`` of a loop, clamped into ``[0, count)`` when ``CLAMP`` (else ``k`` itself).

    A load without bounds checks needs it: tileiras issues a loop's loads a few iterations ahead, also for the
    iterations after the last (their values unused), and unchecked those read past the array (sm_90 SASS of the FP8
    decode kernels' scale loads: three 128-wide K blocks past the end). Every iteration that runs keeps its index.
    """
    return ct.minimum(k, count - 1) if CLAMP else k


def swizzle(lt, mblocks, n_tiles, GM: int):
    """Tile ``lt`` -> (row block, col block) in the swizzled order the grouped and MoE kernels walk (within a
    group): bands of ``GM`` row blocks, rows fastest, so consecutive tiles share their column's B tiles in L2.

    :func:`tile_coords` is the same order written with a modulo; each family keeps the form its SASS was measured
    with (one form for both changed the dense and einsum kernels' instruction streams by -6% to +0.5%: to be timed
    before they share one)."""
    band = lt // (GM * n_tiles)
    first = band * GM
    gm = ct.minimum(mblocks - first, GM)
    w = lt - band * GM * n_tiles
    return first + w % gm, w // gm


def tile_coords(tile, num_m, num_n, GROUP_M: ConstInt):
    """:func:`swizzle`'s order as the dense and einsum kernels compute it: ``GROUP_M`` row-tiles share each column
    sweep, so B stays in L2."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = ct.minimum(num_m - first_m, GROUP_M)
    local = tile % per_group
    return first_m + local % rows, local // rows


def load_rows(x, g, rb, kb, ROWS: int, COLS: int, KIND: int):
    """The ``[ROWS, COLS]`` tile (row block ``rb``, column block ``kb``) of ``x``: ``[rows, cols]``, or for masked
    ``[G, Mmax, cols]`` with ``rb`` counted inside group ``g`` (loads past Mmax read 0)."""
    if KIND == Kind.MASKED:
        return ct.reshape(ct.load(x, (g, rb, kb), shape=(1, ROWS, COLS), padding_mode=_ZERO), (ROWS, COLS))
    return ct.load(x, (rb, kb), shape=(ROWS, COLS), padding_mode=_ZERO)


def mma_bf16(a, b, g, e, rb, nb, nk, BM: int, BN: int, BK: int, TRANS_B: bool, KIND: int):
    """fp32 [BM, BN] = row block ``rb`` of ``a`` @ B_e[:, nb cols] over ``nk`` blocks of BK (zero padded)."""
    acc = ct.full((BM, BN), 0.0, dtype=ct.float32)
    for kb in range(nk):
        at = load_rows(a, g, rb, kb, BM, BK, KIND)
        if TRANS_B:
            bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), order=(0, 2, 1), padding_mode=_ZERO)
        else:
            bt = ct.load(b, (e, kb, nb), shape=(1, BK, BN), padding_mode=_ZERO)
        acc = ct.mma(at, ct.reshape(bt, (BK, BN)), acc)
    return acc


def activation(g, ACT: int):
    """``silu(g) = g * sigmoid(g)`` or the tanh GELU ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))``, fp32."""
    if ACT == 0:
        return g / (1.0 + ct.exp(-g))
    return 0.5 * g * (1.0 + ct.tanh(GELU_C * (g + 0.044715 * g * g * g)))


def persistent_walk(out, a, BM: int, BN: int, BK: int):
    """A persistent kernel's walk over the ``BM x BN`` tiles of ``out`` [M, N], a product of the row operand ``a``
    [M, K]: ``(mblocks, n_tiles, nk, total, first, step)``, the row and column blocks, the ``BK``-wide K blocks, the
    tile count, this CTA's first tile and the stride between its tiles. (The column blocks are computed first: the
    MoE kernels' SASS was measured with that order.)"""
    n_tiles = ct.cdiv(out.shape[1], BN)
    mblocks = ct.cdiv(out.shape[0], BM)
    total = mblocks * n_tiles
    first = ct.bid(0)
    step = ct.num_blocks(0)
    return mblocks, n_tiles, ct.cdiv(a.shape[1], BK), total, first, step


def expert_tile(block_expert, t, mblocks, n_tiles, num_experts: int, GM: int):
    """Tile ``t`` of an MoE kernel's walk over expert row blocks: ``(mb, nb, e, live)``, its row and column block
    (:func:`swizzle`), the row block's expert and whether that is in ``[0, E)`` (a block of none is skipped)."""
    mb, nb = swizzle(t, mblocks, n_tiles, GM)
    e = ct.load(block_expert, (mb,), shape=())
    return mb, nb, e, (e >= 0) & (e < num_experts)


def block_expert(block_expert, mb, num_experts: int):
    """``(e, live)``: block ``mb``'s expert clamped into ``[0, E)``, and whether it was in range."""
    e = ct.load(block_expert, (mb,), shape=())
    live = (e >= 0) & (e < num_experts)
    return ct.where(live, e, 0), live
