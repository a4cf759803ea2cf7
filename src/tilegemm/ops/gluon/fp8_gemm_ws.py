"""Host side of the warp-specialized gluon FP8 GEMM (:mod:`fp8_gemm_ws_kernel`): ``D = A @ B.T``, DeepGEMM's recipe.

:func:`ws_plan`: problem (:func:`ws_problem`) -> config (:func:`ws_config`) -> grid; the first run launches through
triton's JIT with :func:`ws_descriptors`, later runs go to the compiled kernel. Tests and benchmarks run a
fresh plan (``ws_plan(a, b, d, cfg)(a, b, d)``); the gluon backend's ``fp8_fp4_gemm_*`` keep plans
(:mod:`tilegemm.ops.gluon.gemm`). :data:`VARIANTS` names the designs; the backend runs
:data:`tilegemm.heuristics.gluon.DENSE_FP8_WS_DESIGN`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from tilegemm.heuristics.gluon import BARRIER_BYTES, SMEM_BYTES
from tilegemm.ops import operands
from tilegemm.ops.gluon.fp8_gemm_ws_kernel import BLOCK_K, MMA_WARPS, NARROW_N, WAVE_M, fp8_gemm_ws_kernel
from tilegemm.ops.gluon.tma import SCALE_LAYOUT, Relaunch, descriptor, tma_strides

__all__ = ["VARIANTS", "WsConfig", "ws_plan"]


class WsConfig(NamedTuple):
    """One launch of :func:`fp8_gemm_ws_kernel`.

    ``block_n`` 128 or 192 (128 + 64 sub-tiles); ``waves`` 1 (128-row tile) or 2 (256 rows); ``persistent``: grid of
    at most one CTA per SM; ``overlap``: K blocks per software-pipelined run with the next step's wgmma before the
    current promotion (0: off; 1, 2, 4 or 8); ``stages``: ring depth,
    0 for the deepest that fits; ``group_m``: row tiles per column sweep; ``loader_regs``: the TMA warp's registers.
    """

    block_n: int = 128
    waves: int = 2
    persistent: bool = True
    overlap: int = 0
    stages: int = 0
    group_m: int = 8
    loader_regs: int = 56


#: The designs of the prototype, by name: (a) the MMA warpgroups in the default partition, (b) 256x128 as two waves,
#: persistent, (c) 128x192 from 128 + 64 sub-tiles, (d) the next step's wgmma before the promotion (runs of 2 or 4
#: K blocks), and mixes.
VARIANTS: dict[str, WsConfig] = {
    "a_128x128": WsConfig(block_n=128, waves=1, persistent=False),
    "a_128x128_p": WsConfig(block_n=128, waves=1, persistent=True),
    "d_128x128_ov": WsConfig(block_n=128, waves=1, persistent=True, overlap=2),
    "d_128x128_ov4": WsConfig(block_n=128, waves=1, persistent=True, overlap=4),
    "b_256x128": WsConfig(block_n=128, waves=2, persistent=True),
    "b_256x128_np": WsConfig(block_n=128, waves=2, persistent=False),
    "bd_256x128_ov": WsConfig(block_n=128, waves=2, persistent=True, overlap=1),
    "c_128x192": WsConfig(block_n=192, waves=1, persistent=True),
    "cd_128x192_ov": WsConfig(block_n=192, waves=1, persistent=True, overlap=2),
}


class Problem(NamedTuple):
    """An FP8 GEMM's sizes and output dtype."""

    m: int
    n: int
    k: int
    out_dtype: torch.dtype


def stage_bytes(cfg: WsConfig) -> int:
    """Shared memory of one ring stage: the A and B tiles and A's scales."""
    return (WAVE_M * cfg.waves + cfg.block_n) * BLOCK_K + 4 * WAVE_M * cfg.waves


def staging_bytes(cfg: WsConfig, out_bytes: int) -> int:
    """Shared memory of the output staging tiles (one wave of every sub-tile)."""
    return WAVE_M * cfg.block_n * out_bytes


def max_stages(cfg: WsConfig, out_bytes: int) -> int:
    """The deepest ring that fits in a CTA's shared memory beside the output staging tiles."""
    return (SMEM_BYTES - BARRIER_BYTES - staging_bytes(cfg, out_bytes)) // stage_bytes(cfg)


