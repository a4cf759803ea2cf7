"""Dense GEMM benchmark (issue 3): cutile vs torch.matmul (BF16) and torch blockwise scaled_mm (FP8).

Usage on a CUDA machine (``source .devbundle/setup.sh`` first on the lent H100):

    python3 tests/benchmark/bench_dense.py                      # full set -> results/dense_h100.{json,md}
    python3 tests/benchmark/bench_dense.py --sweep --out DIR    # tile-config sweep (design work)
    python3 tests/benchmark/bench_dense.py --check              # quick correctness of every op path

The shape set is DeepGEMM's: M in {1, 64, 128, 4096} x (N, K) in {(2112, 7168), (576, 7168),
(24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)}, plus 8192^3.
``--budget S`` stops starting new rows after S seconds (device time is scarce).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tilegemm.bench import dense  # noqa: E402
from tilegemm.ops.cutile.heuristics import DenseConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

SWEEP_SHAPES = [
    (4096, 2112, 7168),
    (4096, 7168, 2048),
    (4096, 24576, 1536),
    (128, 7168, 16384),
    (64, 2112, 7168),
    (1, 2112, 7168),
    (64, 576, 7168),
]
FP8_SWEEP = [
    DenseConfig("fp8", 64, 128, 128, num_worker_warps=4, occupancy=2, fast_acc=True),
    DenseConfig("fp8", 64, 128, 128, num_worker_warps=4, occupancy=2, fast_acc=True, scale_tma=False),
    DenseConfig("fp8", 64, 128, 128, num_worker_warps=4, occupancy=2, fast_acc=True, group_m=16),
    DenseConfig("fp8", 64, 128, 128, num_worker_warps=4, occupancy=2, fast_acc=True, min_split_kb=8),
    DenseConfig("fp8", 128, 128, 128, num_worker_warps=8, scale_tma=False),
]
BF16_SWEEP = [
    DenseConfig("bf16", 128, 128, 64),
    DenseConfig("bf16", 128, 128, 64, min_split_kb=8),
    DenseConfig("bf16", 128, 256, 64, num_worker_warps=8),
    DenseConfig("bf16", 64, 128, 64),
]


# ------------------------------------------------------------- ceilings (experiments only)

import cuda.tile as ct  # noqa: E402

_ZERO = ct.PaddingMode.ZERO


def _plain_fp8_body(A, B, D, K: int, TM: ct.Constant[int], TN: ct.Constant[int], FAST_ACC: ct.Constant[bool]):
    """Unscaled FP8 GEMM with the MMA accumulating in place: the ceiling the promotion is measured against."""
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    per_group = 8 * num_n
    for tile in range(ct.bid(0), num_m * num_n, ct.num_blocks(0)):
        first_m = (tile // per_group) * 8
        rows = ct.minimum(num_m - first_m, 8)
        pm = first_m + (tile % per_group) % rows
        pn = (tile % per_group) // rows
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for kb in range(ct.cdiv(K, 128)):
            a = ct.load(A, (pm, kb), (TM, 128), padding_mode=_ZERO)
            b = ct.load(B, (kb, pn), (128, TN), order=(1, 0), padding_mode=_ZERO)
            acc = ct.mma(a, b, acc, use_fast_acc=FAST_ACC)
        ct.store(D, (pm, pn), ct.astype(acc, D.dtype))


CEILINGS = [
    ("plain_fp8_64x128_w4_o2", dict(num_worker_warps=4, occupancy=2), 64, 128, 2),
    ("plain_fp8_128x128_w8", dict(num_worker_warps=8), 128, 128, 1),
    ("plain_fp8_128x256_w8", dict(num_worker_warps=8), 128, 256, 1),
]


def ceilings(fh, budget) -> None:
    """TFLOP/s of unscaled FP8 kernels (no promotion) on the big sweep shapes."""
    from tilegemm.testing import bench_kernel

    for name, opts, tm, tn, per_sm in CEILINGS:
        kern = ct.kernel(_plain_fp8_body, **opts)
        for m, n, k in SWEEP_SHAPES[:3]:
            if budget.left() < 0:
                return
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            tiles = -(-m // tm) * -(-n // tn)
            grid = (min(tiles, torch.cuda.get_device_properties(0).multi_processor_count * per_sm), 1, 1)
            args = (a, b, d, k, tm, tn, True)

            def call(grid=grid, kern=kern, args=args):
                ct.launch(torch.cuda.current_stream(), grid, kern, args)

            try:
                ms = bench_kernel(call)
            except Exception as exc:
                _log(fh, f"ceiling {name} FAILED {type(exc).__name__}: {str(exc)[:200]}")
                break
            _log(fh, f"ceiling {name:28s} {m:5d}x{n:5d}x{k:5d} {2 * m * n * k / ms / 1e9:8.1f} TF/s (unscaled)")


class Budget:
    def __init__(self, seconds: float):
        self.end = time.time() + seconds

    def left(self) -> float:
        return self.end - time.time()


def _log(fh, msg: str) -> None:
    print(msg, flush=True)
    if fh:
        fh.write(msg + "\n")
        fh.flush()


def check_all(fh, budget: Budget) -> None:
    """Quick correctness of every op path (layout x dtype x recipe) on two shapes, default configs."""
    from tilegemm.ops import api as tg
    from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
    from tilegemm.testing import calc_diff, poisoned

    for m, n, k in [(333, 777, 1000), (4096, 2112, 7168)]:
        for layout in ("nt", "nn", "tn", "tt"):
            if budget.left() < 0:
                return
            ta, tb = layout[0] == "t", layout[1] == "n"
            a_log = torch.randn(m, k, device="cuda").bfloat16()
            b_log = torch.randn(n, k, device="cuda").bfloat16()
            a = a_log.t().contiguous() if ta else a_log
            b = b_log.t().contiguous() if tb else b_log
            d = poisoned((m, n), torch.float32, "cuda")
            t0 = time.time()
            getattr(tg, f"bf16_gemm_{layout}")(a, b, d, backend="cutile")
            torch.cuda.synchronize()
            diff = calc_diff(d, a_log.double() @ b_log.double().T)
            _log(fh, f"check bf16 {layout} {m}x{n}x{k} diff={diff:.2e} first-call {time.time() - t0:.1f}s")
            for recipe in ((1, 128, 128), (1, 1, 128)):
                xa, xb = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
                qa, sa = per_token_cast_to_fp8(xa)
                qb, sb = per_block_cast_to_fp8(xb) if recipe == (1, 128, 128) else per_token_cast_to_fp8(xb)
                deq_a = qa.double() * sa.double().repeat_interleave(128, 1)[:, :k]
                if recipe == (1, 128, 128):
                    deq_b = qb.double() * sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
                else:
                    deq_b = qb.double() * sb.double().repeat_interleave(128, 1)[:, :k]
                sa_mn = get_mn_major_tma_aligned_tensor(sa)  # scales transposed along with their data:
                fa = (qa.t().contiguous(), sa_mn.t()) if ta else (qa, sa_mn)
                fb = (qb.t().contiguous(), sb.t()) if tb else (qb, sb)
                d = poisoned((m, n), torch.bfloat16, "cuda")
                t0 = time.time()
                getattr(tg, f"fp8_gemm_{layout}")(fa, fb, d, backend="cutile")
                torch.cuda.synchronize()
                diff = calc_diff(d, deq_a @ deq_b.T)
                unq = calc_diff(d, xa.double() @ xb.double().T)
                _log(
                    fh,
                    f"check fp8 {recipe} {layout} {m}x{n}x{k} diff={diff:.2e} unquant={unq:.2e} "
                    f"first-call {time.time() - t0:.1f}s",
                )


def sweep(fh, budget: Budget, kinds: list[str]) -> list[dict]:
    """TFLOP/s of each candidate config (NT; FP8 with 128x128 RHS scales) on SWEEP_SHAPES."""
    rows = []
    for kind in kinds:
        cfgs = FP8_SWEEP if kind == "fp8" else BF16_SWEEP
        for cfg in cfgs:
            for m, n, k in SWEEP_SHAPES:
                if budget.left() < 0:
                    _log(fh, "budget exhausted")
                    return rows
                try:
                    t0 = time.time()
                    if kind == "fp8":
                        row = dense.bench_fp8("nt", (1, 128, 128), m, n, k, config=cfg)
                    else:
                        row = dense.bench_bf16("nt", m, n, k, config=cfg)
                except Exception as exc:
                    _log(fh, f"sweep {cfg.name} {m}x{n}x{k} FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    break
                rows.append(row)
                _log(
                    fh,
                    f"sweep {cfg.name:34s} {m:5d}x{n:5d}x{k:5d} {row['tflops']:8.1f} TF/s peer "
                    f"{row['peer_tflops']} ratio {row['ratio']} diff {row['calc_diff']:.1e} ({time.time() - t0:.1f}s)",
                )
    return rows


def _bench_row(fh, kind: str, layout: str, rec, m: int, n: int, k: int, tag: str = "") -> dict | None:
    """One row of the dense set (``dense.bench_fp8`` / ``bench_bf16``), or ``None`` after logging why it failed."""
    try:
        if kind == "fp8":
            return dense.bench_fp8(layout, rec, m, n, k)
        return dense.bench_bf16(layout, m, n, k)
    except Exception as exc:
        _log(fh, f"{tag}{kind} {layout} {m}x{n}x{k} FAILED {type(exc).__name__}: {str(exc)[:300]}")
        return None


EXTRA_SHAPES = [(4096, 4096, 7168), (4096, 7168, 2048), (64, 2112, 7168)]


def extras(fh, budget: Budget) -> list[dict]:
    """NN/TN/TT layouts (BF16 and FP8) and the 1x128 RHS recipe (FP8 NT) on a few shapes."""
    rows = []
    jobs = [("fp8", "nt", (1, 1, 128))] + [
        (k, lay, (1, 128, 128)) for lay in ("nn", "tn", "tt") for k in ("bf16", "fp8")
    ]
    for kind, layout, rec in jobs:
        for m, n, k in EXTRA_SHAPES:
            if budget.left() < 0:
                return rows
            row = _bench_row(fh, kind, layout, rec, m, n, k, tag="extra ")
            if row is None:
                continue
            rows.append(row)
            _log(fh, f"extra {row['op']} {row['dtype']} {m}x{n}x{k} {row['tflops']} TF/s ratio {row['ratio']}")
    return rows


TUNE_BIG = [(4096, 2112, 7168), (4096, 7168, 2048), (4096, 24576, 1536), (4096, 4096, 7168)]
TUNE_SMALL = [(64, 2112, 7168), (128, 7168, 16384), (128, 2112, 7168)]


def tune_fp8(fh, budget: Budget):
    """Measure every FP8 config on big-M and small-M shapes; return the (big, small) winners by geomean."""
    from tilegemm.ops.cutile import heuristics

    scores: dict = {}
    rows = []
    for cfg in heuristics.FP8_CONFIGS:
        for shape in TUNE_BIG + TUNE_SMALL:
            if budget.left() < 0:
                break
            try:
                row = dense.bench_fp8("nt", (1, 128, 128), *shape, config=cfg)
            except Exception as exc:
                _log(fh, f"tune {cfg.name} {shape} FAILED {type(exc).__name__}: {str(exc)[:200]}")
                continue
            rows.append(row)
            scores[(cfg, shape)] = row["tflops"]
            _log(
                fh, f"tune {cfg.name:40s} {shape} {row['tflops']:8.1f} TF/s ratio {row['ratio']} {row['calc_diff']:.1e}"
            )

    def winner(shapes):
        best, best_g = None, -1.0
        for cfg in heuristics.FP8_CONFIGS:
            vals = [scores.get((cfg, s)) for s in shapes]
            if all(vals):
                g = dense.geomean(vals)
                if g > best_g:
                    best, best_g = cfg, g
        return best or heuristics.FP8_CONFIGS[0]

    return winner(TUNE_BIG), winner(TUNE_SMALL), rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--ceilings", action="store_true", help="unscaled FP8 kernels (experiment)")
    p.add_argument(
        "--tune", action="store_true", help="measure FP8 configs first and use the winners (M>=1024 / M<1024)"
    )
    p.add_argument("--full", action="store_true", help="the full benchmark set (default when no mode is given)")
    p.add_argument("--kinds", default="fp8,bf16")
    p.add_argument("--layouts", default="nt", help="full set: comma list of layouts")
    p.add_argument("--recipes", default="128x128", help="full set: 128x128,1x128")
    p.add_argument("--out", default=None, help="directory for logs/results (default: tests/benchmark/results)")
    p.add_argument("--name", default="dense_h100")
    p.add_argument("--budget", type=float, default=1e9)
    p.add_argument("--extras", action="store_true", help="after the set: other layouts and the 1x128 recipe")
    p.add_argument("--graph", action="store_true", help="also time CUDA-graph replays (kernel time, no host overhead)")
    p.add_argument("--extras-budget", type=float, default=30.0)
    p.add_argument("--shapes", default=None, help="semicolon list of MxNxK (default: the benchmark set)")
    args = p.parse_args()

    dense.GRAPH = args.graph
    out = Path(args.out) if args.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    kinds = args.kinds.split(",")
    with open(out / f"{args.name}_log.txt", "a") as fh:
        _log(fh, f"# {torch.cuda.get_device_name(0)} torch {torch.__version__}")
        if args.check:
            check_all(fh, budget)
        if args.ceilings:
            ceilings(fh, budget)
        if args.tune:
            from tilegemm.ops.cutile import heuristics

            big, small, tune_rows = tune_fp8(fh, Budget(min(55.0, budget.left())))
            (out / f"{args.name}_tune.json").write_text(json.dumps(tune_rows, indent=1) + "\n")
            _log(fh, f"tuned FP8: M>=1024 -> {big.name}, M<1024 -> {small.name}")
            base = heuristics.choose_dense_config

            def chooser(kind, m, n, k, sms, _base=base):
                if kind == "fp8":
                    return big if m >= 1024 else small
                return _base(kind, m, n, k, sms)

            heuristics.choose_dense_config = chooser
        if args.sweep:
            rows = sweep(fh, budget, kinds)
            (out / f"{args.name}_sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
        if args.full or not (args.check or args.sweep or args.ceilings or args.tune):
            recipes = [(1, 128, 128) if r == "128x128" else (1, 1, 128) for r in args.recipes.split(",")]
            shapes = dense.BENCH_SHAPES
            if args.shapes:
                shapes = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split(";")]
            rows = []
            for kind in kinds:
                for layout in args.layouts.split(","):
                    for rec in recipes if kind == "fp8" else [None]:
                        for m, n, k in shapes:
                            if budget.left() < 0:
                                break
                            row = _bench_row(fh, kind, layout, rec, m, n, k)
                            if row is None:
                                continue
                            rows.append(row)
                            _log(
                                fh,
                                f"{row['op']} {row['dtype']} {m}x{n}x{k} {row['tflops']} TF/s peer "
                                f"{row['peer_tflops']} ratio {row['ratio']} diff {row['calc_diff']:.1e} "
                                f"{row['config']} {row['peer_error'] or ''}",
                            )
            if args.extras:
                rows += extras(fh, Budget(args.extras_budget))
            (out / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
            (out / f"{args.name}.md").write_text(dense.markdown(rows))
            _log(fh, dense.markdown(rows))


if __name__ == "__main__":
    main()
