"""cuTile dense GEMMs: ``bf16_gemm_{nt,nn,tn,tt}`` and ``fp8_gemm_{nt,nn,tn,tt}`` (block-scaled).

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
from typing import Any

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, register_impl, register_replay
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
    (docs/kernels.md, "MMA groups and the walk loop").
    """
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    num_k = ct.cdiv(K, TK)
    tiles = num_m * num_n
    for u in range(ct.bid(0), tiles * splits if SPLITK else tiles, ct.num_blocks(0)):
        tile, k_lo, k_hi = u, 0, num_k
        if SPLITK:
            tile, k_lo, k_hi = _split_unit(u, tiles, splits, num_k)
        pm, pn = tile_lib.swizzle(tile, num_m, num_n, GROUP_M)
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
        pm, pn = tile_lib.swizzle(tile, num_m, num_n, GROUP_M)
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
    pm, pn = tile_lib.swizzle(t, num_m, num_n, GROUP_M)
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
        return [cfg.bm, cfg.bn, cfg.bk, cfg.gm, a_kmajor, b_kmajor, has_c, splitk]
    return [cfg.bm, cfg.bn, cfg.nh, cfg.gm, sb_rows, cfg.fast_acc, cfg.scale_tma, splitk]


#: Rows per split-K reduce CTA: a (32, TN) fp32 sum, four CTAs per 128-row tile.
REDUCE_ROWS = 32


def reduce_rows(cfg: heuristics.DenseConfig) -> int:
    """Rows per reduce CTA for ``cfg``'s tiles."""
    return min(cfg.bm, REDUCE_ROWS)


def reduce_constants(cfg: heuristics.DenseConfig, *, has_c: bool = False) -> list[Any]:
    """The ``ct.Constant`` arguments of the split-K reduce kernel for ``cfg``."""
    return [cfg.bm, cfg.bn, cfg.gm, has_c, reduce_rows(cfg)]


# --------------------------------------------------------------------------- host side
#
# A call builds a launch plan once per (op, layout, operand shapes/strides/dtypes/alignment,
# epilogue, config, SM count): the config, grid, kernel object, constant arguments and how each
# operand reaches the kernel (``launch.cached_plan``). A repeated call only looks its plan up and
# launches: no heuristics, no allocations (split-K workspaces and counters are cached per device and
# stream), no views.

Runner = launch.Runner


