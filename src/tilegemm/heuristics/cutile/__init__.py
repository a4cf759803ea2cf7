"""Kernel config choice for the cutile backend: one problem description in, one config out.

A host path describes its call as a :class:`Problem` (family, dtype, M, N, K, groups, SMs; the layout
:class:`Kind` for grouped GEMMs; the ``TILEGEMM_*_VARIANT`` override read once, :func:`variant`) and
:func:`choose` returns the config from host sizes only: no device reads, no runtime search (a first call never
autotunes). Every config names the kernel family that runs it (``cfg.path``), so host code never asks a config's
type. One module per family, each a rule list whose reasons name the measurement (``docs/notes/heuristics.md``):

* ``dense`` (:mod:`.narrow`, :mod:`.decode`, :mod:`.dense`): at most ``DECODE_MAX_M`` rows take a decode kernel,
  the narrow-tile one (calls without ``c``) or else the swap-AB one where :func:`takes_decode`; others the
  persistent-tile kernel, split along K when its grid fills less than half the machine (:func:`split_plan`).
* ``grouped`` (:mod:`.grouped`): m-grouped (``m_indices``, psum, masked) and k-grouped tiles.
* ``moe``, ``moe_fp8``, ``moe_train`` (:mod:`.moe`): the fused experts' path (per slot, expert blocks, sorted
  tiles; the FP8 block or row form) and its tiles.
* MQA logits (:mod:`.mqa`), RMSNorm (:mod:`.norm`) and the BF16 einsum (:mod:`.einsum`) are chosen from their own
  sizes (heads and head size, row length, batch) by the functions those modules name.

``TILEGEMM_PRINT_CONFIGS=1`` makes :func:`print_once` print each choice once.
"""

from __future__ import annotations

from typing import Any

from tilegemm.heuristics.cutile.decode import (
    DECODE_BF16_UNSPLIT_OCCUPANCY,
    DECODE_CONFIGS,
    DECODE_DEEP_LATENCY,
    DECODE_FP8_BM32_MIN_K,
    DECODE_MAX_M,
    DECODE_MIN_BM,
    DECODE_NARROW_BM,
    DECODE_SPLIT_MIN_TILE_BYTES,
    DECODE_W64_K128,
    DECODE_W64_K256,
    DecodeConfig,
    DecodePlan,
    decode_config,
    decode_plan,
    takes_decode,
)
from tilegemm.heuristics.cutile.dense import (
    BF16_CONFIGS,
    FP8_CONFIGS,
    FP8_LARGE_K,
    FP8_SMALL_K,
    FP8_SMALL_M,
    SMALL_M,
    SPLIT_MIN_K,
    DenseConfig,
    SplitPlan,
    all_dense_configs,
    dense_tile_config,
    split_plan,
)
from tilegemm.heuristics.cutile.grouped import (
    GROUPED_BF16,
    GROUPED_BF16_BIG,
    GROUPED_BF16_K_WITH_C,
    GROUPED_BF16_SMALL_M,
    GROUPED_FP8,
    GROUPED_FP8_K,
    GROUPED_FP8_SMALL_M,
    all_grouped_configs,
    grouped_config,
)
from tilegemm.heuristics.cutile.moe import (
    MOE_BLOCKS_MAX_BT,
    MOE_BLOCKS_MIN_BT,
    MOE_COMBINE_BT,
    MOE_COMBINE_MAX_BN,
    MOE_DOWN_CONFIGS,
    MOE_FP8_TILE_CONFIG,
    MOE_FP8_TILE_MIN_ROWS,
    MOE_UP_CONFIGS,
    MoEBlocksConfig,
    MoEConfig,
    MoESlotsConfig,
    all_moe_configs,
    combine_bn,
    moe_blocks_config,
    moe_config,
    moe_fp8_config,
    moe_slots_config,
    moe_train_config,
)
from tilegemm.heuristics.cutile.mqa import (
    FP8_ROWS,
    FP8_ROWS_MAX_COLS,
    FP8_ROWS_MAX_HADAMARD,
    FP8_ROWS_TILE_ELEMS,
    MQA_DECODE_BK,
    MQA_DECODE_CTAS_PER_SM,
    MQA_DECODE_MAX_ROWS,
    MQA_DECODE_MIN_KEYS,
    MQA_DECODE_MIN_N,
    MQA_VARIANT_ENV,
    MQA_VARIANTS,
    PREPARE_MASK_MAX_ROWS,
    PREPARE_MASK_TILE_ELEMS,
    SCHEDULE_CHUNK,
    Fp8RowsConfig,
    MqaConfig,
    PagedMqaConfig,
    bf16_mqa_logits_config,
    decode_sized,
    fp8_rows_config,
    mqa_decode_config,
    mqa_logits_config,
    paged_decode_config,
    paged_mqa_config,
    plain_mqa_config,
    prepare_mask_tile,
    takes_mqa_decode,
)
from tilegemm.heuristics.cutile.narrow import (
    NARROW_BF16_M128_W128,
    NARROW_BF16_W32,
    NARROW_BF16_W32_DEEP,
    NARROW_CONFIGS,
    NARROW_FP8_W16,
    NARROW_FP8_W32,
    NARROW_FP8_W64_PAIR,
    NARROW_FP8_W128,
    NarrowConfig,
    narrow_config,
)
from tilegemm.heuristics.cutile.norm import (
    NORM_MAX_COLS,
    NORM_OCCUPANCY,
    NORM_TILE_ELEMS,
    NormConfig,
    rms_norm_config,
)
from tilegemm.heuristics.cutile.problem import (
    DECODE_VARIANT_ENV,
    MOE_VARIANT_ENV,
    MOE_VARIANTS,
    Kind,
    Problem,
    Rule,
    TileConfig,
    variant,
)
from tilegemm.heuristics.report import print_once


