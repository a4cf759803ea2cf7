"""Gluon dense GEMMs, host side: ``fp8_fp4_gemm_{nt,nn,tn,tt}`` and ``bf16_gemm_{nt,nn,tn,tt}`` on Hopper.

The checks hand every layout over in the logical ``nt`` form (a [M, K], b [N, K] views with their scales in
the same orientation). FP8 wgmma reads K-major operands only, so a view that is not K-major is copied to
K-major here, as the cutile backend does. Two kernels: the warp-specialized one (:mod:`fp8_gemm_ws`, design
:func:`tilegemm.heuristics.gluon.dense_fp8_ws_design`) runs DeepGEMM's recipe without an addend,
:func:`fp8_gemm_kernel.fp8_gemm_kernel` (config from :func:`tilegemm.heuristics.gluon.dense_fp8_config`) every
other call. The path, DeepGEMM's shape:

    fp8_gemm (the registered implementation, named arguments)
      -> fp8_plan: the kernel (takes_ws_kernel) and the key; the plan kept in tilegemm.ops.plans, or
         _build_ws_plan (fp8_gemm_ws.ws_plan) / _build_plan: problem -> config -> descriptors
      -> run(a, b, d, c, alpha, beta, stream): the first launch through triton's JIT, later ones to the compiled
         kernel's launcher (tma.Relaunch), on ``stream`` (the current one when ``None``)

The BF16 GEMMs run the BF16 ws kernel (:mod:`bf16_gemm_ws`, design
:func:`tilegemm.heuristics.gluon.dense_bf16_ws_design`) on the calls it computes as given
(:func:`tilegemm.heuristics.gluon.bf16_ws_takes`: no addend, ``alpha`` 1, K-major operands); it makes no copies:

    bf16_gemm -> bf16_plan (kept in tilegemm.ops.plans) or _build_bf16_plan (bf16_gemm_ws.bf16_ws_plan) -> run
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from tilegemm import config
from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics.gluon import (
    BLOCK_K,
    BLOCK_M,
    GluonDenseConfig,
    bf16_ws_takes,
    dense_bf16_ws_design,
    dense_fp8_config,
    dense_fp8_ws_design,
    fit_stages,
    takes_ws_kernel,
)
from tilegemm.heuristics.report import print_once
from tilegemm.ops import operands, plans
from tilegemm.ops.gluon import bf16_gemm_ws, fp8_gemm_kernel, fp8_gemm_ws
from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.gluon.tma import SCALE_LAYOUT, Relaunch, descriptor, tma_strides


def block_shapes(cfg: GluonDenseConfig, sb_rows: bool) -> dict[str, list[int]]:
    """The TMA box of each descriptor the kernel takes (A, B, their scales, D)."""
    return {
        "a": [BLOCK_M, BLOCK_K],
        "b": [cfg.block_n, BLOCK_K],
        "sa": [1, BLOCK_M],
        "sb": [1, cfg.block_n if sb_rows else fp8_gemm_kernel.SB_BOX.value],
        "d": [fp8_gemm_kernel.WG_ROWS, cfg.block_n],
    }


def constants(cfg: GluonDenseConfig, sb_rows: bool, has_c: bool) -> dict[str, Any]:
    """The kernel's constexpr arguments for ``cfg``."""
    return {
        "GROUP_M": cfg.group_m,
        "STAGES": cfg.stages,
        "SB_ROWS": sb_rows,
        "HAS_C": has_c,
        "ORDER": cfg.order,
        "LOADER_REGS": cfg.loader_regs,
        "MMA_REGS": cfg.mma_regs,
    }


def unsupported_reason(m: int, n: int, k: int, d: torch.Tensor) -> str | None:
    """Why the gluon FP8 kernel cannot run a call with these sizes and output, or ``None``."""
    if m == 0 or n == 0 or k == 0:
        return "an empty GEMM"
    if d.dtype not in (torch.bfloat16, torch.float32):
        return f"output dtype {d.dtype}"
    if not operands.tma_ready(d):
        return "the output is not TMA-aligned (row pitch a multiple of 16 bytes, 16-byte base)"
    return None


