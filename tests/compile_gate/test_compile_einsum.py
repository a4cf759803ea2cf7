"""CPU compile gate for the einsum and pre-norm kernels (``ops/cutile/einsum.py``, ``prenorm.py``), sm_90 and sm_100.

Variants: the ``bmk,bnk->mn`` kernel (split-K with an fp32 workspace, and whole tiles with each epilogue), its
split-K reduce kernel (each epilogue), the ``bhd,hdr->bhr`` per-head kernel (each config and epilogue), the
TF32 pre-norm kernel (each column tile), and the grouped-kernel variants only the einsum paths launch (the
masked BF16 / FP8 GEMM writing an fp32 ``d``). Each is compiled once per arch with ``export_kernel`` (no GPU)
and its SASS checked: tensor-core MMAs (the TF32 ones included), TMA operand loads, no LDL/STL spills, no
byte-wide FP8 loads, no TMA descriptors built on the device.
"""

from __future__ import annotations

import pytest
import torch

ct = pytest.importorskip("cuda.tile")

from compile_gate.sass import compile_all  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.heuristics.cutile import einsum as einsum_rules  # noqa: E402
from tilegemm.ops.cutile import aot, einsum, grouped, launch, prenorm  # noqa: E402

ARCHS = aot.ARCHS
_A = aot.array
_I32 = aot.scalar(ct.int32)
OUT = {"bf16": ct.bfloat16, "f32": ct.float32}
# (tag, d dtype, has_c, c_is_d): no c, DeepGEMM's fp32 accumulate (c = d), a separate c.
EPILOGUES = [("bf16", "bf16", False, False), ("f32-c-is-d", "f32", True, True), ("bf16-c", "bf16", True, False)]
#: (H, N, K) of DeepGEMM's per-head tests (H, D, R and H, R, D), and a wide one.
EINSUM_HEADS = [(128, 128, 512), (128, 512, 128), (8, 1024, 4096), (8, 4096, 1024), (64, 7168, 512)]


def _bmk(cfg: heuristics.TileConfig, split: bool, out: str, has_c: bool, c_is_d: bool) -> list:
    consts = einsum.bmk_constants(cfg, split=split, has_c=has_c, c_is_d=c_is_d)
    d = [_A(OUT[out], 2), _A(OUT[out], 2), _A(ct.float32, 3)]  # D, C, W
    return [_A(ct.bfloat16, 3), _A(ct.bfloat16, 3), *d, _I32, *consts]


def _reduce(out: str, has_c: bool, c_is_d: bool) -> list:
    consts = einsum.reduce_constants(has_c=has_c, c_is_d=c_is_d)
    return [_A(ct.float32, 3), _A(OUT[out], 2), _A(OUT[out], 2), _I32, *consts]


def _heads(cfg: heuristics.TileConfig, out: str, has_c: bool, c_is_d: bool) -> list:
    consts = einsum.heads_constants(cfg, has_c=has_c, c_is_d=c_is_d)
    return [_A(ct.bfloat16, 3), _A(ct.bfloat16, 3), _A(OUT[out], 3), _A(OUT[out], 3), *consts]


def _prenorm(n: int) -> list:
    # sqr_sum [splits, M] rows are M * 4 bytes: no alignment promised.
    arrays = [_A(ct.bfloat16, 2), _A(ct.float32, 2), _A(ct.float32, 3), _A(ct.float32, 2, align_bytes=4)]
    return [*arrays, _I32, _I32, _I32, *prenorm.kernel_constants(n)]


def _masked(fp8: bool, cfg: heuristics.TileConfig) -> list:
    """The masked m-grouped kernel (NT weights) writing an fp32 ``d``: einsum ``bhr,hdr->bhd`` with an fp32 output."""
    consts = [int(heuristics.Kind.MASKED), True, cfg.bm, cfg.bn, cfg.bk, cfg.gm]
    tail = [_A(ct.int32, 1, align_bytes=4), _I32, _I32, _I32, _I32]
    if fp8:
        ops = [_A(ct.float8_e4m3fn, 3), _A(ct.float32, 3), _A(ct.float8_e4m3fn, 3), _A(ct.float32, 3, align_bytes=4)]
        return [*ops, _A(ct.float32, 3), *tail, *consts, cfg.fast_acc]
    return [_A(ct.bfloat16, 3), _A(ct.bfloat16, 3), _A(ct.float32, 3), *tail, *consts]


