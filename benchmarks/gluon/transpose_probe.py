"""How fast the FP8 transposing copy runs, and what share of a ``tn`` k-grouped call it is.

The ``tn`` k-grouped FP8 op transposes A [K_sum, M] and B [K_sum, N] into K-major copies before the GEMM
(``ops/gluon/transpose.transposed``). This probe times, on one GPU, in one process:

- ``clone``: a plain copy of the same bytes (the bandwidth a transpose can hope for);
- ``library``: ``transposed`` as shipped;
- tile variants of the same kernel (tile rows x tile columns, warps), each checked bitwise against
  ``x.t().contiguous()`` first;
- the public ``k_grouped_fp8_gemm_tn_contiguous`` on the same operands (default settings), kernel time by CUDA
  events, so the transposes' share of the call is read off the same run.

Usage: ``python benchmarks/gluon/transpose_probe.py [--out FILE]`` (a GPU with gluon). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import tilegemm
from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.gluon.transpose import transposed
from tilegemm.ops.operands import cdiv


@gluon.jit
def _transpose(src, dst, rows, cols, TR: gl.constexpr, TC: gl.constexpr, V: gl.constexpr):
    """``dst[c, r] = src[r, c]`` over a [TR, TC] tile, 16 bytes an access each way, each thread holding ``V`` rows
    of 16 bytes as loaded and ``V`` columns of 16 as stored (the library's kernel is ``V`` = 1 at 128x128)."""
    along_cols: gl.constexpr = gl.BlockedLayout([V, 16], [32 // (TC // 16), TC // 16], [gl.num_warps(), 1], [1, 0])
    along_rows: gl.constexpr = gl.BlockedLayout([16, V], [TR // 16, 32 // (TR // 16)], [1, gl.num_warps()], [0, 1])
    r = gl.program_id(0) * TR + gl.arange(0, TR, layout=gl.SliceLayout(1, along_cols))
    c = gl.program_id(1) * TC + gl.arange(0, TC, layout=gl.SliceLayout(0, along_cols))
    inside = (r < rows)[:, None] & (c < cols)[None, :]
    tile = gl.load(src + r.to(gl.int64)[:, None] * cols + c[None, :], mask=inside)
    tile = gl.convert_layout(tile, along_rows)
    r = gl.program_id(0) * TR + gl.arange(0, TR, layout=gl.SliceLayout(1, along_rows))
    c = gl.program_id(1) * TC + gl.arange(0, TC, layout=gl.SliceLayout(0, along_rows))
    inside = (r < rows)[:, None] & (c < cols)[None, :]
    gl.store(dst + c.to(gl.int64)[None, :] * rows + r[:, None], tile, mask=inside)


VARIANTS = {  # name -> (tile rows, tile columns, warps, rows a thread holds)
    "t64x64_w4": (64, 64, 4, 1),
    "t128x128_w4": (128, 128, 4, 1),
    "t128x128_w8": (128, 128, 8, 1),
    "t256x128_w8": (256, 128, 8, 1),
    "t128x256_w8": (128, 256, 8, 1),
    "t256x256_w8": (256, 256, 8, 1),
    "t128x128_w4_v4": (128, 128, 4, 4),
    "t128x128_w8_v4": (128, 128, 8, 4),
    "t256x256_w8_v4": (256, 256, 8, 4),
    "t128x128_w4_v2": (128, 128, 4, 2),
}


def variant_call(tr: int, tc: int, warps: int, v: int):
    def run(x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        out = torch.empty(cols, rows, dtype=x.dtype, device=x.device)
        grid = (cdiv(rows, tr), cdiv(cols, tc))
        _transpose[grid](
            x.view(torch.uint8), out.view(torch.uint8), rows, cols, tr, tc, v, num_warps=warps, **COMPILE_OPTIONS
        )
        return out

    return run


def time_us(fn, reps: int = 15) -> float:
    """Median microseconds of ``fn()`` by CUDA events, one call each (operands past L2: 128-224 MB)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def measure(groups: int, kg: int, m: int, n: int) -> dict:
    """One ``tn`` row's operands (``groups`` groups of K ``kg``, A [K_sum, m], B [K_sum, n]): every transpose
    column on A and on B, and the public op."""
    ks = [kg] * groups
    k_sum = sum(ks)
    a = torch.randn(k_sum, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k_sum, n, device="cuda", dtype=torch.bfloat16)
    qa_t, sa_t = tilegemm.per_token_cast_to_fp8(a.t())
    qb_t, sb_t = tilegemm.per_token_cast_to_fp8(b.t())
    qa, sa = qa_t.t().contiguous(), sa_t.t().contiguous()
    qb, sb = qb_t.t().contiguous(), sb_t.t().contiguous()
    del a, b, qa_t, qb_t, sa_t, sb_t
    row = {"groups": groups, "k_per_group": kg, "m": m, "n": n, "us": {}, "gbps": {}}
    for name, x in (("a", qa), ("b", qb)):
        want = x.t().contiguous()
        calls = {"clone": x.clone, "library": lambda x=x: transposed(x)}
        calls.update({v: (lambda x=x, f=variant_call(*cfg): f(x)) for v, cfg in VARIANTS.items()})
        for label, fn in calls.items():
            if label != "clone" and not torch.equal(fn().view(torch.uint8), want.view(torch.uint8)):
                raise AssertionError(f"{label} on {name}: not the transpose")
            us = time_us(fn)
            row["us"][f"{name}:{label}"] = us
            row["gbps"][f"{name}:{label}"] = 2 * x.numel() / us / 1e3
        del want
    ks_t = torch.tensor(ks, dtype=torch.int32, device="cuda")
    d = torch.zeros(groups, m, n, device="cuda", dtype=torch.float32)
    row["us"]["tn_op"] = time_us(
        lambda: tilegemm.k_grouped_fp8_gemm_tn_contiguous((qa, sa), (qb, sb), d, ks, ks_t, c=d), reps=7
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="transpose_probe.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows_out = []
    for shape in [(8, 4096, 4096, 7168), (4, 8192, 7168, 2048)]:  # canonical tn rows: groups, K a group, M, N
        rows_out.append(measure(*shape))
        torch.cuda.empty_cache()
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "variants": VARIANTS, "rows": rows_out}, f, indent=1)
    for row in rows_out:
        print(f"\n{row['groups']}x{row['k_per_group']} M{row['m']} N{row['n']}: tn op {row['us']['tn_op']:.0f} us")
        for key in row["us"]:
            if key != "tn_op":
                print(f"  {key:20s} {row['us'][key]:8.1f} us {row['gbps'][key]:7.0f} GB/s")


if __name__ == "__main__":
    main()
