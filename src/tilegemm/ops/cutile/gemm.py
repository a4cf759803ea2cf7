"""cuTile dense GEMMs, host side: ``bf16_gemm_{nt,nn,tn,tt}`` and ``fp8_gemm_{nt,nn,tn,tt}`` (block-scaled).

One host function per dtype (:func:`bf16_gemm`, :func:`fp8_gemm`, the registered implementations): problem ->
config (:mod:`tilegemm.heuristics.cutile`) -> how each operand reaches the kernel -> kernel, grid and constants (a
plan, kept in :mod:`tilegemm.ops.plans`) -> launch on the given stream. The kernels: the persistent-tile and split-K
reduce kernels in :mod:`tilegemm.ops.cutile.gemm_kernels`, the swap-AB decode and narrow-tile kernels in
:mod:`tilegemm.ops.cutile.decode`; ``cfg.path`` names the family a config runs. Measurements and SASS findings:
``docs/kernels.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops import plans
from tilegemm.ops.common import write_head_splits
from tilegemm.ops.cutile import decode, launch
from tilegemm.ops.cutile.gemm_kernels import (
    get_kernel,
    get_reduce_kernel,
    kernel_constants,
    reduce_constants,
    reduce_rows,
)

# --------------------------------------------------------------------------- host side
#
# Operands arrive in the logical ``nt`` form the checks derive: a [M, K] and b [N, K] views (FP8: with their scales
# sa [M, K/128] and sb [N/128, K/128] or [N, K/128]). One host function per dtype, DeepGEMM's shape:
#
#     bf16_gemm / fp8_gemm (the registered implementation, named arguments)
#       -> bf16_plan / fp8_plan: the key; the kept plan, or _plan: problem -> config -> operands -> kernel, grid,
#          constants (one builder per kernel family the config names: _narrow_plan, _decode_plan, _tile_plan)
#       -> run(a, b, d, c, alpha, beta, stream) -> launch.launch(kernel, grid, args, stream)
#
# A repeated call only looks its plan up and launches: no heuristics, no allocations (split-K workspaces and
# counters are cached per device and stream), no views. A plan is also the op's hot-lane replay.

Runner = plans.Runner


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
    c_fn: Callable[[torch.Tensor, Any], torch.Tensor]
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
        return lambda a, b, d, c, alpha, beta, stream=None: d
    if k == 0:
        return lambda a, b, d, c, alpha, beta, stream=None: _empty_k(d, c, beta)
    return None


def _stream_buffers(d: torch.Tensor, handle: int, ws_elems: int, ws_shape: tuple, cnt_elems: int) -> tuple:
    """The (fp32 workspace view, int32 counters view) a plan's kernel uses on stream ``handle``."""
    ws = launch.scratch(d.device, handle, torch.float32, max(1, ws_elems))
    cnt = launch.scratch(d.device, handle, torch.int32, max(1, cnt_elems))
    return ws[: max(1, ws_elems)].view(ws_shape), cnt[: max(1, cnt_elems)]


def _has_c(c: torch.Tensor | None, beta: float) -> bool:
    return c is not None and beta != 0


def bf16_gemm(a, b, d, c=None, *, alpha=1.0, beta=1.0, stream=None, config=None) -> torch.Tensor:
    """cuTile BF16 GEMM ``d = alpha * a @ b.T + beta * c`` of any layout, on the logical ``nt`` form the checks derive
    (a [M, K], b [N, K] views of any storage order; see ops/api/), launched on ``stream`` (``None``: the current one).

    ``config`` overrides the heuristic choice (benchmarks, tests): a ``DenseConfig`` forces the
    persistent-tile kernel, a ``DecodeConfig`` the swap-AB decode kernel, a ``NarrowConfig`` the narrow-tile
    decode kernel (calls without ``c`` only).
    """
    return bf16_plan(a, b, d, c if _has_c(c, beta) else None, config)(a, b, d, c, alpha, beta, stream)