def ws_config(problem: Problem, cfg: WsConfig | None = None) -> WsConfig:
    """``cfg`` (default: :class:`WsConfig`'s, the 256x128 two-wave persistent design) with its ring depth set: the
    deepest that fits when ``cfg.stages`` is 0, else no deeper than fits."""
    cfg = cfg or WsConfig()
    out_bytes = torch.empty(0, dtype=problem.out_dtype).element_size()
    deepest = min(max_stages(cfg, out_bytes), 8)
    if deepest < 2:
        raise ValueError(f"{cfg} leaves no room for a two-stage ring with a {problem.out_dtype} output")
    return cfg._replace(stages=deepest if cfg.stages <= 0 else min(cfg.stages, deepest))


def block_shapes(cfg: WsConfig) -> dict[str, list[int]]:
    """The TMA box of each descriptor: A, B's wide and narrow sub-tiles, A's scales, D's wide and narrow sub-tiles."""
    narrow = NARROW_N if cfg.block_n == 192 else 128
    return {
        "a": [WAVE_M * cfg.waves, BLOCK_K],
        "b0": [128, BLOCK_K],
        "b1": [narrow, BLOCK_K],
        "sa": [1, WAVE_M * cfg.waves],
        "d0": [WAVE_M, 128],
        "d1": [WAVE_M, narrow],
    }


def constants(cfg: WsConfig) -> dict[str, Any]:
    """The kernel's constexpr arguments for ``cfg`` (its ring depth already set)."""
    return {
        "BLOCK_N": cfg.block_n,
        "WAVES": cfg.waves,
        "STAGES": cfg.stages,
        "GROUP_M": cfg.group_m,
        "PERSISTENT": cfg.persistent,
        "OVERLAP": cfg.overlap,
        "LOADER_REGS": cfg.loader_regs,
    }


class Operands(NamedTuple):
    """The tensors the kernel reads and writes, in the layouts its descriptors take."""

    a: torch.Tensor  # [M, K] fp8, row-major
    b: torch.Tensor  # [N, K] fp8, row-major
    sa_t: torch.Tensor  # [ceil(K/128), M] fp32, row pitch a multiple of 16 bytes
    sb: torch.Tensor  # [ceil(N/128), ceil(K/128)] fp32, unit last stride
    d: torch.Tensor  # [M, N] bf16 or fp32


def ws_problem(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor
) -> tuple[Problem, Operands]:
    """Check a call and put its operands in the layouts the kernel reads (:func:`ws_operands`)."""
    (a_data, sa), (b_data, sb) = a, b
    m, k = a_data.shape
    n = b_data.shape[0]
    if a_data.dtype != torch.float8_e4m3fn or b_data.dtype != torch.float8_e4m3fn:
        raise ValueError("A and B must be float8_e4m3fn")
    if b_data.shape[1] != k or tuple(d.shape) != (m, n) or min(m, n, k) == 0:
        raise ValueError(f"shapes A {tuple(a_data.shape)}, B {tuple(b_data.shape)}, D {tuple(d.shape)}")
    kb, nb = operands.cdiv(k, BLOCK_K), operands.cdiv(n, 128)
    if tuple(sa.shape) != (m, kb) or tuple(sb.shape) != (nb, kb):
        raise ValueError(f"scales: sa {tuple(sa.shape)} (want {(m, kb)}), sb {tuple(sb.shape)} (want {(nb, kb)})")
    if d.dtype not in (torch.bfloat16, torch.float32) or not operands.tma_ready(d):
        raise ValueError("D must be bf16 or fp32 and TMA-aligned (16-byte row pitch and base)")
    return Problem(m, n, k, d.dtype), ws_operands(a, b, d)


def ws_operands(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor
) -> Operands:
    """The operands of a checked call in the layouts the kernel reads (copies only where needed)."""
    (a_data, sa), (b_data, sb) = a, b
    sb_arr = sb.float()
    if sb_arr.stride(1) != 1:
        sb_arr = sb_arr.contiguous()
    return Operands(
        operands.as_row_major(a_data),
        operands.as_row_major(b_data),
        operands.as_row_major(sa.float().t()),
        sb_arr,
        d,
    )


def tma_operands(ops: Operands) -> tuple[torch.Tensor, ...]:
    """The tensors under the kernel's TMA descriptors, in its parameter order (``a_desc`` ... ``d1_desc``)."""
    return ops.a, ops.b, ops.b, ops.sa_t, ops.d, ops.d


