"""Host side of the warp-specialized gluon BF16 GEMM (:mod:`bf16_gemm_ws_kernel`): ``D = A @ B.T``, and its
k-grouped form ``D[g] (+)= A_g.T @ B_g`` (MN-major operands read in place).

:func:`bf16_ws_plan`: checks -> config (:func:`bf16_ws_config`: the ring depth that fits) -> descriptors -> grid;
the first run launches through triton's JIT, later runs go to the compiled kernel (:class:`tma.Relaunch`).
:data:`VARIANTS` names the designs; the ``_sk`` ones split a short last round of tiles (:mod:`split_tail`): their
plans keep the split's workspace and counters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import torch

from tilegemm.heuristics.gluon import BARRIER_BYTES, BF16_BLOCK_K, SMEM_BYTES
from tilegemm.ops import operands
from tilegemm.ops.gluon.bf16_gemm_ws_kernel import MMA_WARPS, bf16_gemm_ws_kernel
from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.gluon.split_tail import StreamTails, plan_sms, split_grid
from tilegemm.ops.gluon.tma import Relaunch, descriptor, tma_strides

__all__ = ["Bf16WsConfig", "bf16_ws_plan"]

BLOCK_K = BF16_BLOCK_K


class Bf16WsConfig(NamedTuple):
    """One launch of :func:`bf16_gemm_ws_kernel`: the tile is ``block_m`` x ``block_n`` (``block_m`` 128: each MMA
    warpgroup 64 of its rows; 64: each warpgroup half its columns, or with ``mma_warps`` 4 one warpgroup the whole
    tile; ``block_n`` 64, 128 or 256, the last as two 128-wide halves); ``stages``: ring depth, 0 for the deepest
    that fits (at most 8); ``group_m``: row tiles per column sweep; ``loader_regs``: the TMA warp's registers;
    ``splits``: the split tail's runs a tile (1: no split; 2, 4, 8 or 16 for dense calls in 64- and 128-wide tiles:
    the kernel's ``SPLITS``); ``mma_warps``: the MMA warps, 8 (two warpgroups) or 4 (one warpgroup issuing
    m64n128 over a 64-row tile: A and B read from shared memory once a K step instead of A twice and B in halves;
    64-row tiles only); ``wg_parts``: 1, or 2 to make each MMA warpgroup a partition of its own (128-row tiles,
    unsplit; the loader warp then takes 24 registers). The launch's ``num_warps`` is :attr:`num_warps`."""

    block_n: int = 256
    stages: int = 0
    group_m: int = 8
    loader_regs: int = 40
    block_m: int = 128
    splits: int = 1
    mma_warps: int = MMA_WARPS
    wg_parts: int = 1

    @property
    def num_warps(self) -> int:
        """The launch's ``num_warps``: the default partition's warps (the MMA warps, or one warpgroup of them)."""
        return self.mma_warps // self.wg_parts


#: The designs by name: 128x256 and 128x128 tiles, and for short M or N 64x128 and 128x64; ``_sk``: the same tiles
#: with a short last round split 4 ways along K, ``_sk2``: 2 ways (:mod:`split_tail`; chosen by
#: :func:`tilegemm.heuristics.tiling.cheapest_tiling` with :data:`~tilegemm.heuristics.gluon.DENSE_BF16_WS_SPLITS`);
#: ``_w4``: a 64-row tile on one MMA warpgroup (``mma_warps`` 4); ``_wg2``: each MMA warpgroup a partition of its own
#: (``wg_parts`` 2).
VARIANTS: dict[str, Bf16WsConfig] = {
    "bf16_128x256": Bf16WsConfig(block_n=256),
    "bf16_128x128": Bf16WsConfig(block_n=128),
    "bf16_64x128": Bf16WsConfig(block_n=128, block_m=64),
    "bf16_128x64": Bf16WsConfig(block_n=64),
    "bf16_128x128_sk": Bf16WsConfig(block_n=128, splits=4),
    "bf16_64x128_sk": Bf16WsConfig(block_n=128, block_m=64, splits=4),
    "bf16_128x64_sk": Bf16WsConfig(block_n=64, splits=4),
    "bf16_64x128_sk2": Bf16WsConfig(block_n=128, block_m=64, splits=2),
    "bf16_128x64_sk2": Bf16WsConfig(block_n=64, splits=2),
    "bf16_64x128_w4": Bf16WsConfig(block_n=128, block_m=64, mma_warps=4),
    "bf16_64x256_w4": Bf16WsConfig(block_n=256, block_m=64, mma_warps=4),
    "bf16_64x128_w4_sk": Bf16WsConfig(block_n=128, block_m=64, splits=4, mma_warps=4),
    "bf16_64x128_w4_sk2": Bf16WsConfig(block_n=128, block_m=64, splits=2, mma_warps=4),
    "bf16_128x128_wg2": Bf16WsConfig(block_n=128, loader_regs=24, wg_parts=2),
    "bf16_128x256_wg2": Bf16WsConfig(block_n=256, loader_regs=24, wg_parts=2),
    "bf16_128x64_wg2": Bf16WsConfig(block_n=64, loader_regs=24, wg_parts=2),
}


