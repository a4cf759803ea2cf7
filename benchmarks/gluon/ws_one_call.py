"""One ``fp8_gemm_ws`` call of a design at M N K, for Nsight Compute: three warm-up calls, then the profiled one.

``python3 benchmarks/gluon/ws_one_call.py DESIGN M N K`` (``DESIGN``: a ``fp8_gemm_ws.VARIANTS`` name), e.g. under
``ncu -k regex:fp8_gemm_ws_kernel --launch-skip 3 --launch-count 1``.
"""

from __future__ import annotations

import sys

import torch

import tilegemm
from tilegemm.ops.gluon import fp8_gemm_ws as ws


def main() -> None:
    name, m, n, k = sys.argv[1], *map(int, sys.argv[2:5])
    qa, sa = tilegemm.per_token_cast_to_fp8(torch.randn(m, k, device="cuda"))
    qb, sb = tilegemm.per_block_cast_to_fp8(torch.randn(n, k, device="cuda"))
    a, b = (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    plan = ws.ws_plan(a, b, d, ws.VARIANTS[name])
    for _ in range(4):
        plan(a, b, d)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
