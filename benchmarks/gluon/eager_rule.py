"""Where the gluon dense FP8 kernel wins an eager call: gluon and cutile forced, eager and kernel-only, per shape.

The automatic choice (``tilegemm.heuristics.gluon.prefers_dense_fp8``) takes gluon where its kernel is faster: for
``fp8_gemm_kernel``, where the call is also large enough that its host path does not undo that in an eager call
(``DENSE_FP8_MIN_FLOPS``); for the warp-specialized kernel, which DeepGEMM's recipe runs (these rows), by its own rule
without a FLOP bar (``ws_kernel_faster``; its host path costs no more than cutile's). This script measures both
backends through the public API (``backend=``) on the benchmark set's dense FP8 rows at M >= 256 and on shapes
outside it, so the FLOP threshold is set from eager numbers and checked on shapes it was not set on. Run on the GPU
machine:

    PYTHONPATH=src python3 benchmarks/gluon/eager_rule.py $OUT/eager_rule.json [--shapes M,N,K ...] [--host]

``--shapes`` measures those shapes instead of the set and the off-set list. ``--host`` adds, per shape, the
per-call wall time of back-to-back calls without synchronisation or L2 flush (``loop_us``: host-bound when it is
above the kernel-only time) and a profile of the gluon call's Python (top functions by own time).

Prints one line per shape: eager and kernel-only microseconds of each backend, the ratios, and what the current
rules choose. Eager = median over L2-flushed calls (``tilegemm.bench.timing.eager_ms``), kernel-only = CUDA-graph
replay of 10 calls (``graph_ms``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch

import tilegemm
from tilegemm.bench import timing
from tilegemm.heuristics import gluon as rules
from tilegemm.testing import calc_diff

SET_NK = [
    (2112, 7168),
    (24576, 1536),
    (32768, 512),
    (7168, 16384),
    (4096, 7168),
    (7168, 2048),
    (1536, 2048),
    (2048, 768),
]
SET = [(m, n, k) for n, k in SET_NK for m in (256, 512, 2048, 4096)] + [(8192, 8192, 8192)]
OFF_SET = [
    (300, 4096, 8192),
    (384, 2112, 7168),
    (768, 7168, 2048),
    (1000, 1536, 2048),
    (1500, 2048, 768),
    (3000, 4096, 4096),
    (640, 8192, 1024),
    (6000, 1024, 1024),
    (1024, 576, 7168),
    (2500, 3072, 1536),
]


def inputs(m: int, n: int, k: int):
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    xa = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    xb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    qa, sa = tilegemm.per_token_cast_to_fp8(xa)
    qb, sb = tilegemm.per_block_cast_to_fp8(xb)
    a = (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa))
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return a, (qb, sb), d


def measure(m: int, n: int, k: int, sms: int) -> dict:
    a, b, d = inputs(m, n, k)
    row = {"m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "in_set": (m, n, k) in SET}
    outs = {}
    for backend in ("gluon", "cutile"):
        fn = lambda backend=backend: tilegemm.fp8_gemm_nt(a, b, d, backend=backend)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        outs[backend] = d.clone()
        row[f"{backend}_eager_us"] = timing.eager_ms(fn) * 1e3
        row[f"{backend}_graph_us"] = timing.graph_ms(fn, 10) * 1e3
    row["diff"] = float(calc_diff(outs["gluon"], outs["cutile"]))  # the backends sum in different orders
    row["eager_ratio"] = row["cutile_eager_us"] / row["gluon_eager_us"]
    row["graph_ratio"] = row["cutile_graph_us"] / row["gluon_graph_us"]
    row["kernel_rule"] = rules.kernel_faster_dense_fp8(m, n, k, sms)
    row["chosen_gluon"] = rules.prefers_dense_fp8(m, n, k, sms)
    return row


def back_to_back_us(fn, calls: int, warmup: int) -> tuple[float, float]:
    """``fn`` called ``calls`` times back to back after ``warmup`` calls, without synchronisation or L2 flush:
    (CPU microseconds per call until the last call returns, microseconds per call until the GPU is done)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6, (time.perf_counter() - t0) / calls * 1e6


def profile_top(fn, calls: int, count: int) -> dict[str, list[str]]:
    """A cProfile of ``calls`` calls of ``fn`` (synchronized after): the ``count`` functions of most ``cumulative``
    and most ``own`` time, each as ``"<us per call>us <calls> <file>:<line>(<name>)"``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    top = {}
    for key, col in (("cumulative", 3), ("own", 2)):
        order = sorted(stats.stats.items(), key=lambda it: it[1][col], reverse=True)[:count]
        top[key] = [f"{v[col] / calls * 1e6:.2f}us {v[1]} {f.split('site-packages/')[-1]}:{line}({nm})"
                    for (f, line, nm), v in order]  # fmt: skip
    return top


def host_probe(m: int, n: int, k: int, row: dict, calls: int = 200) -> str:
    """Adds ``{backend}_loop_us`` to ``row``; returns the profile of ``calls`` gluon calls (top 12 by own time)."""
    a, b, d = inputs(m, n, k)
    for backend in ("gluon", "cutile"):
        fn = lambda backend=backend: tilegemm.fp8_gemm_nt(a, b, d, backend=backend)  # noqa: E731
        row[f"{backend}_loop_us"] = back_to_back_us(fn, calls, warmup=20)[1]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        tilegemm.fp8_gemm_nt(a, b, d, backend="gluon")
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default="eager_rule.json")
    parser.add_argument("--shapes", nargs="*", default=None, help="M,N,K triples (default: set + off-set)")
    parser.add_argument("--host", action="store_true", help="add the back-to-back loop time and a profile")
    args = parser.parse_args()
    out = args.out
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] if args.shapes else SET + OFF_SET
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, profiles = [], {}
    t0 = time.time()
    for m, n, k in shapes:
        rows.append(measure(m, n, k, sms))
        if args.host:
            profiles[f"{m}x{n}x{k}"] = host_probe(m, n, k, rows[-1])
            print(f"loop us: gluon {rows[-1]['gluon_loop_us']:.1f} cutile {rows[-1]['cutile_loop_us']:.1f}")
        r = rows[-1]
        print(
            f"{m:5d} {n:5d} {k:5d} {r['flops']:.2e} gl {r['gluon_eager_us']:8.1f}/{r['gluon_graph_us']:8.1f} "
            f"ct {r['cutile_eager_us']:8.1f}/{r['cutile_graph_us']:8.1f} eager {r['eager_ratio']:.2f}x "
            f"graph {r['graph_ratio']:.2f}x rule {int(r['kernel_rule'])} chosen {int(r['chosen_gluon'])} "
            f"diff {r['diff']:.1e} set {int(r['in_set'])}",
            flush=True,
        )
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": sms,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "torch": torch.__version__,
        "seconds": time.time() - t0,
        "timing": "eager: median over L2-flushed calls; graph: CUDA-graph replay of 10 calls, per call",
    }
    with open(out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "profiles": profiles}, f, indent=1)


if __name__ == "__main__":
    main()