def _logical(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The operand as its logical [rows, K] matrix (a view)."""
    return x.t() if transposed else x


def _transpose(x: torch.Tensor) -> torch.Tensor:
    return x.t()


def _operand_fn(x: torch.Tensor, transposed: bool, need_kmajor: bool) -> tuple[Callable | None, bool]:
    """How a stored operand reaches the kernel: ``(fn, kmajor)``, the kernel's array being ``fn(x)`` (``None``: ``x``).

    The logical [rows, K] matrix is used when TMA can read it (K-major), else its [K, rows]
    storage (not when ``need_kmajor``), else an aligned K-major copy is made per call.
    """
    lx = _logical(x, transposed)
    if launch.tma_ready(lx):
        return (_transpose if transposed else None), True
    if not need_kmajor and launch.tma_ready(lx.t()):
        return (None if transposed else _transpose), False
    return (lambda t: launch.aligned_copy(_logical(t, transposed))), True


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


def _decode_runner(
    op: str,
    p: heuristics.Problem,
    cfg: heuristics.DecodeConfig,
    consts: Callable[[heuristics.DecodePlan, bool], list[Any]],
    operands: Callable[..., tuple],
    c_fn: Callable,
    has_c: bool,
) -> Runner:
    """The launch of a decode-size GEMM: one swap-AB kernel (split-K reduced inside it); without ``c`` and
    split-K, its lean entry point (no C, workspace or counter arguments)."""
    plan = heuristics.decode_plan(p, cfg)
    heuristics.print_once(op, (p.m, p.n, p.k), plan.summary)
    grid = plan.grid
    if not (has_c or plan.splitk):
        lean = decode.get_kernel(p.dtype, cfg, plan.bm, lean=True, occupancy=plan.occupancy)
        lean_tail = (p.k, *consts(plan, False)[:-2])

        def run_lean(a, b, d, c, alpha, beta):
            launch.launch(lean, grid, (*operands(a, b), d, float(alpha), *lean_tail))

        return run_lean
    kernel = decode.get_kernel(p.dtype, cfg, plan.bm, occupancy=plan.occupancy)
    tail = (p.k, plan.splits, plan.per, *consts(plan, plan.splitk))
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


def _narrow_runner(op: str, p: heuristics.Problem, cfg: heuristics.NarrowConfig, consts: list[Any], operands) -> Runner:
    """The launch of a narrow-tile decode GEMM (calls without ``c``): one kernel, no workspace."""
    if p.has_c:
        raise Unsupported(f"config {cfg.name}: the narrow-tile kernel has no c epilogue")
    heuristics.print_once(op, (p.m, p.n, p.k), cfg.summary(p.m, p.n))
    kernel = decode.get_narrow_kernel(p.dtype, cfg)
    grid = cfg.grid(p.m, p.n)
    tail = (p.k, *consts)

    def run(a, b, d, c, alpha, beta):
        launch.launch(kernel, grid, (*operands(a, b), d, float(alpha), *tail))

    return run


def _dense_runner(
    op: str,
    p: heuristics.Problem,
    cfg: heuristics.DenseConfig,
    consts: Callable[[bool], list[Any]],
    operands: Callable[..., list],
    c_fn: Callable,
    has_c: bool,
    c_in_reduce: bool = False,
) -> Runner:
    """The launch of the persistent-tile kernel (and the split-K reduce kernel when the plan splits tiles).

    ``c_in_reduce``: with a ``c``, every tile goes through the fp32 workspace so that the reduce
    kernel applies the epilogue (the FP8 kernel has no ``c`` epilogue).
    """
    plan = heuristics.split_plan(p, cfg)
    splitk = plan.splits > 1 or (c_in_reduce and has_c)
    grid = launch.persistent_grid(plan.units, cfg.ctas_per_sm, p.sms)
    heuristics.print_once(op, (p.m, p.n, p.k), f"{cfg.name} grid={grid} split={plan.splits}")
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


def _has_c(c: torch.Tensor | None, beta: float) -> bool:
    return c is not None and beta != 0


def bf16_gemm(
    layout: str,
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    c,
    alpha,
    beta,
    config: heuristics.DenseConfig | heuristics.DecodeConfig | heuristics.NarrowConfig | None = None,
) -> torch.Tensor:
    """BF16 GEMM ``d = alpha * op(a) @ op(b) + beta * c`` for ``layout`` in nt/nn/tn/tt (see ops/api.py).

    ``config`` overrides the heuristic choice (benchmarks, tests): a ``DenseConfig`` forces the
    persistent-tile kernel, a ``DecodeConfig`` the swap-AB decode kernel, a ``NarrowConfig`` the narrow-tile
    decode kernel (calls without ``c`` only).
    """
    bf16_plan(layout, a, b, d, c if _has_c(c, beta) else None, config)(a, b, d, c, alpha, beta)
    return d


def bf16_plan(layout: str, a, b, d, c, config=None) -> Runner:
    """The cached launch plan of a BF16 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta)``."""
    tk = launch.tensor_key
    variant = heuristics.variant("dense")
    key = ("bf16", layout, tk(a), tk(b), tk(d), None if c is None else tk(c), config, variant, launch.sms_key(d.device))
    return launch.cached_plan(key, _bf16_plan, layout, a, b, d, c, config, variant)


def _bf16_plan(layout: str, a, b, d, c, config, variant: str | None) -> Runner:
    """Build the launch plan of a BF16 call (see :func:`bf16_gemm`)."""
    m, n, k, trivial = _plan_dims(layout, a, b, d)
    if trivial is not None:
        return trivial
    op, p, cfg, (fa, a_kmajor), (fb, b_kmajor), c_fn = _prepare("bf16", layout, a, b, d, c, config, variant, m, n, k)
    has_c = c is not None
    if cfg.path == "narrow":
        consts = decode.narrow_constants("bf16", cfg, a_kmajor=a_kmajor, b_kmajor=b_kmajor, sb_rows=False)
        return _narrow_runner(op, p, cfg, consts, lambda a, b: (_apply(fa, a), _apply(fb, b)))
    if cfg.path == "decode":

        def dconsts(plan: heuristics.DecodePlan, splitk: bool) -> list[Any]:
            return decode.bf16_constants(plan, a_kmajor=a_kmajor, b_kmajor=b_kmajor, has_c=has_c, splitk=splitk)

        if fa is None and fb is None:
            operands = _swap_pair
        else:
            operands = lambda a, b: (_apply(fb, b), _apply(fa, a))  # noqa: E731
        return _decode_runner(op, p, cfg, dconsts, operands, c_fn, has_c)

    def consts(splitk: bool) -> list[Any]:
        return kernel_constants(cfg, a_kmajor=a_kmajor, b_kmajor=b_kmajor, has_c=has_c, splitk=splitk)

    return _dense_runner(op, p, cfg, consts, lambda a, b: (_apply(fa, a), _apply(fb, b)), c_fn, has_c)


def _plan_dims(layout: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> tuple[int, int, int, Runner | None]:
    """``(M, N, K, trivial)`` of a dense call stored in ``layout``: ``trivial`` is the plan of an empty
    problem (else ``None``); a non-contiguous ``d`` of a non-trivial call is ``Unsupported``."""
    la = _logical(a, layout[0] == "t")  # [M, K]
    lb = _logical(b, layout[1] == "n")  # [N, K]
    (m, k), n = la.shape, lb.shape[0]
    trivial = _trivial_plan(m, n, k)
    if trivial is None and not d.is_contiguous():
        raise Unsupported("d must be contiguous")
    return m, n, k, trivial


def _prepare(dtype: str, layout: str, a, b, d, c, config, variant: str | None, m: int, n: int, k: int) -> tuple:
    """What a dense plan starts from: ``(op, problem, config, (fa, a_kmajor), (fb, b_kmajor), c_fn)``.

    The config is ``config`` when forced, else the heuristics' choice (under ``variant``, what
    ``$TILEGEMM_DECODE_VARIANT`` forced when the plan's key was taken); ``fa``/``fb`` and ``c_fn`` as
    :func:`_operand_fn` and :func:`_addend_fn` give them (FP8 operands must reach the kernel K-major).
    """
    need_kmajor = dtype == "fp8"
    fa = _operand_fn(a, layout[0] == "t", need_kmajor)
    fb = _operand_fn(b, layout[1] == "n", need_kmajor)
    p = heuristics.Problem("dense", dtype, m, n, k, launch.num_sms(), has_c=c is not None, variant=variant)
    return f"{dtype}_gemm_{layout}", p, config or heuristics.choose(p), fa, fb, _addend_fn(d, c)


def _swap_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return b, a


def _mn_major_scales(s: torch.Tensor) -> torch.Tensor:
    """[rows, KB] fp32 scales as the [KB, rows] row-major array the kernel reads (zero-copy when MN-major)."""
    return launch.as_row_major(s.t())


def fp8_gemm(
    layout: str,
    a,
    b,
    d: torch.Tensor,
    c,
    alpha,
    beta,
    recipe,
    config: heuristics.DenseConfig | heuristics.DecodeConfig | heuristics.NarrowConfig | None = None,
) -> torch.Tensor:
    """FP8 block-scaled GEMM for ``layout`` in nt/nn/tn/tt (see ops/api.py); operands are (fp8, fp32 scales).

    ``a``/``b`` data are stored in ``layout``; their scales are logical (sa [M, K/128], sb [N/128, K/128]
    or [N, K/128]) and ``recipe`` is resolved (the checks do both). Non-K-major operands are copied to
    K-major (Hopper FP8 MMAs read K-major data only). ``config`` as in :func:`bf16_gemm`.
    """
    fp8_plan(layout, a, b, d, c if _has_c(c, beta) else None, recipe, config)(a, b, d, c, alpha, beta)
    return d


def fp8_plan(layout: str, a, b, d, c, recipe, config=None) -> Runner:
    """The cached launch plan of an FP8 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta)``."""
    (a_data, sa), (b_data, sb) = a, b
    tk = launch.tensor_key
    variant = heuristics.variant("dense")
    key = (
        "fp8",
        layout,
        tk(a_data),
        tk(sa),
        tk(b_data),
        tk(sb),
        tk(d),
        None if c is None else tk(c),
        None if recipe is None else tuple(recipe),
        config,
        variant,
        launch.sms_key(d.device),
    )
    return launch.cached_plan(key, _fp8_plan, layout, a_data, sa, b_data, sb, d, c, recipe, config, variant)


def _fp8_plan(layout: str, a_data, sa, b_data, sb, d, c, recipe, config, variant: str | None) -> Runner:
    """Build the launch plan of an FP8 call (see :func:`fp8_gemm`)."""
    m, n, k, trivial = _plan_dims(layout, a_data, b_data, d)
    if trivial is not None:
        return trivial
    sb_rows = tuple(recipe) == (1, 1, 128)
    op, p, cfg, (fa, _), (fb, _), c_fn = _prepare("fp8", layout, a_data, b_data, d, c, config, variant, m, n, k)
    has_c = c is not None
    to_f32 = sa.dtype != torch.float32
    if cfg.path == "narrow":
        inside = decode.narrow_scales_inside(cfg, m, n, sb_rows)
        consts = decode.narrow_constants("fp8", cfg, a_kmajor=True, b_kmajor=True, sb_rows=sb_rows, inside=inside)
        if not sb_rows and 128 % cfg.bn != 0:
            raise Unsupported(f"config {cfg.name}: 128x128 weight scales need a weight tile that divides 128")

        def narrow_operands(a, b):
            return (_apply(fa, a[0]), _apply(fb, b[0]), a[1].to(torch.float32) if to_f32 else a[1], b[1])

        return _narrow_runner(op, p, cfg, consts, narrow_operands)
    if cfg.path == "decode":

        def dconsts(plan: heuristics.DecodePlan, splitk: bool) -> list[Any]:
            inside = decode.swap_scales_inside(plan, m, n, k, sb_rows)
            return decode.fp8_constants(plan, sb_rows=sb_rows, has_c=has_c, splitk=splitk, inside=inside)

        if fa is None and fb is None and not to_f32:
            operands = _fp8_swap
        else:

            def operands(a, b):
                sa_arr = a[1].to(torch.float32) if to_f32 else a[1]
                return (_apply(fb, b[0]), _apply(fa, a[0]), b[1], sa_arr)

        return _decode_runner(op, p, cfg, dconsts, operands, c_fn, has_c)
    if not sb_rows and cfg.bn // cfg.nh != 128:
        raise Unsupported(f"config {cfg.name}: 128x128 RHS scales need 128-wide N parts")

    def consts(splitk: bool) -> list[Any]:
        return kernel_constants(cfg, sb_rows=sb_rows, splitk=splitk)

    def operands(a, b):
        arr_sa = _mn_major_scales(a[1].to(torch.float32))
        arr_sb = _mn_major_scales(b[1]) if sb_rows else b[1].contiguous()
        return (_apply(fa, a[0]), _apply(fb, b[0]), arr_sa, arr_sb)

    return _dense_runner(op, p, cfg, consts, operands, c_fn, has_c, c_in_reduce=True)


def _fp8_swap(a, b) -> tuple:
    return b[0], a[0], b[1], a[1]


# --------------------------------------------------------------------------- registration


def _bf16_gemm(a, b, d, c, alpha, beta, stream):
    """cuTile BF16 GEMM of any layout, in the logical ``nt`` form the checks derive (a [M, K], b [N, K] views)."""
    return bf16_gemm("nt", a, b, d, c, alpha, beta)


def _fp8_gemm(a, b, d, c, recipe, alpha, beta, stream):
    """cuTile FP8 GEMM of any layout, in the logical ``nt`` form (data and scales transposed together)."""
    return fp8_gemm("nt", a, b, d, c, alpha, beta, recipe)


def _replay(plan: Runner) -> Callable[..., torch.Tensor]:
    """The hot-lane replay of a dense call whose plan is ``plan`` (operands in the logical ``nt`` form)."""

    def replay(a, b, d, c, alpha, beta) -> torch.Tensor:
        plan(a, b, d, c, alpha, beta)
        return d

    return replay


def _bf16_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor]:
    a, b, d, c, beta = (derived[key] for key in ("a", "b", "d", "c", "beta"))
    return _replay(bf16_plan("nt", a, b, d, c if _has_c(c, beta) else None))


def _fp8_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor]:
    a, b, d, c, beta, recipe = (derived[key] for key in ("a", "b", "d", "c", "beta", "recipe"))
    return _replay(fp8_plan("nt", a, b, d, c if _has_c(c, beta) else None, recipe))


@register_impl("fp8_gemm_nt_skip_head_mid", "cutile")
def _fp8_gemm_skip_head_mid(a, b, d, head_splits, recipe, stream):
    """The FP8 ``nt`` GEMM into a temporary [M, N] of ``d``'s dtype, then placed around each head's gap."""
    out = torch.empty(a[0].shape[0], b[0].shape[0], dtype=d.dtype, device=d.device)
    fp8_gemm("nt", a, b, out, None, 1.0, 0.0, recipe)
    return write_head_splits(d, out, head_splits)


for _op in ("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt"):
    register_impl(_op, "cutile")(_bf16_gemm)
    register_replay(_op, "cutile")(_bf16_replay)
for _op in ("fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt"):
    register_impl(_op, "cutile")(_fp8_gemm)
    register_replay(_op, "cutile")(_fp8_replay)
del _op
