"""Run DeepGEMM v2.6.1's own test functions against tilegemm, as ``import tilegemm as deep_gemm``.

DeepGEMM's tests import ``deep_gemm`` (the API under test) and its helper packages
``deep_gemm.testing`` and ``deep_gemm.utils`` (generators, casts, timers: not API under test).
This script builds a stand-in ``deep_gemm`` package in a temporary folder: its ``__init__`` is
``from tilegemm import *``; ``testing/`` and ``utils/`` are copied from a DeepGEMM source tree and
their one import of DeepGEMM's extension (``deep_gemm._C``: layout helpers) is served by tilegemm.
Each test function then runs in a fresh process (seeded as the test file's ``__main__`` seeds it)
with ``DG_USE_NVIDIA_TOOLS=1``, which makes DeepGEMM's kineto timer a no-op: what runs is the
correctness part of every test. Needs a CUDA GPU and a DeepGEMM source tree (no build)::

    python benchmarks/deepgemm_suite.py --deepgemm-src DIR --out OUT_DIR [--timeout 300]

Writes ``OUT_DIR/deepgemm_suite.json`` and ``.md`` (one row per test function: passed, failed with
the last lines of its output, or timed out) and each function's log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
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

_C_NAMES = (
    "get_tma_aligned_size",
    "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "set_mk_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout",
)

_RUNNER = """
import random, sys, torch
sys.path.insert(0, {tests!r})
torch.manual_seed({seed}); random.seed({seed})
import {module} as m
m.{function}()
print("DEEPGEMM_SUITE_OK")
"""


def build_shim(deepgemm_src: Path, root: Path) -> Path:
    """Write the stand-in ``deep_gemm`` package under ``root``; returns ``root``."""
    pkg = root / "deep_gemm"
    pkg.mkdir(parents=True)
    for helper in ("testing", "utils"):
        shutil.copytree(deepgemm_src / "deep_gemm" / helper, pkg / helper)
    (pkg / "__init__.py").write_text(
        "from tilegemm import *  # noqa: F403\nfrom tilegemm import __all__  # noqa: F401\n"
    )
    (pkg / "_C.py").write_text(f"from tilegemm import {', '.join(_C_NAMES)}  # noqa: F401\n")
    return root


def run_function(shim: Path, tests: Path, module: str, seed: int, function: str, timeout: float, log: Path) -> dict:
    """Run one test function in a fresh process; returns its row."""
    code = _RUNNER.format(tests=str(tests), seed=seed, module=module, function=function)
    env = {**os.environ, "DG_USE_NVIDIA_TOOLS": "1"}
    env["PYTHONPATH"] = f"{shim}:{env.get('PYTHONPATH', '')}"
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=tests, env=env, capture_output=True, text=True, timeout=timeout
        )
        output, status = proc.stdout + proc.stderr, ("passed" if "DEEPGEMM_SUITE_OK" in proc.stdout else "failed")
    except subprocess.TimeoutExpired as exc:
        output, status = f"{exc.stdout or ''}{exc.stderr or ''}", "timeout"
        output = output if isinstance(output, str) else output.decode(errors="replace")
    log.write_text(output)
    tail = [line for line in output.splitlines() if line.strip()][-6:]
    return dict(file=module, function=function, status=status, seconds=round(time.perf_counter() - start, 1), tail=tail)


def to_markdown(rows: list[dict], meta: dict) -> str:
    """The suite's table: one row per test function."""
    passed = sum(r["status"] == "passed" for r in rows)
    lines = [
        f"# DeepGEMM {meta['deepgemm']} test functions through `import tilegemm as deep_gemm`",
        "",
        f"{meta['date']}, {meta['gpu']}, torch {meta['torch']}. DeepGEMM's kineto timing off "
        "(`DG_USE_NVIDIA_TOOLS=1`): the correctness part of each function. "
        f"**{passed}/{len(rows)} passed.**",
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
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(args.deepgemm_src, Path(tmp))
        for module, (seed, functions) in SUITE.items():
            if only and module not in only:
                continue
            for function in functions:
                row = run_function(
                    shim, tests, module, seed, function, args.timeout, args.out / f"{module}.{function}.log"
                )
                print(f"{row['status']:8} {row['seconds']:7.1f}s {module}.{function}", flush=True)
                rows.append(row)
    meta = dict(
        date=datetime.date.today().isoformat(),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        deepgemm="v2.6.1",
    )
    (args.out / "deepgemm_suite.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (args.out / "deepgemm_suite.md").write_text(to_markdown(rows, meta))
    return 0 if all(r["status"] == "passed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
