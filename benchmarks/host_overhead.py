"""Host time of a tilegemm call: what the Python path costs above the kernel (issue: lean host path).

Two measurements, one table each:

* ``--stub`` (any machine, no GPU needed): the public call runs through the ``cutile`` backend's host path
  (bind, checks, backend choice, plan lookup, launch arguments) on CPU tensors, with ``cuda.tile.launch``
  replaced by a no-op. That is the Python cost of a call, stage by stage (``public_us`` with the registry's
  hot lane, ``full_path_us`` without it), beside a 1x8x8 ``torch.mm`` on the CPU (the host cost of one
  small torch op on this machine, as a yardstick).
* default (a CUDA machine): back-to-back calls of a tiny problem (the kernel takes a few microseconds, so a
  loop of calls without synchronisation runs at the host's pace): per-call time of tilegemm, ``torch.matmul``
  (and DeepGEMM when its loader finds it) minus their CUDA-graph replay time (kernel only) = host time above
  the kernel. tilegemm's is split into ``python_us`` (the call with ``cuda.tile.launch`` a no-op;
  ``python_full_path_us`` with the hot lane off) and ``ct_launch_us`` (``cuda.tile.launch`` alone on the
  arguments the call passed it). A second table times ``cuda.tile.launch`` alone on trivial kernels with
  1 array, 5 arrays, and a dense GEMM's parameter list, and ``launch.current_stream()``.

    PYTHONPATH=src python3 benchmarks/host_overhead.py --stub
    PYTHONPATH=src python3 benchmarks/host_overhead.py --out $OUT/host.json
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

import cuda.tile as ct
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
                    full_path_us=_full_path_us(call, calls),
                    check_us=_per_call_us(lambda: check(*args), calls),  # noqa: B023
                    backend_us=_per_call_us(lambda: impl(**derived), calls),  # noqa: B023
                )
            )
    small_a, small_b = torch.randn(1, 8), torch.randn(8, 8)
    yardstick = _per_call_us(lambda: torch.mm(small_a, small_b), calls)
    for row in rows:
        row["torch_mm_1x8x8_cpu_us"] = yardstick
    return rows


def _full_path_us(call: Callable[[], object], calls: int) -> float:
    """:func:`_per_call_us` of ``call`` taking the full path every time: no backend offers a replay, so the
    call computes its signature, misses, and is checked, dispatched and looked up as before the hot lane."""
    from tilegemm.backend import hot_lane

    with mock.patch.object(hot_lane, "_REPLAYS", {}), mock.patch.object(hot_lane, "_HOT", {}):
        return _per_call_us(call, calls)


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
    and ``ct_launch_us`` (``cuda.tile.launch`` alone, replaying the arguments the call passed it); and
    ``python_full_path_us``, the Python time with the registry's hot lane off (checks and plan lookup per call)."""
    import cuda.tile as ct

    launches = []
    real = ct.launch
    with mock.patch.object(ct, "launch", lambda *args: launches.append(args)):
        fn()
    with mock.patch.object(ct, "launch", lambda *args: None):
        python_us = _per_call_us(fn, calls)
        python_full_us = _full_path_us(fn, calls)
    ct_launch_us = _per_call_us(lambda: [real(*args) for args in launches], calls, sync=torch.cuda.synchronize)
    return dict(
        python_us=python_us,
        python_full_path_us=python_full_us,
        ct_launch_us=ct_launch_us,
        launches_per_call=len(launches),
    )


ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _store_one(X):
    """A kernel of one array parameter (each launch table kernel does only this one store)."""
    ct.store(X, (0,), ct.zeros((16,), dtype=ct.float32))


def _store_five(X, A, B, C, D):
    """Five array parameters."""
    ct.store(X, (0,), ct.zeros((16,), dtype=ct.float32))


def _store_gemm_like(
    X, A, B, C, D, f1: float, f2: float, i1: int, i2: int, i3: int,
    c1: ConstInt, c2: ConstInt, c3: ConstInt, c4: ConstInt, b1: ConstBool, b2: ConstBool, b3: ConstBool, b4: ConstBool,
):  # fmt: skip
    """A dense GEMM kernel's parameter list: five arrays, two floats, three ints, eight constants."""
    ct.store(X, (0,), ct.zeros((16,), dtype=ct.float32))


def launch_table(calls: int) -> list[dict]:
    """``cuda.tile.launch`` alone on three trivial kernels that differ only in their parameters (1 array;
    5 arrays; a dense GEMM's list), and :func:`tilegemm.ops.cutile.launch.current_stream`."""
    from tilegemm.ops.cutile import launch

    x = torch.zeros(16, device="cuda")
    others = [torch.zeros(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    cases = {
        "1 array": (_store_one, (x,)),
        "5 arrays": (_store_five, (x, *others)),
        "5 arrays, 5 scalars, 8 constants": (
            _store_gemm_like,
            (x, *others, 1.0, 0.0, 7168, 0, 1, 128, 128, 64, 8, True, True, False, False),
        ),
    }
    stream = launch.current_stream()
    rows = []
    for name, (body, args) in cases.items():
        kernel = ct.kernel(body)
        us = _per_call_us(lambda: ct.launch(stream, (1, 1, 1), kernel, args), calls, sync=torch.cuda.synchronize)  # noqa: B023
        rows.append(dict(kernel=name, ct_launch_us=us))
    rows.append(dict(kernel="launch.current_stream()", ct_launch_us=_per_call_us(launch.current_stream, calls)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stub", action="store_true", help="Python host path on the CPU, launch stubbed")
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed loop")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = stub_table(args.calls) if args.stub else gpu_table(args.calls) + launch_table(args.calls)
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