def _variants():
    """(id, kernel, params, mma kind or None) for every kernel variant the einsum and pre-norm ops launch."""
    out = []
    split_cfg = einsum_rules.bmk_config(False)
    for dt in OUT:
        kernel = einsum.get_kernel("bmk", split_cfg)
        out.append((f"bmk-split-{dt}", kernel, _bmk(split_cfg, True, dt, False, False), "bf16"))
    for tag, dt, has_c, c_is_d in EPILOGUES:
        cfg = einsum_rules.bmk_config(has_c)
        kernel = einsum.get_kernel("bmk", cfg)
        out.append((f"bmk-whole-{cfg.name}-{tag}", kernel, _bmk(cfg, False, dt, has_c, c_is_d), "bf16"))
        out.append((f"reduce-{tag}", einsum.get_kernel("reduce"), _reduce(dt, has_c, c_is_d), None))
    for batch in (einsum_rules.SMALL_BATCH, einsum_rules.SMALL_BATCH + 1):
        for tag, dt, has_c, c_is_d in EPILOGUES:
            cfg = einsum_rules.heads_config(batch, has_c)
            kernel = einsum.get_kernel("heads", cfg)
            out.append((f"heads-{cfg.name}-{tag}", kernel, _heads(cfg, dt, has_c, c_is_d), "bf16"))
    for tn in prenorm.TILE_NS:
        out.append((f"prenorm-n{tn}", prenorm.get_kernel(), _prenorm(tn), "tf32"))
    for fp8 in (False, True):
        for cfg in sorted(_masked_f32_configs(fp8), key=lambda c: c.name):
            kernel = grouped.get_kernel("m_fp8" if fp8 else "m_bf16", cfg.num_worker_warps, cfg.occupancy)
            dt = "fp8" if fp8 else "bf16"
            out.append((f"masked-{dt}-{cfg.name}-f32-out", kernel, _masked(fp8, cfg), dt))
    return out


#: (B, H, N, K) of the per-head expressions: DeepGEMM's test shapes and a few others.
HEAD_SHAPES = [(b, h, n, k) for b in (1, 4, 32, 64, 65, 128, 4096, 8192) for h, n, k in EINSUM_HEADS]


def _masked_f32_configs(fp8: bool) -> set:
    """The masked-GEMM configs an einsum with an fp32 output (its ``d``, or the temporary of a ``c``) launches."""
    out = set()
    for b, h, n, k in HEAD_SHAPES:
        hint = einsum.masked_hint(b, torch.float32)
        out.add(
            heuristics.choose(
                heuristics.Problem(
                    "grouped",
                    "fp8" if fp8 else "bf16",
                    h * b,
                    n,
                    k,
                    launch.num_sms(),
                    groups=h,
                    kind=heuristics.Kind.MASKED,
                    expected_m=hint,
                )
            )
        )
    return out


VARIANTS = _variants()


@pytest.fixture(scope="module")
def compiled():
    """SASS summaries of every (variant, arch), compiled in parallel threads (tileiras runs out of process)."""
    jobs = [(vid, kernel, params, arch) for vid, kernel, params, _ in VARIANTS for arch in ARCHS]
    return compile_all(jobs, aot.compile_cubin)


def test_configs_are_gated():
    """The host paths pick configs only from :func:`einsum_rules.bmk_config` / :func:`einsum_rules.heads_config` at the
    batch sizes compiled above, and the pre-norm column tiles compiled above."""
    small, big = (
        einsum_rules.heads_config(einsum_rules.SMALL_BATCH, False),
        einsum_rules.heads_config(einsum_rules.SMALL_BATCH + 1, False),
    )
    for b in (1, 4, 32, 64, 65, 128, 4096, 8192):
        for has_c in (False, True):
            want = (
                small
                if b <= einsum_rules.SMALL_BATCH
                else einsum_rules.heads_config(einsum_rules.SMALL_BATCH + 1, has_c)
            )
            assert einsum_rules.heads_config(b, has_c) == want
    assert small.bm == 64 and big.bm == 128
    assert {prenorm.tile_n(n) for n in range(1, 300)} == set(prenorm.TILE_NS)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid,mma", [(v[0], v[3]) for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_einsum_kernel_sass(compiled, vid, mma, arch):
    s = compiled[(vid, arch)]
    if isinstance(s, Exception):
        raise s
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: register spills to local memory: {s}"
    assert s["tensormap_writes"] == 0, f"{vid} {arch}: TMA descriptors built on the device: {s}"
    if mma is None:  # the reduce kernel: no MMA
        return
    if arch == "sm_90":
        count, name = (s["qgmma"], "QGMMA") if mma == "fp8" else (s["hgmma"], "HGMMA")
    else:
        count, name = (s["utcqmma"], "UTCQMMA") if mma == "fp8" else (s["utchmma"], "UTCHMMA")
    assert count > 0, f"{vid} {arch}: no {name}: {s}"
    assert s["hmma"] == 0, f"{vid} {arch}: legacy mma.sync (HMMA): {s}"
    assert s["utmaldg"] >= 2, f"{vid} {arch}: operands not loaded with TMA: {s}"
    assert s["ldg_u8"] == 0, f"{vid} {arch}: byte-wide LDG.E.U8 loads (TMA lost on FP8 operands): {s}"
