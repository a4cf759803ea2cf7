"""Fused MoE experts: which path a call takes (per slot, expert blocks, sorted tiles; FP8 block or row form) and
its tiles (``ops/cutile/moe*.py``). Measurements: ``benchmarks/results/moe/paths_h100.md`` and
``docs/notes/heuristics.md``, "MoE experts"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from tilegemm.heuristics.cutile.problem import MOE_VARIANT_ENV, MOE_VARIANTS, Problem, TileConfig, forced
from tilegemm.ops.common import cdiv

#: Routed slots per expert, and routed slots in all, up to which an MoE call is decode-sized
#: (:func:`moe_decode_sized`): the per-slot path; above, the block path (``ops/cutile/moe_blocks.py``). Per slot won
#: by 1-5% within both bounds, the blocks by 3-5% beyond either (notes, "MoE paths").
MOE_DECODE_SLOTS_PER_EXPERT = 1
MOE_DECODE_MAX_SLOTS = 64


def moe_decode_sized(tokens: int, top_k: int, experts: int) -> bool:
    """True when the ``tokens * top_k`` routed slots are at most :data:`MOE_DECODE_SLOTS_PER_EXPERT` per expert
    and :data:`MOE_DECODE_MAX_SLOTS` in all: reading each slot's expert weights directly (an expert shared by
    several slots is read again) costs less than sorting the slots by expert (two routing launches and a gather)."""
    slots = tokens * top_k
    return slots <= MOE_DECODE_SLOTS_PER_EXPERT * experts and slots <= MOE_DECODE_MAX_SLOTS


#: Mean routed rows per expert up to which the fused experts op takes a call that is not decode-sized with its
#: block path (``ops/cutile/moe_blocks.py``); above it the sorted path (``ops/cutile/moe.py``): blocks won at 16 rows
#: per expert on all three models, lost at 32 on two of three (notes, "MoE paths").
MOE_BLOCKS_MAX_ROWS = 16


def moe_blocks_sized(tokens: int, top_k: int, experts: int) -> bool:
    """True when the fused experts op takes the per-slot or the block path for ``tokens * top_k`` routed slots
    over ``experts``: at most :data:`MOE_BLOCKS_MAX_ROWS` rows per expert on average (every decode-sized call,
    :func:`moe_decode_sized`, is within that)."""
    return tokens * top_k <= MOE_BLOCKS_MAX_ROWS * experts


#: The combine kernel's tile: tokens, and the widest column count (a power of two dividing H); the configs' defaults.
MOE_COMBINE_BT = 16
MOE_COMBINE_MAX_BN = 256


@dataclass(frozen=True)
class MoEConfig:
    """Configs of the fused experts kernels (``ops/cutile/moe.py``).

    ``up``: the gate/up GEMM (two ``bm x bn`` fp32 accumulators: gate and up columns); ``down``: the down
    GEMM; both share ``bm``, which is also the row alignment of each expert's segment.
    ``combine_bt x combine_bn``: the combine kernel's tile (tokens x columns; ``combine_bn`` divides H).
    """

    path: ClassVar[str] = "sorted"
    up: TileConfig
    down: TileConfig
    combine_bt: int = MOE_COMBINE_BT
    combine_bn: int = MOE_COMBINE_MAX_BN

    @property
    def bm(self) -> int:
        return self.up.bm

    @property
    def row_align(self) -> int:
        """Rows each expert's segment is padded to: the tiles' rows."""
        return self.up.bm

    @property
    def name(self) -> str:
        return self.up.name


#: Sorted path tiles: gate/up two 128x128 fp32 accumulators over 8 warps (4 spill), down 128x256 over 8 warps;
#: 1.2-1.3x the former 128x64 / 128x128 tiles (notes, "MoE experts: sorted tiles").
MOE_UP_CONFIGS = {64: TileConfig(64, 64, 64), 128: TileConfig(128, 128, 64, num_worker_warps=8)}
MOE_DOWN_CONFIGS = {64: TileConfig(64, 128, 64), 128: TileConfig(128, 256, 64, num_worker_warps=8)}
#: Mean rows per expert at or below which experts' segments are 64-row aligned (64-row tiles).
MOE_SMALL_ROWS = 64


def all_moe_configs() -> tuple[MoEConfig, ...]:
    """Every (gate/up, down) pair :func:`choose` can return for ``moe`` (the CPU gate compiles each kernel variant)."""
    return tuple(MoEConfig(MOE_UP_CONFIGS[bm], MOE_DOWN_CONFIGS[bm]) for bm in MOE_UP_CONFIGS)


def moe_config(p: Problem) -> MoEConfig | MoESlotsConfig | MoEBlocksConfig:
    """Fused experts (``p.m`` routed slots, ``p.groups`` experts, ``p.n`` = H), the first path that fits (or the one
    ``p.variant`` forces, ``$TILEGEMM_MOE_VARIANT``): the per-slot kernels when decode-sized
    (:func:`moe_decode_sized`); the block kernels while the experts average at most :data:`MOE_BLOCKS_MAX_ROWS` rows
    each (:func:`moe_blocks_sized`); else the sorted path, 64-row tiles when the experts average at most
    :data:`MOE_SMALL_ROWS` rows each (a 128-row tile would be mostly padding; only a forced call gets there), else
    128. The combine's column tile is the largest power of two dividing H, at most :data:`MOE_COMBINE_MAX_BN`."""
    path = forced(p.variant, MOE_VARIANTS, MOE_VARIANT_ENV)
    if path == "slots" or (path is None and moe_decode_sized(p.m, 1, p.groups)):
        return moe_slots_config(p.n)
    if path == "blocks" or (path is None and moe_blocks_sized(p.m, 1, p.groups)):
        return moe_blocks_config(p.m, p.n, p.groups)
    bm = 64 if p.m <= MOE_SMALL_ROWS * p.groups else 128
    return MoEConfig(MOE_UP_CONFIGS[bm], MOE_DOWN_CONFIGS[bm], MOE_COMBINE_BT, combine_bn(p.n))