def fp8_gemm(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    recipe: tuple[int, int, int],
    alpha: float = 1.0,
    beta: float = 1.0,
    stream: torch.cuda.Stream | None = None,
    config: GluonDenseConfig | None = None,
) -> torch.Tensor:
    """``d = alpha * dequant(a) @ dequant(b).T (+ beta * c)`` on a gluon kernel: an FP8 GEMM of any layout, in the
    logical ``nt`` form the checks derive, launched on ``stream`` (``None``: the current one). The warp-specialized
    kernel (:mod:`fp8_gemm_ws`) runs the calls :func:`takes_ws_kernel` gives it, ``fp8_gemm_kernel`` the rest.

    Args:
        a: (fp8 [M, K], fp32 sa [M, ceil(K/128)]).
        b: (fp8 [N, K], fp32 sb [ceil(N/128), ceil(K/128)] for ``recipe`` (1, 128, 128), or [N, ceil(K/128)]
            for (1, 1, 128)).
        d: bf16 or fp32 [M, N], TMA-aligned (see :func:`unsupported_reason`).
        c: addend [M, N] read when not ``None`` and ``beta != 0``; may be ``d``.
        config: ``fp8_gemm_kernel``'s config (given: that kernel runs); ``None``: the kernel and config chosen from
            the call (:func:`takes_ws_kernel`, :func:`dense_fp8_config`).

    Raises:
        Unsupported: a case the kernel lacks (before anything is written).
    """
    return fp8_plan(a, b, d, c if c is not None and beta != 0 else None, recipe, config, alpha)(
        a, b, d, c, alpha, beta, stream
    )


Runner = plans.Runner


def fp8_plan(a, b, d, c, recipe, cfg: GluonDenseConfig | None = None, alpha: float = 1.0) -> Runner:
    """The launch plan of a call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta, stream=None)
    -> d``, kept in :mod:`tilegemm.ops.plans`.

    Keyed by every operand's metadata (shape, strides, dtype, 16-byte alignment), the recipe, the config, the kernel
    (:func:`takes_ws_kernel`) and the device and SM count: what decides the copies, the descriptors' shapes and
    strides, the grid and triton's specialization, so a repeated call only makes views and launches.
    """
    (a_data, sa), (b_data, sb) = a, b
    ws = cfg is None and takes_ws_kernel(recipe, c is not None, alpha)
    tk = plans.tensor_key
    key = (
        "gluon", "fp8_gemm", tk(a_data), tk(sa), tk(b_data), tk(sb), tk(d), None if c is None else tk(c),
        tuple(recipe), cfg, ws, plans.sms_key(d.device),
    )  # fmt: skip
    run = plans.find(key)
    if run is None:
        build = (
            _build_ws_plan(a_data, sa, b_data, sb, d)
            if ws
            else _build_plan(a_data, sa, b_data, sb, d, c, tuple(recipe), cfg)
        )
        run = plans.keep(key, build)
    return run


def _build_ws_plan(a_data, sa, b_data, sb, d) -> Runner:
    """The launch plan of a call the warp-specialized kernel runs, in the design :func:`dense_fp8_ws_design` picks."""
    m, k = a_data.shape
    n = b_data.shape[0]
    reason = unsupported_reason(m, n, k, d)
    if reason is not None:
        raise Unsupported(reason)
    num_sms = config.get_num_sms()
    design = fp8_gemm_ws.VARIANTS[dense_fp8_ws_design(m, n, k, num_sms)]
    print_once("fp8_gemm_nt[gluon]", (m, n, k), design)
    launch_ws = fp8_gemm_ws.ws_plan((a_data, sa), (b_data, sb), d, design, num_sms)

    def run(a, b, d, c, alpha, beta, stream=None) -> torch.Tensor:
        return launch_ws(a, b, d, stream)

    return run


def _build_plan(a_data, sa, b_data, sb, d, c, recipe, cfg) -> Runner:
    """Build the launch plan of a call (see :func:`fp8_plan`)."""
    m, k = a_data.shape
    n = b_data.shape[0]
    reason = unsupported_reason(m, n, k, d)
    if reason is not None:
        raise Unsupported(reason)
    sb_rows = recipe == (1, 1, 128)
    out_bytes = d.element_size()
    cfg = fit_stages(cfg, out_bytes) if cfg else dense_fp8_config(m, n, k, config.get_num_sms(), out_bytes)
    has_c = c is not None
    print_once("fp8_gemm_nt[gluon]", (m, n, k), cfg)
    tiles = operands.cdiv(m, BLOCK_M) * operands.cdiv(n, cfg.block_n)
    grid = (max(1, min(tiles, config.get_num_sms())), 1, 1)
    consts = constants(cfg, sb_rows, has_c)
    box = block_shapes(cfg, sb_rows)

    def arrays(a, b, d, c) -> tuple[torch.Tensor, ...]:
        """The tensors the kernel reads, in the layouts its descriptors take (copies only where needed)."""
        sa_t = a[1].t()  # [KB, M]: one K block's row scales are contiguous
        sb_t = b[1].t() if sb_rows else b[1]  # [KB, N] or [NB, KB]
        c_arr = (c if c.stride(1) == 1 else c.contiguous()) if has_c else d
        return (
            operands.as_row_major(a[0]),
            operands.as_row_major(b[0]),
            operands.as_row_major(sa_t.to(torch.float32)),
            operands.as_row_major(sb_t.to(torch.float32)),
            d,
            c_arr,
        )

    first = arrays((a_data, sa), (b_data, sb), d, c)
    shapes = [(list(t.shape), tma_strides(t)) for t in first[:5]]
    c_stride = first[5].stride(0)
    relaunch = None

    def run(a, b, d, c, alpha, beta, stream=None) -> torch.Tensor:
        nonlocal relaunch
        *tma, c_arr = arrays(a, b, d, c)
        scalars = (c_arr, m, n, k, c_stride, float(alpha), float(beta))
        if relaunch is not None:
            relaunch(tma, (*scalars, *consts.values()), stream)
            return d
        descs = [
            descriptor(tma[0], box["a"]),
            descriptor(tma[1], box["b"]),
            descriptor(tma[2], box["sa"], SCALE_LAYOUT),
            descriptor(tma[3], box["sb"], SCALE_LAYOUT),
            descriptor(tma[4], box["d"]),
        ]
        args = dict(zip(fp8_gemm_kernel.fp8_gemm_kernel.arg_names, (*descs, *scalars)))
        with (
            contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
        ):  # the JIT launches on the current
            compiled = fp8_gemm_kernel.fp8_gemm_kernel[grid](num_warps=4, **args, **consts, **COMPILE_OPTIONS)
        relaunch = Relaunch(compiled, grid, d.device, shapes)
        return d

    return run


