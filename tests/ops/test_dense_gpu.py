"""cutile dense GEMMs on the GPU: every layout x dtype x recipe over the benchmark shapes + awkward ones.

Each case: fresh random inputs, ``d`` poisoned with NaN, the cutile result (fallback disabled)
compared in float64 with ``calc_diff`` against the exact formula (and, for FP8, against the
unquantized math), then a rerun that must be bitwise identical. Also: the epilogue
(``c``/``alpha``/``beta``, ``c`` aliasing ``d``), strided views, ``K == 0``, and CUDA-graph
capture of a call replayed with new inputs.
"""

from __future__ import annotations

import os

import pytest
import torch

from tilegemm.ops import api as tg
from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import assert_rerun_identical, calc_diff, poisoned

pytestmark = [
    pytest.mark.gpu,
]

LAYOUTS = ["nt", "nn", "tn", "tt"]
BENCH_NK = [(2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
BENCH_SHAPES = [(m, n, k) for m in (1, 64, 128, 4096) for n, k in BENCH_NK] + [(8192, 8192, 8192)]
AWKWARD_SHAPES = [(1, 1, 1), (5, 3, 17), (333, 777, 1000), (130, 250, 64), (1, 129, 200), (257, 136, 4104)]
# TILEGEMM_GPU_TEST_SHAPES=quick: a subset that still covers split-K (small M), a partial last wave and
# whole-wave shapes, for short device sessions.
QUICK_SHAPES = [(1, 2112, 7168), (64, 576, 7168), (128, 7168, 16384), (4096, 2112, 7168), (4096, 576, 7168)]
_QUICK = os.environ.get("TILEGEMM_GPU_TEST_SHAPES", "full") == "quick"
SHAPES = AWKWARD_SHAPES + (QUICK_SHAPES if _QUICK else BENCH_SHAPES)
RECIPES = [(1, 128, 128), (1, 1, 128)]
BAR_BF16 = 1e-5
BAR_FP8_EXACT = {torch.bfloat16: 1e-5, torch.float32: 1e-6}
BAR_FP8_UNQUANT = 1e-3


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """A fallback to the pytorch backend would make these tests meaningless: make it an error."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _sid(shape):
    return "x".join(map(str, shape))


def _store(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    """A logical [R, K] operand stored as the layout says: [R, K], or a contiguous [K, R]."""
    return x.t().contiguous() if transposed else x.contiguous()


def _bf16_case(layout, m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a_log = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b_log = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    return a_log, b_log, _store(a_log, layout[0] == "t"), _store(b_log, layout[1] == "n")


def _fp8_case(layout, recipe, m, n, k, seed=0):
    """Quantized operands in the layout's shapes, plus the float64 dequantized and unquantized logical matrices."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    xa = torch.randn(m, k, device="cuda", generator=g)
    xb = torch.randn(n, k, device="cuda", generator=g)
    qa, sa = per_token_cast_to_fp8(xa)
    if recipe == (1, 128, 128):
        qb, sb = per_block_cast_to_fp8(xb)
        deq_b = qb.double() * sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    else:
        qb, sb = per_token_cast_to_fp8(xb)
        deq_b = qb.double() * sb.double().repeat_interleave(128, 1)[:, :k]
    deq_a = qa.double() * sa.double().repeat_interleave(128, 1)[:, :k]
    ta, tb = layout[0] == "t", layout[1] == "n"
    sa_mn = get_mn_major_tma_aligned_tensor(sa)
    # a transposed operand's scales are transposed too (DeepGEMM's orientation)
    a = (_store(qa, ta), sa_mn.t() if ta else sa_mn)
    b = (_store(qb, tb), sb.t() if tb else sb)
    return a, b, deq_a, deq_b, xa.double(), xb.double()


@pytest.mark.parametrize("shape", SHAPES, ids=_sid)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16(layout, shape):
    m, n, k = shape
    a_log, b_log, a, b = _bf16_case(layout, m, n, k)
    d = poisoned((m, n), torch.float32, "cuda")
    op = getattr(tg, f"bf16_gemm_{layout}")
    assert op(a, b, d, backend="cutile") is d
    ref = a_log.double() @ b_log.double().T
    diff = calc_diff(d, ref)
    assert diff < BAR_BF16, f"calc_diff {diff:.3g}"
    assert_rerun_identical(lambda: op(a, b, d, backend="cutile"), d)


@pytest.mark.parametrize("shape", SHAPES, ids=_sid)
@pytest.mark.parametrize("recipe", RECIPES, ids=["128x128", "1x128"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8(layout, recipe, shape):
    m, n, k = shape
    a, b, deq_a, deq_b, xa, xb = _fp8_case(layout, recipe, m, n, k)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    op = getattr(tg, f"fp8_gemm_{layout}")
    assert op(a, b, d, recipe=recipe, backend="cutile") is d
    exact = calc_diff(d, deq_a @ deq_b.T)
    assert exact < BAR_FP8_EXACT[torch.bfloat16], f"vs dequantized formula: {exact:.3g}"
    unquant = calc_diff(d, xa @ xb.T)
    assert unquant < BAR_FP8_UNQUANT, f"vs unquantized math: {unquant:.3g}"
    assert_rerun_identical(lambda: op(a, b, d, recipe=recipe, backend="cutile"), d)


OUT_SHAPES = [(333, 777, 1000), (4096, 4096, 7168), (64, 2112, 7168)]


@pytest.mark.parametrize("shape", OUT_SHAPES, ids=_sid)
@pytest.mark.parametrize("recipe", RECIPES, ids=["128x128", "1x128"])
def test_fp8_fp32_out(recipe, shape):
    m, n, k = shape
    a, b, deq_a, deq_b, _, _ = _fp8_case("nt", recipe, m, n, k, seed=3)
    d = poisoned((m, n), torch.float32, "cuda")
    tg.fp8_gemm_nt(a, b, d, backend="cutile")
    exact = calc_diff(d, deq_a @ deq_b.T)
    assert exact < BAR_FP8_EXACT[torch.float32], f"vs dequantized formula: {exact:.3g}"


@pytest.mark.parametrize("shape", OUT_SHAPES, ids=_sid)
def test_bf16_bf16_out(shape):
    m, n, k = shape
    a_log, b_log, a, b = _bf16_case("nt", m, n, k, seed=4)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    tg.bf16_gemm_nt(a, b, d, backend="cutile")
    assert calc_diff(d, a_log.double() @ b_log.double().T) < BAR_BF16


EPILOGUES = ["c_bf16", "c_fp32", "c_is_d", "beta0_c_nan", "alpha_only"]


def _epilogue(mode, m, n, out_dtype):
    """(c, alpha, beta, d, float64 addend) for an epilogue mode."""
    if mode in ("c_bf16", "c_fp32"):
        c = torch.randn(m, n, device="cuda").to(torch.bfloat16 if mode == "c_bf16" else torch.float32)
        return c, 0.75, -1.5, poisoned((m, n), out_dtype, "cuda"), -1.5 * c.double()
    if mode == "c_is_d":
        d = torch.randn(m, n, device="cuda").to(out_dtype)
        return d, 1.25, 0.5, d, 0.5 * d.double()
    if mode == "beta0_c_nan":
        c = poisoned((m, n), torch.float32, "cuda")
        return c, 2.0, 0.0, poisoned((m, n), out_dtype, "cuda"), torch.zeros(m, n, dtype=torch.float64, device="cuda")
    return None, -0.5, 1.0, poisoned((m, n), out_dtype, "cuda"), torch.zeros(m, n, dtype=torch.float64, device="cuda")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mode", EPILOGUES)
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_epilogue(kind, mode, out_dtype):
    _check_epilogue(kind, mode, out_dtype, (200, 320, 384), seed=5)


def _check_epilogue(kind: str, mode: str, out_dtype: torch.dtype, shape: tuple[int, int, int], seed: int) -> None:
    """The ``nt`` GEMM of ``kind`` (bf16 or fp8) on cutile with the epilogue ``mode`` (``c``, ``alpha``, ``beta``)
    into a NaN-poisoned ``d``, against the float64 formula: every element written, within the kind's bar."""
    m, n, k = shape
    c, alpha, beta, d, addend = _epilogue(mode, m, n, out_dtype)
    if kind == "bf16":
        a_log, b_log, a, b = _bf16_case("nt", m, n, k, seed=seed)
        ref = alpha * (a_log.double() @ b_log.double().T) + addend
        tg.bf16_gemm_nt(a, b, d, c=c, alpha=alpha, beta=beta, backend="cutile")
        bar = BAR_BF16
    else:
        a, b, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=seed)
        ref = alpha * (deq_a @ deq_b.T) + addend
        tg.fp8_gemm_nt(a, b, d, c=c, alpha=alpha, beta=beta, backend="cutile")
        bar = BAR_FP8_EXACT[out_dtype]
    assert not torch.isnan(d).any(), shape
    assert calc_diff(d, ref) < bar, shape


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_k_zero(kind):
    m, n = 64, 96
    c = torch.randn(m, n, device="cuda")
    d = poisoned((m, n), torch.float32, "cuda")
    if kind == "bf16":
        a = torch.empty(m, 0, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(n, 0, device="cuda", dtype=torch.bfloat16)
        tg.bf16_gemm_nt(a, b, d, c=c, beta=2.0, backend="cutile")
    else:
        a = (torch.empty(m, 0, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(m, 0, device="cuda"))
        b = (torch.empty(n, 0, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, 0, device="cuda"))
        tg.fp8_gemm_nt(a, b, d, c=c, beta=2.0, backend="cutile")
    assert torch.equal(d, 2.0 * c)


def test_strided_views():
    """Operands given as non-contiguous views (a column slice, a transposed view) are handled."""
    m, n, k = 256, 384, 512
    big_a = torch.randn(m, k + 64, device="cuda").bfloat16()
    a = big_a[:, 32 : 32 + k]  # row pitch k+64, offset 64 bytes
    b = torch.randn(k, n, device="cuda").bfloat16().t()  # [N, K] view of a [K, N] tensor
    d = poisoned((m, n), torch.float32, "cuda")
    tg.bf16_gemm_nt(a, b, d, backend="cutile")
    assert calc_diff(d, a.double() @ b.double().T) < BAR_BF16
    fa, fb, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 1, 128), m, n, k, seed=7)
    fa = (fa[0].t().contiguous().t(), fa[1].contiguous())  # column-major fp8 A, row-major scales
    d2 = poisoned((m, n), torch.bfloat16, "cuda")
    tg.fp8_gemm_nt(fa, fb, d2, backend="cutile")
    assert calc_diff(d2, deq_a @ deq_b.T) < BAR_FP8_EXACT[torch.bfloat16]


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_cuda_graph_capture(kind):
    """Capture one call after warm-up; replay with new inputs copied into the captured buffers."""
    m, n, k = 512, 1024, 1024
    if kind == "bf16":
        a_log, b_log, a, b = _bf16_case("nt", m, n, k, seed=8)
        fn = lambda: tg.bf16_gemm_nt(a, b, d, backend="cutile")  # noqa: E731
    else:
        a, b, *_ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=8)
        fn = lambda: tg.fp8_gemm_nt(a, b, d, backend="cutile")  # noqa: E731
    d = poisoned((m, n), torch.float32, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up: JIT compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for seed in (11, 12):
        if kind == "bf16":
            na_log, nb_log, na, nb = _bf16_case("nt", m, n, k, seed=seed)
            a.copy_(na)
            b.copy_(nb)
            ref = na_log.double() @ nb_log.double().T
            bar = BAR_BF16
        else:
            na, nb, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=seed)
            a[0].copy_(na[0])
            a[1].copy_(na[1])
            b[0].copy_(nb[0])
            b[1].copy_(nb[1])
            ref = deq_a @ deq_b.T
            bar = BAR_FP8_EXACT[torch.float32]
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert calc_diff(d, ref) < bar


# split-K (K >= heuristics.SPLIT_MIN_K), small M, a partial last wave
CONFIG_SHAPES = [(333, 777, 4100), (64, 2112, 7168), (4096, 576, 7168)]


def _all_configs():
    from tilegemm.heuristics import cutile as heuristics

    return list(heuristics.all_dense_configs())


# (M, N, K) the tile kernel splits along K on 132 SMs, BF16 and FP8 alike: 8, 3 and 2 splits (the last one off
# every tile and block size).
SPLIT_SHAPES = [(512, 512, 7168), (384, 1536, 7168), (777, 1000, 4200)]


@pytest.mark.parametrize("with_c", [False, True], ids=["no_c", "c"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=_sid)
def test_split_k_tile_kernel(shape, dtype, with_c):
    """Split-K on the tile kernel (partials in a workspace, summed in split order by the reduce kernel, which applies
    alpha, beta * c): float64 agreement, every element written, bitwise reruns."""
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.ops.cutile import launch

    m, n, k = shape
    problem = heuristics.Problem("dense", dtype, m, n, k, launch.num_sms())
    cfg = heuristics.choose(problem)
    if launch.num_sms() == 132:
        assert isinstance(cfg, heuristics.DenseConfig) and heuristics.split_plan(problem, cfg).splits > 1, shape
    g = torch.Generator(device="cuda").manual_seed(13)
    c = torch.randn(m, n, device="cuda", generator=g) if with_c else None
    alpha, beta = 0.5, (2.0 if with_c else 0.0)
    if dtype == "bf16":
        a_log, b_log, a, b = _bf16_case("nt", m, n, k, seed=13)
        want = alpha * (a_log.double() @ b_log.double().T)
        d = poisoned((m, n), torch.float32, "cuda")
        call = lambda: tg.bf16_gemm_nt(a, b, d, c=c, alpha=alpha, beta=beta)  # noqa: E731
        bar = BAR_BF16
    else:
        a, b, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=13)
        want = alpha * (deq_a @ deq_b.T)
        d = poisoned((m, n), torch.float32, "cuda")
        call = lambda: tg.fp8_gemm_nt(a, b, d, c=c, alpha=alpha, beta=beta)  # noqa: E731
        bar = BAR_FP8_EXACT[torch.float32]
    if with_c:
        want = want + beta * c.double()
    call()
    assert calc_diff(d, want) < bar
    assert_rerun_identical(call, d)


@pytest.mark.parametrize("shape", CONFIG_SHAPES, ids=_sid)
@pytest.mark.parametrize("cfg", _all_configs(), ids=lambda c: c.name)
def test_every_config(cfg, shape):
    """Every tile config the heuristics may pick, forced, on a small, a split-K and a partial-last-wave shape."""
    from tilegemm.ops.cutile import gemm

    m, n, k = shape
    if cfg.dtype == "bf16":
        a_log, b_log, a, b = _bf16_case("nt", m, n, k, seed=9)
        d = poisoned((m, n), torch.float32, "cuda")
        gemm.bf16_gemm(a, b, d, None, alpha=1.0, beta=1.0, config=cfg)
        assert calc_diff(d, a_log.double() @ b_log.double().T) < BAR_BF16
        return
    for recipe in RECIPES:
        if recipe == (1, 128, 128) and cfg.bn // cfg.nh != 128:
            continue
        a, b, deq_a, deq_b, _, _ = _fp8_case("nt", recipe, m, n, k, seed=9)
        d = poisoned((m, n), torch.bfloat16, "cuda")
        gemm.fp8_gemm(a, b, d, None, recipe=recipe, alpha=1.0, beta=1.0, config=cfg)
        assert calc_diff(d, deq_a @ deq_b.T) < BAR_FP8_EXACT[torch.bfloat16], recipe


# ------------------------------------------------------------------ decode-size (swap-AB) kernels

# M = 1..255 (awkward), N not a multiple of 64/128, K not a multiple of 128 (520), split-K and whole-tile plans;
# (5, 7000, 2100): an unsplit BF16 plan compiled for 2 CTAs per SM; (24, 7000, 4200): unsplit 32-row tiles (FP8
# from K = 4096) at 3 per SM; (16, 1024, 2048), (128, 576, 7168): FP8 scale tiles inside the scales (unchecked loads);
# (3, 2000, 4096): 16 BF16 / 8 FP8 K splits.
DECODE_SHAPES = [
    (1, 4096, 7168),
    (16, 1024, 2048),
    (3, 2112, 7168),
    (5, 7000, 2100),
    (17, 7168, 2048),
    (24, 7000, 4200),
    (255, 1000, 1536),
    (64, 200, 520),
    (128, 576, 7168),
    (3, 2000, 4096),
]


def _decode_configs():
    from tilegemm.heuristics import cutile as heuristics

    return list(heuristics.DECODE_CONFIGS)


@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=_sid)
@pytest.mark.parametrize("cfg", _decode_configs(), ids=lambda c: c.name)
def test_decode_bf16(cfg, shape):
    """Every decode variant, forced: awkward M, N not a multiple of the tile, K not a multiple of 128."""
    from tilegemm.ops.cutile import gemm

    m, n, k = shape
    a_log, b_log, a, b = _bf16_case("nt", m, n, k, seed=20)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    gemm.bf16_gemm(a, b, d, None, alpha=1.0, beta=1.0, config=cfg)
    diff = calc_diff(d, a_log.double() @ b_log.double().T)
    assert diff < BAR_BF16, f"calc_diff {diff:.3g}"
    assert_rerun_identical(lambda: gemm.bf16_gemm(a, b, d, None, alpha=1.0, beta=1.0, config=cfg), d)


@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=_sid)
@pytest.mark.parametrize("recipe", RECIPES, ids=["128x128", "1x128"])
@pytest.mark.parametrize("cfg", _decode_configs(), ids=lambda c: c.name)
def test_decode_fp8(cfg, recipe, shape):
    from tilegemm.ops.cutile import gemm

    m, n, k = shape
    a, b, deq_a, deq_b, _, _ = _fp8_case("nt", recipe, m, n, k, seed=21)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    gemm.fp8_gemm(a, b, d, None, recipe=recipe, alpha=1.0, beta=1.0, config=cfg)
    exact = calc_diff(d, deq_a @ deq_b.T)
    assert exact < BAR_FP8_EXACT[torch.bfloat16], f"vs dequantized formula: {exact:.3g}"
    assert_rerun_identical(lambda: gemm.fp8_gemm(a, b, d, None, recipe=recipe, alpha=1.0, beta=1.0, config=cfg), d)