def ws_descriptors(cfg: WsConfig, ops: Operands) -> dict[str, Any]:
    """The kernel's TMA descriptors over ``ops`` for ``cfg``, by parameter name."""
    box = block_shapes(cfg)
    return {
        "a_desc": descriptor(ops.a, box["a"]),
        "b0_desc": descriptor(ops.b, box["b0"]),
        "b1_desc": descriptor(ops.b, box["b1"]),
        "sa_desc": descriptor(ops.sa_t, box["sa"], SCALE_LAYOUT),
        "d0_desc": descriptor(ops.d, box["d0"]),
        "d1_desc": descriptor(ops.d, box["d1"]),
    }


def ws_grid(cfg: WsConfig, problem: Problem, num_sms: int) -> tuple[int]:
    """One CTA per output tile, or at most one per SM when persistent."""
    tiles = operands.cdiv(problem.m, WAVE_M * cfg.waves) * operands.cdiv(problem.n, cfg.block_n)
    return (max(1, min(tiles, num_sms)) if cfg.persistent else tiles,)


def ws_plan(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    cfg: WsConfig | None = None,
    num_sms: int | None = None,
) -> Callable[..., torch.Tensor]:
    """The launch plan of calls shaped as this one: ``run(a, b, d, stream=None) -> d``.

    Problem -> :func:`ws_config` -> grid, and what a call's operand metadata fixes (the descriptors' shapes and
    strides, B's scale pitch), settled once here: a run is valid for operands with this call's shapes, strides,
    dtypes and alignment (the gluon backend keys its plans by them). The first run launches through triton's JIT
    (it compiles); later runs go straight to the compiled kernel's launcher (:class:`tma.Relaunch`), with the
    operands as given where the first call's were already in the kernel's layouts (the same metadata, the same
    layouts), else through :func:`ws_operands`. A run computes ``d = dequant(a) @ dequant(b).T`` on ``stream``
    (``None``: the current one) and returns ``d``.

    Args:
        a: (fp8 e4m3 [M, K] K-major, fp32 sa [M, ceil(K/128)], best MN-major and TMA-aligned as
            ``get_mn_major_tma_aligned_tensor`` makes it: then no copy).
        b: (fp8 e4m3 [N, K] K-major, fp32 sb [ceil(N/128), ceil(K/128)]: one scale per 128x128 block).
        d: bf16 or fp32 [M, N], TMA-aligned; every element is written.
        cfg: the design (:data:`VARIANTS` names some); ``None``: :class:`WsConfig`'s default. Its ring depth is
            set by :func:`ws_config`.
        num_sms: SMs for the persistent grid; ``None``: the device's count.
    """
    problem, first = ws_problem(a, b, d)
    cfg = ws_config(problem, cfg)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(d.device).multi_processor_count
    grid = (*ws_grid(cfg, problem, num_sms), 1, 1)
    consts = constants(cfg)
    fixed = {"sb_stride": first.sb.stride(0), "M": problem.m, "N": problem.n, "K": problem.k, **consts}
    names = fp8_gemm_ws_kernel.arg_names
    after_sb = tuple(fixed[name] for name in names[names.index("sb_ptr") + 1 :])
    tma_shapes = [(list(t.shape), tma_strides(t)) for t in tma_operands(first)]
    (a_data, sa), (b_data, sb) = a, b
    # the operands already in the kernel's layouts (no copy, no cast): a launch reads them as given
    as_given = first.a is a_data and first.b is b_data and first.sb is sb and first.sa_t.data_ptr() == sa.data_ptr()
    as_given = as_given and sa.dtype == torch.float32
    relaunch = None

    def run(a, b, d, stream: torch.cuda.Stream | None = None) -> torch.Tensor:
        nonlocal relaunch
        if relaunch is not None and as_given:
            (a_data, sa), (b_data, sb) = a, b
            relaunch((a_data, b_data, b_data, sa, d, d), (sb, *after_sb), stream)
            return d
        ops = ws_operands(a, b, d)
        if relaunch is not None:
            relaunch(tma_operands(ops), (ops.sb, *after_sb), stream)
            return d
        with contextlib.nullcontext() if stream is None else torch.cuda.stream(stream):
            compiled = fp8_gemm_ws_kernel[grid](**ws_descriptors(cfg, ops), sb_ptr=ops.sb, **fixed, num_warps=MMA_WARPS)
        relaunch = Relaunch(compiled, grid, d.device, tma_shapes)
        return d

    return run