def _fp8_replay(derived: dict[str, Any]) -> Runner:
    """The hot-lane replay of a call that ran here: its plan, ``run(a, b, d, c, alpha, beta) -> d``, without the
    checks, the chooser or the lookup."""
    a, b, d, c, alpha, beta, recipe = (derived[key] for key in ("a", "b", "d", "c", "alpha", "beta", "recipe"))
    return fp8_plan(a, b, d, c if c is not None and beta != 0 else None, recipe, None, alpha)


def bf16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    stream: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """``d = a @ b.T`` on the BF16 ws kernel, on the logical ``nt`` form the checks derive, launched on ``stream``
    (``None``: the current one). The sum is fp32, rounded once to ``d``'s dtype.

    Args:
        a: bf16 [M, K], K-major (unit last stride), TMA-ready.
        b: bf16 [N, K], K-major, TMA-ready.
        d: bf16 or fp32 [M, N], TMA-ready.
        c: an addend; only ``None`` (or ``beta`` 0) and ``alpha`` 1 run here.

    Raises:
        Unsupported: an addend, ``alpha`` other than 1, operands the kernel does not read as given, an empty
            dimension (before anything is written).
    """
    return bf16_plan(a, b, d, c if c is not None and beta != 0 else None, alpha)(a, b, d, c, alpha, beta, stream)


def bf16_plan(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None, alpha: float) -> Runner:
    """The launch plan of a BF16 call (``c``: ``None`` when it is not read): ``run(a, b, d, c, alpha, beta,
    stream=None) -> d``, kept in :mod:`tilegemm.ops.plans`, keyed by the operands' metadata, whether there is an
    addend, ``alpha`` and the device's SM count."""
    tk = plans.tensor_key
    key = ("gluon", "bf16_gemm", tk(a), tk(b), tk(d), c is not None, float(alpha), plans.sms_key(d.device))
    run = plans.find(key)
    if run is None:
        run = plans.keep(key, _build_bf16_plan(a, b, d, c is not None, alpha))
    return run


def _build_bf16_plan(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, has_c: bool, alpha: float) -> Runner:
    """The launch plan of a call the BF16 ws kernel runs, in the design :func:`dense_bf16_ws_design` picks."""
    if not bf16_ws_takes(a, b, has_c, alpha):
        raise Unsupported("the gluon BF16 kernel computes a @ b.T of K-major, TMA-ready operands (no addend, alpha 1)")
    reason = bf16_gemm_ws.unsupported_reason(a, b, d)
    if reason is not None:
        raise Unsupported(reason)
    (m, k), n = a.shape, b.shape[0]
    num_sms = config.get_num_sms()
    design = dense_bf16_ws_design(m, n, k, num_sms, d.element_size())
    print_once("bf16_gemm_nt[gluon]", (m, n, k), design)
    launch = bf16_gemm_ws.bf16_ws_plan(a, b, d, bf16_gemm_ws.VARIANTS[design], num_sms)

    def run(a, b, d, c, alpha, beta, stream=None) -> torch.Tensor:
        return launch(a, b, d, stream)

    return run


def _bf16_replay(derived: dict[str, Any]) -> Runner:
    """The hot-lane replay of a BF16 call that ran here: its plan, ``run(a, b, d, c, alpha, beta) -> d``."""
    a, b, d, c, alpha, beta = (derived[key] for key in ("a", "b", "d", "c", "alpha", "beta"))
    return bf16_plan(a, b, d, c if c is not None and beta != 0 else None, alpha)


for _op in ("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt"):
    register_impl(_op, "gluon")(bf16_gemm)
    register_replay(_op, "gluon")(_bf16_replay)
for _op in ("fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt"):
    register_impl(_op, "gluon")(fp8_gemm)
    register_replay(_op, "gluon")(_fp8_replay)
del _op
