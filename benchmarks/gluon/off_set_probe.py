"""Time dense calls off the benchmark set through the public op: the gluon ws kernel and cutile's kernels, both
forced, beside the automatic choice, DeepGEMM and (BF16) cuBLAS, eager and kernel-only.

Run on the H200 machine (``source .devbundle/setup.sh``; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    PYTHONPATH=src:benchmarks/gluon python3 benchmarks/gluon/off_set_probe.py OUT.json [--dtype fp8|bf16]
        [--shapes 264x2112x7168,...] [--pairs 2]

The default rows: FP8 calls whose ws tiling fills 0.5-0.75 of the SMs in one round (M 192-320), BF16 calls whose
last row tile is mostly empty. Each row: random operands (FP8: quantized with DeepGEMM's recipe), every
implementation's output checked against the float64 formula (``calc_diff``), then eager (``timing.eager_ms``: L2
flushed before each call) and kernel-only (``timing.graph_ms``: 20 calls a CUDA graph) times, the implementations
alternating ``--pairs`` times. ``gluon`` is the op with ``backend="gluon"``, which runs the ws kernel in the design
the rule picks; the row also records that design, its tile count per SM and whether the automatic choice takes the
gluon kernel. Prints a table last and writes every time to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from fp8_ws_sweep import quant, reference
from sweep_table import parse_shapes

import tilegemm
from tilegemm.bench import peers, timing
from tilegemm.heuristics import gluon as rules
from tilegemm.ops import operands
from tilegemm.ops.gluon import bf16_gemm_ws as bw
from tilegemm.testing import calc_diff

#: FP8: M 192-383 rows whose ws tiling fills 0.5-0.75 of the 132 SMs of an H200 in one round; BF16: rows whose
#: last row tile holds 8-72 rows
SHAPES = {
    "fp8": "264x2112x7168,300x2112x7168,320x2112x4096,256x2560x7168,230x2304x7168,192x3072x7168,192x4096x7168,"
    "192x4096x4096,288x2048x7168,256x2304x7168",
    "bf16": "136x2112x7168,200x2112x7168,264x2112x7168,392x2112x7168,136x4096x7168,200x1024x7168,1000x4096x7168,"
    "2056x2112x7168",
}
CALLS = 20  # calls a CUDA graph


def _calls(dtype: str, a, b, d, dg) -> dict:
    """The timed implementations of one row by name: gluon and cutile forced, the automatic choice, DeepGEMM, and for
    BF16 cuBLAS (``torch.matmul`` into D)."""
    op = tilegemm.fp8_gemm_nt if dtype == "fp8" else tilegemm.bf16_gemm_nt
    calls = {
        "gluon": lambda: op(a, b, d, backend="gluon"),
        "cutile": lambda: op(a, b, d, backend="cutile"),
        "tilegemm": lambda: op(a, b, d),
    }
    if dtype == "bf16":
        calls["cublas"] = lambda: torch.matmul(a, b.t(), out=d)
    if dg is not None:
        calls["deepgemm"] = lambda: getattr(dg, f"{dtype}_gemm_nt")(a, b, d)
    return calls


def _operands(dtype: str, m: int, n: int, k: int):
    """(A, B, the float64 product) of one row."""
    if dtype == "fp8":
        a, b = quant(m, n, k, seed=m + n + k)
        return a, b, reference(a, b)
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    return a, b, a.double() @ b.double().t()


def _design(dtype: str, m: int, n: int, k: int, sms: int) -> tuple[str, int, bool]:
    """(the ws design the rule picks, its output tiles, whether the automatic choice takes the gluon kernel)."""
    if dtype == "fp8":
        design, tiles = rules.dense_fp8_ws_tiling(m, n, k, sms)
        return design, tiles, rules.ws_kernel_faster(m, n, k, sms)
    design = rules.dense_bf16_ws_design(m, n, k, sms)
    cfg = bw.VARIANTS[design]
    tiles = operands.cdiv(m, cfg.block_m) * operands.cdiv(n, cfg.block_n)
    return design, tiles, rules.prefers_dense_bf16(m, n, k, sms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8")
    parser.add_argument("--shapes", default="", help="comma-separated MxNxK rows (default: the dtype's SHAPES)")
    parser.add_argument("--pairs", type=int, default=2, help="alternate timings of each implementation")
    args = parser.parse_args()
    dg, dg_note = peers.load_deepgemm("auto")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m, n, k in parse_shapes(args.shapes or SHAPES[args.dtype]):
        a, b, ref = _operands(args.dtype, m, n, k)
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        calls = _calls(args.dtype, a, b, d, dg)
        design, tiles, auto = _design(args.dtype, m, n, k, sms)
        row = {"dtype": args.dtype, "m": m, "n": n, "k": k, "design": design, "tiles_per_sm": round(tiles / sms, 3)}
        row["auto_takes_ws"] = auto
        row.update({"diff": {}, "eager_us": {x: [] for x in calls}, "graph_us": {x: [] for x in calls}})
        for name, fn in calls.items():
            d.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            row["diff"][name] = calc_diff(d, ref)
        for _ in range(args.pairs):
            for name, fn in calls.items():
                row["eager_us"][name].append(1e3 * timing.eager_ms(fn))
                row["graph_us"][name].append(1e3 * timing.graph_ms(fn, CALLS))
        rows.append(row)
        best_us = {x: round(min(t), 1) for x, t in row["graph_us"].items()}
        print(f"{m}x{n}x{k}", design, row["tiles_per_sm"], best_us, flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": sms, "deepgemm": dg_note}
    meta["date"] = time.strftime("%Y-%m-%d %H:%M")
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    peer = "cublas" if args.dtype == "bf16" else "deepgemm"
    print(f"\n| M x N x K | ws design | tiles/SM | auto takes gluon | gluon / cutile eager | kernel-only | "
          f"tilegemm / {peer} eager | kernel-only |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        med = {kind: {x: statistics.median(t) for x, t in r[kind].items()} for kind in ("eager_us", "graph_us")}
        e, g = med["eager_us"], med["graph_us"]
        vs_e = f"{e[peer] / e['tilegemm']:.2f}" if peer in e else "-"
        vs_g = f"{g[peer] / g['tilegemm']:.2f}" if peer in g else "-"
        print(f"| {r['m']}x{r['n']}x{r['k']} | {r['design']} | {r['tiles_per_sm']} | {r['auto_takes_ws']} | "
              f"{e['cutile'] / e['gluon']:.2f} | {g['cutile'] / g['gluon']:.2f} | {vs_e} | {vs_g} |")  # fmt: skip


if __name__ == "__main__":
    main()
