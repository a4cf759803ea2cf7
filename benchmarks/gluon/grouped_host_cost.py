"""Host time of one m-grouped FP8 call, back to back, beside DeepGEMM: where the eager time of the short rows goes.

The benchmark set's m-grouped FP8 rows whose eager time sits far above their kernel time (4 x 8192 and 32 x 512 at K
768, 32 x 512 at N 1536) and one that does not (8 x 4096 at K 768), on the sweep's operands (``grouped_sweep``: the
harness's group sizes, tilegemm's casts, A's scales MN-major TMA-aligned; DeepGEMM on the same values, A's scales in
its layout). Per row and call: ``(host_us, wall_us)`` of 300 back-to-back calls (``eager_rule.back_to_back_us``: CPU
time per call before the final synchronize; wall time per call until the GPU is done), the harness's eager time
(``timing.eager_ms``: L2 flushed before each call) and kernel-only time (``timing.graph_ms``); then, on the first
row, the CUDA kernels of 20 eager calls (``torch.profiler``) and a cProfile of 1000 public calls (top functions).
``--quick``: the
two K 768 rows (one design, one compile), host and wall time only. Run on the GPU machine from the repository root:

    source .devbundle/setup.sh && DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/dev/null
    PYTHONPATH=src:tests:. python3 benchmarks/gluon/grouped_host_cost.py $OUT/grouped_host_cost.json [--quick]

Two runs packed as ``ab_before`` / ``ab_after`` (``results/grouped-fp8-h200/m_grouped_hot_lane_h200.json``) plotted:

    python benchmarks/gluon/grouped_host_cost.py plot DATA.json OUT.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROWS = [(4, 8192, 2048, 768), (32, 512, 2048, 768), (32, 512, 1536, 2048), (8, 4096, 2048, 768)]


def row_operands(groups: int, m: int, n: int, k: int, dg):
    """The sweep's operands of the set row ``groups x m``, ``n``, ``k``: ours, DeepGEMM's, ``d`` and the index."""
    import grouped_sweep as sweep  # this folder's

    from tilegemm.bench import peers

    spec = next(r for r in sweep.set_rows() if r["name"] == f"g{groups}m{m}" and (r["n"], r["k"]) == (n, k))
    index = sweep.m_indices(spec["sizes"])
    ours = sweep.operands(index, groups, n, k, seed=groups * n + k)
    (qa, sa), (qb, sb) = ours
    theirs = None if dg is None else ((qa, peers.dg_sfa(dg, sa)), (qb, sb))
    d = torch.empty(index.numel(), n, device="cuda", dtype=torch.bfloat16)
    return ours, theirs, d, index


def calls(ours, theirs, d, index, dg) -> dict:
    """The calls timed on one row's operands, by name."""
    import tilegemm

    named = {
        "auto": lambda: tilegemm.m_grouped_fp8_gemm_nt_contiguous(*ours, d, index),
        "gluon": lambda: tilegemm.m_grouped_fp8_gemm_nt_contiguous(*ours, d, index, backend="gluon"),
    }
    if dg is not None:
        named["deepgemm"] = lambda: dg.m_grouped_fp8_gemm_nt_contiguous(*theirs, d, index)
    return named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true", help="the two K 768 rows of one design, no eager or graph time")
    args = parser.parse_args()
    os.environ["TILEGEMM_DISABLE_FALLBACK"] = "1"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    dg = None
    if os.path.isdir(".devbundle/deepgemm"):
        sys.path.insert(0, ".devbundle/deepgemm")
        import peer

        dg = peer.setup()
    from eager_rule import back_to_back_us, profile_top

    import tilegemm
    from tilegemm.bench import timing

    out = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, "rows": []}
    first = None
    for groups, m, n, k in ROWS[:2] if args.quick else ROWS:
        ours, theirs, d, index = row_operands(groups, m, n, k, dg)
        row = {"row": [groups, m, n, k], "m_sum": index.numel()}
        for name, fn in calls(ours, theirs, d, index, dg).items():
            host, wall = back_to_back_us(fn, 300, warmup=30)
            row[name] = {"host_us": round(host, 1), "wall_us": round(wall, 1)}
            if not args.quick:
                row[name]["eager_us"] = round(timing.eager_ms(fn, 200.0) * 1e3, 1)
                row[name]["graph_us"] = round(timing.graph_ms(fn, 1, budget_ms=200.0) * 1e3, 1)
        out["rows"].append(row)
        print(row, flush=True)
        first = first or (ours, theirs, d, index)
    ours, theirs, d, index = first
    fn = calls(ours, theirs, d, index, dg)["auto"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    out["kernels_20_calls"] = [
        f"{e.count} x {e.key[:90]}: {e.device_time_total / e.count:.1f} us"
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    for key, lines in profile_top(fn, 1000, 25).items():
        out[f"profile_{key}"] = lines
    out["meta"]["tilegemm"] = tilegemm.__file__
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("\n".join(out["kernels_20_calls"]))
    print("\n".join(out["profile_own"][:15]))
    print(f"{'row':22s} " + " ".join(f"{c:>30s}" for c in ("auto host/wall[/eager/graph]", "gluon", "deepgemm")))
    for r in out["rows"]:
        cells = ["/".join(f"{v:.0f}" for v in r[c].values()) if c in r else "-" for c in ("auto", "gluon", "deepgemm")]
        print(f"{'x'.join(map(str, r['row'])):22s} " + " ".join(f"{c:>30s}" for c in cells))
    return 0


def plot(data_path: str, out: str) -> None:
    """Host and wall microseconds per call of each row, before and after, beside DeepGEMM's, one panel per measure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(data_path))
    before, after = data["ab_before"]["rows"], data["ab_after"]["rows"]
    rows = ["x".join(map(str, r["row"])) for r in before]
    bars = [("tilegemm, before", before, "auto", "#9bb3d6"), ("tilegemm, after", after, "auto", "#4c72b0"),
            ("DeepGEMM (after's run)", after, "deepgemm", "#999999")]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, measure, title in zip(axes, ("host_us", "wall_us"), ("CPU us per call", "wall us per call (GPU done)")):
        top = 0.0
        for i, (label, run, column, color) in enumerate(bars):
            xs = [x + (i - 1) * 0.27 for x in range(len(rows))]
            ax.bar(xs, [r[column][measure] for r in run], 0.27, label=label, color=color)
            top = max(top, *(r[column][measure] for r in run))
        ax.set_ylim(0, top * 1.35)
        ax.set_xticks(range(len(rows)), [f"{r} (G x M x N x K)" for r in rows], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right", ncol=3)
    fig.suptitle(f"m-grouped FP8, back-to-back calls, {data['ab_after']['meta']['gpu']}, {data['meta']['date']}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["plot"]:
        plot(*sys.argv[2:4])
        raise SystemExit(0)
    raise SystemExit(main())
