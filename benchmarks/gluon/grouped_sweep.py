"""Time the gluon grouped FP8 kernels (the ws kernel's m-grouped and k-grouped forms) beside cutile and DeepGEMM.

Run on the H200 machine (``source .devbundle/setup.sh``; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    PYTHONPATH=src python3 benchmarks/gluon/grouped_sweep.py OUT.json [--family m|k] [--designs a,b]

m-grouped (``--family m``) rows: the benchmark set's m-grouped FP8 rows (``tilegemm.bench.m_grouped``: groups x rows per
group x (N, K), group sizes drawn around the mean and aligned to 128) and MoE layers with skewed routing (128 experts,
Zipf-like loads, a few experts empty, each expert's rows padded to 128 with -1). Implementations: each ws design run
directly (``ws_plan(..., m_index=)``), the public op with default settings (``tilegemm``: the automatic choice), the
public op on cutile and on gluon (forced), DeepGEMM's ``m_grouped_fp8_gemm_nt_contiguous``. Every implementation's
output is checked on 256 sampled rows against the float64 formula (``calc_diff``) before it is timed; timing is
kernel-only (CUDA-graph replay, input sets rotated past L2, median per call) and eager (``--eager``: back-to-back calls,
L2 not flushed) for the public calls. Rows of -1 padding are left out of the check: DeepGEMM leaves them undefined.

k-grouped (``--family k``) rows: the benchmark set's k-grouped FP8 rows (``tilegemm.bench.k_grouped``), every call
accumulating into ``d`` (``c=d``, as the harness runs them); the public ``tn`` op (its transposing copies included)
beside DeepGEMM's ``k_grouped_fp8_gemm_nt_contiguous`` on its per-group K-major layout of the same values; the designs
run on the K-major operands directly (``name@R`` gives the loader warp R registers); with ``--in-place`` each design
also run on DeepGEMM's layout read in place (``<design>_in_place``: ``ws_plan(..., in_place=True)``, descriptors built
on the device per group block; its output also compared bit for bit with the design's on the gathered operands).
Checked on every element against the float64 formula.

Prints a table last and writes every number to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch

import tilegemm
from tilegemm.bench import device, inputs, peers, timing
from tilegemm.bench import k_grouped as k_family
from tilegemm.bench import m_grouped as family
from tilegemm.ops.gluon import fp8_gemm_ws as ws
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token

ALIGN = 128
#: MoE layers with skewed routing: (experts, routed rows, N, K, empty experts)
SKEWED = [
    (128, 16384, 4096, 7168, 9),
    (128, 32768, 7168, 2048, 9),
    (128, 65536, 4096, 7168, 9),
    (64, 24576, 2816, 2048, 5),
]


def set_rows() -> list[dict]:
    """The benchmark set's FP8 m-grouped rows (sizes as the harness draws them)."""
    out = []
    for spec in family.specs("full"):
        if spec["dtype"] != "fp8":
            continue
        g, m, n, k = spec["groups"], spec["m_per_group"], spec["n"], spec["k"]
        sizes = inputs.group_sizes(g, m, inputs.seed_of("m_grouped", g, m, n, k), align=ALIGN)
        out.append({"kind": "set", "sizes": sizes, "n": n, "k": k, "name": f"g{g}m{m}"})
    return out


def skewed_rows() -> list[dict]:
    """Zipf-like expert loads (exponent 1.1, shuffled), ``empty`` experts given none, rows padded per expert."""
    out = []
    for experts, routed, n, k, empty in SKEWED:
        rng = random.Random(experts * routed + n)
        weights = [1.0 / (i + 1) ** 1.1 for i in range(experts - empty)]
        rng.shuffle(weights)
        total = sum(weights)
        sizes = [int(routed * w / total) for w in weights] + [0] * empty
        rng.shuffle(sizes)
        out.append({"kind": "skewed", "sizes": sizes, "n": n, "k": k, "name": f"e{experts}r{routed}"})
    return out


