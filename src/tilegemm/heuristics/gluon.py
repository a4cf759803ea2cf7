"""Configs of the gluon kernels (Hopper), chosen from the problem's shape alone (no runtime search), and the gluon
backend's rule for the automatic backend choice (registered when the backend loads: its host path imports this
module)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from tilegemm import config
from tilegemm.backend import selector
from tilegemm.backend.choice import register_rule
from tilegemm.heuristics.tiling import TailSplit, cheapest_tiling
from tilegemm.ops import operands
from tilegemm.ops.operands import cdiv
from tilegemm.routing import max_padded_rows

BLOCK_M = 128  # two MMA warpgroups of 64 rows
BLOCK_K = 128  # one FP8 scale block per K step
SMEM_BYTES = 232448  # shared memory one Hopper CTA may use (227 KiB)
BARRIER_BYTES = 1024  # the ring's mbarriers, with room to spare
BF16_BLOCK_K = 64  # the BF16 ws kernel's K block: 128 bytes of bf16, one 128-byte swizzled row


# The automatic choice of the dense FP8 kernels, one reason a line (the rows: benchmarks/results/dense-fp8-h200/ for
# the warp-specialized kernel, benchmarks/results/gluon/README.md for fp8_gemm_kernel).
#: ``fp8_gemm_kernel``'s tiles are 128 rows: below 256, cutile's decode kernels (swap-AB, split-K) serve.
DENSE_FP8_MIN_M = 256
#: The ws kernel from this many rows: with 64-row tiles it beats cutile's split-K plans at 200x4096x8192 (1.55x
#: kernel-only), and ties them at 128 rows (benchmarks/results/dense-fp8-h200/few_tiles_h200.json).
DENSE_FP8_WS_MIN_M = 192
#: The ws kernel from this many output tiles (of the design :func:`dense_fp8_ws_design` picks) per SM: it does not
#: split K, and below 384 rows cutile's split-K plans win with fewer (64 128x128 tiles on 132 SMs: 0.94x eager;
#: 68 64x128 tiles: 0.98x kernel-only). From 72 64x128 tiles up it won every measured row: ten rows of M 192-320
#: and 72-96 tiles, 1.09-1.42x eager and 1.16-1.45x kernel-only (benchmarks/results/dense-fp8-h200/
#: few_tiles_threshold_h200.json); 112 128x128 tiles: 1.23x; 128 64x128 tiles: 1.19x.
DENSE_FP8_WS_MIN_TILES_PER_SM = 0.54
#: From 384 rows the ws kernel wins with fewer tiles (every measured row, 48-72 tiles included: 1.34-1.56x), down
#: to this many per SM (the fewest measured).
DENSE_FP8_WS_MIN_TILES_PER_SM_FROM_384 = 0.35
#: ...and with at least this many tile-steps (tiles x K blocks) per SM (the fewest measured: 2.9, 1.10x eager).
DENSE_FP8_WS_MIN_STEPS_PER_SM = 2.5
#: ``fp8_gemm_kernel``: fewer tile-steps per SM and cutile's split-K plans fill the machine better (384 on 132 lost).
DENSE_FP8_MIN_STEPS_PER_SM = 4
#: ``fp8_gemm_kernel``: fewer output tiles than half the SMs leave most SMs idle: 34-64 tiles on 132 lost (0.59-0.91x).
DENSE_FP8_MIN_TILES_PER_SM = 0.5
#: ``fp8_gemm_kernel``: an eager call must be large enough to pay its host cost (measured before the host path
#: relaunched through :class:`tilegemm.ops.gluon.tma.Relaunch`): from here every measured row won eager too.
DENSE_FP8_MIN_FLOPS = 2e10


#: The design of the warp-specialized FP8 kernel (``ops/gluon/fp8_gemm_ws.py``, by its ``VARIANTS`` name) the dense
#: FP8 calls run where it computes what they ask (:func:`takes_ws_kernel`) and 128x128 tiles fill the SMs: persistent,
#: each K block's promotion under the next block's wgmma in runs of 8 (7 promotions in 8; R208, no spills). Faster
#: than runs of 4 on each of the 20 measured rows of 256-12288 rows
#: (benchmarks/results/dense-fp8-h200/ws_overlap_designs_h200.json).
DENSE_FP8_WS_DESIGN = "d_128x128_ov8"
#: ...with each MMA warpgroup a partition of its own (``wg_parts`` 2; runs of 4 in each) where its 128x128 tiles run
#: at least :data:`DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS` rounds over the SMs: there the two warpgroups drift apart and
#: one's promotion runs under the other's wgmma. On the 26 set rows of that design and 8192x4096x7168 (H200, the
#: same process) it won all 11 set rows of 4 rounds or more and that one, 1.01-1.10x (1.04x geomean;
#: 8192x4096x7168 and 4096x7168x16384 1.10x), and lost up to 0.92x on rows of fewer rounds, where a CTA runs few
#: tiles (benchmarks/results/dense-fp8-h200/wg_parts_designs_h200.json).
DENSE_FP8_WS_LONG_DESIGN = "g_128x128_ov4"
DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS = 4
#: The designs for dense calls whose 128x128 tiles would leave SMs idle (:func:`dense_fp8_ws_design`): 64x128 tiles
#: (one MMA warpgroup, ``mma_warps`` 4: m64n128 wgmma, runs of 4) and 128x64 tiles (each of two warpgroups 64 rows
#: of 64 columns, each a partition of its own, runs of 2). One warpgroup on the whole 64-row tile ran 1.05-1.12x the
#: two warpgroups splitting its columns (``e_64x128_ov2``: A read from shared memory twice) on seven rows of M 200-512
#: (H200, benchmarks/results/dense-fp8-h200/one_warpgroup_h200.json). The 128x64 warpgroups as partitions ran
#: 1.01-1.03x the lockstep ``f_128x64_ov2`` on five rows of M 256-1024, N 2112, in two rounds each (H200,
#: benchmarks/results/gluon/fp8_g128x64_partitions_h200.json).
DENSE_FP8_WS_SHORT_M_DESIGN = "i_64x128_ov4"
DENSE_FP8_WS_SHORT_N_DESIGN = "g_128x64_ov2"
#: The time of a 64x128 or 128x64 tile over a 128x128 one's on an SM (H200, rows where both fill the SMs in one
#: round: 0.81 for 64x128 with two warpgroups; 0.79 for 128x64 at 512x2112x7168; benchmarks/results/dense-fp8-h200/).
#: Kept at 0.8 for the one-warpgroup 64x128 tile, which only runs faster on the rows the rule gives it.
WS_SHORT_TILE_COST = 0.8
#: 64x64 tiles (one 64-row wave, one MMA warpgroup, runs of 2; 1.09-1.12x the two warpgroups 32 columns each) for
#: calls whose 64x128 and 128x64 tilings still leave SMs idle: 68 tiles at 256x2112 become one round of 132.
DENSE_FP8_WS_64X64_DESIGN = "i_64x64_ov2"
#: 128x192 tiles (each MMA warpgroup a partition running 64 rows of 192 columns) for dense calls where they cut the
#: rounds of 128x128 tiles: two rounds to one on 7 rows off the set, 1.07-1.15x the 128x128 design; three to two
#: lost (0.94-0.95x; H200, benchmarks/results/gluon/g_128x192_rounds_h200.json).
DENSE_FP8_WS_WIDE_DESIGN = "g_128x192"
#: A 128x192 tile's time over a 128x128 one's: 1.7, between what those rows imply (two rounds over one at
#: 1.07-1.15x: 1.74-1.87; three over two at 0.94-0.95x: 1.58-1.60).
WS_WIDE_TILE_COST = 1.7
#: A 64x64 tile's time over a 128x128 one's: 0.69-0.70 (one round of 132 64x64 tiles against one of 68 64x128 ones
#: at 256x2112x7168, of 128 against 64 at 128x4096x7168; benchmarks/results/dense-fp8-h200/h_64x64_h200.json).
WS_64X64_TILE_COST = 0.7
#: 64x64 tiles from this K: with fewer K blocks a tile's prologue and epilogue weigh more. On one MMA warpgroup,
#: against what the public op ran before (H200, benchmarks/results/dense-fp8-h200/short_k_64x64_h200.json, 34 rows
#: of M 128-512, kernel-only): at K 1536-3072 1.04-1.14x (cutile's split-K plans at M 128-256; 64x128 tiles at
#: 512x1024) and 1.85-2.36x at 320x1536 (cutile's kernels at 320 rows); at K 768 0.98-1.01x at M 128-256, 1.07x at
#: 512x1024 and 1.52x at 320x1536; at K 512 0.94-0.98x. K 4096-7168: 1.08-1.15x.
DENSE_FP8_WS_64X64_MIN_K = 768
#: ...and the ws kernel in 64x64 tiles from this many rows (128x4096x7168: 1.11x cutile's split-K plans).
DENSE_FP8_WS_64X64_MIN_M = 128
#: The dense designs in order of preference where their costs tie: (design, tile rows, tile columns, a tile's time
#: relative to a 128x128 one's).
DENSE_FP8_WS_TILES = (
    (DENSE_FP8_WS_DESIGN, BLOCK_M, 128, 1.0),
    (DENSE_FP8_WS_SHORT_M_DESIGN, BLOCK_M // 2, 128, WS_SHORT_TILE_COST),
    (DENSE_FP8_WS_SHORT_N_DESIGN, BLOCK_M, 64, WS_SHORT_TILE_COST),
    (DENSE_FP8_WS_64X64_DESIGN, BLOCK_M // 2, 64, WS_64X64_TILE_COST),
    (DENSE_FP8_WS_WIDE_DESIGN, BLOCK_M, 192, WS_WIDE_TILE_COST),
)


#: The dense FP8 split tail (H200): 2048x2112x7168 66.5 -> 55.8 us (272 tiles: two rounds and 8), 4096x2112x7168
#: 1.11x, 8192x8192x8192 1.01-1.04x. A run's fixed cost measured about 22 K blocks of 128; the rule charges 24.
DENSE_FP8_WS_TAIL_SPLIT = TailSplit({DENSE_FP8_WS_DESIGN: "d_128x128_ov8_sk"}, BLOCK_K, 24)
#: The dense FP8 single-round splits of the one-warpgroup tilings, for calls whose 64x128 or 64x64 tiles fill at
#: most half the SMs (H200, benchmarks/results/dense-fp8-h200/one_wg_split_h200.json, kernel-only): 32 64x128 tiles
#: split 4 ways ran 1.72x unsplit at 256x1024x16384 (a run's fixed cost 43 K blocks of 128) and 1.20x at
#: 128x2048x7168 (33); 64 64x64 tiles split 2 ways 1.35x and 1.08x there (31, 24). 64 64x128 tiles split 2 ways
#: at 128x4096x7168 ran 1.03x unsplit, below its 128 64x64 tiles (0.94x of those). The rule charges 36 and 24. On 13
#: rows of M 128-1024, N 256-2112, K 7168-16384 (eleven not fitted) the rule's split ran 1.34-2.06x cutile's split-K
#: plans (what the rule ran before), each at least 0.987x the fastest of the four one-warpgroup designs.
DENSE_FP8_WS_ROUND_SPLITS = (
    TailSplit({"i_64x128_ov4": "i_64x128_ov4_sk4"}, BLOCK_K, 36, splits=4, single_round=True),
    TailSplit({"i_64x64_ov2": "i_64x64_ov2_sk2"}, BLOCK_K, 24, splits=2, single_round=True),
)
#: Every split of the dense FP8 tilings.
DENSE_FP8_WS_SPLITS = (DENSE_FP8_WS_TAIL_SPLIT, *DENSE_FP8_WS_ROUND_SPLITS)
#: The single-round split designs and their runs a tile.
DENSE_FP8_WS_ROUND_SPLIT_RUNS = {d: s.splits for s in DENSE_FP8_WS_ROUND_SPLITS for d in s.designs.values()}

#: The BF16 split-tail design of 128x128 tiles spills with fp32 output from triton 3.9: 1 STL / 2 LDL in the MMA
#: partition, outside the K loop (an address of the epilogue's, held from before the loop). Its calls with fp32
#: output run the tile unsplit there (:func:`dense_bf16_ws_design`).
TRITON_SPILLS_BF16_FP32_FROM = (3, 9)
BF16_FP32_SPILLING_DESIGNS = frozenset({"bf16_128x128_sk"})


def spill_free_here(since: tuple[int, int]) -> bool:
    """True where the installed triton compiles the designs that spill from triton ``since`` without spills (before
    it, or no triton): :data:`BF16_FP32_SPILLING_DESIGNS` with fp32 output for :data:`TRITON_SPILLS_BF16_FP32_FROM`."""
    version = selector.triton_version()
    return version is None or version < since


# The automatic choice of the dense BF16 GEMMs (benchmarks/results/gluon/bf16_ws_h200.json: the BF16 ws kernel's
# designs beside cutile, cuBLAS and DeepGEMM on 48 rows of M 160-1024; benchmarks/results/dense-bf16-h200/: the
# public op on every row of the set, the cutile kernels of each row the kernel takes beside it).
#: The BF16 ws kernel (``ops/gluon/bf16_gemm_ws.py``) serves rows in this range, where it was measured: at M 160-1024
#: the design :func:`dense_bf16_ws_design` picks ran 1.06x the cutile kernels (geomean, 40 of 48 rows faster); the
#: benchmark set's rows run to 8192.
DENSE_BF16_WS_MIN_M = 129
DENSE_BF16_WS_MAX_M = 8192
#: ...and from this many rows below that (K from :data:`DENSE_BF16_WS_MIN_K`) where the design's runs (its tiles, each
#: split tile's runs counted) fill at least :data:`DENSE_BF16_WS_FEW_ROWS_MIN_RUNS_PER_SM` of the SMs: on 14 rows of
#: M 64-128 (H200, benchmarks/results/dense-bf16-h200/bf16_few_rows_h200.json) the 9 such rows of M 96-128 ran
#: 1.09-1.34x the cutile kernels kernel-only and 0.97-1.31x eager; the rows of 68 runs or fewer 0.73-1.14x
#: (128x2112x7168, 68 runs: 0.96x), 64x7168x16384 1.00x.
DENSE_BF16_WS_FEW_ROWS_MIN_M = 96
DENSE_BF16_WS_FEW_ROWS_MIN_RUNS_PER_SM = 0.6
#: ...with K at least this deep: the rows of K 768 (kernels of 6-10 us) lost 0.91-0.97x...
DENSE_BF16_WS_MIN_K = 1024
#: ...and below it, from K :data:`DENSE_BF16_WS_SHALLOW_K_LEAST_K`, where the rule's design is the 64x128 tile and M
#: is at least this: on 48 rows of M 192-768 at K 512-768 (H200, benchmarks/results/gluon/bf16_short_k_h200.json,
#: kernel-only) the 16 such rows of M 320-768 ran 1.11-1.26x the cutile kernels; the 128-row tiles there 0.96-1.00x,
#: the 64x128 tiles at M 192-256 0.92-1.01x (but 192x32768x512: 1.15x).
DENSE_BF16_WS_SHALLOW_K_MIN_M = 320
DENSE_BF16_WS_SHALLOW_K_LEAST_K = 512
#: The 64x128 design: one MMA warpgroup on the tile (``_w4``), 1.01-1.04x the two warpgroups splitting its
#: columns on 23 of 24 rows of M 256-1024, split 2 ways 1.01-1.09x (H200,
#: benchmarks/results/gluon/bf16_one_warpgroup_h200.json).
DENSE_BF16_WS_SHORT_M_DESIGN = "bf16_64x128_w4"
#: The BF16 designs by preference where their costs tie: (design, tile rows, tile columns, a tile's time relative
#: to a 128x128 one's: 0.73 for 64x128 and 128x64 at 256x4096x7168; 1.83-1.95 for 128x256 at 512x7168x16384,
#: 1024x4096x7168 and 1024x7168x16384: benchmarks/results/gluon/bf16_ws_designs_h200.json). The 128x256 tiles run
#: with each MMA warpgroup a partition of its own (``_wg2``): 1.00-1.09x the lockstep design on the 9 rows of
#: benchmarks/results/gluon/bf16_wg2_dense_h200.json (median of 3 runs in turn), most at many rounds of short K.
DENSE_BF16_WS_TILES = (
    ("bf16_128x128", BLOCK_M, 128, 1.0),
    (DENSE_BF16_WS_SHORT_M_DESIGN, BLOCK_M // 2, 128, 0.75),
    ("bf16_128x64", BLOCK_M, 64, 0.75),
    ("bf16_128x256_wg2", BLOCK_M, 256, 1.9),
)
#: ...and at K up to :data:`DENSE_BF16_WS_SHORT_K`, where a round of 64x128 tiles cost 0.54-0.58 of a round of 128x128
#: ones (2048x1536x2048: three rounds of 64x128 tiles 20.8 us, one of 128x256 23.7, two of 128x128 23.8;
#: 256x7168x2048 and 512x7168x2048 likewise: benchmarks/results/gluon/bf16_short_k_tiles_h200.json), the half tiles
#: at 0.6.
DENSE_BF16_WS_SHORT_K = 2048
DENSE_BF16_WS_SHORT_K_HALF_TILE_COST = 0.6
DENSE_BF16_WS_SHORT_K_TILES = tuple(
    (design, rows, cols, DENSE_BF16_WS_SHORT_K_HALF_TILE_COST if rows * cols == BLOCK_M * 64 else cost)
    for design, rows, cols, cost in DENSE_BF16_WS_TILES
)
#: The dense BF16 split tail (H200): 2048x2112x7168 115.6 -> 89.9 us (272 128x128 tiles: two rounds and 8); a run's
#: fixed cost measured 23-25 K blocks of 64; the rule charges 32. 128x256 tiles are not split.
DENSE_BF16_WS_TAIL_SPLIT = TailSplit(
    {
        "bf16_128x128": "bf16_128x128_sk",
        DENSE_BF16_WS_SHORT_M_DESIGN: "bf16_64x128_w4_sk",
        "bf16_128x64": "bf16_128x64_sk",
    },
    64,
    32,
)
#: The dense BF16 single-round split (H200, benchmarks/results/gluon/split_tail_short_h200.json): at 256x2112x7168
#: the 66 128x64 tiles split 2 ways over 132 SMs ran 16.9 us against the 68 unsplit 64x128 tiles' 20.9 us (a run's
#: fixed cost about 34 K blocks of 64); 64 128x128 tiles split 2 ways at 256x4096x7168 lost 0.83x (46), so only
#: the half tiles split, and the rule charges 40. M need not be whole row tiles since the kernel moves a partial
#: last row tile up to end at M (``tiles.tile_row``): at 200x2112x7168 the split then ran 17.7 us against 21.1 for
#: the unsplit 64x128 tiles, where with the tile unmoved it ran 29.1
#: (benchmarks/results/gluon/bf16_last_row_tile_h200.json).
DENSE_BF16_WS_ROUND_SPLIT = TailSplit(
    {DENSE_BF16_WS_SHORT_M_DESIGN: "bf16_64x128_w4_sk2", "bf16_128x64": "bf16_128x64_sk2"},
    64,
    40,
    splits=2,
    single_round=True,
)
#: Both splits of the dense BF16 tilings.
DENSE_BF16_WS_SPLITS = (DENSE_BF16_WS_TAIL_SPLIT, DENSE_BF16_WS_ROUND_SPLIT)
#: The single-round split designs and their runs a tile.
DENSE_BF16_WS_ROUND_SPLIT_RUNS = {
    d: DENSE_BF16_WS_ROUND_SPLIT.splits for d in DENSE_BF16_WS_ROUND_SPLIT.designs.values()
}


#: The design of the warp-specialized kernel the m-grouped contiguous FP8 calls run (``ops/gluon/grouped.py``): one
#: 128-row wave a tile (one group), as the dense calls, each K block's promotion under the next block's wgmma in runs
#: of 4; the fused experts' down projection runs it at every size.
M_GROUPED_FP8_WS_DESIGN = "d_128x128_ov4"
#: ...in runs of 8 where the groups are long: from this many rows a group on average (padding included) runs of 8
#: won 1.00-1.14x over runs of 4 on each of the 14 rows measured there (12 set rows of 8-32 groups of 512-8192 rows,
#: 1.03x geomean; a skewed 64-expert row of 432 rows a group, 1.14x), and lost up to 0.96x on groups of 128-316 rows
#: (benchmarks/results/grouped-fp8-h200/m_grouped_ov8_designs_h200.json).
M_GROUPED_FP8_WS_LONG_DESIGN = "d_128x128_ov8"
M_GROUPED_FP8_WS_LONG_MIN_ROWS = 384
#: ...and each MMA warpgroup a partition of its own (runs of 8) where K is short: on the five set rows of K 768 (4-256
#: groups, N 2048) it ran 1.05x / 1.05x / 1.03x / 1.01x / 1.00x the design chosen before (4 / 8 / 32 / 128 / 256
#: groups; two rounds, each within 0.005x of the other), while at K 2048 and 7168 it was mixed (0.92-1.10x)
#: (benchmarks/results/grouped-fp8-h200/m_grouped_short_k_h200.json, wg_parts_m_grouped_h200.json).
M_GROUPED_FP8_WS_SHORT_K_DESIGN = "g_128x128_ov8"
M_GROUPED_FP8_WS_SHORT_K_MAX = 768
#: The design the k-grouped FP8 calls run: 128x128 tiles, persistent, each MMA warpgroup a partition of its own, the
#: next K block's wgmma in flight during each promotion (runs of 2), B's column scales read from the stage at the
#: promotion (no spills: tests/compile_gate/test_compile_gluon_ws.py). The lockstep design with the overlap
#: (``d_128x128_ov``) ran 0.83x DeepGEMM against 0.74x without it
#: (benchmarks/results/grouped-fp8-h200/k_grouped_ov_designs_h200.json); this one 1.03x that (0.97-1.08x, faster on
#: 4 of the 6 set rows, the 16-group rows 1.07-1.08x; benchmarks/results/grouped-fp8-h200/wg_parts_k_grouped_h200.json).
K_GROUPED_FP8_WS_DESIGN = "g_128x128_ov2"
#: The grouped FP8 calls the ws kernel takes: enough 128x128 tiles for the SMs and tile-steps per SM, as dense.
GROUPED_FP8_MIN_TILES_PER_SM = 0.75
GROUPED_FP8_MIN_STEPS_PER_SM = 2.5
#: The fused FP8 experts run on the m-grouped GEMMs (``ops/gluon/moe_fp8.py``) from this many routed rows per
#: expert on average (``T * k / E``): half a 128-row tile each, where the gluon GEMMs' speed pays for the padding;
#: below it the cutile form's smaller row tiles win (the rows: benchmarks/results/moe-fp8-gluon-h200/).
MOE_FP8_MIN_ROWS_PER_EXPERT = 64
#: The design of the fused experts' gate/up GEMM (the ws kernel's gated form: gate and up tiles, the activation and
#: its FP8 quantization in the epilogue): no overlap, since two accumulators and one product tile already take
#: R221 of the 224 registers (tests/compile_gate/test_compile_gluon_ws.py).
MOE_FP8_GATE_UP_WS_DESIGN = "a_128x128_p"


def takes_ws_kernel(recipe: tuple[int, int, int], has_c: bool, alpha: float) -> bool:
    """Whether a gluon dense FP8 call runs the warp-specialized kernel: DeepGEMM's recipe (B scaled per 128x128
    block), no addend and ``alpha`` 1, the product it computes; other calls run ``fp8_gemm_kernel``."""
    return tuple(recipe) == (1, 128, 128) and not has_c and alpha == 1.0


class GluonDenseConfig(NamedTuple):
    """One launch of ``fp8_gemm_kernel``: tile width, ring depth, raster group, MMA issue order, registers.

    ``order`` 1: the two MMA warpgroups take turns issuing each K block's wgmma (an mbarrier pair), so one
    promotes while the other's MMA runs; 0: free issue; 2: turns at MMA completion (1 measured fastest:
    benchmarks/results/gluon/README.md).
    """

    block_n: int = 128
    stages: int = 6
    group_m: int = 8
    order: int = 1
    loader_regs: int = 40
    mma_regs: int = 232


def max_stages(block_n: int, out_bytes: int) -> int:
    """The deepest A/B ring that fits beside the two [64, block_n] output staging tiles."""
    stage = (BLOCK_M + block_n) * BLOCK_K + 4 * (BLOCK_M + block_n)  # FP8 tiles and their fp32 scales
    return (SMEM_BYTES - BARRIER_BYTES - 2 * 64 * block_n * out_bytes) // stage


def fit_stages(cfg: GluonDenseConfig, out_bytes: int) -> GluonDenseConfig:
    """``cfg`` with its ring no deeper than shared memory allows for an output of ``out_bytes`` an element."""
    return cfg._replace(stages=min(cfg.stages, max_stages(cfg.block_n, out_bytes)))


def dense_fp8_config(m: int, n: int, k: int, num_sms: int, out_bytes: int = 2) -> GluonDenseConfig:
    """The gluon dense FP8 config of an [M, K] x [N, K] problem on ``num_sms`` SMs, output ``out_bytes`` wide."""
    return fit_stages(GluonDenseConfig(), out_bytes)


def prefers_dense_fp8(m: int, n: int, k: int, num_sms: int, ws: bool = True) -> bool:
    """True when the gluon backend is the automatic choice for an [M, K] x [N, K] FP8 GEMM on ``num_sms`` SMs.

    ``ws``: the call runs the warp-specialized kernel (:func:`takes_ws_kernel`): then where it beats cutile
    (:func:`ws_kernel_faster`), kernel-only and eager alike (its host path costs no more than cutile's). Else
    ``fp8_gemm_kernel``: where it is faster kernel-only (:func:`kernel_faster_dense_fp8`) and the call is large
    enough that its host cost does not undo that in an eager call (:data:`DENSE_FP8_MIN_FLOPS`).
    """
    if ws:
        return ws_kernel_faster(m, n, k, num_sms)
    if 2.0 * m * n * k < DENSE_FP8_MIN_FLOPS:
        return False
    return kernel_faster_dense_fp8(m, n, k, num_sms)


def dense_fp8_ws_tiling(m: int, n: int, k: int, num_sms: int) -> tuple[str, int]:
    """The ws kernel's design for a dense [M, K] x [N, K] call on ``num_sms`` SMs, and its number of output tiles:
    the cheapest tiling of :data:`DENSE_FP8_WS_TILES` (:func:`cheapest_tiling`), 64x64 tiles from
    :data:`DENSE_FP8_WS_64X64_MIN_K`, refined by the split tail (:data:`DENSE_FP8_WS_TAIL_SPLIT`) or a single short
    round's split (:data:`DENSE_FP8_WS_ROUND_SPLITS`: 32 64x128 tiles at 256x1024x16384 run 4 ways). One round of 64
    128x128 tiles on 132 SMs becomes one round of 128 64x128 tiles; 68 tiles at 512x2112 become one round of 132
    128x64 tiles, at 256x2112x7168 one of 132 64x64 tiles; 272 128x128 tiles at 2048x2112x7168 run two rounds and
    a split tail; 192 128x128 tiles at 2048x1536 (two rounds) become one round of 128 128x192 tiles; 128x128 tiles
    of :data:`DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS` rounds or more run :data:`DENSE_FP8_WS_LONG_DESIGN` (4096x7168x2048:
    1792 tiles, 14 rounds)."""
    tiles = tuple(t for t in DENSE_FP8_WS_TILES if k >= DENSE_FP8_WS_64X64_MIN_K or t[0] != DENSE_FP8_WS_64X64_DESIGN)
    design, count = cheapest_tiling(m, n, num_sms, tiles, k, DENSE_FP8_WS_SPLITS)
    if design == DENSE_FP8_WS_DESIGN and count >= DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS * max(num_sms, 1):
        design = DENSE_FP8_WS_LONG_DESIGN
    return design, count


def dense_fp8_ws_design(m: int, n: int, k: int, num_sms: int) -> str:
    """The ws kernel's design for a dense [M, K] x [N, K] call on ``num_sms`` SMs (:func:`dense_fp8_ws_tiling`)."""
    return dense_fp8_ws_tiling(m, n, k, num_sms)[0]


def ws_kernel_faster(m: int, n: int, k: int, num_sms: int) -> bool:
    """True where the warp-specialized kernel beats cutile's kernels: from :data:`DENSE_FP8_WS_MIN_M` rows
    (:data:`DENSE_FP8_WS_64X64_MIN_M` in 64x64 tiles or a single round's split), enough runs of the design it runs
    (:func:`dense_fp8_ws_tiling`: its output tiles, times the splits of a split single round) for the SMs
    (:data:`DENSE_FP8_WS_MIN_TILES_PER_SM`, fewer from 384 rows but for 64x64 tiles and split rounds) and enough
    tile-steps per SM."""
    design, tiles = dense_fp8_ws_tiling(m, n, k, num_sms)
    splits = DENSE_FP8_WS_ROUND_SPLIT_RUNS.get(design, 1)
    least_m = DENSE_FP8_WS_64X64_MIN_M if design == DENSE_FP8_WS_64X64_DESIGN or splits > 1 else DENSE_FP8_WS_MIN_M
    if m < least_m or tiles * cdiv(k, BLOCK_K) < DENSE_FP8_WS_MIN_STEPS_PER_SM * num_sms:
        return False
    # 64x64 tiles and split rounds: measured with 128-132 runs of them only
    fewer_ok = m >= 384 and design != DENSE_FP8_WS_64X64_DESIGN and splits == 1
    least = DENSE_FP8_WS_MIN_TILES_PER_SM_FROM_384 if fewer_ok else DENSE_FP8_WS_MIN_TILES_PER_SM
    return tiles * splits >= least * num_sms


def dense_bf16_ws_design(m: int, n: int, k: int, num_sms: int, out_bytes: int = 2) -> str:
    """The BF16 ws kernel's design (a ``bf16_gemm_ws.VARIANTS`` name) for a dense [M, K] x [N, K] call on
    ``num_sms`` SMs into an output of ``out_bytes`` an element: the cheapest tiling of :data:`DENSE_BF16_WS_TILES`
    (:func:`cheapest_tiling`), refined by the split tail (:data:`DENSE_BF16_WS_TAIL_SPLIT`) or a single round's split
    (:data:`DENSE_BF16_WS_ROUND_SPLIT`); at K up to :data:`DENSE_BF16_WS_SHORT_K` with the short-K costs
    (:func:`dense_bf16_ws_tiles`). No split into a design of :data:`BF16_FP32_SPILLING_DESIGNS` with fp32 output
    where it spills (:data:`TRITON_SPILLS_BF16_FP32_FROM`)."""
    return dense_bf16_ws_tiling(m, n, k, num_sms, out_bytes)[0]


def dense_bf16_ws_tiling(m: int, n: int, k: int, num_sms: int, out_bytes: int = 2) -> tuple[str, int]:
    """:func:`dense_bf16_ws_design`'s design and its number of output tiles (each split tile counted once)."""
    splits = DENSE_BF16_WS_SPLITS
    if out_bytes == 4 and not spill_free_here(TRITON_SPILLS_BF16_FP32_FROM):
        splits = tuple(
            s._replace(designs={u: d for u, d in s.designs.items() if d not in BF16_FP32_SPILLING_DESIGNS})
            for s in splits
        )
    return cheapest_tiling(m, n, num_sms, dense_bf16_ws_tiles(k), k, splits)


def dense_bf16_ws_tiles(k: int) -> tuple[tuple[str, int, int, float], ...]:
    """The BF16 tilings and their costs at depth ``k``: :data:`DENSE_BF16_WS_SHORT_K_TILES` up to
    :data:`DENSE_BF16_WS_SHORT_K`, else :data:`DENSE_BF16_WS_TILES`."""
    return DENSE_BF16_WS_SHORT_K_TILES if k <= DENSE_BF16_WS_SHORT_K else DENSE_BF16_WS_TILES


def prefers_dense_bf16(m: int, n: int, k: int, num_sms: int) -> bool:
    """True where the BF16 ws kernel is the automatic choice for an [M, K] x [N, K] product (no addend, ``alpha``
    1, K-major operands) on ``num_sms`` SMs: :data:`DENSE_BF16_WS_MIN_M` to :data:`DENSE_BF16_WS_MAX_M` rows, K from
    :data:`DENSE_BF16_WS_MIN_K`; shallower K (from :data:`DENSE_BF16_WS_SHALLOW_K_LEAST_K`) where the design is the
    64x128 tile (:func:`dense_bf16_ws_design`) and M at least :data:`DENSE_BF16_WS_SHALLOW_K_MIN_M`; fewer rows (from
    :data:`DENSE_BF16_WS_FEW_ROWS_MIN_M`) where the design's runs fill :data:`DENSE_BF16_WS_FEW_ROWS_MIN_RUNS_PER_SM`
    of the SMs."""
    if not DENSE_BF16_WS_FEW_ROWS_MIN_M <= m <= DENSE_BF16_WS_MAX_M or k < DENSE_BF16_WS_SHALLOW_K_LEAST_K:
        return False
    if m < DENSE_BF16_WS_MIN_M:
        if k < DENSE_BF16_WS_MIN_K:
            return False
        design, tiles = dense_bf16_ws_tiling(m, n, k, num_sms)
        runs = tiles * DENSE_BF16_WS_ROUND_SPLIT_RUNS.get(design, 1)
        return runs >= DENSE_BF16_WS_FEW_ROWS_MIN_RUNS_PER_SM * num_sms
    if k >= DENSE_BF16_WS_MIN_K:
        return True
    return m >= DENSE_BF16_WS_SHALLOW_K_MIN_M and dense_bf16_ws_design(m, n, k, num_sms) == DENSE_BF16_WS_SHORT_M_DESIGN


def _read_in_place(*xs: torch.Tensor) -> bool:
    """Whether the BF16 ws kernel reads each 2-D operand of ``xs`` as it is: unit-stride rows, TMA-ready."""
    return all(x.stride(1) == 1 and operands.tma_ready(x) for x in xs)


def bf16_ws_takes(a: torch.Tensor, b: torch.Tensor, has_c: bool, alpha: float) -> bool:
    """Whether the BF16 ws kernel computes a call as given (logical ``nt`` form): no addend, ``alpha`` 1, A [M, K]
    and B [N, K] K-major and TMA-ready (it makes no copies)."""
    if has_c or alpha != 1.0:
        return False
    return _read_in_place(a, b)


def kernel_faster_dense_fp8(m: int, n: int, k: int, num_sms: int) -> bool:
    """True where ``fp8_gemm_kernel`` beats cutile's kernels kernel-only (CUDA-graph replay), whatever the host cost
    of a call: 128-row tiles, enough of them to occupy half the SMs (it does not split K), and enough tile-steps per
    SM that the persistent schedule fills the machine."""
    tiles = cdiv(m, BLOCK_M) * cdiv(n, 128)
    if m < DENSE_FP8_MIN_M or tiles < DENSE_FP8_MIN_TILES_PER_SM * num_sms:
        return False
    return tiles * cdiv(k, BLOCK_K) >= DENSE_FP8_MIN_STEPS_PER_SM * num_sms


@register_rule("fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt")
def dense_fp8_rule(arguments: dict[str, Any]) -> str | None:
    """The automatic choice's rule for the dense FP8 GEMMs (``arguments``: what the check derived, the logical
    ``nt`` form): ``gluon`` on Hopper where :func:`prefers_dense_fp8` says the kernel the call runs there
    (:func:`takes_ws_kernel`) is faster, else no claim."""
    d = arguments["d"]
    if not _gluon_may_run(d):
        return None
    (a_data, _), (b_data, _) = arguments["a"], arguments["b"]
    m, k = a_data.shape
    addend = arguments["c"] is not None and arguments["beta"] != 0
    ws = takes_ws_kernel(arguments["recipe"], addend, arguments["alpha"])
    if prefers_dense_fp8(m, b_data.shape[0], k, config.get_num_sms(), ws):
        return "gluon"
    return None


@register_rule("bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt")
def dense_bf16_rule(arguments: dict[str, Any]) -> str | None:
    """The automatic choice's rule for the dense BF16 GEMMs (``arguments``: the logical ``nt`` form the check
    derived): ``gluon`` on Hopper where the BF16 ws kernel computes the call as given (:func:`bf16_ws_takes`) and
    :func:`prefers_dense_bf16` says it is faster, else no claim."""
    d, a, b = arguments["d"], arguments["a"], arguments["b"]
    if not _gluon_may_run(d):
        return None
    addend = arguments["c"] is not None and arguments["beta"] != 0
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    if bf16_ws_takes(a, b, addend, arguments["alpha"]) and prefers_dense_bf16(m, n, k, config.get_num_sms()):
        return "gluon"
    return None


def grouped_tiles_suffice(tiles: int, k_blocks: int, num_sms: int) -> bool:
    """Whether ``tiles`` 128x128 output tiles of ``k_blocks`` K blocks each on average fill ``num_sms`` SMs well enough
    for the ws kernel (it does not split K)."""
    if tiles < GROUPED_FP8_MIN_TILES_PER_SM * num_sms:
        return False
    return tiles * k_blocks >= GROUPED_FP8_MIN_STEPS_PER_SM * num_sms


def prefers_m_grouped_fp8(m_sum: int, n: int, k: int, num_sms: int) -> bool:
    """True when the gluon backend is the automatic choice for an m-grouped contiguous FP8 GEMM of ``m_sum`` rows
    against [G, N, K] weights on ``num_sms`` SMs (:func:`grouped_tiles_suffice`)."""
    return grouped_tiles_suffice(cdiv(m_sum, BLOCK_M) * cdiv(n, 128), cdiv(k, BLOCK_K), num_sms)


def m_grouped_fp8_ws_design(m_sum: int, groups: int, k: int) -> str:
    """The ws kernel's design for an m-grouped contiguous FP8 call of ``m_sum`` rows (padding included) over
    ``groups`` groups of [N, ``k``] weights: :data:`M_GROUPED_FP8_WS_SHORT_K_DESIGN` up to
    :data:`M_GROUPED_FP8_WS_SHORT_K_MAX` K, else :data:`M_GROUPED_FP8_WS_LONG_DESIGN` from
    :data:`M_GROUPED_FP8_WS_LONG_MIN_ROWS` rows a group on average, else :data:`M_GROUPED_FP8_WS_DESIGN`."""
    if groups == 0:
        return M_GROUPED_FP8_WS_DESIGN
    if k <= M_GROUPED_FP8_WS_SHORT_K_MAX:
        return M_GROUPED_FP8_WS_SHORT_K_DESIGN
    if m_sum >= M_GROUPED_FP8_WS_LONG_MIN_ROWS * groups:
        return M_GROUPED_FP8_WS_LONG_DESIGN
    return M_GROUPED_FP8_WS_DESIGN


def prefers_k_grouped_fp8(groups: int, m: int, n: int, k_sum: int, num_sms: int) -> bool:
    """True when the gluon backend is the automatic choice for a k-grouped FP8 GEMM into fp32 [G, M, N] over K_sum:
    M a multiple of 128 (the kernel's condition) and enough tiles (:func:`grouped_tiles_suffice`)."""
    if m % BLOCK_M or groups == 0:
        return False
    return grouped_tiles_suffice(groups * cdiv(m, BLOCK_M) * cdiv(n, 128), cdiv(k_sum, BLOCK_K * groups), num_sms)


#: The k-grouped BF16 designs (the BF16 ws kernel's k-grouped form, ``ops/gluon/grouped.py``): the dense BF16 tiles
#: at most 128 wide, by the same costs, the 128-row ones with each MMA warpgroup a partition of its own (``_wg2``):
#: on the 6 set rows 1.013x, 1.001x and 0.999x the lockstep design in three runs (within noise), outputs bitwise the
#: same (H200, benchmarks/results/grouped-bf16-h200/k_grouped_wg2_h200.json).
K_GROUPED_BF16_WS_TILES = tuple(
    (design + "_wg2" if rows == BLOCK_M else design, rows, cols, cost)
    for design, rows, cols, cost in DENSE_BF16_WS_TILES
    if cols <= 128
)


def k_grouped_bf16_ws_design(groups: int, m: int, n: int, num_sms: int) -> str:
    """The BF16 ws kernel's design (a ``bf16_gemm_ws.VARIANTS`` name) for a k-grouped call into fp32 [G, M, N] on
    ``num_sms`` SMs: the cheapest tiling (:func:`cheapest_tiling`) of :data:`K_GROUPED_BF16_WS_TILES` over the
    [G * M, N] output (M a multiple of 128: no tile crosses a group)."""
    return cheapest_tiling(groups * m, n, num_sms, K_GROUPED_BF16_WS_TILES)[0]


def prefers_k_grouped_bf16(groups: int, m: int, n: int, ks: list[int], num_sms: int) -> bool:
    """True when the gluon backend is the automatic choice for a k-grouped BF16 GEMM into fp32 [G, M, N] with
    per-group K ``ks``: the kernel's conditions (M a multiple of 128, every group's K of :data:`BF16_BLOCK_K`) and
    enough 128x128 tiles and 128-deep steps for the SMs, as the k-grouped FP8 calls (:func:`prefers_k_grouped_fp8`)."""
    return not any(k % BF16_BLOCK_K for k in ks) and prefers_k_grouped_fp8(groups, m, n, sum(ks), num_sms)


def _gluon_may_run(d: torch.Tensor) -> bool:
    """Whether a call writing ``d`` may go to gluon at all: on a CUDA device where the backend runs, bf16 or fp32
    output, TMA-aligned."""
    if not d.is_cuda or selector.gluon_unavailable_reason() is not None:
        return False
    return d.dtype in (torch.bfloat16, torch.float32) and operands.tma_ready(d)


@register_rule("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous")
def m_grouped_fp8_rule(arguments: dict[str, Any]) -> str | None:
    """The automatic choice's rule for the m-grouped contiguous FP8 GEMMs (``arguments``: the logical ``nt`` form the
    check derived): ``gluon`` on Hopper for the ``m_indices`` layout with K-major weights where
    :func:`prefers_m_grouped_fp8` says so, else no claim."""
    if arguments["use_psum_layout"] or not _gluon_may_run(arguments["d"]):
        return None
    (a_data, _), (b_data, sb) = arguments["a"], arguments["b"]
    if b_data.stride(-1) != 1 or sb.shape[-2] != cdiv(b_data.shape[-2], 128):
        return None
    m_sum, k = a_data.shape
    return "gluon" if prefers_m_grouped_fp8(m_sum, b_data.shape[-2], k, config.get_num_sms()) else None


@register_rule("k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous")
def k_grouped_fp8_rule(arguments: dict[str, Any]) -> str | None:
    """The automatic choice's rule for the k-grouped FP8 GEMMs: ``gluon`` on Hopper where
    :func:`prefers_k_grouped_fp8` says so (contiguous fp32 output), else no claim."""
    d = arguments["d"]
    if not d.is_contiguous() or not _gluon_may_run(d):
        return None
    groups, m, n = d.shape
    k_sum = sum(arguments["ks_cpu"])
    return "gluon" if prefers_k_grouped_fp8(groups, m, n, k_sum, config.get_num_sms()) else None


@register_rule("k_grouped_bf16_gemm_tn_contiguous")
def k_grouped_bf16_rule(arguments: dict[str, Any]) -> str | None:
    """The automatic choice's rule for ``k_grouped_bf16_gemm_tn_contiguous``: ``gluon`` on Hopper where the BF16 ws
    kernel reads the MN-major operands in place (:func:`_read_in_place`), D is contiguous and
    :func:`prefers_k_grouped_bf16` says so, else no claim."""
    d, a, b = arguments["d"], arguments["a"], arguments["b"]
    if not d.is_contiguous() or not _gluon_may_run(d) or not _read_in_place(a, b):
        return None
    groups, m, n = d.shape
    return "gluon" if prefers_k_grouped_bf16(groups, m, n, arguments["ks_cpu"], config.get_num_sms()) else None


def moe_fp8_buffers_fit(tokens: int, top_k: int, experts: int, hidden: int, inter: int) -> bool:
    """Whether the gluon form's buffers (``[M, H]`` and ``[M, I]`` over the worst-case ``M`` rows of 128-row expert
    blocks) stay below 2**31 elements: its cuTile steps index them in int32."""
    rows = max_padded_rows(tokens, top_k, experts, BLOCK_M)
    return rows * max(hidden, inter) < 2**31


def prefers_fp8_moe_experts(tokens: int, top_k: int, experts: int, hidden: int, inter: int) -> bool:
    """True when the fused FP8 experts of ``tokens`` tokens routed ``top_k`` ways over ``experts`` experts (hidden
    size ``hidden``, intermediate ``inter``) run on the gluon form: :data:`MOE_FP8_MIN_ROWS_PER_EXPERT` and
    :func:`moe_fp8_buffers_fit`."""
    if experts <= 0 or tokens * top_k < MOE_FP8_MIN_ROWS_PER_EXPERT * experts:
        return False
    return moe_fp8_buffers_fit(tokens, top_k, experts, hidden, inter)


def moe_fp8_ws_designs(tokens: int, top_k: int, experts: int) -> tuple[str, str]:
    """The (gate/up, down) designs of the fused FP8 experts' gluon form for ``tokens`` tokens routed to ``top_k`` of
    ``experts`` experts: :data:`MOE_FP8_GATE_UP_WS_DESIGN` and :data:`M_GROUPED_FP8_WS_DESIGN` at every size. The
    64-row designs (``e_64x128_p``, ``e_64x128_ov2``: a 128-row block's padding half skipped) ran 1.06x slower at 16
    and 32 routed rows per expert (benchmarks/results/moe-fp8-gluon-h200/short_tiles_h200.json)."""
    return MOE_FP8_GATE_UP_WS_DESIGN, M_GROUPED_FP8_WS_DESIGN


@register_rule("fp8_moe_experts")
def fp8_moe_experts_rule(arguments: dict[str, Any]) -> str | None:
    """The automatic choice's rule for ``fp8_moe_experts``: ``gluon`` on Hopper (with cuTile, whose kernels run the
    routing, quantization and combine) where :func:`prefers_fp8_moe_experts` says so, else no claim."""
    hidden, topk_ids, w13 = arguments["hidden"], arguments["topk_ids"], arguments["w13"]
    if not hidden.is_cuda or selector.gluon_unavailable_reason() is not None:
        return None
    if selector.cutile_unavailable_reason() is not None:
        return None
    tokens, top_k = topk_ids.shape
    experts, two_inter, hidden_dim = w13[0].shape
    return "gluon" if prefers_fp8_moe_experts(tokens, top_k, experts, hidden_dim, two_inter // 2) else None
