"""One FP8 GEMM call of ``impl`` at M N K, for Nsight Compute to profile.

``python3 benchmarks/gluon/fp8_profile.py IMPL M N K [block_n,stages,group_m,order]``: three warm-up calls, then one.
IMPL: ``gluon`` (``fp8_gemm_kernel``, the config given), ``tilegemm`` (the public op, default settings), ``cutile``,
``ws:DESIGN`` (a design of ``fp8_gemm_ws.VARIANTS``) or ``deepgemm``.
"""

from __future__ import annotations

import sys

import torch

import tilegemm
from tilegemm.bench import peers
from tilegemm.heuristics.gluon import GluonDenseConfig
from tilegemm.ops.gluon import fp8_gemm_ws as ws
from tilegemm.ops.gluon import gemm as ggemm


def main() -> None:
    impl, m, n, k = sys.argv[1], *map(int, sys.argv[2:5])
    cfg = GluonDenseConfig(*map(int, sys.argv[5].split(","))) if len(sys.argv) > 5 else None
    xa = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    qa, sa = tilegemm.per_token_cast_to_fp8(xa)
    qb, sb = tilegemm.per_block_cast_to_fp8(xb)
    a, b = (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if impl == "gluon":
        fn = lambda: ggemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), beta=0.0, config=cfg)  # noqa: E731
    elif impl == "tilegemm":
        fn = lambda: tilegemm.fp8_gemm_nt(a, b, d)  # noqa: E731
    elif impl.startswith("ws:"):
        plan = ws.ws_plan(a, b, d, ws.VARIANTS[impl[3:]])
        fn = lambda: plan(a, b, d)  # noqa: E731
    elif impl == "cutile":
        fn = lambda: tilegemm.fp8_gemm_nt(a, b, d, backend="cutile")  # noqa: E731
    else:
        dg, why = peers.load_deepgemm("auto")
        fn = lambda: dg.fp8_gemm_nt(a, b, d)  # noqa: E731
    for _ in range(4):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