def m_indices(sizes: list[int]) -> torch.Tensor:
    parts = []
    for g, s in enumerate(sizes):
        seg = torch.full((-(-s // ALIGN) * ALIGN,), -1, dtype=torch.int32)
        seg[:s] = g
        parts.append(seg)
    return torch.cat(parts).cuda()


def operands(index: torch.Tensor, groups: int, n: int, k: int, seed: int):
    """tilegemm's FP8 operands (A's scales MN-major TMA-aligned) and DeepGEMM's own casts of the same values."""
    a = inputs.randn((index.numel(), k), torch.bfloat16, seed)
    qa, sa = tilegemm.per_token_cast_to_fp8(a)
    qb = torch.empty(groups, n, k, device="cuda", dtype=torch.float8_e4m3fn)
    sb = torch.empty(groups, -(-n // 128), -(-k // 128), device="cuda")
    for g in range(groups):  # one expert at a time: bounded fp32 scratch
        qb[g], sb[g] = tilegemm.per_block_cast_to_fp8(inputs.randn((n, k), torch.bfloat16, seed + 1 + g))
    return (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb)


def sampled_reference(a, b, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """float64 formula on the sampled ``rows`` (0 for rows of no group)."""
    (qa, sa), (qb, sb) = a, b
    a64 = dequant_per_token(qa[rows], sa[rows]).double()
    out = torch.zeros(rows.numel(), qb.shape[1], dtype=torch.float64, device="cuda")
    for g in index[rows].unique().tolist():
        if g < 0:
            continue
        sel = index[rows] == g
        out[sel] = a64[sel] @ dequant_per_block(qb[g], sb[g]).double().T
    return out


def timed(row: dict, name: str, fn, sets: list, d: torch.Tensor, ref, rows, eager: bool, budget_ms: float) -> None:
    """Check ``fn`` on set 0 (the ``rows`` of ``d``; ``None``: a k-grouped call accumulating into ``d`` from 0), then
    time it kernel-only (and eager); errors are recorded."""
    try:
        d.fill_(float("nan") if rows is not None else 0.0)
        fn(*sets[0])
        torch.cuda.synchronize()
        row["diff"][name] = calc_diff(d[rows] if rows is not None else d, ref)
        row["us"][name] = timing.graph_ms(lambda: [fn(*s) for s in sets], 1, budget_ms=budget_ms) / len(sets) * 1e3
        if eager:
            it = iter(range(1 << 30))
            row["eager_us"][name] = timing.eager_ms(lambda: fn(*sets[next(it) % len(sets)]), budget_ms) * 1e3
    except Exception as exc:
        row["error"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  {name}: {row['error'][name]}", flush=True)


def finish_row(row: dict, flops: float, label: str, t0: float) -> dict:
    """``row`` with its TFLOP/s (``flops`` a call), printed as one progress line (``BAD`` for a ``calc_diff`` over
    1e-5)."""
    row["tflops"] = {name: flops / us / 1e6 for name, us in row["us"].items()}
    bad = {name: f"{x:.1e}" for name, x in row["diff"].items() if not x < 1e-5}
    print(
        f"{label} {time.time() - t0:5.0f}s "
        + " ".join(f"{name}={t:.0f}" for name, t in row["tflops"].items())
        + (f" BAD calc_diff {bad}" if bad else ""),
        flush=True,
    )
    return row


def design(name: str) -> ws.WsConfig:
    """``ws.VARIANTS[name]``, or with the loader warp's registers set for ``name@R``."""
    base, _, regs = name.partition("@")
    cfg = ws.VARIANTS[base]
    return cfg._replace(loader_regs=int(regs)) if regs else cfg


def check_in_place(designs: list[str]) -> None:
    """Each design on an awkward k-grouped call read in place (empty groups first, amid and last, N off the tiles, a
    3-CTA grid so that a CTA's tiles cross groups, with and without accumulation): every element against the float64
    formula, and the bits of the same design on the gathered operands."""
    from tilegemm.testing import dequantize

    ks, m, n = [0, 256, 0, 384, 128, 0], 256, 200
    k_sum, g = sum(ks), len(ks)
    qa, sa = tilegemm.per_token_cast_to_fp8(inputs.randn((m, k_sum), torch.bfloat16, 11))
    qb, sb = tilegemm.per_token_cast_to_fp8(inputs.randn((n, k_sum), torch.bfloat16, 12))
    bounds = [sum(ks[:i]) for i in range(g + 1)]
    offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    flat_a = torch.cat([qa[:, bounds[i] : bounds[i + 1]].reshape(-1) for i in range(g)])
    flat_b = torch.cat([qb[:, bounds[i] : bounds[i + 1]].reshape(-1) for i in range(g)])
    blocks = ((flat_a.view(m, k_sum), sa), (flat_b.view(n, k_sum), sb))
    c = inputs.randn((g, m, n), torch.float32, 13)
    product = torch.zeros(g, m, n, dtype=torch.float64, device="cuda")
    for i in range(g):
        s, e = bounds[i], bounds[i + 1]
        a64 = dequantize(qa[:, s:e], sa[:, s // 128 : e // 128], 1, 128).double()
        product[i] = a64 @ dequantize(qb[:, s:e], sb[:, s // 128 : e // 128], 1, 128).double().T
    for name in designs:
        for accumulate in (False, True):
            outs = []
            for ops, in_place in ((((qa, sa), (qb, sb)), False), (blocks, True)):
                d = c.clone() if accumulate else torch.full((g, m, n), float("nan"), device="cuda")
                plan = ws.ws_plan(*ops, d, design(name), 3, k_offsets=offsets, accumulate=accumulate, in_place=in_place)
                plan(*ops, d, k_offsets=offsets)
                torch.cuda.synchronize()
                outs.append(d)
            want = product + c.double() if accumulate else product
            diff = calc_diff(outs[1], want)
            same = torch.equal(outs[0], outs[1])
            print(f"check {name}_in_place accumulate={accumulate}: calc_diff {diff:.1e}, the gathered bits: {same}")
            if not (diff < 1e-5 and same and not outs[1].isnan().any()):
                raise AssertionError(f"{name}_in_place differs (calc_diff {diff:.1e}, bitwise {same})")


def k_grouped_rows(dg, designs: list[str], args, t0: float) -> list[dict]:
    """The k-grouped sweep (see the module docstring)."""
    from tilegemm.testing import dequantize

    results = []
    for spec in k_family.specs("full"):
        if spec["dtype"] != "fp8":
            continue
        if time.time() - t0 > args.budget_s:
            print(f"skipping {spec}: past the budget", flush=True)
            continue
        g, m, n, k = spec["groups"], spec["m"], spec["n"], spec["k_per_group"]
        ks = inputs.group_sizes(g, k, inputs.seed_of("k_grouped", g, m, n, k), lo=0.7, hi=1.3, align=128)
        k_sum = sum(ks)
        seed = inputs.seed_of("k_grouped", "fp8", g, m, n, k_sum)
        ks_tensor = torch.tensor(ks, dtype=torch.int32, device="cuda")
        qa_t, sa_t = tilegemm.per_token_cast_to_fp8(inputs.randn((m, k_sum), torch.bfloat16, seed))
        qb_t, sb_t = tilegemm.per_token_cast_to_fp8(inputs.randn((n, k_sum), torch.bfloat16, seed + 1))
        tn = ((qa_t.t().contiguous(), sa_t.t().contiguous()), (qb_t.t().contiguous(), sb_t.t().contiguous()))
        kmajor = ((qa_t, sa_t), (qb_t, sb_t))
        d = torch.zeros(g, m, n, device="cuda")
        ref = torch.zeros(g, m, n, dtype=torch.float64, device="cuda")
        start = 0
        for i, kg in enumerate(ks):
            a64 = dequantize(qa_t[:, start : start + kg], sa_t[:, start // 128 : (start + kg) // 128], 1, 128)
            b64 = dequantize(qb_t[:, start : start + kg], sb_t[:, start // 128 : (start + kg) // 128], 1, 128)
            ref[i] = a64.double() @ b64.double().T
            start += kg
        row = {"kind": "k", "name": f"g{g}k{k}", "groups": g, "m": m, "n": n, "k": k, "k_sum": k_sum}
        row.update(us={}, eager_us={}, diff={}, error={}, bitwise={})
        offsets = torch.tensor([sum(ks[:i]) for i in range(g + 1)], dtype=torch.int32, device="cuda")
        bounds = [sum(ks[:i]) for i in range(g + 1)]
        flat_a = torch.cat([qa_t[:, bounds[i] : bounds[i + 1]].reshape(-1) for i in range(g)])
        flat_b = torch.cat([qb_t[:, bounds[i] : bounds[i + 1]].reshape(-1) for i in range(g)])
        blocks = ((flat_a.view(m, k_sum), sa_t), (flat_b.view(n, k_sum), sb_t))  # in place: views of the nt memory
        plans = {}
        for name in designs:
            for in_place in (False, True) if args.in_place else (False,):
                label, ops = (f"{name}_in_place", blocks) if in_place else (name, kmajor)
                try:
                    plan = ws.ws_plan(*ops, d, design(name), k_offsets=offsets, accumulate=True, in_place=in_place)
                except Exception as exc:
                    row["error"][label] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    continue
                plans[label] = plan, ops
                call = lambda a, b, p=plan, d=d, o=offsets: p(a, b, d, k_offsets=o)  # noqa: E731
                timed(row, label, call, [ops], d, ref, None, False, args.rep_ms)
            if f"{name}_in_place" in plans and name in plans:  # the same bits as on the gathered operands
                outs = []
                for plan, ops in (plans[name], plans[f"{name}_in_place"]):
                    d.zero_()
                    plan(*ops, d, k_offsets=offsets)
                    outs.append(d.clone())
                row["bitwise"][f"{name}_in_place"] = bool(torch.equal(*outs))
        op = tilegemm.k_grouped_fp8_gemm_tn_contiguous
        for name, backend in (("tilegemm", None), ("cutile", "cutile"), ("gluon", "gluon")):
            call = lambda a, b, bk=backend, op=op, d=d, ks=ks, t=ks_tensor: op(a, b, d, ks, t, c=d, backend=bk)  # noqa: E731
            timed(row, name, call, [tn], d, ref, None, args.eager, args.rep_ms)
        theirs = [((flat_a, sa_t), (flat_b, sb_t))]  # DeepGEMM's nt layout: each group's K-major block
        nt = tilegemm.k_grouped_fp8_gemm_nt_contiguous
        call = lambda a, b, nt=nt, d=d, ks=ks, t=ks_tensor: nt(a, b, d, ks, t, c=d)  # noqa: E731
        timed(row, "tilegemm_nt", call, theirs, d, ref, None, args.eager, args.rep_ms)
        if dg is not None and hasattr(dg, "k_grouped_fp8_gemm_nt_contiguous"):
            fn = dg.k_grouped_fp8_gemm_nt_contiguous
            call = lambda a, b, fn=fn, d=d, ks=ks, t=ks_tensor: fn(a, b, d, ks, t, d, (1, 1, 128))  # noqa: E731
            timed(row, "deepgemm", call, theirs, d, ref, None, args.eager, args.rep_ms)
        results.append(finish_row(row, 2 * m * n * k_sum, f"{row['name']:>10} m{m:5d} n{n:5d}", t0))
        del tn, kmajor, ref, blocks, flat_a, flat_b, theirs
        torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--family", choices=("m", "k"), default="m", help="m-grouped or k-grouped rows")
    parser.add_argument("--designs", default=None, help="ws.VARIANTS names (one wave; name@R: R loader registers)")
    parser.add_argument("--rows", default="set,skewed", help="set, skewed or both")
    parser.add_argument("--eager", action="store_true", help="also time the public calls eagerly")
    parser.add_argument("--in-place", action="store_true", help="k: also each design on the nt blocks read in place")
    parser.add_argument("--only-k", default="", help="m: only the rows of these K (comma-separated)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="start no row after this many seconds")
    parser.add_argument("--rep-ms", type=float, default=25.0, help="timing budget of one implementation on a row")
    args = parser.parse_args()
    default = "a_128x128_p,d_128x128_ov@40" if args.family == "k" else "d_128x128_ov4,c_128x192"
    designs = [v for v in (args.designs or default).split(",") if v]
    t0 = time.time()
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, flush=True)
    if args.family == "k":
        if args.in_place:  # its launches take their descriptors' scratch from torch themselves (tma.Relaunch)
            check_in_place(designs)
        finish(args, designs, why, t0, k_grouped_rows(dg, designs, args, t0))
        return
    specs = (set_rows() if "set" in args.rows else []) + (skewed_rows() if "skewed" in args.rows else [])
    if args.only_k:
        specs = [spec for spec in specs if spec["k"] in {int(k) for k in args.only_k.split(",")}]
    results = []
    for spec in specs:
        if time.time() - t0 > args.budget_s:
            print(f"skipping {spec['name']} n{spec['n']} k{spec['k']}: past the budget", flush=True)
            continue
        sizes, n, k = spec["sizes"], spec["n"], spec["k"]
        index = m_indices(sizes)
        groups, m_sum = len(sizes), index.numel()
        weight_bytes = groups * n * k
        nsets = min(2, timing.rotation_count(m_sum * k + weight_bytes + 2 * m_sum * n))
        sets = []
        for s in range(nsets):
            a, b = operands(index, groups, n, k, seed=7 * s + n + k)
            sets.append((a, b, index))
        d = torch.empty(m_sum, n, device="cuda", dtype=torch.bfloat16)
        rows = torch.randperm(m_sum, device="cuda", generator=torch.Generator("cuda").manual_seed(1))[:256]
        rows = rows[index[rows] >= 0]  # DeepGEMM leaves -1 rows undefined: the tests check that ours are 0
        ref = sampled_reference(sets[0][0], sets[0][1], index, rows)
        row = {key: spec[key] for key in ("kind", "name", "n", "k")}
        row.update(groups=groups, m_sum=m_sum, routed=sum(sizes), empty=sizes.count(0))
        row.update(us={}, eager_us={}, diff={}, error={})
        for name in designs:
            plan = ws.ws_plan(sets[0][0], sets[0][1], d, design(name), m_index=index)  # same metadata: one plan
            call = lambda a, b, i, p=plan, d=d: p(a, b, d, m_index=i)  # noqa: E731
            timed(row, name, call, sets, d, ref, rows, False, args.rep_ms)
        op = tilegemm.m_grouped_fp8_gemm_nt_contiguous
        for name, backend in (("tilegemm", None), ("cutile", "cutile"), ("gluon", "gluon")):
            call = lambda a, b, i, bk=backend, op=op, d=d: op(a, b, d, i, backend=bk)  # noqa: E731
            timed(row, name, call, sets, d, ref, rows, args.eager, args.rep_ms)
        if dg is not None:
            theirs = [((a[0], peers.dg_sfa(dg, a[1])), b, i) for a, b, i in sets]
            call = lambda a, b, i, d=d: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, i)  # noqa: E731
            timed(row, "deepgemm", call, theirs, d, ref, rows, args.eager, args.rep_ms)
        results.append(finish_row(row, 2 * row["routed"] * n * k, f"{spec['name']:>10} n{n:5d} k{k:5d}", t0))
        del sets, ref
        torch.cuda.empty_cache()
    finish(args, designs, why, t0, results)


def finish(args, designs: list[str], why: str, t0: float, results: list[dict]) -> None:
    """Write OUT.json and print the table (TFLOP/s kernel-only; geomean speed against DeepGEMM per kind of row)."""
    meta = {
        **device.describe(),
        "deepgemm": why,
        "family": args.family,
        "designs": {name: design(name)._asdict() for name in designs},
        "columns": "ws designs (direct); tilegemm: the public op, default settings; cutile / gluon: forced; deepgemm",
        "timing": "us: CUDA-graph replay median per call, input sets rotated past L2; eager_us: back-to-back calls",
        "tflops": "m: 2 * routed rows * N * K / kernel-only time (padding rows not counted); k: 2 * M * N * K_sum",
        "seconds": round(time.time() - t0, 1),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    in_place = [f"{name}_in_place" for name in designs] if args.family == "k" and args.in_place else []
    impls = designs + in_place + ["tilegemm", "cutile", "gluon"]
    impls += (["tilegemm_nt"] if args.family == "k" else []) + ["deepgemm"]
    print("\nTFLOP/s (kernel-only)          " + " ".join(f"{i[:13]:>13}" for i in impls))
    for r in results:
        cells = " ".join(f"{r['tflops'][i]:13.0f}" if i in r["tflops"] else f"{'-':>13}" for i in impls)
        print(f"{r['name']:>10} n{r['n']:5d} k{r['k']:5d}   {cells}")
    for kind in ("set", "skewed", "k"):
        ratios = []
        for i in impls:
            v = [r["us"]["deepgemm"] / r["us"][i] for r in results if r["kind"] == kind and i in r["us"]
                 and "deepgemm" in r["us"]]  # fmt: skip
            ratios.append(f"{math.exp(sum(map(math.log, v)) / len(v)):13.2f}" if v else f"{'-':>13}")
        if any(r["kind"] == kind for r in results):
            print(f"{kind:>6} geomean / DeepGEMM     " + " ".join(ratios))
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
