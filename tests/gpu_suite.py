"""The whole GPU test suite in one run, and its record (``make test-gpu``).

Runs every test marked ``gpu`` on the CUDA machine in one pytest-xdist run, with workers sized to the GPU's free
memory and CPU cores (:func:`workers_for`; the cuTile compiles of first calls take the CPU), each worker's CPU
thread pools sized to its share of the cores (:func:`threads_per_worker`). Two xdist groups run one test after
another on a worker of their own while the others take the rest: ``gpu_serial`` (many GiB of operands each, or the
whole suite under compute-sanitizer) and ``gpu_memory`` (8-28 GiB each with their float64 references). Every test
report reaches a file as it arrives (tests/conftest.py, ``TILEGEMM_TEST_OUTCOMES``) and each failure is printed at
once, so a run stopped at its time budget (``--budget``, inside one device call) still records what ran. It then
writes ``benchmarks/results/gpu-tests/<date>-<tree>.json``: which ``src`` tree ran (:func:`git_tree_hash`, equal to
``git rev-parse HEAD:src`` for a clean checkout, computed from the files so that it holds on a machine without the
repository's ``.git``), the commit when known, date, GPU, torch, triton, cuda-tile, ``complete`` (the run ended
before its budget), passed, failed, errors, skipped, seconds, workers, threads per worker, the pytest arguments
added, what did not pass, and the slowest and most memory-hungry tests (``gpu_peak_bytes``). A run without cuTile
(the gluon tests under another triton: ``-k gluon``, a triton bundle in place of the cuTile one) is recorded as
``<date>-<tree>-triton<version>.json`` (:func:`record_name`).

Usage: ``python tests/gpu_suite.py [--workers N] [--budget S] [--record-dir DIR] [pytest arguments ...]``; exit
status 0 only for a complete run in which no test failed or errored. ``TILEGEMM_COMMIT`` names the commit where
``.git`` is absent or checked out at another commit.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "gpu-tests"
GIB_PER_WORKER = 16
"""GPU memory one pytest worker may take: its CUDA context, the cuTile/Triton modules it loads, and the operands of
the largest tests outside the ``gpu_serial`` and ``gpu_memory`` groups (under 8 GiB; the conftest hands cached blocks
back after each)."""
MAX_WORKERS = 8
CORES_PER_WORKER = 2
"""CPU cores one worker takes: its Python and the tileiras compiles its tests' first calls start."""
IGNORED_NAMES = {"__pycache__"}
IGNORED_SUFFIXES = (".pyc", ".egg-info")


def git_tree_hash(path: Path) -> str:
    """The git tree id of the files under ``path`` (as ``git rev-parse HEAD:<path>`` gives for a clean checkout),
    leaving out what the repository's ``.gitignore`` leaves out under ``src/`` (``__pycache__``, ``*.pyc``,
    ``*.egg-info``)."""
    entries = []
    for child in path.iterdir():
        if child.name in IGNORED_NAMES or child.name.endswith(IGNORED_SUFFIXES):
            continue
        if child.is_dir():
            mode, digest = b"40000", bytes.fromhex(git_tree_hash(child))
        else:
            data = child.read_bytes()
            mode = b"100755" if child.stat().st_mode & 0o111 else b"100644"
            digest = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
        # git orders a tree's entries by name, a directory's name as if it ended in "/"
        entries.append(
            (child.name + ("/" if child.is_dir() else ""), mode + b" " + child.name.encode() + b"\0" + digest)
        )
    body = b"".join(entry for _, entry in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def commit(tree: str) -> str | None:
    """The checked-out commit (``git rev-parse HEAD``) when its ``src`` tree is ``tree`` (the files that ran; a copy
    of the working tree can travel with another commit's ``.git``), else ``$TILEGEMM_COMMIT``, else ``None``."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    if git("rev-parse", "HEAD:src") == tree:
        return git("rev-parse", "HEAD")
    return os.environ.get("TILEGEMM_COMMIT") or None


def record_name(record: dict) -> str:
    """A record's file name: ``<date>-<tree>.json`` for a run with every backend, ``<date>-<tree>-triton<version>.json``
    for one without cuTile (the gluon tests, ``-k gluon``, under another triton's bundle)."""
    name = f"{record['date']}-{record['src_tree'][:12]}"
    return f"{name}.json" if record.get("cuda-tile") else f"{name}-triton{record['triton']}.json"


def early_first(items: list) -> list:
    """``items`` with those marked ``early`` first, each part in its order (tests/conftest.py orders the collection
    so). Under ``--dist loadgroup`` xdist hands out the tests of no group in collection order (after the groups,
    largest first), so a long test collected last would start last and hold the run past its budget; marked
    ``early`` it starts on a worker of its own at once."""
    return sorted(items, key=lambda item: "early" not in item.keywords)


def workers_for(free_bytes: int, cpus: int) -> int:
    """Parallel pytest workers: one per :data:`GIB_PER_WORKER` of free GPU memory and per :data:`CORES_PER_WORKER`
    CPU cores, 1 to :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, free_bytes // (GIB_PER_WORKER << 30), cpus // CORES_PER_WORKER))


def threads_per_worker(workers: int, cpus: int) -> int:
    """CPU threads each worker's torch / OpenMP pools get: its share of the cores. Left at their default (every core
    per process), the workers' spinning pools take the cores from each other and from the compiles, and a test whose
    float64 reference is many small CPU products runs a hundred times slower (benchmarks/results/gpu-tests/)."""
    return max(1, cpus // workers)


def _versions() -> dict[str, str | None]:
    import torch

    found: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name, module in (("triton", "triton"), ("cuda-tile", "cuda.tile")):
        try:
            found[name] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            found[name] = None
    return found


def _run(workers: int, threads: int, outcomes: Path, budget: float, extra: list[str]) -> int | None:
    """pytest over the ``gpu`` tests, each report appended to ``outcomes``; its exit status, or ``None`` when it was
    stopped at ``budget`` seconds (with its workers)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "--durations=25", "-m", "gpu"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    cmd += [*extra, "tests"]
    print("+", " ".join(cmd), flush=True)
    env = dict(os.environ, TILEGEMM_TEST_OUTCOMES=str(outcomes), OMP_NUM_THREADS=str(threads))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"\ngpu_suite: stopped at the {budget:.0f} s budget", flush=True)
        return None


