"""Kernel config choice for the cutile backend: one problem description in, one config out.

A host path describes its GEMM as a :class:`Problem` (family, dtype, M, N, K, groups, SMs; the layout
:class:`Kind` for grouped GEMMs) and :func:`choose` returns the config from host sizes only: no
device reads, no runtime search (a first call never autotunes). The rules, per family:

* ``dense``: at most :data:`DECODE_MAX_M` rows take a decode kernel: above :data:`NARROW_MIN_M` rows (calls
  without ``c``) the narrow-tile kernel (:class:`NarrowConfig` from :func:`narrow_config`), else the swap-AB kernel
  where :func:`takes_decode` (:class:`DecodeConfig`, launch shape from :func:`decode_plan`); others a fixed,
  measured table of tile configs
  (:class:`DenseConfig`: BF16 one 128x128x64 tile, FP8 by M and K), whose grids are split along K
  when they fill less than half the machine (:func:`split_plan`).
* ``grouped``: m-grouped (``m_indices``, psum, masked) and k-grouped tiles (:class:`TileConfig`).
* ``moe``: the fused experts' path and tiles: per slot at decode sizes (:class:`MoESlotsConfig`), few-row
  expert blocks next (:class:`MoEBlocksConfig`), persistent tiles at prefill sizes (:class:`MoEConfig`).

MQA logits (not GEMMs) are chosen from heads, head size and compute capability: :func:`mqa_logits_config`,
:func:`paged_mqa_config`; the RMSNorm kernel's row tiles from the row length: :func:`rms_norm_config`.
``TILEGEMM_PRINT_CONFIGS=1`` makes :func:`print_once` print each choice once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from enum import IntEnum

from tilegemm.env import env_choice
from tilegemm.heuristics.report import print_once
from tilegemm.ops.common import cdiv, moe_blocks_sized, moe_decode_sized

__all__ = [
    "Kind",
    "Problem",
    "choose",
    "TileConfig",
    "DenseConfig",
    "SplitPlan",
    "DecodeConfig",
    "DecodePlan",
    "NarrowConfig",
    "narrow_config",
    "MoEConfig",
    "MoESlotsConfig",
    "MoEBlocksConfig",
    "MqaConfig",
    "PagedMqaConfig",
    "BF16_CONFIGS",
    "FP8_CONFIGS",
    "SMALL_M",
    "DECODE_CONFIGS",
    "all_dense_configs",
    "all_grouped_configs",
    "all_moe_configs",
    "moe_slots_config",
    "moe_blocks_config",
    "dense_tile_config",
    "split_plan",
    "decode_config",
    "decode_plan",
    "mqa_logits_config",
    "paged_mqa_config",
    "NormConfig",
    "rms_norm_config",
    "print_once",
]


class Kind(IntEnum):
    """Layout of a grouped GEMM: the ``KIND`` constant of the grouped kernels (``ops/cutile/grouped.py``).

    Kernel code compares ``KIND`` with the members; a launch passes ``int(kind)`` (a cuTile constant
    argument must be a plain int: an enum member fails the JIT's name mangling).
    """

    INDICES = 0  # m-grouped, ``m_indices[M]``: every row block names its expert
    PSUM = 1  # m-grouped, ``offs[G]`` cumulative group ends
    MASKED = 2  # m-grouped, ``[G, Mmax, *]`` with ``masked_m[G]`` valid rows
    K = 3  # k-grouped, one output per group


@dataclass(frozen=True)
class Problem:
    """A GEMM as the config choice sees it: host sizes only.

    ``family``: ``"dense"``, ``"grouped"``, ``"moe"`` or ``"moe_train"`` (only ``n = H`` is read);
    ``dtype``: ``"bf16"`` or ``"fp8"``; ``sms``: SMs
    persistent kernels may use. ``m, n, k``: dense, ``D [M, N]`` over ``K``; grouped, ``m`` the rows of the
    row space (``M_sum``, ``G * Mmax``, or each k-grouped output's M) and ``k`` the inner size (``K_sum``
    k-grouped); moe, ``m = T * top_k`` routed rows, ``n = H``, ``k = I`` (the down GEMM). ``groups``: G
    (moe: experts). ``kind``: the grouped layout; ``expected_m``: the masked op's rows-per-group hint;
    ``has_c``: a k-grouped addend.
    """

    family: str
    dtype: str
    m: int
    n: int
    k: int
    sms: int
    groups: int = 1
    kind: Kind | None = None
    expected_m: int = 0
    has_c: bool = False


def choose(p: Problem) -> TileConfig | NarrowConfig | DecodeConfig | MoEConfig | MoESlotsConfig | MoEBlocksConfig:
    """The config of problem ``p``: a :class:`NarrowConfig`, :class:`DecodeConfig` or :class:`DenseConfig` (dense), a
    :class:`TileConfig` (grouped) or a :class:`MoESlotsConfig` / :class:`MoEBlocksConfig` / :class:`MoEConfig`
    (moe: decode sizes, a few rows per expert, prefill; moe_train: :func:`moe_train_config`)."""
    if p.family == "dense":
        return narrow_config(p) or (decode_config() if takes_decode(p) else dense_tile_config(p))
    if p.family == "grouped":
        return _grouped_config(p)
    if p.family == "moe":
        return _moe_config(p)
    if p.family == "moe_train":
        return moe_train_config(p.n)
    raise ValueError(f"Problem.family: got {p.family!r}, expected 'dense', 'grouped', 'moe' or 'moe_train'")


# ------------------------------------------------------------------------------ tile configs


@dataclass(frozen=True)
class TileConfig:
    """Tile config of a persistent GEMM kernel (dense, grouped, fused MoE).

    ``bm x bn`` output tile, ``bk`` K step (128 for FP8: one scale block), ``gm`` row blocks per
    swizzle band, ``fast_acc`` FP8 MMA mode (promoted every 128 of K), ``num_worker_warps``/
    ``occupancy``/``num_ctas`` the cuTile compiler hints (``None``: auto).
    """

    bm: int
    bn: int
    bk: int
    gm: int = 8
    fast_acc: bool = False
    num_worker_warps: int | None = None
    occupancy: int | None = None
    num_ctas: int | None = None

    @property
    def ctas_per_sm(self) -> int:
        return self.occupancy or 1

    @property
    def name(self) -> str:
        parts = [f"{self.bm}x{self.bn}x{self.bk}", f"g{self.gm}"]
        if self.num_worker_warps:
            parts.append(f"w{self.num_worker_warps}")
        if self.occupancy:
            parts.append(f"o{self.occupancy}")
        if self.num_ctas:
            parts.append(f"c{self.num_ctas}")
        if self.fast_acc:
            parts.append("fa")
        return "_".join(parts)

    def compiler_options(self) -> dict[str, int]:
        """Keyword arguments for ``ct.kernel`` (only the hints that are set)."""
        opts = {"num_worker_warps": self.num_worker_warps, "occupancy": self.occupancy, "num_ctas": self.num_ctas}
        return {k: v for k, v in opts.items() if v is not None}


# ------------------------------------------------------------------------------ dense GEMMs


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


# Measured on an H100 (docs/kernels.md, benchmarks/results/dense_h100.*).
BF16_CONFIGS: tuple[DenseConfig, ...] = (DenseConfig(128, 128, 64, dtype="bf16"),)

#: FP8, M > SMALL_M, K > 4096: 64x128 tiles, two CTAs per SM (their MMA and promotion phases
#: interleave), scale tiles through TMA.
FP8_LARGE_K = DenseConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2, dtype="fp8")
#: FP8, M > SMALL_M, K <= 4096: the same with scales read by plain loads (fewer barrier waits
#: per K block; +5-12% at K = 1536/2048, -4-6% at K = 7168).
FP8_SMALL_K = DenseConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2, dtype="fp8", scale_tma=False)
#: FP8, M <= SMALL_M: 128x256 tiles as two 128-wide promotion chains over two warpgroups.
FP8_SMALL_M = DenseConfig(128, 256, 128, fast_acc=True, num_worker_warps=8, dtype="fp8", nh=2)
FP8_CONFIGS: tuple[DenseConfig, ...] = (FP8_LARGE_K, FP8_SMALL_K, FP8_SMALL_M)
SMALL_M = 256


def all_dense_configs() -> tuple[DenseConfig, ...]:
    """Every config :func:`dense_tile_config` can return (the CPU compile gate compiles each)."""
    return BF16_CONFIGS + FP8_CONFIGS


def dense_tile_config(p: Problem) -> DenseConfig:
    """The persistent-tile config of dense problem ``p`` (what :func:`choose` takes above the decode sizes).

    BF16: one config (128x128x64). FP8: by M and K, see :data:`FP8_LARGE_K`, :data:`FP8_SMALL_K`,
    :data:`FP8_SMALL_M`.
    """
    if p.dtype == "bf16":
        return BF16_CONFIGS[0]
    if p.m <= SMALL_M:
        return FP8_SMALL_M
    return FP8_LARGE_K if p.k > 4096 else FP8_SMALL_K


MAX_SPLITS = 32  # K splits of a dense tile-kernel GEMM at most
#: Split-K only from this K on. H100 (results/dense_splitk/split_sweep_h100.json): at K = 768 and 2048 every split
#: plan was slower than none (BF16 512x2048x768: 13.0 us in 2 splits, 8.0 unsplit), at K = 7168 and 16384 every
#: split plan faster (1.3-2.2x); K between 2048 and 7168 was not measured.
SPLIT_MIN_K = 4096
SPLIT_BELOW = 0.5  # split-K only grids that fill less than this share of the CTA slots


def split_plan(p: Problem, cfg: DenseConfig) -> SplitPlan:
    """Split-K plan of dense problem ``p`` under ``cfg``: a grid that fills less than half the CTA slots is
    split along K when K is at least :data:`SPLIT_MIN_K`.

    Each split gets at least ``cfg.min_split_kb`` K blocks; at most :data:`MAX_SPLITS`. Grids
    of a wave or more are not split: splitting only a partial last wave (stream-K style) was
    measured slower on the H100 (bf16 4096x2112x7168: 408 TFLOP/s with it, 536 without), since
    the split-capable kernel and the extra reduce launch cost more than the idle tail.
    """
    tiles = cdiv(p.m, cfg.bm) * cdiv(p.n, cfg.bn)
    slots = max(1, p.sms) * cfg.ctas_per_sm
    num_kb = cdiv(p.k, cfg.bk)
    if tiles >= SPLIT_BELOW * slots or p.k < SPLIT_MIN_K:
        return SplitPlan(tiles, 1)
    splits = min(slots // tiles, num_kb // max(1, cfg.min_split_kb), MAX_SPLITS)
    return SplitPlan(tiles, max(1, splits))


# ------------------------------------------------------------------------ decode-size dense GEMMs


@dataclass(frozen=True)
class DecodeConfig:
    """A swap-AB decode kernel family (``ops/cutile/decode.py``) for dense GEMMs with few rows.

    ``bw`` weight rows per tile (the MMA's M side, 64 or 128); the activation tile ``bm`` (the MMA's
    N side) is the power of two covering M, between :data:`DECODE_MIN_BM` and ``bm_max``; ``ku``
    128-wide K blocks per FP8 step, ``bk_bf16`` the BF16 K step; ``splitk`` whether K may be split
    (reduced in the same launch); ``occupancy`` the CTAs-per-SM hint for activation tiles of at
    most 16 rows (``occupancy_mid`` at 32, ``occupancy_wide`` above; :func:`decode_plan` may lower it for an
    unsplit BF16 plan); ``splits`` a fixed K split count (0: sized by
    :func:`decode_plan`; the shipped variants use 0, the benchmark sweeps set it); ``latency`` a fixed latency
    hint of the weight and activation loads (1-10; 0: the compiler's choice; ``None``: chosen by
    :func:`decode_plan`, what the shipped variants use).
    """

    name: str
    bw: int
    ku: int = 1
    bk_bf16: int = 64
    bm_max: int = 128
    splitk: bool = True
    occupancy: int = 4
    occupancy_mid: int = 3
    occupancy_wide: int = 2
    splits: int = 0
    latency: int | None = None

    def tile_m(self, m: int, dtype: str = "bf16", k: int = 0) -> int:
        """The activation tile (MMA N side) for ``m`` rows: a power of two in [DECODE_MIN_BM, bm_max].

        FP8 below K = :data:`DECODE_FP8_BM32_MIN_K` skips the 32-row tile for the 64-row one. H100, 2026-11-24,
        harness timing (``results/decode/README.md``, "Occupancy"), 32 rows, 64-row tile vs 32-row tile at
        ``occupancy_mid``: 32x7168x2048 11.8 vs 24.2 us, 32x2048x768 6.1 vs 10.1; 32x2112x7168 18.2 vs 16.6,
        32x4096x7168 26.7 vs 23.8, 32x7168x16384 70.3 vs 64.5.
        """
        bm = DECODE_MIN_BM
        while bm < m and bm < self.bm_max:
            bm *= 2
        if dtype == "fp8" and bm == 32 and self.bm_max >= 64 and k < DECODE_FP8_BM32_MIN_K:
            bm = 64
        return bm

    def occupancy_for(self, bm: int) -> int:
        """CTAs per SM the kernel for activation tile ``bm`` is compiled for (what split-K sizes its units from).

        The hint sets the load stages tileiras fits (sm_90, 64 weight rows x 256 bytes of K per stage): at 4 CTAs
        per SM the FP8 split kernel with a 32-row tile got one stage and the BF16 16/32-row kernels two; at 3 the
        FP8 one two and the BF16 32-row ones two to three; at 2 the BF16 16-row lean kernel five.
        """
        if bm < 32:
            return self.occupancy
        return self.occupancy_mid if bm == 32 else self.occupancy_wide

    def warps_for(self, bm: int) -> int:
        """Worker warps: one warpgroup, two for a 64x128 (or larger) fp32 accumulator.

        (One warpgroup holding a 64x128 accumulator next to the FP8 product spills on sm_90.)
        """
        return 8 if self.bw * bm >= 64 * 128 else 4

    def compiler_options(self, bm: int, occupancy: int | None = None) -> dict[str, int]:
        """Keyword arguments for ``ct.kernel`` of the kernel with activation tile ``bm`` (``occupancy``: the plan's
        hint, ``None``: :meth:`occupancy_for`)."""
        return {"num_worker_warps": self.warps_for(bm), "occupancy": occupancy or self.occupancy_for(bm)}

    def step_k(self, dtype: str) -> int:
        """K elements per main-loop step."""
        return 128 * self.ku if dtype == "fp8" else self.bk_bf16


#: Swap-AB variants. ``w64k256``: 64 weight rows x 256 of K per step (32 KiB FP8 / 16 KiB BF16 per
#: stage is what a memory-bound CTA keeps in flight), 4 CTAs per SM for narrow activation tiles.
DECODE_W64_K256 = DecodeConfig("w64k256", bw=64, ku=2, bk_bf16=128)
#: Half the K step (more, smaller TMA loads; more stages fit).
DECODE_W64_K128 = DecodeConfig("w64k128", bw=64, ku=1, bk_bf16=64)
#: 128 weight rows per tile (half the activation re-reads from L2 at M = 64..256, half the CTAs).
DECODE_W128_K128 = DecodeConfig("w128k128", bw=128, ku=1, bk_bf16=64, occupancy=2, occupancy_wide=1)
#: ``w64k256`` without split-K (one unit per tile: what split-K buys).
DECODE_W64_NOSPLIT = DecodeConfig("w64k256ns", bw=64, ku=2, bk_bf16=128, splitk=False)
DECODE_CONFIGS: tuple[DecodeConfig, ...] = (DECODE_W64_K256, DECODE_W64_K128, DECODE_W128_K128, DECODE_W64_NOSPLIT)
DECODE_MIN_BM = 16
#: The activation tile :func:`decode_plan` narrows to, and the tiles per SM up to which it does.
DECODE_NARROW_BM = 64
DECODE_NARROW_WAVES = 2
#: Dense GEMMs with at most this many rows take the decode kernels.
DECODE_MAX_M = 256
#: ... except BF16 ones with more than DECODE_BF16_TILE_M rows and K <= DECODE_BF16_TILE_K whose weight rows
#: alone fill the SMs (more tiles than :func:`decode_plan` narrows): the persistent tile kernel was faster there
#: (H100, 2026-11-23, kernel-only: 256x7168x2048 16.6 us vs 18.0, 256x24576x1536 37.6 vs 44.8; at K = 7168 it
#: was 1.3-2x slower, at M = 128 no faster) and 5-6x slower where N is small (256x2048x768 32.7 us, cuBLAS 5.5;
#: 256x1536x2048 29.8 us, cuBLAS 7.6).
DECODE_BF16_TILE_M = 128
DECODE_BF16_TILE_K = 2048


def _narrow_fits(p: Problem, bw: int) -> bool:
    """Whether ``bw``-row weight tiles x :data:`DECODE_NARROW_BM`-row activation tiles of ``p`` stay within
    :data:`DECODE_NARROW_WAVES` per SM (:func:`decode_plan` then narrows the activation tile)."""
    return cdiv(p.n, bw) * cdiv(p.m, DECODE_NARROW_BM) <= DECODE_NARROW_WAVES * p.sms


def takes_decode(p: Problem) -> bool:
    """Whether dense problem ``p`` takes a swap-AB decode kernel (else the persistent-tile kernel)."""
    if p.m > DECODE_MAX_M:
        return False
    wide = not _narrow_fits(p, DECODE_CONFIGS[0].bw)
    return not (p.dtype == "bf16" and p.m > DECODE_BF16_TILE_M and p.k <= DECODE_BF16_TILE_K and wide)


#: Split-K bounds: at most this many splits, each of at least DECODE_MIN_STEPS K steps, and
#: the fp32 partial a split writes and its tile's last unit reads back at most
#: 1 / DECODE_PARTIAL_RATIO of the weight bytes the split streams.
DECODE_MAX_SPLITS = 16
DECODE_MIN_STEPS = 2
DECODE_PARTIAL_RATIO = 2
#: FP8 K steps from which tiles of at most 32 activation rows are split even when they fill 3/4 of the SMs.
DECODE_LONG_K_STEPS = 64
#: The load latency hint of the unsplit FP8 kernel with a 64-row activation tile at K >= DECODE_DEEP_MIN_K.
DECODE_DEEP_LATENCY = 2
DECODE_DEEP_MIN_K = 2048
#: FP8 tiles of 17-32 activation rows from this K on (below it, the 64-row tile: ``DecodeConfig.tile_m``).
DECODE_FP8_BM32_MIN_K = 4096
#: The CTAs-per-SM hint of an unsplit BF16 plan with at most 16 activation rows: more load stages than the 4 its
#: slot count assumes (``decode_plan``).
DECODE_BF16_UNSPLIT_OCCUPANCY = 2
#: No split-K when a tile's whole weight slice (``bw * K`` elements) is smaller than this: the split's fixed cost
#: (partial store, fence, counter atomic, the last unit's serial reload) outweighs the parallelism it buys.
DECODE_SPLIT_MIN_TILE_BYTES = 128 * 1024
DECODE_VARIANT_ENV = "TILEGEMM_DECODE_VARIANT"


@dataclass(frozen=True)
class DecodePlan:
    """Launch shape of a decode GEMM: activation tile ``bm``, tiles, K splits of ``per`` steps, grid, the
    latency hint of the kernel's loads (0: the compiler's choice) and its CTAs-per-SM hint (0:
    ``cfg.occupancy_for(bm)``)."""

    cfg: DecodeConfig
    bm: int
    num_m: int
    num_n: int
    steps: int
    splits: int
    per: int
    latency: int = 0
    occupancy: int = 0

    @property
    def tiles(self) -> int:
        return self.num_m * self.num_n

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.tiles * self.splits, 1, 1)

    @property
    def splitk(self) -> bool:
        return self.splits > 1

    @property
    def workspace_elems(self) -> int:
        """fp32 elements of the split-K partials (0 without split-K)."""
        return self.splits * self.tiles * self.cfg.bw * self.bm if self.splitk else 0

    @property
    def summary(self) -> str:
        """The plan in one line (what :func:`print_once` shows)."""
        cfg = self.cfg
        return (
            f"decode_{cfg.name} tile={cfg.bw}x{self.bm} warps={cfg.warps_for(self.bm)} "
            f"occupancy={self.occupancy or cfg.occupancy_for(self.bm)} grid={self.grid} "
            f"split={self.splits}x{self.per} steps of {self.steps} latency={self.latency}"
        )


def decode_config(name: str | None = None) -> DecodeConfig:
    """The decode variant called ``name``; ``None``: ``$TILEGEMM_DECODE_VARIANT`` or the default."""
    name = name or os.environ.get(DECODE_VARIANT_ENV) or DECODE_CONFIGS[0].name
    for cfg in DECODE_CONFIGS:
        if cfg.name == name:
            return cfg
    raise ValueError(f"{DECODE_VARIANT_ENV}: got {name!r}, expected one of {[c.name for c in DECODE_CONFIGS]}")


def decode_plan(p: Problem, cfg: DecodeConfig) -> DecodePlan:
    """Tiles and K split of dense problem ``p`` on decode variant ``cfg``, sized from the weight bytes per SM.

    The activation tile is capped at :data:`DECODE_NARROW_BM` rows while that keeps the tiles within
    :data:`DECODE_NARROW_WAVES` per SM: more, narrower tiles stream the weight from more SMs at once (H100,
    2026-11-23, kernel-only, FP8: 128x2112x7168 31.3 -> 17.3 us, 128x4096x7168 42.9 -> 29.2, 256x2112x7168
    35.3 -> 25.7; BF16 128x4096x7168 49.6 -> 29.4; where N / bw alone fills two waves, e.g. 256x24576x1536,
    it lost: 44.8 -> 63.8). BF16 tiles of 64 or more rows are not split along K: they lost to one unit per
    tile at every measured shape (64x4096x7168 40.5 vs 29.3 us, 128x2112x7168 31.1 vs 22.7) and were never
    more than 3% ahead.

    Tiles: ``cdiv(N, bw) x cdiv(M, bm)``. With at least 3/4 of an SM's worth of tiles, K is not
    split; with fewer, K is split so that the units fill the CTA slots (``sms * occupancy``), within
    the bounds above (a split's partial costs ``2 * bw * bm * 4`` bytes of traffic against the
    ``bw * per * step_k * elt`` weight bytes it streams). H100, BF16, 2026-11-23: 112 tiles unsplit
    took 13.3 us at 1x7168x2048 (4 splits: 15.4) and 16.1 us at 128x7168x2048 (2 splits: 30.1);
    64 tiles at 1x4096x7168 took 29.3 us in 8 splits and 42.5 us in 2.

    Small weights (H100, 2026-11-23, kernel-only, ``decode_variants.py --nk 2048x768,1536x2048``): a tile whose
    weight slice is under :data:`DECODE_SPLIT_MIN_TILE_BYTES` is not split (BF16 16x2048x768, 96 KB per tile:
    3.7 us unsplit, 5.7 in 3 splits), and a split in two becomes no split (FP8 256x1536x2048: 8.9 us unsplit,
    11.0 in 2; two splits was never the best count in any sweep).

    Long K (H100, 2026-11-23, kernel-only, ``results/decode/pipeline_h100.json``): FP8 tiles of at most 32 rows
    with at least :data:`DECODE_LONG_K_STEPS` steps are split even when they fill the SMs (1/8/16x7168x16384,
    112 tiles: 49.2/51.4/62.5 us unsplit, 47.1/47.4/49.6 in 4 splits); 64-row tiles are not (64x7168x16384:
    65.9 unsplit, 79.5 in 4).

    Load latency hint: tileiras sizes the load pipeline from it. The unsplit FP8 kernel with a 64-row tile gets
    one 32 KiB stage without a hint and two with :data:`DECODE_DEEP_LATENCY`; from K = 2048 that wins (same
    file: 64x7168x16384 84.6 -> 65.9 us, 128x4096x7168 30.5 -> 23.7, 256x2112x7168 25.8 -> 22.8, 32x7168x2048
    10.8 -> 9.8), below it loses (32x24576x1536 20.1 -> 21.3, 64x32768x512 10.5 -> 11.8). The split kernels
    lose stages with it (64x2112x7168: 15.1 -> 17.0) and BF16 kernels do not change.

    Occupancy hint (H100, 2026-11-24, harness timing, ``results/decode/README.md``, "Occupancy"): the split count
    is sized from :meth:`DecodeConfig.occupancy_for`; an unsplit BF16 plan of at most 16 activation rows whose tiles
    fit one wave at :data:`DECODE_BF16_UNSPLIT_OCCUPANCY` CTAs per SM is compiled for that many instead of 4 (five
    load stages instead of two): 1/8/16x7168x16384 94.2-94.7 -> 86.6-86.9 us, 7168x2048 16.6-17.1 -> 15.7-15.8,
    2048x768 6.0-6.2 -> 5.1. Where the tiles need more than one such wave it lost 1-2% (1x24576x1536 33.9 -> 34.4),
    split plans lost with it (fewer slots: 1x4096x7168 31.8 -> 35.1), and FP8 plans did not gain (8x7168x2048
    10.3 -> 11.4, 16x 11.1 -> 10.6).
    """
    bm = cfg.tile_m(p.m, p.dtype, p.k)
    if bm > DECODE_NARROW_BM and _narrow_fits(p, cfg.bw):
        bm = DECODE_NARROW_BM
    num_m, num_n = cdiv(p.m, bm), cdiv(p.n, cfg.bw)
    step = cfg.step_k(p.dtype)
    steps = max(1, cdiv(p.k, step))
    tiles = num_m * num_n
    splits = 1
    few_tiles = 4 * tiles < 3 * max(1, p.sms)
    long_k = p.dtype == "fp8" and bm <= 32 and tiles <= max(1, p.sms) and steps >= DECODE_LONG_K_STEPS
    if cfg.splitk and (few_tiles or long_k) and not (p.dtype == "bf16" and bm >= DECODE_NARROW_BM):
        slots = max(1, p.sms) * cfg.occupancy_for(bm)
        elt = 1 if p.dtype == "fp8" else 2
        step_bytes = cfg.bw * step * elt
        partial_bytes = 2 * cfg.bw * bm * 4
        min_steps = max(DECODE_MIN_STEPS, cdiv(DECODE_PARTIAL_RATIO * partial_bytes, step_bytes))
        splits = max(1, min(slots // tiles, steps // min_steps, DECODE_MAX_SPLITS))
        if splits == 2 or cfg.bw * p.k * elt < DECODE_SPLIT_MIN_TILE_BYTES:
            splits = 1
    if cfg.splitk and cfg.splits > 0:
        splits = min(cfg.splits, steps)
    per = cdiv(steps, splits)
    splits = cdiv(steps, per)
    latency = cfg.latency
    if latency is None:
        deep = p.dtype == "fp8" and bm == DECODE_NARROW_BM and splits == 1 and p.k >= DECODE_DEEP_MIN_K
        latency = DECODE_DEEP_LATENCY if deep else 0
    occupancy = cfg.occupancy_for(bm)
    if p.dtype == "bf16" and splits == 1 and bm < 32 and tiles <= DECODE_BF16_UNSPLIT_OCCUPANCY * max(1, p.sms):
        occupancy = min(occupancy, DECODE_BF16_UNSPLIT_OCCUPANCY)
    return DecodePlan(cfg, bm, num_m, num_n, steps, splits, per, latency, occupancy)


@dataclass(frozen=True)
class NarrowConfig:
    """The narrow-tile decode kernel (``ops/cutile/decode.py``): ``[bm, bn]`` output tiles (``bm`` activation rows,
    64 or 128, x ``bn`` weight rows), the whole of K per CTA, one warpgroup, ``occupancy`` CTAs per SM; ``bk_bf16``
    the BF16 K step (FP8 steps by one 128-wide scale block); ``latency`` the FP8 kernel's load latency hint;
    ``rotate_k``: weight tile ``pn`` starts its K loop at block ``pn % KB`` and wraps around; ``pair_k``: the FP8
    kernel takes two K blocks per iteration, both MMAs before either promotion; ``unchecked_scales``: the FP8
    kernel loads its scales without bounds checks where every scale tile lies inside the scales
    (``decode.narrow_scales_inside``).

    The rotation: without it every CTA reads the same activation K block at the same time, and with the
    activations not yet in L2 (a real call; the harness rotates its inputs and flushes the L2) the FP8 kernel ran
    1.2-1.5x slower than with L2-resident activations (H100, 2026-11-24, ``results/decode/narrow_h100.json``:
    64x2112x7168 26.5 -> 20.7 us with it, 64x4096x7168 32.6 -> 24.3, 64x7168x16384 72.4 -> 63.1). The 128-row
    weight tiles (a quarter as many CTAs per activation tile) keep the plain order: the harness timed them slower
    with the rotation (128x7168x16384 65.1 -> 75.8 us), but a later run of the unrotated kernel read 73.8, so that
    evidence is within the run-to-run spread of those rows. BF16 lost 1-5% with it (64x2112x7168 21.6 -> 22.0) and
    does not rotate. Each tile's sum order is fixed by its position: reruns stay bitwise identical.

    The hint: tileiras sizes the load pipeline from it, and without one the FP8 kernel with 1x128 weight scales
    got a single stage (17-34 KiB of shared memory) where the 128x128 one got 4-5; with 6 both get 4-6 stages
    (the 128x128 kernels the same as without a hint; ``tests/kernels/test_compile_dense.py`` holds it).
    """

    name: str
    bn: int
    occupancy: int = 4
    bk_bf16: int = 128
    bm: int = 64
    latency: int = 6
    rotate_k: bool = True
    pair_k: bool = False
    unchecked_scales: bool = False

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """One CTA per output tile."""
        return (cdiv(m, self.bm) * cdiv(n, self.bn), 1, 1)

    def compiler_options(self) -> dict[str, int]:
        """Keyword arguments for ``ct.kernel``."""
        return {"num_worker_warps": 4, "occupancy": self.occupancy}

    def summary(self, m: int, n: int) -> str:
        """The plan in one line (what :func:`print_once` shows)."""
        return f"{self.name} tile={self.bm}x{self.bn} occupancy={self.occupancy} grid={self.grid(m, n)}"


#: FP8 narrow tiles: 64 weight rows two K blocks per iteration at two CTAs per SM (128 registers), 128 rows (a
#: quarter of the activation re-reads of 32) or 16 (more tiles); 32 rows only when forced (sweeps: the 64x64 pairs
#: took its shapes). The pairs load their scales unchecked where they lie inside (H100, 2026-11-24, same process,
#: ``results/decode/README.md``, "Scale loads without bounds checks": 1.00-1.05x); the 16- and 128-row tiles lost
#: with it (64x1536x2048 7.0 -> 7.8 us, 256x7168x16384 88.4 -> 102.0) and keep the checks.
NARROW_FP8_W128 = NarrowConfig("narrow_w128", bn=128, rotate_k=False)
NARROW_FP8_W32 = NarrowConfig("narrow_w32", bn=32)
NARROW_FP8_W16 = NarrowConfig("narrow_w16", bn=16)
NARROW_FP8_W64_PAIR = NarrowConfig("narrow_w64_pair", bn=64, occupancy=2, pair_k=True, unchecked_scales=True)
#: BF16: 32 weight rows, 128 of K per step, two CTAs per SM; above NARROW_BF16_MAX_M rows, 128x128 tiles (64 of K
#: per step, one CTA per SM: 255 registers, six load stages on sm_90).
NARROW_BF16_W32 = NarrowConfig("narrow_bf16_w32", bn=32, occupancy=2, rotate_k=False)
NARROW_BF16_M128_W128 = NarrowConfig("narrow_bf16_m128_w128", bn=128, bm=128, bk_bf16=64, occupancy=1, rotate_k=False)
#: ... and where the 32-row tiles fit one wave, the same tiles at one CTA per SM: tileiras then fills the shared
#: memory with ~9 load stages instead of 4.
NARROW_BF16_W32_DEEP = NarrowConfig("narrow_bf16_w32_deep", bn=32, occupancy=1, rotate_k=False)
NARROW_CONFIGS: dict[str, tuple[NarrowConfig, ...]] = {
    "fp8": (NARROW_FP8_W64_PAIR, NARROW_FP8_W128, NARROW_FP8_W32, NARROW_FP8_W16),
    "bf16": (NARROW_BF16_W32, NARROW_BF16_M128_W128, NARROW_BF16_W32_DEEP),
}
#: Dense problems with more rows than this (and at most DECODE_MAX_M) take the narrow kernel ...
NARROW_MIN_M = 16
#: ... at most this many rows only up to NARROW_SMALL_M_MAX_K and not with FP8 32-row weight tiles (the swap-AB kernel
#: was ahead there) ...
NARROW_SMALL_M = 32
NARROW_SMALL_M_MAX_K = 2048
#: ... FP8 above NARROW_SMALL_M rows 64x64 tiles two K blocks at a time while their count is within these shares
#: of the SMs, else the widest weight tile whose tiles fill NARROW_FILL of the SMs (else 16 rows, up to this K) ...
NARROW_FP8_PAIR_TILES = (1 / 3, 2)
NARROW_FILL = 0.75
NARROW_FP8_W16_MAX_K = 2048
#: ... BF16 up to this many rows, while its tiles stay within this many per SM (above it, 128x128 tiles while
#: they fill NARROW_FILL of the SMs in one wave).
NARROW_BF16_MAX_M = 128
NARROW_BF16_MAX_WAVES = 1.5


def narrow_config(p: Problem) -> NarrowConfig | None:
    """The narrow-tile config of dense problem ``p``, or ``None`` where the swap-AB / tile kernels take it.

    H100, 2026-11-24, kernel-only, FP8 block-scaled NT, sweeps with L2-resident activations
    (``benchmarks/results/decode/narrow_h100.json``): at 64-256 rows the narrow tiles beat the swap-AB kernel,
    e.g. 64x7168x16384 67.4 -> 61.3 us, 256x7168x16384 104 -> 80, 64x4096x7168 23.6 -> 18.1, 64x1536x2048 8.2 ->
    5.8; below 32 rows the swap-AB kernel stays ahead (16x4096x7168: 17.2 vs 20.3). The harness (cold activations)
    over the issue's 48 shapes at 64-256 rows: FP8 1.09x, BF16 1.05x the swap-AB kernel's speed (geomean), three
    FP8 rows 3-9% slower (``results/decode/README.md``, "Narrow tiles"). The time follows the bytes each SM reads
    (weight tile plus activation tile per K block): a wider weight tile re-reads the activations less, so the
    widest tile that still fills ~3/4 of the SMs wins (256x7168x16384: 16 rows 298 us, 32 170, 64 121, 128 80).
    Where only 16-row tiles fill the SMs, the swap-AB kernel's split-K is ahead at long K (64x2112x7168,
    activations cold: 18.0 vs 20.7 us) and behind at K <= 2048 (64x1536x2048: 10.1 vs 7.9).
    BF16 (same run): 32-row tiles at 64-128 rows where they stay within 1.5 waves (64x2112x7168 22.9 -> 18.5,
    64x4096x7168 29.5 -> 25.2, 64x1536x2048 8.1 -> 6.8); beyond, or at 256 rows, they lost. Above 128 rows,
    128x128 tiles (one CTA per SM) where they fill 3/4 of the SMs in one wave (H100, 2026-11-24, harness timing,
    ``results/decode/README.md``, "128-row activation tiles"): 256x7168x16384 138.9 -> 107.2 us, 256x7168x2048
    20.3 -> 19.4; at 64 tiles (256x4096x7168) 38.8 -> 44.8, at 384 (256x24576x1536) 42.0 -> 45.9.
    FP8 above 32 rows, first (same day, ``results/decode/README.md``, "Two K blocks per iteration"): 64x64 tiles with
    two K blocks per iteration (``NARROW_FP8_W64_PAIR``) while their count is between a third of the SMs and two per
    SM: 256x2112x7168 25.9 -> 20.9 us, 128x4096x7168 27.0 -> 23.1, 128x7168x16384 75.9 -> 61.8, 128x7168x2048 13.1
    -> 11.2, 256x1536x2048 9.6 -> 8.4; below (64x2112x7168, 33 tiles: 18.1 -> 20.2) or above (256x7168x16384, 448:
    92.4 -> 115.2) they lost.
    At 17-32 rows (H100, 2026-11-24, harness runs, ``results/decode/README.md``, "17-32 rows"), the same rules up to
    K = 2048, less FP8's 32-row weight tiles: FP8 32x1536x2048 9.4 -> 7.8 us (16 rows), 32x2048x768 5.9 -> 4.9,
    32x24576x1536 23.4 -> 21.1 (128 rows), 32x32768x512 11.8 -> 10.8; BF16 32x1536x2048 9.6 -> 7.8, 32x2048x768
    5.6 -> 5.2. The FP8 32-row tile lost there (32x7168x2048: 12.6 us against the swap-AB kernel's 11.7, a sweep),
    BF16 at K = 7168 by 1-1.4% (32x4096x7168 35.3 -> 35.8), and at 16 rows or fewer the narrow kernel won only on
    1536x2048.
    BF16 at 17-128 rows where the 32-row tiles fit one wave (``NARROW_BF16_W32_DEEP``, one CTA per SM; at 17-32 rows
    with K > 2048 only where they also fill NARROW_FILL of the SMs). H100, 2026-11-24, same process, harness timing
    (``results/decode/README.md``, "One CTA per SM"): 64x2112x7168 21.6 -> 18.1 us, 128x2112x7168 22.2 -> 18.5,
    32x4096x7168 38.3 -> 31.4, 17x4096x7168 36.8 -> 32.9, 64x1536x2048 8.3 -> 7.6; 2048x768 unchanged. At 17 rows of
    2112x7168 (66 tiles) the swap-AB kernel stayed ahead (22.3 vs 25.1); with more tiles than SMs it lost
    (64x7168x2048, 224 tiles: 16.8 -> 18.0), and at 1-16 rows it lost to the swap-AB kernel except on 1536x2048.
    ``$TILEGEMM_DECODE_VARIANT`` (a swap-AB variant forced) and calls with ``c`` never take it.
    """
    if p.has_c or not NARROW_MIN_M < p.m <= DECODE_MAX_M or os.environ.get(DECODE_VARIANT_ENV):
        return None
    sms = max(1, p.sms)
    small = p.m <= NARROW_SMALL_M
    deep = NARROW_BF16_W32_DEEP
    deep_tiles = cdiv(p.m, deep.bm) * cdiv(p.n, deep.bn)
    if p.dtype == "bf16" and p.m <= NARROW_BF16_MAX_M and deep_tiles <= sms:
        if not small or p.k <= NARROW_SMALL_M_MAX_K or deep_tiles >= NARROW_FILL * sms:
            return deep
    if small and p.k > NARROW_SMALL_M_MAX_K:
        return None
    if p.dtype == "fp8":

        def tiles(cfg: NarrowConfig) -> int:
            return cdiv(p.m, cfg.bm) * cdiv(p.n, cfg.bn)

        low, high = NARROW_FP8_PAIR_TILES
        if not small and low * sms <= tiles(NARROW_FP8_W64_PAIR) <= high * sms:
            return NARROW_FP8_W64_PAIR
        if tiles(NARROW_FP8_W128) >= NARROW_FILL * sms:
            return NARROW_FP8_W128
        if tiles(NARROW_FP8_W32) >= NARROW_FILL * sms:  # (17-32 rows only: above, the 64x64 pairs cover these)
            return None
        return NARROW_FP8_W16 if p.k <= NARROW_FP8_W16_MAX_K else None
    cfg = NARROW_BF16_W32
    if p.m <= NARROW_BF16_MAX_M and cdiv(p.m, cfg.bm) * cdiv(p.n, cfg.bn) <= NARROW_BF16_MAX_WAVES * sms:
        return cfg
    wide = NARROW_BF16_M128_W128
    if p.m > NARROW_BF16_MAX_M and NARROW_FILL * sms <= cdiv(p.m, wide.bm) * cdiv(p.n, wide.bn) <= sms:
        return wide
    return None


# ---------------------------------------------------------------------------- grouped GEMMs
# (used by ops/cutile/grouped.py and tests/kernels/test_compile_grouped.py.)

GROUPED_BF16_BIG = TileConfig(128, 256, 64, num_worker_warps=8)
GROUPED_BF16 = TileConfig(128, 128, 64)
GROUPED_BF16_SMALL_M = TileConfig(64, 128, 64)
GROUPED_BF16_K_WITH_C = TileConfig(128, 128, 64, num_worker_warps=8)  # default warps spill with a C tile
GROUPED_FP8 = TileConfig(128, 128, 128, fast_acc=True)
GROUPED_FP8_SMALL_M = TileConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2)
GROUPED_FP8_K = TileConfig(128, 128, 128, fast_acc=True, num_worker_warps=8)  # default warps spill without C


def all_grouped_configs(dtype: str, kind: Kind) -> tuple[TileConfig, ...]:
    """Every config :func:`choose` can return for a grouped ``dtype`` GEMM of layout ``kind`` (the CPU gate
    compiles each)."""
    fp8 = dtype == "fp8"
    if kind == Kind.K:
        return (GROUPED_FP8_K,) if fp8 else (GROUPED_BF16, GROUPED_BF16_K_WITH_C)
    if fp8:
        return (GROUPED_FP8, GROUPED_FP8_SMALL_M)
    return (GROUPED_BF16_BIG, GROUPED_BF16, GROUPED_BF16_SMALL_M)


def _grouped_config(p: Problem) -> TileConfig:
    """Grouped GEMMs: small groups (<= 64 expected rows: ``p.expected_m`` for masked, ``m / groups`` for
    contiguous layouts) take 64-row tiles so a 128-row tile is not mostly padding; otherwise the widest
    tile that still gives every SM at least one tile. k-grouped: by dtype and the addend."""
    fp8 = p.dtype == "fp8"
    if p.kind == Kind.K:
        if fp8:
            return GROUPED_FP8_K
        return GROUPED_BF16_K_WITH_C if p.has_c else GROUPED_BF16
    per_group = p.expected_m if p.kind == Kind.MASKED else max(1, p.m // max(1, p.groups))
    if fp8:
        return GROUPED_FP8_SMALL_M if per_group <= 64 else GROUPED_FP8
    if per_group <= 64:
        return GROUPED_BF16_SMALL_M
    tiles_wide = p.groups * cdiv(per_group, 128) * cdiv(p.n, 256)
    return GROUPED_BF16_BIG if tiles_wide >= max(1, p.sms) else GROUPED_BF16


# ----------------------------------------------------------------------------- fused MoE experts
# (used by ops/cutile/moe.py and tests/kernels/test_compile_moe.py)


@dataclass(frozen=True)
class MoEConfig:
    """Configs of the fused experts kernels (``ops/cutile/moe.py``).

    ``up``: the gate/up GEMM (two ``bm x bn`` fp32 accumulators: gate and up columns); ``down``: the down
    GEMM; both share ``bm``, which is also the row alignment of each expert's segment.
    ``combine_bt x combine_bn``: the combine kernel's tile (tokens x columns; ``combine_bn`` divides H).
    """

    up: TileConfig
    down: TileConfig
    combine_bt: int = 16
    combine_bn: int = 256

    @property
    def bm(self) -> int:
        return self.up.bm

    @property
    def name(self) -> str:
        return self.up.name


# Sorted path tiles. gate/up: two 128x128 fp32 accumulators on TMA-fed rows need 8 warps (168 registers, no spills;
# 4 warps spill ~475 words); down: 128x256, 8 warps. H100, kernel-only, against the former 128x64 / 128x128 tiles
# (docs/kernels.md, "Fused MoE experts"): Mixtral 4096 tokens 7013 -> 5645 us, DeepSeek-V3 16384 32867 -> 25694.
MOE_UP_CONFIGS = {64: TileConfig(64, 64, 64), 128: TileConfig(128, 128, 64, num_worker_warps=8)}
MOE_DOWN_CONFIGS = {64: TileConfig(64, 128, 64), 128: TileConfig(128, 256, 64, num_worker_warps=8)}
#: Names the fused-experts path every call takes (benchmarks, tests): ``slots`` (one weight stream per routed
#: slot, ``ops/cutile/moe_slots.py``), ``blocks`` (device-side sort into few-row blocks, one swap-AB weight stream
#: per block, ``ops/cutile/moe_blocks.py``) or ``sorted`` (device-side sort, persistent tiles, ``ops/cutile/moe.py``).
MOE_VARIANT_ENV = "TILEGEMM_MOE_VARIANT"
MOE_VARIANTS = ("slots", "blocks", "sorted")
#: Mean rows per expert at or below which experts' segments are 64-row aligned (64-row tiles).
MOE_SMALL_ROWS = 64
#: The combine kernel's tile: tokens, and the widest column count (a power of two dividing H).
MOE_COMBINE_BT = 16
MOE_COMBINE_MAX_BN = 256


def all_moe_configs() -> tuple[MoEConfig, ...]:
    """Every (gate/up, down) pair :func:`choose` can return for ``moe`` (the CPU gate compiles each kernel variant)."""
    return tuple(MoEConfig(MOE_UP_CONFIGS[bm], MOE_DOWN_CONFIGS[bm]) for bm in MOE_UP_CONFIGS)


def _moe_config(p: Problem) -> MoEConfig | MoESlotsConfig | MoEBlocksConfig:
    """Fused experts (``p.m`` routed slots, ``p.groups`` experts, ``p.n`` = H), the first path that fits (or the one
    ``TILEGEMM_MOE_VARIANT`` forces): the per-slot kernels when decode-sized (``ops.common.moe_decode_sized``); the
    block kernels while the experts average at most ``ops.common.MOE_BLOCKS_MAX_ROWS`` rows each
    (``ops.common.moe_blocks_sized``); else the sorted path, 64-row tiles when the experts average at most
    :data:`MOE_SMALL_ROWS` rows each (a 128-row tile would be mostly padding; only a forced call gets there), else
    128. The combine's column tile is the largest power of two dividing H, at most :data:`MOE_COMBINE_MAX_BN`."""
    forced = env_choice(MOE_VARIANT_ENV, MOE_VARIANTS)
    if forced == "slots" or (forced is None and moe_decode_sized(p.m, 1, p.groups)):
        return moe_slots_config(p.n)
    if forced == "blocks" or (forced is None and moe_blocks_sized(p.m, 1, p.groups)):
        return moe_blocks_config(p.m, p.n, p.groups)
    bm = 64 if p.m <= MOE_SMALL_ROWS * p.groups else 128
    return MoEConfig(MOE_UP_CONFIGS[bm], MOE_DOWN_CONFIGS[bm], MOE_COMBINE_BT, _combine_bn(p.n))


def moe_train_config(hidden: int) -> MoEConfig:
    """The training experts kernels (``ops/cutile/moe_train.py``) on the 128-row aligned layout: ``up`` for the
    gate/up forward and its backward (the same two-accumulator shape), ``down`` for the down forward and the
    input-gradient GEMM (both write [M, H] rows), the combine tile for the token kernels."""
    return MoEConfig(MOE_UP_CONFIGS[128], MOE_DOWN_CONFIGS[128], MOE_COMBINE_BT, _combine_bn(hidden))


def _combine_bn(hidden: int) -> int:
    bn = MOE_COMBINE_MAX_BN
    while bn > 1 and hidden % bn:
        bn //= 2
    return bn


@dataclass(frozen=True)
class MoESlotsConfig:
    """Tiles of the per-slot experts kernels (``ops/cutile/moe_slots.py``): ``bw`` weight rows x ``bk`` K per
    MMA (the weight tile, TMA), ``bt`` the MMA's N side (the token row repeated), and the combine's tile."""

    bw: int = 64
    bk: int = 256
    bt: int = 8
    combine_bt: int = 16
    combine_bn: int = 256

    @property
    def name(self) -> str:
        return f"slots_w{self.bw}_k{self.bk}_t{self.bt}"


def moe_slots_config(hidden: int, bw: int = 64, bk: int = 256) -> MoESlotsConfig:
    """Config of the per-slot experts kernels; the combine's column tile as in the sorted path."""
    return MoESlotsConfig(bw=bw, bk=bk, combine_bt=MOE_COMBINE_BT, combine_bn=_combine_bn(hidden))


#: The block kernels' row tile (the MMA's N side): the power of two covering twice the mean rows per touched
#: expert, between these bounds (a block holds most experts' rows whole: one weight stream per expert).
MOE_BLOCKS_MIN_BT = 8
MOE_BLOCKS_MAX_BT = 64


@dataclass(frozen=True)
class MoEBlocksConfig:
    """Tiles of the block experts kernels (``ops/cutile/moe_blocks.py``): ``bw`` weight rows x ``bk`` K per MMA
    (the weight tile, TMA), ``bt`` rows per block (the MMA's N side and each expert's row alignment), and
    the combine's tile. 128 x 128 weight tiles: 0-8% faster than
    64 x 256 and 64 x 128 from 16 tokens on, on all three models (``results/moe/paths_h100.md``)."""

    bw: int = 128
    bk: int = 128
    bt: int = 8
    combine_bt: int = 16
    combine_bn: int = 256

    @property
    def name(self) -> str:
        return f"blocks_w{self.bw}_k{self.bk}_t{self.bt}"


def moe_blocks_config(
    slots: int, hidden: int, experts: int, bw: int = MoEBlocksConfig.bw, bk: int = MoEBlocksConfig.bk
) -> MoEBlocksConfig:
    """Config of the block experts kernels for ``slots`` routed rows over ``experts``: ``bt`` from
    :data:`MOE_BLOCKS_MIN_BT` / :data:`MOE_BLOCKS_MAX_BT`; the combine's column tile as in the sorted path."""
    mean = cdiv(max(slots, 1), max(1, min(experts, slots)))
    bt = MOE_BLOCKS_MIN_BT
    while bt < 2 * mean and bt < MOE_BLOCKS_MAX_BT:
        bt *= 2
    return MoEBlocksConfig(bw=bw, bk=bk, bt=bt, combine_bt=MOE_COMBINE_BT, combine_bn=_combine_bn(hidden))


#: FP8 fused experts, row form (``moe_fp8._tile_gate_up`` / ``_tile_down``): 64-row tiles x 128 columns x 128 of K
#: per step (one weight scale block), 4 warps, two CTAs per SM (128 registers) for both GEMMs. H100, gate/up + down
#: (``docs/kernels.md``, "FP8 experts: block form and row form"): 1.1-1.5x faster than 128-row tiles (two 64-row
#: chains) and than 64-row tiles with 8 warps, on Qwen3, DeepSeek-V3 and Mixtral from 512 to 16384 tokens.
MOE_FP8_TILE_CONFIG = MoEConfig(
    TileConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2),
    TileConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2),
)
#: Mean routed rows per touched expert from which the FP8 op takes the row form.
MOE_FP8_TILE_MIN_ROWS = 16


