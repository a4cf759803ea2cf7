"""Time the ws kernels' split-tail designs against the same tiling unsplit, in pairs.

Run on the H200 machine (``source .devbundle/setup.sh``):

    PYTHONPATH=src:benchmarks/gluon python3 benchmarks/gluon/split_tail_probe.py OUT.json [--rows split|short]
        [--shapes bf16:MxNxK,fp8:MxNxK,...] [--also DESIGN,...] [--pairs 3] [--budget-s 200]

``--rows split`` (default): the benchmark set's dense rows whose design the rule splits, the rule's ``_sk`` design
against its unsplit tiling. ``--rows short``: rows whose tiles fill at most one short round or whose tail the rule
leaves unsplit (the BF16 rows of M 256 and 512 the gluon kernel takes, and FP8 few-tile rows; or ``--shapes``): the
rule's design against every tiling of the rule's tiles, unsplit and split 2 or 4 ways where that spreads its tiles
over the idle SMs (configs made here), and the ``--also`` designs of the row's kernel. Each design runs through a
plan built before timing (so a split plan's workspace and counters are made once, as in use); every output is
checked against float64 (``calc_diff``) and rerun bitwise; then kernel-only times (CUDA-graph replay, median per
call) are taken alternately, ``--pairs`` times, so a clock or power drift falls on every design. Prints a table
(microseconds, the rule's design over each other) last and writes every time to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from fp8_ws_sweep import quant, reference

from tilegemm.bench import timing
from tilegemm.bench.dense import NK
from tilegemm.heuristics import gluon as rules
from tilegemm.ops import operands
from tilegemm.ops.gluon import bf16_gemm_ws as bw
from tilegemm.ops.gluon import fp8_gemm_ws as ws
from tilegemm.ops.gluon import split_tail
from tilegemm.testing import calc_diff

#: (dtype, M, N, K): the benchmark set's dense rows whose design the rule splits on 132 SMs
SPLIT_ROWS = [("bf16", 2048, 2112, 7168), ("bf16", 4096, 2112, 7168), ("fp8", 2048, 2112, 7168),
              ("fp8", 4096, 2112, 7168), ("fp8", 8192, 8192, 8192)]  # fmt: skip
#: FP8 rows of few tiles (the dense-fp8-h200 few-tile set's, M 200-512)
FP8_FEW = [(200, 4096, 8192), (256, 2112, 7168), (256, 4096, 7168), (320, 6144, 4096), (384, 2112, 7168),
           (512, 2112, 7168)]  # fmt: skip
CALLS = 20  # calls a CUDA graph


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def short_rows() -> list[tuple[str, int, int, int]]:
    """The BF16 rows of M 256 and 512 the gluon kernel takes, then :data:`FP8_FEW`."""
    bf16 = [("bf16", m, n, k) for m in (256, 512) for n, k in NK if rules.prefers_dense_bf16(m, n, k, _sms())]
    return bf16 + [("fp8", m, n, k) for m, n, k in FP8_FEW]


def _designs(dtype: str, m: int, n: int, k: int, rows: str) -> dict[str, object]:
    """The configs a row times by name, the rule's design first."""
    variants = bw.VARIANTS if dtype == "bf16" else ws.VARIANTS
    picked = (rules.dense_bf16_ws_design if dtype == "bf16" else rules.dense_fp8_ws_design)(m, n, k, _sms())
    if rows == "split":
        split = rules.DENSE_BF16_WS_TAIL_SPLIT if dtype == "bf16" else rules.DENSE_FP8_WS_TAIL_SPLIT
        unsplit = {v: u for u, v in split.designs.items()}[picked]
        return {picked: variants[picked], unsplit: variants[unsplit]}
    out = {picked: variants[picked]}
    tiles = rules.DENSE_BF16_WS_TILES if dtype == "bf16" else rules.DENSE_FP8_WS_TILES
    for name, rows_, cols, _ in tiles:  # every tiling, and its splits that would divide its tiles over idle SMs
        count = operands.cdiv(m, rows_) * operands.cdiv(n, cols)
        if variants[name] not in out.values():
            out[name] = variants[name]
        for splits in (2, 4):
            split = variants[name]._replace(splits=splits)
            if cols <= 128 and split_tail.tail_tiles(count, _sms(), splits) and split not in out.values():
                out[f"{name}+s{splits}"] = split
    return out


def _runs(dtype: str, m: int, n: int, k: int, designs: dict[str, object]):
    """({design: run()}, d, float64 reference) of one row, every plan built here."""
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        gen = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        b = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
        plans = {name: bw.bf16_ws_plan(a, b, d, cfg) for name, cfg in designs.items()}
        ref = a.double() @ b.double().t()
    else:
        a, b = quant(m, n, k, seed=m + n + k)
        ref = reference(a, b)
        plans = {name: ws.ws_plan(a, b, d, cfg) for name, cfg in designs.items()}
    return {name: (lambda p=p: p(a, b, d)) for name, p in plans.items()}, d, ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--rows", choices=("split", "short"), default="split")
    parser.add_argument("--shapes", default="", help="short rows to time instead of the set's: bf16:MxNxK,fp8:...")
    parser.add_argument("--also", default="", help="designs (VARIANTS names) every short row also times")
    parser.add_argument("--pairs", type=int, default=3, help="alternate timings of each design")
    parser.add_argument("--budget-s", type=float, default=200.0, help="start no row after this many seconds")
    args = parser.parse_args()
    t0 = time.time()
    results = []
    shapes = [(dt, *map(int, mnk.split("x"))) for dt, mnk in (s.split(":") for s in args.shapes.split(",") if s)]
    for dtype, m, n, k in SPLIT_ROWS if args.rows == "split" else shapes or short_rows():
        if time.time() - t0 > args.budget_s:
            print("budget spent: stopped before", dtype, m, n, k, flush=True)
            break
        designs = _designs(dtype, m, n, k, args.rows)
        variants = bw.VARIANTS if dtype == "bf16" else ws.VARIANTS
        if args.rows == "short":
            designs.update({name: variants[name] for name in args.also.split(",") if name in variants})
        if len(designs) < 2:  # no split spreads this row's tiles
            continue
        runs, d, ref = _runs(dtype, m, n, k, designs)
        base = next(iter(designs))
        row = {"dtype": dtype, "m": m, "n": n, "k": k, "rule": base, "designs": list(designs)}
        row.update({"diff": {}, "bitwise_rerun": {}, "us": {name: [] for name in designs}})
        for name, run in runs.items():
            d.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            row["diff"][name] = calc_diff(d, ref)
            first = d.clone()
            run()
            torch.cuda.synchronize()
            row["bitwise_rerun"][name] = bool(torch.equal(first, d))
        for _ in range(args.pairs):
            for name, run in runs.items():
                row["us"][name].append(1e3 * timing.graph_ms(run, CALLS))
        results.append(row)
        print(dtype, m, n, k, {name: [round(t, 1) for t in ts] for name, ts in row["us"].items()}, flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": _sms(), "rows": args.rows}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    print("\n| dtype | M x N x K | design | us | rule's design / this | calc_diff | bitwise rerun |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        base = statistics.median(r["us"][r["rule"]])
        for name in r["designs"]:
            t = statistics.median(r["us"][name])
            print(f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {name} | {t:.1f} | {base / t:.3f} | "
                  f"{r['diff'][name]:.1e} | {r['bitwise_rerun'][name]} |")  # fmt: skip


if __name__ == "__main__":
    main()
