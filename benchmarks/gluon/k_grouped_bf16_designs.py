"""Time the k-grouped BF16 designs of the rule's tile beside DeepGEMM: the MMA warpgroups in lockstep (one partition)
and each a partition of its own (``_wg2``).

Run on the H200 machine (``source .devbundle/setup.sh``; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/k_grouped_bf16_designs.py OUT.json

First a check on an awkward call (an empty group, N off the tiles, a 3-CTA grid, with and without accumulation):
each ``_wg2`` design writes every element, matches the float64 formula and gives the lockstep design's bits. Then the
benchmark set's 6 k-grouped rows (``c = d``; per-group K as ``tilegemm.bench.k_grouped`` draws it): each design run
directly through ``bf16_ws_plan``, DeepGEMM's ``k_grouped_bf16_gemm_tn_contiguous``; kernel-only (CUDA-graph replay),
the columns in turn twice, the faster median kept. Prints each design's geomean against DeepGEMM last.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from tilegemm.bench import device, inputs, peers, timing
from tilegemm.bench.k_grouped import SHAPES
from tilegemm.heuristics.gluon import k_grouped_bf16_ws_design
from tilegemm.ops.gluon import bf16_gemm_ws as bw
from tilegemm.testing import calc_diff


def check() -> None:
    """The ``_wg2`` designs on an awkward call against float64 and against the lockstep design's bits."""
    ks, m, n = [256, 0, 320, 64], 256, 200
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(sum(ks), m, device="cuda", generator=g).bfloat16()
    b = torch.randn(sum(ks), n, device="cuda", generator=g).bfloat16()
    offsets = torch.tensor([0, 256, 256, 576, 640], dtype=torch.int32, device="cuda")
    c = torch.randn(len(ks), m, n, device="cuda", generator=g)
    bounds = offsets.tolist()
    product = torch.stack([a[s:e].double().t() @ b[s:e].double() for s, e in zip(bounds[:-1], bounds[1:])])
    for design in (name for name in bw.VARIANTS if name.endswith("_wg2") and bw.VARIANTS[name].block_n <= 128):
        lockstep = design.removesuffix("_wg2")
        for accumulate in (False, True):
            outs = {}
            for name in (design, lockstep):
                out = c.clone() if accumulate else torch.full((len(ks), m, n), float("nan"), device="cuda")
                plan = bw.bf16_ws_plan(a, b, out, bw.VARIANTS[name], 3, ks=ks, accumulate=accumulate)
                outs[name] = plan(a, b, out, k_offsets=offsets)
            torch.cuda.synchronize()
            diff = calc_diff(outs[design], product + (c.double() if accumulate else 0))
            same = torch.equal(outs[design], outs[lockstep])
            print(f"check {design} accumulate={accumulate}: calc_diff {diff:.1e}, the lockstep bits: {same}")
            assert not outs[design].isnan().any() and diff < 1e-6 and same


def time_row(dg, groups: int, m: int, n: int, k: int, sms: int) -> dict:
    """One set row: the rule's tile in lockstep and as ``_wg2``, and DeepGEMM, each the faster of two medians."""
    ks = inputs.group_sizes(groups, k, inputs.seed_of("k_grouped", groups, m, n, k), lo=0.7, hi=1.3, align=128)
    ks_t = torch.tensor(ks, dtype=torch.int32, device="cuda")
    offsets = torch.cat([ks_t.new_zeros(1), torch.cumsum(ks_t, 0, dtype=torch.int32)])
    a = torch.randn(sum(ks), m, device="cuda").bfloat16()
    b = torch.randn(sum(ks), n, device="cuda").bfloat16()
    d = torch.zeros(groups, m, n, device="cuda")
    lockstep = k_grouped_bf16_ws_design(groups, m, n, sms).removesuffix("_wg2")
    columns = {}
    for name in (lockstep, lockstep + "_wg2") if lockstep + "_wg2" in bw.VARIANTS else (lockstep,):
        plan = bw.bf16_ws_plan(a, b, d, bw.VARIANTS[name], ks=ks, accumulate=True)
        columns[name] = lambda plan=plan: plan(a, b, d, k_offsets=offsets)
    if dg is not None:
        columns["deepgemm"] = lambda: dg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, ks_t, c=d)
    samples: dict[str, list[float]] = {}
    for _ in range(2):  # the columns in turn, so that a drift of the clocks reaches each alike
        for name, call in columns.items():
            samples.setdefault(name, []).append(timing.graph_ms(call, 1, budget_ms=150) * 1e3)
    row = {"groups": groups, "m": m, "n": n, "k_per_group": k, "k_sum": sum(ks), "lockstep": lockstep}
    row["us"] = {name: min(v) for name, v in samples.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    args = parser.parse_args()
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, flush=True)
    check()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for groups, m, n, k in SHAPES:
        rows.append(time_row(dg, groups, m, n, k, sms))
        print(groups, m, n, k, {name: round(us, 1) for name, us in rows[-1]["us"].items()}, flush=True)
        torch.cuda.empty_cache()
    meta = {**device.describe(), "deepgemm": why, "timing": "CUDA-graph replay, c = d, the faster of two medians"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    for suffix in ("", "_wg2"):
        ratios = [r["us"]["deepgemm"] / r["us"][r["lockstep"] + suffix] for r in rows if "deepgemm" in r["us"]]
        if ratios:
            geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{'wg2' if suffix else 'lockstep':>8} / DeepGEMM {geomean:.3f}", [round(x, 3) for x in ratios])


if __name__ == "__main__":
    main()
