"""The gluon k-grouped BF16 GEMM (the BF16 ws kernel's k-grouped form) on a Hopper GPU.

Each case: fresh random bf16 [K_sum, M] and [K_sum, N] operands read in place (MN-major), groups of uneven K (an
empty group among them), ``d`` poisoned with NaN (or holding the addend), the result compared with ``calc_diff``
against the float64 formula, then a rerun that must be bitwise identical. Every k-grouped design, with and without
the addend (``c`` = ``d``, ``c`` apart), N off the tiles, a persistent grid smaller than the tile count, CUDA-graph
replay with new inputs, the automatic choice against ``backend="gluon"``, and the cases the form refuses.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.registry import Unsupported
from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.ops import api as tg
from tilegemm.testing import calc_diff, poisoned, replay_after

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
gluon = pytest.importorskip("tilegemm.heuristics.gluon")
gluon_grouped = pytest.importorskip("tilegemm.ops.gluon.grouped")

BAR = 1e-6  # fp32 output of bf16 products: DESIGN.md's exact bar
#: (per-group K, M, N): an empty group, K of one 64-deep block, N off the tiles, one group, many small groups
CASES = [([512, 0, 1024, 64], 256, 384), ([192, 320], 384, 200), ([2048], 128, 1024), ([64] * 9, 256, 264)]
DESIGNS = [d for d, *_ in gluon.K_GROUPED_BF16_WS_TILES]


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "0")


def _case(ks: list[int], m: int, n: int, seed: int):
    """bf16 a [K_sum, M], b [K_sum, N], their int32 [G] K mirror, and the float64 ``a_g.T @ b_g`` per group."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(sum(ks), m, device="cuda", generator=gen).bfloat16()
    b = torch.randn(sum(ks), n, device="cuda", generator=gen).bfloat16()
    ref = torch.zeros(len(ks), m, n, dtype=torch.float64, device="cuda")
    start = 0
    for g, k in enumerate(ks):
        ref[g] = a[start : start + k].double().t() @ b[start : start + k].double()
        start += k
    return a, b, torch.tensor(ks, dtype=torch.int32, device="cuda"), ref


def _check(run, d, ref) -> None:
    out = run(d.clone())
    torch.cuda.synchronize()
    assert not out.isnan().any(), "elements left unwritten"
    diff = calc_diff(out, ref)
    assert diff < BAR, f"calc_diff {diff:.2e}"
    again = run(d.clone())
    assert torch.equal(out.view(torch.uint8), again.view(torch.uint8)), "rerun not bitwise identical"


@pytest.mark.parametrize("addend", ["none", "c=d", "c"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{len(c[0])}m{c[1]}n{c[2]}")
def test_gluon_k_grouped_bf16(case, addend):
    ks, m, n = case
    a, b, layout_ks, ref = _case(ks, m, n, seed=sum(ks) + m + n)
    c = torch.randn(len(ks), m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    d0, c_arg = poisoned((len(ks), m, n), torch.float32, "cuda"), None
    if addend == "c=d":
        d0, c_arg = c, "d"
    elif addend == "c":
        c_arg = c
    if addend != "none":
        ref = ref + c.double()

    def run(d):
        op = tg.k_grouped_bf16_gemm_tn_contiguous
        return op(a, b, d, ks, layout_ks, c=d if c_arg == "d" else c_arg, backend="gluon")

    _check(run, d0, ref)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("design", DESIGNS)
def test_every_design_on_a_short_grid(design, accumulate):
    """Three CTAs over every tile of every group, through the plan directly, in each design the rule may pick."""
    ks, m, n = [384, 0, 256, 640], 256, 264
    a, b, layout_ks, ref = _case(ks, m, n, seed=9)
    offsets = torch.tensor([0, 384, 384, 640, 1280], dtype=torch.int32, device="cuda")
    cfg = bw.VARIANTS[design]
    start = (
        torch.randn(len(ks), m, n, device="cuda") if accumulate else poisoned((len(ks), m, n), torch.float32, "cuda")
    )
    if accumulate:
        ref = ref + start.double()

    def run(d):
        plan = bw.bf16_ws_plan(a, b, d, cfg, 3, ks=ks, accumulate=accumulate)
        return plan(a, b, d, k_offsets=offsets)

    _check(run, start, ref)


def test_automatic_choice_matches_gluon_bitwise():
    from tilegemm import config

    ks, m, n = [1024, 2048, 1536, 512], 1024, 2048
    assert gluon.prefers_k_grouped_bf16(len(ks), m, n, ks, config.get_num_sms())
    a, b, layout_ks, ref = _case(ks, m, n, seed=13)
    auto = poisoned((len(ks), m, n), torch.float32, "cuda")
    tg.k_grouped_bf16_gemm_tn_contiguous(a, b, auto, ks, layout_ks)
    forced = poisoned((len(ks), m, n), torch.float32, "cuda")
    tg.k_grouped_bf16_gemm_tn_contiguous(a, b, forced, ks, layout_ks, backend="gluon")
    torch.cuda.synchronize()
    assert torch.equal(auto.view(torch.uint8), forced.view(torch.uint8))
    assert calc_diff(auto, ref) < BAR


def test_cuda_graph_replay_with_new_inputs():
    """Captured once (accumulating into ``d``), replayed after the inputs and ``d`` change in place."""
    ks, m, n = [256, 512], 256, 384
    a, b, layout_ks, _ = _case(ks, m, n, seed=31)
    d = torch.zeros(len(ks), m, n, device="cuda")
    a2, b2, _, ref = _case(ks, m, n, seed=32)

    def change():
        a.copy_(a2)
        b.copy_(b2)
        d.fill_(1.0)

    replay_after(lambda: tg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, layout_ks, c=d, backend="gluon"), change)
    assert calc_diff(d, ref + 1.0) < BAR


@pytest.mark.parametrize(
    "ks, m, n, match",
    [([96, 128], 256, 256, "multiple of 64"), ([128], 200, 256, "multiple of 128")],
    ids=["k-off-64", "m-off-128"],
)
def test_refused_cases_raise_unsupported(ks, m, n, match):
    """A group's K off the 64-deep blocks and M off the 128-row tiles are refused before anything is written."""
    a, b, layout_ks, _ = _case(ks, m, n, seed=3)
    d = poisoned((len(ks), m, n), torch.float32, "cuda")
    with pytest.raises(Unsupported, match=match):
        gluon_grouped.k_grouped_bf16(a, b, d, ks, layout_ks)
    assert d.isnan().all()