# ------------------------------------------------------------------ decode-size narrow-tile kernels

# M from 17 to 255 (not a multiple of 64), N not a multiple of 16/32/128, K not a multiple of 128; (64, 200, 520) and
# (128, 1024, 1100): FP8 scale tiles inside the scales (unchecked loads; the second with 1x128 weight scales too).
NARROW_SHAPES = [
    (17, 1000, 1536),
    (128, 1024, 1100),
    (33, 2112, 7168),
    (64, 200, 520),
    (100, 1000, 1536),
    (255, 577, 2100),
    (200, 7000, 520),
]


def _narrow_configs(dtype):
    from tilegemm.heuristics import cutile as heuristics

    return list(heuristics.NARROW_CONFIGS[dtype])


@pytest.mark.parametrize("shape", NARROW_SHAPES, ids=_sid)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cfg", _narrow_configs("bf16"), ids=lambda c: c.name)
def test_narrow_bf16(cfg, layout, shape):
    """Every narrow BF16 config, forced, every operand layout (MN-major operands read in place), an fp32 d."""
    from tilegemm.ops.cutile import gemm

    m, n, k = shape
    a_log, b_log, a, b = _bf16_case(layout, m, n, k, seed=28)
    d = poisoned((m, n), torch.float32 if layout == "tt" else torch.bfloat16, "cuda")
    la = a if layout[0] == "n" else a.t()  # the logical nt form the checks derive: views of the stored operands
    lb = b if layout[1] == "t" else b.t()
    gemm.bf16_gemm(la, lb, d, None, alpha=0.5, beta=1.0, config=cfg)
    diff = calc_diff(d, 0.5 * (a_log.double() @ b_log.double().T))
    assert diff < BAR_BF16, f"calc_diff {diff:.3g}"
    assert_rerun_identical(lambda: gemm.bf16_gemm(la, lb, d, None, alpha=0.5, beta=1.0, config=cfg), d)


