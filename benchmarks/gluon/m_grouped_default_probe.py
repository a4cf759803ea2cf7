"""Which kernels the m-grouped FP8 op runs with default settings, against ``backend="gluon"`` and ``"cutile"``.

An earlier sweep had the public ``m_grouped_fp8_gemm_nt_contiguous`` with default settings 9-13% slower than the
same op forced to gluon on three benchmark rows (``../results/grouped-fp8-h200/README.md``). This probe takes those
rows' inputs from the benchmark harness (``tilegemm.bench.m_grouped``: the same group sizes, casts and layouts),
times the op kernel-only with each backend setting (one call in a CUDA graph, the replays' median; the settings in
turn, three rounds) and lists each setting's kernels from ``torch.profiler`` over one eager call:

    PYTHONPATH=src python3 benchmarks/gluon/m_grouped_default_probe.py OUT.json

Prints a line per row and setting, and writes every number and kernel name to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import tilegemm
from tilegemm.bench import device, m_grouped
from tilegemm.kernel_timing import kernel_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from batched_decode_probe import graph_us  # noqa: E402  (benchmarks/: one call in a CUDA graph, the replays' median)

#: (groups, rows a group, N, K): the rows the sweep had apart, and one it had alike
ROWS = [(4, 8192, 4096, 7168), (8, 4096, 4096, 7168), (4, 8192, 7168, 2048), (32, 512, 7168, 2048)]
SETTINGS = {"default": None, "gluon": "gluon", "cutile": "cutile"}


def kernels(fn) -> list[tuple[str, float]]:
    """(name, device us) of every kernel one eager call of ``fn`` launches (``kernel_timing.kernel_rows``)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(name[:100], seconds * 1e6) for name, seconds, _ in kernel_rows(prof)]


def main(out: str) -> int:
    rows = []
    for g, m, n, k in ROWS:
        spec = {"dtype": "fp8", "groups": g, "m_per_group": m, "n": n, "k": k}
        built = m_grouped.case(spec).build()
        args = built.impls[0].sets[0]  # (a, sfa), (b, sfb), d, m_indices
        d = args[2]
        calls = {
            name: (lambda be=be, args=args: tilegemm.m_grouped_fp8_gemm_nt_contiguous(*args, backend=be))
            for name, be in SETTINGS.items()
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        outs = {}
        for name, fn in calls.items():
            fn()
            outs[name] = d.clone()
        same = {name: torch.equal(outs[name], outs["default"]) for name in calls}
        for _ in range(3):
            for name, fn in calls.items():
                times[name].append(graph_us(fn, 30))
        row = {"groups": g, "m_per_group": m, "n": n, "k": k, "us": times, "bitwise_as_default": same}
        row["kernels"] = {name: kernels(fn) for name, fn in calls.items()}
        rows.append(row)
        for name in calls:
            names = ", ".join(f"{kn[:60]} {us:.0f}" for kn, us in row["kernels"][name])
            best = min(times[name])
            print(f"g{g} m{m} n{n} k{k} {name:>8}: {best:8.1f} us (of {times[name]}); same bits {same[name]}; {names}")
        del built, args, d, outs, calls
        torch.cuda.empty_cache()
    result = {**device.describe(), "when": time.strftime("%Y-%m-%d"), "rows": rows}
    result["timing"] = "us: one call in a CUDA graph, replay median, three rounds of the settings in turn"
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
