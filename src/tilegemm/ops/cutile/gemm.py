"""cuTile dense GEMMs: ``bf16_gemm_{nt,nn,tn,tt}`` and ``fp8_gemm_{nt,nn,tn,tt}`` (block-scaled).

Over 600 lines: the dense kernels (BF16, FP8, split-K reduce) and the one host path that plans their launches
(with the decode kernels of ``decode.py``) belong together: a plan is checked against the kernels' parameters.

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
:mod:`tilegemm.heuristics.cutile`; host-side launch helpers in :mod:`tilegemm.ops.cutile.launch`.
Measurements and SASS findings: ``docs/kernels.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cuda.tile as ct
import torch

from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.common import write_head_splits
from tilegemm.ops.cutile import decode, launch, tile_lib

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
        tile, k_lo, k_hi = u, 0, num_k
        if SPLITK:
            tile, k_lo, k_hi = _split_unit(u, tiles, splits, num_k)
        pm, pn = tile_lib.tile_coords(tile, num_m, num_n, GROUP_M)
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
        tile, k_lo, k_hi = u, 0, num_k
        if SPLITK:
            tile, k_lo, k_hi = _split_unit(u, tiles, splits, num_k)
        pm, pn = tile_lib.tile_coords(tile, num_m, num_n, GROUP_M)
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


# --------------------------------------------------------------------------- host side
#
# Operands arrive in the logical ``nt`` form the checks derive: a [M, K] and b [N, K] views (FP8: with their scales
# sa [M, K/128] and sb [N/128, K/128] or [N, K/128]). A call's launch plan is built once per key (operand
# metadata, epilogue, recipe, config, decode variant, SMs): ``bf16_plan`` / ``fp8_plan`` -> ``launch.cached_plan``
# -> :func:`_build` -> the runner of the config's kernel family (``_RUNNERS[cfg.path]``). A repeated call only
# looks its plan up and launches: no heuristics, no allocations (split-K workspaces and counters are cached per
# device and stream), no views.

Runner = launch.Runner


@dataclass(frozen=True)
class _Call:
    """What a plan is built from: the problem, its config, and how each operand reaches the kernels.

    ``fa`` / ``fb``: the logical operand -> the kernel's array (``None``: as it is), ``a_kmajor`` / ``b_kmajor``
    whether that array is K-major; ``c_fn``: ``(d, c) ->`` the C array; FP8: ``sb_rows`` (1x128 RHS scales),
    ``sa_to_f32`` (``sa`` is not fp32 yet).
    """

    op: str
    p: heuristics.Problem
    cfg: Any
    fa: Callable | None
    a_kmajor: bool
    fb: Callable | None
    b_kmajor: bool
    c_fn: Callable
    sb_rows: bool = False
    sa_to_f32: bool = False

    @property
    def fp8(self) -> bool:
        return self.p.dtype == "fp8"


def _transpose(x: torch.Tensor) -> torch.Tensor:
    return x.t()


def _operand_fn(x: torch.Tensor, need_kmajor: bool) -> tuple[Callable | None, bool]:
    """How logical operand ``x`` ([rows, K]) reaches the kernel: ``(fn, kmajor)``, the kernel's array being ``fn(x)``
    (``None``: ``x``). ``x`` itself when TMA can read it (K-major), else its [K, rows] storage (not when
    ``need_kmajor``: FP8 MMAs read K-major data only), else an aligned K-major copy made per call."""
    if launch.tma_ready(x):
        return None, True
    if not need_kmajor and launch.tma_ready(x.t()):
        return _transpose, False
    return launch.aligned_copy, True


def _apply(fn: Callable | None, x: torch.Tensor) -> torch.Tensor:
    return x if fn is None else fn(x)


def _addend_fn(d: torch.Tensor, c: torch.Tensor | None) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """``(d, c) -> C array``: ``d`` without a ``c`` (not read), else ``c`` itself when TMA can read it, else a
    row-major copy. It depends on ``c``'s metadata only (the plan key), never on whether ``c`` is ``d``."""
    if c is None:
        return lambda dd, cc: dd
    if launch.tma_ready(c):
        return lambda dd, cc: cc
    return lambda dd, cc: launch.aligned_copy(cc)


