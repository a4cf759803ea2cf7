"""Grouped GEMM benchmark (issue 4): cutile vs torch peers, same run, same GPU.

Usage on a CUDA machine (``source .devbundle/setup.sh`` first on the lent H100)::

    python3 tests/benchmark/bench_grouped.py                    # full set -> results/grouped_h100.{json,md}
    python3 tests/benchmark/bench_grouped.py --sweep            # tile-config sweep on a few shapes (design work)
    python3 tests/benchmark/bench_grouped.py --only contiguous  # one family (contiguous | masked | kgrouped)

Sets (issue 4):

* contiguous: (G, m~) in {(4, 8192), (8, 4096), (128, 256), (256, 128)} x (N, K) in {(4096, 7168),
  (7168, 2048), (1536, 2048), (2048, 768)}; per-group rows random in [0.75 m, 1.25 m] rounded to
  128 (the m_indices layout needs 128-aligned segments; the same rows feed every backend).
  BF16 peer ``torch._grouped_mm`` (offs layout); FP8 peer a per-group loop of torch's blockwise
  scaled_mm (1x128 LHS, 128x128 RHS scales, cuBLAS). cutile runs the ``m_indices`` layout; the
  psum layout is timed as a second row on the same data.
* masked: (G, m~) in {(32, 192), (6, 1024), (32, 20), (6, 20)}, Mmax 4096, (N, K) in {(4096, 7168),
  (7168, 2048)}; peer ``torch.bmm`` over all Mmax rows. TFLOP/s count valid rows only.
* k-grouped: DeepGEMM's EP shapes (G, M, N, k~) in {(4, 4096, 7168, 8192), (4, 7168, 2048, 8192),
  (8, 4096, 7168, 4096), (8, 7168, 2048, 4096)}; peer the dense cutile TN kernel on the same total
  work (M x N x K_sum), the issue's "within 15% of the dense kernel".

Inputs are larger than L2 on every row here except the smallest masked ones, which rotate sets.
Value checks are off (``TILEGEMM_CHECK_VALUES=0``): the timed path is the production one.
``calc_diff`` compares cutile with the peer's output (a sanity check; the accuracy bars are
tested against float64 references in tests/ops/test_grouped_gpu.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
os.environ.setdefault("TILEGEMM_CHECK_VALUES", "0")
os.environ.setdefault("TILEGEMM_DISABLE_FALLBACK", "1")

from tilegemm.ops import api as tg  # noqa: E402
from tilegemm.ops.cutile import grouped, heuristics  # noqa: E402
from tilegemm.ops.cutile.heuristics import GroupedConfig  # noqa: E402
from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8  # noqa: E402
from tilegemm.testing import bench_kernel, calc_diff  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CONTIG_GM = [(4, 8192), (8, 4096), (128, 256), (256, 128)]
CONTIG_NK = [(4096, 7168), (7168, 2048), (1536, 2048), (2048, 768)]
MASKED_GM = [(32, 192), (6, 1024), (32, 20), (6, 20)]
MASKED_NK = [(4096, 7168), (7168, 2048)]
MMAX = 4096
K_GROUPED = [(4, 4096, 7168, 8192), (4, 7168, 2048, 8192), (8, 4096, 7168, 4096), (8, 7168, 2048, 4096)]
L2_BYTES = 50 * 2**20


def _ms(fn) -> float:
    return bench_kernel(fn, warmup=25, rep=100)


def _gpu() -> str:
    return torch.cuda.get_device_name(0)


def _sizes(groups: int, m: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(int(m * 0.75), int(m * 1.25) + 1, (groups,), generator=g).tolist()
    return [max(128, round(x / 128) * 128) for x in raw]


def _row(op, dtype, layout, shape, flops, ms, peer, peer_ms, diff, config, extra=None) -> dict[str, Any]:
    tflops = flops / (ms * 1e-3) / 1e12
    peer_tflops = flops / (peer_ms * 1e-3) / 1e12 if peer_ms else None
    row = {
        "op": op,
        "dtype": dtype,
        "layout": layout,
        "shape": shape,
        "backend": "cutile",
        "tflops": round(tflops, 1),
        "peer": peer,
        "peer_tflops": round(peer_tflops, 1) if peer_tflops else None,
        "ratio": round(tflops / peer_tflops, 3) if peer_tflops else None,
        "calc_diff": diff,
        "gpu": _gpu(),
        "date": datetime.date.today().isoformat(),
        "ms": round(ms, 4),
        "peer_ms": round(peer_ms, 4) if peer_ms else None,
        "config": config,
    }
    row.update(extra or {})
    return row


def _cfg_name(cfg: GroupedConfig | None, default: GroupedConfig) -> str:
    return (cfg or default).name


# ------------------------------------------------------------------------------ contiguous


def _m_indices(sizes: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((s,), g, dtype=torch.int32) for g, s in enumerate(sizes)]).cuda()


def _peer_fp8_loop(qa, sa, qb, sb, sizes, out):
    """Per-group torch blockwise scaled_mm (cuBLAS): scales prepared in the layouts torch requires."""
    import torch.nn.functional as F

    calls, start = [], 0
    for g, s in enumerate(sizes):
        a_g = qa[start : start + s]
        sa_g = sa[start : start + s].t().contiguous().t()  # [s, K/128], MN-major
        kb = sb.shape[2]
        l4 = -(-kb // 4) * 4
        buf = torch.zeros(sb.shape[1], l4, device=sb.device, dtype=torch.float32)
        buf[:, :kb] = sb[g]
        sb_g = buf.t()  # [round4(K/128), N/128], MN-major
        out_g = out[start : start + s]
        calls.append((a_g, qb[g], sa_g, sb_g, out_g))
        start += s

    if hasattr(F, "scaled_mm"):
        ra, rb = F.ScalingType.BlockWise1x128, F.ScalingType.BlockWise128x128

        def run():
            for a_g, b_g, sa_g, sb_g, out_g in calls:
                out_g.copy_(F.scaled_mm(a_g, b_g.t(), sa_g, ra, sb_g, rb, output_dtype=out.dtype))

    else:

        def run():
            for a_g, b_g, sa_g, sb_g, out_g in calls:
                out_g.copy_(torch._scaled_mm(a_g, b_g.t(), scale_a=sa_g, scale_b=sb_g, out_dtype=out.dtype))

    return run


_PEER_MS: dict[tuple, float] = {}  # peer timings reused across configs of a sweep
COMPILE_ONLY = False  # --compile-only: run each cutile call once (JIT warm-up of the disk cache), time nothing


def bench_contiguous(
    fp8: bool, groups: int, m: int, n: int, k: int, cfg: GroupedConfig | None = None, psum: bool = True
) -> list[dict]:
    sizes = _sizes(groups, m, seed=groups * 131 + n + k)
    rows = sum(sizes)
    flops = 2.0 * rows * n * k
    m_indices = _m_indices(sizes)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    d = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    shape = {"groups": groups, "m_per_group": m, "m_sum": rows, "n": n, "k": k}
    if fp8:
        xa = torch.randn(rows, k, device="cuda")
        qa, sa = per_token_cast_to_fp8(xa)
        del xa
        qb = torch.empty(groups, n, k, device="cuda", dtype=torch.float8_e4m3fn)
        sb = torch.empty(groups, -(-n // 128), -(-k // 128), device="cuda")
        for g in range(groups):  # quantize expert by expert (bounded fp32 scratch)
            qb[g], sb[g] = per_block_cast_to_fp8(torch.randn(n, k, device="cuda"))
        a_arg, b_arg = (qa, sa), (qb, sb)
        op = "m_grouped_fp8_gemm_nt_contiguous"
        default = heuristics.grouped_config(
            op, kind=0, fp8=True, rows=rows, n=n, k=k, groups=groups, expected_m=rows // groups
        )
        peer_name = "torch scaled_mm blockwise per-group loop"
        peer_out = torch.empty_like(d)
        peer_fn = _peer_fp8_loop(qa, sa, qb, sb, sizes, peer_out)
    else:
        a_arg = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        b_arg = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16)
        op = "m_grouped_bf16_gemm_nt_contiguous"
        default = heuristics.grouped_config(
            op, kind=0, fp8=False, rows=rows, n=n, k=k, groups=groups, expected_m=rows // groups
        )
        peer_name = "torch._grouped_mm"
        peer_out = torch.empty_like(d)
        bt = b_arg.transpose(1, 2)

        def peer_fn():
            peer_out.copy_(torch._grouped_mm(a_arg, bt, offs=offs, out_dtype=torch.bfloat16))

    def ours(kind, index):
        return lambda: grouped._m_grouped(op, a_arg, b_arg, d, index, kind, True, fp8, 0, cfg=cfg)

    out_rows = []
    if COMPILE_ONLY:
        ours(grouped.KIND_INDICES, m_indices)()
        if psum:
            ours(grouped.KIND_PSUM, offs)()
        torch.cuda.synchronize()
        return []
    peer_fn()
    key = (fp8, groups, m, n, k)
    if key not in _PEER_MS:
        _PEER_MS[key] = _ms(peer_fn)
    peer_ms = _PEER_MS[key]
    layouts = [(grouped.KIND_INDICES, m_indices, "nt")] + ([(grouped.KIND_PSUM, offs, "nt-psum")] if psum else [])
    for kind, index, lay in layouts:
        fn = ours(kind, index)
        fn()
        torch.cuda.synchronize()
        diff = calc_diff(d, peer_out)
        ms = _ms(fn)
        name = _cfg_name(cfg, default)
        out_rows.append(_row(op, "fp8" if fp8 else "bf16", lay, shape, flops, ms, peer_name, peer_ms, diff, name))
    return out_rows


# -------------------------------------------------------------------------------- masked


def bench_masked(fp8: bool, groups: int, m: int, n: int, k: int, cfg: GroupedConfig | None = None) -> list[dict]:
    g = torch.Generator().manual_seed(groups * 7 + m)
    sizes = torch.randint(int(m * 0.5), int(m * 1.5) + 1, (groups,), generator=g).clamp(max=MMAX).tolist()
    masked_m = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    valid = sum(sizes)
    flops = 2.0 * valid * n * k
    a = torch.randn(groups, MMAX, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(groups, MMAX, n, dtype=torch.bfloat16, device="cuda")
    peer_out = torch.empty_like(d)

    def peer_fn():
        torch.bmm(a, b.transpose(1, 2), out=peer_out)

    if fp8:
        qa, sa = per_token_cast_to_fp8(a)
        qb, sb = per_block_cast_to_fp8(b)
        a_arg, b_arg = (qa, sa), (qb, sb)
        op = "m_grouped_fp8_gemm_nt_masked"
    else:
        a_arg, b_arg = a, b
        op = "m_grouped_bf16_gemm_nt_masked"
    default = heuristics.grouped_config(op, kind=2, fp8=fp8, rows=groups * MMAX, n=n, k=k, groups=groups, expected_m=m)

    def fn():
        grouped._m_grouped(op, a_arg, b_arg, d, masked_m, grouped.KIND_MASKED, True, fp8, m, cfg=cfg)

    fn()
    torch.cuda.synchronize()
    if COMPILE_ONLY:
        return []
    peer_fn()
    mask = torch.arange(MMAX, device="cuda")[None, :] < masked_m[:, None]
    diff = calc_diff(d[mask], peer_out[mask])
    peer_ms = _ms(peer_fn)
    ms = _ms(fn)
    shape = {"groups": groups, "m_per_group": m, "valid_rows": valid, "mmax": MMAX, "n": n, "k": k}
    name = _cfg_name(cfg, default)
    return [_row(op, "fp8" if fp8 else "bf16", "nt-masked", shape, flops, ms, "torch.bmm (all Mmax rows)", peer_ms,
                 diff, name)]  # fmt: skip


# ----------------------------------------------------------------------------- k-grouped


def bench_k_grouped(fp8: bool, groups: int, m: int, n: int, k: int, cfg: GroupedConfig | None = None) -> list[dict]:
    ks = _sizes(groups, k, seed=groups + m + n)
    k_sum = sum(ks)
    flops = 2.0 * m * n * k_sum
    d = torch.empty(groups, m, n, device="cuda")
    dense_d = torch.empty(m, n, device="cuda")
    a = torch.randn(k_sum, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k_sum, n, device="cuda", dtype=torch.bfloat16)
    if fp8:
        qa_t, sa_t = per_token_cast_to_fp8(a.t())  # [M, K_sum], [M, K_sum/128]
        qb_t, sb_t = per_token_cast_to_fp8(b.t())
        a_arg = (qa_t.t().contiguous(), sa_t.t().contiguous())
        b_arg = (qb_t.t().contiguous(), sb_t.t().contiguous())
        op = "k_grouped_fp8_gemm_tn_contiguous"

        def dense():  # dense FP8 TN on the same data: a [K, M], b [K, N]; scales in the data's orientation
            tg.fp8_gemm_tn(a_arg, b_arg, dense_d, recipe=(1, 1, 128), backend="cutile")

    else:
        a_arg, b_arg = a, b
        op = "k_grouped_bf16_gemm_tn_contiguous"

        def dense():
            tg.bf16_gemm_tn(a, b, dense_d, backend="cutile")

    default = heuristics.grouped_config(op, kind=3, fp8=fp8, rows=m, n=n, k=k_sum, groups=groups, expected_m=m)
    ks_t = torch.tensor(ks, dtype=torch.int32, device="cuda")

    def fn():
        grouped._k_grouped(op, a_arg, b_arg, d, ks, ks_t, None, fp8, cfg=cfg)

    fn()
    torch.cuda.synchronize()
    if COMPILE_ONLY:
        return []
    dense()
    torch.cuda.synchronize()
    diff = calc_diff(d.sum(0), dense_d)  # sum over groups of a_g.T b_g == a.T b
    peer_ms = _ms(dense)
    ms = _ms(fn)
    shape = {"groups": groups, "m": m, "n": n, "k_per_group": k, "k_sum": k_sum}
    name = _cfg_name(cfg, default)
    return [_row(op, "fp8" if fp8 else "bf16", "tn", shape, flops, ms, "cutile dense tn (same M,N,K_sum)", peer_ms,
                 diff, name)]  # fmt: skip


# ------------------------------------------------------------------------------- driver


def geomean(values) -> float | None:
    vals = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def markdown(rows: list[dict]) -> str:
    """Markdown table of ``rows`` plus geometric-mean ratios per (op, dtype, layout) and shape subset."""
    lines = [
        "| op | dtype | layout | shape | cutile TFLOP/s | peer | peer TFLOP/s | ratio | calc_diff vs peer | config |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = " ".join(f"{k}={v}" for k, v in r["shape"].items())
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['layout']} | {shape} | {r['tflops']} | {r['peer']} | "
            f"{r['peer_tflops']} | {ratio} | {r['calc_diff']:.2e} | {r['config']} |"
        )
    lines += ["", "| op | dtype | layout | subset | geomean ratio | rows |", "|---|---|---|---|---|---|"]
    keys = sorted({(r["op"], r["dtype"], r["layout"]) for r in rows})
    for op, dt, lay in keys:
        sel = [r for r in rows if (r["op"], r["dtype"], r["layout"]) == (op, dt, lay)]
        subsets = {"all": sel}
        if "contiguous" in op:
            subsets["many small experts (G>=128)"] = [r for r in sel if r["shape"]["groups"] >= 128]
        if "masked" in op:
            subsets["m~20"] = [r for r in sel if r["shape"]["m_per_group"] == 20]
            subsets["m~192"] = [r for r in sel if r["shape"]["m_per_group"] == 192]
        for name, sub in subsets.items():
            g = geomean(r["ratio"] for r in sub)
            if g:
                lines.append(f"| {op} | {dt} | {lay} | {name} | {g:.3f} | {len(sub)} |")
    gpu = rows[0]["gpu"] if rows else ""
    date = rows[0]["date"] if rows else ""
    head = f"Grouped GEMMs on {gpu} ({date}); ratio = cutile / peer, same run; value checks off.\n\n"
    return head + "\n".join(lines) + "\n"


SWEEP = {
    "bf16": [
        GroupedConfig(128, 256, 64, num_worker_warps=8),
        GroupedConfig(128, 128, 64),
        GroupedConfig(128, 128, 64, gm=16),
        GroupedConfig(64, 128, 64),
    ],
    "fp8": [
        GroupedConfig(128, 128, 128, fast_acc=True),
        GroupedConfig(128, 128, 128, fast_acc=True, num_worker_warps=8),
        GroupedConfig(128, 128, 128),
        GroupedConfig(64, 128, 128, fast_acc=True, num_worker_warps=4, occupancy=2),
    ],
}


def run(only: str | None, sweep: bool, budget_s: float, log=print, save=None) -> list[dict]:
    """Benchmark rows in priority order (BF16 first; the FP8 target shape early), stopping after ``budget_s``."""
    rows: list[dict] = []
    end = time.time() + budget_s

    def go(fn, *args, **kw):
        if time.time() > end:
            log(f"budget spent: skipping {fn.__name__}{args}")
            return
        try:
            for r in fn(*args, **kw):
                rows.append(r)
                log(
                    f"{r['op']:36s} {r['layout']:10s} {json.dumps(r['shape'])} {r['config']:22s} "
                    f"{r['tflops']:7.1f} vs {r['peer_tflops']} -> {r['ratio']}  diff {r['calc_diff']:.1e}"
                )
                if save is not None:
                    save(rows)
        except Exception as exc:  # keep the run going; the row is reported missing
            log(f"FAILED {fn.__name__}{args} {kw}: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()

    if sweep:
        for gm, nk in (((4, 8192), (4096, 7168)), ((128, 256), (1536, 2048))):
            for i in range(max(len(SWEEP["bf16"]), len(SWEEP["fp8"]))):
                for fp8 in (False, True):
                    cfgs = SWEEP["fp8" if fp8 else "bf16"]
                    if i < len(cfgs):
                        go(bench_contiguous, fp8, *gm, *nk, cfg=cfgs[i], psum=False)
        return rows
    fp8_first = ((4, 8192), (4096, 7168))
    plan = []
    if only in (None, "contiguous"):
        plan += [(bench_contiguous, (False, *gm, *nk), {}) for gm in CONTIG_GM for nk in CONTIG_NK]
        plan += [(bench_contiguous, (True, *fp8_first[0], *fp8_first[1]), {"psum": False})]
    if only in (None, "masked"):
        plan += [(bench_masked, (False, *gm, *nk), {}) for gm in MASKED_GM for nk in MASKED_NK]
    if only in (None, "kgrouped"):
        plan += [(bench_k_grouped, (False, *shp), {}) for shp in K_GROUPED]
    if only in (None, "contiguous"):
        plan += [
            (bench_contiguous, (True, *gm, *nk), {"psum": False})
            for gm in CONTIG_GM
            for nk in CONTIG_NK
            if (gm, nk) != fp8_first
        ]
    if only in (None, "masked"):
        plan += [(bench_masked, (True, *gm, *nk), {}) for gm in MASKED_GM for nk in MASKED_NK]
    if only in (None, "kgrouped"):
        plan += [(bench_k_grouped, (True, *shp), {}) for shp in K_GROUPED]
    for fn, args, kw in plan:
        go(fn, *args, **kw)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["contiguous", "masked", "kgrouped"])
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--budget", type=float, default=1e9, help="stop starting rows after this many seconds")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="grouped_h100")
    p.add_argument("--compile-only", action="store_true", help="JIT every cutile variant of the set, time nothing")
    args = p.parse_args()
    global COMPILE_ONLY
    COMPILE_ONLY = args.compile_only
    args.out.mkdir(parents=True, exist_ok=True)

    def save(rows: list[dict]) -> None:  # after every row, so a run cut short keeps what it measured
        (args.out / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / f"{args.name}.md").write_text(markdown(rows))

    rows = run(args.only, args.sweep, args.budget, save=None if COMPILE_ONLY else save)
    if not COMPILE_ONLY:
        save(rows)
        print(markdown(rows))


if __name__ == "__main__":
    main()
