"""K-grouped GEMMs (MoE weight gradient): ``k_grouped_{bf16,fp8}_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c=d)``.

DeepGEMM's EP shapes ``(G, M, N, k per group)``; ``ks[g] = align(k * U(0.7, 1.3), 128)``. Every
implementation accumulates into ``d`` (``c=d``, the weight-gradient use and the only form DeepGEMM's
SM90 kernels take), so rows say ``settings: {"c": "d"}``. Peers: a per-group cuBLAS loop (BF16:
``d[g] += a_g.T @ b_g`` with fp32 output) and DeepGEMM (``k_grouped_bf16_gemm_tn_contiguous``;
FP8 on SM90: ``k_grouped_fp8_gemm_nt_contiguous`` on its per-group K-major layout of the same data).
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.bench import inputs, peers, timing
from tilegemm.bench.core import Built, Case, Impl, diff_check

FAMILY = "k_grouped"
SHAPES = [
    (4, 4096, 7168, 8192),
    (4, 7168, 2048, 8192),
    (8, 4096, 7168, 4096),
    (8, 7168, 2048, 4096),
    (16, 4096, 7168, 2048),
    (16, 7168, 2048, 2048),
]
QUICK = [(8, 4096, 7168, 4096)]
DTYPES = ("bf16", "fp8")


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: ``{"dtype", "groups", "m", "n", "k_per_group"}``."""
    shapes = list(QUICK) + ([s for s in SHAPES if s not in QUICK] if size != "quick" else [])
    return [{"dtype": dt, "groups": g, "m": m, "n": n, "k_per_group": k} for g, m, n, k in shapes for dt in DTYPES]


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec (per-group K fixed here, seeded)."""
    g, m, n, k, dt = spec["groups"], spec["m"], spec["n"], spec["k_per_group"], spec["dtype"]
    ks = inputs.group_sizes(g, k, inputs.seed_of("k_grouped", g, m, n, k), lo=0.7, hi=1.3, align=128)
    k_sum = sum(ks)
    elt = 2 if dt == "bf16" else 1
    nbytes = elt * k_sum * (m + n) + 8.0 * g * m * n  # read c, write d (fp32)
    if dt == "fp8":
        nbytes += 4.0 * (k_sum // 128) * (m + n)
    shape = {"groups": g, "m": m, "n": n, "k_per_group": k, "k_sum": k_sum}
    op = f"k_grouped_{dt}_gemm_tn_contiguous"
    build = lambda: _build(dt, ks, m, n, dg, dg_reason)  # noqa: E731
    return Case(FAMILY, op, dt, shape, 2.0 * m * n * k_sum, nbytes, build, settings={"c": "d"})


def _bounds(ks: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for k in ks:
        out.append((start, start + k))
        start += k
    return out


def _reference(a64_of, b64_of, ks: list[int], m: int, n: int) -> torch.Tensor:
    ref = torch.zeros(len(ks), m, n, dtype=torch.float64, device=timing.DEVICE)
    for g, (s, e) in enumerate(_bounds(ks)):
        if e > s:
            ref[g] = a64_of(s, e).t() @ b64_of(s, e)
    return ref


def _build(dt: str, ks: list[int], m: int, n: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm.testing import dequantize

    k_sum = sum(ks)
    seed = inputs.seed_of("k_grouped", dt, len(ks), m, n, k_sum)
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device=timing.DEVICE)
    d = torch.zeros(len(ks), m, n, device=timing.DEVICE, dtype=torch.float32)
    zero = d.zero_
    a = inputs.randn((k_sum, m), torch.bfloat16, seed)
    b = inputs.randn((k_sum, n), torch.bfloat16, seed + 1)

    if dt == "bf16":
        sets = [(a, b, d)]
        impls = [
            Impl("tilegemm", sets, _tg_bf16(ks, ks_tensor), reset=zero),
            Impl("cublas_loop", sets, _mm_loop(ks), reset=zero, note="d[g] += a_g.T @ b_g, fp32 out"),
        ]
        if dg:
            call = peers.writes_d(dg.k_grouped_bf16_gemm_tn_contiguous, ks, ks_tensor, c_is_d=True)
            impls.append(Impl("deepgemm", sets, call, reset=zero))
        else:
            impls.append(Impl("deepgemm", dg_reason, None))
        ref = lambda: _reference(lambda s, e: a[s:e].double(), lambda s, e: b[s:e].double(), ks, m, n)  # noqa: E731
        return Built(impls, diff_check(ref))

    qa_t, sa_t = tilegemm.per_token_cast_to_fp8(a.t())  # [M, K_sum], [M, K_sum/128]: 1x128 along K
    qb_t, sb_t = tilegemm.per_token_cast_to_fp8(b.t())
    qa, sa = qa_t.t().contiguous(), sa_t.t().contiguous()  # [K_sum, M], [K_sum/128, M]
    qb, sb = qb_t.t().contiguous(), sb_t.t().contiguous()
    del qa_t, sa_t, qb_t, sb_t
    sets = [((qa, sa), (qb, sb), d)]
    impls = [
        Impl("tilegemm", sets, _tg_fp8(ks, ks_tensor), reset=zero),
        Impl("cublas_loop", "no per-group FP8 cuBLAS peer with 1x128 scales on both operands", None),
    ]
    if dg:
        impls.append(_dg_fp8(dg, a, b, d, ks, ks_tensor, (qa, sa, qb, sb), zero))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))
    a = b = None  # the bf16 sources are no longer needed

    def ref() -> torch.Tensor:
        return _reference(
            lambda s, e: dequantize(qa[s:e], sa[s // 128 : e // 128], 128, 1),
            lambda s, e: dequantize(qb[s:e], sb[s // 128 : e // 128], 128, 1),
            ks,
            m,
            n,
        )

    return Built(impls, diff_check(ref))


def _tg_bf16(ks: list[int], ks_tensor: torch.Tensor):
    import tilegemm

    def call(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return tilegemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c=d)

    return call


def _tg_fp8(ks: list[int], ks_tensor: torch.Tensor):
    import tilegemm

    def call(a: tuple, b: tuple, d: torch.Tensor) -> torch.Tensor:
        return tilegemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, ks_tensor, c=d)

    return call


def _mm_loop(ks: list[int]):
    bounds = [(g, s, e) for g, (s, e) in enumerate(_bounds(ks)) if e > s]

    def run(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        for g, s, e in bounds:
            peers.mm_fp32_out(a[s:e].t(), b[s:e], d[g])
        return d

    return run


def _dg_fp8(dg: Any, a, b, d, ks: list[int], ks_tensor, ours, zero) -> Impl:
    """DeepGEMM's SM90 FP8 k-grouped op: per group, the data K-major (``x[s:e].T`` flattened), scales ``sf.T``."""
    qa, sa = dg.utils.per_channel_cast_to_fp8(a, use_ue8m0=False)  # [K_sum, M], [K_sum/128, M]
    qb, sb = dg.utils.per_channel_cast_to_fp8(b, use_ue8m0=False)
    same = inputs.same_inputs(ours, (qa, sa, qb, sb))
    flat_a = torch.cat([qa[s:e].t().reshape(-1) for s, e in _bounds(ks)])
    flat_b = torch.cat([qb[s:e].t().reshape(-1) for s, e in _bounds(ks)])
    args = [((flat_a, sa.t()), (flat_b, sb.t()), d)]
    fn = dg.k_grouped_fp8_gemm_nt_contiguous if hasattr(dg, "k_grouped_fp8_gemm_nt_contiguous") else None
    if fn is None:
        return Impl("deepgemm", "this DeepGEMM has no k_grouped_fp8_gemm_nt_contiguous", None)
    note = "k_grouped_fp8_gemm_nt_contiguous (SM90 layout)"
    if not same:
        note += "; DeepGEMM's casts differ from tilegemm's, calc_diff is vs tilegemm's inputs"
    call = peers.writes_d(fn, ks, ks_tensor, c_is_d=True, recipe=(1, 1, 128))
    return Impl("deepgemm", args, call, reset=zero, note=note)
