"""Decode-size dense GEMMs on one GPU: every decode variant vs the persistent-tile path and the peers.

Run (from the repository root, no network needed)::

    PYTHONPATH=src python3 benchmarks/decode_variants.py [--quick] [--budget-s 270]
    PYTHONPATH=src python3 benchmarks/decode_variants.py --variants w64k256,w64k256/bm64,w64k256/bm64/s2,tile
    PYTHONPATH=src python3 benchmarks/decode_variants.py --ms 64,128,256 --variants w64k256/bm64,tile
    PYTHONPATH=src python3 benchmarks/decode_variants.py --nk 2048x768,1536x2048 --variants w64k256/s4,w64k128

For M in {1, 4, 16, 64, 128, 256} x (N, K) in {(7168, 2048), (4096, 7168), (2112, 7168),
(24576, 1536)}, BF16 and FP8 (1x128 activation / 128x128 weight scales), NT, bf16 output:

* correctness of each variant (``calc_diff`` of the bf16 result against the float64 formula,
  the dequantized one for FP8; bar 1e-5) and a bitwise-identical rerun;
* kernel-only time: one CUDA graph of 20 calls cycling over enough weight copies to defeat the
  L2 cache, the median of several replays divided by 20; for each decode variant
  (``TILEGEMM_DECODE_VARIANT`` names), the persistent-tile path (``tile``: the former default),
  and the peer (``torch.matmul`` for BF16, blockwise ``torch.nn.functional.scaled_mm`` / cuBLAS
  for FP8, skipped with a note where it refuses);
* eager time of the public call (``tilegemm.*_gemm_nt`` with its default choice) and of the
  peer: a loop of calls, so host overhead is included.

Prints one table (us, and GB/s of weight bytes) and writes ``$OUT/decode.json`` (``--out``).
Each variant is guarded: a failure is recorded and the run goes on. The run stops adding shapes
once ``--budget-s`` seconds have passed (JIT compiles included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

MS = (1, 4, 16, 64, 128, 256)
NK = ((7168, 2048), (4096, 7168), (2112, 7168), (24576, 1536))
QUICK_MS = (1, 16, 128)
QUICK_NK = ((7168, 2048), (4096, 7168))
L2_BYTES = 50 * 2**20
CALLS_PER_GRAPH = 20
BAR = 1e-5


def _log(msg: str) -> None:
    print(msg, flush=True)


def _graph_us(fn_for, count: int, replays: int = 7) -> float:
    """Kernel-only us per call: a CUDA graph of CALLS_PER_GRAPH calls ``fn_for(i)``, i cycling over ``count``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(count, CALLS_PER_GRAPH)):
            fn_for(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            fn_for(i % count)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS_PER_GRAPH)
    del graph
    return statistics.median(times)


def _eager_us(fn_for, count: int, calls: int = 40, repeats: int = 5) -> float:
    """Eager microseconds per call (host overhead included): loops of ``calls`` calls, median of ``repeats``."""
    for i in range(3):
        fn_for(i % count)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fn_for(i % count)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def _copies(weight_bytes: int) -> int:
    """Weight copies so one pass over them is at least twice the L2 (at least 2, at most 8)."""
    return max(2, min(8, math.ceil(2 * L2_BYTES / max(1, weight_bytes))))


class Case:
    """Operands of one (dtype, N, K): weight copies, and the float64 logical weight of copy 0."""

    def __init__(self, kind: str, n: int, k: int):
        from tilegemm.quant import per_block_cast_to_fp8

        self.kind, self.n, self.k = kind, n, k
        x = torch.randn(n, k, device="cuda")
        if kind == "bf16":
            w = x.bfloat16()
            self.weights = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
            self.w64 = w.double()
            self.weight_bytes = n * k * 2
        else:
            qb, sb = per_block_cast_to_fp8(x)
            self.weights = [(qb, sb)] + [(qb.clone(), sb.clone()) for _ in range(_copies(qb.numel()) - 1)]
            self.w64 = qb.double() * sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
            self.weight_bytes = n * k
        del x


def _activation(kind: str, m: int, k: int):
    """(activation operand, float64 logical activation)."""
    from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_token_cast_to_fp8

    x = torch.randn(m, k, device="cuda")
    if kind == "bf16":
        a = x.bfloat16()
        return a, a.double()
    qa, sa = per_token_cast_to_fp8(x)
    return (qa, get_mn_major_tma_aligned_tensor(sa)), qa.double() * sa.double().repeat_interleave(128, 1)[:, :k]


def _variant_call(kind: str, cfg, a, case: Case, d):
    """``fn(i)``: the call with weight copy ``i`` through ``gemm`` with ``cfg`` forced."""
    from tilegemm.ops.cutile import gemm

    if kind == "bf16":
        return lambda i: gemm.bf16_gemm(a, case.weights[i], d, config=cfg)
    return lambda i: gemm.fp8_gemm(a, case.weights[i], d, recipe=(1, 128, 128), config=cfg)


