"""The whole GPU test suite in one run, and its record (``make test-gpu``).

Runs every test marked ``gpu`` on the CUDA machine in one pytest-xdist run, with workers sized to the GPU's free
memory and CPU cores (:func:`workers_for`; the cuTile compiles of first calls take the CPU). The tests of xdist
group ``gpu_serial`` (many GiB of operands each, or the whole suite under compute-sanitizer) run one after another
on one worker while the others take the rest. It then writes
``benchmarks/results/gpu-tests/<date>.json``: which ``src`` tree ran (:func:`git_tree_hash`, equal to
``git rev-parse HEAD:src`` for a clean checkout, computed from the files so that it holds on a machine without the
repository's ``.git``), the commit when known, date, GPU, torch, triton, cuda-tile, passed, failed, errors, skipped,
seconds, workers, and the slowest and most memory-hungry tests (``gpu_peak_bytes``, tests/conftest.py).

Usage: ``python tests/gpu_suite.py [--workers N] [--record-dir DIR] [pytest arguments ...]``; exit status 0 only
when no test failed or errored. ``TILEGEMM_COMMIT`` names the commit where ``.git`` is absent.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "gpu-tests"
GIB_PER_WORKER = 32
"""GPU memory one pytest worker may take: its CUDA context, the cuTile/Triton modules it loads, and the operands of
the largest tests outside the ``gpu_serial`` group (a few GiB; the conftest hands cached blocks back after each)."""
MAX_WORKERS = 4
"""More workers ran no more tests per second (benchmarks/results/gpu-tests/README.md): each worker JIT-compiles the
cuTile variants its tests meet, so added workers mostly compile the same kernels again."""
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


def commit() -> str | None:
    """The checked-out commit (``git rev-parse HEAD``), else ``$TILEGEMM_COMMIT``, else ``None``."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0:
        return out.stdout.strip()
    return os.environ.get("TILEGEMM_COMMIT") or None


def workers_for(free_bytes: int, cpus: int) -> int:
    """Parallel pytest workers: one per :data:`GIB_PER_WORKER` of free GPU memory and per 4 CPU cores, 1 to
    :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, free_bytes // (GIB_PER_WORKER << 30), cpus // 4))


def _versions() -> dict[str, str | None]:
    import torch

    found: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name, module in (("triton", "triton"), ("cuda-tile", "cuda.tile")):
        try:
            found[name] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            found[name] = None
    return found


def _run(workers: int, junit: Path, extra: list[str]) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "--durations=25", "-m", "gpu", f"--junitxml={junit}"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    cmd += [*extra, "tests"]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def _cases(junit: Path) -> list[dict]:
    if not junit.exists():
        return []
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "errors"}.get(tag, tag)
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append(
            {"test": name, "outcome": outcome, "seconds": float(case.get("time") or 0),
             "gpu_peak_bytes": int(props.get("gpu_peak_bytes", 0))}
        )  # fmt: skip
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=None, help="parallel workers (default: by free GPU memory)")
    parser.add_argument("--record-dir", type=Path, default=RECORDS, help=f"where the record goes ({RECORDS})")
    args, extra = parser.parse_known_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_suite: no CUDA GPU here; the GPU suite runs on a CUDA machine", file=sys.stderr)
        return 2
    free, _ = torch.cuda.mem_get_info()
    workers = args.workers or workers_for(free, os.cpu_count() or 1)
    gpu = torch.cuda.get_device_name(0)
    tree = git_tree_hash(ROOT / "src")
    torch.cuda.empty_cache()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"tilegemm-gpu-suite-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    code = _run(workers, tmp / "suite.xml", extra)
    cases = _cases(tmp / "suite.xml")
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "errors", "skipped")}
    if code not in (0, 1) or not cases:  # pytest itself failed (usage, collection, interrupted) or ran nothing
        counts["errors"] += 1
    record = {
        "src_tree": tree,
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "gpu": gpu,
        **_versions(),
        **counts,
        "seconds": round(time.perf_counter() - start, 1),
        "workers": workers,
        "pytest_exit": code,
        "not_passed": [c["test"] for c in cases if c["outcome"] in ("failed", "errors")],
        "slowest": [(c["test"], c["seconds"]) for c in sorted(cases, key=lambda c: -c["seconds"])[:10]],
        "peak_memory_gib": [
            (c["test"], round(c["gpu_peak_bytes"] / 2**30, 2))
            for c in sorted(cases, key=lambda c: -c["gpu_peak_bytes"])[:10]
        ],
    }
    args.record_dir.mkdir(parents=True, exist_ok=True)
    out = args.record_dir / f"{record['date']}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "errors", "skipped"))
    print(f"\n{gpu}, src tree {tree[:12]}: {summary} in {record['seconds']:.0f} s ({workers} workers)")
    print(f"record: {out}")
    return 0 if counts["failed"] == 0 and counts["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
