"""The gluon k-grouped FP8 GEMM (the warp-specialized kernel's ``K_GROUPED`` form) on a Hopper GPU.

Each case: fresh random inputs quantized 1x128 along K on both sides (DeepGEMM's k-grouped recipe), groups of
uneven K (an empty group among them), ``d`` poisoned with NaN (or holding the addend), the result compared with
``calc_diff`` against the float64 formula on the dequantized inputs, then a rerun that must be bitwise identical.
Both ops (``tn`` and DeepGEMM's ``nt`` layout, whose blocks the kernel reads in place), with and without the addend
(``c`` = ``d``, ``c`` apart), N off the tiles, a persistent grid smaller than the tile count, CUDA-graph replay with new
inputs, and the public op's automatic choice against ``backend="gluon"``; the ``nt`` op read in place bitwise the
``tn`` op on the same values (empty groups first, amid and last; CTAs whose walk crosses groups), and on a base off
16 bytes (gathered).
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.ops import api as tg
from tilegemm.quant import per_token_cast_to_fp8
from tilegemm.testing import calc_diff, poisoned, replay_after

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

ws = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")

BAR = 1e-6  # fp32 output: DESIGN.md's exact bar against the formula on the dequantized values
#: (per-group K, M, N): an empty group, N off the tiles, one group
CASES = [([512, 0, 1024, 128], 256, 384), ([256, 384], 384, 200), ([2048], 128, 1024), ([128] * 9, 256, 256)]


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "0")


def _case(ks: list[int], m: int, n: int, seed: int):
    """The ``tn`` operands (fp8 [K_sum, M] with scales [K_sum/128, M], and the same for N) and the float64 formula."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k_sum = sum(ks)
    xa = torch.randn(m, k_sum, device="cuda", generator=gen)
    xb = torch.randn(n, k_sum, device="cuda", generator=gen)
    qa, sa = per_token_cast_to_fp8(xa)  # 1x128 along K: [M, K_sum], [M, K_sum/128]
    qb, sb = per_token_cast_to_fp8(xb)
    a64 = qa.double() * sa.double().repeat_interleave(128, 1)[:, :k_sum]
    b64 = qb.double() * sb.double().repeat_interleave(128, 1)[:, :k_sum]
    ref = torch.zeros(len(ks), m, n, dtype=torch.float64, device="cuda")
    start = 0
    for g, k in enumerate(ks):
        ref[g] = a64[:, start : start + k] @ b64[:, start : start + k].T
        start += k
    tn = ((qa.t().contiguous(), sa.t().contiguous()), (qb.t().contiguous(), sb.t().contiguous()))
    return tn, (qa, sa, qb, sb), ref


def _nt(raw, ks: list[int], m: int, n: int):
    """DeepGEMM's ``nt`` layout of the same values: each group's K-major [M, K_g] / [N, K_g] block back to back."""
    qa, sa, qb, sb = raw
    bounds = [sum(ks[:g]) for g in range(len(ks) + 1)]
    a = torch.cat([qa[:, bounds[g] : bounds[g + 1]].contiguous().flatten() for g in range(len(ks))])
    b = torch.cat([qb[:, bounds[g] : bounds[g + 1]].contiguous().flatten() for g in range(len(ks))])
    return (a, sa), (b, sb)


def _check(run, d, ref) -> None:
    out = run(d.clone())
    torch.cuda.synchronize()
    assert not out.isnan().any(), "elements left unwritten"
    diff = calc_diff(out, ref)
    assert diff < BAR, f"calc_diff {diff:.2e}"
    again = run(d.clone())
    assert torch.equal(out.view(torch.uint8), again.view(torch.uint8)), "rerun not bitwise identical"