@pytest.mark.parametrize("shape", NARROW_SHAPES, ids=_sid)
@pytest.mark.parametrize("recipe", RECIPES, ids=["128x128", "1x128"])
@pytest.mark.parametrize("cfg", _narrow_configs("fp8"), ids=lambda c: c.name)
def test_narrow_fp8(cfg, recipe, shape):
    """Every narrow FP8 config, forced, both weight-scale recipes; an fp32 d on the last shape."""
    from tilegemm.ops.cutile import gemm

    m, n, k = shape
    a, b, deq_a, deq_b, _, _ = _fp8_case("nt", recipe, m, n, k, seed=29)
    out = torch.float32 if shape == NARROW_SHAPES[-1] else torch.bfloat16
    d = poisoned((m, n), out, "cuda")
    gemm.fp8_gemm(a, b, d, None, recipe=recipe, alpha=1.0, beta=1.0, config=cfg)
    exact = calc_diff(d, deq_a @ deq_b.T)
    assert exact < BAR_FP8_EXACT[out], f"vs dequantized formula: {exact:.3g}"
    assert_rerun_identical(lambda: gemm.fp8_gemm(a, b, d, None, recipe=recipe, alpha=1.0, beta=1.0, config=cfg), d)


def test_narrow_rejects_c():
    """A forced narrow config with a ``c`` (no epilogue for it) is refused, not silently wrong."""
    from tilegemm.backend.registry import Unsupported
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.ops.cutile import gemm

    _, _, a, b = _bf16_case("nt", 64, 256, 256, seed=30)
    d = torch.zeros(64, 256, device="cuda", dtype=torch.float32)
    with pytest.raises(Unsupported, match="no c epilogue"):
        gemm.bf16_gemm(a, b, d, d.clone(), alpha=1.0, beta=1.0, config=heuristics.NARROW_BF16_W32)