def bf16_plan(a, b, d, c, config=None) -> Runner:
    """The launch plan of a BF16 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta, stream=None)
    -> d``, kept in :mod:`tilegemm.ops.plans`."""
    tk, variant = plans.tensor_key, heuristics.variant("dense")
    key = (
        "cutile", "bf16_gemm", tk(a), tk(b), tk(d), None if c is None else tk(c), config, variant,
        plans.sms_key(d.device),
    )  # fmt: skip
    run = plans.find(key)
    if run is None:
        run = plans.keep(key, _plan("bf16", a, None, b, None, d, c, None, config, variant))
    return run


def fp8_gemm(a, b, d, c=None, *, recipe, alpha=1.0, beta=1.0, stream=None, config=None) -> torch.Tensor:
    """cuTile FP8 block-scaled GEMM of any layout, on the logical ``nt`` form (see ops/api/; data and scales
    transposed together), launched on ``stream`` (``None``: the current one). Operands are (fp8, fp32 scales): a
    [M, K] with sa [M, K/128], b [N, K] with sb [N/128, K/128] or [N, K/128]; ``recipe`` resolved (the checks do
    both). Operands that are not K-major are copied to K-major (Hopper FP8 MMAs read K-major data only).
    ``config`` as in :func:`bf16_gemm`.
    """
    return fp8_plan(a, b, d, c if _has_c(c, beta) else None, recipe, config)(a, b, d, c, alpha, beta, stream)


def fp8_plan(a, b, d, c, recipe, config=None) -> Runner:
    """The launch plan of an FP8 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta,
    stream=None) -> d``, kept in :mod:`tilegemm.ops.plans`."""
    (a_data, sa), (b_data, sb) = a, b
    tk, variant = plans.tensor_key, heuristics.variant("dense")
    recipe = None if recipe is None else tuple(recipe)
    key = (
        "cutile", "fp8_gemm", tk(a_data), tk(sa), tk(b_data), tk(sb), tk(d), None if c is None else tk(c), recipe,
        config, variant, plans.sms_key(d.device),
    )  # fmt: skip
    run = plans.find(key)
    if run is None:
        run = plans.keep(key, _plan("fp8", a_data, sa, b_data, sb, d, c, recipe, config, variant))
    return run


def _plan(dtype: str, a, sa, b, sb, d, c, recipe, config, variant: str | None) -> Runner:
    """Build the plan of a ``dtype`` call: the trivial plan of an empty problem, else problem -> config (``config``
    when forced, else the heuristics' choice under ``variant``) -> how each operand reaches the kernel -> the plan of
    the kernel family the config names (``cfg.path``)."""
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
    if cfg.path == "narrow":
        return _narrow_plan(call)
    if cfg.path == "decode":
        return _decode_plan(call)
    if cfg.path == "tile":
        return _tile_plan(call)
    raise ValueError(f"config {cfg.name}: no dense kernel family {cfg.path!r}")


def _narrow_plan(call: _Call) -> Runner:
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

    def run(a, b, d, c, alpha, beta, stream=None):
        launch.launch(kernel, grid, (*operands(a, b), d, float(alpha), *tail), stream)
        return d

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


