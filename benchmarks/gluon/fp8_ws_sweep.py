"""Time the prototype gluon FP8 kernel (``fp8_gemm_ws``) designs beside the gluon kernel, cutile and DeepGEMM.

Run on the H200 machine (``source .devbundle/setup.sh``; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/fp8_ws_sweep.py OUT.json [--variants a_128x128,b_256x128] [--quick]
        [--rows set|unseen|few | --shapes 256x2048x768,...] [--no-gluon] [--no-cutile] [--repeat N]

Every implementation's output on a row is compared with the float64 formula (``calc_diff``) before it is timed;
timing is kernel-only: CUDA-graph replay of calls over input sets rotated past L2, median per call (``--repeat N``:
the columns timed in turn N times, the median kept, so that the clocks' drift in a long run of large GEMMs reaches
every column alike). A row whose
turn would start after ``--budget-s`` seconds is skipped, so the run ends within about four minutes. Prints a
table (TFLOP/s, and each implementation's geomean ratio to DeepGEMM) last and writes everything to OUT.json.
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
from tilegemm.heuristics.gluon import GluonDenseConfig
from tilegemm.ops.gluon import fp8_gemm_ws as ws
from tilegemm.ops.gluon import gemm as ggemm
from tilegemm.testing import dequant_per_block, dequant_per_token

#: DeepSeek-V3 (N, K) pairs at M 256..8192: ten rows.
ROWS = [
    (256, 2112, 7168),
    (256, 7168, 2048),
    (1024, 24576, 1536),
    (1024, 4096, 7168),
    (2048, 7168, 16384),
    (4096, 2112, 7168),
    (4096, 24576, 1536),
    (4096, 7168, 2048),
    (8192, 4096, 7168),
    (8192, 7168, 16384),
]
QUICK = [ROWS[1], ROWS[3], ROWS[7], ROWS[8]]
#: Shapes outside the benchmark set (``--rows unseen``): rows 640..12288, M not always a multiple of 128.
UNSEEN = [
    (640, 6144, 4096),
    (1000, 5120, 5120),
    (1536, 3584, 8192),
    (2500, 4096, 4096),
    (3072, 12288, 4096),
    (5000, 2048, 6144),
    (6144, 8192, 3072),
    (8000, 1536, 7168),
    (12288, 4096, 4096),
    (12288, 14336, 4096),
]
#: Few-tile rows (``--rows few``): M 128-512, where 128-row tiles leave SMs idle (64 on 132 for 200x4096).
FEW = [
    (128, 4096, 7168),
    (200, 4096, 8192),
    (256, 2112, 7168),
    (256, 4096, 7168),
    (256, 7168, 2048),
    (320, 6144, 4096),
    (384, 2112, 7168),
    (384, 3072, 8192),
    (512, 1536, 2048),
    (512, 2048, 768),
    (512, 2112, 7168),
    (512, 4096, 7168),
]

#: The design probes' rows (``multicast_probe.py``, ``wg_split_probe.py``; first in
#: ``../results/gluon/multicast_probe_h200.md``): DeepSeek-V3 shapes, M >= 512.
DESIGN_ROWS = [
    (4096, 7168, 2048),
    (4096, 2112, 7168),
    (4096, 24576, 1536),
    (4096, 7168, 16384),
    (8192, 4096, 7168),
    (2048, 7168, 2048),
    (512, 7168, 2048),
    (8192, 2112, 7168),
]
#: The design probes' check shapes: a CTA past M, a partial cluster tile and K block, several tiles a cluster.
DESIGN_CHECKS = [(256, 128, 128), (128, 256, 384), (1100, 1096, 1040), (2048, 7168, 2048)]


def quant(m: int, n: int, k: int, seed: int):
    """DeepGEMM's recipe: A 1x128 per row (scales MN-major, TMA-aligned), B 128x128 blocks."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    xa = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    xb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    qa, sa = tilegemm.per_token_cast_to_fp8(xa)
    qb, sb = tilegemm.per_block_cast_to_fp8(xb)
    return (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb)


def reference(a, b) -> torch.Tensor:
    return dequant_per_token(*a).double() @ dequant_per_block(*b).double().t()


