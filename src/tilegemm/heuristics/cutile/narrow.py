"""Dense GEMMs of 17 to :data:`~tilegemm.heuristics.cutile.decode.DECODE_MAX_M` rows without ``c``: the
narrow-tile kernel's configs (``ops/cutile/decode.py``). Measurements: ``docs/notes/heuristics.md``, "Narrow tiles"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tilegemm.heuristics.cutile.decode import DECODE_MAX_M
from tilegemm.heuristics.cutile.problem import Problem
from tilegemm.ops.common import cdiv


@dataclass(frozen=True)
class NarrowConfig:
    """The narrow-tile decode kernel (``ops/cutile/decode.py``): ``[bm, bn]`` output tiles (``bm`` activation rows,
    64 or 128, x ``bn`` weight rows), the whole of K per CTA, one warpgroup, ``occupancy`` CTAs per SM; ``bk_bf16``
    the BF16 K step (FP8 steps by one 128-wide scale block); ``latency`` the FP8 kernel's load latency hint;
    ``rotate_k``: weight tile ``pn`` starts its K loop at block ``pn % KB`` and wraps around; ``pair_k``: the FP8
    kernel takes two K blocks per iteration, both MMAs before either promotion; ``unchecked_scales``: the FP8
    kernel loads its scales without bounds checks where every scale tile lies inside the scales
    (``decode.narrow_scales_inside``).

    Rotating the K loop keeps the CTAs off one activation K block at a time (FP8 1.2-1.5x with cold activations;
    BF16 and the 128-row weight tiles do not gain: notes, "Narrow tiles: K rotation"). The latency hint gives the
    FP8 kernel with 1x128 weight scales 4-6 load stages instead of one (notes, "Narrow tiles: latency hint").
    """

    path: ClassVar[str] = "narrow"
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


#: FP8 narrow tiles: 64 weight rows two K blocks per iteration at two CTAs per SM (128 registers), 128 rows or 16;
#: 32 rows only when forced. Only the pairs load their scales unchecked (notes, "Narrow tiles: unchecked scales").
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

    The rules, in order (each measured: ``docs/notes/heuristics.md``, "Narrow tiles"): BF16 32-row tiles at one CTA
    per SM where they fit one wave (:data:`NARROW_BF16_W32_DEEP`); at most :data:`NARROW_SMALL_M` rows only up to
    K = :data:`NARROW_SMALL_M_MAX_K`; FP8 64x64 tile pairs within :data:`NARROW_FP8_PAIR_TILES` of the SMs, else the
    widest weight tile filling :data:`NARROW_FILL` of them (16 rows up to K = :data:`NARROW_FP8_W16_MAX_K`); BF16
    32-row tiles within :data:`NARROW_BF16_MAX_WAVES` waves up to :data:`NARROW_BF16_MAX_M` rows, 128x128 tiles
    above it while they fill :data:`NARROW_FILL` of the SMs in one wave.
    A forced swap-AB variant (``p.variant``: ``$TILEGEMM_DECODE_VARIANT``) and calls with ``c`` never take it.
    """
    if p.has_c or not NARROW_MIN_M < p.m <= DECODE_MAX_M or (p.variant or "").strip():
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
