"""The split tail of a persistent GEMM kernel: the last, short round of output tiles split along K over the CTAs
that round would leave idle.

A persistent grid of ``ctas`` CTAs (at most one per SM) walks its work as CTA ``i`` takes jobs ``i, i + ctas,
...``. With ``tiles = q * ctas + r`` and a small ``r``, the last round keeps ``r`` SMs busy for a whole tile's K
loop. Instead, the tiles of the whole rounds stay one job each, and each of the ``r`` tail tiles becomes ``SPLITS``
jobs (runs), each over its share of the K blocks: split ``s`` of ``nk`` blocks runs blocks ``[s * nk // SPLITS,
(s + 1) * nk // SPLITS)``. The jobs are numbered ``0 .. full - 1`` for the whole tiles (``full = q * ctas``), then
``full + t * SPLITS + s`` for split ``s`` of tail tile ``t``.

The tail is split only when its runs fit in one round (``r * SPLITS <= ctas``), so that every run is the last job
of its CTA and the runs of a tile run side by side. Else (and when ``r`` is 0) nothing is split and the jobs are the
tiles. The host decides whether a split pays (it launches a design whose constexpr ``SPLITS`` exceeds 1); the
kernel only applies this rule, which the host mirrors (:func:`tail_tiles`, :func:`job_count`) to size the grid and
the buffers. The device helpers take ``SPLITS`` 2, 4, 8 or 16 (a kernel of ``SPLITS`` 1 does not call them).

Each run stores its fp32 partial tile to a workspace slot and arrives on the tile's counter; the run that arrives
last sums the partials in split order (so reruns are bitwise identical) and stores the tile to D as an unsplit
tile is stored, then resets the counter for the next launch (:func:`split_fixup`). No run waits for another.
Buffers (:class:`TailBuffers`): fp32 ``[tail tiles, SPLITS, TILE_M, TILE_N]`` and int32 ``[tail tiles]``
(arrivals), zeroed once. Launches on one stream run one after another, so they share one set; launches on two
streams may run at once, so a plan keeps a set per stream (:class:`StreamTails`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from tilegemm.ops.gluon.tiles import cta_barrier, store_tile

__all__ = [
    "StreamTails", "TailBuffers", "job_count", "job_walk", "plan_sms", "split_fixup", "split_grid", "tail_buffers",
    "tail_splits", "tail_tiles",
]  # fmt: skip


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
def job_walk(num_tiles, num_ctas, SPLITS: gl.constexpr):
    """(jobs, the split tail's first tile) of a CTA walk over ``num_tiles`` tiles with ``num_ctas`` CTAs: the tiles
    themselves (the tail starting past the last), or with ``SPLITS`` > 1 the split tail's jobs (:func:`num_jobs`,
    :func:`tail_start`)."""
    if SPLITS > 1:
        return num_jobs(num_tiles, num_ctas, SPLITS), tail_start(num_tiles, num_ctas, SPLITS)
    else:
        return num_tiles, num_tiles


@gluon.jit
def runs_alike(num_tiles, full):
    """Whether every tile of a walk over ``num_tiles`` tiles whose split tail starts at tile ``full`` runs the same
    way: none split or every one split, so that two tiles holding the same output rows compute the same bits for
    them (:func:`tiles.tile_row`)."""
    return (full == 0) | (full >= num_tiles)


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
def _rows_layout(width, num_warps):
    """A row-major layout of rows ``width`` wide over ``num_warps`` warps, 16 bytes of fp32 a thread."""
    lanes_n = min(32, width // 4)
    return gl.BlockedLayout([1, 4], [32 // lanes_n, lanes_n], [num_warps, 1], [1, 0])


@gluon.jit
def split_fixup(acc, work_ptr, counter_ptr, slot, split, d_desc, out, row, col, SPLITS: gl.constexpr):
    """The end of split ``split`` of tail tile ``slot`` (its index in the tail), whose fp32 partial is ``acc``
    [TILE_M, TILE_N] (any distributed layout) and whose place in D is (``row``, ``col``).

    Every run stores ``acc`` to the workspace slot ``work_ptr[slot, split]`` (fp32 [tail, SPLITS, TILE_M,
    TILE_N]) and arrives on the tile's counter ``counter_ptr[slot]`` (a CTA barrier, then one acq_rel atomic: every
    thread's stores happen before it). The run that arrives last reads the partials back (a CTA barrier after the
    atomic, so all its threads see the others' stores), sums them in split order, so reruns are bitwise identical
    whichever run is last, stores the tile to D as an unsplit tile is stored (:func:`tiles.store_tile` through
    ``out``), and resets the counter to 0 for the next launch. No run waits for another: a tile's runs need not be
    resident at once, and the kernel may share the GPU with any other work."""
    TILE_M: gl.constexpr = acc.shape[0]
    TILE_N: gl.constexpr = acc.shape[1]
    TILE: gl.constexpr = TILE_M * TILE_N
    acc_l: gl.constexpr = acc.type.layout
    work = work_ptr + slot.to(gl.int64) * (SPLITS * TILE)
    r = gl.arange(0, TILE_M, layout=gl.SliceLayout(1, acc_l))
    c = gl.arange(0, TILE_N, layout=gl.SliceLayout(0, acc_l))
    gl.store(work + split * TILE + (r[:, None] * TILE_N + c[None, :]), acc)
    cta_barrier()
    arrival = counter_ptr + slot
    if gl.atomic_add(arrival, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
        cta_barrier()
        rows_l: gl.constexpr = _rows_layout(TILE_N, gl.num_warps())
        rr = gl.arange(0, TILE_M, layout=gl.SliceLayout(1, rows_l))
        rc = gl.arange(0, TILE_N, layout=gl.SliceLayout(0, rows_l))
        part = work + (rr[:, None] * TILE_N + rc[None, :])
        total = gl.load(part)
        for s in gl.static_range(1, SPLITS):
            total = total + gl.load(part + s * TILE)
        store_tile(total, d_desc, out, row, col)
        gl.atomic_xchg(arrival, 0, sem="relaxed", scope="gpu")


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


def plan_sms(num_sms: int | None, device: torch.device) -> int:
    """The SMs a plan's persistent grid spreads over: ``num_sms``, or where ``None`` the device's count."""
    if num_sms is not None:
        return num_sms
    return torch.cuda.get_device_properties(device).multi_processor_count


class TailBuffers(NamedTuple):
    """What the split tail of a plan's launches writes: ``workspace`` fp32 [tail tiles * SPLITS * TILE_M * TILE_N]
    (the partial tiles) and ``counters`` int32 [tail tiles] (each tile's arrivals, zero between launches)."""

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
    return TailBuffers(workspace, torch.zeros(tail, dtype=torch.int32, device=device))


class StreamTails:
    """A split plan's :class:`TailBuffers`, one set per stream: ``tails(stream)`` gives the set of a launch on
    ``stream`` (``None``: the current stream of the plan's device).

    A set's counters must be zero when a launch starts and each launch leaves them so; launches on one stream are
    ordered, so they share one set, made (zeroed on that stream) at its first launch. Launches on two streams may
    overlap: each has its own set. A launch captured into a CUDA graph gets a fresh set, allocated in the capture
    (the graph's pool) and zeroed by a node of the graph before the kernel, so every replay starts clean, replays of
    two graphs may overlap, and nothing made outside the capture is read by it. An unsplit plan (no tail tiles) has
    one placeholder set, which the kernel never reads."""

    def __init__(self, tiles: int, ctas: int, splits: int, tile_m: int, tile_n: int, device: torch.device):
        self.shape = (tiles, ctas, splits, tile_m, tile_n)
        self.device = device
        self.split = tail_tiles(tiles, ctas, splits) > 0
        self.by_stream: dict[int | None, TailBuffers] = {}
        self.placeholder = None if self.split else tail_buffers(*self.shape, device)

    def __call__(self, stream: torch.cuda.Stream | None = None) -> TailBuffers:
        if not self.split:
            return self.placeholder
        if self.device.type != "cuda":  # plans recorded on a CPU: one set
            return self._kept(None)
        if stream is None:
            return self._on(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            return self._on(stream)

    def _on(self, stream: torch.cuda.Stream) -> TailBuffers:
        """The set of a launch on ``stream``, the current stream."""
        if torch.cuda.is_current_stream_capturing():
            return tail_buffers(*self.shape, self.device)
        return self._kept(stream.cuda_stream)

    def _kept(self, key: int | None) -> TailBuffers:
        """The set kept for the stream of handle ``key``, made (on the current stream) at its first launch."""
        buffers = self.by_stream.get(key)
        if buffers is None:
            buffers = self.by_stream[key] = tail_buffers(*self.shape, self.device)
        return buffers
