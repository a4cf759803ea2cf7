"""Tilings of an output over the SMs, costed in rounds: the cheapest of a kernel's tile designs
(:func:`cheapest_tiling`) and the split of a short last round along K (:class:`TailSplit`,
:func:`split_tail_rounds`). The gluon kernels' choices (:mod:`tilegemm.heuristics.gluon`) give the designs and
their costs."""

from __future__ import annotations

from typing import NamedTuple

from tilegemm.ops.operands import cdiv


class TailSplit(NamedTuple):
    """The split tail of a tiling (``ops/gluon/split_tail.py``): a short last round of tiles, each split along K
    into ``splits`` runs over CTAs that round leaves idle. ``designs``: the split design of each unsplit one (the
    same tile); ``block_k``: the kernel's K block; ``fixed_k_blocks``: a split run's fixed cost (its partial stored,
    the last run's sum of the partials, the L2 bandwidth the extra runs contend for), in K blocks of a tile's time;
    ``splits``: the split designs' runs a tile (their constexpr ``SPLITS``); ``single_round``: the split of a single
    short round (no whole round before it) instead of a tail after whole rounds."""

    designs: dict[str, str]
    block_k: int
    fixed_k_blocks: int
    splits: int = 4
    single_round: bool = False


#: The split tail splits a last round of at most ``sms // SPLIT_TAIL_MAX_TAIL_SHARE`` tiles (26 on an H200): after
#: two whole rounds a tail of 25 128x128 tiles split 4 ways won (2056x2112x7168: BF16 1.08x, FP8 1.05x), after four
#: one of 33 did not (4104x2112x7168: BF16 1.01x, FP8 0.95x;
#: benchmarks/results/gluon/split_tail_longer_tails_h200.json), and a split of the 32 tiles of 256x4096, 4 ways with
#: no whole round before it, lost (0.94x).
SPLIT_TAIL_MAX_TAIL_SHARE = 5
#: ...after at least this many whole rounds (every measured row had two or more; one short round alone is what
#: cutile's split-K plans serve).
SPLIT_TAIL_MIN_ROUNDS = 1


def cheapest_tiling(
    m: int,
    n: int,
    num_sms: int,
    tiles: tuple[tuple[str, int, int, float], ...],
    k: int = 0,
    split: TailSplit | tuple[TailSplit, ...] = (),
) -> tuple[str, int]:
    """Of ``tiles`` ((design, tile rows, tile columns, a tile's relative time), by preference), the design whose
    rounds of tiles over ``num_sms`` SMs, ``ceil(tiles / SMs)``, each weighted by its tile's time, cost least (the
    first where they tie), and its number of output tiles.

    With ``split`` (one :class:`TailSplit` or several, and ``k``, the problem's K): a tail split refines the chosen
    tiling (its split design where :func:`split_tail_rounds` is below the unsplit rounds; it never changes the
    tile); then a single-round split of any tiling (``single_round``) is taken where it costs less than that."""
    num_sms = max(num_sms, 1)  # 0 where no GPU is seen (plans recorded on a CPU)
    splits = (split,) if isinstance(split, TailSplit) else split
    best: tuple[float, str, int] | None = None
    for design, rows, cols, cost in tiles:
        count = cdiv(m, rows) * cdiv(n, cols)
        rounds_time = cdiv(count, num_sms) * cost
        if best is None or rounds_time < best[0]:
            best = (rounds_time, design, count)
    time, design, count = best
    cost = next(c for d, _, _, c in tiles if d == design)
    for tail in (s for s in splits if not s.single_round and design in s.designs):
        rounds = split_tail_rounds(count, k, num_sms, tail)
        if rounds is not None and rounds * cost < time:
            time, design = rounds * cost, tail.designs[design]
    for single in (s for s in splits if s.single_round):
        for unsplit, rows, cols, cost in tiles:
            tiling = cdiv(m, rows) * cdiv(n, cols)
            rounds = split_tail_rounds(tiling, k, num_sms, single) if unsplit in single.designs else None
            if rounds is not None and rounds * cost < time:
                time, design, count = rounds * cost, single.designs[unsplit], tiling
    return design, count


def split_tail_rounds(tiles: int, k: int, num_sms: int, split: TailSplit) -> float | None:
    """The rounds (in a tile's time) of ``tiles`` output tiles of K ``k`` on ``num_sms`` SMs with the last round
    split (:class:`TailSplit`): the whole rounds, then a run's ``1 / splits`` of a tile plus its fixed cost
    (``fixed_k_blocks`` of the tile's ``ceil(k / block_k)`` K blocks); ``None`` where the split does not apply: no
    short last round, runs that would not fit in one round, or no K; a tail split also not after fewer than
    :data:`SPLIT_TAIL_MIN_ROUNDS` whole rounds or on a last round of more than ``num_sms //
    SPLIT_TAIL_MAX_TAIL_SHARE`` tiles; a single-round split only where there is no whole round."""
    full_rounds, tail = divmod(tiles, max(num_sms, 1))
    k_blocks = cdiv(k, split.block_k)
    if tail == 0 or tail * split.splits > num_sms or k_blocks == 0:
        return None
    if split.single_round and full_rounds > 0:
        return None
    if not split.single_round and (tail > num_sms // SPLIT_TAIL_MAX_TAIL_SHARE or full_rounds < SPLIT_TAIL_MIN_ROUNDS):
        return None
    return full_rounds + 1 / split.splits + split.fixed_k_blocks / k_blocks