def moe_train_config(hidden: int) -> MoEConfig:
    """The training experts kernels (``ops/cutile/moe_train.py``) on the 128-row aligned layout: ``up`` for the
    gate/up forward and its backward (the same two-accumulator shape), ``down`` for the down forward and the
    input-gradient GEMM (both write [M, H] rows), the combine tile for the token kernels."""
    return MoEConfig(MOE_UP_CONFIGS[128], MOE_DOWN_CONFIGS[128], MOE_COMBINE_BT, combine_bn(hidden))


def combine_bn(hidden: int) -> int:
    """The combine kernel's column tile for hidden size ``hidden``: the largest power of two dividing it, at most
    :data:`MOE_COMBINE_MAX_BN`."""
    bn = MOE_COMBINE_MAX_BN
    while bn > 1 and hidden % bn:
        bn //= 2
    return bn


@dataclass(frozen=True)
class _SwapABConfig:
    """Tiles of the swap-AB experts kernels (per slot, expert blocks): ``bw`` weight rows x ``bk`` K per MMA (the
    weight tile, TMA), ``bt`` the MMA's N side, and the combine's tile; named after the path and the three."""

    path: ClassVar[str]
    bw: int
    bk: int
    bt: int = 8
    combine_bt: int = MOE_COMBINE_BT
    combine_bn: int = MOE_COMBINE_MAX_BN

    @property
    def name(self) -> str:
        return f"{self.path}_w{self.bw}_k{self.bk}_t{self.bt}"


@dataclass(frozen=True)
class MoESlotsConfig(_SwapABConfig):
    """Tiles of the per-slot experts kernels (``ops/cutile/moe_slots.py``): ``bw`` weight rows x ``bk`` K per
    MMA (the weight tile, TMA), ``bt`` the MMA's N side (the token row repeated), and the combine's tile."""

    path: ClassVar[str] = "slots"
    bw: int = 64
    bk: int = 256


