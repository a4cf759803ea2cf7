"""Dense GEMMs above the decode sizes: the persistent-tile kernel's configs (``ops/cutile/gemm.py``) and its
split-K plan. Measurements: ``docs/notes/heuristics.md``, "Dense tiles" and "Split-K"."""

from __future__ import annotations

from dataclasses import dataclass

from tilegemm.heuristics.cutile.problem import Problem, Rule, TileConfig, first
from tilegemm.ops.common import cdiv


@dataclass(frozen=True, kw_only=True)
class DenseConfig(TileConfig):
    """Tile config of a dense GEMM kernel: a :class:`TileConfig` and

    ``dtype`` the kernel (``"bf16"``/``"fp8"``), ``scale_tma`` whether FP8 scale tiles may use TMA,
    ``nh`` the number of column parts (FP8 promotion chains) of a tile, ``min_split_kb`` the fewest K
    blocks a split-K unit gets.
    """

    dtype: str
    scale_tma: bool = True
    nh: int = 1
    min_split_kb: int = 4

    @property
    def name(self) -> str:
        parts = [f"{self.dtype}_{super().name}"]
        if self.dtype == "fp8" and not self.scale_tma:
            parts.append("ldgscale")
        if self.nh > 1:
            parts.append(f"nh{self.nh}")
        return "_".join(parts)


@dataclass(frozen=True)
class SplitPlan:
    """How a GEMM's output tiles become work units: each of the ``tiles`` is cut into ``splits`` K ranges
    (fp32 partials summed in order by a reduce kernel); ``splits == 1``: no split."""

    tiles: int
    splits: int

    @property
    def units(self) -> int:
        return self.tiles * self.splits


BF16_CONFIGS: tuple[DenseConfig, ...] = (DenseConfig(128, 128, 64, dtype="bf16"),)
#: FP8, M > SMALL_M, K > 4096: 64x128 tiles, two CTAs per SM (their MMA and promotion phases
#: interleave), scale tiles through TMA.
FP8_LARGE_K = DenseConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2, dtype="fp8")
#: FP8, M > SMALL_M, K <= 4096: the same with scales read by plain loads (fewer barrier waits per K block).
FP8_SMALL_K = DenseConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2, dtype="fp8", scale_tma=False)
#: FP8, M <= SMALL_M: 128x256 tiles as two 128-wide promotion chains over two warpgroups.
FP8_SMALL_M = DenseConfig(128, 256, 128, fast_acc=True, num_worker_warps=8, dtype="fp8", nh=2)
FP8_CONFIGS: tuple[DenseConfig, ...] = (FP8_LARGE_K, FP8_SMALL_K, FP8_SMALL_M)
SMALL_M = 256

#: The tile kernel's configs, first match wins.
TILE_RULES: tuple[Rule, ...] = (
    Rule(lambda p: p.dtype == "bf16", BF16_CONFIGS[0], "one 128x128x64 tile (benchmarks/results/dense_h100.md)"),
    Rule(lambda p: p.m <= SMALL_M, FP8_SMALL_M, "two promotion chains per tile at few rows (notes: Dense tiles)"),
    Rule(lambda p: p.k > 4096, FP8_LARGE_K, "TMA scale tiles win at K = 7168 by 4-6% (notes: Dense tiles)"),
    Rule(lambda p: True, FP8_SMALL_K, "plain scale loads win at K = 1536/2048 by 5-12% (notes: Dense tiles)"),
)


def all_dense_configs() -> tuple[DenseConfig, ...]:
    """Every config :func:`dense_tile_config` can return (the CPU compile gate compiles each)."""
    return BF16_CONFIGS + FP8_CONFIGS


def dense_tile_config(p: Problem) -> DenseConfig:
    """The persistent-tile config of dense problem ``p`` (what the chooser takes above the decode sizes):
    the first of :data:`TILE_RULES` that applies."""
    return first(TILE_RULES, p)


MAX_SPLITS = 32  # K splits of a dense tile-kernel GEMM at most
#: Split-K only from this K on: below it every split plan measured slower (notes: Split-K).
SPLIT_MIN_K = 4096
SPLIT_BELOW = 0.5  # split-K only grids that fill less than this share of the CTA slots


def split_plan(p: Problem, cfg: DenseConfig) -> SplitPlan:
    """Split-K plan of dense problem ``p`` under ``cfg``: a grid that fills less than half the CTA slots is
    split along K when K is at least :data:`SPLIT_MIN_K`.

    Each split gets at least ``cfg.min_split_kb`` K blocks; at most :data:`MAX_SPLITS`. Grids of a wave or more
    are not split: splitting only a partial last wave (stream-K style) measured slower (notes: Split-K).
    """
    tiles = cdiv(p.m, cfg.bm) * cdiv(p.n, cfg.bn)
    slots = max(1, p.sms) * cfg.ctas_per_sm
    num_kb = cdiv(p.k, cfg.bk)
    if tiles >= SPLIT_BELOW * slots or p.k < SPLIT_MIN_K:
        return SplitPlan(tiles, 1)
    splits = min(slots // tiles, num_kb // max(1, cfg.min_split_kb), MAX_SPLITS)
    return SplitPlan(tiles, max(1, splits))