_WORST = ("passed", "skipped", "failed", "errors")


def cases(outcomes: Path) -> list[dict]:
    """One entry per test from the reports in ``outcomes`` (tests/conftest.py): its outcome (``errors`` for a
    setup or teardown that failed, else the call's), seconds over its phases and peak GPU memory."""
    found: dict[str, dict] = {}
    lines = outcomes.read_text().splitlines() if outcomes.exists() else []
    for report in map(json.loads, lines):
        case = found.setdefault(report["test"], {"test": report["test"], "outcome": "passed", "seconds": 0.0})
        case["seconds"] += report["seconds"]
        outcome = report["outcome"]
        if outcome == "failed" and report["when"] != "call":
            outcome = "errors"
        if _WORST.index(outcome) > _WORST.index(case["outcome"]):
            case["outcome"] = outcome
        case["gpu_peak_bytes"] = max(case.get("gpu_peak_bytes", 0), report.get("gpu_peak_bytes", 0))
    return list(found.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=None, help="parallel workers (default: by free GPU memory)")
    parser.add_argument("--record-dir", type=Path, default=RECORDS, help=f"where the record goes ({RECORDS})")
    parser.add_argument("--budget", type=float, default=540, help="seconds before the run is stopped (default 540)")
    args, extra = parser.parse_known_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_suite: no CUDA GPU here; the GPU suite runs on a CUDA machine", file=sys.stderr)
        return 2
    free, _ = torch.cuda.mem_get_info()
    cpus = os.cpu_count() or 1
    workers = args.workers or workers_for(free, cpus)
    threads = threads_per_worker(workers, cpus)
    gpu = torch.cuda.get_device_name(0)
    tree = git_tree_hash(ROOT / "src")
    torch.cuda.empty_cache()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"tilegemm-gpu-suite-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    code = _run(workers, threads, tmp / "outcomes.jsonl", args.budget, extra)
    ran = cases(tmp / "outcomes.jsonl")
    counts = {k: sum(c["outcome"] == k for c in ran) for k in ("passed", "failed", "errors", "skipped")}
    complete = code in (0, 1) and bool(ran)  # else stopped, or pytest itself failed (usage, collection) or ran nothing
    record = {
        "src_tree": tree,
        "commit": commit(tree),
        "date": datetime.date.today().isoformat(),
        "gpu": gpu,
        **_versions(),
        "complete": complete,
        **counts,
        "seconds": round(time.perf_counter() - start, 1),
        "workers": workers,
        "threads_per_worker": threads,
        "pytest_exit": code,
        "pytest_args": extra,
        "not_passed": [c["test"] for c in ran if c["outcome"] in ("failed", "errors")],
        "slowest": [(c["test"], round(c["seconds"], 1)) for c in sorted(ran, key=lambda c: -c["seconds"])[:10]],
        "peak_memory_gib": [
            (c["test"], round(c["gpu_peak_bytes"] / 2**30, 2))
            for c in sorted(ran, key=lambda c: -c["gpu_peak_bytes"])[:10]
        ],
    }
    args.record_dir.mkdir(parents=True, exist_ok=True)
    out = args.record_dir / record_name(record)
    out.write_text(json.dumps(record, indent=1) + "\n")
    summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "errors", "skipped"))
    state = "" if complete else " (INCOMPLETE: stopped or broken)"
    print(f"\n{gpu}, src tree {tree[:12]}: {summary} in {record['seconds']:.0f} s ({workers} workers){state}")
    print(f"record: {out}")
    return 0 if complete and counts["failed"] == 0 and counts["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