@pytest.mark.parametrize("addend", ["none", "c=d", "c"])
@pytest.mark.parametrize("layout", ["tn", "nt"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{len(c[0])}m{c[1]}n{c[2]}")
def test_gluon_k_grouped(case, layout, addend):
    ks, m, n = case
    tn, raw, ref = _case(ks, m, n, seed=sum(ks) + m + n)
    a, b = tn if layout == "tn" else _nt(raw, ks, m, n)
    op = getattr(tg, f"k_grouped_fp8_gemm_{layout}_contiguous")
    layout_ks = torch.tensor(ks, dtype=torch.int32, device="cuda")
    c = torch.randn(len(ks), m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    if addend == "none":
        d0, c_arg = poisoned((len(ks), m, n), torch.float32, "cuda"), None
    elif addend == "c=d":
        d0, c_arg = c, "d"
        ref = ref + c.double()
    else:
        d0, c_arg = poisoned((len(ks), m, n), torch.float32, "cuda"), c
        ref = ref + c.double()

    def run(d):
        return op(a, b, d, ks, layout_ks, c=d if c_arg == "d" else c_arg, backend="gluon")

    _check(run, d0, ref)


def test_ws_k_grouped_persistent_walk():
    """Three CTAs over every tile of every group, through the plan directly (an empty group among them)."""
    ks, m, n = [384, 0, 256, 640], 256, 264
    (a, b), _, ref = _case(ks, m, n, seed=9)
    a_k = (a[0].t().contiguous(), a[1].t())
    b_k = (b[0].t().contiguous(), b[1].t())
    offsets = torch.tensor([0, 384, 384, 640, 1280], dtype=torch.int32, device="cuda")
    cfg = ws.VARIANTS["a_128x128_p"]

    def run(d):
        return ws.ws_plan(a_k, b_k, d, cfg, 3, k_offsets=offsets)(a_k, b_k, d, k_offsets=offsets)

    _check(run, poisoned((len(ks), m, n), torch.float32, "cuda"), ref)


def test_automatic_choice_matches_gluon_bitwise():
    from tilegemm import config
    from tilegemm.heuristics.gluon import prefers_k_grouped_fp8

    ks, m, n = [1024, 2048, 1536, 512], 1024, 2048
    assert prefers_k_grouped_fp8(len(ks), m, n, sum(ks), config.get_num_sms())
    (a, b), _, ref = _case(ks, m, n, seed=13)
    layout_ks = torch.tensor(ks, dtype=torch.int32, device="cuda")
    auto = poisoned((len(ks), m, n), torch.float32, "cuda")
    tg.k_grouped_fp8_gemm_tn_contiguous(a, b, auto, ks, layout_ks)
    forced = poisoned((len(ks), m, n), torch.float32, "cuda")
    tg.k_grouped_fp8_gemm_tn_contiguous(a, b, forced, ks, layout_ks, backend="gluon")
    torch.cuda.synchronize()
    assert torch.equal(auto.view(torch.uint8), forced.view(torch.uint8))
    assert calc_diff(auto, ref) < BAR


@pytest.mark.parametrize("layout, ks", [("tn", [256, 512]), ("nt", [256, 0, 512])])
def test_cuda_graph_replay_with_new_inputs(layout, ks):
    """Captured once (accumulating into ``d``), replayed after the inputs and ``d`` change in place; ``nt``: the
    blocks read in place, their descriptors' scratch from the graph's pool."""
    m, n = 256, 384
    tn, raw, _ = _case(ks, m, n, seed=31)
    tn2, raw2, ref = _case(ks, m, n, seed=32)
    (a, b), (a2, b2) = (_nt(raw, ks, m, n), _nt(raw2, ks, m, n)) if layout == "nt" else (tn, tn2)
    op = getattr(tg, f"k_grouped_fp8_gemm_{layout}_contiguous")
    layout_ks = torch.tensor(ks, dtype=torch.int32, device="cuda")
    d = torch.zeros(len(ks), m, n, device="cuda")

    def change():
        for live, new in zip((*a, *b), (*a2, *b2)):
            live.copy_(new)
        d.fill_(1.0)

    replay_after(lambda: op(a, b, d, ks, layout_ks, c=d, backend="gluon"), change)
    assert calc_diff(d, ref + 1.0) < BAR


@pytest.mark.parametrize("ctas", [3, None], ids=["3-ctas", "all-sms"])
def test_nt_in_place_equals_tn_bitwise(ctas):
    """The ``nt`` blocks read in place (descriptors built on the device where a CTA's walk enters a group) give the
    bits of the same design on the gathered K-major operands: empty groups first, amid and last, with and without
    accumulation; 3 CTAs make every CTA's walk cross groups. The public ``nt`` and ``tn`` ops agree bit for bit."""
    from tilegemm import config
    from tilegemm.heuristics.gluon import K_GROUPED_FP8_WS_DESIGN

    ks, m, n = [0, 384, 0, 256, 640, 0], 256, 264
    tn, raw, ref = _case(ks, m, n, seed=17)
    (a_nt, sa), (b_nt, sb) = _nt(raw, ks, m, n)
    qa, _, qb, _ = raw
    k_sum = sum(ks)
    offsets = torch.tensor([sum(ks[:g]) for g in range(len(ks) + 1)], dtype=torch.int32, device="cuda")
    cfg, sms = ws.VARIANTS[K_GROUPED_FP8_WS_DESIGN], ctas or config.get_num_sms()
    gathered = ((qa, sa), (qb, sb))
    blocks = ((a_nt.view(m, k_sum), sa), (b_nt.view(n, k_sum), sb))
    c = torch.randn(len(ks), m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    for accumulate in (False, True):
        outs = []
        for ops, in_place in ((gathered, False), (blocks, True)):
            d = c.clone() if accumulate else poisoned((len(ks), m, n), torch.float32, "cuda")
            plan = ws.ws_plan(*ops, d, cfg, sms, k_offsets=offsets, accumulate=accumulate, in_place=in_place)
            outs.append(plan(*ops, d, k_offsets=offsets))
        torch.cuda.synchronize()
        assert not outs[1].isnan().any(), "elements left unwritten"
        assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))
        assert calc_diff(outs[1], ref + c.double() if accumulate else ref) < BAR
    layout_ks = torch.tensor(ks, dtype=torch.int32, device="cuda")
    by_tn, by_nt = (poisoned((len(ks), m, n), torch.float32, "cuda") for _ in range(2))
    tg.k_grouped_fp8_gemm_tn_contiguous(*tn, by_tn, ks, layout_ks, backend="gluon")
    tg.k_grouped_fp8_gemm_nt_contiguous((a_nt, sa), (b_nt, sb), by_nt, ks, layout_ks, backend="gluon")
    torch.cuda.synchronize()
    assert torch.equal(by_tn.view(torch.uint8), by_nt.view(torch.uint8))


def test_nt_off_16_bytes_is_gathered():
    """``nt`` data whose base is not 16-byte aligned (TMA's rule) is gathered into the ``tn`` form: still right."""
    ks, m, n = [256, 128], 128, 256
    _, raw, ref = _case(ks, m, n, seed=23)
    (a_nt, sa), b = _nt(raw, ks, m, n)
    shifted = torch.empty(a_nt.numel() + 1, dtype=a_nt.dtype, device="cuda")[1:]
    shifted.copy_(a_nt)
    layout_ks = torch.tensor(ks, dtype=torch.int32, device="cuda")

    def run(d):
        return tg.k_grouped_fp8_gemm_nt_contiguous((shifted, sa), b, d, ks, layout_ks, backend="gluon")

    _check(run, poisoned((len(ks), m, n), torch.float32, "cuda"), ref)


@pytest.mark.parametrize("shape", [(1, 1), (200, 300), (129, 4097), (4096, 7168)], ids=lambda s: "x".join(map(str, s)))
def test_transposed_equals_torch(shape):
    """The FP8 transposing copy the ``tn`` op takes is ``x.t().contiguous()`` bit for bit (edges masked)."""
    from tilegemm.ops.gluon.transpose import transposed

    x = torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)
    out = transposed(x)
    assert out.shape == (shape[1], shape[0]) and out.is_contiguous()
    assert torch.equal(out.view(torch.uint8), x.t().contiguous().view(torch.uint8))