def moe_slots_config(hidden: int, bw: int = 64, bk: int = 256) -> MoESlotsConfig:
    """Config of the per-slot experts kernels; the combine's column tile as in the sorted path."""
    return MoESlotsConfig(bw=bw, bk=bk, combine_bt=MOE_COMBINE_BT, combine_bn=combine_bn(hidden))


#: The block kernels' row tile (the MMA's N side): the power of two covering twice the mean rows per touched
#: expert, between these bounds (a block holds most experts' rows whole: one weight stream per expert).
MOE_BLOCKS_MIN_BT = 8
MOE_BLOCKS_MAX_BT = 64


@dataclass(frozen=True)
class MoEBlocksConfig(_SwapABConfig):
    """Tiles of the block experts kernels (``ops/cutile/moe_blocks.py``): ``bw`` weight rows x ``bk`` K per MMA
    (the weight tile, TMA), ``bt`` rows per block (the MMA's N side and each expert's row alignment), and
    the combine's tile. 128 x 128 weight tiles: 0-8% faster than 64 x 256 and 64 x 128 from 16 tokens on, on all
    three models (``benchmarks/results/moe/paths_h100.md``)."""

    path: ClassVar[str] = "blocks"
    bw: int = 128
    bk: int = 128

    @property
    def row_align(self) -> int:
        """Rows each expert's segment is padded to: one block."""
        return self.bt


def moe_blocks_config(
    slots: int, hidden: int, experts: int, bw: int = MoEBlocksConfig.bw, bk: int = MoEBlocksConfig.bk
) -> MoEBlocksConfig:
    """Config of the block experts kernels for ``slots`` routed rows over ``experts``: ``bt`` from
    :data:`MOE_BLOCKS_MIN_BT` / :data:`MOE_BLOCKS_MAX_BT`; the combine's column tile as in the sorted path."""
    mean = cdiv(max(slots, 1), max(1, min(experts, slots)))
    bt = MOE_BLOCKS_MIN_BT
    while bt < 2 * mean and bt < MOE_BLOCKS_MAX_BT:
        bt *= 2
    return MoEBlocksConfig(bw=bw, bk=bk, bt=bt, combine_bt=MOE_COMBINE_BT, combine_bn=combine_bn(hidden))


#: FP8 fused experts, row form (``moe_fp8._tile_gate_up`` / ``_tile_down``): 64-row tiles x 128 columns x 128 of K
#: per step, 4 warps, two CTAs per SM for both GEMMs: 1.1-1.5x 128-row tiles and 8-warp tiles (notes, "MoE FP8").
MOE_FP8_TILE_CONFIG = MoEConfig(
    TileConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2),
    TileConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2),
)
#: Mean routed rows per touched expert from which the FP8 op takes the row form.
MOE_FP8_TILE_MIN_ROWS = 16


def moe_fp8_config(p: Problem) -> MoEBlocksConfig | MoEConfig:
    """Config of the FP8 fused experts (``ops/cutile/moe_fp8.py``, family ``moe_fp8``) for ``p.m`` routed rows over
    ``p.groups`` experts, ``p.n = H``.

    The block form (swap-AB, 128x128 weight tiles, ``bt`` as :func:`moe_blocks_config` chooses it) while the touched
    experts average fewer than :data:`MOE_FP8_TILE_MIN_ROWS` rows, else the row form (:data:`MOE_FP8_TILE_CONFIG`).
    ``p.variant`` (``$TILEGEMM_MOE_VARIANT``) forces ``blocks`` or ``sorted`` (the row form); ``slots`` means the
    block form here."""
    slots, hidden, experts = p.m, p.n, p.groups
    path = forced(p.variant, MOE_VARIANTS, MOE_VARIANT_ENV)
    mean = cdiv(max(slots, 1), max(1, min(experts, slots)))
    if path == "sorted" or (path is None and mean >= MOE_FP8_TILE_MIN_ROWS):
        return replace(MOE_FP8_TILE_CONFIG, combine_bn=combine_bn(hidden))
    return moe_blocks_config(slots, hidden, experts, bw=128, bk=128)