def moe_fp8_config(slots: int, hidden: int, experts: int) -> MoEBlocksConfig | MoEConfig:
    """Config of the FP8 fused experts (``ops/cutile/moe_fp8.py``) for ``slots`` routed rows over ``experts``.

    The block form (swap-AB, 128x128 weight tiles, ``bt`` as :func:`moe_blocks_config` chooses it) while the touched
    experts average fewer than :data:`MOE_FP8_TILE_MIN_ROWS` rows, else the row form (:data:`MOE_FP8_TILE_CONFIG`).
    ``TILEGEMM_MOE_VARIANT`` forces ``blocks`` or ``sorted`` (the row form); ``slots`` means the block form here."""
    forced = env_choice(MOE_VARIANT_ENV, MOE_VARIANTS)
    mean = cdiv(max(slots, 1), max(1, min(experts, slots)))
    if forced == "sorted" or (forced is None and mean >= MOE_FP8_TILE_MIN_ROWS):
        return replace(MOE_FP8_TILE_CONFIG, combine_bn=_combine_bn(hidden))
    return moe_blocks_config(slots, hidden, experts, bw=128, bk=128)


# ------------------------------------------------------------------------------- MQA logits
# (used by ops/cutile/mqa.py,
#  tests/kernels/test_compile_mqa.py and benchmarks/bench_mqa.py. Static: derived from the
#  shape, no tuning sweep; the measurements behind it are in docs/kernels.md.)


