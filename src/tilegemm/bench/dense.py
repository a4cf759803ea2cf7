"""Dense GEMMs: ``tilegemm.bf16_gemm_nt`` and ``tilegemm.fp8_gemm_nt`` (1x128 LHS / 128x128 RHS scales).

Peers: cuBLAS through torch (``torch.matmul``; ``scaled_mm`` blockwise for FP8, which refuses some
shapes, e.g. M=1) and DeepGEMM (``bf16_gemm_nt`` / ``fp8_gemm_nt`` on its own casts). An FP8 row that the
automatic choice runs on the gluon backend (FP8 or BF16) also times the cutile kernel (``tilegemm_cutile``).

Shapes: decode M in {1..256} x the (N, K) of DeepSeek-V3 and Qwen3 layers, then prefill M (512, 2048:
grids under half the SMs there are split along K) and large M (4096) on the same (N, K), and 8192^3.
Both libraries get the LHS scales in the MN-major TMA-aligned layout (``get_mn_major_tma_aligned_tensor``,
each library's own), made once outside the timing.
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.bench import inputs, peers, timing
from tilegemm.bench.core import Built, Case, Impl, diff_check, ready_calls

FAMILY = "dense"
DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_M = (512, 2048)
LARGE_M = (4096,)
NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (1536, 2048), (2048, 768)]
QUICK = [(1, 4096, 7168), (128, 7168, 2048), (4096, 7168, 2048)]
DTYPES = ("bf16", "fp8")


def specs(size: str) -> list[dict[str, Any]]:
    """The rows of a ``quick`` or ``full`` run, most important first: ``{"dtype", "m", "n", "k"}``."""
    if size == "quick":
        mnk = QUICK
    else:
        mnk = list(QUICK)
        mnk += [(m, n, k) for n, k in NK for m in DECODE_M if (m, n, k) not in QUICK]
        mnk += [(m, n, k) for n, k in NK for m in PREFILL_M + LARGE_M if (m, n, k) not in QUICK]
        mnk += [(8192, 8192, 8192)]
    return [{"dtype": dt, "m": m, "n": n, "k": k} for m, n, k in mnk for dt in DTYPES]


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec (see :func:`specs`); ``dg`` is the DeepGEMM module or None."""
    m, n, k, dt = spec["m"], spec["n"], spec["k"], spec["dtype"]
    flops = 2.0 * m * n * k
    nbytes = inputs.gemm_bytes(dt, m, 1, n, k)
    if dt == "bf16":
        build = lambda: _build_bf16(m, n, k, dg, dg_reason)  # noqa: E731
        op = "bf16_gemm_nt"
    else:
        build = lambda: _build_fp8(m, n, k, dg, dg_reason)  # noqa: E731
        op = "fp8_gemm_nt"
    shape = {"m": m, "n": n, "k": k}
    return Case(FAMILY, op, dt, shape, flops, nbytes, build)


def _runs_on_gluon(m: int, n: int, k: int, dtype: str = "fp8") -> bool:
    """True when the automatic choice runs this row (``dtype`` "fp8" or "bf16", K-major operands, no addend) on the
    gluon backend (see ``tilegemm.heuristics``)."""
    from tilegemm import config
    from tilegemm.backend import selector
    from tilegemm.heuristics import gluon

    if timing.DEVICE != "cuda" or selector.gluon_unavailable_reason() is not None:
        return False
    if dtype == "bf16":
        return gluon.prefers_dense_bf16(m, n, k, config.get_num_sms())
    return gluon.prefers_dense_fp8(m, n, k, config.get_num_sms())


def _nsets(m: int, n: int, k: int, elt: int) -> int:
    return timing.rotation_count(elt * (m * k + n * k) + 2 * m * n)


def _build_bf16(m: int, n: int, k: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm

    seed = inputs.seed_of("dense-bf16", m, n, k)
    d = torch.empty(m, n, device=timing.DEVICE, dtype=torch.bfloat16)
    sets = [
        (inputs.randn((m, k), torch.bfloat16, seed + 2 * i), inputs.randn((n, k), torch.bfloat16, seed + 2 * i + 1), d)
        for i in range(_nsets(m, n, k, 2))
    ]
    impls = [
        Impl("tilegemm", sets, lambda a, b, out: tilegemm.bf16_gemm_nt(a, b, out)),
    ]
    if _runs_on_gluon(m, n, k, "bf16"):  # the automatic choice took the gluon kernel: cutile's time beside it
        cutile = lambda a, b, out: tilegemm.bf16_gemm_nt(a, b, out, backend="cutile")  # noqa: E731
        impls.append(Impl("tilegemm_cutile", sets, cutile, note="the cutile kernel of this row (backend='cutile')"))
    impls.append(Impl("cublas", sets, lambda a, b, out: torch.matmul(a, b.t(), out=out), note="torch.matmul"))
    if dg:
        impls.append(Impl("deepgemm", sets, peers.writes_d(dg.bf16_gemm_nt)))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))
    a0, b0 = sets[0][0], sets[0][1]
    return Built(impls, diff_check(lambda: a0.double() @ b0.double().t()))


def _build_fp8(m: int, n: int, k: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm.testing import dequant_per_block, dequant_per_token

    seed = inputs.seed_of("dense-fp8", m, n, k)
    d = torch.empty(m, n, device=timing.DEVICE, dtype=torch.bfloat16)
    ours, theirs, blas = [], [], []
    same = None
    for i in range(_nsets(m, n, k, 1)):
        xa = inputs.randn((m, k), torch.bfloat16, seed + 2 * i)
        xb = inputs.randn((n, k), torch.bfloat16, seed + 2 * i + 1)
        qa, sa = tilegemm.per_token_cast_to_fp8(xa)
        qb, sb = tilegemm.per_block_cast_to_fp8(xb)
        ours.append(((qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), (qb, sb), d))
        blas.append(peers.cublas_fp8_blockwise(qa, sa, qb, sb, torch.bfloat16))
        if dg:
            (dqa, dsa), (dqb, dsb) = peers.dg_quant_a(dg, xa), peers.dg_quant_b(dg, xb)
            if same is None:
                same = inputs.same_inputs((qa, sa, qb, sb), (dqa, dsa, dqb, dsb))
            theirs.append(((dqa, peers.dg_sfa(dg, dsa)), (dqb, dsb), d))
        del xa, xb
    impls = [Impl("tilegemm", ours, lambda a, b, out: tilegemm.fp8_gemm_nt(a, b, out))]
    if _runs_on_gluon(m, n, k):  # the automatic choice took the gluon kernel: cutile's time beside it
        cutile = lambda a, b, out: tilegemm.fp8_gemm_nt(a, b, out, backend="cutile")  # noqa: E731
        impls.append(Impl("tilegemm_cutile", ours, cutile, note="the cutile kernel of this row (backend='cutile')"))
    impls.append(ready_calls("cublas", blas, "scaled_mm blockwise 1x128/128x128"))
    if dg:
        note = peers.casts_note(same)
        impls.append(Impl("deepgemm", theirs, peers.writes_d(dg.fp8_gemm_nt), note=note))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))
    (qa, sa), (qb, sb) = ours[0][0], ours[0][1]
    return Built(impls, diff_check(lambda: dequant_per_token(qa, sa) @ dequant_per_block(qb, sb).t()))
