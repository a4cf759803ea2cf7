"""Time the ws kernels' split-tail designs against the same tiling unsplit, in pairs, on the rows the rule splits.

Run on the H200 machine (``source .devbundle/setup.sh``):

    PYTHONPATH=src:benchmarks/gluon python3 benchmarks/gluon/split_tail_probe.py OUT.json [--pairs 3]

Each row: the design the dense rule picks (``dense_bf16_ws_design`` / ``dense_fp8_ws_design``, a ``_sk`` one) and
its unsplit tiling, each run through a plan built before timing (so a split plan's workspace and counters are made
once, as in use); both outputs checked against float64 (``calc_diff``) and the split one rerun bitwise; then
kernel-only times (CUDA-graph replay, median per call) taken alternately, ``--pairs`` times, so a clock or power
drift falls on both. Prints a table (microseconds, unsplit over split) last and writes every time to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from fp8_ws_sweep import quant, reference

from tilegemm.bench import timing
from tilegemm.heuristics import gluon as rules
from tilegemm.ops.gluon import bf16_gemm_ws as bw
from tilegemm.ops.gluon import fp8_gemm_ws as ws
from tilegemm.testing import calc_diff

#: (dtype, M, N, K): the benchmark set's dense rows whose design the rule splits on 132 SMs
ROWS = [("bf16", 2048, 2112, 7168), ("bf16", 4096, 2112, 7168), ("fp8", 2048, 2112, 7168), ("fp8", 4096, 2112, 7168),
        ("fp8", 8192, 8192, 8192)]  # fmt: skip
CALLS = 20  # calls a CUDA graph


def _plans(dtype: str, m: int, n: int, k: int):
    """(split design, unsplit design, {design: run()}, d, float64 reference) of one row."""
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        gen = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        b = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
        split = rules.dense_bf16_ws_design(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
        unsplit = {v: u for u, v in rules.DENSE_BF16_WS_TAIL_SPLIT.designs.items()}[split]
        plans = {name: bw.bf16_ws_plan(a, b, d, bw.VARIANTS[name]) for name in (split, unsplit)}
        runs = {name: (lambda p=p: p(a, b, d)) for name, p in plans.items()}
        ref = a.double() @ b.double().t()
    else:
        a, b = quant(m, n, k, seed=m + n + k)
        ref = reference(a, b)
        split = rules.dense_fp8_ws_design(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
        unsplit = {v: u for u, v in rules.DENSE_FP8_WS_TAIL_SPLIT.designs.items()}[split]
        plans = {name: ws.ws_plan(a, b, d, ws.VARIANTS[name]) for name in (split, unsplit)}
        runs = {name: (lambda p=p: p(a, b, d)) for name, p in plans.items()}
    return split, unsplit, runs, d, ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--pairs", type=int, default=3, help="alternate timings of each design")
    args = parser.parse_args()
    results = []
    for dtype, m, n, k in ROWS:
        split, unsplit, runs, d, ref = _plans(dtype, m, n, k)
        row = {"dtype": dtype, "m": m, "n": n, "k": k, "split": split, "unsplit": unsplit, "diff": {}, "us": {}}
        for name, run in runs.items():
            d.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            row["diff"][name] = calc_diff(d, ref)
            first = d.clone()
            run()
            torch.cuda.synchronize()
            row.setdefault("bitwise_rerun", {})[name] = bool(torch.equal(first, d))
            row["us"][name] = []
        for _ in range(args.pairs):
            for name, run in runs.items():
                row["us"][name].append(1e3 * timing.graph_ms(run, CALLS))
        results.append(row)
        print(dtype, m, n, k, {name: [round(t, 1) for t in ts] for name, ts in row["us"].items()}, flush=True)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    print("\n| dtype | M x N x K | split design | unsplit us | split us | unsplit / split | calc_diff (split) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        u, s = statistics.median(r["us"][r["unsplit"]]), statistics.median(r["us"][r["split"]])
        print(f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {r['split']} | {u:.1f} | {s:.1f} | {u / s:.3f} | "
              f"{r['diff'][r['split']]:.1e} |")  # fmt: skip


if __name__ == "__main__":
    main()
