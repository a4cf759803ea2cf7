"""BF16 einsum (``ops/cutile/einsum.py``): the tiles of its two own kernels and the ``bmk,bnk->mn`` split along the
flattened K steps (the ``bhr,hdr->bhd`` expression runs the masked grouped GEMM, whose tiles ``grouped`` picks)."""

from __future__ import annotations

from tilegemm.heuristics.cutile.problem import TileConfig
from tilegemm.ops.common import cdiv

#: ``bmk,bnk->mn``: the dense BF16 tile (docs/kernels.md); with a ``c`` read in the kernel's epilogue, two
#: warpgroups (a 128x128 fp32 ``c`` tile beside the accumulator spills with one on sm_90 or sm_100).
BMK_CONFIG = TileConfig(128, 128, 64)
BMK_C_CONFIG = TileConfig(128, 128, 64, num_worker_warps=8)
#: ``bhd,hdr->bhr``: 128-row tiles (two warpgroups with a ``c``, as above), or 64 rows for a batch of at most
#: :data:`SMALL_BATCH`.
HEADS_CONFIG = TileConfig(128, 128, 64)
HEADS_C_CONFIG = TileConfig(128, 128, 64, num_worker_warps=8)
HEADS_SMALL_CONFIG = TileConfig(64, 128, 64)
SMALL_BATCH = 64
#: The split-K reduce kernel's tile: rows x columns of fp32 per CTA (64 x 128 spills with a C tile).
REDUCE_TILE = (32, 128)
#: At most this many splits; each gets at least :data:`MIN_SPLIT_STEPS` K steps.
MAX_SPLITS = 64
MIN_SPLIT_STEPS = 4
#: Split only outputs whose tiles fill less than this share of the CTA slots.
SPLIT_BELOW = 0.5


def bmk_config(has_c: bool) -> TileConfig:
    """The ``bmk,bnk->mn`` config; ``has_c``: the kernel itself adds ``c`` (whole tiles, no split)."""
    return BMK_C_CONFIG if has_c else BMK_CONFIG


def heads_config(batch: int, has_c: bool) -> TileConfig:
    """The ``bhd,hdr->bhr`` config for ``batch`` rows per head, with or without a ``c``."""
    if batch <= SMALL_BATCH:
        return HEADS_SMALL_CONFIG
    return HEADS_C_CONFIG if has_c else HEADS_CONFIG


def split_steps(tiles: int, steps: int, slots: int) -> tuple[int, int]:
    """``(splits, per)``: how ``steps`` K steps of each of ``tiles`` output tiles are cut for ``slots`` CTA slots.

    No split (``(1, steps)``) when the tiles fill at least :data:`SPLIT_BELOW` of the slots; otherwise enough
    splits to fill them, each of at least :data:`MIN_SPLIT_STEPS` steps, at most :data:`MAX_SPLITS`. ``per`` is
    the steps of each split (the last may have fewer), and no split is empty.
    """
    if tiles <= 0 or steps <= 0 or tiles >= SPLIT_BELOW * slots:
        return 1, max(steps, 0)
    splits = min(slots // tiles, steps // MIN_SPLIT_STEPS, MAX_SPLITS)
    if splits < 2:
        return 1, steps
    per = cdiv(steps, splits)
    return cdiv(steps, per), per
