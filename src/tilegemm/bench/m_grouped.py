"""M-grouped contiguous GEMMs (MoE forward): ``tilegemm.m_grouped_{bf16,fp8}_gemm_nt_contiguous(a, b, d, m_indices)``.

Group sizes are drawn in [0.75, 1.25] x the mean rows per group and rounded to the 128-row
alignment of the layout, so every implementation sees exactly the same rows (no padding rows).
Peers: ``torch._grouped_mm`` (BF16, ``offs`` = the cumulative group ends), a per-group cuBLAS
blockwise ``scaled_mm`` loop (FP8), and DeepGEMM's ``m_grouped_*_gemm_nt_contiguous``.
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.bench import inputs, peers, timing
from tilegemm.bench.core import Built, Case, Impl, diff_check, ready_calls

FAMILY = "m_grouped"
GM = [(4, 8192), (8, 4096), (32, 512), (128, 256), (256, 128)]
NK = [(4096, 7168), (7168, 2048), (1536, 2048), (2048, 768)]
QUICK = [(8, 4096, 4096, 7168)]
DTYPES = ("bf16", "fp8")


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: ``{"dtype", "groups", "m_per_group", "n", "k"}``."""
    shapes = list(QUICK)
    if size != "quick":
        shapes += [(g, m, n, k) for g, m in GM for n, k in NK if (g, m, n, k) not in QUICK]
    return [{"dtype": dt, "groups": g, "m_per_group": m, "n": n, "k": k} for g, m, n, k in shapes for dt in DTYPES]


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec; group sizes are fixed here (seeded) so reruns match."""
    g, m, n, k, dt = spec["groups"], spec["m_per_group"], spec["n"], spec["k"], spec["dtype"]
    sizes = inputs.group_sizes(g, m, inputs.seed_of("m_grouped", g, m, n, k), align=128)
    rows = sum(sizes)
    nbytes = inputs.gemm_bytes(dt, rows, g, n, k)
    shape = {"groups": g, "m_per_group": m, "n": n, "k": k, "m_sum": rows}
    op = f"m_grouped_{dt}_gemm_nt_contiguous"
    return Case(FAMILY, op, dt, shape, 2.0 * rows * n * k, nbytes, lambda: _build(dt, sizes, n, k, dg, dg_reason))


def _reference(a64_rows, b_of, sizes: list[int], n: int) -> torch.Tensor:
    out = torch.empty(sum(sizes), n, dtype=torch.float64, device=timing.DEVICE)
    start = 0
    for g, s in enumerate(sizes):
        out[start : start + s] = a64_rows(start, start + s) @ b_of(g).t()
        start += s
    return out


def _build(dt: str, sizes: list[int], n: int, k: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm.testing import dequant_per_block, dequant_per_token

    groups, rows = len(sizes), sum(sizes)
    seed = inputs.seed_of("m_grouped", dt, groups, rows, n, k)
    m_indices = torch.cat([torch.full((s,), g, dtype=torch.int32) for g, s in enumerate(sizes)]).to(timing.DEVICE)
    offs = torch.tensor(sizes, device=timing.DEVICE).cumsum(0).to(torch.int32)
    d = torch.empty(rows, n, device=timing.DEVICE, dtype=torch.bfloat16)
    nsets = timing.rotation_count((2 if dt == "bf16" else 1) * (rows * k + groups * n * k))
    xs = [
        (
            inputs.randn((rows, k), torch.bfloat16, seed + 2 * i),
            inputs.randn((groups, n, k), torch.bfloat16, seed + 2 * i + 1),
        )
        for i in range(nsets)
    ]
    if dt == "bf16":
        sets = [(a, b, d, m_indices) for a, b in xs]
        impls = [
            Impl("tilegemm", sets, lambda a, b, out, idx: tilegemm.m_grouped_bf16_gemm_nt_contiguous(a, b, out, idx)),
            Impl(
                "torch_grouped_mm",
                [(a, b.transpose(1, 2)) for a, b in xs],
                lambda a, bt: torch._grouped_mm(a, bt, offs=offs, out_dtype=torch.bfloat16),
            ),
        ]
        if dg:
            call = peers.writes_d(dg.m_grouped_bf16_gemm_nt_contiguous)
            impls.append(Impl("deepgemm", sets, call))
        else:
            impls.append(Impl("deepgemm", dg_reason, None))
        a0, b0 = xs[0]
        ref = lambda: _reference(lambda s, e: a0[s:e].double(), lambda g: b0[g].double(), sizes, n)  # noqa: E731
        return Built(impls, diff_check(ref))

    ours, theirs, loops, same = [], [], [], None
    for a, b in xs:
        qa, sa = tilegemm.per_token_cast_to_fp8(a)
        qb, sb = inputs.cast_b_grouped(b)
        ours.append(((qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb), d, m_indices))
        loops.append(_cublas_loop(qa, sa, qb, sb, sizes, n))
        if dg:
            (dqa, dsa), (dqb, dsb) = peers.dg_quant_a(dg, a), peers.dg_quant_b(dg, b)
            same = inputs.same_inputs((qa, sa, qb, sb), (dqa, dsa, dqb, dsb)) if same is None else same
            theirs.append(((dqa, peers.dg_sfa(dg, dsa)), (dqb, dsb), d, m_indices))
    del xs, a, b
    impls = [Impl("tilegemm", ours, lambda a, b, out, idx: tilegemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, idx))]
    impls.append(ready_calls("cublas_loop", loops, "per-group scaled_mm blockwise"))
    if dg:
        note = peers.casts_note(same)
        call = peers.writes_d(dg.m_grouped_fp8_gemm_nt_contiguous)
        impls.append(Impl("deepgemm", theirs, call, note=note))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))
    (qa, sa), (qb, sb) = ours[0][0], ours[0][1]

    def ref() -> torch.Tensor:
        return _reference(
            lambda s, e: dequant_per_token(qa[s:e], sa[s:e]), lambda g: dequant_per_block(qb[g], sb[g]), sizes, n
        )

    return Built(impls, diff_check(ref))


def _cublas_loop(qa, sa, qb, sb, sizes: list[int], n: int):
    """One cuBLAS blockwise ``scaled_mm`` per group writing its rows of a shared output (or why not)."""
    out = torch.empty(sum(sizes), n, device=timing.DEVICE, dtype=torch.bfloat16)
    calls, start = [], 0
    for g, s in enumerate(sizes):
        call = peers.cublas_fp8_blockwise(qa[start : start + s], sa[start : start + s], qb[g], sb[g], torch.bfloat16)
        if isinstance(call, str):
            return call
        calls.append((call, out[start : start + s]))
        start += s

    def run() -> torch.Tensor:
        for f, dst in calls:
            dst.copy_(f())
        return out

    return run
