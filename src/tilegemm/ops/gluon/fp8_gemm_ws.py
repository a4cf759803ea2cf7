"""Host side of the warp-specialized gluon FP8 GEMM (:mod:`fp8_gemm_ws_kernel`): ``D = A @ B.T``, DeepGEMM's recipe;
with ``m_index``, the m-grouped contiguous form ``D[r] = A[r] @ B[m_index[r]].T``.

:func:`ws_plan`: problem (:func:`ws_problem`) -> config (:func:`ws_config`) -> grid; the first run launches through
triton's JIT with :func:`ws_descriptors`, later runs go to the compiled kernel. Tests and benchmarks run a
fresh plan (``ws_plan(a, b, d, cfg)(a, b, d)``); the gluon backend's ``fp8_fp4_gemm_*`` and
``m_grouped_fp8_fp4_gemm_{nt,nn}_contiguous`` keep plans (:mod:`tilegemm.ops.gluon.gemm`,
:mod:`tilegemm.ops.gluon.grouped`). :data:`VARIANTS` names the designs; the backend runs the one
:func:`tilegemm.heuristics.gluon.dense_fp8_ws_design` picks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from tilegemm.heuristics.gluon import BARRIER_BYTES, SMEM_BYTES
from tilegemm.ops import operands
from tilegemm.ops.gluon.fp8_gemm_ws_kernel import (
    BLOCK_K,
    DENSE,
    GATED_GELU_TANH,
    GATED_SILU,
    K_GROUPED,
    M_GROUPED,
    MMA_WARPS,
    NARROW_N,
    WAVE_M,
    fp8_gemm_ws_kernel,
)
from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.gluon.split_tail import StreamTails, plan_sms, split_grid
from tilegemm.ops.gluon.tma import SCALE_LAYOUT, Relaunch, descriptor, scratch_allocator, tma_strides

__all__ = ["GATED_ACTIVATIONS", "VARIANTS", "WsConfig", "ws_plan"]

#: The activations the kernel's gated form computes, by the fused experts' names: their ``gated`` code.
GATED_ACTIVATIONS = {"silu": GATED_SILU, "gelu_tanh": GATED_GELU_TANH}


class WsConfig(NamedTuple):
    """One launch of :func:`fp8_gemm_ws_kernel`.

    ``block_n`` 64 (one wave), 128 or 192 (128 + 64 sub-tiles); ``waves`` 1 (one wave a tile) or 2 (two 128-row
    waves: 256 rows); ``wave_m``: rows of a wave, 128 (each MMA warpgroup 64 of them) or 64 (the one wave of a 128- or
    64-wide tile, each warpgroup half its columns: twice the tiles of a short M, for SMs a 128-row tiling leaves
    idle); ``persistent``: grid of at most one CTA per SM; ``overlap``: K blocks per software-pipelined run with the
    next step's wgmma before the current promotion (0: off; 1, 2, 4 or 8); ``stages``: ring depth, 0 for the deepest
    that fits; ``group_m``: row tiles per column sweep; ``loader_regs``: the TMA warp's registers; ``splits``: the
    split tail's runs a tile (1: no split; 2, 4, 8 or 16: a short last round of tiles split along K,
    :mod:`split_tail`; dense, persistent, one wave of a 128- or 64-wide tile); ``wg_parts``: 1, the two MMA
    warpgroups one partition stepping together, or 2, each a partition of its own (one 128-row wave of a 64-, 128-
    or 192-wide tile, no split tail, not gated; its loader warp then takes 24 registers so that both warpgroups get 232
    or more); ``mma_warps``: the MMA warps, 8 (two warpgroups) or 4 (one warpgroup computing a whole 64-row tile,
    m64nN wgmma: A read from shared memory once a K block instead of once a warpgroup; unsplit, not gated).
    """

    block_n: int = 128
    waves: int = 2
    persistent: bool = True
    overlap: int = 0
    stages: int = 0
    group_m: int = 8
    loader_regs: int = 56
    wave_m: int = WAVE_M
    splits: int = 1
    wg_parts: int = 1
    mma_warps: int = MMA_WARPS

    @property
    def block_m(self) -> int:
        """Rows of a tile."""
        return self.wave_m * self.waves

    @property
    def num_warps(self) -> int:
        """The launch's ``num_warps``: the default partition's warps (both MMA warpgroups; one when each is a
        partition, or when ``mma_warps`` is 4)."""
        return self.mma_warps // self.wg_parts


#: The designs of the prototype, by name: (a) the MMA warpgroups in the default partition, (b) 256x128 as two waves,
#: persistent, (c) 128x192 from 128 + 64 sub-tiles, (d) the next step's wgmma before the promotion (runs of 2 or 4
#: K blocks), and mixes; ``e_``: 64x128 (one 64-row wave, the warpgroups splitting its columns), ``f_``: 128x64,
#: ``h_``: 64x64 (the warpgroups 32 columns each); ``_sk``: a short last round of tiles split 4 ways along K
#: (:mod:`split_tail`; dense only, chosen by :func:`tilegemm.heuristics.tiling.cheapest_tiling` with
#: :data:`~tilegemm.heuristics.gluon.DENSE_FP8_WS_TAIL_SPLIT`); ``g_``: 128x128, 128x192 or 128x64 with each MMA
#: warpgroup a partition of its own (``wg_parts`` 2), without and with the overlap; ``i_``: 64x128 and 64x64 on one MMA
#: warpgroup (``mma_warps`` 4), ``_sk4`` / ``_sk2`` with a single short round split 4 or 2 ways along K
#: (:data:`~tilegemm.heuristics.gluon.DENSE_FP8_WS_ROUND_SPLITS`).
VARIANTS: dict[str, WsConfig] = {
    "a_128x128": WsConfig(block_n=128, waves=1, persistent=False),
    "a_128x128_p": WsConfig(block_n=128, waves=1, persistent=True),
    "d_128x128_ov": WsConfig(block_n=128, waves=1, persistent=True, overlap=2),
    "d_128x128_ov4": WsConfig(block_n=128, waves=1, persistent=True, overlap=4),
    "d_128x128_ov8": WsConfig(block_n=128, waves=1, persistent=True, overlap=8),
    "d_128x128_ov8_sk": WsConfig(block_n=128, waves=1, persistent=True, overlap=8, splits=4),
    "b_256x128": WsConfig(block_n=128, waves=2, persistent=True),
    "b_256x128_np": WsConfig(block_n=128, waves=2, persistent=False),
    "bd_256x128_ov": WsConfig(block_n=128, waves=2, persistent=True, overlap=1),
    "c_128x192": WsConfig(block_n=192, waves=1, persistent=True),
    "cd_128x192_ov": WsConfig(block_n=192, waves=1, persistent=True, overlap=2),
    "e_64x128_p": WsConfig(block_n=128, waves=1, persistent=True, wave_m=64),
    "e_64x128_ov2": WsConfig(block_n=128, waves=1, persistent=True, overlap=2, wave_m=64),
    "e_64x128_ov4": WsConfig(block_n=128, waves=1, persistent=True, overlap=4, wave_m=64),
    "f_128x64_p": WsConfig(block_n=64, waves=1, persistent=True),
    "f_128x64_ov2": WsConfig(block_n=64, waves=1, persistent=True, overlap=2),
    "f_128x64_ov4": WsConfig(block_n=64, waves=1, persistent=True, overlap=4),
    "h_64x64_ov2": WsConfig(block_n=64, waves=1, persistent=True, overlap=2, wave_m=64),
    "h_64x64_ov4": WsConfig(block_n=64, waves=1, persistent=True, overlap=4, wave_m=64),
    "g_128x128": WsConfig(block_n=128, waves=1, persistent=True, loader_regs=24, wg_parts=2),
    "g_128x192": WsConfig(block_n=192, waves=1, persistent=True, loader_regs=24, wg_parts=2),
    "g_128x128_ov2": WsConfig(block_n=128, waves=1, persistent=True, overlap=2, loader_regs=24, wg_parts=2),
    "g_128x128_ov4": WsConfig(block_n=128, waves=1, persistent=True, overlap=4, loader_regs=24, wg_parts=2),
    "g_128x128_ov8": WsConfig(block_n=128, waves=1, persistent=True, overlap=8, loader_regs=24, wg_parts=2),
    "g_128x64_ov2": WsConfig(block_n=64, waves=1, persistent=True, overlap=2, loader_regs=24, wg_parts=2),
    "g_128x64_ov4": WsConfig(block_n=64, waves=1, persistent=True, overlap=4, loader_regs=24, wg_parts=2),
    "i_64x128_ov2": WsConfig(block_n=128, waves=1, persistent=True, overlap=2, wave_m=64, mma_warps=4),
    "i_64x128_ov4": WsConfig(block_n=128, waves=1, persistent=True, overlap=4, wave_m=64, mma_warps=4),
    "i_64x64_ov2": WsConfig(block_n=64, waves=1, persistent=True, overlap=2, wave_m=64, mma_warps=4),
    "i_64x64_ov4": WsConfig(block_n=64, waves=1, persistent=True, overlap=4, wave_m=64, mma_warps=4),
    "i_64x128_ov4_sk4": WsConfig(block_n=128, waves=1, persistent=True, overlap=4, wave_m=64, mma_warps=4, splits=4),
    "i_64x64_ov2_sk2": WsConfig(block_n=64, waves=1, persistent=True, overlap=2, wave_m=64, mma_warps=4, splits=2),
}


class Problem(NamedTuple):
    """An FP8 GEMM's sizes and output dtype, and what it is (``grouping``: :data:`DENSE`, :data:`M_GROUPED` or
    :data:`K_GROUPED`). ``m``: rows of A (k-grouped: of each group's D); ``k``: K (k-grouped: all groups' K);
    ``groups``: the groups of a grouped call (0: dense)."""

    m: int
    n: int
    k: int
    out_dtype: torch.dtype
    groups: int = 0
    grouping: int = DENSE
    gated: int = 0  # m-grouped: the gated activation fused (GATED: 1 SiLU, 2 tanh GELU), D FP8 [M, N], B [G, 2N, K]


def stage_bytes(cfg: WsConfig, grouping: int = DENSE, gated: bool = False) -> int:
    """Shared memory of one ring stage: the A and B tiles (gated: two B tiles, gate and up) and A's scales
    (k-grouped: and B's)."""
    scales = 4 * cfg.block_m + (4 * cfg.block_n if grouping == K_GROUPED else 0)
    return (cfg.block_m + cfg.block_n * (2 if gated else 1)) * BLOCK_K + scales


def staging_bytes(cfg: WsConfig, out_bytes: int) -> int:
    """Shared memory of the output staging tiles (one wave of every sub-tile)."""
    return cfg.wave_m * cfg.block_n * out_bytes


def max_stages(cfg: WsConfig, out_bytes: int, grouping: int = DENSE, gated: bool = False) -> int:
    """The deepest ring that fits in a CTA's shared memory beside the output staging tiles."""
    return (SMEM_BYTES - BARRIER_BYTES - staging_bytes(cfg, out_bytes)) // stage_bytes(cfg, grouping, gated)


def ws_config(problem: Problem, cfg: WsConfig | None = None) -> WsConfig:
    """``cfg`` (default: :class:`WsConfig`'s, the 256x128 two-wave persistent design) with its ring depth set: the
    deepest that fits when ``cfg.stages`` is 0, else no deeper than fits. A grouped call takes one wave (a
    k-grouped one, 128-wide tiles); a split design (``splits`` > 1) runs dense calls only."""
    cfg = cfg or WsConfig()
    if cfg.wave_m not in (64, WAVE_M) or (cfg.wave_m == 64 and (cfg.waves != 1 or cfg.block_n == 192)):
        raise ValueError(f"{cfg}: a wave is 128 rows, or 64 as the one wave of a 128- or 64-wide tile")
    if cfg.block_n not in (64, 128, 192) or (cfg.block_n == 64 and (cfg.waves != 1 or problem.gated)):
        raise ValueError(f"{cfg}: tiles are 128 or 192 wide, or 64 with one wave (not gated)")
    if problem.grouping != DENSE and cfg.waves != 1:
        raise ValueError(f"{cfg}: a grouped call runs one wave a tile (waves=1), one group each")
    if problem.grouping == K_GROUPED and cfg.wave_m != WAVE_M:
        raise ValueError(f"{cfg}: a k-grouped call runs 128-row tiles")
    if problem.grouping == K_GROUPED and cfg.block_n != 128:
        raise ValueError(f"{cfg}: a k-grouped call runs 128-wide tiles")
    if problem.gated and (cfg.block_n != 128 or cfg.overlap):
        raise ValueError(f"{cfg}: a gated call runs 128-wide tiles without the overlap")
    if cfg.splits not in (1, 2, 4, 8, 16):
        raise ValueError(f"{cfg}: splits 1, 2, 4, 8 or 16")
    if cfg.splits > 1 and (problem.grouping != DENSE or problem.gated):
        raise ValueError(f"{cfg}: the split tail runs dense calls only (not grouped, not gated)")
    if cfg.splits > 1 and (not cfg.persistent or cfg.waves != 1 or cfg.block_n == 192):
        raise ValueError(f"{cfg}: the split tail runs persistent designs of one wave, 128- or 64-wide tiles")
    if cfg.wg_parts not in (1, 2):
        raise ValueError(f"{cfg}: wg_parts 1 or 2")
    if cfg.wg_parts == 2 and (cfg.block_m != WAVE_M or cfg.splits > 1 or problem.gated):
        raise ValueError(f"{cfg}: a warpgroup a partition runs 128-row tiles of one wave, unsplit, not gated")
    if cfg.mma_warps not in (4, MMA_WARPS) or (
        cfg.mma_warps == 4 and (cfg.wave_m != 64 or cfg.wg_parts != 1 or problem.gated)
    ):
        raise ValueError(f"{cfg}: one MMA warpgroup (mma_warps 4) runs a 64-row tile, not gated")
    out_bytes = torch.empty(0, dtype=problem.out_dtype).element_size()
    deepest = min(max_stages(cfg, out_bytes, problem.grouping, bool(problem.gated)), 8)
    if deepest < 2:
        raise ValueError(f"{cfg} leaves no room for a two-stage ring with a {problem.out_dtype} output")
    return cfg._replace(stages=deepest if cfg.stages <= 0 else min(cfg.stages, deepest))


IN_PLACE_LOADER_REGS = 32
"""The loader warp's fewest registers when it builds the ``nt`` blocks' descriptors (``in_place``): at 24 (the
``wg_parts`` 2 designs') triton 3.8 spills two words of it; at 32 the MMA warpgroups keep 240 and 232."""


def in_place_config(cfg: WsConfig) -> WsConfig:
    """``cfg`` as an ``in_place`` plan runs it: its loader given at least :data:`IN_PLACE_LOADER_REGS` registers."""
    return cfg._replace(loader_regs=max(cfg.loader_regs, IN_PLACE_LOADER_REGS))


def block_shapes(cfg: WsConfig) -> dict[str, list[int]]:
    """The TMA box of each descriptor: A, B's wide and narrow sub-tiles, A's scales, B's column scales (k-grouped),
    D's wide and narrow sub-tiles (a warpgroup's rows of a wave each, with ``wg_parts`` 2)."""
    wide = min(cfg.block_n, 128)
    narrow = NARROW_N if cfg.block_n == 192 else wide
    d_rows = cfg.wave_m // cfg.wg_parts
    return {
        "a": [cfg.block_m, BLOCK_K],
        "b0": [wide, BLOCK_K],
        "b1": [narrow, BLOCK_K],
        "sa": [1, cfg.block_m],
        "sb": [1, 128],
        "d0": [d_rows, wide],
        "d1": [d_rows, narrow],
    }


def constants(
    cfg: WsConfig,
    grouping: int = DENSE,
    accumulate: bool = False,
    row_scale: bool = False,
    gated: int = 0,
    in_place: bool = False,
) -> dict[str, Any]:
    """The kernel's constexpr arguments for ``cfg`` (its ring depth already set), the problem's ``grouping``,
    whether D is accumulated into and A and B read in place as per-group blocks (k-grouped), whether its rows are
    scaled and the gated activation fused (m-grouped)."""
    return {
        "BLOCK_N": cfg.block_n,
        "WAVES": cfg.waves,
        "STAGES": cfg.stages,
        "GROUP_M": cfg.group_m,
        "PERSISTENT": cfg.persistent,
        "OVERLAP": cfg.overlap,
        "GROUPING": grouping,
        "ACCUMULATE": accumulate,
        "ROW_SCALE": row_scale,
        "GATED": gated,
        "LOADER_REGS": cfg.loader_regs,
        "SPLITS": cfg.splits,
        "WG_PARTS": cfg.wg_parts,
        "IN_PLACE": in_place,
    }


class Operands(NamedTuple):
    """The tensors the kernel reads and writes, in the layouts its descriptors take."""

    a: torch.Tensor  # [M, K] fp8, row-major
    b: torch.Tensor  # [N, K] fp8, row-major (m-grouped: [G * N, K], the groups' weights)
    sa_t: torch.Tensor  # [ceil(K/128), M] fp32, row pitch a multiple of 16 bytes
    # dense: [ceil(N/128), ceil(K/128)] fp32, unit last stride; m-grouped: [G, ...], contiguous; k-grouped: the
    # column scales [ceil(K/128), N], row pitch a multiple of 16 bytes (sb_desc's)
    sb: torch.Tensor
    d: torch.Tensor  # [M, N] bf16 or fp32 (k-grouped: [G * M, N] fp32)
    index: torch.Tensor | None  # m-grouped: int32 m_index [M]; k-grouped: int32 K offsets [G + 1]; dense: None


def ws_problem(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    m_index: torch.Tensor | None = None,
    k_offsets: torch.Tensor | None = None,
    gated: int = 0,
) -> tuple[Problem, Operands]:
    """Check a call and put its operands in the layouts the kernel reads (:func:`ws_operands`).

    Dense: A [M, K], sa [M, ceil(K/128)], B [N, K], sb [ceil(N/128), ceil(K/128)], D [M, N]. m-grouped
    (``m_index`` int32 [M]): B [G, N, K], sb [G, ceil(N/128), ceil(K/128)]; ``gated``: B [G, 2N, K] (gate rows,
    then up rows), sb [G, 2N/128, ceil(K/128)], D FP8 [M, N], N a multiple of 128. k-grouped (``k_offsets`` int32
    [G + 1]): A [M, K_sum], sa [M, K_sum/128], B [N, K_sum], sb [N, K_sum/128] (one scale per column and K block),
    D fp32 [G, M, N] contiguous, M a multiple of 128."""
    (a_data, sa), (b_data, sb) = a, b
    grouping = M_GROUPED if m_index is not None else K_GROUPED if k_offsets is not None else DENSE
    if gated and (grouping != M_GROUPED or b_data.shape[-2] % 256 or d.dtype != torch.float8_e4m3fn):
        raise ValueError("gated: m-grouped, B [G, 2N, K] with N a multiple of 128, D float8_e4m3fn [M, N]")
    m, k = a_data.shape
    n = b_data.shape[-2] // (2 if gated else 1)
    kb, nb = operands.cdiv(k, BLOCK_K), operands.cdiv(b_data.shape[-2], 128)
    lead, out, b_scales = [], (m, n), (nb, kb)
    if grouping == M_GROUPED:
        lead = list(b_data.shape[:1])
        b_scales = (*lead, nb, kb)
    elif grouping == K_GROUPED:
        out, b_scales = (k_offsets.numel() - 1, m, n), (n, kb)
    if a_data.dtype != torch.float8_e4m3fn or b_data.dtype != torch.float8_e4m3fn:
        raise ValueError("A and B must be float8_e4m3fn")
    if b_data.dim() != 2 + len(lead) or b_data.shape[-1] != k or tuple(d.shape) != out or min(m, n, k) == 0:
        raise ValueError(f"shapes A {tuple(a_data.shape)}, B {tuple(b_data.shape)}, D {tuple(d.shape)}")
    if tuple(sa.shape) != (m, kb) or tuple(sb.shape) != b_scales:
        raise ValueError(f"scales: sa {tuple(sa.shape)} (want {(m, kb)}), sb {tuple(sb.shape)} (want {b_scales})")
    if d.dtype not in (torch.bfloat16, torch.float32, *([torch.float8_e4m3fn] if gated else [])):
        raise ValueError(f"D must be bf16 or fp32 (gated: float8_e4m3fn), got {d.dtype}")
    if not operands.tma_ready(d):
        raise ValueError("D must be TMA-aligned (16-byte row pitch and base)")
    if grouping == M_GROUPED and (m_index.dtype != torch.int32 or tuple(m_index.shape) != (m,)):
        raise ValueError(f"m_index must be int32 [M] = [{m}], got {m_index.dtype} {tuple(m_index.shape)}")
    if grouping == K_GROUPED:
        if k_offsets.dtype != torch.int32 or k_offsets.dim() != 1 or k_offsets.numel() < 2:
            raise ValueError(f"k_offsets must be int32 [G + 1], got {k_offsets.dtype} {tuple(k_offsets.shape)}")
        if d.dtype != torch.float32 or not d.is_contiguous() or m % WAVE_M:
            raise ValueError("k-grouped: D fp32 [G, M, N] contiguous with M a multiple of 128")
    groups = b_data.shape[0] if grouping == M_GROUPED else out[0] if grouping == K_GROUPED else 0
    return Problem(m, n, k, d.dtype, groups, grouping, gated), ws_operands(a, b, d, m_index, k_offsets)


def ws_operands(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    m_index: torch.Tensor | None = None,
    k_offsets: torch.Tensor | None = None,
) -> Operands:
    """The operands of a checked call in the layouts the kernel reads (copies only where needed): an m-grouped
    call's B as one [G * N, K] matrix and its scales contiguous; a k-grouped call's B scales MN-major and D as
    [G * M, N]."""
    (a_data, sa), (b_data, sb) = a, b
    index = None
    if m_index is not None:
        b_data = b_data.contiguous().flatten(0, 1)
        sb_arr = sb.float().contiguous()
        index = m_index.contiguous()
    elif k_offsets is not None:
        sb_arr = operands.as_row_major(sb.float().t())
        d = d.flatten(0, 1)
        index = k_offsets.contiguous()
    else:
        sb_arr = sb.float()
        if sb_arr.stride(1) != 1:
            sb_arr = sb_arr.contiguous()
    return Operands(
        operands.as_row_major(a_data),
        operands.as_row_major(b_data),
        operands.as_row_major(sa.float().t()),
        sb_arr,
        d,
        index,
    )


def tma_operands(ops: Operands, grouping: int) -> tuple[torch.Tensor, ...]:
    """The tensors under the kernel's TMA descriptors, in its parameter order (``a_desc`` ... ``d1_desc``)."""
    return ops.a, ops.b, ops.b, ops.sa_t, ops.sb if grouping == K_GROUPED else ops.sa_t, ops.d, ops.d


def ws_descriptors(cfg: WsConfig, ops: Operands, grouping: int) -> dict[str, Any]:
    """The kernel's TMA descriptors over ``ops`` for ``cfg``, by parameter name."""
    box = block_shapes(cfg)
    return {
        "a_desc": descriptor(ops.a, box["a"]),
        "b0_desc": descriptor(ops.b, box["b0"]),
        "b1_desc": descriptor(ops.b, box["b1"]),
        "sa_desc": descriptor(ops.sa_t, box["sa"], SCALE_LAYOUT),
        "sb_desc": descriptor(ops.sb, box["sb"], SCALE_LAYOUT)
        if grouping == K_GROUPED
        else descriptor(ops.sa_t, box["sa"], SCALE_LAYOUT),
        "d0_desc": descriptor(ops.d, box["d0"]),
        "d1_desc": descriptor(ops.d, box["d1"]),
    }


def ws_tiles(cfg: WsConfig, problem: Problem) -> int:
    """The output tiles of a launch (k-grouped: of every group)."""
    tiles = operands.cdiv(problem.m, cfg.block_m) * operands.cdiv(problem.n, cfg.block_n)
    return tiles * problem.groups if problem.grouping == K_GROUPED else tiles


def ws_grid(cfg: WsConfig, problem: Problem, num_sms: int) -> tuple[int]:
    """One CTA per output tile, or when persistent one per job (a split tail's runs included,
    :func:`split_tail.split_grid`), at most one per SM."""
    tiles = ws_tiles(cfg, problem)
    return (split_grid(tiles, num_sms, cfg.splits) if cfg.persistent else tiles,)


def _row_scale_fits(row_scale: torch.Tensor, problem: Problem) -> bool:
    """Whether ``row_scale`` is what an m-grouped launch with scaled rows reads: fp32 [M], contiguous."""
    return (
        problem.grouping == M_GROUPED
        and row_scale.dtype == torch.float32
        and tuple(row_scale.shape) == (problem.m,)
        and row_scale.is_contiguous()
    )


def _d_scales_fit(d_scales: torch.Tensor, problem: Problem) -> bool:
    """Whether ``d_scales`` is what a gated launch writes: fp32 [N/128, M], contiguous."""
    want = (problem.n // 128, problem.m)
    return d_scales.dtype == torch.float32 and tuple(d_scales.shape) == want and d_scales.is_contiguous()


def ws_plan(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    cfg: WsConfig | None = None,
    num_sms: int | None = None,
    m_index: torch.Tensor | None = None,
    k_offsets: torch.Tensor | None = None,
    accumulate: bool = False,
    row_scale: torch.Tensor | None = None,
    gated: int = 0,
    d_scales: torch.Tensor | None = None,
    in_place: bool = False,
) -> Callable[..., torch.Tensor]:
    """The launch plan of calls shaped as this one: ``run(a, b, d, stream=None, m_index=None, k_offsets=None,
    row_scale=None, d_scales=None) -> d``.

    Problem -> :func:`ws_config` -> grid, and what a call's operand metadata fixes (the descriptors' shapes and
    strides, B's scale pitch), settled once here: a run is valid for operands with this call's shapes, strides,
    dtypes and alignment (the gluon backend keys its plans by them). The first run launches through triton's JIT
    (it compiles); later runs go straight to the compiled kernel's launcher (:class:`tma.Relaunch`), with the
    operands as given where the first call's needed no copy (then no call of the same metadata does), else through
    :func:`ws_operands`. A run computes ``d = dequant(a) @ dequant(b).T`` (m-grouped: row r against its group's B;
    k-grouped: ``d[g] (+)= A_g @ B_g.T``) on ``stream`` (``None``: the current one) and returns ``d``.

    Args:
        a: (fp8 e4m3 [M, K] K-major, fp32 sa [M, ceil(K/128)], best MN-major and TMA-aligned as
            ``get_mn_major_tma_aligned_tensor`` makes it: then no copy).
        b: (fp8 e4m3 [N, K] K-major, fp32 sb [ceil(N/128), ceil(K/128)]: one scale per 128x128 block); m-grouped:
            (fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)]), both best contiguous (then no copy); k-grouped:
            (fp8 [N, K_sum], fp32 [N, K_sum/128], one scale per column and K block, best MN-major).
        d: bf16 or fp32 [M, N], TMA-aligned; every element is written (m-grouped: but the rows of tiles whose
            group id is neither -1 nor in ``[0, G)``, which are left as they were); k-grouped: fp32 [G, M, N],
            contiguous, M a multiple of 128.
        cfg: the design (:data:`VARIANTS` names some); ``None``: :class:`WsConfig`'s default. Its ring depth is
            set by :func:`ws_config`.
        num_sms: SMs for the persistent grid; ``None``: the device's count.
        m_index: int32 [M], the m-grouped call's row groups (DeepGEMM's ``m_indices``: every 128-row block one
            group, -1 for padding rows); a run of an m-grouped plan takes its call's ``m_index``.
        k_offsets: int32 [G + 1], the k-grouped call's K ranges (group g: ``[k_offsets[g], k_offsets[g + 1])``,
            multiples of 128); a run of a k-grouped plan takes its call's ``k_offsets``.
        accumulate: k-grouped: ``d[g] += A_g @ B_g.T`` (``d`` is read) instead of ``=``.
        row_scale: m-grouped: fp32 [M], contiguous: ``d[r] = row_scale[r] * (A[r] @ B[m_index[r]].T)``, scaled
            before the rounding to ``d``'s dtype; a run of such a plan takes its call's ``row_scale``.
        gated: m-grouped, the fused experts' gate/up projection: ``b`` holds [G, 2N, K] (each group's gate rows,
            then its up rows), and with ``g, u`` the fp32 products of row r against them, ``h = act(g) * u``
            (``gated`` 1: SiLU, 2: tanh GELU) is quantized 1x128 into ``d`` float8_e4m3fn [M, N] and ``d_scales``
            (fp32 [N/128, M], contiguous: MN-major); a run of such a plan takes its call's ``d_scales``.
        in_place: k-grouped, A's and B's data hold each group's K-major [M, K_g] / [N, K_g] block back to back
            (DeepGEMM's ``nt`` layout; given as [M, K_sum] / [N, K_sum] views of that memory): the kernel reads the
            blocks in place through descriptors it builds where its walk enters a group, in global scratch
            memory each launch takes from torch (:func:`tma.scratch_allocator`, :class:`tma.Relaunch`).

    ``run.tails`` is the plan's :class:`split_tail.StreamTails` (a split design's workspace and counters, a set per
    stream).
    """
    problem, first = ws_problem(a, b, d, m_index, k_offsets, gated)
    grouping = problem.grouping
    if gated and (d_scales is None or not _d_scales_fit(d_scales, problem)):
        raise ValueError(f"gated: d_scales must be fp32 [N/128, M] = [{problem.n // 128}, {problem.m}], contiguous")
    if row_scale is not None and not _row_scale_fits(row_scale, problem):
        raise ValueError(f"row_scale must be fp32 [M] = [{problem.m}], contiguous, with m_index; got "
                         f"{row_scale.dtype} {tuple(row_scale.shape)}")  # fmt: skip
    if in_place and grouping != K_GROUPED:
        raise ValueError("in_place: k-grouped calls only")
    cfg = ws_config(problem, in_place_config(cfg or WsConfig()) if in_place else cfg)
    num_sms = plan_sms(num_sms, d.device)
    grid = (*ws_grid(cfg, problem, num_sms), 1, 1)
    consts = constants(cfg, grouping, accumulate, row_scale is not None, gated, in_place)
    tails = StreamTails(ws_tiles(cfg, problem), grid[0], cfg.splits, cfg.block_m, cfg.block_n, d.device)
    fixed = {
        "sb_stride": first.sb.stride(-2),
        "sb_group_stride": first.sb.stride(0) if grouping == M_GROUPED else 0,
        "num_groups": max(problem.groups, 1),
        "M": problem.m,
        "N": problem.n,
        "K": problem.k,
        **consts,
    }
    names = fp8_gemm_ws_kernel.arg_names
    after_names = names[names.index("b_blocks") + 1 :]  # the parameters after the pointers, in order
    at_tail = after_names.index("work_ptr")  # work_ptr, counter_ptr: the stream's tail buffers, amid fixed ones
    assert after_names[at_tail + 1] == "counter_ptr"
    before_tail = tuple(fixed[name] for name in after_names[:at_tail])
    after_tail = tuple(fixed[name] for name in after_names[at_tail + 2 :])
    # An unsplit plan's parameters after the pointers never change; a split plan's tail follows the launch's stream.
    unsplit_after = None if tails.split else (*before_tail, *tails(), *after_tail)
    tma_shapes = [(list(t.shape), tma_strides(t)) for t in tma_operands(first, grouping)]
    (a_data, sa), (b_data, sb) = a, b
    index = m_index if m_index is not None else k_offsets
    # Where the first call needed no copy (the kernel reads the caller's own memory), no call of the same metadata
    # does: a launch hands the caller's tensors to the launcher (only their addresses are read).
    own = [(first.a, a_data), (first.b, b_data), (first.sa_t, sa), (first.sb, sb), (first.d, d)]
    as_given = all(x.data_ptr() == y.data_ptr() for x, y in own) and (index is None or first.index is index)
    as_given = as_given and sa.dtype == sb.dtype == torch.float32
    relaunch = None

    def run(a, b, d, stream=None, m_index=None, k_offsets=None, row_scale=None, d_scales=None) -> torch.Tensor:
        nonlocal relaunch
        if (row_scale is not None) != consts["ROW_SCALE"] or (d_scales is not None) != bool(gated):
            raise ValueError("a run takes row_scale / d_scales exactly when its plan was made with them")
        index = m_index if grouping == M_GROUPED else k_offsets
        # read only by a ROW_SCALE / GATED plan: row_scale_ptr / d_scale_ptr; by an in-place one: a_blocks, b_blocks
        epilogue = (d if row_scale is None else row_scale, d if d_scales is None else d_scales)
        after_pointers = unsplit_after
        if after_pointers is None:
            after_pointers = (*before_tail, *tails(stream), *after_tail)
        if relaunch is not None and as_given:
            (a_data, sa), (b_data, sb) = a, b
            sb_tma = sb if grouping == K_GROUPED else sa
            blocks = (a_data, b_data) if in_place else (d, d)
            pointers = (sb, sb if index is None else index, *epilogue, *blocks)
            relaunch((a_data, b_data, b_data, sa, sb_tma, d, d), (*pointers, *after_pointers), stream)
            return d
        ops = ws_operands(a, b, d, m_index, k_offsets)
        blocks = (ops.a, ops.b) if in_place else (d, d)
        pointers = (ops.sb, ops.sb if ops.index is None else ops.index, *epilogue, *blocks)
        if relaunch is not None:
            relaunch(tma_operands(ops, grouping), (*pointers, *after_pointers), stream)
            return d
        on_stream = contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
        with on_stream, scratch_allocator() if in_place else contextlib.nullcontext():
            compiled = fp8_gemm_ws_kernel[grid](
                **ws_descriptors(cfg, ops, grouping),
                **dict(zip(("sb_ptr", "group_ptr", "row_scale_ptr", "d_scale_ptr", "a_blocks", "b_blocks"), pointers)),
                **dict(zip(after_names, after_pointers)), num_warps=cfg.num_warps, **COMPILE_OPTIONS,
            )  # fmt: skip
        relaunch = Relaunch(compiled, grid, d.device, tma_shapes)
        return d

    run.tails = tails
    return run