@dataclass(frozen=True)
class MqaConfig:
    """Tile sizes of the plain MQA kernel (``mqa.make_mqa_logits_kernel``): ``bq`` query rows x ``hp`` (padded)
    heads, ``bk`` keys.

    ``head_chain``: sum the weighted heads as a chain of FFMAs over groups of 8 (``mqa.weighted_head_sum``);
    otherwise one ``ct.sum`` (an FMUL and an FADD per score). ``two_chains``: the query rows in two halves with an
    MMA each per key tile (``mqa.key_tile_logits``). ``occupancy``: the sm_90 CTAs-per-SM hint
    (``mqa.plain_kernel_for``). ``unroll``: key tiles per loop iteration, each its own load and shared-memory slot.
    ``scales_ldg``: where the tiles divide the keys (``mqa.tiles_inside``), the key scales are plain unchecked loads
    rather than TMA loads. ``key_latency``: the key load's latency hint (0: none), from which tileiras sizes its
    pipeline.
    """

    bq: int
    hp: int
    bk: int
    head_chain: bool = False
    two_chains: bool = False
    occupancy: int = 2
    unroll: int = 1
    scales_ldg: bool = False
    key_latency: int = 0


@dataclass(frozen=True)
class PagedMqaConfig:
    """Tile sizes and launch shape of :func:`paged_mqa_logits_kernel`.

    ``nnp``: next_n rounded up to a power of two; ``rg``: query rows per MMA (``rg * hp <= 256``);
    ``ck``: keys per chunk (one indexed load of ``ck / block_kv`` cache blocks); ``split``: keys per
    schedule split; ``parts``: CTAs sharing each schedule row (round-robin over its splits), so
    several gathers are in flight per SM; ``occupancy``: the compiler's CTAs-per-SM hint; ``head_chain``: as
    :class:`MqaConfig`'s; ``batch_major``: the kernel walks its splits one batch row at a time with a branch-free
    chunk loop (sm_90; on sm_100 tileiras 13.4 spills with it, so it walks one split per iteration);
    ``rows_outer``: with ``batch_major``, one row group (``nnp == rg``) whose rows are loaded once per batch row
    rather than once per chunk.
    """

    nnp: int
    rg: int
    hp: int
    ck: int
    split: int
    parts: int
    occupancy: int
    head_chain: bool = False
    batch_major: bool = False
    rows_outer: bool = False


