"""The split tail's arithmetic (``ops/gluon/split_tail.py``) on the CPU: the device helpers' own code run on torch
integer tensors (their ``gl`` calls mapped to torch's), against the host mirrors that size the grid and buffers.

What must hold for every grid: the jobs cover each (tile, K block) exactly once; a tile's runs are consecutive jobs
over shares of its K blocks as even as possible; when the tail is split, each run is the last job of its CTA and no
CTA holds two (the runs of a tile wait for each other, so they must all be resident and never queued behind one
another); the host's job count and grid match what the kernel computes on that grid.
"""

from __future__ import annotations

import types

import pytest
import torch

split_tail = pytest.importorskip("tilegemm.ops.gluon.split_tail")

#: ``gl`` as the helpers' arithmetic needs it, on torch tensors
_GL = types.SimpleNamespace(
    maximum=lambda x, y: torch.maximum(torch.as_tensor(x), torch.as_tensor(y)),
    minimum=lambda x, y: torch.minimum(torch.as_tensor(x), torch.as_tensor(y)),
    int32=torch.int32,
)


def _on_cpu(name: str):
    """The device helper ``name`` as a plain function of torch integer tensors (helpers it calls likewise)."""
    fn = getattr(split_tail, name).fn
    names = {"gl": _GL, **{h: _on_cpu(h) for h in ("tail_start",) if h in fn.__code__.co_names}}
    return types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__)


tail_start, num_jobs, split_job = _on_cpu("tail_start"), _on_cpu("num_jobs"), _on_cpu("split_job")
GRIDS = [(tiles, sms) for sms in (1, 3, 16, 132) for tiles in range(1, 3 * sms + 20)]


def _jobs(tiles: int, ctas: int, num_k: int, splits: int):
    """(tile, split, first K block, K blocks) of every job of a grid of ``ctas`` CTAs, as the kernel computes them."""
    t, c = torch.tensor(tiles), torch.tensor(ctas)
    full = tail_start(t, c, splits)
    jobs = int(num_jobs(t, c, splits))
    out = split_job(torch.arange(jobs), full, torch.tensor(num_k), splits)
    return int(full), [tuple(int(x) for x in row) for row in zip(*out)]


@pytest.mark.parametrize("splits", [2, 4, 16])
def test_kernel_job_count_is_the_hosts(splits):
    for tiles, ctas in GRIDS:
        t, c = torch.tensor(tiles), torch.tensor(ctas)
        assert int(num_jobs(t, c, splits)) == split_tail.job_count(tiles, ctas, splits), (tiles, ctas)
        tail = split_tail.tail_tiles(tiles, ctas, splits)
        assert int(tail_start(t, c, splits)) == tiles - tail
        assert tail == 0 or (tiles % ctas == tail and tail * splits <= ctas)


