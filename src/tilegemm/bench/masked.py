"""Masked grouped GEMMs (MoE decode under CUDA graphs): ``tilegemm.m_grouped_{bf16,fp8}_gemm_nt_masked``.

``a [G, Mmax, K]``, ``b [G, N, K]``, ``masked_m[g] = int(expected_m * U(0.7, 1.3))`` valid rows per
group (DeepGEMM's own test draw), ``Mmax = 128``. TFLOP/s count valid rows only; bytes count the
weights of groups with rows, the valid rows of ``a`` and ``d``. Peers: a cropped per-group cuBLAS
loop (``torch.matmul`` on each group's valid rows, or blockwise ``scaled_mm`` for FP8, which refuses
odd row counts) and DeepGEMM's ``m_grouped_*_gemm_nt_masked``.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from tilegemm.bench import inputs, peers, timing
from tilegemm.bench.core import Built, Case, Impl, diff_check

FAMILY = "masked"
GROUPS = (32, 128, 256)
EXPECTED_M = (1, 4, 16, 64)
NK = [(4096, 7168), (7168, 2048)]
MMAX = 128
QUICK = [(128, 4, 7168, 2048)]
DTYPES = ("bf16", "fp8")


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: ``{"dtype", "groups", "expected_m", "n", "k"}``."""
    shapes = list(QUICK)
    if size != "quick":
        shapes += [(g, e, n, k) for n, k in NK for g in GROUPS for e in EXPECTED_M if (g, e, n, k) not in QUICK]
    return [{"dtype": dt, "groups": g, "expected_m": e, "n": n, "k": k} for g, e, n, k in shapes for dt in DTYPES]


def masked_sizes(groups: int, expected_m: int, seed: int) -> list[int]:
    """Valid rows per group: ``int(expected_m * U(0.7, 1.3))`` clamped to ``[0, MMAX]``."""
    rng = random.Random(seed)
    return [min(MMAX, int(expected_m * rng.uniform(0.7, 1.3))) for _ in range(groups)]


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec (valid-row counts fixed here, seeded)."""
    g, e, n, k, dt = spec["groups"], spec["expected_m"], spec["n"], spec["k"], spec["dtype"]
    sizes = masked_sizes(g, e, inputs.seed_of("masked", g, e, n, k))
    valid, active = sum(sizes), sum(1 for s in sizes if s)
    nbytes = inputs.gemm_bytes(dt, valid, active, n, k)
    shape = {"groups": g, "expected_m": e, "n": n, "k": k, "valid_rows": valid}
    op = f"m_grouped_{dt}_gemm_nt_masked"
    settings = {"mmax": MMAX}
    return Case(
        FAMILY,
        op,
        dt,
        shape,
        2.0 * valid * n * k,
        nbytes,
        lambda: _build(dt, sizes, e, n, k, dg, dg_reason),
        settings=settings,
    )


def _build(dt: str, sizes: list[int], expected_m: int, n: int, k: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm.testing import dequant_per_block, dequant_per_token

    groups = len(sizes)
    seed = inputs.seed_of("masked", dt, groups, expected_m, n, k)
    masked_m = torch.tensor(sizes, dtype=torch.int32, device=timing.DEVICE)
    mask = torch.arange(MMAX, device=timing.DEVICE)[None, :] < masked_m[:, None]
    d = torch.zeros(groups, MMAX, n, device=timing.DEVICE, dtype=torch.bfloat16)
    a = inputs.randn((groups, MMAX, k), torch.bfloat16, seed)
    b = inputs.randn((groups, n, k), torch.bfloat16, seed + 1)
    crop = lambda out, *args: out[mask]  # noqa: E731

    if dt == "bf16":
        sets = [(a, b, d, masked_m)]
        impls = [
            Impl("tilegemm", sets, _tg(tilegemm.m_grouped_bf16_gemm_nt_masked, expected_m), crop),
            Impl("cublas_loop", [(a, b, d)], _matmul_loop(sizes), crop, note="torch.matmul on each group's valid rows"),
        ]
        if dg:
            call = peers.writes_d(dg.m_grouped_bf16_gemm_nt_masked, expected_m)
            impls.append(Impl("deepgemm", sets, call, crop))
        else:
            impls.append(Impl("deepgemm", dg_reason, None))
        ref = lambda: _reference(lambda g, s: a[g, :s].double(), lambda g: b[g].double(), sizes)  # noqa: E731
        return Built(impls, diff_check(ref))

    qa, sa = tilegemm.per_token_cast_to_fp8(a)
    qb, sb = inputs.cast_b_grouped(b)
    sets = [((qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb), d, masked_m)]
    impls = [
        Impl("tilegemm", sets, _tg(tilegemm.m_grouped_fp8_gemm_nt_masked, expected_m), crop),
    ]
    loop = _scaled_loop(qa, sa, qb, sb, sizes, d)
    if isinstance(loop, str):
        impls.append(Impl("cublas_loop", loop, None))
    else:
        impls.append(Impl("cublas_loop", [()], loop, crop, note="blockwise scaled_mm on each group's valid rows"))
    if dg:
        (dqa, dsa), (dqb, dsb) = peers.dg_quant_a(dg, a), peers.dg_quant_b(dg, b)
        same = inputs.same_inputs((qa, sa, qb, sb), (dqa, dsa, dqb, dsb))
        note = peers.casts_note(same)
        theirs = [((dqa, peers.dg_sfa(dg, dsa)), (dqb, dsb), d, masked_m)]
        call = peers.writes_d(dg.m_grouped_fp8_gemm_nt_masked, expected_m)
        impls.append(Impl("deepgemm", theirs, call, crop, note=note))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))
    a = b = None  # the bf16 sources are no longer needed

    def ref() -> torch.Tensor:
        return _reference(
            lambda g, s: dequant_per_token(qa[g, :s], sa[g, :s]), lambda g: dequant_per_block(qb[g], sb[g]), sizes
        )

    return Built(impls, diff_check(ref))


def _tg(op, expected_m: int):
    """tilegemm's masked op as a user calls it: ``op(a, b, d, masked_m, expected_m)``."""

    def call(a, b, d: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
        return op(a, b, d, masked_m, expected_m)

    return call


def _reference(a_rows, b_of, sizes: list[int]) -> torch.Tensor:
    """Float64 ``cat_g(a[g, :m_g] @ b[g].T)``: the valid rows in ``d[mask]`` order."""
    parts = [a_rows(g, s) @ b_of(g).t() for g, s in enumerate(sizes) if s]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64, device=timing.DEVICE)


def _matmul_loop(sizes: list[int]):
    live = [(g, s) for g, s in enumerate(sizes) if s]

    def run(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        for g, s in live:
            torch.matmul(a[g, :s], b[g].t(), out=d[g, :s])
        return d

    return run


def _scaled_loop(qa, sa, qb, sb, sizes: list[int], d: torch.Tensor):
    calls = []
    for g, s in enumerate(sizes):
        if not s:
            continue
        call = peers.cublas_fp8_blockwise(qa[g, :s], sa[g, :s], qb[g], sb[g], torch.bfloat16)
        if isinstance(call, str):
            return call
        calls.append((call, d[g, :s]))

    def run() -> torch.Tensor:
        for f, dst in calls:
            dst.copy_(f())
        return d

    return run