def _empty_k(d: torch.Tensor, c: torch.Tensor | None, beta: float) -> torch.Tensor:
    """K == 0: ``d = beta * c`` (or zeros) without a kernel."""
    if c is None or beta == 0:
        return d.zero_()
    d.copy_((c.to(torch.float32) * beta).to(d.dtype))
    return d


def _trivial_plan(m: int, n: int, k: int) -> Runner | None:
    """The plan of an empty output (nothing to do) or of K == 0 (``d = beta * c``), else ``None``."""
    if m == 0 or n == 0:
        return lambda a, b, d, c, alpha, beta: None
    if k == 0:
        return lambda a, b, d, c, alpha, beta: _empty_k(d, c, beta)
    return None


def _stream_buffers(d: torch.Tensor, handle: int, ws_elems: int, ws_shape: tuple, cnt_elems: int) -> tuple:
    """The (fp32 workspace view, int32 counters view) a plan's kernel uses on stream ``handle``."""
    ws = launch.scratch(d.device, handle, torch.float32, max(1, ws_elems))
    cnt = launch.scratch(d.device, handle, torch.int32, max(1, cnt_elems))
    return ws[: max(1, ws_elems)].view(ws_shape), cnt[: max(1, cnt_elems)]


def _has_c(c: torch.Tensor | None, beta: float) -> bool:
    return c is not None and beta != 0


def bf16_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c, alpha, beta, config=None) -> torch.Tensor:
    """BF16 GEMM ``d = alpha * a @ b.T + beta * c`` on the logical ``nt`` form (a [M, K], b [N, K] views of any
    storage order; see ops/api/).

    ``config`` overrides the heuristic choice (benchmarks, tests): a ``DenseConfig`` forces the
    persistent-tile kernel, a ``DecodeConfig`` the swap-AB decode kernel, a ``NarrowConfig`` the narrow-tile
    decode kernel (calls without ``c`` only).
    """
    bf16_plan(a, b, d, c if _has_c(c, beta) else None, config)(a, b, d, c, alpha, beta)
    return d


def bf16_plan(a, b, d, c, config=None) -> Runner:
    """The cached launch plan of a BF16 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta)``."""
    tk, variant = launch.tensor_key, heuristics.variant("dense")
    key = ("bf16", tk(a), tk(b), tk(d), None if c is None else tk(c), config, variant, launch.sms_key(d.device))
    return launch.cached_plan(key, _build, "bf16", a, None, b, None, d, c, None, config, variant)


def fp8_gemm(a, b, d: torch.Tensor, c, alpha, beta, recipe, config=None) -> torch.Tensor:
    """FP8 block-scaled GEMM on the logical ``nt`` form (see ops/api/); operands are (fp8, fp32 scales): a
    [M, K] with sa [M, K/128], b [N, K] with sb [N/128, K/128] or [N, K/128]; ``recipe`` resolved (the checks do
    both). Operands that are not K-major are copied to K-major (Hopper FP8 MMAs read K-major data only).
    ``config`` as in :func:`bf16_gemm`.
    """
    fp8_plan(a, b, d, c if _has_c(c, beta) else None, recipe, config)(a, b, d, c, alpha, beta)
    return d


def fp8_plan(a, b, d, c, recipe, config=None) -> Runner:
    """The cached launch plan of an FP8 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta)``."""
    (a_data, sa), (b_data, sb) = a, b
    tk, variant = launch.tensor_key, heuristics.variant("dense")
    recipe = None if recipe is None else tuple(recipe)
    key = (
        "fp8", tk(a_data), tk(sa), tk(b_data), tk(sb), tk(d), None if c is None else tk(c), recipe, config, variant,
        launch.sms_key(d.device),
    )  # fmt: skip
    return launch.cached_plan(key, _build, "fp8", a_data, sa, b_data, sb, d, c, recipe, config, variant)


