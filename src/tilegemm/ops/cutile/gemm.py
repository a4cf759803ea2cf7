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
:mod:`tilegemm.ops.cutile.heuristics`; host-side launch helpers in :mod:`tilegemm.ops.cutile.launch`.
Measurements and SASS findings: ``notes/dense.md``.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.ops.common import write_head_splits
from tilegemm.ops.cutile import heuristics, launch

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO

# ------------------------------------------------------------------------------- kernels


def _tile_coords(tile, num_m, num_n, GROUP_M: ConstInt):
    """Grouped (swizzled) order: GROUP_M row-tiles share each column sweep, so B stays in L2."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = ct.minimum(num_m - first_m, GROUP_M)
    local = tile % per_group
    return first_m + local % rows, local // rows


def _num_units(tiles, full, splits, SPLITK: ConstBool):
    """Work units of a launch: one per tile, or with ``SPLITK`` the tiles from ``full`` on cut ``splits`` ways."""
    units = tiles
    if SPLITK:
        units = full + (tiles - full) * splits
    return units


def _work_unit(u, tiles, full, splits, num_k, SPLITK: ConstBool):
    """Work unit ``u`` -> (output tile, first K block, end K block).

    Units below ``full`` are whole tiles; with ``SPLITK`` the tiles from ``full`` on are each cut into
    ``splits`` K ranges, unit ``full + s * (tiles - full) + i`` being range ``s`` of tile ``full + i``.
    """
    tile = u
    k_lo = 0
    k_hi = num_k
    if SPLITK:
        if u >= full:
            v = u - full
            tile = full + v % (tiles - full)
            per = ct.cdiv(num_k, splits)
            k_lo = (v // (tiles - full)) * per
            k_hi = ct.minimum(num_k, k_lo + per)
    return tile, k_lo, k_hi


def _bf16_gemm_body(
    A,
    B,
    D,
    C,
    W,
    alpha: float,
    beta: float,
    K: int,
    full: int,
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

    Work units: output tiles ``0..full-1`` whole; with SPLITK the remaining tiles are split in
    ``splits`` K ranges whose fp32 partial sums go to ``W[split, tile - full]`` (summed in order
    by the reduce kernel, so results are deterministic).
    """
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    num_k = ct.cdiv(K, TK)
    tiles = num_m * num_n
    for u in range(ct.bid(0), _num_units(tiles, full, splits, SPLITK), ct.num_blocks(0)):
        tile, k_lo, k_hi = _work_unit(u, tiles, full, splits, num_k, SPLITK)
        pm, pn = _tile_coords(tile, num_m, num_n, GROUP_M)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for kb in range(k_lo, k_hi):
            if A_KMAJOR:
                a = ct.load(A, (pm, kb), (TM, TK), padding_mode=_ZERO)
            else:
                a = ct.load(A, (pm, kb), (TM, TK), order=(1, 0), padding_mode=_ZERO)
            if B_KMAJOR:
                b = ct.load(B, (kb, pn), (TK, TN), order=(1, 0), padding_mode=_ZERO)
            else:
                b = ct.load(B, (kb, pn), (TK, TN), padding_mode=_ZERO)
            acc = ct.mma(a, b, acc)
        _finish(D, C, W, acc, u, full, tiles, pm, pn, 0, alpha, beta, HAS_C, SPLITK)


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
    full: int,
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
    for u in range(ct.bid(0), _num_units(tiles, full, splits, SPLITK), ct.num_blocks(0)):
        tile, k_lo, k_hi = _work_unit(u, tiles, full, splits, num_k, SPLITK)
        pm, pn = _tile_coords(tile, num_m, num_n, GROUP_M)
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
        _finish(D, C, W, acc0, u, full, tiles, pm, pn * NH, 0, alpha, beta, False, SPLITK)
        if NH == 2:
            if (pn * NH + 1) * HN < D.shape[1]:
                _finish(D, C, W, acc1, u, full, tiles, pm, pn * NH + 1, 1, alpha, beta, False, SPLITK)


