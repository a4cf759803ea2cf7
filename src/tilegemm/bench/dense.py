"""Dense GEMM benchmark: cutile vs torch.matmul (BF16) and vs torch's blockwise-scaled FP8 GEMM.

Every timing is a ``triton.testing.do_bench`` median (after warm-up) of the public op call
(``tilegemm.ops.api.*_gemm_*(..., backend="cutile")``, host overhead included) or of the peer
call, in the same process on the same GPU. Inputs rotate over enough buffer sets to exceed
the L2 cache. Rows follow the results-file schema (``op, dtype, layout, shape, backend,
tflops, peer, peer_tflops, ratio, calc_diff, gpu, date``) plus ``gbps``, ``config`` and
``peer_error`` (why the peer refused a shape; such rows stay out of the geometric mean).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

BENCH_NK = [(2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
BENCH_SHAPES = [(m, n, k) for m in (1, 64, 128, 4096) for n, k in BENCH_NK] + [(8192, 8192, 8192)]
L2_BYTES = 50 * 2**20
_PEER_MS: dict[tuple, tuple[float | None, str | None]] = {}  # peer timings are reused across configs


def _bench(fn: Callable[[], Any]) -> float:
    from tilegemm.testing import bench_kernel

    return bench_kernel(fn, warmup=25, rep=100)


#: Set by ``--graph``: also time one CUDA graph replay of a call per input set (no host overhead).
GRAPH = False


def _graph_ms(sets: list[tuple], call: Callable[..., Any]) -> float | None:
    """Milliseconds per call with the host out of the loop: one CUDA graph holds one call per input set."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for st in sets:  # warm-up (JIT) outside the capture
                call(*st)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for st in sets:
                call(*st)
        return _bench(graph.replay) / len(sets)
    except Exception:  # a peer that cannot be captured: leave the column empty
        return None


def _with_graph(row: dict[str, Any], ms: float | None, peer_ms: float | None) -> dict[str, Any]:
    flops = 2.0 * row["shape"]["m"] * row["shape"]["n"] * row["shape"]["k"]
    row["tflops_graph"] = round(flops / (ms * 1e-3) / 1e12, 2) if ms else None
    row["peer_tflops_graph"] = round(flops / (peer_ms * 1e-3) / 1e12, 2) if peer_ms else None
    return row


def _rotating(make: Callable[[], tuple], set_bytes: int, max_sets: int = 16) -> list[tuple]:
    """Enough independent input sets that cycling through them never hits in L2 (2x its size)."""
    count = max(1, min(max_sets, math.ceil(2 * L2_BYTES / max(1, set_bytes))))
    return [make() for _ in range(count)]


def _cycler(sets: list[tuple], call: Callable[..., Any]) -> Callable[[], Any]:
    state = {"i": 0}

    def fn():
        i = state["i"]
        state["i"] = (i + 1) % len(sets)
        return call(*sets[i])

    return fn


