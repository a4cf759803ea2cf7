"""The fused FP8 experts' cutile form with and without the zero select in its casts.

``tile_lib.fp8_quantize_padded`` casts a tile's zero elements without dividing them by the row's scale (the IEEE
division's slow path takes a zero dividend); ``tile_lib.fp8_quantize``, which the MoE kernels use, divides every
element. The MoE kernels cast gathered rows in blocks of 64 (or swap-AB 16) rows, and an expert's last block is zero
padding past its routed rows. This probe times ``tilegemm.fp8_moe_experts`` through the public API
(``backend="cutile"`` and the default) in one process; run it twice, the second time with ``--select``, which makes
the MoE kernels' cast the select (``fp8_quantize`` replaced by ``fp8_quantize_padded`` before any kernel compiles):

    PYTHONPATH=src python3 benchmarks/gluon/moe_fp8_cast_probe.py OUT.json [--select]

(The results of 2026-11-30 were taken while ``fp8_quantize`` itself held the select; their ``--slow-division``
runs, ``"slow_division": true``, are the plain division the MoE kernels use now.)

Rows: two of the benchmark set's MoE models (``tilegemm.bench.moe.MODELS``) at decode and prefill token counts, the
routing a top-k of random scores. Kernel-only (one call captured in a CUDA graph, replays timed, L2 flushed before
each) and eager. Prints a line per row and writes every number to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from moe_fp8_sweep import fp8_weights  # the sibling sweep's weights (this script's folder is on sys.path)

import tilegemm
from tilegemm.bench import device, timing
from tilegemm.bench.moe import MODELS
from tilegemm.ops.cutile import tile_lib

#: (model, token counts)
ROWS = {"qwen3-30b-a3b": (1, 8, 32, 256, 512, 1024), "mixtral-8x7b": (1, 8, 64, 128, 256, 512)}
FORMS = {"cutile": "cutile", "auto": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--select", action="store_true", help="the MoE kernels' cast with the zero select")
    parser.add_argument("--budget-ms", type=float, default=300.0, help="timing budget per measurement")
    args = parser.parse_args()
    if args.select:
        tile_lib.fp8_quantize = tile_lib.fp8_quantize_padded
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
    meta = {**device.describe(), "select": args.select, "seconds": round(time.time() - t0, 1)}
    meta["timing"] = "us: one call in a CUDA graph, replay median, L2 flushed before each; eager_us: L2 flushed too"
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
