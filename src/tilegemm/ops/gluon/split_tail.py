"""The split tail of a persistent GEMM kernel: the last, short round of output tiles split along K over the CTAs
that round would leave idle.

A persistent grid of ``ctas`` CTAs (at most one per SM, all resident at once) walks its work as CTA ``i`` takes
jobs ``i, i + ctas, ...``. With ``tiles = q * ctas + r`` and a small ``r``, the last round keeps ``r`` SMs busy for
a whole tile's K loop. Instead, the tiles of the whole rounds stay one job each, and each of the ``r`` tail tiles
becomes ``SPLITS`` jobs (runs), each over its share of the K blocks: split ``s`` of ``nk`` blocks runs blocks
``[s * nk // SPLITS, (s + 1) * nk // SPLITS)``. The jobs are numbered ``0 .. full - 1`` for the whole tiles
(``full = q * ctas``), then ``full + t * SPLITS + s`` for split ``s`` of tail tile ``t``.

The tail is split only when its runs fit in one round (``r * SPLITS <= ctas``): then every run is the LAST job of
its CTA, so the runs of one tile are all resident together and may wait for each other (:func:`split_store`). Else
(and when ``r`` is 0) nothing is split and the jobs are the tiles. The host decides whether a split pays (it
launches a design whose constexpr ``SPLITS`` exceeds 1); the kernel only applies this rule, which the host mirrors
(:func:`tail_tiles`, :func:`job_count`) to size the grid and the buffers. The device helpers take ``SPLITS`` 2, 4, 8
or 16 (a kernel of ``SPLITS`` 1 does not call them).

Each run stores its fp32 partial tile to a workspace slot, arrives on the tile's counter, waits for all
``SPLITS`` runs, then sums its ``1/SPLITS`` share of the tile's rows over the partials in split order (so reruns are
bitwise identical) and stores them to D. The last run to leave resets the tile's counters for the next launch.
Buffers (:class:`TailBuffers`): fp32 ``[tail tiles, SPLITS, TILE_M, TILE_N]`` and int32 ``[tail tiles, 2]``
(arrivals, departures), zeroed once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["TailBuffers", "job_count", "resident_sms", "split_grid", "tail_buffers", "tail_splits", "tail_tiles"]


@gluon.jit
def tail_start(num_tiles, num_ctas, SPLITS: gl.constexpr):
    """The first tile of the split tail on a grid of ``num_ctas`` CTAs: ``num_tiles`` when nothing is split (the
    last round is full, or its ``SPLITS`` runs a tile would not fit in one round), else the tiles of the whole
    rounds."""
    full = num_tiles // num_ctas * num_ctas
    fits = ((num_tiles - full) * SPLITS <= num_ctas).to(gl.int32)
    return full + (num_tiles - full) * (1 - fits)


@gluon.jit
def num_jobs(num_tiles, num_ctas, SPLITS: gl.constexpr):
    """The jobs of a grid of ``num_ctas`` CTAs: one per tile of the whole rounds, ``SPLITS`` per tail tile
    (:func:`tail_start`)."""
    full = tail_start(num_tiles, num_ctas, SPLITS)
    return full + (num_tiles - full) * SPLITS


@gluon.jit
def split_job(job, full, num_k, SPLITS: gl.constexpr):
    """(tile, split, first K block, K blocks) of ``job``, the tail starting at tile ``full`` (:func:`tail_start`)
    of ``num_k`` K blocks a tile: a job before ``full`` is its whole tile (split 0, every K block); job
    ``full + t * SPLITS + s`` is split ``s`` of tile ``full + t``, K blocks ``[s * num_k // SPLITS,
    (s + 1) * num_k // SPLITS)``."""
    rel = gl.maximum(job - full, 0)
    split = rel % SPLITS
    parts = 1 + (SPLITS - 1) * (job >= full).to(gl.int32)
    kb0 = split * num_k // parts
    return gl.minimum(job, full) + rel // SPLITS, split, kb0, (split + 1) * num_k // parts - kb0


@gluon.constexpr_function
def _share_layout(width, num_warps):
    """A row-major layout of rows ``width`` wide over ``num_warps`` warps, 16 bytes of fp32 a thread."""
    lanes_n = min(32, width // 4)
    return gl.BlockedLayout([1, 4], [32 // lanes_n, lanes_n], [num_warps, 1], [1, 0])


@gluon.jit
def split_store(acc, d_ptr, d_stride, work_ptr, counter_ptr, slot, split, row, col, M, N, SPLITS: gl.constexpr):
    """The epilogue of split ``split`` of tail tile ``slot`` (its index in the tail), whose fp32 partial is ``acc``
    [TILE_M, TILE_N] (any distributed layout) and whose place in D is (``row``, ``col``).

    Stores ``acc`` to the workspace slot ``work_ptr[slot, split]`` (fp32 [tail, SPLITS, TILE_M, TILE_N]), arrives
    on the tile's counter ``counter_ptr[2 * slot]`` (a CTA barrier, then one release atomic: every thread's stores
    happen before it), waits until all ``SPLITS`` runs arrived (one acquire atomic, then a CTA barrier), sums rows
    ``[split, split + 1) * TILE_M / SPLITS`` of the tile over the ``SPLITS`` partials in split order (the loads
    unrolled, all in flight) and stores them in D's dtype to ``d_ptr`` (row-major, row pitch ``d_stride``,
    clipped at ``M`` and ``N``). Then it leaves on ``counter_ptr[2 * slot + 1]``; the last run to leave resets
    both counters to 0 for the next launch (every run has passed its wait by then)."""
    TILE_M: gl.constexpr = acc.shape[0]
    TILE_N: gl.constexpr = acc.shape[1]
    SHARE: gl.constexpr = TILE_M // SPLITS
    TILE: gl.constexpr = TILE_M * TILE_N
    gl.static_assert(SHARE >= 1, "SPLITS at most the tile's rows")
    acc_l: gl.constexpr = acc.type.layout
    work = work_ptr + slot.to(gl.int64) * (SPLITS * TILE)
    r = gl.arange(0, TILE_M, layout=gl.SliceLayout(1, acc_l))
    c = gl.arange(0, TILE_N, layout=gl.SliceLayout(0, acc_l))
    gl.store(work + split * TILE + (r[:, None] * TILE_N + c[None, :]), acc)
    gl.thread_barrier()
    arrival = counter_ptr + 2 * slot
    gl.atomic_add(arrival, 1, sem="release", scope="gpu")
    while gl.atomic_add(arrival, 0, sem="acquire", scope="gpu") < SPLITS:
        pass
    gl.thread_barrier()
    share_l: gl.constexpr = _share_layout(TILE_N, gl.num_warps())
    sr = split * SHARE + gl.arange(0, SHARE, layout=gl.SliceLayout(1, share_l))
    sc = gl.arange(0, TILE_N, layout=gl.SliceLayout(0, share_l))
    share = work + (sr[:, None] * TILE_N + sc[None, :])
    total = gl.load(share)
    for s in gl.static_range(1, SPLITS):
        total = total + gl.load(share + s * TILE)
    rows = row + sr
    cols = col + sc
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    out = d_ptr + (rows.to(gl.int64)[:, None] * d_stride + cols[None, :])
    gl.store(out, total.to(d_ptr.dtype.element_ty), mask=mask)
    departure = arrival + 1
    if gl.atomic_add(departure, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
        gl.atomic_xchg(arrival, 0, sem="relaxed", scope="gpu")
        gl.atomic_xchg(departure, 0, sem="relaxed", scope="gpu")


def tail_splits(tiles: int, ctas: int, max_splits: int) -> int:
    """The runs each tile of the last round can be split into on ``ctas`` CTAs: the CTAs per tail tile, rounded
    down to a power of two, at most ``max_splits``; 1 when the last round is full. A kernel of constexpr ``SPLITS``
    splits its tail exactly when this is ``SPLITS`` with ``max_splits = SPLITS``."""
    tail = tiles % ctas if ctas > 0 else 0
    if tail == 0 or max_splits <= 1:
        return 1
    per_tile = min(ctas // tail, max_splits)
    return 1 << (per_tile.bit_length() - 1) if per_tile > 0 else 1


def tail_tiles(tiles: int, ctas: int, splits: int) -> int:
    """The tiles a kernel of constexpr ``SPLITS`` = ``splits`` splits on ``ctas`` CTAs (the device rule,
    :func:`tail_start`): the last round's, when it is short and its runs fit in one round; else 0."""
    if splits <= 1 or ctas <= 0 or tail_splits(tiles, ctas, splits) != splits:
        return 0
    return tiles % ctas


def job_count(tiles: int, ctas: int, splits: int) -> int:
    """The jobs of ``tiles`` output tiles on ``ctas`` CTAs (the device rule, :func:`num_jobs`)."""
    return tiles + tail_tiles(tiles, ctas, splits) * (splits - 1)


def split_grid(tiles: int, sms: int, splits: int) -> int:
    """The persistent grid of ``tiles`` output tiles on ``sms`` SMs: one CTA per job, at most one per SM (at least
    one CTA). The kernel, seeing this grid, makes the same jobs: with fewer jobs than SMs every job (each run of a
    split tile included) gets its own CTA."""
    return max(1, min(job_count(tiles, max(sms, 1), splits), sms))


def resident_sms(num_sms: int | None, splits: int, device: torch.device) -> int:
    """The SMs a plan's persistent grid may use: ``num_sms`` (``None``: the device's count), for a split design
    (``splits`` > 1) at most the device's count, since its runs wait for each other and every CTA must be resident
    (one per SM) at once."""
    if num_sms is not None and (splits <= 1 or device.type != "cuda"):
        return num_sms
    count = torch.cuda.get_device_properties(device).multi_processor_count
    return count if num_sms is None else min(num_sms, count)


class TailBuffers(NamedTuple):
    """What the split tail of a plan's launches writes: ``workspace`` fp32 [tail tiles * SPLITS * TILE_M * TILE_N]
    (the partial tiles) and ``counters`` int32 [2 * tail tiles] (each tile's arrivals and departures, zero between
    launches)."""

    workspace: torch.Tensor
    counters: torch.Tensor


def tail_buffers(tiles: int, ctas: int, splits: int, tile_m: int, tile_n: int, device: torch.device) -> TailBuffers:
    """The buffers of a plan that launches ``tiles`` output tiles of ``tile_m`` x ``tile_n`` on a grid of ``ctas``
    CTAs with constexpr ``SPLITS`` = ``splits``, the counters zeroed; when nothing is split (the kernel then reads
    neither), one uninitialized element each."""
    tail = tail_tiles(tiles, ctas, splits)
    if tail == 0:
        return TailBuffers(
            torch.empty(1, dtype=torch.float32, device=device), torch.empty(2, dtype=torch.int32, device=device)
        )
    workspace = torch.empty(tail * splits * tile_m * tile_n, dtype=torch.float32, device=device)
    return TailBuffers(workspace, torch.zeros(2 * tail, dtype=torch.int32, device=device))
