"""tilegemm.ops.cutile.concurrent: cuTile compiles on several threads run tileiras at once, give the cubins of a
serial compile, run each distinct compile once, and leave cuTile as it was (CPU: ``tileiras`` runs on the host)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ct = pytest.importorskip("cuda.tile")

from cuda.tile import _compile  # noqa: E402

from compile_gate import test_compile_moe  # noqa: E402
from tilegemm.ops.cutile import aot, moe  # noqa: E402
from tilegemm.ops.cutile.concurrent import concurrent_tileiras  # noqa: E402


@pytest.fixture
def no_disk_cache(monkeypatch):
    """cuTile's disk cache off (its directory is read once, at import), so every compile runs tileiras."""
    from cuda.tile._cext import default_tile_context

    monkeypatch.setattr(default_tile_context.config, "cache_dir", None)


def _jobs(count: int) -> list:
    return [(moe.get_kernel(name, *hints), params) for _, name, hints, params in test_compile_moe._variants()[:count]]


def test_threads_give_the_serial_cubins_each_compiled_once(no_disk_cache):
    jobs = _jobs(3)
    serial = [aot.compile_cubin(kernel, params, "sm_90") for kernel, params in jobs]
    original = _compile.compile_cubin
    with concurrent_tileiras(3) as stats:
        with ThreadPoolExecutor(6) as pool:
            cubins = list(pool.map(lambda job: aot.compile_cubin(job[0], job[1], "sm_90"), jobs * 2))
    assert cubins == serial * 2
    assert stats.runs == 3 and stats.shared == 3, "each distinct compile runs tileiras once"
    assert 1 <= stats.peak <= 3
    assert _compile.compile_cubin is original, "cuTile's compile_cubin is restored"


def test_tileiras_runs_overlap_and_the_limit_holds(no_disk_cache, monkeypatch):
    """A stand-in tileiras that sleeps: three threads overlap their runs with limit 3 (the front ends still take
    cuTile's lock one at a time), one at a time with limit 1."""
    original = _compile.compile_cubin

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return original(*args, **kwargs)

    monkeypatch.setattr(_compile, "compile_cubin", slow)
    jobs = _jobs(3)
    for limit, peak in ((3, 3), (1, 1)):
        barrier = threading.Barrier(3)

        def compile_one(job, barrier=barrier):
            barrier.wait()
            return aot.compile_cubin(job[0], job[1], "sm_90")

        with concurrent_tileiras(limit) as stats:
            with ThreadPoolExecutor(3) as pool:
                list(pool.map(compile_one, jobs))
        assert (stats.runs, stats.peak) == (3, peak)
        assert _compile.compile_cubin is slow


def test_nested_blocks_share_one_state_and_errors(no_disk_cache):
    original = _compile.compile_cubin
    with concurrent_tileiras(2) as outer, concurrent_tileiras(5) as inner:
        assert inner is outer
        assert _compile.compile_cubin is not original
    assert _compile.compile_cubin is original
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="^limit: got"):
            with concurrent_tileiras(bad):
                pass
