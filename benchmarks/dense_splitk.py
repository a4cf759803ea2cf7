"""Dense GEMMs that the tile kernel splits along K: kernel-only times of this tree's tilegemm next to torch.matmul.

Usage (GPU; run it once per tree to compare two versions): ``python benchmarks/dense_splitk.py OUT.json``.
Each row: calc_diff against the float64 formula (FP8: of the dequantized operands), whether a rerun is
bitwise identical, tilegemm's kernel-only microseconds (5 calls per CUDA graph) and, for BF16, torch.matmul's.
Results: ``benchmarks/results/dense_splitk/``.
"""

from __future__ import annotations

import json
import sys

import torch

import tilegemm as tg
from tilegemm.bench import timing
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token

#: (M, N, K) per dtype: split along K on an H100 (132 SMs) when measured, the K = 2048 ones no longer since
#: ``heuristics.SPLIT_MIN_K``.
SHAPES = {
    "bf16": [
        (384, 1536, 7168),
        (512, 2048, 7168),
        (512, 1024, 7168),
        (512, 512, 7168),
        (1024, 1024, 16384),
        (2048, 512, 2048),
        (512, 1536, 2048),
    ],
    "fp8": [(512, 1536, 7168), (512, 1024, 7168), (1024, 512, 7168), (384, 2112, 7168)],
}


def row(dtype: str, m: int, n: int, k: int) -> dict:
    """One shape: correctness, rerun identity and kernel-only times."""
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda")
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    peer = None
    if dtype == "bf16":
        a16, b16 = a.bfloat16(), b.bfloat16()
        call = lambda: tg.bf16_gemm_nt(a16, b16, d)  # noqa: E731
        peer = lambda: torch.matmul(a16, b16.t())  # noqa: E731
        ref = a16.double() @ b16.double().t()
    else:
        qa, qb = tg.per_token_cast_to_fp8(a), tg.per_block_cast_to_fp8(b)
        call = lambda: tg.fp8_gemm_nt(qa, qb, d)  # noqa: E731
        ref = dequant_per_token(*qa) @ dequant_per_block(*qb).t()
    call()
    torch.cuda.synchronize()
    first = d.clone()
    out = {"dtype": dtype, "m": m, "n": n, "k": k, "calc_diff": calc_diff(d, ref)}
    call()
    torch.cuda.synchronize()
    out["bitwise_rerun"] = bool(torch.equal(first, d))
    out["us"] = timing.graph_ms(call, 5) * 1e3
    if peer is not None:
        out["torch_us"] = timing.graph_ms(peer, 5) * 1e3
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not torch.cuda.is_available():
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for dtype, shapes in SHAPES.items():
        for m, n, k in shapes:
            rows.append(row(dtype, m, n, k))
            print(json.dumps(rows[-1]), flush=True)
    with open(argv[0], "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