def _store(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x.t().contiguous() if transposed else x.contiguous()


def _gpu_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _row(op, dtype, layout, m, n, k, ms, peer, peer_ms, peer_error, diff, nbytes, config) -> dict[str, Any]:
    flops = 2.0 * m * n * k
    tflops = flops / (ms * 1e-3) / 1e12
    peer_tflops = flops / (peer_ms * 1e-3) / 1e12 if peer_ms else None
    return {
        "op": op,
        "dtype": dtype,
        "layout": layout,
        "shape": {"m": m, "n": n, "k": k},
        "backend": "cutile",
        "tflops": round(tflops, 2),
        "gbps": round(nbytes / (ms * 1e-3) / 1e9, 1),
        "peer": peer,
        "peer_tflops": None if peer_tflops is None else round(peer_tflops, 2),
        "ratio": None if peer_tflops is None else round(tflops / peer_tflops, 4),
        "peer_error": peer_error,
        "calc_diff": diff,
        "config": config,
        "gpu": _gpu_name(),
        "date": datetime.date.today().isoformat(),
    }


# --------------------------------------------------------------------------------- BF16


def bench_bf16(layout: str, m: int, n: int, k: int, config=None) -> dict[str, Any]:
    """One BF16 row: cutile ``bf16_gemm_<layout>`` vs ``torch.matmul`` on the same stored operands."""
    from tilegemm.ops import api as tg
    from tilegemm.ops.cutile import gemm, heuristics, launch
    from tilegemm.testing import calc_diff

    ta, tb = layout[0] == "t", layout[1] == "n"

    def make():
        a_log = torch.randn(m, k, device="cuda").bfloat16()
        b_log = torch.randn(n, k, device="cuda").bfloat16()
        return _store(a_log, ta), _store(b_log, tb), torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    nbytes = 2 * (m * k + n * k + m * n)
    sets = _rotating(make, nbytes)
    op = getattr(tg, f"bf16_gemm_{layout}")

    def ours(a, b, d):
        if config is None:
            return op(a, b, d, backend="cutile")
        return gemm.bf16_gemm(layout, a, b, d, None, 1.0, 1.0, config=config)

    def peer(a, b, d):
        return torch.matmul(a.t() if ta else a, b if tb else b.t(), out=d)

    a, b, d = sets[0]
    ours(a, b, d)
    ref = (a.t() if ta else a).double() @ (b if tb else b.t()).double()
    diff = calc_diff(d, ref)
    ms = _bench(_cycler(sets, ours))
    key = ("bf16", layout, m, n, k)
    if key not in _PEER_MS:
        _PEER_MS[key] = (_bench(_cycler(sets, peer)), None)
    peer_ms = _PEER_MS[key][0]
    cfg = config or heuristics.choose_dense_config("bf16", m, n, k, launch.num_sms())
    row = _row(
        f"bf16_gemm_{layout}", "bf16", layout, m, n, k, ms, "torch.matmul", peer_ms, None, diff, nbytes, cfg.name
    )
    if GRAPH:
        row = _with_graph(row, _graph_ms(sets, ours), _graph_ms(sets, peer))
    return row


# ---------------------------------------------------------------------------------- FP8


class _Cached(Exception):
    """Internal: the peer timing of this shape is already known."""


def _peer_fp8(qa, sa, qb, sb, recipe, out):
    """torch's blockwise FP8 GEMM (cuBLAS): A [M,K] row-major, B as [K,N] column-major, MN-major scales.

    Scale layouts torch requires: sa [M, K/128] strides (1, M); 128x128 sb as [round4(K/128), N/128]
    strides (1, round4(K/128)); 1x128 sb [N, K/128] strides (1, N).
    """
    import torch.nn.functional as F

    m, n = qa.shape[0], qb.shape[0]
    kb = sa.shape[1]
    sa_t = torch.empty_strided((m, kb), (1, m), dtype=torch.float32, device=sa.device)
    sa_t.copy_(sa)
    if recipe == (1, 128, 128):
        l4 = -(-kb // 4) * 4
        buf = torch.zeros(sb.shape[0], l4, device=sb.device, dtype=torch.float32)
        buf[:, :kb] = sb
        sb_t = buf.t()
        rb = F.ScalingType.BlockWise128x128
    else:
        sb_t = torch.empty_strided((n, kb), (1, n), dtype=torch.float32, device=sb.device)
        sb_t.copy_(sb)
        rb = F.ScalingType.BlockWise1x128
    ra = F.ScalingType.BlockWise1x128
    assert sa_t.shape == (m, kb) and qb.t().shape[1] == n

    if hasattr(F, "scaled_mm"):

        def call():
            return F.scaled_mm(qa, qb.t(), sa_t, ra, sb_t, rb, output_dtype=out.dtype)

    else:  # older torch: the private op infers the blockwise recipe from the scale shapes

        def call():
            return torch._scaled_mm(qa, qb.t(), scale_a=sa_t, scale_b=sb_t, out_dtype=out.dtype)

    return call


def bench_fp8(layout: str, recipe: tuple[int, int, int], m: int, n: int, k: int, config=None) -> dict[str, Any]:
    """One FP8 row: cutile ``fp8_gemm_<layout>`` (bf16 out) vs torch blockwise ``scaled_mm`` (NT data)."""
    from tilegemm.ops import api as tg
    from tilegemm.ops.cutile import gemm, heuristics, launch
    from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
    from tilegemm.testing import calc_diff

    ta, tb = layout[0] == "t", layout[1] == "n"

    def make():
        xa = torch.randn(m, k, device="cuda")
        xb = torch.randn(n, k, device="cuda")
        qa, sa = per_token_cast_to_fp8(xa)
        qb, sb = per_block_cast_to_fp8(xb) if recipe == (1, 128, 128) else per_token_cast_to_fp8(xb)
        sa_mn = get_mn_major_tma_aligned_tensor(sa)
        # the public op takes a transposed operand's scales transposed too (DeepGEMM's orientation)
        a = (_store(qa, ta), sa_mn.t() if ta else sa_mn)
        b = (_store(qb, tb), sb.t() if tb else sb)
        return a, b, torch.empty(m, n, device="cuda", dtype=torch.bfloat16), (qa, sa, qb, sb)

    nbytes = m * k + n * k + 2 * m * n
    sets = _rotating(make, nbytes)
    op = getattr(tg, f"fp8_gemm_{layout}")

    def ours(a, b, d, _nt):
        if config is None:
            return op(a, b, d, recipe=recipe, backend="cutile")
        logical_a = (a[0], a[1].t() if ta else a[1])  # gemm.fp8_gemm takes logical scales
        logical_b = (b[0], b[1].t() if tb else b[1])
        return gemm.fp8_gemm(layout, logical_a, logical_b, d, None, 1.0, 1.0, recipe, config=config)

    a, b, d, (qa, sa, qb, sb) = sets[0]
    ours(a, b, d, None)
    deq_a = qa.double() * sa.double().repeat_interleave(128, 1)[:, :k]
    if recipe == (1, 128, 128):
        deq_b = qb.double() * sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    else:
        deq_b = qb.double() * sb.double().repeat_interleave(128, 1)[:, :k]
    diff = calc_diff(d, deq_a @ deq_b.T)
    del deq_a, deq_b
    ms = _bench(_cycler(sets, ours))
    key = ("fp8", recipe, m, n, k)
    peer_ms, peer_error = _PEER_MS.get(key, (None, None))
    try:
        if key in _PEER_MS:
            raise _Cached
        calls = [_peer_fp8(*s[3], recipe, s[2]) for s in sets]
        calls[0]()
        torch.cuda.synchronize()
        state = {"i": 0}

        def peer():
            i = state["i"]
            state["i"] = (i + 1) % len(calls)
            return calls[i]()

        peer_ms = _bench(peer)
        _PEER_MS[key] = (peer_ms, None)
    except _Cached:
        pass
    except Exception as exc:  # cuBLAS refuses some shapes (e.g. M=1): record why
        peer_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        _PEER_MS[key] = (None, peer_error)
    cfg = config or heuristics.choose_dense_config("fp8", m, n, k, launch.num_sms())
    tag = "128x128" if recipe == (1, 128, 128) else "1x128"
    row = _row(
        f"fp8_gemm_{layout}",
        f"fp8-{tag}",
        layout,
        m,
        n,
        k,
        ms,
        "torch scaled_mm blockwise",
        peer_ms,
        peer_error,
        diff,
        nbytes,
        cfg.name,
    )
    if GRAPH:
        peer_graph = None
        if peer_error is None:
            peer_graph = _graph_ms([(_peer_fp8(*st[3], recipe, st[2]),) for st in sets], lambda f: f())
        row = _with_graph(row, _graph_ms(sets, ours), peer_graph)
    return row


# ------------------------------------------------------------------------------ reporting


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def markdown(rows: list[dict[str, Any]], preamble: str = "") -> str:
    """A markdown table of ``rows`` plus the geometric mean of the ratio per (op, dtype).

    Rows without a peer timing (refused) or whose ``calc_diff`` fails the bar (>= 1e-5) stay
    out of the mean.
    """
    lines = [
        "| op | dtype | M | N | K | cutile TFLOP/s | GB/s | peer | peer TFLOP/s | ratio | calc_diff | config | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["shape"]
        peer_t = r["peer_tflops"] if r["peer_tflops"] is not None else f"refused ({(r.get('peer_error') or '')[:60]})"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['op']} | {r['dtype']} | {s['m']} | {s['n']} | {s['k']} | {r['tflops']} | {r.get('gbps', '')} | "
            f"{r['peer']} | {peer_t} | {ratio} | {r['calc_diff']:.2e} | {r.get('config', '')} | {r.get('note', '')} |"
        )
    lines.append("")
    lines.append("| op | dtype | geomean ratio | shapes in mean | min ratio |")
    lines.append("|---|---|---|---|---|")
    keys = sorted({(r["op"], r["dtype"]) for r in rows})
    for op, dt in keys:
        ratios = [
            r["ratio"] for r in rows if r["op"] == op and r["dtype"] == dt and r["ratio"] and r["calc_diff"] < 1e-5
        ]
        g = geomean(ratios)
        lines.append(
            f"| {op} | {dt} | {g:.3f} | {len(ratios)} | {min(ratios):.3f} |" if g else f"| {op} | {dt} | - | 0 | - |"
        )
    gpu = rows[0]["gpu"] if rows else ""
    date = rows[0]["date"] if rows else ""
    head = f"Dense GEMMs on {gpu} ({date}); ratio = cutile / peer, same run.\n\n"
    return head + (preamble + "\n\n" if preamble else "") + "\n".join(lines) + "\n"


def run(kinds=("bf16", "fp8"), layouts=("nt",), recipes=((1, 128, 128),), shapes=None, log=print) -> list[dict]:
    """Benchmark every (kind, layout, recipe, shape); returns rows (printing one line per row via ``log``)."""
    rows = []
    for kind in kinds:
        for layout in layouts:
            for rec in recipes if kind == "fp8" else (None,):
                for m, n, k in shapes or BENCH_SHAPES:
                    row = bench_bf16(layout, m, n, k) if kind == "bf16" else bench_fp8(layout, rec, m, n, k)
                    rows.append(row)
                    log(
                        f"{row['op']:14s} {row['dtype']:12s} {m:5d} {n:6d} {k:6d} {row['tflops']:8.1f} "
                        f"peer {row['peer_tflops']} ratio {row['ratio']} diff {row['calc_diff']:.2e} {row['config']}"
                    )
    return rows