# (shape, what decode_plan picks for it on 132 SMs): the deep load pipeline and the long-K split, K ragged.
DECODE_FP8_PLANS = [((20, 6400, 2100), "deep"), ((5, 6400, 16400), "long_k_split"), ((16, 7168, 16384), "long_k_split")]


@pytest.mark.parametrize("shape,kind", DECODE_FP8_PLANS, ids=lambda v: _sid(v) if isinstance(v, tuple) else v)
def test_decode_fp8_default_plans(shape, kind):
    """The public default on the FP8 plans with a load latency hint (unsplit 64-row tiles, K >= 2048) and with a
    long-K split of 16-row tiles: float64 agreement and bitwise reruns (``compute-sanitizer memcheck`` reads these
    split plans wrong but reports no error; natively, under racecheck and synccheck they are right:
    benchmarks/results/sanitize/README.md)."""
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.ops.cutile import launch

    m, n, k = shape
    plan = heuristics.decode_plan(
        heuristics.Problem("dense", "fp8", m, n, k, launch.num_sms()), heuristics.decode_config()
    )
    if launch.num_sms() == 132:
        deep = plan.latency == heuristics.DECODE_DEEP_LATENCY and plan.splits == 1
        assert deep if kind == "deep" else (plan.bm == 16 and plan.splits > 1), plan.summary
    a, b, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=22)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    tg.fp8_gemm_nt(a, b, d, backend="cutile")
    exact = calc_diff(d, deq_a @ deq_b.T)
    assert exact < BAR_FP8_EXACT[torch.bfloat16], f"vs dequantized formula: {exact:.3g}"
    assert_rerun_identical(lambda: tg.fp8_gemm_nt(a, b, d, backend="cutile"), d)


