"""Gluon grouped GEMMs, host side, on Hopper: m-grouped contiguous FP8 (``m_grouped_fp8_fp4_gemm_{nt,nn}_contiguous``)
and k-grouped FP8 (``k_grouped_fp8_gemm_{tn,nt}_contiguous``), both on the warp-specialized FP8 kernel
(:mod:`fp8_gemm_ws`, its ``M_GROUPED`` and ``K_GROUPED`` forms); k-grouped BF16
(``k_grouped_bf16_gemm_tn_contiguous``) on the BF16 ws kernel's k-grouped form (:mod:`bf16_gemm_ws`: the MN-major
[K_sum, M] and [K_sum, N] operands read in place, every group's K a multiple of 64, M of 128).

m-grouped: DeepGEMM's ``m_indices`` layout, every 128-row block of A one group (or padding, -1), so a 128-row output
tile reads one group's B. The check hands the weights over as the logical [G, N, K]; a view that is not K-major (the
``nn`` op) is copied to K-major here, as the cutile backend does. The psum layout is not served here
(:class:`Unsupported`).

k-grouped: ``d[g] (+)= A_g @ B_g.T`` with 1x128 scales on both sides. The check hands over the ``tn`` form (a
[K_sum, M], b [K_sum, N]); FP8 wgmma reads K-major tiles, so A and B go in as [M, K_sum] and [N, K_sum]: a view for
the ``nt`` op (its groups were gathered K-major by the check), one transposing copy for ``tn``
(:mod:`tilegemm.ops.gluon.transpose`). M must be a
multiple of 128 (no output tile crosses a group); ``c`` other than ``d`` is copied into ``d`` first.

    m_grouped_fp8 / k_grouped_fp8 (the registered implementations, named arguments)
      -> m_grouped_plan / k_grouped_plan: the plan kept in tilegemm.ops.plans, or fp8_gemm_ws.ws_plan with the
         design :func:`tilegemm.heuristics.gluon.m_grouped_fp8_ws_design` / ``K_GROUPED_FP8_WS_DESIGN``
      -> run(a, b, d, stream, m_index= / k_offsets=): the first launch through triton's JIT, later ones to the
         compiled kernel's launcher
    _m_grouped_replay: an m-grouped call's hot-lane replay (tilegemm.backend.hot_lane), its plan's run, for the
         later public calls of the same signature (``checks.m_grouped_contiguous_signature``)
    k_grouped_bf16 -> k_grouped_bf16_plan: kept, or bf16_gemm_ws.bf16_ws_plan with the design
         :func:`tilegemm.heuristics.gluon.k_grouped_bf16_ws_design` -> run(a, b, d, stream, k_offsets=)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tilegemm import config
from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics.gluon import (
    K_GROUPED_FP8_WS_DESIGN,
    M_GROUPED_FP8_WS_DESIGN,
    MOE_FP8_GATE_UP_WS_DESIGN,
    k_grouped_bf16_ws_design,
    m_grouped_fp8_ws_design,
)
from tilegemm.heuristics.report import print_once
from tilegemm.ops import operands, plans
from tilegemm.ops.gluon import bf16_gemm_ws, fp8_gemm_ws, gemm
from tilegemm.ops.gluon.transpose import transposed

Runner = plans.Runner


def unsupported_reason(b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor, use_psum_layout: bool) -> str | None:
    """Why the gluon m-grouped FP8 kernel cannot run a call with these weights, output and layout, or ``None``."""
    if use_psum_layout:
        return "the psum layout (the kernel reads m_indices)"
    if b[1].shape[-2] != operands.cdiv(b[0].shape[-2], 128):
        return "RHS scales other than one per 128x128 block"
    reason = gemm.unsupported_reason(1, 1, 1, d)  # the output's dtype and alignment, as the dense calls'
    if reason is not None:
        return reason
    if max(*b[0].shape, *d.shape) >= 2**31 or b[0].shape[0] * b[0].shape[1] >= 2**31:
        return "a dimension past int32 (TMA coordinates)"
    return None


def m_grouped_fp8(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    grouped_layout: torch.Tensor,
    use_psum_layout: bool = False,
    alignment: int = 128,
    stream: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """``d[r] = dequant(a)[r] @ dequant(b[m_indices[r]]).T`` on the gluon warp-specialized kernel; rows of group -1
    written 0 (DeepGEMM's m-grouped contiguous FP8 GEMM, ``m_indices`` layout), on ``stream`` (``None``: current).

    Args:
        a: (fp8 [M_sum, K], fp32 sa [M_sum, ceil(K/128)]).
        b: (fp8 [G, N, K], fp32 sb [G, ceil(N/128), ceil(K/128)]), the logical ``nt`` form.
        d: bf16 or fp32 [M_sum, N], TMA-aligned.
        grouped_layout: int32 [M_sum], row r's group; every 128-row block one group or -1 padding.
        use_psum_layout: must be False (else :class:`Unsupported`).
        alignment: the psum alignment (not read: the ``m_indices`` layout has none).

    Raises:
        Unsupported: a case the kernel lacks (before anything is written).
    """
    reason = unsupported_reason(b, d, use_psum_layout)
    if reason is not None:
        raise Unsupported(reason)
    if not _launches(a, b, d):  # M_sum or N 0: nothing to write; K or G 0: every row an empty sum or padding
        return d.zero_()
    return _m_grouped_run(a, b, d, grouped_layout)(a, b, d, stream, grouped_layout)


def _launches(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor) -> bool:
    """Whether an m-grouped call launches the kernel: no empty dimension (M_sum, K, G or N)."""
    return 0 not in (*a[0].shape, b[0].shape[0], d.shape[1])


def _m_grouped_run(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor, m_index: torch.Tensor
) -> Runner:
    """The plan of an m-grouped call on the design the chooser gives its shape (M_sum, G, K)."""
    (a_data, _), (b_data, _) = a, b
    design = m_grouped_fp8_ws_design(a_data.shape[0], b_data.shape[0], b_data.shape[2])
    return m_grouped_plan(a, b, d, m_index, design=design)


def _m_grouped_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor] | None:
    """The hot-lane replay of an m-grouped call that ran here: its plan, ``replay(a, b, d, grouped_layout) -> d`` on
    the logical ``nt`` form, without the checks, the chooser or the plan lookup; ``None`` where the call launched
    nothing (an empty dimension: the full path is as short)."""
    a, b, d = derived["a"], derived["b"], derived["d"]
    if not _launches(a, b, d):
        return None
    run = _m_grouped_run(a, b, d, derived["grouped_layout"])

    def replay(a, b, d, grouped_layout) -> torch.Tensor:
        return run(a, b, d, None, grouped_layout)

    return replay


def m_grouped_plan(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    m_index: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    gated: int = 0,
    d_scales: torch.Tensor | None = None,
    design: str | None = None,
) -> Runner:
    """The launch plan of a call, ``run(a, b, d, stream, m_index, row_scale=None, d_scales=None) -> d``, kept in
    :mod:`tilegemm.ops.plans`: keyed by every operand's metadata, the design and the device and SM count (what
    decides the copies, the descriptors and the grid). The fused experts' forms (:func:`fp8_gemm_ws.ws_plan`):
    ``row_scale`` (fp32 [M_sum], the down projection) multiplies each output row before the rounding; ``gated`` (the
    gate/up projection) quantizes ``act(g) * u`` into an FP8 ``d`` and its scales ``d_scales``. ``design``: the ws
    kernel's design by its ``VARIANTS`` name; ``None``: :data:`~tilegemm.heuristics.gluon.MOE_FP8_GATE_UP_WS_DESIGN`
    when gated, else :data:`~tilegemm.heuristics.gluon.M_GROUPED_FP8_WS_DESIGN`."""
    (a_data, sa), (b_data, sb) = a, b
    tk = plans.tensor_key
    design = design or (MOE_FP8_GATE_UP_WS_DESIGN if gated else M_GROUPED_FP8_WS_DESIGN)
    epilogue = tuple(None if x is None else tk(x) for x in (row_scale, d_scales))
    key = (
        "gluon", "m_grouped_fp8", tk(a_data), tk(sa), tk(b_data), tk(sb), tk(d), tk(m_index), *epilogue, gated,
        design, plans.sms_key(d.device),
    )  # fmt: skip
    run = plans.find(key)
    if run is None:
        cfg = fp8_gemm_ws.VARIANTS[design]
        print_once("m_grouped_fp8_gemm_nt_contiguous[gluon]", (a_data.shape[0], *b_data.shape, gated), cfg)
        plan = fp8_gemm_ws.ws_plan(
            a, b, d, cfg, config.get_num_sms(), m_index, row_scale=row_scale, gated=gated, d_scales=d_scales
        )
        run = plans.keep(key, plan)
    return run


def k_grouped_unsupported_reason(m: int, d: torch.Tensor) -> str | None:
    """Why the gluon k-grouped FP8 kernel cannot run a call with per-group M ``m`` and output ``d``, or ``None``."""
    if m % 128:
        return f"M = {m} is not a multiple of 128 (an output tile would cross groups)"
    if not d.is_contiguous() or not operands.tma_ready(d):
        return "the output is not contiguous and TMA-aligned (N a multiple of 4)"
    if d.shape[0] * d.shape[1] >= 2**31:
        return "G * M output rows past int32 (TMA coordinates)"
    return None


def k_grouped_fp8(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    ks_cpu: list[int],
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """``d[g] = dequant(a_g).T @ dequant(b_g) (+ c[g])`` in fp32 on the gluon warp-specialized kernel (DeepGEMM's
    k-grouped FP8 GEMM, 1x128 scales along K on both sides), on ``stream`` (``None``: current).

    Args:
        a: (fp8 [K_sum, M], fp32 sa [K_sum/128, M]), the ``tn`` form the check derives.
        b: (fp8 [K_sum, N], fp32 sb [K_sum/128, N]).
        d: fp32 [G, M, N], contiguous, M a multiple of 128.
        ks_cpu: per-group K, multiples of 128 (0 allowed); ``grouped_layout``: their int32 [G] device mirror.
        c: fp32 [G, M, N] added to the product, or ``None``; may be ``d``.

    Raises:
        Unsupported: a case the kernel lacks (before anything is written).
    """
    return _k_grouped_fp8_run(a, b, d, ks_cpu, grouped_layout, c, stream, in_place=False)


def k_grouped_fp8_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    ks_cpu: list[int],
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """:func:`k_grouped_fp8` on the ``nt`` op's operands (DeepGEMM's SM90 layout), each group's blocks read in place:
    the kernel builds the group's A and B descriptors on the device where its walk enters the group (``in_place``).

    Args:
        a: (fp8 data holding each group's K-major [M, K_g] block back to back, fp32 sa [M, K_sum/128]).
        b: (fp8 data holding each group's [N, K_g] block back to back, fp32 sb [N, K_sum/128]).
        d, ks_cpu, grouped_layout, c: as :func:`k_grouped_fp8`.

    Data whose base is not 16-byte aligned (TMA's rule; each block then is too, K_g a multiple of 128) is gathered
    into the ``tn`` form instead (:func:`operands.k_grouped_nt_as_tn`).

    Raises:
        Unsupported: a case the kernel lacks (before anything is written).
    """
    if a[0].data_ptr() % operands.ALIGN_BYTES or b[0].data_ptr() % operands.ALIGN_BYTES:
        tn = operands.k_grouped_nt_as_tn(a, b, ks_cpu, d.shape[1], d.shape[2])
        return _k_grouped_fp8_run(*tn, d, ks_cpu, grouped_layout, c, stream, in_place=False)
    return _k_grouped_fp8_run(a, b, d, ks_cpu, grouped_layout, c, stream, in_place=True)


def _k_grouped_fp8_run(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    ks_cpu: list[int],
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None,
    stream: torch.cuda.Stream | None,
    in_place: bool,
) -> torch.Tensor:
    """The k-grouped FP8 call on the kernel: checked (:func:`k_grouped_unsupported_reason`), started
    (:func:`_k_grouped_start`), then A and B in the kernel's K-major form (``tn`` operands transposed; ``in_place``:
    the ``nt`` blocks' memory as the [M, K_sum] / [N, K_sum] views the plan's checks take) and launched."""
    (a_data, sa), (b_data, sb) = a, b
    groups, m, n = d.shape
    reason = k_grouped_unsupported_reason(m, d)
    if reason is not None:
        raise Unsupported(reason)
    k_sum = sum(ks_cpu)
    accumulate, done = _k_grouped_start(d, c, k_sum)
    if done:
        return d
    if in_place:
        a_k = (a_data.reshape(-1).view(m, k_sum), sa)
        b_k = (b_data.reshape(-1).view(n, k_sum), sb)
    else:
        a_k = (_k_major(a_data), sa.t())  # [M, K_sum], scales [M, K_sum/128] (MN-major storage)
        b_k = (_k_major(b_data), sb.t())
    offsets = operands.k_offsets(ks_cpu, grouped_layout, d.device)
    return k_grouped_plan(a_k, b_k, d, offsets, accumulate, in_place)(a_k, b_k, d, stream, k_offsets=offsets)


def _k_grouped_start(d: torch.Tensor, c: torch.Tensor | None, k_sum: int) -> tuple[bool, bool]:
    """The start of a k-grouped call the kernel takes: ``(accumulate, done)``. ``accumulate``: ``c`` is given, and
    ``d`` holds it first (copied unless ``c`` is ``d``); ``done``: nothing is left to launch (``d`` empty, or no K
    at all, every group's product an empty sum: ``d`` is ``c``, or zeros)."""
    accumulate = c is not None
    if d.numel() == 0:
        return accumulate, True
    if accumulate and not (c.data_ptr() == d.data_ptr() and c.stride() == d.stride()):
        d.copy_(c)  # d[g] = c[g], then accumulated into
    if k_sum == 0:
        if not accumulate:
            d.zero_()
        return accumulate, True
    return accumulate, False


def _k_major(x: torch.Tensor) -> torch.Tensor:
    """The [K_sum, MN] operand ``x`` as the [MN, K_sum] K-major matrix the kernel reads: a view where ``x`` is one
    (the ``nt`` op's gathered groups), else a transposing copy (:func:`transpose.transposed`)."""
    return x.t() if x.t().is_contiguous() else transposed(x)


def k_grouped_plan(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    k_offsets: torch.Tensor,
    accumulate: bool,
    in_place: bool = False,
) -> Runner:
    """The launch plan of a k-grouped call in the kernel's K-major form, ``run(a, b, d, stream, k_offsets=) -> d``,
    kept in :mod:`tilegemm.ops.plans` (keyed as :func:`m_grouped_plan`, and by ``accumulate`` and ``in_place``:
    A and B given as the ``nt`` op's per-group blocks, :func:`k_grouped_fp8_nt`)."""
    (a_data, sa), (b_data, sb) = a, b
    tk = plans.tensor_key
    key = (
        "gluon", "k_grouped_fp8", tk(a_data), tk(sa), tk(b_data), tk(sb), tk(d), tk(k_offsets), accumulate, in_place,
        plans.sms_key(d.device),
    )  # fmt: skip
    run = plans.find(key)
    if run is None:
        design = fp8_gemm_ws.VARIANTS[K_GROUPED_FP8_WS_DESIGN]
        print_once("k_grouped_fp8_gemm_contiguous[gluon]", tuple(d.shape), design)
        plan = fp8_gemm_ws.ws_plan(
            a, b, d, design, config.get_num_sms(), k_offsets=k_offsets, accumulate=accumulate, in_place=in_place
        )
        run = plans.keep(key, plan)
    return run


def k_grouped_bf16(
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    ks_cpu: list[int],
    grouped_layout: torch.Tensor,
    c: torch.Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
) -> torch.Tensor:
    """``d[g] = a_g.T @ b_g (+ c[g])`` in fp32 on the BF16 ws kernel's k-grouped form (DeepGEMM's
    ``k_grouped_bf16_gemm_tn_contiguous``), on ``stream`` (``None``: current).

    Args:
        a: bf16 [K_sum, M], unit last stride, TMA-ready (read in place).
        b: bf16 [K_sum, N], likewise.
        d: fp32 [G, M, N], contiguous, M a multiple of 128.
        ks_cpu: per-group K, multiples of 64 (0 allowed); ``grouped_layout``: their int32 [G] device mirror.
        c: fp32 [G, M, N] added to the product, or ``None``; may be ``d``.

    Raises:
        Unsupported: a case the kernel lacks (before anything is written).
    """
    reason = bf16_gemm_ws.k_grouped_unsupported_reason(a, b, d, ks_cpu)
    if reason is not None:
        raise Unsupported(reason)
    accumulate, done = _k_grouped_start(d, c, a.shape[0])
    if done:
        return d
    offsets = operands.k_offsets(ks_cpu, grouped_layout, d.device)
    return k_grouped_bf16_plan(a, b, d, ks_cpu, offsets, accumulate)(a, b, d, stream, k_offsets=offsets)


def k_grouped_bf16_plan(
    a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks: list[int], k_offsets: torch.Tensor, accumulate: bool
) -> Runner:
    """The launch plan of a k-grouped BF16 call, ``run(a, b, d, stream, k_offsets=) -> d``, kept in
    :mod:`tilegemm.ops.plans` (keyed by the operands' metadata, the per-group K, ``accumulate``, the device and SM
    count)."""
    tk = plans.tensor_key
    key = ("gluon", "k_grouped_bf16", tk(a), tk(b), tk(d), tuple(ks), accumulate, plans.sms_key(d.device))
    run = plans.find(key)
    if run is None:
        groups, m, n = d.shape
        design = k_grouped_bf16_ws_design(groups, m, n, config.get_num_sms())
        print_once("k_grouped_bf16_gemm_tn_contiguous[gluon]", tuple(d.shape), design)
        plan = bf16_gemm_ws.bf16_ws_plan(
            a, b, d, bf16_gemm_ws.VARIANTS[design], config.get_num_sms(), ks=ks, accumulate=accumulate
        )
        run = plans.keep(key, plan)
    return run


register_impl("k_grouped_bf16_gemm_tn_contiguous", "gluon")(k_grouped_bf16)
for _op in ("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous"):
    register_impl(_op, "gluon")(m_grouped_fp8)
    register_replay(_op, "gluon")(_m_grouped_replay)
register_impl("k_grouped_fp8_gemm_tn_contiguous", "gluon")(k_grouped_fp8)
register_impl("k_grouped_fp8_gemm_nt_contiguous", "gluon")(k_grouped_fp8_nt)
del _op
