"""The fused FP8 experts' cutile form with and without the division's slow path on its tiles' zero padding.

``tile_lib.fp8_quantize`` casts a tile's zero elements without dividing them by the row's scale (the IEEE division's
slow path takes a zero dividend). Its MoE kernels cast gathered rows in blocks of 64 (or swap-AB 16) rows, and an
expert's last block is zero padding past its routed rows; at decode sizes most of every block is. This probe times
``tilegemm.fp8_moe_experts`` through the public API (``backend="cutile"`` and the default) in one process; run it
twice, the second time with ``--slow-division``, which puts back the plain ``v / scale`` before any kernel compiles
(the formula before the change):

    PYTHONPATH=src python3 benchmarks/gluon/moe_fp8_cast_probe.py OUT.json [--slow-division]

Rows: two of the benchmark set's MoE models (``tilegemm.bench.moe.MODELS``) at decode and prefill token counts, the
routing a top-k of random scores. Kernel-only (one call captured in a CUDA graph, replays timed, L2 flushed before
each) and eager. Prints a line per row and writes every number to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import time

import cuda.tile as ct
import torch
from moe_fp8_sweep import fp8_weights  # the sibling sweep's weights (this script's folder is on sys.path)

import tilegemm
from tilegemm.bench import device, timing
from tilegemm.bench.moe import MODELS
from tilegemm.ops.common import AMAX_EPS, FP8_MAX
from tilegemm.ops.cutile import tile_lib

#: (model, token counts)
ROWS = {"qwen3-30b-a3b": (1, 8, 32, 256, 512, 1024), "mixtral-8x7b": (1, 8, 64, 128, 256, 512)}
FORMS = {"cutile": "cutile", "auto": None}


def _fp8_quantize_dividing(v, axis: int):
    """``tile_lib.fp8_quantize`` as it was: every element divided by the scale, zeros included."""
    amax = ct.max(ct.abs(v), axis=axis, keepdims=True)
    scale = ct.maximum(amax, AMAX_EPS) / FP8_MAX
    q = ct.minimum(ct.maximum(v / scale, -FP8_MAX), FP8_MAX)
    return ct.astype(q, ct.float8_e4m3fn), scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--slow-division", action="store_true", help="the cast as it was (zeros divided)")
    parser.add_argument("--budget-ms", type=float, default=300.0, help="timing budget per measurement")
    args = parser.parse_args()
    if args.slow_division:
        tile_lib.fp8_quantize = _fp8_quantize_dividing
    t0, results = time.time(), []
    for model, token_counts in ROWS.items():
        h, e, k, i, _ = MODELS[model]
        gen = torch.Generator(device="cuda").manual_seed(0)
        w13, w2 = fp8_weights(e, 2 * i, h, gen), fp8_weights(e, h, i, gen)
        for t in token_counts:
            x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
            ids = torch.rand(t, e, device="cuda", generator=gen).topk(k, dim=-1).indices
            w = torch.softmax(torch.randn(t, k, device="cuda", generator=gen), dim=-1)
            row = {"model": model, "tokens": t, "us": {}, "eager_us": {}}
            for form, backend in FORMS.items():
                call = lambda b=backend, a=(x, ids, w, w13, w2): tilegemm.fp8_moe_experts(*a, backend=b)  # noqa: E731
                call()
                row["us"][form] = timing.graph_ms(call, 1, budget_ms=args.budget_ms) * 1e3
                row["eager_us"][form] = timing.eager_ms(call, args.budget_ms) * 1e3
            results.append(row)
            cells = "  ".join(f"{f} {row['us'][f]:8.1f} us (eager {row['eager_us'][f]:8.1f})" for f in FORMS)
            print(f"{model:>14} T={t:5d}  {cells}  [{time.time() - t0:.0f} s]", flush=True)
        w13 = w2 = None
        torch.cuda.empty_cache()
    meta = {**device.describe(), "slow_division": args.slow_division, "seconds": round(time.time() - t0, 1)}
    meta["timing"] = "us: one call in a CUDA graph, replay median, L2 flushed before each; eager_us: L2 flushed too"
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
