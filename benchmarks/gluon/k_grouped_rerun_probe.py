"""Rerun one k-grouped FP8 call many times and report where a rerun differs bitwise from the first output.

The call is ``tests/ops/test_grouped_gpu.py::test_k_grouped_fp8[True]``'s (4 groups, M 1024, N 1536, K 1024, 0, 2048
and 384, an addend ``c``). For each of the first three differing reruns it prints the differing rows, columns and
tiles, and for the first differing 16x8 block (one warp's registers of 8 columns) which run is wrong against the
float64 formula and which single substitution fits the wrong values best: B's column scales (``sb``), A's row scales
(``sa``) or the product (``p``) of one K block taken from another, or a K block missing or added twice (residual
0: an exact fit). A race shows up under load: run several processes at once on one GPU, e.g. on the device::

    source .devbundle/setup.sh
    for w in 1 2 3 4 5 6 7 8; do
      PYTHONPATH=$PWD/src:$PWD/tests:$PYTHONPATH python3 benchmarks/gluon/k_grouped_rerun_probe.py 600 run$w &
    done; wait

Prints ``[TAG] B/N reruns differ`` last.
"""

from __future__ import annotations

import argparse

import torch

import tilegemm as tg
from tilegemm.quant import per_token_cast_to_fp8

GROUPS, M, N = 4, 1024, 1536
KS = [1024, 0, 2048, 384]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reruns", type=int)
    parser.add_argument("tag", help="printed before every line (which process, which build)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    xa = torch.randn(sum(KS), M, device="cuda", generator=gen)
    xb = torch.randn(sum(KS), N, device="cuda", generator=gen)
    qa_t, sa_t = per_token_cast_to_fp8(xa.T.contiguous())
    qb_t, sb_t = per_token_cast_to_fp8(xb.T.contiguous())
    qa, sa = qa_t.T.contiguous(), sa_t.T.contiguous()  # [K_sum, M] and its [K_sum / 128, M] scales
    qb, sb = qb_t.T.contiguous(), sb_t.T.contiguous()
    c = torch.randn(GROUPS, M, N, device="cuda", generator=gen)
    ks_t = torch.tensor(KS, dtype=torch.int32, device="cuda")
    blocks = sum(KS) // 128
    first_block = [sum(KS[:g]) // 128 for g in range(GROUPS)]

    def run() -> torch.Tensor:
        d = torch.full((GROUPS, M, N), float("nan"), device="cuda")
        tg.k_grouped_fp8_gemm_tn_contiguous((qa, sa), (qb, sb), d, KS, ks_t, c=c)
        return d

    def diagnose(first: torch.Tensor, rerun: torch.Tensor, g: int, row: int, col: int) -> None:
        r0, c0 = row // 16 * 16, col // 8 * 8
        a, b = qa[:, r0 : r0 + 16].double(), qb[:, c0 : c0 + 8].double()
        p = torch.stack([a[kb * 128 : kb * 128 + 128].T @ b[kb * 128 : kb * 128 + 128] for kb in range(blocks)])
        sa_, sb_ = sa[:, r0 : r0 + 16].double(), sb[:, c0 : c0 + 8].double()
        own = range(first_block[g], first_block[g] + KS[g] // 128)
        exact = c[g, r0 : r0 + 16, c0 : c0 + 8].double()
        exact = exact + sum(p[kb] * sa_[kb][:, None] * sb_[kb][None, :] for kb in own)
        chunk = lambda t: t[g, r0 : r0 + 16, c0 : c0 + 8].double()  # noqa: E731
        err_first, err_rerun = ((chunk(t) - exact).abs().max().item() for t in (first, rerun))
        wrong, right = (rerun, first) if err_rerun > err_first else (first, rerun)
        delta = chunk(wrong) - chunk(right)
        fits = []
        for kb in own:
            base = p[kb] * sa_[kb][:, None] * sb_[kb][None, :]
            for x in (x for x in range(blocks) if x != kb):
                for name, cand in (
                    ("sb", p[kb] * sa_[kb][:, None] * sb_[x][None, :]),
                    ("sa", p[kb] * sa_[x][:, None] * sb_[kb][None, :]),
                    ("p", p[x] * sa_[kb][:, None] * sb_[kb][None, :]),
                ):
                    fits.append((((delta - (cand - base)).norm() / delta.norm()).item(), f"{name}[kb {kb} -> {x}]"))
            fits.append((((delta + base).norm() / delta.norm()).item(), f"missing kb {kb}"))
            fits.append((((delta - base).norm() / delta.norm()).item(), f"twice kb {kb}"))
        fits.sort()
        best = "; ".join(f"{what} {res:.3f}" for res, what in fits[:3])
        print(
            f"[{args.tag}]   block g{g} rows {r0}+16 cols {c0}+8: max error first {err_first:.2e}, rerun "
            f"{err_rerun:.2e}; best fits (residual) {best}",
            flush=True,
        )

    first = run()
    torch.cuda.synchronize()
    bad = 0
    for i in range(args.reruns):
        d = run()
        differ = (d != first) & ~(d.isnan() & first.isnan())
        if not differ.any():
            continue
        bad += 1
        if bad <= 3:
            g, r, col = differ.nonzero(as_tuple=True)
            tiles = sorted({(a, b // 128, cc // 128) for a, b, cc in zip(g.tolist(), r.tolist(), col.tolist())})
            print(
                f"[{args.tag}] rerun {i}: {int(differ.sum())} differ; rows {int(r.min())}-{int(r.max())}, cols "
                f"{int(col.min())}-{int(col.max())}; tiles (group, row tile, col tile) {tiles[:6]}; "
                f"NaN {int(d.isnan().sum())}",
                flush=True,
            )
            diagnose(first, d, int(g[0]), int(r[0]), int(col[0]))
    torch.cuda.synchronize()
    print(f"[{args.tag}] {bad}/{args.reruns} reruns differ", flush=True)


if __name__ == "__main__":
    main()
