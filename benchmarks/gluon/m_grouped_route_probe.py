"""Which kernels the m-grouped contiguous FP8 op launches through the automatic choice and forced to gluon, and
their GPU times (torch.profiler), on one row of the benchmark set: to explain a gap between the two routes.

    PYTHONPATH=src:. python3 benchmarks/gluon/m_grouped_route_probe.py [GROUPS M N K]
"""

from __future__ import annotations

import sys

import torch

import tilegemm
from benchmarks.gluon.grouped_sweep import m_indices, operands


def main() -> None:
    groups, m, n, k = (int(x) for x in (sys.argv[1:] or ["4", "8192", "4096", "7168"]))
    index = m_indices([m] * groups)
    a, b = operands(index, groups, n, k, seed=1)
    d = torch.empty(index.numel(), n, device="cuda", dtype=torch.bfloat16)
    op = tilegemm.m_grouped_fp8_gemm_nt_contiguous
    outs = {}
    for backend in (None, "gluon"):
        for _ in range(3):
            op(a, b, d, index, backend=backend)
        torch.cuda.synchronize()
        outs[backend] = d.clone()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                op(a, b, d, index, backend=backend)
            torch.cuda.synchronize()
        print(f"== backend={backend}")
        for e in prof.key_averages():
            if e.device_time_total > 0:
                print(f"  {e.count:3d} x {e.device_time_total / e.count:9.1f} us  {e.key[:110]}")
    print("outputs equal:", torch.equal(outs[None], outs["gluon"]))


if __name__ == "__main__":
    main()