def _public_call(kind: str, a, case: Case, d):
    from tilegemm.ops import api as tg

    if kind == "bf16":
        return lambda i: tg.bf16_gemm_nt(a, case.weights[i], d)
    return lambda i: tg.fp8_gemm_nt(a, case.weights[i], d)


def _peer_call(kind: str, a, case: Case, m: int, d):
    """``(fn(i), note)``: torch.matmul, or cuBLAS blockwise FP8 (``None`` and why where it refuses)."""
    if kind == "bf16":
        return (lambda i: torch.matmul(a, case.weights[i].t(), out=d)), None
    from tilegemm.bench.peers import cublas_fp8_blockwise

    try:
        qa, sa = a[0], a[1].contiguous()
        calls = [cublas_fp8_blockwise(qa, sa, qb, sb, d.dtype) for qb, sb in case.weights]
        if isinstance(calls[0], str):
            return None, calls[0]
        return (lambda i: d.copy_(calls[i]())), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def _check(fn, d, ref) -> tuple[float | None, bool]:
    """(calc_diff of the first call's result vs ``ref``, None for NaN/inf; whether a rerun is bitwise identical)."""
    from tilegemm.testing import calc_diff

    d.fill_(float("nan"))
    fn(0)
    torch.cuda.synchronize()
    diff = calc_diff(d, ref)
    first = d.clone()
    fn(0)
    torch.cuda.synchronize()
    same = bool(torch.equal(first.view(torch.int16), d.view(torch.int16)))
    return (diff if math.isfinite(diff) else None), same


def _decode_variant(name: str):
    """The decode config a variant name describes: a shipped variant, then optional ``/bm<N>`` (activation tile
    capped at N rows), ``/s<N>`` (N K splits forced) and ``/l<N>`` (load latency hint N, 0: the compiler's),
    e.g. ``w64k256/bm64/s2/l3``."""
    from tilegemm.heuristics import cutile as heuristics

    base, *mods = name.split("/")
    cfg = heuristics.decode_config(base)
    for mod in mods:
        if mod.startswith("bm") and mod[2:].isdigit() and int(mod[2:]) >= heuristics.DECODE_MIN_BM:
            cfg = dataclasses.replace(cfg, bm_max=int(mod[2:]))
        elif mod.startswith("s") and mod[1:].isdigit() and int(mod[1:]) >= 1:
            cfg = dataclasses.replace(cfg, splits=int(mod[1:]))
        elif mod.startswith("l") and mod[1:].isdigit() and int(mod[1:]) <= 10:
            cfg = dataclasses.replace(cfg, latency=int(mod[1:]))
        else:
            raise ValueError(f"variant {name!r}: {mod!r} is none of /bm<rows>, /s<splits>, /l<latency>")
    return dataclasses.replace(cfg, name=name)


def _variants(args) -> list[str]:
    """The variants to time: ``--variants`` (comma-separated) or every decode variant and ``tile``."""
    from tilegemm.heuristics import cutile as heuristics

    every = [c.name for c in heuristics.DECODE_CONFIGS] + ["tile"]
    if not args.variants:
        return every
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = []
    for v in chosen:
        try:
            if v != "tile":
                _decode_variant(v)
        except ValueError as exc:
            unknown.append(f"{v} ({exc})")
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}, expected names from {every} (+ /bm<N>, /s<N>, /l<N>)")
    return chosen


def run(args) -> list[dict]:
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.ops.cutile import launch

    t0 = time.time()
    ms = args.ms or (QUICK_MS if args.quick else MS)
    nks = args.nk or (QUICK_NK if args.quick else NK)
    variants = _variants(args)
    default_name = heuristics.decode_config().name
    rows: list[dict] = []
    for n, k in nks:
        for kind in args.dtypes:
            if time.time() - t0 > args.budget_s:
                _log(f"budget of {args.budget_s}s spent: skipping {kind} N={n} K={k}")
                continue
            case = Case(kind, n, k)
            for m in ms:
                if time.time() - t0 > args.budget_s:
                    _log(f"budget of {args.budget_s}s spent: skipping {kind} {m}x{n}x{k}")
                    continue
                a, a64 = _activation(kind, m, k)
                ref = a64 @ case.w64.T
                d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                row = {"dtype": kind, "m": m, "n": n, "k": k, "weight_bytes": case.weight_bytes, "variants": {}}
                problem = heuristics.Problem("dense", kind, m, n, k, launch.num_sms())
                for name in variants:
                    rec: dict = {}
                    try:
                        if name == "tile":
                            cfg = heuristics.dense_tile_config(problem)
                            rec["config"] = cfg.name
                        else:
                            cfg = _decode_variant(name)
                            plan = heuristics.decode_plan(problem, cfg)
                            rec["config"] = f"{cfg.bw}x{plan.bm} split={plan.splits} grid={plan.grid[0]}"
                        fn = _variant_call(kind, cfg, a, case, d)
                        rec["calc_diff"], rec["bitwise"] = _check(fn, d, ref)
                        rec["ok"] = rec["calc_diff"] is not None and rec["calc_diff"] < BAR and rec["bitwise"]
                        rec["us"] = _graph_us(fn, len(case.weights))
                    except Exception as exc:
                        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                        if args.verbose:
                            traceback.print_exc()
                    row["variants"][name] = rec
                try:
                    pub = _public_call(kind, a, case, d)
                    row["public_eager_us"] = _eager_us(pub, len(case.weights))
                    row["public_graph_us"] = _graph_us(pub, len(case.weights))
                    public = heuristics.choose(problem)
                    if isinstance(public, heuristics.DecodeConfig):
                        row["public_variant"] = default_name
                    else:
                        row["public_variant"] = public.name if isinstance(public, heuristics.NarrowConfig) else "tile"
                except Exception as exc:
                    row["public_error"] = f"{type(exc).__name__}: {exc}"[:200]
                peer, note = _peer_call(kind, a, case, m, d)
                row["peer"] = "torch.matmul" if kind == "bf16" else "scaled_mm blockwise"
                if peer is None:
                    row["peer_note"] = note
                else:
                    try:
                        row["peer_us"] = _graph_us(peer, len(case.weights))
                        row["peer_eager_us"] = _eager_us(peer, len(case.weights))
                    except Exception as exc:
                        row["peer_note"] = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(row)
                _log(_line(row, variants) + f"   [{time.time() - t0:.0f}s]")
                del a, a64, ref, d
            del case
            torch.cuda.empty_cache()
    launch.clear_plans()
    return rows


