"""cuBLAS's kernels on the dense BF16 rows where tilegemm is below 0.93x cuBLAS, and one off the set (2056 rows).

``python3 benchmarks/gluon/cublas_kernels_probe.py OUT.json`` on a GPU (torch only). Each shape's ``torch.matmul``
(bf16, B transposed: the NT GEMM) runs 20 times under torch's profiler; the JSON holds every CUDA kernel it launched
with its mean device microseconds. cuBLAS's Hopper kernel names carry the CTA tile (``nvjet_sm90_tst_192x176_...``:
192 x 176), the K step and stages (``64x4``) and the cluster (``1x2``).
"""

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = [
    (512, 2048, 768),
    (256, 1536, 2048),
    (512, 1536, 2048),
    (2048, 1536, 2048),
    (128, 4096, 7168),
    (4096, 2112, 7168),
    (2048, 2112, 7168),
    (2056, 2112, 7168),
    (512, 7168, 2048),
    (128, 7168, 16384),
    (128, 24576, 1536),
    (256, 7168, 2048),
    (2048, 4096, 7168),
    (2048, 7168, 2048),
    (256, 2048, 768),
    (32, 2112, 7168),
    (16, 1536, 2048),
]
out = []
for m, n, k in SHAPES:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            torch.matmul(a, b.t())
        torch.cuda.synchronize()
    kern = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kern.setdefault(e.name, []).append(e.device_time_total)
    calls = {name: {"calls": len(v), "us_per_call": sum(v) / len(v)} for name, v in kern.items()}
    row = {"shape": [m, n, k], "kernels": calls}
    out.append(row)
    named = "; ".join(f"{nm[:90]} x{d['calls']} {d['us_per_call']:.1f}us" for nm, d in calls.items())
    print(m, n, k, named, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