def _dense(p: Problem) -> Any:
    return narrow_config(p) or (decode_config(p.variant) if takes_decode(p) else dense_tile_config(p))


_FAMILIES = {
    "dense": _dense,
    "grouped": grouped_config,
    "moe": moe_config,
    "moe_fp8": moe_fp8_config,
    "moe_train": lambda p: moe_train_config(p.n),
}


def choose(p: Problem) -> Any:
    """The config of problem ``p``, by family: ``dense`` a :class:`NarrowConfig`, :class:`DecodeConfig` or
    :class:`DenseConfig`; ``grouped`` a :class:`TileConfig`; ``moe`` a :class:`MoESlotsConfig`,
    :class:`MoEBlocksConfig` or :class:`MoEConfig` (decode sizes, a few rows per expert, prefill); ``moe_fp8`` a
    :class:`MoEBlocksConfig` or :class:`MoEConfig`; ``moe_train`` a :class:`MoEConfig`. ``cfg.path`` names the
    kernel family."""
    rules = _FAMILIES.get(p.family)
    if rules is None:
        raise ValueError(f"Problem.family: got {p.family!r}, expected one of {sorted(_FAMILIES)}")
    return rules(p)


def problem(family: str, dtype: str, m: int, n: int, k: int, sms: int, **fields: Any) -> Problem:
    """A :class:`Problem` of ``family`` with the variant ``$TILEGEMM_*_VARIANT`` forces on it now (read once)."""
    return Problem(family, dtype, m, n, k, sms, variant=variant(family), **fields)


__all__ = [
    "BF16_CONFIGS", "DECODE_BF16_UNSPLIT_OCCUPANCY", "DECODE_CONFIGS", "DECODE_DEEP_LATENCY", "DECODE_FP8_BM32_MIN_K",
    "DECODE_MAX_M", "DECODE_MIN_BM", "DECODE_NARROW_BM", "DECODE_SPLIT_MIN_TILE_BYTES", "DECODE_VARIANT_ENV",
    "DECODE_W64_K128", "DECODE_W64_K256", "FP8_CONFIGS", "FP8_LARGE_K", "FP8_ROWS", "FP8_ROWS_MAX_COLS",
    "FP8_ROWS_MAX_HADAMARD", "FP8_ROWS_TILE_ELEMS", "Fp8RowsConfig", "fp8_rows_config", "SCHEDULE_CHUNK",
    "PREPARE_MASK_MAX_ROWS", "PREPARE_MASK_TILE_ELEMS", "prepare_mask_tile",
    "FP8_SMALL_K", "FP8_SMALL_M", "GROUPED_BF16",
    "GROUPED_BF16_BIG", "GROUPED_BF16_K_WITH_C", "GROUPED_BF16_SMALL_M", "GROUPED_FP8", "GROUPED_FP8_K",
    "GROUPED_FP8_SMALL_M", "MOE_BLOCKS_MAX_BT", "MOE_BLOCKS_MIN_BT", "MOE_COMBINE_BT", "MOE_COMBINE_MAX_BN",
    "MOE_DOWN_CONFIGS", "MOE_FP8_TILE_CONFIG", "MOE_FP8_TILE_MIN_ROWS", "MOE_UP_CONFIGS", "MOE_VARIANT_ENV",
    "MOE_VARIANTS", "MQA_DECODE_BK", "MQA_DECODE_CTAS_PER_SM", "MQA_DECODE_MAX_ROWS",
    "MQA_DECODE_MIN_KEYS", "MQA_DECODE_MIN_N", "MQA_VARIANT_ENV", "MQA_VARIANTS",
    "NARROW_BF16_M128_W128", "NARROW_BF16_W32", "NARROW_BF16_W32_DEEP", "NARROW_CONFIGS",
    "NARROW_FP8_W128", "NARROW_FP8_W16", "NARROW_FP8_W32", "NARROW_FP8_W64_PAIR", "NORM_MAX_COLS", "NORM_OCCUPANCY",
    "NORM_TILE_ELEMS", "SMALL_M", "SPLIT_MIN_K", "all_dense_configs", "all_grouped_configs", "all_moe_configs",
    "combine_bn",
    "bf16_mqa_logits_config", "choose", "decode_config", "decode_sized", "decode_plan", "DecodeConfig", "DecodePlan",
    "dense_tile_config", "DenseConfig", "grouped_config", "Kind", "moe_blocks_config", "moe_config", "moe_fp8_config",
    "moe_slots_config", "moe_train_config", "MoEBlocksConfig", "MoEConfig", "MoESlotsConfig", "mqa_decode_config",
    "mqa_logits_config", "MqaConfig", "narrow_config", "NarrowConfig", "NormConfig", "paged_decode_config",
    "paged_mqa_config", "PagedMqaConfig", "plain_mqa_config", "print_once", "Problem", "problem", "rms_norm_config",
    "Rule", "split_plan", "SplitPlan", "takes_decode", "takes_mqa_decode", "TileConfig", "variant",
]  # fmt: skip