def _fmt(us: float | None) -> str:
    return "      -" if us is None else f"{us:7.1f}"


def _line(row: dict, variants: list[str]) -> str:
    cells = []
    for name in variants:
        rec = row["variants"].get(name, {})
        mark = "" if rec.get("ok", False) else ("!" if "us" in rec else "x")
        cells.append(" " * (max(9, len(name)) - 7) + _fmt(rec.get("us")) + (mark or " "))
    peer = _fmt(row.get("peer_us"))
    shape = f"{row['dtype']:4s} {row['m']:3d}x{row['n']:5d}x{row['k']:5d}".ljust(24)
    timed = [(r["us"], nm) for nm, r in row["variants"].items() if r.get("ok") and "us" in r]
    best = min(timed) if timed else (None, "-")
    gbps = f"{row['weight_bytes'] / (best[0] * 1e-6) / 1e9:6.0f}" if best[0] else "   -  "
    eager = _fmt(row.get("public_eager_us"))
    pg = _fmt(row.get("public_graph_us"))
    return f"{shape} |" + "".join(cells) + f" | {peer} |  {pg} {eager} | {best[1]:9s} {gbps}"


def _header(variants: list[str]) -> str:
    names = " ".join(f"{v:>9s}" for v in variants)
    return (
        f"{'shape (us, kernel-only)':24s} | {names} |    peer |   public: graph   eager | best      GB/s(w)\n"
        "(! = wrong or not bitwise-reproducible, x = failed; GB/s = weight bytes / best variant's time)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="M in {1, 16, 128}, two (N, K)")
    p.add_argument("--ms", type=lambda v: tuple(int(m) for m in v.split(",")), help="the M values, e.g. 64,128,256")
    p.add_argument(
        "--nk",
        type=lambda v: tuple(tuple(int(x) for x in nk.split("x")) for nk in v.split(",")),
        help="the (N, K) pairs, e.g. 2048x768,1536x2048",
    )
    p.add_argument(
        "--dtypes",
        type=lambda v: tuple(d for d in v.split(",") if d in ("bf16", "fp8")),
        default=("bf16", "fp8"),
        help="comma-separated subset of bf16,fp8 (default both)",
    )
    p.add_argument("--budget-s", type=float, default=270.0, help="stop adding shapes after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for decode.json (default $OUT)")
    p.add_argument(
        "--variants",
        default="",
        help="comma-separated variants (default: every shipped one and tile); a decode variant may add "
        "/bm<N> (activation tile capped at N rows), /s<N> (N K splits) and /l<N> (load latency hint), "
        "e.g. w64k256/bm64/s2/l3",
    )
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing variants")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.ops.cutile import launch

    torch.manual_seed(0)
    variants = _variants(args)
    _log(f"{torch.cuda.get_device_name(0)}, {launch.num_sms()} SMs, torch {torch.__version__}")
    _log(f"default decode variant: {heuristics.decode_config().name}; M <= {heuristics.DECODE_MAX_M} routed to it")
    _log(_header(variants))
    rows = run(args)
    _log("\n" + _header(variants))
    for row in rows:
        _log(_line(row, variants))
    for row in rows:
        for name, rec in row["variants"].items():
            if "error" in rec:
                _log(f"error {row['dtype']} {row['m']}x{row['n']}x{row['k']} {name}: {rec['error']}")
        if "peer_note" in row:
            _log(f"peer {row['dtype']} {row['m']}x{row['n']}x{row['k']}: {row['peer_note']}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode.json")
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls_per_graph": CALLS_PER_GRAPH}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    _log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
