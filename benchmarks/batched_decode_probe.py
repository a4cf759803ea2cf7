"""The batched decode kernel against one MQA-logits call per sequence (DeepSeek-V3.2's indexer: 64 heads of 128).

``PYTHONPATH=src python3 benchmarks/batched_decode_probe.py OUT.json`` on a Hopper GPU: for BF16 and FP8, 1 / 8 / 32
sequences of 4k / 16k / 64k keys, one query row each: whether the batched kernel's logits inside every window are
the per-sequence op's bit for bit, and both paths' CUDA-graph and eager (host included) microseconds.
Its memcheck case: ``tests/sanitize/cases.py`` ("mqa logits batched decode kernel").
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

import tilegemm as tg
from tilegemm.heuristics import cutile as heur
from tilegemm.ops.cutile import mqa as cutile_mqa

HEADS, DIM = 64, 128


def graph_us(fn: Callable[[], object], reps: int = 50, calls: int = 1) -> float:
    """Median microseconds per call of ``fn`` from the replays of a CUDA graph of ``calls`` calls back to back
    (captured after two warm-ups on a side stream; ``calls=1``: one call a replay, its launch included)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def eager_us(fn: Callable[[], object], reps: int = 50) -> float:
    """Median wall-clock microseconds of ``fn`` (host included), each call waited for, after five warm-ups."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def case(dtype: str, batch: int, keys: int) -> dict:
    """One row: operands, both paths, their bits inside the windows and their times."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(batch * keys)
    q = torch.randn(batch, 1, HEADS, DIM, device=dev, generator=g)
    kv = torch.randn(batch, keys, DIM, device=dev, generator=g)
    w = torch.randn(batch, 1, HEADS, device=dev, generator=g)
    ks = torch.zeros(batch, 1, dtype=torch.int32, device=dev)
    ke = torch.randint(keys // 2, keys + 1, (batch, 1), device=dev, generator=g, dtype=torch.int32)
    if dtype == "bf16":
        q, kv, scale = q.bfloat16(), kv.bfloat16(), torch.ones(batch, keys, device=dev)
        base = heur.bf16_mqa_logits_config(HEADS, DIM)
    else:
        q, kv = q.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn)
        scale = torch.rand(batch, keys, device=dev, generator=g) + 0.5
        base = heur.mqa_logits_config(HEADS, DIM)
    conf = heur.mqa_decode_config(base, 1, keys, torch.cuda.get_device_properties(dev).multi_processor_count, 90, batch)
    out = torch.empty(batch, 1, keys, device=dev)

    def one(b: int) -> torch.Tensor:
        if dtype == "bf16":
            return tg.bf16_mqa_logits(q[b], kv[b], w[b], ks[b], ke[b], False)
        return tg.fp8_mqa_logits(q[b], (kv[b], scale[b]), w[b], ks[b], ke[b], False)

    def loop() -> list[torch.Tensor]:
        return [one(b) for b in range(batch)]

    def batched() -> None:
        cutile_mqa.launch_mqa_logits_batched((q, kv, scale, w, ks, ke), out, conf)

    refs = loop()
    batched()
    torch.cuda.synchronize()
    ends = ke[:, 0].tolist()
    equal = all(torch.equal(out[b, 0, : ends[b]], refs[b][0, : ends[b]]) for b in range(batch))
    return dict(
        dtype=dtype,
        batch=batch,
        keys=keys,
        parts=conf.parts,
        bitwise_equal=equal,
        loop_graph_us=graph_us(loop),
        batched_graph_us=graph_us(batched),
        loop_eager_us=eager_us(loop),
        batched_eager_us=eager_us(batched),
    )


def main(out_path: str) -> int:
    rows = []
    for dtype in ("bf16", "fp8"):
        for batch in (1, 8, 32):
            for keys in (4096, 16384, 65536):
                rows.append(case(dtype, batch, keys))
                print(json.dumps(rows[-1]), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "batched_decode_probe.json"))