def _build(dtype: str, a, sa, b, sb, d, c, recipe, config, variant: str | None) -> Runner:
    """Build the plan of a ``dtype`` call: the trivial plan of an empty problem, else the runner of the config's
    kernel family (``config`` when forced, else the heuristics' choice under ``variant``)."""
    (m, k), n = a.shape, b.shape[0]
    trivial = _trivial_plan(m, n, k)
    if trivial is not None:
        return trivial
    if not d.is_contiguous():
        raise Unsupported("d must be contiguous")
    fp8 = dtype == "fp8"
    p = heuristics.Problem("dense", dtype, m, n, k, launch.num_sms(), has_c=c is not None, variant=variant)
    cfg = config or heuristics.choose(p)
    (fa, a_kmajor), (fb, b_kmajor) = _operand_fn(a, fp8), _operand_fn(b, fp8)
    call = _Call(
        f"{dtype}_gemm_nt", p, cfg, fa, a_kmajor, fb, b_kmajor, _addend_fn(d, c),
        sb_rows=fp8 and tuple(recipe) == (1, 1, 128), sa_to_f32=fp8 and sa.dtype != torch.float32,
    )  # fmt: skip
    return _RUNNERS[cfg.path](call)


def _narrow_runner(call: _Call) -> Runner:
    """The narrow-tile decode kernel (calls without ``c``): one kernel, no workspace."""
    p, cfg, fa, fb = call.p, call.cfg, call.fa, call.fb
    if p.has_c:
        raise Unsupported(f"config {cfg.name}: the narrow-tile kernel has no c epilogue")
    if call.fp8:
        inside = decode.narrow_scales_inside(cfg, p.m, p.n, call.sb_rows)
        consts = decode.narrow_constants("fp8", cfg, a_kmajor=True, b_kmajor=True, sb_rows=call.sb_rows, inside=inside)
        if not call.sb_rows and 128 % cfg.bn != 0:
            raise Unsupported(f"config {cfg.name}: 128x128 weight scales need a weight tile that divides 128")
        to_f32 = call.sa_to_f32

        def operands(a, b):
            return (_apply(fa, a[0]), _apply(fb, b[0]), a[1].to(torch.float32) if to_f32 else a[1], b[1])

    else:
        consts = decode.narrow_constants("bf16", cfg, a_kmajor=call.a_kmajor, b_kmajor=call.b_kmajor, sb_rows=False)

        def operands(a, b):
            return (_apply(fa, a), _apply(fb, b))

    heuristics.print_once(call.op, (p.m, p.n, p.k), cfg.summary(p.m, p.n))
    kernel = decode.get_narrow_kernel(p.dtype, cfg)
    grid = cfg.grid(p.m, p.n)
    tail = (p.k, *consts)

    def run(a, b, d, c, alpha, beta):
        launch.launch(kernel, grid, (*operands(a, b), d, float(alpha), *tail))

    return run


def _decode_constants(call: _Call, plan: heuristics.DecodePlan, splitk: bool, lean: bool = False) -> list[Any]:
    """The constant tail of the swap-AB kernel of ``plan`` for ``call`` (``lean``: its lean entry point's)."""
    has_c = call.p.has_c
    if call.fp8:
        inside = decode.swap_scales_inside(plan, call.p.m, call.p.n, call.p.k, call.sb_rows)
        return decode.fp8_constants(plan, sb_rows=call.sb_rows, has_c=has_c, splitk=splitk, inside=inside, lean=lean)
    return decode.bf16_constants(
        plan, a_kmajor=call.a_kmajor, b_kmajor=call.b_kmajor, has_c=has_c, splitk=splitk, lean=lean
    )


def _decode_operands(call: _Call) -> Callable[..., tuple]:
    """``(a, b) ->`` the swap-AB kernel's leading arrays: the weight side first (``B, A`` and FP8 ``SB, SA``)."""
    fa, fb = call.fa, call.fb
    if not call.fp8:
        return _swap_pair if fa is None and fb is None else lambda a, b: (_apply(fb, b), _apply(fa, a))
    if fa is None and fb is None and not call.sa_to_f32:
        return _fp8_swap
    to_f32 = call.sa_to_f32

    def operands(a, b):
        sa_arr = a[1].to(torch.float32) if to_f32 else a[1]
        return (_apply(fb, b[0]), _apply(fa, a[0]), b[1], sa_arr)

    return operands