def _mqa_pow2_ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _head_chain(sm: int, n_side: int) -> bool:
    """The FFMA-chain head sum: on sm_90 up to an MMA N side of 128.

    Measured on an H100 (docs/kernels.md), plain kernel at two CTAs per SM: 1.07-1.23x over ``ct.sum``.
    tileiras 13.4 spills with it on sm_100 (up to thousands of words) and on sm_90 at N = 256, so those keep
    ``ct.sum``.
    """
    return sm == 90 and n_side <= 128


def mqa_logits_config(h: int, d: int, sm: int = 90) -> MqaConfig | None:
    """Tiles for ``fp8_mqa_logits``: ``h`` heads of size ``d``, compute capability ``sm``; ``None`` if unsupported.

    The N side of the MMA is ``bq * hp = 128`` (query rows x padded heads); 128 keys per tile. With two rows of 64
    (padded) heads, two MMA chains of one row each on sm_90 (``MqaConfig.two_chains``). H100, 2026-11-24, same process,
    outputs bitwise equal (``results/mqa/README.md``, run 17): S=2048 S_kv=8192 H=64 D=32 208.9 -> 200.7 us, D=64
    225.2 -> 221.4, D=128 291.1 -> 270.4, S=8192 694-700 (1.01x), S_kv=65536 1.01x. With four rows of 32 heads
    (two rows per chain) tileiras 13.4 spills at D = 128, so H <= 32 keeps one chain.

    Two CTAs per SM on sm_90, three with two chains at D = 32 (80 registers, spill-free; at D = 64 it spills 56
    words, and one chain keeps 128 registers whatever the hint). H100, 2026-11-24, same process, outputs bitwise
    equal (``results/mqa/README.md``, run 18), H = 64 D = 32: S=2048 S_kv=8192 198.7 -> 178.6 us (DeepGEMM 164.2),
    S=8192 S_kv=8192 487.1 -> 424.9 (418.7), S=2048 S_kv=65536 1932.6 -> 1533.7 (1313.1).

    Two key tiles per loop iteration with two chains at D = 64 (``MqaConfig.unroll``): tileiras gives the loop's key
    load one shared-memory slot there (19.5 KB in all), so the next tile's load waits for the MMA on the current
    one; two loads per iteration are two slots. H100, 2026-11-24, same process, outputs bitwise equal
    (``results/mqa/README.md``, run 19), H = 64 D = 64: S=2048 S_kv=8192 218.4 -> 211.6 us, S_kv=65536 2001.1 ->
    1773.6, S=8192 527.5 -> 512.4. One chain (H = 32) lost 2% at S_kv = 8192 (D = 64 127.5 -> 130.3), D = 32 at two
    CTAs per SM lost to three (179.8 -> 187.9), and D = 128 alone went both ways in two runs (S=8192 S_kv=8192
    680.9 -> 719.5, S_kv=65536 3-12% faster).

    At D = 128, two key tiles per iteration with a latency hint of 6 on the key load (``MqaConfig.key_latency``):
    without the hint tileiras 13.4 waits after every QGMMA of the two-chain D = 128 kernel (one
    ``WARPGROUP.DEPBAR`` each, sm_90), with it 12 waits for 96 QGMMAs and no spill (a hint of 7-10 spills 10
    words, 5 spills 215). H100, 2026-11-24, same process, outputs bitwise equal (``results/mqa/README.md``, run
    21), H = 64 D = 128: S=2048 S_kv=8192 265.7 -> 263.2 us, S=8192 S_kv=8192 654.2 -> 636.6, S=2048 S_kv=65536
    2506.7 -> 2228.9, S=4096 S_kv=65536 4995.6 -> 4696.8, S=8192 S_kv=65536 9779.7 -> 9157.0; with one tile per
    iteration the hint alone lost (7: 266.2 -> 333.2, 10: -> 294.5).

    Key scales by plain loads with one chain on sm_90 (``MqaConfig.scales_ldg``, where the tiles divide the keys).
    H100, 2026-11-24, same process, outputs bitwise equal (``results/mqa/README.md``, run 20), H = 32: D = 128
    S=2048 S_kv=8192 156.7 -> 147.4 us, S=8192 397.0 -> 372.1, S_kv=65536 1342.7 -> 1212.7; D = 64 126.6 -> 123.1.
    With two chains they lost (H = 64: D = 64 198.7 -> 216.6, D = 128 266.6 -> 500.3).
    """
    if d not in (32, 64, 128) or not 1 <= h <= 128:
        return None
    hp = _mqa_pow2_ceil(h)
    bq = max(1, 128 // hp)
    chain = _head_chain(sm, bq * hp)
    two = chain and bq == 2
    occupancy = 3 if two and d <= 32 else 2
    unroll = 2 if two and d >= 64 else 1
    return MqaConfig(
        bq=bq,
        hp=hp,
        bk=128,
        head_chain=chain,
        two_chains=two,
        occupancy=occupancy,
        unroll=unroll,
        scales_ldg=sm == 90 and not two,
        key_latency=6 if two and d == 128 else 0,
    )


def bf16_mqa_logits_config(h: int, d: int, sm: int = 90) -> MqaConfig | None:
    """Tiles of the plain MQA kernel with bf16 ``q`` and keys (``bf16_mqa_logits``); ``None`` if unsupported.

    :func:`mqa_logits_config`'s tiles with one key tile per iteration and no latency hint, and two MMA chains only at
    D = 128: a bf16 key tile is twice an FP8 one, and with FP8's D = 128 choice (two tiles, hint 6) tileiras 13.4
    spills 17 + 12 words on sm_90, with two chains at D = 64 82 + 32, at D = 32 33 + 34; these settings compile
    spill-free at every head class (``tests/kernels/test_compile_mqa.py``), two CTAs per SM at about 100 KB of
    shared memory each.
    """
    base = mqa_logits_config(h, d, sm)
    if base is None:
        return None
    two = base.two_chains and d == 128
    return MqaConfig(
        bq=base.bq,
        hp=base.hp,
        bk=base.bk,
        head_chain=base.head_chain,
        two_chains=two,
        occupancy=2,
        unroll=1,
        scales_ldg=sm == 90 and not two,
        key_latency=0,
    )


def paged_mqa_config(
    h: int, d: int, next_n: int, block_kv: int, split: int = 256, sm: int = 90
) -> PagedMqaConfig | None:
    """Tiles and launch shape for ``fp8_paged_mqa_logits`` on compute capability ``sm``; ``None`` if unsupported.

    Decode is bound by the latency of dependent loads (schedule -> block table -> cache blocks) more than by
    the MMA, so several CTAs share each schedule row and the kernel streams each batch row's chunks without a
    branch. Measured on an H100 (docs/kernels.md, H = 32/64, D = 128, block_kv = 64, DeepGEMM in the same
    process): with an MMA N side (``rg * hp``) of at most 128, 128-key chunks and 2 CTAs per row (0.94-0.98x
    DeepGEMM; 256-key chunks 0.81-0.88x, 64-key chunks 0.69-0.95x at N = 64 and 0.06x at N = 128, where they spill
    1783 words). The occupancy hint (2 or 3: the same speed at N = 64 and 128) is the one that compiles
    spill-free on sm_90: 3 up to N = 32 (at 2 the 16-key-block variant spills), else 2 (at 3, 80 registers, N = 64
    with 2-D lengths spills). N = 256 keeps the config the GPU tests ran (64-key chunks, 4 CTAs, occupancy 4).
    sm_100 takes the same tiles (spill-free with its walk, never measured).
    """
    if d not in (64, 128) or not 1 <= h <= 128 or not 1 <= next_n <= 4 or block_kv not in (16, 32, 64):
        return None
    if split % 128:
        return None
    hp = _mqa_pow2_ceil(h)
    nnp = _mqa_pow2_ceil(next_n)
    rg = min(nnp, max(1, 256 // hp))
    n_side = rg * hp
    if n_side <= 128:
        ck, parts, occupancy = 128, 2, 3 if n_side <= 32 else 2
    else:
        ck, parts, occupancy = 64, 4, 4
    return PagedMqaConfig(
        nnp=nnp,
        rg=rg,
        hp=hp,
        ck=ck,
        split=split,
        parts=parts,
        occupancy=occupancy,
        head_chain=_head_chain(sm, n_side),
        batch_major=sm == 90,
        rows_outer=sm == 90 and nnp == rg,
    )


# ------------------------------------------------------------------------------- RMSNorm
# (used by ops/cutile/norm.py and tests/kernels/test_compile_norm.py.)

#: The longest row (padded to a power of two) the RMSNorm kernel holds in registers; longer rows run the
#: ``pytorch`` backend.
NORM_MAX_COLS = 8192
#: fp32 elements of x per CTA (rows x padded columns): 64 per thread of the kernel's four warps.
NORM_TILE_ELEMS = 8192
#: Rows per CTA at most (short rows such as 128-wide per-head norms).
NORM_MAX_ROWS = 64
#: The kernel's CTAs-per-SM hint: tileiras then keeps it at 64 registers without spills for every tile above
#: (255 registers, one CTA per SM, without a hint; at 8 it spills on 8192-column rows).
NORM_OCCUPANCY = 4


@dataclass(frozen=True)
class NormConfig:
    """Tile of the RMSNorm kernel: ``rows`` rows x ``cols`` columns (the row length padded to a power of two)."""

    rows: int
    cols: int


def rms_norm_config(h: int) -> NormConfig | None:
    """The RMSNorm tile for rows of ``h`` elements; ``None`` beyond :data:`NORM_MAX_COLS`.

    A CTA holds whole rows (one load, the sum of squares and the scaling in registers):
    ``NORM_TILE_ELEMS / cols`` of them, at most :data:`NORM_MAX_ROWS`.
    """
    if not 1 <= h <= NORM_MAX_COLS:
        return None
    cols = 1 << (h - 1).bit_length()
    return NormConfig(rows=max(1, min(NORM_MAX_ROWS, NORM_TILE_ELEMS // cols)), cols=cols)
