"""Time BF16 ws designs at M just past and short of a 128-row boundary: what a partly filled last row tile costs.

Run on the H200 machine (``source .devbundle/setup.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/partial_rows_probe.py OUT.json [--m 128,136,...] [--n 2112,2048]
        [--k 7168] [--designs bf16_128x64,...]

Each (M, N) row builds a plan per design on random bf16 operands, then takes kernel-only times (CUDA-graph replay,
``tilegemm.bench.timing.graph_ms``) twice, the designs alternating; prints the fastest of each and writes every time
to OUT.json.
"""

from __future__ import annotations

import argparse
import json

import torch

from tilegemm.bench import timing
from tilegemm.ops.gluon import bf16_gemm_ws as bw

CALLS = 20  # calls a CUDA graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--m", default="128,136,192,200,240,248,256,264,384")
    parser.add_argument("--n", default="2112,2048")
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--designs", default="bf16_128x64,bf16_64x128,bf16_128x128,bf16_128x64_sk2")
    args = parser.parse_args()
    designs = args.designs.split(",")
    results = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "k": args.k}, "us": {}}
    for m in map(int, args.m.split(",")):
        for n in map(int, args.n.split(",")):
            a = torch.randn(m, args.k, device="cuda").bfloat16()
            b = torch.randn(n, args.k, device="cuda").bfloat16()
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            plans = {name: bw.bf16_ws_plan(a, b, d, bw.VARIANTS[name]) for name in designs}
            times: dict[str, list[float]] = {name: [] for name in designs}
            for _ in range(2):
                for name, plan in plans.items():
                    times[name].append(round(1e3 * timing.graph_ms(lambda p=plan, x=(a, b, d): p(*x), CALLS), 2))
            results["us"][f"{m}x{n}x{args.k}"] = times
            print(m, n, {name: min(t) for name, t in times.items()}, flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