def _decode_runner(call: _Call) -> Runner:
    """A decode-size GEMM: one swap-AB kernel (split-K reduced inside it); without ``c`` and split-K, its lean
    entry point (no C, workspace or counter arguments)."""
    p, cfg, c_fn, has_c = call.p, call.cfg, call.c_fn, call.p.has_c
    plan = heuristics.decode_plan(p, cfg)
    heuristics.print_once(call.op, (p.m, p.n, p.k), plan.summary)
    grid, operands = plan.grid, _decode_operands(call)
    if not (has_c or plan.splitk):
        lean = decode.get_kernel(p.dtype, cfg, plan.bm, lean=True, occupancy=plan.occupancy)
        lean_tail = (p.k, *_decode_constants(call, plan, False, lean=True))

        def run_lean(a, b, d, c, alpha, beta):
            launch.launch(lean, grid, (*operands(a, b), d, float(alpha), *lean_tail))

        return run_lean
    kernel = decode.get_kernel(p.dtype, cfg, plan.bm, occupancy=plan.occupancy)
    tail = (p.k, plan.splits, plan.per, *_decode_constants(call, plan, plan.splitk))
    ws_shape = (plan.splits * plan.tiles, cfg.bw, plan.bm) if plan.splitk else (1, 1, 1)
    per_stream: dict[int, tuple] = {}

    def run(a, b, d, c, alpha, beta):
        stream = launch.current_stream()
        bufs = per_stream.get(stream.cuda_stream)
        if bufs is None:
            bufs = per_stream[stream.cuda_stream] = _stream_buffers(
                d, stream.cuda_stream, plan.workspace_elems, ws_shape, plan.tiles
            )
        args = (*operands(a, b), d, c_fn(d, c), *bufs, float(alpha), float(beta), *tail)
        launch.launch(kernel, grid, args, stream)

    return run


