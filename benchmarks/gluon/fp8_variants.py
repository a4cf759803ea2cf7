"""Gluon dense FP8 GEMM: correctness on awkward shapes, then kernel configs beside cutile, DeepGEMM and cuBLAS.

Run on the H100 machine (``source .devbundle/setup.sh`` and DeepGEMM built first):
``python3 benchmarks/gluon/fp8_variants.py OUT_DIR [variant ...]``; a variant is ``block_n,stages,group_m,order``.
Every variant's output is compared with the float64 formula on the dequantized inputs before it is timed.
Writes ``OUT_DIR/gluon_fp8_variants.json`` and prints a table (kernel-only, CUDA-graph replay medians).
"""

from __future__ import annotations

import functools
import json
import sys
import time

import torch

import tilegemm
from tilegemm.bench import device, peers, timing
from tilegemm.heuristics.gluon import GluonDenseConfig
from tilegemm.ops.gluon import gemm as ggemm
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (1536, 2048), (2048, 768)]
ROWS = [(m, n, k) for n, k in NK for m in (512, 2048, 4096)] + [(8192, 8192, 8192)]
AWKWARD = [(1, 128, 128), (129, 136, 256), (300, 200, 1100), (1000, 2112, 7168), (4097, 520, 640)]


def quant(m: int, n: int, k: int, seed: int, rows_recipe: bool = False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    xa = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    xb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    qa, sa = tilegemm.per_token_cast_to_fp8(xa)
    qb, sb = tilegemm.per_token_cast_to_fp8(xb) if rows_recipe else tilegemm.per_block_cast_to_fp8(xb)
    return (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb)


def reference(a, b, rows_recipe: bool = False) -> torch.Tensor:
    da = dequant_per_token(*a)
    db = dequant_per_token(*b) if rows_recipe else dequant_per_block(*b)
    return da.double() @ db.double().t()


def check(cfg: GluonDenseConfig, log: list) -> bool:
    ok = True
    for i, (m, n, k) in enumerate(AWKWARD):
        for rows_recipe, dtype, with_c in ((False, torch.bfloat16, False), (True, torch.float32, True)):
            a, b = quant(m, n, k, 100 + i, rows_recipe)
            ref = reference(a, b, rows_recipe)
            c = torch.randn(m, n, device="cuda", dtype=dtype) if with_c else None
            if c is not None:
                ref = 0.5 * ref + 2.0 * c.double()
            d = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            print("case", m, n, k, rows_recipe, dtype, with_c, flush=True)
            recipe = (1, 1, 128) if rows_recipe else (1, 128, 128)
            ggemm.fp8_gemm(a, b, d, c, recipe=recipe, alpha=0.5 if with_c else 1.0, beta=2.0, config=cfg)
            first = d.clone()
            ggemm.fp8_gemm(a, b, d, c, recipe=recipe, alpha=0.5 if with_c else 1.0, beta=2.0, config=cfg)
            diff = calc_diff(d, ref)
            good = bool(torch.isfinite(d).all()) and diff < (1e-6 if dtype == torch.float32 else 1e-5)
            same = torch.equal(first, d)
            log.append(
                {
                    "cfg": list(cfg),
                    "shape": [m, n, k],
                    "recipe": recipe,
                    "dtype": str(dtype),
                    "c": with_c,
                    "calc_diff": diff,
                    "ok": good,
                    "bitwise_rerun": same,
                }
            )
            ok &= good and same
            if not (good and same):
                print("FAIL", cfg, m, n, k, rows_recipe, dtype, diff, same, flush=True)
    return ok


def _gluon(a, b, *, d, cfg):
    return ggemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), beta=0.0, config=cfg)


def _cutile(a, b, *, d):
    return tilegemm.fp8_gemm_nt(a, b, d, backend="cutile")


def _deepgemm(dg, a, b, *, d):
    return dg.fp8_gemm_nt(a, b, d)


def _timed(row: dict, name: str, fn, sets: list, d: torch.Tensor, ref: torch.Tensor) -> None:
    """Check ``fn`` on set 0, then time it kernel-only over all sets (one CUDA graph)."""
    fn(*sets[0])
    row["diff"][name] = calc_diff(d, ref)
    ms = timing.graph_ms(lambda: [fn(*s) for s in sets], 1) / len(sets)
    row["us"][name] = ms * 1e3
    row["tflops"][name] = 2 * row["m"] * row["n"] * row["k"] / ms / 1e9


def main() -> None:
    out_dir = sys.argv[1]
    variants = [GluonDenseConfig(*map(int, v.split(","))) for v in sys.argv[2:]] or [GluonDenseConfig()]
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, flush=True)
    log: list = []
    good = {cfg: check(cfg, log) for cfg in variants}
    print("correct:", {str(tuple(c)): g for c, g in good.items()}, flush=True)
    rows = []
    t0 = time.time()
    for m, n, k in ROWS:
        nsets = timing.rotation_count(m * k + n * k + 2 * m * n)
        sets = [quant(m, n, k, 7 * s + 1) for s in range(nsets)]
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = reference(*sets[0])
        row = {"m": m, "n": n, "k": k, "tflops": {}, "us": {}, "diff": {}}
        for cfg in variants:
            if good[cfg]:
                call = functools.partial(_gluon, d=d, cfg=cfg)
                _timed(row, str(tuple(cfg)), call, sets, d, ref)
        _timed(row, "cutile", functools.partial(_cutile, d=d), sets, d, ref)
        if dg is not None:
            _timed(row, "deepgemm", functools.partial(_deepgemm, dg, d=d), sets, d, ref)
        blas = peers.cublas_fp8_blockwise(sets[0][0][0], sets[0][0][1], sets[0][1][0], sets[0][1][1], torch.bfloat16)
        if not isinstance(blas, str):
            row["us"]["cublas"] = timing.graph_ms(blas, 1) * 1e3
            row["tflops"]["cublas"] = 2 * m * n * k / row["us"]["cublas"] / 1e6
        rows.append(row)
        print(f"{m:5d} {n:5d} {k:5d} " + " ".join(f"{name}={t:7.1f}" for name, t in row["tflops"].items()), flush=True)
        del sets, ref
        torch.cuda.empty_cache()
    print(f"timing took {time.time() - t0:.0f} s")
    meta = {
        **device.describe(),
        "deepgemm": why,
        "timing": "CUDA-graph replay median per call, inputs rotated past L2",
    }
    with open(f"{out_dir}/gluon_fp8_variants.json", "w") as f:
        json.dump({"meta": meta, "correctness": log, "rows": rows}, f, indent=1)
    names = list(rows[0]["tflops"])
    print("\nTFLOP/s (kernel-only)  " + " ".join(f"{n[:14]:>14}" for n in names))
    for r in rows:
        print(f"{r['m']:5d}x{r['n']:5d}x{r['k']:5d} " + " ".join(f"{r['tflops'].get(n, 0):14.1f}" for n in names))
    dgk = "deepgemm"
    for n in names:
        if dgk in names and n != dgk:
            import math

            rs = [r["us"][dgk] / r["us"][n] for r in rows if n in r["us"] and dgk in r["us"]]
            print(f"{n}: geomean vs DeepGEMM {math.exp(sum(map(math.log, rs)) / len(rs)):.3f}x, min {min(rs):.3f}x")


if __name__ == "__main__":
    main()
