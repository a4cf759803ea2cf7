"""Grouped GEMMs (m-grouped contiguous, psum, masked; k-grouped): the tile configs of ``ops/cutile/grouped.py``
(the CPU gate, ``tests/compile_gate/test_compile_grouped.py``, compiles each). Measurements:
``benchmarks/results/grouped_h100.md``."""

from __future__ import annotations

from tilegemm.heuristics.cutile.problem import Kind, Problem, Rule, TileConfig, first
from tilegemm.ops.common import cdiv

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


def _per_group(p: Problem) -> int:
    """Rows a group expects: the masked op's hint, or the mean of a contiguous layout."""
    return p.expected_m if p.kind == Kind.MASKED else max(1, p.m // max(1, p.groups))


def _fills_sms_wide(p: Problem) -> bool:
    """128x256 tiles still give every SM at least one tile."""
    return p.groups * cdiv(_per_group(p), 128) * cdiv(p.n, 256) >= max(1, p.sms)


#: Grouped configs, first match wins: small groups (<= 64 expected rows) take 64-row tiles so that a 128-row tile
#: is not mostly padding; otherwise the widest tile that still gives every SM a tile.
RULES: tuple[Rule, ...] = (
    Rule(lambda p: p.kind == Kind.K and p.dtype == "fp8", GROUPED_FP8_K, "k-grouped FP8: 8 warps (4 spill)"),
    Rule(lambda p: p.kind == Kind.K and p.has_c, GROUPED_BF16_K_WITH_C, "k-grouped BF16 with C: 8 warps (4 spill)"),
    Rule(lambda p: p.kind == Kind.K, GROUPED_BF16, "k-grouped BF16"),
    Rule(lambda p: p.dtype == "fp8" and _per_group(p) <= 64, GROUPED_FP8_SMALL_M, "FP8 small groups: 64-row tiles"),
    Rule(lambda p: p.dtype == "fp8", GROUPED_FP8, "FP8"),
    Rule(lambda p: _per_group(p) <= 64, GROUPED_BF16_SMALL_M, "BF16 small groups: 64-row tiles"),
    Rule(_fills_sms_wide, GROUPED_BF16_BIG, "BF16 128x256 tiles where they give every SM a tile"),
    Rule(lambda p: True, GROUPED_BF16, "BF16 128x128 tiles"),
)


def grouped_config(p: Problem) -> TileConfig:
    """The tile config of grouped problem ``p``: the first of :data:`RULES` that applies."""
    return first(RULES, p)
