"""A tile round's cost against K: per-call time (CUDA-graph replay) and kernel duration (CUPTI, ``torch.profiler``)
of the gluon ws kernels' designs beside cuBLAS and DeepGEMM, fitted as ``a + b * K``.

Run on the H200 machine (``source .devbundle/setup.sh``; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/fixed_cost.py OUT.json

Each case is a design on a shape whose tiles run one round over the SMs (M, N fixed), at K 128, 512, 2048 and 8192:
``a`` is what one round costs whatever its depth (launch, prologue, the first loads' latency, the epilogue),
``b`` the cost of each 1000 of K; ``graph - kernel`` the gap between back-to-back launches. The kernel timed is the
one with the most device time under the profiler (each peer launches one). Prints the fits last.
"""

from __future__ import annotations

import argparse
import json

import torch
from fp8_ws_sweep import quant

from tilegemm.bench import device, peers, timing
from tilegemm.ops.gluon import bf16_gemm_ws as bw
from tilegemm.ops.gluon import fp8_gemm_ws as ws

KS = (128, 512, 2048, 8192)
#: (label, dtype, M, N, design): the designs the dense rules pick at those shapes
CASES = (
    ("bf16 128x256", "bf16", 512, 7168, "bf16_128x256"),
    ("bf16 64x128_w4", "bf16", 256, 1536, "bf16_64x128_w4"),
    ("bf16 128x128", "bf16", 256, 7168, "bf16_128x128"),
    ("fp8 i_64x64_ov2", "fp8", 256, 1536, "i_64x64_ov2"),
    ("fp8 f_128x64_ov2", "fp8", 512, 2112, "f_128x64_ov2"),
)


def measure(fn, sets: list, calls_per_set: int = 4) -> tuple[float, float, str]:
    """(us a call by CUDA-graph replay, us a kernel by CUPTI, the kernel's name) of ``fn`` over the input sets."""
    fn(*sets[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_set):
            for s in sets:
                fn(*s)
    calls = calls_per_set * len(sets)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(
        ((e.device_time_total, e.count, e.key) for e in prof.key_averages() if e.count >= calls), reverse=True
    )
    total, count, name = kernels[0]
    return sorted(times)[len(times) // 2], total / count, name[:80]


def columns(dtype: str, design: str, dg) -> dict:
    """Each column's maker: ``(m, n, k) -> (call, input sets)``."""

    def bf16_sets(m, n, k):
        count = min(4, timing.rotation_count(2 * (m * k + n * k + m * n)))
        return [
            (torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16())
            for _ in range(count)
        ]

    def fp8_sets(m, n, k):
        return [quant(m, n, k, 7 * s + 1) for s in range(min(4, timing.rotation_count(m * k + n * k + 2 * m * n)))]

    def made(call_of, sets_of):
        def make(m, n, k):
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            sets = sets_of(m, n, k)
            return call_of(d, sets), sets

        return make

    if dtype == "bf16":

        def ours(d, sets):
            plan = bw.bf16_ws_plan(*sets[0], d, bw.VARIANTS[design])
            return lambda a, b: plan(a, b, d)

        out = {"ours": made(ours, bf16_sets)}
        out["cublas"] = made(lambda d, sets: lambda a, b: torch.matmul(a, b.t(), out=d), bf16_sets)
        if dg is not None:
            out["deepgemm"] = made(lambda d, sets: lambda a, b: dg.bf16_gemm_nt(a, b, d), bf16_sets)
        return out

    def ours8(d, sets):
        plan = ws.ws_plan(*sets[0], d, ws.VARIANTS[design])
        return lambda a, b: plan(a, b, d)

    out = {"ours": made(ours8, fp8_sets)}
    if dg is not None:
        out["deepgemm"] = made(lambda d, sets: lambda a, b: dg.fp8_gemm_nt(a, b, d), fp8_sets)
    return out


def fit(rows: list[dict], key: str) -> tuple[float, float]:
    """Least squares ``a + b * K`` of ``key`` (us) over ``rows``: (a in us, b in us per 1000 of K)."""
    xs, ys = [r["k"] for r in rows], [r[key] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    args = parser.parse_args()
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, flush=True)
    rows, fits = [], []
    for label, dtype, m, n, design in CASES:
        for impl, make in columns(dtype, design, dg).items():
            for k in KS:
                call, sets = make(m, n, k)
                graph_us, kernel_us, kernel = measure(call, sets)
                rows.append(dict(case=label, impl=impl, m=m, n=n, k=k, graph_us=graph_us, kernel_us=kernel_us))
                rows[-1]["kernel"] = kernel
                print(f"{label:>18} {impl:>9} {m}x{n}x{k:<5} graph {graph_us:7.2f} kernel {kernel_us:7.2f} {kernel}")
            mine = [r for r in rows if r["case"] == label and r["impl"] == impl]
            (ga, gb), (ka, kb) = fit(mine, "graph_us"), fit(mine, "kernel_us")
            fits.append(dict(case=label, impl=impl, graph_a=ga, graph_b=gb, kernel_a=ka, kernel_b=kb))
    with open(args.out, "w") as f:
        json.dump({"meta": {**device.describe(), "deepgemm": why, "ks": KS}, "rows": rows, "fits": fits}, f, indent=1)
    print("\nfit over K: a + b * K (us; b per 1000 of K)")
    for x in fits:
        print(
            f"{x['case']:>18} {x['impl']:>9}  graph a {x['graph_a']:5.2f} b {x['graph_b']:6.3f} | "
            f"kernel a {x['kernel_a']:5.2f} b {x['kernel_b']:6.3f} | gap {x['graph_a'] - x['kernel_a']:4.2f}"
        )


if __name__ == "__main__":
    main()
