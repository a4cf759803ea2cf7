"""Time the gluon warp-specialized BF16 kernel (``bf16_gemm_ws``) designs beside cuBLAS, tilegemm and DeepGEMM.

Run on the H200 machine (``source .devbundle/setup.sh``; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/bf16_ws_sweep.py OUT.json [--m 256,512] [--designs a,b]
        [--shapes MxNxK,...] [--repeat N]

Rows: the benchmark set's dense (N, K) pairs at the given M (default 256 and 512: the 129-1024 bucket where the
cutile kernels trail cuBLAS), or ``--shapes``. Columns: each design run directly (``bf16_ws_plan``; ``rule``: the
design ``heuristics.gluon.dense_bf16_ws_design`` picks for the row, whether or not the rule sends the row to the
kernel, named in the JSON's ``rule_design``); ``cublas``: ``torch.matmul``
into the output; ``tilegemm``: ``bf16_gemm_nt`` with default settings; ``deepgemm``: its ``bf16_gemm_nt``. Every
output is checked against float64 (``calc_diff``) before it is timed; timing is kernel-only (CUDA-graph replay over
input sets rotated past L2, median per call; with ``--repeat`` the columns are timed in turn that many times and the
median kept). A row whose turn would start after ``--budget-s`` is skipped. Prints a
table (TFLOP/s, each column's geomean ratio to cuBLAS) last and writes everything to OUT.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
from sweep_table import design_config, parse_shapes, print_table, progress, timed_in_turn

import tilegemm
from tilegemm.bench import device, peers, timing
from tilegemm.bench.dense import NK
from tilegemm.heuristics.gluon import dense_bf16_ws_design
from tilegemm.ops.gluon import bf16_gemm_ws as bw


def _ws(a, b, d, *, cfg):
    return bw.bf16_ws_plan(a, b, d, cfg)(a, b, d)


def _rule_design(m: int, n: int, k: int) -> str:
    """The design the dense BF16 rule picks for an [m, k] x [n, k] call on this GPU's SMs."""
    return dense_bf16_ws_design(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)


def _cublas(a, b, d):
    return torch.matmul(a, b.t(), out=d)


def _public(a, b, d):
    return tilegemm.bf16_gemm_nt(a, b, d)


def _deepgemm(dg, a, b, d):
    return dg.bf16_gemm_nt(a, b, d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--m", default="256,512", help="comma-separated M values")
    parser.add_argument(
        "--designs",
        default=",".join(bw.VARIANTS),
        help="comma-separated bw.VARIANTS names, name:field=value to vary one",
    )
    parser.add_argument("--shapes", default="", help="comma-separated MxNxK rows instead of --m")
    parser.add_argument("--budget-s", type=float, default=200.0, help="start no row after this many seconds")
    parser.add_argument("--rep-ms", type=float, default=20.0, help="timing budget of one column on a row")
    parser.add_argument("--repeat", type=int, default=1, help="time the columns in turn this many times (median)")
    args = parser.parse_args()
    designs = [v for v in args.designs.split(",") if v]
    t0 = time.time()
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, flush=True)
    rows = []
    shapes = parse_shapes(args.shapes) or [(m, n, k) for m in map(int, args.m.split(",")) for n, k in NK]
    for m, n, k in shapes:
        if time.time() - t0 > args.budget_s:
            print(f"skipping {m}x{n}x{k}: past the {args.budget_s:.0f} s budget", flush=True)
            continue
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        nsets = min(4, timing.rotation_count(2 * (m * k + n * k + m * n)))
        sets = [
            (
                torch.randn(m, k, device="cuda", generator=g).bfloat16(),
                torch.randn(n, k, device="cuda", generator=g).bfloat16(),
                torch.empty(m, n, device="cuda", dtype=torch.bfloat16),
            )
            for _ in range(nsets)
        ]
        ref = sets[0][0].double() @ sets[0][1].double().t()
        row = {"m": m, "n": n, "k": k, "tflops": {}, "us": {}, "diff": {}, "error": {}}
        out = sets[0][2]  # set 0's d: the one the check reads
        row["rule_design"] = _rule_design(m, n, k)
        columns = {
            name: functools.partial(_ws, cfg=design_config(bw.VARIANTS, row["rule_design"] if name == "rule" else name))
            for name in designs
        }
        columns |= {"cublas": _cublas, "tilegemm": _public}
        if dg is not None:
            columns["deepgemm"] = functools.partial(_deepgemm, dg)
        timed_in_turn(row, columns, sets, out, ref, args.rep_ms, args.repeat)
        rows.append(row)
        progress(row, t0, 1e-4)
        del sets, ref
        torch.cuda.empty_cache()
    meta = {
        **device.describe(),
        "deepgemm": why,
        "designs": {name: design_config(bw.VARIANTS, name)._asdict() for name in designs if name != "rule"},
        "columns": "designs (direct); cublas: torch.matmul; tilegemm: bf16_gemm_nt, default settings; deepgemm",
        "timing": "CUDA-graph replay median per call, input sets rotated past L2, kernel-only",
        "seconds": round(time.time() - t0, 1),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, designs + ["cublas", "tilegemm", "deepgemm"], "cublas", "cuBLAS")
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