def _tile_runner(call: _Call) -> Runner:
    """The persistent-tile kernel (and the split-K reduce kernel when the plan splits tiles). FP8 has no ``c``
    epilogue in the tile kernel: with a ``c`` every tile goes through the fp32 workspace and the reduce kernel
    applies the epilogue."""
    p, cfg, fa, fb, c_fn, has_c = call.p, call.cfg, call.fa, call.fb, call.c_fn, call.p.has_c
    if call.fp8:
        sb_rows = call.sb_rows
        if not sb_rows and cfg.bn // cfg.nh != 128:
            raise Unsupported(f"config {cfg.name}: 128x128 RHS scales need 128-wide N parts")

        def consts(splitk: bool) -> list[Any]:
            return kernel_constants(cfg, sb_rows=sb_rows, splitk=splitk)

        def operands(a, b):
            arr_sa = _mn_major_scales(a[1].to(torch.float32))
            arr_sb = _mn_major_scales(b[1]) if sb_rows else b[1].contiguous()
            return (_apply(fa, a[0]), _apply(fb, b[0]), arr_sa, arr_sb)

    else:

        def consts(splitk: bool) -> list[Any]:
            return kernel_constants(cfg, a_kmajor=call.a_kmajor, b_kmajor=call.b_kmajor, has_c=has_c, splitk=splitk)

        def operands(a, b):
            return (_apply(fa, a), _apply(fb, b))

    plan = heuristics.split_plan(p, cfg)
    splitk = plan.splits > 1 or (call.fp8 and has_c)
    grid = launch.persistent_grid(plan.units, cfg.ctas_per_sm, p.sms)
    heuristics.print_once(call.op, (p.m, p.n, p.k), f"{cfg.name} grid={grid} split={plan.splits}")
    kernel = get_kernel(cfg)
    main_tail = (p.k, plan.splits, *consts(splitk))
    red_grid = (plan.tiles * (cfg.bm // reduce_rows(cfg)), 1, 1)
    red_tail = (plan.splits, *reduce_constants(cfg, has_c=has_c))
    ws_elems = plan.splits * plan.tiles * cfg.bm * cfg.bn if splitk else 0
    ws_shape = (plan.splits, plan.tiles, cfg.bm, cfg.bn) if splitk else (1, 1, 1, 1)
    per_stream: dict[int, tuple] = {}

    def run(a, b, d, c, alpha, beta):
        stream = launch.current_stream()
        bufs = per_stream.get(stream.cuda_stream)
        if bufs is None:
            bufs = per_stream[stream.cuda_stream] = _stream_buffers(d, stream.cuda_stream, ws_elems, ws_shape, 1)
        work = bufs[0]  # not read without split-K
        c_arg = c_fn(d, c)
        alpha, beta = float(alpha), float(beta)
        launch.launch(kernel, grid, (*operands(a, b), d, c_arg, work, alpha, beta, *main_tail), stream)
        if splitk:
            launch.launch(get_reduce_kernel(), red_grid, (work, d, c_arg, alpha, beta, *red_tail), stream)

    return run


#: The runner of each kernel family a dense config names (``cfg.path``).
_RUNNERS: dict[str, Callable[[_Call], Runner]] = {
    "narrow": _narrow_runner,
    "decode": _decode_runner,
    "tile": _tile_runner,
}


def _swap_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return b, a


def _fp8_swap(a, b) -> tuple:
    return b[0], a[0], b[1], a[1]


def _mn_major_scales(s: torch.Tensor) -> torch.Tensor:
    """[rows, KB] fp32 scales as the [KB, rows] row-major array the kernel reads (zero-copy when MN-major)."""
    return launch.as_row_major(s.t())


# --------------------------------------------------------------------------- registration


def _bf16_gemm(a, b, d, c, alpha, beta, stream):
    """cuTile BF16 GEMM of any layout, in the logical ``nt`` form the checks derive (a [M, K], b [N, K] views)."""
    return bf16_gemm(a, b, d, c, alpha, beta)


def _fp8_gemm(a, b, d, c, recipe, alpha, beta, stream):
    """cuTile FP8 GEMM of any layout, in the logical ``nt`` form (data and scales transposed together)."""
    return fp8_gemm(a, b, d, c, alpha, beta, recipe)


def _replay(plan: Runner) -> Callable[..., torch.Tensor]:
    """The hot-lane replay of a dense call whose plan is ``plan`` (operands in the logical ``nt`` form)."""

    def replay(a, b, d, c, alpha, beta) -> torch.Tensor:
        plan(a, b, d, c, alpha, beta)
        return d

    return replay


def _bf16_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor]:
    a, b, d, c, beta = (derived[key] for key in ("a", "b", "d", "c", "beta"))
    return _replay(bf16_plan(a, b, d, c if _has_c(c, beta) else None))


def _fp8_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor]:
    a, b, d, c, beta, recipe = (derived[key] for key in ("a", "b", "d", "c", "beta", "recipe"))
    return _replay(fp8_plan(a, b, d, c if _has_c(c, beta) else None, recipe))


@register_impl("fp8_gemm_nt_skip_head_mid", "cutile")
def _fp8_gemm_skip_head_mid(a, b, d, head_splits, recipe, stream):
    """The FP8 ``nt`` GEMM into a temporary [M, N] of ``d``'s dtype, then placed around each head's gap."""
    out = torch.empty(a[0].shape[0], b[0].shape[0], dtype=d.dtype, device=d.device)
    fp8_gemm(a, b, out, None, 1.0, 0.0, recipe)
    return write_head_splits(d, out, head_splits)


for _op in ("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt"):
    register_impl(_op, "cutile")(_bf16_gemm)
    register_replay(_op, "cutile")(_bf16_replay)
for _op in ("fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt"):
    register_impl(_op, "cutile")(_fp8_gemm)
    register_replay(_op, "cutile")(_fp8_replay)
del _op