def bf16_ws_config(cfg: Bf16WsConfig, out_dtype: torch.dtype) -> Bf16WsConfig:
    """``cfg`` with its ring depth set: the deepest (at most 8) that fits beside the output staging tile when
    ``cfg.stages`` is 0, else no deeper than fits."""
    if cfg.block_n not in (64, 128, 256) or cfg.block_m not in (64, 128) or (cfg.block_m == 64 and cfg.block_n < 128):
        raise ValueError(f"{cfg}: tiles are 128 x (64, 128 or 256), or 64 x (128 or 256)")
    if cfg.splits not in (1, 2, 4, 8, 16) or (cfg.splits > 1 and cfg.block_n > 128):
        raise ValueError(f"{cfg}: splits 1, 2, 4, 8 or 16, above 1 for 64- and 128-wide tiles")
    if cfg.mma_warps not in (4, MMA_WARPS) or (cfg.mma_warps == 4 and cfg.block_m != 64):
        raise ValueError(f"{cfg}: mma_warps {MMA_WARPS}, or 4 for 64-row tiles")
    if cfg.wg_parts not in (1, 2) or (cfg.wg_parts == 2 and (cfg.block_m != 128 or cfg.splits > 1)):
        raise ValueError(f"{cfg}: wg_parts 1, or 2 for 128-row tiles, unsplit")
    stage = (cfg.block_m + cfg.block_n) * BLOCK_K * 2
    staging = cfg.block_m * min(cfg.block_n, 128) * torch.empty(0, dtype=out_dtype).element_size()
    deepest = min((SMEM_BYTES - BARRIER_BYTES - staging) // stage, 8)
    if deepest < 2:
        raise ValueError(f"{cfg} leaves no room for a two-stage ring with a {out_dtype} output")
    return cfg._replace(stages=deepest if cfg.stages <= 0 else min(cfg.stages, deepest))


def unsupported_reason(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> str | None:
    """Why the kernel cannot run ``d = a @ b.T`` as given, or ``None``: bf16 A [M, K] and B [N, K] K-major and
    TMA-ready (K a multiple of 8), D bf16 or fp32 [M, N] TMA-ready, no dimension 0."""
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        return f"A and B must be bf16, got {a.dtype} and {b.dtype}"
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1] or tuple(d.shape) != (a.shape[0], b.shape[0]):
        return f"shapes A {tuple(a.shape)}, B {tuple(b.shape)}, D {tuple(d.shape)}"
    if min(a.shape[0], b.shape[0], a.shape[1]) == 0:
        return "an empty dimension"
    if d.dtype not in (torch.bfloat16, torch.float32):
        return f"D must be bf16 or fp32, got {d.dtype}"
    if not all(operands.tma_ready(x) and x.stride(1) == 1 for x in (a, b, d)):
        return "A, B (K-major) and D must be TMA-ready: unit last stride, 16-byte row pitch and base"
    return None


def k_grouped_unsupported_reason(
    a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks: list[int], block_m: int = 128
) -> str | None:
    """Why the k-grouped form cannot run ``d[g] = a_g.T @ b_g`` as given, or ``None``: bf16 A [K_sum, M] and B
    [K_sum, N] TMA-ready with unit last stride (MN-major), fp32 D [G, M, N] contiguous and TMA-ready, M a multiple
    of ``block_m`` (no tile crosses a group), every group's K a multiple of :data:`BLOCK_K`, int32 coordinates."""
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or d.dtype != torch.float32:
        return f"A and B must be bf16 and D fp32, got {a.dtype}, {b.dtype}, {d.dtype}"
    if a.dim() != 2 or b.dim() != 2 or d.dim() != 3 or (a.shape[1], b.shape[1]) != tuple(d.shape[1:]):
        return f"shapes A {tuple(a.shape)}, B {tuple(b.shape)}, D {tuple(d.shape)}"
    if a.shape[0] != b.shape[0] or sum(ks) != a.shape[0] or len(ks) != d.shape[0]:
        return f"per-group K {ks} against K_sum {a.shape[0]} and {d.shape[0]} groups"
    if d.shape[1] % block_m:
        return f"M = {d.shape[1]} is not a multiple of {block_m} (a tile would cross groups)"
    if any(k % BLOCK_K for k in ks):
        return f"per-group K {ks}: every one must be a multiple of {BLOCK_K}"
    if not all(operands.tma_ready(x) and x.stride(-1) == 1 for x in (a, b, d)) or not d.is_contiguous():
        return "A and B (MN-major) and D (contiguous) must be TMA-ready: unit last stride, 16-byte pitch and base"
    if max(a.shape[0], d.shape[0] * d.shape[1]) >= 2**31:
        return "a dimension past int32 (TMA coordinates)"
    return None


def bf16_ws_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    d: torch.Tensor,
    cfg: Bf16WsConfig | None = None,
    num_sms: int | None = None,
    ks: list[int] | None = None,
    accumulate: bool = False,
) -> Callable[..., torch.Tensor]:
    """The launch plan of calls shaped as this one: ``run(a, b, d, stream=None, k_offsets=None) -> d`` computes
    ``d = a @ b.T`` in fp32 (rounded to ``d``'s dtype) for operands of this call's shapes, strides, dtypes and
    alignment; k-grouped (``ks`` given): ``d[g] (+)= a_g.T @ b_g`` over the K ranges of its call's ``k_offsets``.

    Args:
        a: bf16 [M, K], K-major, TMA-ready; k-grouped: bf16 [K_sum, M], MN-major (unit last stride).
        b: bf16 [N, K], K-major, TMA-ready; k-grouped: bf16 [K_sum, N], MN-major.
        d: bf16 or fp32 [M, N], TMA-ready; every element is written. k-grouped: fp32 [G, M, N], contiguous.
        cfg: the design (:data:`VARIANTS` names some); ``None``: :class:`Bf16WsConfig`'s default.
        num_sms: SMs for the persistent grid; ``None``: the device's count.
        ks: k-grouped: the per-group K (multiples of :data:`BLOCK_K`, 0 allowed); a run takes the matching int32
            [G + 1] offsets (``operands.k_offsets``) as ``k_offsets``.
        accumulate: k-grouped: ``d[g] += a_g.T @ b_g`` (``d`` is read) instead of ``=``.

    ``run.tails`` is the plan's :class:`split_tail.StreamTails` (a split design's workspace and counters, a set per
    stream).
    """
    cfg = bf16_ws_config(cfg or Bf16WsConfig(), d.dtype)
    k_grouped = ks is not None
    reason = k_grouped_unsupported_reason(a, b, d, ks, cfg.block_m) if k_grouped else unsupported_reason(a, b, d)
    if reason is not None:
        raise ValueError(reason)
    if accumulate and not k_grouped:
        raise ValueError("accumulate: the k-grouped form only")
    if k_grouped and (cfg.block_n > 128 or cfg.splits > 1):
        raise ValueError(f"{cfg}: the k-grouped form takes tiles at most 128 wide, unsplit")
    num_sms = plan_sms(num_sms, d.device)
    if k_grouped:
        groups, m, n = d.shape
        k = a.shape[0]
        boxes = ([BLOCK_K, cfg.block_m], [BLOCK_K, cfg.block_n], [cfg.block_m // cfg.wg_parts, cfg.block_n])
        flat_d = d.flatten(0, 1)  # [G * M, N]: the group's rows of D
    else:
        groups, ((m, k), n) = 1, (a.shape, b.shape[0])
        boxes = ([cfg.block_m, BLOCK_K], [cfg.block_n, BLOCK_K], [cfg.block_m // cfg.wg_parts, min(cfg.block_n, 128)])
        flat_d = d
    tiles = groups * operands.cdiv(m, cfg.block_m) * operands.cdiv(n, cfg.block_n)
    ctas = split_grid(tiles, num_sms, cfg.splits)
    grid = (ctas, 1, 1)
    tails = StreamTails(tiles, ctas, cfg.splits, cfg.block_m, cfg.block_n, d.device)
    head = (groups, m, n, k)  # num_groups .. K: the parameters between group_ptr and work_ptr
    after_tail = (cfg.stages, cfg.group_m, cfg.loader_regs, k_grouped, accumulate, cfg.splits, cfg.wg_parts)
    # work_ptr, counter_ptr and the rest: an unsplit plan's never change; a split plan's follow the launch's stream
    unsplit_tail = None if tails.split else (*tails(), *after_tail)
    names = bf16_gemm_ws_kernel.arg_names
    shapes = [(list(x.shape), tma_strides(x)) for x in (a, b, flat_d)]
    relaunch = None

    def run(a, b, d, stream=None, k_offsets=None) -> torch.Tensor:
        nonlocal relaunch
        if (k_offsets is not None) != k_grouped:
            raise ValueError("a run takes k_offsets exactly when its plan is k-grouped")
        group_ptr = k_offsets if k_grouped else d  # read by the k-grouped form only
        tail = unsplit_tail
        if tail is None:
            tail = (*tails(stream), *after_tail)
        rest = (group_ptr, *head, *tail)  # the parameters after the descriptors
        if relaunch is not None:
            relaunch((a, b, d), rest, stream)
            return d
        tensors = (a, b, d.flatten(0, 1) if k_grouped else d)
        descs = {name: descriptor(x, box) for name, x, box in zip(("a_desc", "b_desc", "d_desc"), tensors, boxes)}
        with contextlib.nullcontext() if stream is None else torch.cuda.stream(stream):
            compiled = bf16_gemm_ws_kernel[grid](
                **descs, **dict(zip(names[len(descs) :], rest)), num_warps=cfg.num_warps, **COMPILE_OPTIONS
            )
        relaunch = Relaunch(compiled, grid, d.device, shapes)
        return d

    run.tails = tails
    return run
