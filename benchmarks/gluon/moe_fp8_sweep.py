"""Time the fused FP8 MoE experts on their two forms: cutile (fused epilogue) and gluon (m-grouped GEMMs).

Run on the H200 machine (``source .devbundle/setup.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/moe_fp8_sweep.py OUT.json [--models a,b] [--rows-per-expert 64,128]
        [--designs] [--activation silu|gelu_tanh]

and its plot on any machine (matplotlib): ``moe_fp8_sweep.py --plot OUT.json PLOT.png``.

Rows: the benchmark set's three MoE models (``tilegemm.bench.moe.MODELS``) over token counts from 16 to 1024 routed
rows per expert, the routing a top-k of random scores (balanced). ``tilegemm.fp8_moe_experts`` is called through the
public API with ``backend="cutile"``, ``backend="gluon"`` and the default (the automatic choice); ``--designs`` adds
the gluon form with its GEMM designs forced to the 128-row ones (``gluon128``) and to the 64-row ones (``gluon64``),
whatever ``moe_fp8_ws_designs`` would pick. Each form's output
is checked against the other's (``calc_diff``, the harness's FP8 bar: two implementations, each a few e4m3 steps of
``h`` from the formula) before it is timed; timing is kernel-only (one call captured in a CUDA graph, replays timed,
L2 flushed before each) and eager (L2 flushed before each call). Prints a table last and writes every number to
OUT.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

import torch

import tilegemm
from tilegemm.bench import device, timing
from tilegemm.bench.moe import FP8_BAR, MODELS
from tilegemm.heuristics import gluon as rules
from tilegemm.heuristics.gluon import prefers_fp8_moe_experts
from tilegemm.ops.gluon import moe_fp8 as gluon_moe_fp8
from tilegemm.testing import calc_diff

#: routed rows per expert of each row: 16 to 1024
ROWS_PER_EXPERT = (16, 32, 64, 128, 256, 512, 1024)
FORMS = ("cutile", "gluon", "auto")
#: ``--designs``: the gluon form with its (gate/up, down) designs forced
FORCED = {
    "gluon128": (rules.MOE_FP8_GATE_UP_WS_DESIGN, rules.M_GROUPED_FP8_WS_DESIGN),
    "gluon64": ("e_64x128_p", "e_64x128_ov2"),
}


@contextlib.contextmanager
def forced_designs(form: str):
    """The gluon form's GEMM designs forced for ``form`` (a :data:`FORCED` name; other forms: as chosen)."""
    chooser = gluon_moe_fp8.moe_fp8_ws_designs
    if form in FORCED:
        gluon_moe_fp8.moe_fp8_ws_designs = lambda *_: FORCED[form]
    try:
        yield
    finally:
        gluon_moe_fp8.moe_fp8_ws_designs = chooser