def row_inputs(m: int, n: int, k: int):
    """A row's inputs: up to 4 quantized input sets (enough to rotate past L2), a bf16 D [m, n], the float64
    reference of the first set, and the row's empty result record (``sweep_table.timed`` fills it)."""
    nsets = min(4, timing.rotation_count(m * k + n * k + 2 * m * n))
    sets = [quant(m, n, k, 7 * s + 1) for s in range(nsets)]
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    row = {"m": m, "n": n, "k": k, "tflops": {}, "us": {}, "diff": {}, "error": {}}
    return sets, d, reference(*sets[0]), row


def ws_design(a, b, *, d, cfg):
    """One call of the ws kernel's design ``cfg`` (a plan made for the call, so the first launch path, triton's JIT,
    runs each time: under CUDA-graph timing that costs nothing)."""
    return ws.ws_plan(a, b, d, cfg)(a, b, d)


def _gluon(a, b, *, d):
    """The first gluon kernel (``fp8_gemm_kernel``): a config given, the backend does not take the ws kernel."""
    return ggemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), beta=0.0, config=GluonDenseConfig())


def _public(a, b, *, d):
    """The public API with default settings (the automatic backend choice)."""
    return tilegemm.fp8_gemm_nt(a, b, d)


def _cutile(a, b, *, d):
    return tilegemm.fp8_gemm_nt(a, b, d, backend="cutile")


def _deepgemm(dg, a, b, *, d):
    return dg.fp8_gemm_nt(a, b, d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument(
        "--variants",
        default=",".join(ws.VARIANTS),
        help="comma-separated ws.VARIANTS names, name:field=value to vary one",
    )
    parser.add_argument("--quick", action="store_true", help="four rows instead of ten")
    parser.add_argument("--rows", choices=("set", "unseen", "few"), default="set", help="ROWS, UNSEEN or FEW")
    parser.add_argument("--shapes", default="", help="comma-separated MxNxK rows instead of --rows")
    parser.add_argument("--budget-s", type=float, default=210.0, help="start no row after this many seconds")
    parser.add_argument("--no-gluon", action="store_true", help="leave out fp8_gemm_kernel (the first gluon kernel)")
    parser.add_argument("--no-cutile", action="store_true", help="leave out the public op forced onto cutile")
    parser.add_argument("--repeat", type=int, default=1, help="time the columns in turn this many times (median)")
    parser.add_argument("--rep-ms", type=float, default=25.0, help="timing budget of one implementation on a row")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    t0 = time.time()
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, flush=True)
    rows = []
    shapes = parse_shapes(args.shapes) or {"set": ROWS, "unseen": UNSEEN, "few": FEW}[args.rows]
    for m, n, k in QUICK if args.quick else shapes:
        if time.time() - t0 > args.budget_s:
            print(f"skipping {m}x{n}x{k}: past the {args.budget_s:.0f} s budget", flush=True)
            continue
        sets, d, ref, row = row_inputs(m, n, k)
        columns = {name: functools.partial(ws_design, d=d, cfg=design_config(ws.VARIANTS, name)) for name in names}
        if not args.no_gluon:
            columns["gluon"] = functools.partial(_gluon, d=d)
        columns["tilegemm"] = functools.partial(_public, d=d)
        if not args.no_cutile:
            columns["cutile"] = functools.partial(_cutile, d=d)
        if dg is not None:
            columns["deepgemm"] = functools.partial(_deepgemm, dg, d=d)
        timed_in_turn(row, columns, sets, d, ref, args.rep_ms, args.repeat)
        rows.append(row)
        progress(row, t0, 1e-3)
        del sets, ref
        torch.cuda.empty_cache()
    meta = {
        **device.describe(),
        "deepgemm": why,
        "rows": args.shapes or args.rows,
        "variants": {name: design_config(ws.VARIANTS, name)._asdict() for name in names},
        "columns": "ws designs; gluon: fp8_gemm_kernel; tilegemm: fp8_gemm_nt, default settings; cutile; deepgemm",
        "timing": "CUDA-graph replay median per call, input sets rotated past L2, kernel-only",
        "seconds": round(time.time() - t0, 1),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    impls = names + ([] if args.no_gluon else ["gluon"]) + ["tilegemm"] + ([] if args.no_cutile else ["cutile"])
    impls += ["deepgemm"]
    print_table(rows, impls, "deepgemm", "DeepGEMM")
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
