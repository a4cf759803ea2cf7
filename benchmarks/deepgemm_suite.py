"""Run DeepGEMM v2.6.1's own test files, unmodified, against tilegemm through a plain module alias.

DeepGEMM's tests import ``deep_gemm`` and its helpers ``deep_gemm.testing`` and ``deep_gemm.utils`` (generators,
casts, timers). Each test function runs in a fresh process that first makes those names aliases of tilegemm's
modules (``sys.modules["deep_gemm"] = tilegemm``, ``deep_gemm.utils`` -> ``tilegemm.utils``, ``deep_gemm.testing``
-> ``tilegemm.testing``, ...), nothing of DeepGEMM's own code imported, then imports the test file from DeepGEMM's
``tests/`` folder and calls the function, seeded as the file's ``__main__`` seeds it. DeepGEMM's kineto timer is
tilegemm's ``bench_kineto``, so each function's benchmark prints run too (they find tilegemm's kernels by the
substrings DeepGEMM filters on); ``--no-kineto`` sets ``DG_USE_NVIDIA_TOOLS=1`` to run the correctness part only.
Needs a CUDA GPU and a DeepGEMM source tree (its ``tests/``; no build)::

    python benchmarks/deepgemm_suite.py --deepgemm-src DIR --out OUT_DIR [--timeout 300] [--only test_bf16,...]

Writes ``OUT_DIR/deepgemm_suite.json`` and ``.md`` (one row per test function: passed, failed with the last lines
of its output, or timed out) and one log per test file (``OUT_DIR/<file>.log``, its functions' output in order).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: Test functions per file, in the order the file's ``__main__`` calls them on an SM90 GPU, and its seed.
SUITE: dict[str, tuple[int, list[str]]] = {
    "test_bf16": (
        0,
        [
            "test_gemm",
            "test_m_grouped_gemm_contiguous",
            "test_m_grouped_gemm_masked",
            "test_k_grouped_gemm_contiguous",
            "test_cublaslt_gemm",
        ],
    ),
    "test_fp8_fp4": (
        0,
        ["test_gemm", "test_m_grouped_gemm_contiguous", "test_m_grouped_gemm_masked", "test_k_grouped_gemm_contiguous"],
    ),
    "test_attention": (0, ["test_gemm_skip_head_mid", "test_mqa_logits", "test_paged_mqa_logits"]),
    "test_layout": (
        1,
        ["test_sf_layout_kernels", "test_k_grouped_sf_layout_kernels", "test_k_grouped_psum_sf_layout_kernels"],
    ),
    "test_hyperconnection": (0, ["test_hc_prenorm_gemm"]),
    "test_einsum": (
        0,
        [
            "test_bmk_bnk_mn",
            "test_bhr_hdr_bhd",
            "test_bhd_hdr_bhr",
            "test_fp8_bhr_hdr_bhd",
            "test_fp8_bhd_hdr_bhr",
            "test_fp8_bhd_bhr_hdr",
        ],
    ),
}

#: The modules DeepGEMM's tests import, and the tilegemm module each becomes.
ALIASES = {
    "deep_gemm": "tilegemm",
    "deep_gemm.utils": "tilegemm.utils",
    "deep_gemm.utils.math": "tilegemm.utils.math",
    "deep_gemm.utils.layout": "tilegemm.utils.layout",
    "deep_gemm.utils.dist": "tilegemm.utils.dist",
    "deep_gemm.testing": "tilegemm.testing",
}

_RUNNER = """
import importlib, random, sys, torch
for alias, name in {aliases!r}.items():
    sys.modules[alias] = importlib.import_module(name)
sys.path.insert(0, {tests!r})
torch.manual_seed({seed}); random.seed({seed})
import {module} as m
m.{function}()
print("DEEPGEMM_SUITE_OK")
"""


def run_function(tests: Path, module: str, seed: int, function: str, timeout: float, log: Path, kineto: bool) -> dict:
    """Run one test function in a fresh process, appending its output to ``log``; returns its row."""
    code = _RUNNER.format(aliases=ALIASES, tests=str(tests), seed=seed, module=module, function=function)
    env = dict(os.environ)
    if not kineto:
        env["DG_USE_NVIDIA_TOOLS"] = "1"
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=tests, env=env, capture_output=True, text=True, timeout=timeout
        )
        output, status = proc.stdout + proc.stderr, ("passed" if "DEEPGEMM_SUITE_OK" in proc.stdout else "failed")
    except subprocess.TimeoutExpired as exc:
        output, status = f"{exc.stdout or ''}{exc.stderr or ''}", "timeout"
        output = output if isinstance(output, str) else output.decode(errors="replace")
    with log.open("a") as f:
        f.write(f"===== {module}.{function}: {status}\n{output}\n")
    tail = [line for line in output.splitlines() if line.strip()][-6:]
    return dict(file=module, function=function, status=status, seconds=round(time.perf_counter() - start, 1), tail=tail)


def to_markdown(rows: list[dict], meta: dict) -> str:
    """The suite's table: one row per test function."""
    passed = sum(r["status"] == "passed" for r in rows)
    lines = [
        f"# DeepGEMM {meta['deepgemm']} test functions through `import tilegemm as deep_gemm`",
        "",
        f"{meta['date']}, {meta['gpu']}, torch {meta['torch']}; DeepGEMM's test files unmodified, `deep_gemm` an "
        f"alias of `tilegemm`; {meta['timing']}. **{passed}/{len(rows)} passed.**",
        "",
        "| file | function | status | s | last output |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        note = "" if r["status"] == "passed" else " / ".join(r["tail"][-2:]).replace("|", "\\|")[:300]
        lines.append(f"| {r['file']} | {r['function']} | {r['status']} | {r['seconds']} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring. Exit status 1 when a function did not pass."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepgemm-src", type=Path, required=True, help="DeepGEMM source tree (deep_gemm/, tests/)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON, markdown and logs")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test function")
    parser.add_argument("--only", default="", help="comma-separated file names to run (default: all)")
    parser.add_argument("--no-kineto", action="store_true", help="DG_USE_NVIDIA_TOOLS=1: correctness only")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        parser.error("DeepGEMM's tests need a CUDA GPU")
    tests = args.deepgemm_src / "tests"
    if not (tests / "generators.py").is_file():
        parser.error(f"--deepgemm-src {args.deepgemm_src}: no tests/generators.py there")
    args.out.mkdir(parents=True, exist_ok=True)
    only = {name for name in args.only.split(",") if name}
    rows = []
    for module, (seed, functions) in SUITE.items():
        if only and module not in only:
            continue
        log = args.out / f"{module}.log"
        log.write_text("")
        for function in functions:
            row = run_function(tests, module, seed, function, args.timeout, log, kineto=not args.no_kineto)
            print(f"{row['status']:8} {row['seconds']:7.1f}s {module}.{function}", flush=True)
            rows.append(row)
    meta = dict(
        date=datetime.date.today().isoformat(),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        deepgemm="v2.6.1",
        timing="kineto off (`DG_USE_NVIDIA_TOOLS=1`): correctness only"
        if args.no_kineto
        else "kineto timing on (tilegemm.testing.bench_kineto)",
    )
    (args.out / "deepgemm_suite.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (args.out / "deepgemm_suite.md").write_text(to_markdown(rows, meta))
    return 0 if all(r["status"] == "passed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