def _finish(D, C, W, acc, u, full, tiles, pm, jn, h: ConstInt, alpha, beta, HAS_C: ConstBool, SPLITK: ConstBool):
    """Write accumulator (column part ``h``) of unit ``u``: to the split-K workspace for a split unit,
    else through the epilogue to D."""
    if SPLITK:
        if u >= full:
            v = u - full
            shape = (1, 1, acc.shape[0], acc.shape[1])
            ct.store(W, (v // (tiles - full), v % (tiles - full), 0, h), ct.reshape(acc, shape))
        else:
            _epilogue(D, C, acc, pm, jn, alpha, beta, HAS_C)
    else:
        _epilogue(D, C, acc, pm, jn, alpha, beta, HAS_C)


def _fp8_part(a, sa, B, SB, acc, kb, jn, HN: ConstInt, SB_ROWS: ConstBool, FAST_ACC: ConstBool, SCALE_TMA: ConstBool):
    """acc + (a @ B[jn-th HN-column block, kb].T) * sa * sb: one K block of one column part."""
    b = ct.load(B, (kb, jn), (128, HN), order=(1, 0), padding_mode=_ZERO)
    if SB_ROWS:
        sb = ct.load(SB, (kb, jn), (1, HN), padding_mode=_ZERO, allow_tma=SCALE_TMA)
    else:
        sb = ct.load(SB, (jn, kb), (1, 1), padding_mode=_ZERO, allow_tma=SCALE_TMA)
    p = ct.mma(a, b, ct.zeros(acc.shape, dtype=ct.float32), use_fast_acc=FAST_ACC)
    return acc + p * (sa * sb)


def _splitk_reduce_body(
    W,
    D,
    C,
    alpha: float,
    beta: float,
    full: int,
    TM: ConstInt,
    TN: ConstInt,
    GROUP_M: ConstInt,
    HAS_C: ConstBool,
    SP: ConstInt,
    RM: ConstInt,
):
    """Sum split-K partials: CTA ``bid`` takes RM rows of split tile ``full + bid // (TM // RM)``.

    It loads the rows of all splits at once as one (SP, RM, TN) tile (SP >= splits, the
    missing splits read as zeros) and reduces over the split axis with a fixed tree, so the
    result is deterministic; then the epilogue (alpha, beta * C, rounding) for those rows.
    """
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    t = ct.bid(0) // (TM // RM)
    r = ct.bid(0) % (TM // RM)
    pm, pn = _tile_coords(full + t, num_m, num_n, GROUP_M)
    row = pm * (TM // RM) + r
    if row * RM < D.shape[0]:  # rows wholly past M: nothing to write (and a store there is undefined)
        parts = ct.load(W, (0, t, r, 0), (SP, 1, RM, TN), padding_mode=_ZERO)
        acc = ct.sum(ct.reshape(parts, (SP, RM, TN)), axis=0)
        _epilogue(D, C, acc, row, pn, alpha, beta, HAS_C)


@functools.cache
def get_kernel(cfg: heuristics.DenseConfig) -> Any:
    """The ``@ct.kernel`` for ``cfg`` (its compiler hints applied), built once per config."""
    body = _bf16_gemm_body if cfg.kind == "bf16" else _fp8_gemm_body
    return ct.kernel(body, **cfg.compiler_options())


@functools.cache
def get_reduce_kernel() -> Any:
    """The split-K reduce kernel (one CTA per split tile)."""
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
    if cfg.kind == "bf16":
        return [cfg.tm, cfg.tn, cfg.tk, cfg.group_m, a_kmajor, b_kmajor, has_c, splitk]
    return [cfg.tm, cfg.tn, cfg.nh, cfg.group_m, sb_rows, cfg.fast_acc, cfg.scale_tma, splitk]


def reduce_rows(cfg: heuristics.DenseConfig) -> int:
    """Rows per reduce CTA: its (MAX_SPLITS, rows, TN) fp32 tile stays at 8192 elements (64 registers a thread)."""
    return max(1, min(cfg.tm, 8192 // (heuristics.MAX_SPLITS * cfg.tn)))


def reduce_constants(cfg: heuristics.DenseConfig, *, has_c: bool = False) -> list[Any]:
    """The ``ct.Constant`` arguments of the split-K reduce kernel for ``cfg``."""
    return [cfg.tm, cfg.tn, cfg.group_m, has_c, heuristics.MAX_SPLITS, reduce_rows(cfg)]


# --------------------------------------------------------------------------- host side

_FP8 = torch.float8_e4m3fn


def _logical(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The operand as its logical [rows, K] matrix (a view)."""
    return x.t() if transposed else x


def _orient(x: torch.Tensor, need_kmajor: bool) -> tuple[torch.Tensor, bool]:
    """Array + K-major flag for a logical [rows, K] operand, copying only when TMA could not take it.

    Returns ``(x, True)`` for a TMA-ready row-major [rows, K] array, ``(x.t(), False)`` for a
    TMA-ready [K, rows] storage (not when ``need_kmajor``), else an aligned K-major copy.
    """
    if launch.tma_ready(x):
        return x, True
    if not need_kmajor and launch.tma_ready(x.t()):
        return x.t(), False
    return launch.aligned_copy(x), True


def _addend(d: torch.Tensor, c: torch.Tensor | None, beta: float) -> torch.Tensor | None:
    """``c`` as the kernel reads it (row-major, or ``None`` when it is not read)."""
    if c is None or beta == 0:
        return None
    if c.data_ptr() == d.data_ptr() and c.stride() == d.stride():
        return d
    return launch.as_row_major(c)


def _empty_k(d: torch.Tensor, c: torch.Tensor | None, beta: float) -> torch.Tensor:
    """K == 0: ``d = beta * c`` (or zeros) without a kernel."""
    if c is None or beta == 0:
        return d.zero_()
    d.copy_((c.to(torch.float32) * beta).to(d.dtype))
    return d


def _launch_dense(
    op: str,
    cfg: heuristics.DenseConfig,
    m: int,
    n: int,
    k: int,
    operands: list[Any],
    d: torch.Tensor,
    cc: torch.Tensor | None,
    alpha: float,
    beta: float,
    constants: Any,
    c_in_reduce: bool = False,
) -> None:
    """Launch ``cfg``'s kernel (and the split-K reduce when the plan splits tiles).

    ``operands``: the kernel's leading array arguments; ``constants(splitk)`` its ``ct.Constant``
    tail. ``c_in_reduce``: with a ``c``, send every tile through the fp32 workspace so that the
    reduce kernel applies the epilogue (the FP8 kernel has no ``c`` epilogue).
    """
    sms = launch.num_sms()
    plan = heuristics.split_plan(cfg, m, n, k, sms)
    if c_in_reduce and cc is not None:
        plan = heuristics.SplitPlan(plan.tiles, 0, plan.splits if plan.full == 0 else 1)
    splitk = plan.splits > 1 or plan.full < plan.tiles
    tail = plan.tiles - plan.full
    if splitk:
        work = torch.empty((plan.splits, tail, cfg.tm, cfg.tn), dtype=torch.float32, device=d.device)
    else:
        work = d.view(1, 1, m, n)  # not read: the kernel has no split-K code
    c_arg = d if cc is None else cc
    args = [*operands, d, c_arg, work, float(alpha), float(beta), k, plan.full, plan.splits, *constants(splitk)]
    grid = launch.persistent_grid(plan.units, sms * cfg.ctas_per_sm)
    heuristics.print_config(op, (m, n, k), cfg, grid, plan)
    launch.launch(get_kernel(cfg), grid, args)
    if splitk:
        red = [work, d, c_arg, float(alpha), float(beta), plan.full]
        grid = (tail * (cfg.tm // reduce_rows(cfg)), 1, 1)
        launch.launch(get_reduce_kernel(), grid, red + reduce_constants(cfg, has_c=cc is not None))


def bf16_gemm(
    layout: str,
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    c,
    alpha,
    beta,
    config: heuristics.DenseConfig | None = None,
) -> torch.Tensor:
    """BF16 GEMM ``d = alpha * op(a) @ op(b) + beta * c`` for ``layout`` in nt/nn/tn/tt (see ops/api.py).

    ``config`` overrides the heuristic choice (benchmarks, tests).
    """
    la = _logical(a, layout[0] == "t")  # [M, K]
    lb = _logical(b, layout[1] == "n")  # [N, K]
    m, k = la.shape
    n = lb.shape[0]
    if m == 0 or n == 0:
        return d
    if k == 0:
        return _empty_k(d, c, beta)
    if not d.is_contiguous():
        raise Unsupported("d must be contiguous")
    arr_a, a_kmajor = _orient(la, need_kmajor=False)
    arr_b, b_kmajor = _orient(lb, need_kmajor=False)
    cc = _addend(d, c, beta)
    cfg = config or heuristics.choose_dense_config("bf16", m, n, k, launch.num_sms())

    def consts(splitk: bool) -> list[Any]:
        return kernel_constants(cfg, a_kmajor=a_kmajor, b_kmajor=b_kmajor, has_c=cc is not None, splitk=splitk)

    _launch_dense(f"bf16_gemm_{layout}", cfg, m, n, k, [arr_a, arr_b], d, cc, alpha, beta, consts)
    return d


def _mn_major_scales(s: torch.Tensor) -> torch.Tensor:
    """[rows, KB] fp32 scales as the [KB, rows] row-major array the kernel reads (zero-copy when MN-major)."""
    st = s.t()
    return st if launch.tma_ready(st) else launch.aligned_copy(st)


def fp8_gemm(
    layout: str, a, b, d: torch.Tensor, c, alpha, beta, recipe, config: heuristics.DenseConfig | None = None
) -> torch.Tensor:
    """FP8 block-scaled GEMM for ``layout`` in nt/nn/tn/tt (see ops/api.py); operands are (fp8, fp32 scales).

    ``a``/``b`` data are stored in ``layout``; their scales are logical (sa [M, K/128], sb [N/128, K/128]
    or [N, K/128]) and ``recipe`` is resolved (the checks do both). Non-K-major operands are copied to
    K-major (Hopper FP8 MMAs read K-major data only).
    """
    a_data, sa = a
    b_data, sb = b
    la = _logical(a_data, layout[0] == "t")
    lb = _logical(b_data, layout[1] == "n")
    m, k = la.shape
    n = lb.shape[0]
    rec = tuple(recipe)
    if m == 0 or n == 0:
        return d
    if k == 0:
        return _empty_k(d, c, beta)
    if not d.is_contiguous():
        raise Unsupported("d must be contiguous")
    sb_rows = rec == (1, 1, 128)
    cfg = config or heuristics.choose_dense_config("fp8", m, n, k, launch.num_sms())
    if not sb_rows and cfg.tn // cfg.nh != 128:
        raise Unsupported(f"config {cfg.name}: 128x128 RHS scales need 128-wide N parts")
    arr_a, _ = _orient(la, need_kmajor=True)
    arr_b, _ = _orient(lb, need_kmajor=True)
    arr_sa = _mn_major_scales(sa.to(torch.float32))
    arr_sb = _mn_major_scales(sb) if sb_rows else sb.contiguous()
    cc = _addend(d, c, beta)

    def consts(splitk: bool) -> list[Any]:
        return kernel_constants(cfg, sb_rows=sb_rows, splitk=splitk)

    operands = [arr_a, arr_b, arr_sa, arr_sb]
    _launch_dense(f"fp8_gemm_{layout}", cfg, m, n, k, operands, d, cc, alpha, beta, consts, c_in_reduce=True)
    return d


# --------------------------------------------------------------------------- registration


def _bf16_gemm(a, b, d, c, alpha, beta, stream):
    """cuTile BF16 GEMM of any layout, in the logical ``nt`` form the checks derive (a [M, K], b [N, K] views)."""
    return bf16_gemm("nt", a, b, d, c, alpha, beta)


def _fp8_gemm(a, b, d, c, recipe, alpha, beta, stream):
    """cuTile FP8 GEMM of any layout, in the logical ``nt`` form (data and scales transposed together)."""
    return fp8_gemm("nt", a, b, d, c, alpha, beta, recipe)


@register_impl("fp8_gemm_nt_skip_head_mid", "cutile")
def _fp8_gemm_skip_head_mid(a, b, d, head_splits, recipe, stream):
    """The FP8 ``nt`` GEMM into a temporary [M, N] of ``d``'s dtype, then placed around each head's gap."""
    out = torch.empty(a[0].shape[0], b[0].shape[0], dtype=d.dtype, device=d.device)
    fp8_gemm("nt", a, b, out, None, 1.0, 0.0, recipe)
    return write_head_splits(d, out, head_splits)


for _layout in ("nt", "nn", "tn", "tt"):
    register_impl(f"bf16_gemm_{_layout}", "cutile")(_bf16_gemm)
    register_impl(f"fp8_fp4_gemm_{_layout}", "cutile")(_fp8_gemm)
del _layout
