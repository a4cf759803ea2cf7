"""Host time of a tilegemm call: what the Python path costs above the kernel (issue: lean host path).

Two measurements, one table each:

* ``--stub`` (any machine, no GPU needed): the public call runs through the ``cutile`` backend's host path
  (bind, checks, backend choice, plan lookup, launch arguments) on CPU tensors, with ``cuda.tile.launch``
  replaced by a no-op. That is the Python cost of a call, stage by stage, beside a 1x8x8 ``torch.mm`` on
  the CPU (the host cost of one small torch op on this machine, as a yardstick).
* default (a CUDA machine): back-to-back calls of a tiny problem (the kernel takes a few microseconds, so a
  loop of calls without synchronisation runs at the host's pace): per-call time of tilegemm, ``torch.matmul``
  (and DeepGEMM when its loader finds it) minus their CUDA-graph replay time (kernel only) = host time above
  the kernel. tilegemm's is split into ``python_us`` (the call with ``cuda.tile.launch`` a no-op) and
  ``ct_launch_us`` (``cuda.tile.launch`` alone on the arguments the call passed it).

    PYTHONPATH=src python3 tests/benchmark/host_overhead.py --stub
    PYTHONPATH=src python3 tests/benchmark/host_overhead.py --out $OUT/host.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import types
from collections.abc import Callable
from unittest import mock

import torch

import tilegemm as tg
from tilegemm.bench import timing

SHAPES = [(1, 4096, 7168), (128, 7168, 2048)]
"""Dense shapes of the ``--stub`` table (the host path does not depend on the size: it never touches data)."""

TINY = (8, 256, 256)
"""The GPU table's problem: a kernel of a few microseconds, so a loop of calls is host-bound."""


def _per_call_us(fn: Callable[[], object], calls: int, repeats: int = 7, sync: Callable[[], None] = lambda: None):
    """Median over ``repeats`` of the wall time of ``calls`` back-to-back calls, per call (us)."""
    for _ in range(max(10, calls // 20)):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def _operands(m: int, n: int, k: int, device: str):
    a = torch.randn(m, k, device=device).bfloat16()
    b = torch.randn(n, k, device=device).bfloat16()
    d = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    a8 = tg.per_token_cast_to_fp8(a.float())
    b8 = tg.per_block_cast_to_fp8(b.float())
    return a, b, d, a8, b8


def _stub_cases(a, b, d, a8, b8) -> dict[str, tuple]:
    """op -> (public call, registered op name, FP8?, positional arguments)."""
    return {
        "bf16_gemm_nt": (lambda: tg.bf16_gemm_nt(a, b, d, backend="cutile"), "bf16_gemm_nt", False, (a, b, d)),
        "fp8_gemm_nt": (lambda: tg.fp8_gemm_nt(a8, b8, d, backend="cutile"), "fp8_fp4_gemm_nt", True, (a8, b8, d)),
    }


def stub_table(calls: int) -> list[dict]:
    """Python host path per call, with the launch stubbed (CPU tensors through the cutile host path)."""
    import cuda.tile as ct

    from tilegemm import config
    from tilegemm.backend import registry
    from tilegemm.ops import checks
    from tilegemm.ops.cutile import launch

    stubs = [
        mock.patch.object(ct, "launch", lambda *args: None),
        mock.patch.object(launch, "current_stream", lambda: types.SimpleNamespace(cuda_stream=0)),
        mock.patch.object(registry, "_unavailable_reason", lambda *args: None),  # CPU tensors take the cutile path
        mock.patch.object(config, "get_num_sms", lambda: 132),
    ]
    with contextlib.ExitStack() as stack:
        for stub in stubs:
            stack.enter_context(stub)
        rows = _stub_rows(calls, checks, registry)
        launch.clear_plans()  # plans built on CPU tensors
    return rows


def _stub_rows(calls: int, checks, registry) -> list[dict]:
    rows = []
    for m, n, k in SHAPES:
        a, b, d, a8, b8 = _operands(m, n, k, "cpu")
        cases = _stub_cases(a, b, d, a8, b8)
        for op, (call, name, fp8, args) in cases.items():
            check = checks.dense_gemm_check("nt", fp8)
            derived = check(*args)
            impl = registry.get_impl(name, "cutile")
            rows.append(
                dict(
                    op=op,
                    shape=[m, n, k],
                    public_us=_per_call_us(call, calls),
                    check_us=_per_call_us(lambda: check(*args), calls),  # noqa: B023
                    backend_us=_per_call_us(lambda: impl(**derived), calls),  # noqa: B023
                )
            )
    small_a, small_b = torch.randn(1, 8), torch.randn(8, 8)
    yardstick = _per_call_us(lambda: torch.mm(small_a, small_b), calls)
    for row in rows:
        row["torch_mm_1x8x8_cpu_us"] = yardstick
    return rows


def gpu_table(calls: int) -> list[dict]:
    """Per-call time of back-to-back tiny calls, and the CUDA-graph (kernel-only) time, per implementation."""
    m, n, k = TINY
    a, b, d, a8, b8 = _operands(m, n, k, "cuda")
    impls: dict[str, Callable[[], object]] = {
        "tilegemm bf16_gemm_nt": lambda: tg.bf16_gemm_nt(a, b, d),
        "tilegemm fp8_gemm_nt": lambda: tg.fp8_gemm_nt(a8, b8, d),
        "torch.matmul": lambda: torch.matmul(a, b.T, out=d),
    }
    from tilegemm.bench import peers

    dg, why = peers.load_deepgemm("auto")
    if dg is not None:
        a8_dg, b8_dg = peers.dg_quant_a(dg, a), peers.dg_quant_b(dg, b)
        impls["deep_gemm bf16_gemm_nt"] = lambda: dg.bf16_gemm_nt(a, b, d)
        impls["deep_gemm fp8_gemm_nt"] = lambda: dg.fp8_gemm_nt(a8_dg, b8_dg, d)
    else:
        print(f"DeepGEMM not timed: {why}")
    rows = []
    for name, fn in impls.items():
        eager = _per_call_us(fn, calls, sync=torch.cuda.synchronize)
        kernel = timing.graph_ms(fn, calls=100) * 1e3  # the harness's kernel-only timer
        row = dict(impl=name, shape=list(TINY), loop_us=eager, graph_us=kernel, host_above_kernel_us=eager - kernel)
        if name.startswith("tilegemm"):
            row.update(_split_launch(fn, calls))
        rows.append(row)
    return rows


def _split_launch(fn: Callable[[], object], calls: int) -> dict:
    """The host time of a tilegemm call split in two: ``python_us`` (the call with ``cuda.tile.launch`` a no-op)
    and ``ct_launch_us`` (``cuda.tile.launch`` alone, replaying the arguments the call passed it)."""
    import cuda.tile as ct

    launches = []
    real = ct.launch
    with mock.patch.object(ct, "launch", lambda *args: launches.append(args)):
        fn()
    with mock.patch.object(ct, "launch", lambda *args: None):
        python_us = _per_call_us(fn, calls)
    ct_launch_us = _per_call_us(lambda: [real(*args) for args in launches], calls, sync=torch.cuda.synchronize)
    return dict(python_us=python_us, ct_launch_us=ct_launch_us, launches_per_call=len(launches))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stub", action="store_true", help="Python host path on the CPU, launch stubbed")
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed loop")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = stub_table(args.calls) if args.stub else gpu_table(args.calls)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d %H:%M"), stub=args.stub, rows=rows), f, indent=1)
    for row in rows:
        print(
            "  ".join(
                f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}" for key, value in row.items()
            )
        )


if __name__ == "__main__":
    main()
