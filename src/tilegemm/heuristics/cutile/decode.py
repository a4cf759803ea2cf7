"""Dense GEMMs of at most :data:`DECODE_MAX_M` rows: the swap-AB decode kernel's variants and launch plan
(``ops/cutile/decode.py``). Measurements: ``docs/notes/heuristics.md``, "Decode-size dense GEMMs"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tilegemm.heuristics.cutile.problem import DECODE_VARIANT_ENV, Problem
from tilegemm.ops.common import cdiv


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

    path: ClassVar[str] = "decode"
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

        FP8 below K = :data:`DECODE_FP8_BM32_MIN_K` skips the 32-row tile for the 64-row one (1.7-2x faster at
        K <= 2048, 9-12% slower at K = 7168: notes, "Decode activation tiles").
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
#: alone fill the SMs: the persistent tile kernel was up to 1.2x faster there (notes, "Decode or tile kernel").
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
    """The decode variant called ``name`` (a problem's ``variant``: what ``$TILEGEMM_DECODE_VARIANT`` forced);
    ``None`` or blank: the default."""
    name = (name or "").strip() or DECODE_CONFIGS[0].name
    for cfg in DECODE_CONFIGS:
        if cfg.name == name:
            return cfg
    raise ValueError(f"{DECODE_VARIANT_ENV}: got {name!r}, expected one of {[c.name for c in DECODE_CONFIGS]}")


def decode_plan(p: Problem, cfg: DecodeConfig) -> DecodePlan:
    """Tiles and K split of dense problem ``p`` on decode variant ``cfg``, sized from the weight bytes per SM.

    Each rule names its section of ``docs/notes/heuristics.md``, "Decode plans":

    * the activation tile narrows to :data:`DECODE_NARROW_BM` rows while the tiles stay within
      :data:`DECODE_NARROW_WAVES` per SM (more SMs stream the weight; "Narrower activation tiles");
    * with fewer tiles than 3/4 of the SMs, K is split to fill the CTA slots within :data:`DECODE_MAX_SPLITS`,
      :data:`DECODE_MIN_STEPS` and :data:`DECODE_PARTIAL_RATIO` ("Split-K"); BF16 tiles of 64 or more rows are
      never split, nor tiles whose weight slice is under :data:`DECODE_SPLIT_MIN_TILE_BYTES`, and a split in two
      becomes none ("Small weights");
    * FP8 tiles of at most 32 rows with :data:`DECODE_LONG_K_STEPS` steps split even when they fill the SMs
      ("Long K");
    * the unsplit FP8 64-row kernel from K = :data:`DECODE_DEEP_MIN_K` gets the load latency hint
      :data:`DECODE_DEEP_LATENCY` ("Load latency hint");
    * an unsplit BF16 plan of at most 16 rows within one wave at :data:`DECODE_BF16_UNSPLIT_OCCUPANCY` CTAs per SM
      is compiled for that many ("Occupancy hint").
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