def _decode_plan(call: _Call) -> Runner:
    """A decode-size GEMM: one swap-AB kernel (split-K reduced inside it); without ``c`` and split-K, its lean
    entry point (no C, workspace or counter arguments)."""
    p, cfg, c_fn, has_c = call.p, call.cfg, call.c_fn, call.p.has_c
    plan = heuristics.decode_plan(p, cfg)
    heuristics.print_once(call.op, (p.m, p.n, p.k), plan.summary)
    grid, operands = plan.grid, _decode_operands(call)
    if not (has_c or plan.splitk):
        lean = decode.get_kernel(p.dtype, cfg, plan.bm, lean=True, occupancy=plan.occupancy)
        lean_tail = (p.k, *_decode_constants(call, plan, False, lean=True))

        def run_lean(a, b, d, c, alpha, beta, stream=None):
            launch.launch(lean, grid, (*operands(a, b), d, float(alpha), *lean_tail), stream)
            return d

        return run_lean
    kernel = decode.get_kernel(p.dtype, cfg, plan.bm, occupancy=plan.occupancy)
    tail = (p.k, plan.splits, plan.per, *_decode_constants(call, plan, plan.splitk))
    ws_shape = (plan.splits * plan.tiles, cfg.bw, plan.bm) if plan.splitk else (1, 1, 1)
    per_stream: dict[int, tuple] = {}

    def run(a, b, d, c, alpha, beta, stream=None):
        stream = launch.current_stream() if stream is None else stream
        bufs = per_stream.get(stream.cuda_stream)
        if bufs is None:
            bufs = per_stream[stream.cuda_stream] = _stream_buffers(
                d, stream.cuda_stream, plan.workspace_elems, ws_shape, plan.tiles
            )
        args = (*operands(a, b), d, c_fn(d, c), *bufs, float(alpha), float(beta), *tail)
        launch.launch(kernel, grid, args, stream)
        return d

    return run


def _tile_plan(call: _Call) -> Runner:
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

    def run(a, b, d, c, alpha, beta, stream=None):
        stream = launch.current_stream() if stream is None else stream
        bufs = per_stream.get(stream.cuda_stream)
        if bufs is None:
            bufs = per_stream[stream.cuda_stream] = _stream_buffers(d, stream.cuda_stream, ws_elems, ws_shape, 1)
        work = bufs[0]  # not read without split-K
        c_arg = c_fn(d, c)
        alpha, beta = float(alpha), float(beta)
        launch.launch(kernel, grid, (*operands(a, b), d, c_arg, work, alpha, beta, *main_tail), stream)
        if splitk:
            launch.launch(get_reduce_kernel(), red_grid, (work, d, c_arg, alpha, beta, *red_tail), stream)
        return d

    return run


def _swap_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return b, a


def _fp8_swap(a, b) -> tuple:
    return b[0], a[0], b[1], a[1]


def _mn_major_scales(s: torch.Tensor) -> torch.Tensor:
    """[rows, KB] fp32 scales as the [KB, rows] row-major array the kernel reads (zero-copy when MN-major)."""
    return launch.as_row_major(s.t())


# --------------------------------------------------------------------------- registration


def _bf16_replay(derived: dict[str, Any]) -> Runner:
    """The hot-lane replay of a BF16 call that ran here: its plan, ``run(a, b, d, c, alpha, beta) -> d``."""
    a, b, d, c, beta = (derived[key] for key in ("a", "b", "d", "c", "beta"))
    return bf16_plan(a, b, d, c if _has_c(c, beta) else None)


def _fp8_replay(derived: dict[str, Any]) -> Runner:
    """The hot-lane replay of an FP8 call that ran here: its plan, ``run(a, b, d, c, alpha, beta) -> d``."""
    a, b, d, c, beta, recipe = (derived[key] for key in ("a", "b", "d", "c", "beta", "recipe"))
    return fp8_plan(a, b, d, c if _has_c(c, beta) else None, recipe)


@register_impl("fp8_gemm_nt_skip_head_mid", "cutile")
def _fp8_gemm_skip_head_mid(a, b, d, head_splits, recipe, stream):
    """The FP8 ``nt`` GEMM into a temporary [M, N] of ``d``'s dtype, then placed around each head's gap."""
    out = torch.empty(a[0].shape[0], b[0].shape[0], dtype=d.dtype, device=d.device)
    fp8_gemm(a, b, out, recipe=recipe, alpha=1.0, beta=0.0, stream=stream)
    return write_head_splits(d, out, head_splits)


for _op in ("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt"):
    register_impl(_op, "cutile")(bf16_gemm)
    register_replay(_op, "cutile")(_bf16_replay)
for _op in ("fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt"):
    register_impl(_op, "cutile")(fp8_gemm)
    register_replay(_op, "cutile")(_fp8_replay)
del _op
