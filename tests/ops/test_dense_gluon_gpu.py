"""gluon dense FP8 GEMMs on a Hopper GPU: every layout x recipe x output dtype over awkward and benchmark shapes.

Each case: fresh random inputs, ``d`` poisoned with NaN, the gluon result (fallback disabled) compared in float64
with ``calc_diff`` against the exact formula on the dequantized inputs, then a rerun that must be bitwise
identical. Also: the epilogue (``c``/``alpha``/``beta``, ``c`` aliasing ``d``), CUDA-graph capture replayed with
new inputs, and the automatic choice (gluon where the chooser's rule claims the shape, the same bits as
``backend="gluon"``).
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend import choice
from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.heuristics import gluon  # noqa: F401  (registers the gluon backend's automatic-choice rule)
from tilegemm.ops import api as tg
from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import assert_rerun_identical, calc_diff, dequant_per_block, dequant_per_token, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

LAYOUTS = ["nt", "nn", "tn", "tt"]
SHAPES = [(1, 8, 16), (129, 136, 256), (300, 200, 1100), (1000, 2112, 7168), (4097, 520, 640), (2048, 7168, 2048)]
RECIPES = [(1, 128, 128), (1, 1, 128)]
BAR = {torch.bfloat16: 1e-5, torch.float32: 1e-6}


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """A fallback to the pytorch backend would make these tests meaningless: make it an error."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _case(layout: str, m: int, n: int, k: int, recipe, seed: int = 0):
    """FP8 operands stored as ``layout`` says (scales in the data's orientation) and the float64 reference."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(n, k, device="cuda", generator=g)
    qa, sa = per_token_cast_to_fp8(a)
    qb, sb = per_token_cast_to_fp8(b) if recipe == (1, 1, 128) else per_block_cast_to_fp8(b)
    ref = (
        dequant_per_token(qa, sa).double()
        @ (dequant_per_token(qb, sb) if recipe == (1, 1, 128) else dequant_per_block(qb, sb)).double().t()
    )
    if layout[0] == "t":
        qa, sa = qa.t().contiguous(), sa.t().contiguous()
    else:
        sa = get_mn_major_tma_aligned_tensor(sa)
    if layout[1] == "n":
        qb, sb = qb.t().contiguous(), sb.t().contiguous()
    return (qa, sa), (qb, sb), ref


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: "x".join(map(str, r)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_gemm_gluon(layout, shape, recipe):
    m, n, k = shape
    a, b, ref = _case(layout, m, n, k, recipe, seed=m + n + k)
    op = getattr(tg, f"fp8_gemm_{layout}")
    for dtype in (torch.bfloat16, torch.float32):
        d = poisoned((m, n), dtype, "cuda")
        op(a, b, d, recipe=recipe, backend="gluon")
        assert calc_diff(d, ref) < BAR[dtype]
        assert_rerun_identical(lambda: op(a, b, d, recipe=recipe, backend="gluon"), d)  # noqa: B023


@pytest.mark.parametrize("alias", [False, True], ids=["c", "c_is_d"])
def test_fp8_gemm_gluon_epilogue(alias):
    m, n, k = 300, 264, 640
    a, b, ref = _case("nt", m, n, k, (1, 128, 128), seed=3)
    c = torch.randn(m, n, device="cuda")
    d = c.clone() if alias else poisoned((m, n), torch.float32, "cuda")
    tg.fp8_gemm_nt(a, b, d, d if alias else c, alpha=0.5, beta=2.0, backend="gluon")
    assert calc_diff(d, 0.5 * ref + 2.0 * c.double()) < BAR[torch.float32]


def test_fp8_gemm_gluon_cuda_graph():
    m, n, k = 512, 1024, 1024
    a, b, _ = _case("nt", m, n, k, (1, 128, 128), seed=1)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    tg.fp8_gemm_nt(a, b, d, backend="gluon")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tg.fp8_gemm_nt(a, b, d, backend="gluon")
    a2, b2, ref2 = _case("nt", m, n, k, (1, 128, 128), seed=2)
    for (dst, _), (src, _) in zip((a, b), (a2, b2)):
        dst.copy_(src)
    a[1].copy_(a2[1])
    b[1].copy_(b2[1])
    graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(d, ref2) < BAR[torch.bfloat16]


def test_automatic_choice_routes_to_gluon():
    m, n, k = 4096, 4096, 4096
    a, b, _ = _case("nt", m, n, k, (1, 128, 128), seed=4)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    derived = {"a": a, "b": b, "d": d, "c": None, "recipe": (1, 128, 128), "alpha": 1.0, "beta": 1.0}  # as the check
    assert choice.automatic("fp8_fp4_gemm_nt", derived) == "gluon"
    auto = tg.fp8_gemm_nt(a, b, d).clone()
    forced = tg.fp8_gemm_nt(a, b, torch.empty_like(d), backend="gluon")
    assert torch.equal(auto, forced)
