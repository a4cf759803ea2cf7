"""Where the fused FP8 experts' time goes, kernel by kernel, on both forms (cutile and gluon).

Run on the H200 machine (``source .devbundle/setup.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/moe_fp8_profile.py OUT.json [--rows model:tokens,...]

Each row: the inputs of ``benchmarks/gluon/moe_fp8_sweep.py``; five calls of each form under ``torch.profiler`` (after
two outside it), the CUDA kernels' time summed by kernel name and divided by five. Prints a table per row and writes
OUT.json.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from moe_fp8_sweep import fp8_weights

import tilegemm
from tilegemm.bench import device
from tilegemm.bench.moe import MODELS

ROWS = "qwen3-30b-a3b:4096,mixtral-8x7b:512,deepseek-v3:4096"
CALLS = 5


def kernel_times(call) -> dict[str, float]:
    """Microseconds per call of each CUDA kernel ``call`` launches (summed over its launches)."""
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            out[event.name[:60]] += event.device_time / CALLS
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rows", default=ROWS)
    args = parser.parse_args()
    results = []
    for item in args.rows.split(","):
        model, tokens = item.split(":")
        t = int(tokens)
        h, e, k, i, _ = MODELS[model]
        gen = torch.Generator(device="cuda").manual_seed(0)
        w13, w2 = fp8_weights(e, 2 * i, h, gen), fp8_weights(e, h, i, gen)
        x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
        ids = torch.rand(t, e, device="cuda", generator=gen).topk(k, dim=-1).indices
        w = torch.softmax(torch.randn(t, k, device="cuda", generator=gen), dim=-1)
        row = {"model": model, "tokens": t}
        for form in ("cutile", "gluon"):
            inputs = (x, ids, w, w13, w2)
            times = kernel_times(lambda form=form, a=inputs: tilegemm.fp8_moe_experts(*a, backend=form))
            row[form] = times
            print(f"\n{model} T={t} {form}: {sum(times.values()):.1f} us of kernels")
            for name, us in times.items():
                print(f"  {us:9.1f}  {name}")
        results.append(row)
    meta = {**device.describe(), "calls": CALLS}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