def fp8_weights(experts: int, rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random [E, rows, cols] weights (scaled by 1/sqrt(cols)) with 128x128 block scales, made a few experts at a
    time (the fp32 copy of DeepSeek-V3's w13 alone would take 30 GB)."""
    data = torch.empty(experts, rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
    scales = torch.empty(experts, rows // 128, cols // 128, dtype=torch.float32, device="cuda")
    step = max(1, 2**28 // (rows * cols))
    for e in range(0, experts, step):
        w = torch.randn(min(step, experts - e), rows, cols, device="cuda", generator=gen) / math.sqrt(cols)
        data[e : e + step], scales[e : e + step] = tilegemm.per_block_cast_to_fp8(w)
    return data, scales


def plot(src: str, png: str) -> None:
    """The gluon form's speed over the cutile form's (kernel-only, solid; eager, dashed) against routed rows per
    expert, one line per model, the automatic choice's threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tilegemm.heuristics.gluon import MOE_FP8_MIN_ROWS_PER_EXPERT

    with open(src) as f:
        doc = json.load(f)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, model in enumerate(dict.fromkeys(r["model"] for r in doc["rows"])):
        rows = [r for r in doc["rows"] if r["model"] == model]
        x = [r["rows_per_expert"] for r in rows]
        color = f"C{i}"
        ax.plot(x, [r["gluon_speedup"] for r in rows], "o-", color=color, label=f"{model} (kernel-only)")
        ax.plot(x, [r["gluon_speedup_eager"] for r in rows], "x--", color=color, alpha=0.6, label=f"{model} (eager)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(MOE_FP8_MIN_ROWS_PER_EXPERT, color="black", lw=0.8, ls=":", label="automatic choice: gluon from here")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("routed rows per expert (T * k / E)")
    ax.set_ylabel("cutile form time / gluon form time")
    meta = doc["meta"]
    ax.set_title(f"fp8_moe_experts: gluon form (m-grouped GEMMs) vs cutile form\n{meta['gpu']}, {meta['date']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--plot", nargs=2, metavar=("SWEEP.json", "PLOT.png"), help="plot a saved sweep and stop")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rows-per-expert", default=",".join(map(str, ROWS_PER_EXPERT)))
    parser.add_argument("--budget-ms", type=float, default=400.0, help="timing budget per measurement")
    parser.add_argument("--designs", action="store_true", help="add the gluon form with each design pair forced")
    parser.add_argument("--activation", default="silu", choices=["silu", "gelu_tanh"], help="the experts' activation")
    args = parser.parse_args()
    forms = FORMS + (tuple(FORCED) if args.designs else ())
    if args.plot:
        plot(*args.plot)
        return
    if not args.out:
        parser.error("OUT.json is required to run the sweep")
    t0 = time.time()
    results = []
    for model in args.models.split(","):
        h, e, k, i, _ = MODELS[model]
        gen = torch.Generator(device="cuda").manual_seed(0)
        w13, w2 = fp8_weights(e, 2 * i, h, gen), fp8_weights(e, h, i, gen)
        for per_expert in map(int, args.rows_per_expert.split(",")):
            t = per_expert * e // k
            x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
            ids = torch.rand(t, e, device="cuda", generator=gen).topk(k, dim=-1).indices
            w = torch.softmax(torch.randn(t, k, device="cuda", generator=gen), dim=-1)
            row = {"model": model, "tokens": t, "rows_per_expert": per_expert, "activation": args.activation}
            row.update(us={}, eager_us={})
            row["auto_is_gluon"] = prefers_fp8_moe_experts(t, k, e, h, i)
            outs = {}
            for form in forms:
                backend = None if form == "auto" else "gluon" if form in FORCED else form
                call = lambda b=backend, a=(x, ids, w, w13, w2): tilegemm.fp8_moe_experts(  # noqa: E731
                    *a, activation=args.activation, backend=b
                )
                with forced_designs(form):
                    outs[form] = call()
                    row["us"][form] = timing.graph_ms(call, 1, budget_ms=args.budget_ms) * 1e3
                    row["eager_us"][form] = timing.eager_ms(call, args.budget_ms) * 1e3
            row["calc_diff_gluon_cutile"] = calc_diff(outs["gluon"], outs["cutile"])
            row["calc_diff_to_cutile"] = {f: calc_diff(outs[f], outs["cutile"]) for f in forms if f != "cutile"}
            row["ok"] = all(v < FP8_BAR for v in row["calc_diff_to_cutile"].values())
            row["gluon_speedup"] = row["us"]["cutile"] / row["us"]["gluon"]
            row["gluon_speedup_eager"] = row["eager_us"]["cutile"] / row["eager_us"]["gluon"]
            flops = 2 * t * k * 3 * h * i
            row["tflops"] = {f: flops / row["us"][f] / 1e6 for f in forms}
            results.append(row)
            print(f"{model:>14} T={t:6d} ({per_expert:4d}/expert) cutile {row['us']['cutile']:9.1f} us  gluon "
                  f"{row['us']['gluon']:9.1f} us  x{row['gluon_speedup']:.2f} (eager x{row['gluon_speedup_eager']:.2f})"
                  + "".join(f"  {f} {row['us'][f]:.1f} us" for f in forms[3:])
                  + f"  diff {row['calc_diff_gluon_cutile']:.1e}  [{time.time() - t0:.0f} s]", flush=True)  # fmt: skip
        w13 = w2 = outs = None
        torch.cuda.empty_cache()
    meta = {
        **device.describe(),
        "forms": "cutile: fused epilogue (ops/cutile/moe_fp8.py); gluon: m-grouped GEMMs (ops/gluon/moe_fp8.py); "
        "auto: the public call with default settings; gluon128 / gluon64: the gluon form with its designs forced "
        f"({FORCED})",
        "timing": "us: one call in a CUDA graph, replay median, L2 flushed before each; eager_us: L2 flushed too",
        "tflops": "2 * T * k * 3 * H * I / kernel-only time (routed rows only)",
        "seconds": round(time.time() - t0, 1),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    head = "".join(f" {f + ' us':>12}" for f in forms)
    print(f"\n{'model':>14} {'T':>6} {'r/e':>5}{head} {'x':>6} {'x eag':>6}")
    for r in results:
        cells = "".join(f" {r['us'][f]:12.1f}" for f in forms)
        print(f"{r['model']:>14} {r['tokens']:6d} {r['rows_per_expert']:5d}{cells} {r['gluon_speedup']:6.2f} "
              f"{r['gluon_speedup_eager']:6.2f}{'' if r['ok'] else '  DIFF'}")  # fmt: skip
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
