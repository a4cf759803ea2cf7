"""Host side of the warp-specialized gluon BF16 GEMM (:mod:`bf16_gemm_ws_kernel`): ``D = A @ B.T``.

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

from tilegemm.heuristics.gluon import BARRIER_BYTES, SMEM_BYTES
from tilegemm.ops import operands
from tilegemm.ops.gluon.bf16_gemm_ws_kernel import BLOCK_K, MMA_WARPS, bf16_gemm_ws_kernel
from tilegemm.ops.gluon.split_tail import resident_sms, split_grid, tail_buffers
from tilegemm.ops.gluon.tma import Relaunch, descriptor, tma_strides

__all__ = ["Bf16WsConfig", "bf16_ws_plan"]


class Bf16WsConfig(NamedTuple):
    """One launch of :func:`bf16_gemm_ws_kernel`: the tile is ``block_m`` x ``block_n`` (``block_m`` 128: each MMA
    warpgroup 64 of its rows; 64: each warpgroup half its columns; ``block_n`` 64, 128 or 256, the last as two
    128-wide halves); ``stages``: ring
    depth, 0 for the deepest that fits (at most 8); ``group_m``: row tiles per column sweep; ``loader_regs``: the TMA
    warp's registers; ``splits``: the split tail's runs a tile (1: no split; 2, 4, 8 or 16 for 64- and 128-wide
    tiles: the kernel's ``SPLITS``)."""

    block_n: int = 256
    stages: int = 0
    group_m: int = 8
    loader_regs: int = 40
    block_m: int = 128
    splits: int = 1


#: The designs by name: 128x256 and 128x128 tiles, and for short M or N 64x128 and 128x64; ``_sk``: the same tiles
#: with a short last round split 4 ways along K (:mod:`split_tail`; chosen by
#: :func:`tilegemm.heuristics.gluon.cheapest_tiling` with :data:`~tilegemm.heuristics.gluon.DENSE_BF16_WS_TAIL_SPLIT`).
VARIANTS: dict[str, Bf16WsConfig] = {
    "bf16_128x256": Bf16WsConfig(block_n=256),
    "bf16_128x128": Bf16WsConfig(block_n=128),
    "bf16_64x128": Bf16WsConfig(block_n=128, block_m=64),
    "bf16_128x64": Bf16WsConfig(block_n=64),
    "bf16_128x128_sk": Bf16WsConfig(block_n=128, splits=4),
    "bf16_64x128_sk": Bf16WsConfig(block_n=128, block_m=64, splits=4),
    "bf16_128x64_sk": Bf16WsConfig(block_n=64, splits=4),
}


def bf16_ws_config(cfg: Bf16WsConfig, out_dtype: torch.dtype) -> Bf16WsConfig:
    """``cfg`` with its ring depth set: the deepest (at most 8) that fits beside the output staging tile when
    ``cfg.stages`` is 0, else no deeper than fits."""
    if cfg.block_n not in (64, 128, 256) or cfg.block_m not in (64, 128) or (cfg.block_m == 64 and cfg.block_n < 128):
        raise ValueError(f"{cfg}: tiles are 128 x (64, 128 or 256), or 64 x (128 or 256)")
    if cfg.splits not in (1, 2, 4, 8, 16) or (cfg.splits > 1 and cfg.block_n > 128):
        raise ValueError(f"{cfg}: splits 1, 2, 4, 8 or 16, above 1 for 64- and 128-wide tiles")
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


def bf16_ws_plan(
    a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, cfg: Bf16WsConfig | None = None, num_sms: int | None = None
) -> Callable[..., torch.Tensor]:
    """The launch plan of calls shaped as this one: ``run(a, b, d, stream=None) -> d`` computes ``d = a @ b.T`` in
    fp32 (rounded to ``d``'s dtype) for operands of this call's shapes, strides, dtypes and alignment.

    Args:
        a: bf16 [M, K], K-major, TMA-ready.
        b: bf16 [N, K], K-major, TMA-ready.
        d: bf16 or fp32 [M, N], TMA-ready; every element is written.
        cfg: the design (:data:`VARIANTS` names some); ``None``: :class:`Bf16WsConfig`'s default.
        num_sms: SMs for the persistent grid; ``None``: the device's count (a split design's grid never exceeds it:
            its runs wait for each other, so all its CTAs must be resident at once).

    ``run.tail`` is the plan's :class:`split_tail.TailBuffers` (a split design's workspace and counters).
    """
    reason = unsupported_reason(a, b, d)
    if reason is not None:
        raise ValueError(reason)
    cfg = bf16_ws_config(cfg or Bf16WsConfig(), d.dtype)
    num_sms = resident_sms(num_sms, cfg.splits, d.device)
    (m, k), n = a.shape, b.shape[0]
    tiles = operands.cdiv(m, cfg.block_m) * operands.cdiv(n, cfg.block_n)
    ctas = split_grid(tiles, num_sms, cfg.splits)
    grid = (ctas, 1, 1)
    tail = tail_buffers(tiles, ctas, cfg.splits, cfg.block_m, cfg.block_n, d.device)
    head = (m, n, k)  # the parameters before d_ptr, then those after it
    after_d = (tail.workspace, tail.counters, d.stride(0), cfg.stages, cfg.group_m, cfg.loader_regs, cfg.splits)
    boxes = ([cfg.block_m, BLOCK_K], [cfg.block_n, BLOCK_K], [cfg.block_m, min(cfg.block_n, 128)])
    shapes = [(list(x.shape), tma_strides(x)) for x in (a, b, d)]
    relaunch = None

    def run(a, b, d, stream=None) -> torch.Tensor:
        nonlocal relaunch
        if relaunch is not None:
            relaunch((a, b, d), (*head, d, *after_d), stream)
            return d
        descs = {name: descriptor(x, box) for name, x, box in zip(("a_desc", "b_desc", "d_desc"), (a, b, d), boxes)}
        names = bf16_gemm_ws_kernel.arg_names
        args = dict(zip(names[len(descs) :], (*head, d, *after_d)))
        with contextlib.nullcontext() if stream is None else torch.cuda.stream(stream):
            compiled = bf16_gemm_ws_kernel[grid](**descs, **args, num_warps=MMA_WARPS)
        relaunch = Relaunch(compiled, grid, d.device, shapes)
        return d

    run.tail = tail
    return run
