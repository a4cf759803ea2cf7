"""Every cutile kernel family on awkward shapes and garbage device values, for compute-sanitizer.

Run under ``compute-sanitizer --tool memcheck`` (and ``initcheck``) by ``make test-gpu-sanitize``. Value
checks are off (``TILEGEMM_CHECK_VALUES=0``), fallback is an error and PyTorch's caching allocator is off
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``), so every tensor is its own allocation and an access past any tensor
is outside every allocation, where memcheck sees it. The kernels promise to stay in bounds whatever the
values of indices, offsets, ``masked_m``, ``ks``, windows, block tables and schedules; a case with valid
values is also checked against the ``pytorch`` backend, so a clean run is not a run that computed nothing.

Usage: ``python tests/sanitize/cases.py [TEXT] [--shard I/N]``: the cases whose name contains TEXT, every N-th of
them from I (the memcheck test runs the shards in parallel). Prints one line per case, with its seconds, and exits
non-zero if any case raised or disagreed with the reference.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import os
import sys
import time
import traceback
from collections.abc import Callable

import torch

import tilegemm as tg
from tilegemm import indexer
from tilegemm.heuristics.cutile import MOE_VARIANT_ENV, MQA_VARIANT_ENV
from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import calc_diff

DEV = "cuda"
ALIGN = 128
GROUP_PATTERNS = [[0, 70, 128, 5], [70, 0, 128, 5], [70, 128, 5, 0], [70, 128, 5, 9], [128, 128, 0, 256], [1, 1, 1, 1]]
N, K = 264, 384  # neither a multiple of the tiles

_CASES: list[tuple[str, Callable[[], str]]] = []


def case(name: str):
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        _CASES.append((name, fn))
        return fn

    return register


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def _cutile_vs_reference(op: Callable, *args, bar: float, backend: str = "cutile", **kwargs) -> str:
    """Run ``op`` on ``backend`` and pytorch into NaN-poisoned outputs; return the calc_diff as text."""
    out = args[2]
    ref = torch.full_like(out, float("nan"))
    op(*args, backend=backend, **kwargs)
    op(*args[:2], ref, *args[3:], backend="pytorch", **kwargs)
    torch.cuda.synchronize()
    both = ~(out.isnan() & ref.isnan())
    diff = calc_diff(torch.nan_to_num(out[both]), torch.nan_to_num(ref[both])) if both.any() else 0.0
    if diff > bar or not torch.equal(out.isnan(), ref.isnan()):
        raise AssertionError(f"{backend} differs from pytorch: calc_diff {diff:.2e}, NaN rows differ")
    return f"calc_diff {diff:.1e}"


def _grouped_operands(rows: int, groups: int, fp8: bool, seed: int):
    g = _gen(seed)
    a = torch.randn(rows, K, device=DEV, generator=g)
    b = torch.randn(groups, N, K, device=DEV, generator=g)
    if fp8:
        return per_token_cast_to_fp8(a), per_block_cast_to_fp8(b)
    return a.bfloat16(), b.bfloat16()


def _psum_kwargs(alignment: int) -> dict:
    """The psum call's alignment argument, where the op takes one (DeepGEMM's layout aligns to 128)."""
    params = inspect.signature(tg.m_grouped_bf16_gemm_nt_contiguous).parameters
    return {"alignment": alignment} if "alignment" in params else {}


def _psum_ends(sizes: list[int], alignment: int) -> list[int]:
    ends, start = [], 0
    for s in sizes:
        ends.append(start + s)
        start = -(-(start + s) // alignment) * alignment
    return ends


for _fp8 in (False, True):
    _dt = "fp8" if _fp8 else "bf16"
    _op = getattr(tg, f"m_grouped_{_dt}_gemm_nt_contiguous")
    for _sizes in GROUP_PATTERNS:
        for _align in (ALIGN, 64, 1):

            @case(f"m-grouped {_dt} psum align={_align} groups={_sizes}")
            def _psum(op=_op, fp8=_fp8, sizes=_sizes, align=_align) -> str:
                kwargs = _psum_kwargs(align)
                if not kwargs and align != 1:
                    return "skipped: this API has no psum alignment argument"
                ends = _psum_ends(sizes, align)
                rows = ends[-1] + 77  # rows past the last group
                a, b = _grouped_operands(rows, len(sizes), fp8, seed=rows)
                offs = torch.tensor(ends, dtype=torch.int32, device=DEV)
                d = torch.full((rows, N), float("nan"), dtype=torch.bfloat16, device=DEV)
                return _cutile_vs_reference(op, a, b, d, offs, use_psum_layout=True, bar=1e-5, **kwargs)

    @case(f"m-grouped {_dt} psum garbage offsets")
    def _psum_garbage(op=_op, fp8=_fp8) -> str:
        rows = 300
        a, b = _grouped_operands(rows, 5, fp8, seed=5)
        offs = torch.tensor([250, -7, 10**6, 3, 2**31 - 1], dtype=torch.int32, device=DEV)
        d = torch.empty(rows, N, dtype=torch.bfloat16, device=DEV)
        op(a, b, d, offs, use_psum_layout=True, backend="cutile")
        torch.cuda.synchronize()
        return "ran"

    @case(f"m-grouped {_dt} m_indices: -1 padding, then garbage ids")
    def _indices(op=_op, fp8=_fp8) -> str:
        parts = []
        for gi, s in enumerate([70, 0, 128, 5]):
            seg = torch.full((-(-s // ALIGN) * ALIGN,), -1, dtype=torch.int32)
            seg[:s] = gi
            parts.append(seg)
        idx = torch.cat(parts).to(DEV)
        rows = idx.numel()
        a, b = _grouped_operands(rows, 4, fp8, seed=rows)
        d = torch.full((rows, N), float("nan"), dtype=torch.bfloat16, device=DEV)
        note = _cutile_vs_reference(op, a, b, d, idx, bar=1e-5)
        garbage = torch.randint(-9, 9, (rows,), generator=_gen(3), device=DEV, dtype=torch.int32)
        op(a, b, d, garbage, backend="cutile")
        torch.cuda.synchronize()
        return note

    _mop = getattr(tg, f"m_grouped_{_dt}_gemm_nt_masked")

    @case(f"m-grouped {_dt} masked: masked_m 0, Mmax, partial; then garbage")
    def _masked(op=_mop, fp8=_fp8) -> str:
        groups, mmax = 4, 200
        a, b = _grouped_operands(groups * mmax, groups, fp8, seed=9)
        a = tuple(t.view(groups, mmax, -1) for t in a) if fp8 else a.view(groups, mmax, K)
        d = torch.zeros(groups, mmax, N, dtype=torch.bfloat16, device=DEV)
        ref = d.clone()
        masked_m = torch.tensor([0, mmax, 77, 1], dtype=torch.int32, device=DEV)
        op(a, b, d, masked_m, 64, backend="cutile")
        op(a, b, ref, masked_m, 64, backend="pytorch")
        valid = torch.arange(mmax, device=DEV)[None, :] < masked_m[:, None]
        diff = calc_diff(d[valid], ref[valid])
        if diff > 1e-5:
            raise AssertionError(f"masked: calc_diff {diff:.2e}")
        garbage = torch.tensor([-5, 10**6, mmax + 1, 2**31 - 1], dtype=torch.int32, device=DEV)
        op(a, b, d, garbage, 64, backend="cutile")
        torch.cuda.synchronize()
        return f"calc_diff {diff:.1e}"

    _kop = getattr(tg, f"k_grouped_{_dt}_gemm_tn_contiguous")

    @case(f"k-grouped {_dt}: empty groups, then ks_tensor that disagrees with ks")
    def _k_grouped(op=_kop, fp8=_fp8) -> str:
        ks = [256, 0, 384, 128] if fp8 else [200, 0, 333, 1]
        m, n, k_sum = 136, 200, sum(ks)
        g = _gen(11)
        a = torch.randn(k_sum, m, device=DEV, generator=g)
        b = torch.randn(k_sum, n, device=DEV, generator=g)
        if fp8:
            qa, sa = per_token_cast_to_fp8(a.t().contiguous())
            qb, sb = per_token_cast_to_fp8(b.t().contiguous())
            a, b = (qa.t().contiguous(), sa.t().contiguous()), (qb.t().contiguous(), sb.t().contiguous())
        else:
            a, b = a.bfloat16(), b.bfloat16()
        ks_t = torch.tensor(ks, dtype=torch.int32, device=DEV)
        d = torch.full((len(ks), m, n), float("nan"), device=DEV)
        note = _cutile_vs_reference(op, a, b, d, ks, ks_t, bar=1e-5)
        garbage = torch.tensor([10**6, -300, 7, 2**31 - 1], dtype=torch.int32, device=DEV)
        op(a, b, d, ks, garbage, backend="cutile")
        torch.cuda.synchronize()
        return note


for _fp8 in (False, True):
    _dt = "fp8" if _fp8 else "bf16"
    # (20, 6400, 2100): an FP8 swap-AB plan with the deep load pipeline (unsplit 64-row tiles, K >= 2048), K ragged;
    # (40, 6400, 2100), (64, 2112, 520), (129, 77, 1000): narrow-tile kernels (FP8; both dtypes at 64 rows);
    # (200, 7000, 520): BF16 128x128 narrow tiles; (5, 7000, 2100): an unsplit BF16 plan at 2 CTAs per SM;
    # (24, 7000, 4200): unsplit 32-row tiles at 3 per SM (FP8 takes them from K = 4096); (30, 1500, 2000): narrow
    # tiles at 17-32 rows (FP8 16 weight rows, BF16 32); (100, 3000, 1100): FP8 64x64 tiles two K blocks at a time
    # (an odd block count); (128, 2112, 1100), (16, 7168, 2048): FP8 scale loads without bounds checks (narrow 64x64
    # pairs with an odd block count, swap-AB with 16 rows); (3, 2000, 4096), (7, 2000, 7000): swap-AB split-K plans
    # (16 BF16 / 8 FP8 splits of 2 steps; 14 splits of 4 BF16 / 2 FP8 steps). FP8
    # split-K plans of 4+ steps per split are not here: memcheck reports no error on them but their results under
    # memcheck are wrong (right natively and under racecheck / synccheck; results/sanitize/README.md).
    for _m, _n, _k in [
        (1, 264, 384),
        (3, 2112, 200),
        (129, 77, 1000),
        (300, 513, 128),
        (20, 6400, 2100),
        (40, 6400, 2100),
        (64, 2112, 520),
        (200, 7000, 520),
        (5, 7000, 2100),
        (24, 7000, 4200),
        (30, 1500, 2000),
        (100, 3000, 1100),
        (128, 2112, 1100),
        (16, 7168, 2048),
        (3, 2000, 4096),
        (7, 2000, 7000),
        (777, 1000, 4200),  # the tile kernel, split along K in two
    ]:

        @case(f"dense {_dt} nt {_m}x{_n}x{_k}")
        def _dense(fp8=_fp8, m=_m, n=_n, k=_k) -> str:
            g = _gen(m + n + k)
            a = torch.randn(m, k, device=DEV, generator=g)
            b = torch.randn(n, k, device=DEV, generator=g)
            d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
            if fp8:
                return _cutile_vs_reference(
                    tg.fp8_gemm_nt, per_token_cast_to_fp8(a), per_block_cast_to_fp8(b), d, bar=1e-5
                )
            return _cutile_vs_reference(tg.bf16_gemm_nt, a.bfloat16(), b.bfloat16(), d, bar=1e-5)


# The gluon dense FP8 kernel (Hopper): partial tiles in M, N and K, odd K-block counts, 1x128 B scales, fp32 output
# with an addend, more tiles than SMs.
for _m, _n, _k, _rows, _c in [
    (1, 8, 16, False, False),
    (129, 136, 1100, False, False),
    (300, 200, 1100, True, True),
    (777, 1000, 4200, False, True),
    (4097, 520, 640, True, False),
]:

    @case(f"dense fp8 gluon {_m}x{_n}x{_k}{' rows' if _rows else ''}{' c' if _c else ''}")
    def _dense_gluon(m=_m, n=_n, k=_k, rows=_rows, with_c=_c) -> str:
        from tilegemm.backend.selector import gluon_unavailable_reason

        reason = gluon_unavailable_reason()
        if reason is not None:
            return f"skipped: gluon unavailable ({reason})"
        g = _gen(m + n + k + 1)
        a = torch.randn(m, k, device=DEV, generator=g)
        b = torch.randn(n, k, device=DEV, generator=g)
        qb = per_token_cast_to_fp8(b) if rows else per_block_cast_to_fp8(b)
        dtype = torch.float32 if with_c else torch.bfloat16
        d = torch.full((m, n), float("nan"), dtype=dtype, device=DEV)
        c = torch.randn(m, n, device=DEV, generator=g) if with_c else None
        return _cutile_vs_reference(tg.fp8_gemm_nt, per_token_cast_to_fp8(a), qb, d, c, bar=1e-5, backend="gluon")


# The gluon plans' later launches (ops/gluon/tma.Relaunch): three calls of one shape on fresh activations and outputs
# (new addresses) beside one weight (a kept descriptor): the ws kernel with A's scales MN-major (launched as given)
# and K-major (copied per call), fp8_gemm_kernel (an addend); each checked against pytorch.
@case("dense fp8 gluon: relaunches on new operands")
def _dense_gluon_relaunch() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason
    from tilegemm.quant import get_mn_major_tma_aligned_tensor

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    m, n, k = 300, 520, 1100
    g = _gen(11)
    qb = per_block_cast_to_fp8(torch.randn(n, k, device=DEV, generator=g))
    diffs = []
    for mn_major, with_c in ((True, False), (False, False), (False, True)):
        for _ in range(3):
            qa, sa = per_token_cast_to_fp8(torch.randn(m, k, device=DEV, generator=g))
            sa = get_mn_major_tma_aligned_tensor(sa) if mn_major else sa
            d = torch.full((m, n), float("nan"), dtype=torch.float32 if with_c else torch.bfloat16, device=DEV)
            c = torch.randn(m, n, device=DEV, generator=g) if with_c else None
            diffs.append(_cutile_vs_reference(tg.fp8_gemm_nt, (qa, sa), qb, d, c, bar=1e-5, backend="gluon"))
    return "; ".join(diffs)


# The warp-specialized gluon FP8 prototype (ops/gluon/fp8_gemm_ws.py), every design: partial tiles in M, N and K,
# one K block, K-block counts that leave every tail of the overlap runs, a persistent grid of 3 CTAs over many tiles.
@case("dense fp8 gluon ws: every design, awkward shapes")
def _dense_gluon_ws() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason
    from tilegemm.quant import get_mn_major_tma_aligned_tensor

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    from tilegemm.ops.gluon import fp8_gemm_ws as ws

    worst = 0.0
    for name, cfg in ws.VARIANTS.items():
        for m, n, k, sms in [(1, 256, 128, None), (300, 200, 1100, None), (257, 520, 640, 3)]:
            g = _gen(m + n + k)
            a = torch.randn(m, k, device=DEV, generator=g)
            b = torch.randn(n, k, device=DEV, generator=g)
            qa, sa = per_token_cast_to_fp8(a)
            qb, sb = per_block_cast_to_fp8(b)
            d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
            a, b = (qa, get_mn_major_tma_aligned_tensor(sa)), (qb, sb)
            ws.ws_plan(a, b, d, cfg, sms)(a, b, d)
            ref = torch.empty_like(d)
            tg.fp8_gemm_nt((qa, sa), (qb, sb), ref, backend="pytorch")
            torch.cuda.synchronize()
            if d.isnan().any():
                raise AssertionError(f"{name} {m}x{n}x{k}: output elements not written")
            worst = max(worst, calc_diff(d, ref))
    if worst > 1e-5:
        raise AssertionError(f"fp8_gemm_ws differs from pytorch: calc_diff {worst:.2e}")
    return f"{len(ws.VARIANTS)} designs, calc_diff {worst:.1e}"


# The warp-specialized gluon BF16 kernel (ops/gluon/bf16_gemm_ws.py), every design: partial tiles in M, N and K,
# one partial K block, a persistent grid of 3 CTAs over many tiles, an fp32 output; then bf16_gemm_nt on gluon twice
# a shape (the plan, then its relaunch on new operands).
@case("dense bf16 gluon ws: every design, awkward shapes")
def _dense_bf16_gluon_ws() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    from tilegemm.ops.gluon import bf16_gemm_ws as bw

    worst = 0.0
    for name, cfg in bw.VARIANTS.items():
        for m, n, k, sms, dtype in [(1, 256, 8, None, torch.bfloat16), (300, 200, 1096, None, torch.float32),
                                    (257, 520, 640, 3, torch.bfloat16)]:  # fmt: skip
            g = _gen(m + n + k)
            a = torch.randn(m, k, device=DEV, generator=g).bfloat16()
            b = torch.randn(n, k, device=DEV, generator=g).bfloat16()
            d = torch.full((m, n), float("nan"), dtype=dtype, device=DEV)
            bw.bf16_ws_plan(a, b, d, cfg, sms)(a, b, d)
            torch.cuda.synchronize()
            if d.isnan().any():
                raise AssertionError(f"{name} {m}x{n}x{k}: output elements not written")
            worst = max(worst, calc_diff(d, a.double() @ b.double().t()))
    # the public op on gluon (its plan, then the relaunch on new operands), in the design the rule picks
    for m, n, k in [(200, 312, 1096), (513, 2112, 1024)]:  # N off the tiles, D rows 16-byte aligned
        for seed in (1, 2):
            g = _gen(m + n + k + seed)
            a = torch.randn(m, k, device=DEV, generator=g).bfloat16()
            b = torch.randn(n, k, device=DEV, generator=g).bfloat16()
            d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
            tg.bf16_gemm_nt(a, b, d, backend="gluon")
            torch.cuda.synchronize()
            if d.isnan().any():
                raise AssertionError(f"bf16_gemm_nt on gluon {m}x{n}x{k}: output elements not written")
            worst = max(worst, calc_diff(d, a.double() @ b.double().t()))
    if worst > 1e-5:
        raise AssertionError(f"bf16_gemm_ws differs from float64: calc_diff {worst:.2e}")
    return f"{len(bw.VARIANTS)} designs and the public op, calc_diff {worst:.1e}"


# The split tail of both ws kernels (ops/gluon/split_tail.py), every split design: grids whose last round is split
# (two whole rounds of 16 CTAs and a tail of 2 tiles; 3 tiles on 16 SMs, every tile split), the last row and column
# tiles partial, K 256 (FP8: 2 blocks, so runs with none) and 1216; each plan run twice (the counters reset between).
@case("dense gluon ws split tail: every split design, split grids")
def _dense_gluon_ws_split_tail() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason
    from tilegemm.quant import get_mn_major_tma_aligned_tensor

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    from tilegemm.ops.gluon import bf16_gemm_ws as bw
    from tilegemm.ops.gluon import fp8_gemm_ws as ws

    worst, count = 0.0, 0
    for module, kind in ((ws, "fp8"), (bw, "bf16")):
        for name, cfg in module.VARIANTS.items():
            if cfg.splits == 1:
                continue
            for rows, cols, k in [(2, 17, 256), (1, 3, 1216), (2, 17, 1216)]:
                m, n = rows * cfg.block_m - 7, cols * cfg.block_n - 8
                g = _gen(m + n + k)
                a = torch.randn(m, k, device=DEV, generator=g)
                b = torch.randn(n, k, device=DEV, generator=g)
                d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
                ref = torch.empty_like(d)
                if kind == "fp8":
                    qa, sa = per_token_cast_to_fp8(a)
                    qb, sb = per_block_cast_to_fp8(b)
                    a, b = (qa, get_mn_major_tma_aligned_tensor(sa)), (qb, sb)
                    plan = ws.ws_plan(a, b, d, cfg, 16)
                    tg.fp8_gemm_nt((qa, sa), (qb, sb), ref, backend="pytorch")
                else:
                    a, b = a.bfloat16(), b.bfloat16()
                    plan = bw.bf16_ws_plan(a, b, d, cfg, 16)
                    ref.copy_(a.double() @ b.double().t())
                for _ in range(2):
                    plan(a, b, d)
                torch.cuda.synchronize()
                if d.isnan().any() or plan.tails().counters.any():
                    raise AssertionError(f"{name} {m}x{n}x{k}: elements not written or counters not reset")
                worst = max(worst, calc_diff(d, ref))
                count += 1
    if worst > 1e-5:
        raise AssertionError(f"split tail differs from the reference: calc_diff {worst:.2e}")
    return f"{count} split grids, calc_diff {worst:.1e}"


# The ws kernel's m-grouped form (ops/gluon/grouped.py): -1 padding ending groups, an empty group, a partial last
# block, N and K off the tiles, every one-wave design on a 3-CTA persistent grid; then garbage ids.
@case("m-grouped fp8 gluon ws: m_indices padding, partial last block, every grouped design; then garbage ids")
def _m_grouped_gluon_ws() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    from tilegemm.ops.gluon import fp8_gemm_ws as ws

    parts = []
    for gi, s in enumerate([70, 0, 128, 5]):
        seg = torch.full((-(-s // ALIGN) * ALIGN,), -1, dtype=torch.int32)
        seg[:s] = gi
        parts.append(seg)
    idx = torch.cat(parts)[:-60].to(DEV)  # the last block partial
    rows = idx.numel()
    a, b = _grouped_operands(rows, 4, True, seed=rows)
    d = torch.full((rows, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    note = _cutile_vs_reference(tg.m_grouped_fp8_gemm_nt_contiguous, a, b, d, idx, bar=1e-5, backend="gluon")
    designs = [n for n, cfg in ws.VARIANTS.items() if cfg.waves == 1 and n != "cd_128x192_ov" and cfg.splits == 1]
    ref = torch.empty_like(d)
    tg.m_grouped_fp8_gemm_nt_contiguous(a, b, ref, idx, backend="pytorch")
    for name in designs:
        d.fill_(float("nan"))
        ws.ws_plan(a, b, d, ws.VARIANTS[name], 3, idx)(a, b, d, m_index=idx)
        torch.cuda.synchronize()
        if d.isnan().any() or calc_diff(d, ref) > 1e-5:
            raise AssertionError(f"{name}: differs from pytorch or left rows unwritten")
    garbage = torch.randint(-9, 9, (rows,), generator=_gen(3), device=DEV, dtype=torch.int32)
    tg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, garbage, backend="gluon")
    torch.cuda.synchronize()
    return f"{note}; {len(designs)} designs"


# The ws kernel's k-grouped form (ops/gluon/grouped.py): uneven K with an empty group, N off the tiles, accumulating
# into d, from the tn operands and from the nt op's blocks read in place; then garbage K offsets (clamped into
# [0, K_sum]) through the plan directly.
@case("k-grouped fp8 gluon ws: an empty group, N off the tiles, c = d, tn and nt in place; then garbage offsets")
def _k_grouped_gluon_ws() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    from tilegemm.ops.gluon import fp8_gemm_ws as ws

    ks, m, n = [256, 0, 384, 128], 256, N
    g = _gen(41)
    qa, sa = per_token_cast_to_fp8(torch.randn(m, sum(ks), device=DEV, generator=g))
    qb, sb = per_token_cast_to_fp8(torch.randn(n, sum(ks), device=DEV, generator=g))
    a, b = (qa.t().contiguous(), sa.t().contiguous()), (qb.t().contiguous(), sb.t().contiguous())
    layout = torch.tensor(ks, dtype=torch.int32, device=DEV)
    d = torch.randn(len(ks), m, n, device=DEV, generator=g)
    ref, by_nt = d.clone(), d.clone()
    tg.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, layout, c=d, backend="gluon")
    tg.k_grouped_fp8_gemm_tn_contiguous(a, b, ref, ks, layout, c=ref, backend="pytorch")
    torch.cuda.synchronize()
    diff = calc_diff(d, ref)
    if not diff < 1e-6:
        raise AssertionError(f"gluon differs from pytorch: calc_diff {diff:.2e}")
    bounds = [sum(ks[:g]) for g in range(len(ks) + 1)]  # the nt op's blocks, read in place: the tn op's bits
    a_nt = torch.cat([qa[:, s:e].contiguous().flatten() for s, e in zip(bounds[:-1], bounds[1:])])
    b_nt = torch.cat([qb[:, s:e].contiguous().flatten() for s, e in zip(bounds[:-1], bounds[1:])])
    tg.k_grouped_fp8_gemm_nt_contiguous((a_nt, sa), (b_nt, sb), by_nt, ks, layout, c=by_nt, backend="gluon")
    torch.cuda.synchronize()
    if not torch.equal(by_nt, d):
        raise AssertionError(f"nt blocks read in place differ from the tn op: calc_diff {calc_diff(by_nt, d):.2e}")
    garbage = torch.tensor([0, -300, 10**6, 128, -5], dtype=torch.int32, device=DEV)
    a_k, b_k = (qa, sa), (qb, sb)
    ws.ws_plan(a_k, b_k, d, ws.VARIANTS["a_128x128_p"], 3, k_offsets=garbage)(a_k, b_k, d, k_offsets=garbage)
    torch.cuda.synchronize()
    return f"calc_diff {diff:.1e}"


@case("k-grouped bf16 gluon ws: every design, an empty group, N off the tiles, c = d; then garbage offsets")
def _k_grouped_bf16_gluon_ws() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    from tilegemm.heuristics.gluon import K_GROUPED_BF16_WS_TILES
    from tilegemm.ops.gluon import bf16_gemm_ws as bw

    ks, m, n = [256, 0, 320, 64], 256, N
    g = _gen(43)
    a = torch.randn(sum(ks), m, device=DEV, generator=g).bfloat16()
    b = torch.randn(sum(ks), n, device=DEV, generator=g).bfloat16()
    layout = torch.tensor(ks, dtype=torch.int32, device=DEV)
    offsets = torch.tensor([0, 256, 256, 576, 640], dtype=torch.int32, device=DEV)
    d = torch.randn(len(ks), m, n, device=DEV, generator=g)
    ref = d.clone()
    tg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, layout, c=d, backend="gluon")
    tg.k_grouped_bf16_gemm_tn_contiguous(a, b, ref, ks, layout, c=ref, backend="pytorch")
    torch.cuda.synchronize()
    worst = calc_diff(d, ref)
    bounds = offsets.tolist()
    product = torch.stack([a[s:e].double().t() @ b[s:e].double() for s, e in zip(bounds[:-1], bounds[1:])])
    for design, *_ in K_GROUPED_BF16_WS_TILES:  # each design on a 3-CTA grid, every element of d written
        out = torch.full((len(ks), m, n), float("nan"), device=DEV)
        bw.bf16_ws_plan(a, b, out, bw.VARIANTS[design], 3, ks=ks)(a, b, out, k_offsets=offsets)
        torch.cuda.synchronize()
        if out.isnan().any():
            raise AssertionError(f"{design}: output elements not written")
        worst = max(worst, calc_diff(out, product))
    if not worst < 1e-6:
        raise AssertionError(f"gluon differs from pytorch: calc_diff {worst:.2e}")
    garbage = torch.tensor([0, -300, 10**6, 64, -5], dtype=torch.int32, device=DEV)
    bw.bf16_ws_plan(a, b, d, bw.VARIANTS["bf16_128x128"], 3, ks=ks)(a, b, d, k_offsets=garbage)
    torch.cuda.synchronize()
    return f"{len(K_GROUPED_BF16_WS_TILES)} designs, calc_diff {worst:.1e}"


class _ForcedVariant:
    """The variant variable ``env`` (``TILEGEMM_MOE_VARIANT`` by default) set to ``variant`` inside the block (unset
    for ``None``), restored after it."""

    def __init__(self, variant: str | None, env: str = MOE_VARIANT_ENV) -> None:
        self.variant, self.env, self.before = variant, env, None

    def __enter__(self) -> None:
        self.before = os.environ.pop(self.env, None)
        if self.variant:
            os.environ[self.env] = self.variant

    def __exit__(self, *exc: object) -> None:
        os.environ.pop(self.env, None)
        if self.before is not None:
            os.environ[self.env] = self.before


def _moe_case(
    op: Callable,
    tokens: int,
    hidden: int,
    inter: int,
    fp8: bool,
    variant: str | None,
    bar: float,
    backend: str = "cutile",
) -> str:
    """``op`` (``moe_experts`` or ``fp8_moe_experts``) on 16 experts, top-4, one sentinel id: ``backend`` against
    pytorch, then a call with garbage int64 expert ids (checked only for staying in bounds)."""
    experts, top_k = 16, 4
    g = _gen(tokens)
    x = torch.randn(tokens, hidden, device=DEV, generator=g).bfloat16()
    w13 = torch.randn(experts, 2 * inter, hidden, device=DEV, generator=g) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device=DEV, generator=g) / inter**0.5
    w13, w2 = (per_block_cast_to_fp8(w13), per_block_cast_to_fp8(w2)) if fp8 else (w13.bfloat16(), w2.bfloat16())
    ids = torch.stack([torch.randperm(experts, device=DEV, generator=g)[:top_k] for _ in range(tokens)])
    ids[0, -1] = -1  # an expert-parallel sentinel
    w = torch.rand(tokens, top_k, device=DEV, generator=g)
    with _ForcedVariant(variant):
        out = op(x, ids, w, w13, w2, backend=backend)
        diff = calc_diff(out, op(x, ids, w, w13, w2, backend="pytorch"))
        if diff > bar:
            raise AssertionError(f"{backend} differs from pytorch: calc_diff {diff:.2e}")
        garbage = torch.randint(-(2**31), 2**31 - 1, ids.shape, device=DEV, generator=g, dtype=torch.int64)
        op(x, garbage, w, w13, w2, backend=backend)
        torch.cuda.synchronize()
    return f"calc_diff {diff:.1e}"


for _t, _variant in ((1, None), (3, None), (40, "slots"), (40, "blocks"), (40, "sorted")):

    @case(f"moe_experts: {_t} tokens ({_variant or 'the default'} path), then garbage expert ids")
    def _moe(tokens=_t, variant=_variant) -> str:
        return _moe_case(tg.moe_experts, tokens, 264, 200, False, variant, 1e-5)  # neither a multiple of the tiles


for _t, _variant in ((1, None), (40, "blocks"), (40, "sorted"), (300, None)):

    @case(f"fp8_moe_experts: {_t} tokens ({_variant or 'the default'} form), then garbage expert ids")
    def _fp8_moe(tokens=_t, variant=_variant) -> str:
        # Two implementations, each a few e4m3 steps of h from the formula: the harness's FP8 bar.
        return _moe_case(tg.fp8_moe_experts, tokens, 384, 256, True, variant, 5e-4)


for _t in (1, 300, 700):

    @case(f"fp8_moe_experts gluon: {_t} tokens (m-grouped GEMMs), then garbage expert ids")
    def _fp8_moe_gluon(tokens=_t) -> str:
        return _moe_case(tg.fp8_moe_experts, tokens, 384, 256, True, None, 5e-4, backend="gluon")


@case("moe_experts training (forward + backward): 40 tokens, then garbage expert ids")
def _moe_train() -> str:
    """``tilegemm.autograd.moe_experts`` forward and backward on cutile against pytorch (output and the four
    gradients), then both with garbage int64 expert ids (checked only for staying in bounds)."""
    import tilegemm.autograd

    tokens, experts, top_k, hidden, inter = 40, 16, 4, 264, 200  # neither H nor I a multiple of the tiles
    g = _gen(7)
    x = torch.randn(tokens, hidden, device=DEV, generator=g).bfloat16()
    w13 = (torch.randn(experts, 2 * inter, hidden, device=DEV, generator=g) / hidden**0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, device=DEV, generator=g) / inter**0.5).bfloat16()
    ids = torch.stack([torch.randperm(experts, device=DEV, generator=g)[:top_k] for _ in range(tokens)])
    ids[0, -1] = -1
    w = torch.rand(tokens, top_k, device=DEV, generator=g).bfloat16()
    dout = torch.randn(tokens, hidden, device=DEV, generator=g).bfloat16()

    def run(backend: str, expert_ids: torch.Tensor) -> list[torch.Tensor]:
        leaves = [t.clone().requires_grad_() for t in (x, w, w13, w2)]
        with tg.use_backend(backend):
            out = tilegemm.autograd.moe_experts(leaves[0], expert_ids, leaves[1], leaves[2], leaves[3])
            out.backward(dout)
        return [out.detach(), *(t.grad for t in leaves)]

    diff = max(calc_diff(a, b) for a, b in zip(run("cutile", ids), run("pytorch", ids)))
    if diff > 1e-5:
        raise AssertionError(f"cutile differs from pytorch: calc_diff {diff:.2e}")
    run("cutile", torch.randint(-(2**31), 2**31 - 1, ids.shape, device=DEV, generator=g, dtype=torch.int64))
    torch.cuda.synchronize()
    return f"calc_diff {diff:.1e} (worst of the output and four gradients)"


@case("rms norm: rows off the tiles, unaligned rows, the longest row, a column slice")
def _rms_norm() -> str:
    worst = 0.0
    g = torch.Generator().manual_seed(4)
    for rows, h in ((130, 128), (5, 97), (3, 7168), (2, 8192), (1, 1)):
        x = torch.randn(rows, h + 3, generator=g).bfloat16().to(DEV)[:, 3:]
        w = torch.randn(h, generator=g).bfloat16().to(DEV)
        got, want = tg.rms_norm(x, w, backend="cutile"), tg.rms_norm(x, w, backend="pytorch")
        torch.cuda.synchronize()
        worst = max(worst, calc_diff(got, want))
    if worst > 1e-5:
        raise AssertionError(f"cutile differs from pytorch: calc_diff {worst:.2e}")
    return f"calc_diff {worst:.1e}"


@case("mqa logits: windows past both ends")
def _mqa() -> str:
    g = torch.Generator().manual_seed(1)
    # H = 64: two key tiles per iteration at D = 64 on sm_90 (odd tile counts: the last pair ends past the keys and
    # takes the last tile again), three CTAs per SM at D = 32; 384 and 512 keys, even row counts: tiles inside
    # (output stores unchecked, and at H = 32 the key scales too)
    plain = ((70, 333, 64, 128), (72, 300, 64, 64), (71, 300, 64, 32), (72, 384, 64, 64), (68, 512, 32, 128))
    for s, s_kv, h, d in plain:
        q8 = torch.randn(s, h, d, generator=g).to(torch.float8_e4m3fn).to(DEV)
        kv = tuple(t.to(DEV) for t in indexer.quantize_keys(torch.randn(s_kv, d, generator=g)))
        w = torch.randn(s, h, generator=g).to(DEV)
        ks = torch.randint(-1000, 100, (s,), generator=g, dtype=torch.int32).to(DEV)
        ke = torch.randint(200, 5000, (s,), generator=g, dtype=torch.int32).to(DEV)
        for _ in range(2):  # the full path, then the hot lane's replay
            tg.fp8_mqa_logits(q8, kv, w, ks, ke, backend="cutile")
    torch.cuda.synchronize()
    return "ran"


@case(
    "paged mqa logits (next_n 1 and 2, scheduled and not): garbage block table tail, output as wide as the longest, "
    "then garbage schedule and lengths"
)
def _paged() -> str:
    for next_n in (1, 2):  # 128-key chunks, two per 256-key split (paged_mqa_config)
        g = torch.Generator().manual_seed(2)
        b, h, d, block_kv = 3, 64, 128, 64
        lens = [130, 2, 640]  # 640 keys: the last split's second chunk starts at the output's end
        keys = [torch.randn(n, d, generator=g) for n in lens]
        cache, table, ctx = indexer.build_paged_kv_cache(keys, block_kv, num_blocks=30, generator=g)
        table = torch.cat([table, torch.randint(-50, 10**6, (b, 3), generator=g, dtype=torch.int32)], 1)
        q8 = torch.randn(b, next_n, h, d, generator=g).to(torch.float8_e4m3fn)
        w = torch.randn(b * next_n, h, generator=g)
        cache, table, ctx, q8, w = (t.to(DEV) for t in (cache, table, ctx, q8, w))
        meta = tg.get_paged_mqa_logits_metadata(ctx, block_kv, 132, backend="cutile")
        for width, schedule in itertools.product((max(lens), max(lens) + 50), (meta, None)):  # None: no schedule
            tg.fp8_paged_mqa_logits(q8, cache, w, ctx, table, schedule, width, backend="cutile")
        bad_meta = torch.randint(-100, 10**5, meta.shape, generator=torch.Generator().manual_seed(3), dtype=torch.int32)
        bad_ctx = torch.tensor([10**6, -4, 2**31 - 1], dtype=torch.int32, device=DEV)
        tg.fp8_paged_mqa_logits(q8, cache, w, bad_ctx, table, bad_meta.to(DEV), width, backend="cutile")
        tg.fp8_paged_mqa_logits(q8, cache, w, bad_ctx, table, None, width, backend="cutile")
    torch.cuda.synchronize()
    return "ran"


@case("bf16 mqa logits: windows past both ends, then valid windows against the reference")
def _bf16_mqa() -> str:
    g = torch.Generator().manual_seed(2)
    # H = 64 at D = 128: two MMA chains (the indexers' size); H = 32, 64 at D = 64, 32: one chain; odd row and key
    # counts (tiles outside), and 384 keys at an even row count (tiles inside: unchecked stores and scale loads)
    shapes = ((70, 333, 64, 128), (71, 300, 64, 64), (72, 300, 64, 32), (68, 384, 32, 128), (1, 1000, 64, 128))
    worst = 0.0
    for s, s_kv, h, d in shapes:
        q = torch.randn(s, h, d, generator=g).bfloat16().to(DEV)
        kv = torch.randn(s_kv, d, generator=g).bfloat16().to(DEV)
        w = torch.randn(s, h, generator=g).to(DEV)
        ks = torch.randint(-1000, 100, (s,), generator=g, dtype=torch.int32).to(DEV)
        ke = torch.randint(200, 5000, (s,), generator=g, dtype=torch.int32).to(DEV)
        tg.bf16_mqa_logits(q, kv, w, ks, ke, backend="cutile")
        ke = torch.randint(0, s_kv + 1, (s,), generator=g, dtype=torch.int32)
        ks = (ke - torch.randint(0, s_kv + 1, (s,), generator=g, dtype=torch.int32)).clamp(min=0).to(DEV)
        ke = ke.to(DEV)
        got = tg.bf16_mqa_logits(q, kv, w, ks, ke, backend="cutile")
        ref = tg.bf16_mqa_logits(q, kv, w, ks, ke, backend="pytorch")
        if not torch.equal(got.isneginf(), ref.isneginf()):
            raise AssertionError(f"bf16 mqa logits {s}x{s_kv}x{h}x{d}: -inf masks differ")
        finite = ref.isfinite()
        if finite.any():
            worst = max(worst, calc_diff(got[finite], ref[finite]))
    torch.cuda.synchronize()
    if worst > 1e-6:
        raise AssertionError(f"cutile differs from pytorch: calc_diff {worst:.2e}")
    return f"calc_diff {worst:.1e}"


@case("mqa logits decode kernel (fp8 and bf16): windows past both ends, few rows over many keys")
def _mqa_decode() -> str:
    with _ForcedVariant("decode", MQA_VARIANT_ENV):
        g = torch.Generator().manual_seed(4)
        for rows, s_kv, h, d in ((1, 5000, 64, 128), (3, 1000, 64, 128), (2, 129, 16, 32), (4, 777, 32, 64)):
            w = torch.randn(rows, h, generator=g).to(DEV)
            ks = torch.randint(-1000, 100, (rows,), generator=g, dtype=torch.int32).to(DEV)
            ke = torch.randint(0, 3 * s_kv, (rows,), generator=g, dtype=torch.int32).to(DEV)
            q8 = torch.randn(rows, h, d, generator=g).to(torch.float8_e4m3fn).to(DEV)
            kv = tuple(t.to(DEV) for t in indexer.quantize_keys(torch.randn(s_kv, d, generator=g)))
            q = torch.randn(rows, h, d, generator=g).bfloat16().to(DEV)
            kv16 = torch.randn(s_kv, d, generator=g).bfloat16().to(DEV)
            for _ in range(2):  # the full path, then the hot lane's replay
                tg.fp8_mqa_logits(q8, kv, w, ks, ke, backend="cutile")
                tg.bf16_mqa_logits(q, kv16, w, ks, ke, backend="cutile")
        torch.cuda.synchronize()
    return "ran"


@case("mqa logits batched decode kernel (fp8 and bf16): windows past both ends, several rows per sequence")
def _mqa_batched() -> str:
    with _ForcedVariant("decode", MQA_VARIANT_ENV):
        g = torch.Generator().manual_seed(6)
        for dtype, batch, rows, keys, h, d in (
            ("bf16", 3, 2, 333, 64, 128),
            ("fp8", 5, 1, 777, 64, 128),
            ("bf16", 2, 3, 129, 16, 32),
        ):
            q = torch.randn(batch, rows, h, d, generator=g)
            k = torch.randn(batch, keys, d, generator=g)
            if dtype == "bf16":
                q, kv = q.bfloat16().to(DEV), k.bfloat16().to(DEV)
            else:
                q = q.to(torch.float8_e4m3fn).to(DEV)
                kv = (k.to(torch.float8_e4m3fn).to(DEV), torch.rand(batch, keys, generator=g).to(DEV))
            w = torch.randn(batch, rows, h, generator=g).to(DEV)
            ks = torch.randint(-1000, 100, (batch, rows), generator=g, dtype=torch.int32).to(DEV)
            ke = torch.randint(0, 3 * keys, (batch, rows), generator=g, dtype=torch.int32).to(DEV)
            for clean in (False, True, False):  # the full path, then the hot lane's replays
                tg.mqa_logits_batched(q, kv, w, ks, ke, clean, backend="cutile")
        torch.cuda.synchronize()
    return "ran"


# The FP8 row cast (awkward row counts, fp32/fp16 rows, padded and unaligned columns), the paged append with
# positions before and past the table and blocks outside the cache (nothing written there), the indexer prepare with
# those and with boolean / additive masks of unaligned rows over one and several key tiles, the decode prepare's
# weights and mask rows (one to 35 key tiles a CTA, no keys), the schedule kernel.
@case(
    "mqa prep kernels: FP8 rows, paged append, indexer and decode prepare with garbage positions and blocks, schedule"
)
def _mqa_prep() -> str:
    g = torch.Generator().manual_seed(7)
    for shape, dtype, hadamard in (
        ((130, 128), torch.bfloat16, True),
        ((3, 5, 100), torch.float32, False),
        ((65, 16), torch.float16, True),
        ((1, 1000), torch.bfloat16, False),
    ):
        x = torch.randn(*shape, generator=g).to(dtype).to(DEV)
        tg.fp8_quantize_rows(x, hadamard=hadamard, backend="cutile")
        tg.fp8_quantize_rows(x[..., 1:] if not hadamard else x, hadamard=hadamard, backend="cutile")  # unaligned rows
    for batch, count, block_kv, lens in ((3, 70, 64, [70, 300, 10**6]), (2, 1, 16, [-5, 33]), (4, 2, 32, [97])):
        cache = torch.zeros(batch * 2 + 1, block_kv, 1, 132, dtype=torch.uint8, device=DEV)
        table = torch.randint(-3, batch * 2 + 4, (batch, 3), generator=g, dtype=torch.int32).to(DEV)  # some outside
        x = torch.randn(batch, count, 128, generator=g).bfloat16().to(DEV)
        ctx = torch.tensor(lens, dtype=torch.int64, device=DEV)
        tg.fp8_paged_append(x, cache, table, ctx if len(lens) > 1 else ctx.reshape(()), hadamard=True, backend="cutile")
        for heads in (64, 5):  # the indexer's 64 query rows a token; 5: ragged row blocks
            q = torch.randn(batch, count, heads, 128, generator=g).bfloat16().to(DEV)
            w = torch.randn(batch, count, heads, generator=g).to(DEV)
            lens_arg = ctx if len(lens) > 1 else ctx.reshape(())
            seen = torch.rand(batch, count, 4097, generator=g) < 0.5  # rows of 4097 bytes: no aligned row
            additive = torch.where(torch.rand(batch, count, 9001, generator=g) < 0.5, 0.0, float("-inf"))
            masks = (None, None, seen.to(DEV), additive.bfloat16().to(DEV), additive.to(DEV)[:, :, 1:])
            for keys, mask in zip((x, x[:, :0], x, x, x), masks):  # full path, no keys, masks (the last strided)
                for _ in range(2):  # the second call: the hot lane's replay
                    tg.fp8_indexer_prepare(
                        q, keys, w, cache, table, lens_arg, hadamard=True, weight_scale=0.1, attention_mask=mask,
                        backend="cutile",
                    )  # fmt: skip
    for batch, rows, heads, keys in ((1, 1, 64, 4097), (3, 3, 5, 9001), (2, 4, 64, 70000), (2, 2, 8, 0)):
        w = torch.randn(batch, rows, heads, generator=g).to(DEV)
        seen = torch.rand(batch, rows, keys, generator=g) < 0.5
        for mask in (seen.to(DEV), torch.where(seen, 0.0, float("-inf")).bfloat16().to(DEV), None):
            for _ in range(2):  # the second call: the hot lane's replay
                tg.indexer_decode_prepare(w, mask, weight_scale=0.1, backend="cutile")
    for shape in ((1,), (17,), (300, 2), (40, 3)):
        lens = torch.randint(0, 70000, shape, generator=g, dtype=torch.int32).to(DEV)
        for sms in (1, 132, 255):
            tg.get_paged_mqa_logits_metadata(lens, 64, sms, backend="cutile")
            tg.get_paged_mqa_logits_metadata(lens, 64, sms, backend="cutile")  # the hot lane's replay
    torch.cuda.synchronize()
    return "ran"


# The gluon sparse decode attention: indices anywhere in int32 (outside [0, T) they select nothing and read nothing),
# boolean and additive masks, grouped heads, awkward head dims, one split and several; valid indices against pytorch.
@case("sparse decode attention gluon: garbage indices, awkward shapes")
def _sparse_decode_attention() -> str:
    from tilegemm.backend.selector import gluon_unavailable_reason

    reason = gluon_unavailable_reason()
    if reason is not None:
        return f"skipped: gluon unavailable ({reason})"
    g = _gen(12)
    diffs = []
    for b, h, hk, t, dk, dv, count in (
        (1, 128, 128, 300, 192, 128, 2048),
        (3, 6, 3, 77, 80, 40, 50),
        (2, 4, 1, 5, 64, 96, 1),
    ):
        q = torch.randn(b, h, dk, device=DEV, generator=g).bfloat16()
        k = torch.randn(b, hk, t, dk, device=DEV, generator=g).bfloat16()
        v = torch.randn(b, hk, t, dv, device=DEV, generator=g).bfloat16()
        visible = torch.rand(b, t, device=DEV, generator=g) > 0.2
        additive = torch.zeros(b, t, device=DEV).masked_fill(~visible, float("-inf"))
        wild = torch.randint(-(2**31), 2**31 - 1, (b, count), device=DEV, generator=g, dtype=torch.int32)
        valid = torch.randint(0, t, (b, count), device=DEV, generator=g)
        for mask, _ in itertools.product((None, visible, additive), range(2)):  # full path, then hot-lane replay
            tg.sparse_decode_attention(q, k, v, wild, 0.1, mask, backend="gluon")
            got = tg.sparse_decode_attention(q, k, v, valid, 0.1, mask, backend="gluon")
            want = tg.sparse_decode_attention(q, k, v, valid, 0.1, mask, backend="pytorch")
            diff = calc_diff(got.double(), want.double())
            if diff > 1e-5:
                raise AssertionError(f"gluon differs from pytorch: calc_diff {diff:.2e}")
            diffs.append(diff)
    torch.cuda.synchronize()
    return f"calc_diff <= {max(diffs):.1e}"


def selected(only: str = "", shard: tuple[int, int] = (0, 1)) -> list[tuple[str, Callable[[], str]]]:
    """The cases whose name contains ``only``, then every ``count``-th of them from ``index`` (``shard``: index, count),
    so that ``count`` processes with indices ``0 .. count - 1`` run each selected case exactly once."""
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: the index must be in 0 .. {count - 1}")
    return [c for c in _CASES if only in c[0]][index::count]


def _parse_shard(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    return int(index), int(count)


def main() -> int:
    parser = argparse.ArgumentParser(description="every kernel family on awkward shapes and garbage values")
    parser.add_argument("only", nargs="?", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--shard", type=_parse_shard, default=(0, 1), metavar="I/N", help="every N-th case from I")
    args = parser.parse_args()
    cases = selected(args.only, args.shard)
    if not torch.cuda.is_available():
        print("tests/sanitize/cases.py needs a CUDA GPU (make test-gpu-sanitize on a GPU machine)", file=sys.stderr)
        return 2
    os.environ.setdefault("TILEGEMM_CHECK_VALUES", "0")
    os.environ.setdefault("TILEGEMM_DISABLE_FALLBACK", "1")
    failed = 0
    for name, fn in cases:
        start = time.perf_counter()
        try:
            note = fn()
            print(f"ok    {name}: {note} ({time.perf_counter() - start:.1f} s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {name}:\n{traceback.format_exc()}", flush=True)
    print(f"{len(cases) - failed} passed, {failed} failed, {len(_CASES) - len(cases)} not selected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