@pytest.mark.parametrize("scale_layout", ["mn_major", "row_major"])
def test_decode_fp8_scale_layouts(scale_layout):
    """Activation scales as DeepGEMM's MN-major TMA-aligned tensor or plain row-major, read in place."""
    m, n, k = 5, 384, 1024
    a, b, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 1, 128), m, n, k, seed=22)
    if scale_layout == "row_major":
        a = (a[0], a[1].contiguous())
        b = (b[0], get_mn_major_tma_aligned_tensor(b[1]))
    d = poisoned((m, n), torch.float32, "cuda")
    tg.fp8_gemm_nt(a, b, d, backend="cutile")
    assert calc_diff(d, deq_a @ deq_b.T) < BAR_FP8_EXACT[torch.float32]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mode", EPILOGUES)
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_decode_epilogue(kind, mode, out_dtype):
    """c / alpha / beta through the decode kernel (split-K and whole-tile shapes)."""
    for shape in ((7, 320, 4096), (200, 4096, 256)):
        _check_epilogue(kind, mode, out_dtype, shape, seed=23)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_layouts(layout):
    """Every BF16 and FP8 layout at decode size (through the one logical form)."""
    m, n, k = 9, 1536, 2048
    a_log, b_log, a, b = _bf16_case(layout, m, n, k, seed=24)
    d = poisoned((m, n), torch.float32, "cuda")
    getattr(tg, f"bf16_gemm_{layout}")(a, b, d, backend="cutile")
    assert calc_diff(d, a_log.double() @ b_log.double().T) < BAR_BF16
    fa, fb, deq_a, deq_b, _, _ = _fp8_case(layout, (1, 128, 128), m, n, k, seed=24)
    d2 = poisoned((m, n), torch.bfloat16, "cuda")
    getattr(tg, f"fp8_gemm_{layout}")(fa, fb, d2, backend="cutile")
    assert calc_diff(d2, deq_a @ deq_b.T) < BAR_FP8_EXACT[torch.bfloat16]


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_decode_cuda_graph(kind):
    """Capture several split-K decode calls in one graph; replays with new inputs match, and are bitwise stable.

    The in-kernel split-K reduction restores its tile counters, so every replay starts clean.
    """
    m, n, k = 4, 4096, 7168
    if kind == "bf16":
        _, _, a, b = _bf16_case("nt", m, n, k, seed=25)
        fn = lambda: tg.bf16_gemm_nt(a, b, d, backend="cutile")  # noqa: E731
    else:
        a, b, *_ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=25)
        fn = lambda: tg.fp8_gemm_nt(a, b, d, backend="cutile")  # noqa: E731
    d = poisoned((m, n), torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            fn()
    for seed in (26, 27):
        if kind == "bf16":
            na_log, nb_log, na, nb = _bf16_case("nt", m, n, k, seed=seed)
            a.copy_(na)
            b.copy_(nb)
            ref = na_log.double() @ nb_log.double().T
            bar = BAR_BF16
        else:
            na, nb, deq_a, deq_b, _, _ = _fp8_case("nt", (1, 128, 128), m, n, k, seed=seed)
            for dst, src in ((a[0], na[0]), (a[1], na[1]), (b[0], nb[0]), (b[1], nb[1])):
                dst.copy_(src)
            ref = deq_a @ deq_b.T
            bar = BAR_FP8_EXACT[torch.bfloat16]
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert calc_diff(d, ref) < bar
        first = d.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(first.view(torch.uint16), d.view(torch.uint16)), "replay is not bitwise identical"
    fn()  # eager after the graph: counters were left at zero
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < bar


def test_decode_streams_and_plan_cache():
    """The same shape on two streams (separate workspaces) and new tensors of a cached plan."""
    m, n, k = 2, 2048, 4096
    outs = []
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    cases = [_bf16_case("nt", m, n, k, seed=30 + i) for i in range(2)]
    for st, (a_log, b_log, a, b) in zip(streams, cases):
        d = poisoned((m, n), torch.float32, "cuda")
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            tg.bf16_gemm_nt(a, b, d, backend="cutile")
        outs.append((d, a_log.double() @ b_log.double().T))
    torch.cuda.synchronize()
    for d, ref in outs:
        assert calc_diff(d, ref) < BAR_BF16


@pytest.mark.parametrize("shape", [(8, 2112, 7168), (333, 777, 1000)], ids=_sid)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_hot_lane_fresh_inputs(kind, layout, shape):
    """Repeated calls of one signature (the hot lane replays them) on fresh tensors each time, with
    and without an addend, ``c`` being ``d`` on the first call and a separate tensor on the next ones."""
    from tilegemm.backend import hot_lane

    m, n, k = shape
    for seed in range(3):
        if kind == "bf16":
            a_log, b_log, a, b = _bf16_case(layout, m, n, k, seed=40 + seed)
            exact = a_log.double() @ b_log.double().T
            op, bar = getattr(tg, f"bf16_gemm_{layout}"), BAR_BF16
        else:
            a, b, deq_a, deq_b, _, _ = _fp8_case(layout, (1, 128, 128), m, n, k, seed=40 + seed)
            exact = deq_a @ deq_b.T
            op, bar = getattr(tg, f"fp8_gemm_{layout}"), BAR_FP8_EXACT[torch.float32]
        d = poisoned((m, n), torch.float32, "cuda")
        assert op(a, b, d) is d
        assert calc_diff(d, exact) < bar
        c = d.clone() if seed else d  # c is d first, then a separate tensor with the same metadata
        addend = 0.5 * c.double()
        if seed:
            d = poisoned((m, n), torch.float32, "cuda")
        op(a, b, d, c, alpha=1.0, beta=0.5)
        assert calc_diff(d, exact + addend) < bar
    assert ("cutile", op.op_name) in {(backend, key[0]) for backend, key in hot_lane._HOT}