@pytest.mark.parametrize("num_k", [1, 2, 3, 10, 56])
@pytest.mark.parametrize("splits", [2, 4, 16])
def test_jobs_cover_every_k_block_once(splits, num_k):
    for tiles, ctas in GRIDS[::7]:
        full, jobs = _jobs(tiles, ctas, num_k, splits)
        seen = [0] * (tiles * num_k)
        for job, (tile, split, kb0, count) in enumerate(jobs):
            if job < full:
                assert (tile, split, kb0, count) == (job, 0, 0, num_k)
            else:
                assert (tile, split) == (full + (job - full) // splits, (job - full) % splits)
                assert (kb0, count) == (split * num_k // splits, (split + 1) * num_k // splits - kb0)
                assert num_k // splits <= count <= -(-num_k // splits)
            for kb in range(kb0, kb0 + count):
                seen[tile * num_k + kb] += 1
        assert seen == [1] * (tiles * num_k), (tiles, ctas)


@pytest.mark.parametrize("splits", [2, 4, 8, 16])
def test_split_runs_are_last_jobs_of_distinct_ctas(splits):
    """On the grid the host launches (:func:`split_tail.split_grid`), every run of the tail is its CTA's last job
    and no CTA runs two; the grid never exceeds the SMs and the kernel makes the jobs the host counted."""
    for tiles, sms in GRIDS:
        grid = split_tail.split_grid(tiles, sms, splits)
        assert 1 <= grid <= sms
        full, jobs = _jobs(tiles, grid, 8, splits)
        assert len(jobs) == split_tail.job_count(tiles, sms, splits) == split_tail.job_count(tiles, grid, splits)
        runs = [job for job in range(full, len(jobs))]
        assert all(job + grid >= len(jobs) for job in runs), "a run that is not its CTA's last job"
        assert len({job % grid for job in runs}) == len(runs), "a CTA with two runs"


def test_tail_splits_and_tiles():
    """The runs a tail tile can take: CTAs per tail tile rounded down to a power of two, at most the cap."""
    assert split_tail.tail_splits(272, 132, 4) == 4  # 2048x2112 in 128x128 tiles: 8 tail tiles, 16 CTAs each
    assert split_tail.tail_splits(136, 132, 16) == 16  # 4 tail tiles, 33 CTAs each
    assert split_tail.tail_splits(132 + 40, 132, 16) == 2  # 40 tail tiles, 3 CTAs each
    assert split_tail.tail_splits(264, 132, 4) == split_tail.tail_splits(272, 132, 1) == 1  # full round; no split
    assert split_tail.tail_tiles(272, 132, 4) == 8 and split_tail.job_count(272, 132, 4) == 264 + 32
    assert split_tail.tail_tiles(132 + 40, 132, 4) == 0  # 4 runs of 40 tiles do not fit in one round
    assert split_tail.split_grid(3, 132, 4) == 12 and split_tail.tail_tiles(3, 12, 4) == 3  # every tile split


def test_tail_buffers():
    cpu = torch.device("cpu")
    tail = split_tail.tail_buffers(272, 132, 4, 128, 128, cpu)
    assert tail.workspace.dtype == torch.float32 and tail.workspace.numel() == 8 * 4 * 128 * 128
    assert tail.counters.dtype == torch.int32 and torch.equal(tail.counters, torch.zeros(8, dtype=torch.int32))
    unsplit = split_tail.tail_buffers(264, 132, 4, 128, 128, cpu)
    assert unsplit.workspace.numel() == 1 and unsplit.counters.numel() == 2
    assert split_tail.plan_sms(7, cpu) == 7 and split_tail.plan_sms(200, cpu) == 200


def test_stream_tails_on_a_cpu():
    """A split plan recorded on a CPU keeps one set of buffers, made at its first launch and given to every later
    one; an unsplit plan's placeholder set is the same object every launch."""
    cpu = torch.device("cpu")
    tails = split_tail.StreamTails(272, 132, 4, 128, 128, cpu)
    assert tails.split and not tails.by_stream
    first = tails()
    assert first.counters.numel() == 8 and tails() is first and list(tails.by_stream) == [None]
    unsplit = split_tail.StreamTails(264, 132, 4, 128, 128, cpu)
    assert not unsplit.split and unsplit() is unsplit() and not unsplit.by_stream


def test_split_designs_refuse_what_they_do_not_split():
    """The FP8 split designs run dense calls only (m-grouped, k-grouped and gated configs are refused before any
    launch); a BF16 split design takes 64- and 128-wide tiles only."""
    ws = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")
    bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
    split = [cfg for cfg in ws.VARIANTS.values() if cfg.splits > 1]
    assert split
    for cfg in split:
        assert ws.ws_config(ws.Problem(256, 256, 256, torch.bfloat16), cfg).splits == cfg.splits
        for grouping in (ws.M_GROUPED, ws.K_GROUPED):  # a 64-row tile is refused k-grouped first for its rows
            with pytest.raises(ValueError, match="dense calls only|k-grouped call runs 128-row tiles"):
                ws.ws_config(ws.Problem(256, 256, 256, torch.float32, 2, grouping), cfg)
        with pytest.raises(ValueError):
            ws.ws_config(ws.Problem(256, 256, 256, torch.float8_e4m3fn, 2, ws.M_GROUPED, 1), cfg)
    with pytest.raises(ValueError, match="split tail runs persistent designs"):
        ws.ws_config(ws.Problem(256, 256, 256, torch.bfloat16), ws.VARIANTS["b_256x128"]._replace(splits=4))
    with pytest.raises(ValueError, match="64- and 128-wide"):
        bw.bf16_ws_config(bw.VARIANTS["bf16_128x256"]._replace(splits=4), torch.bfloat16)
