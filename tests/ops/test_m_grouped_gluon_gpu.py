"""The gluon m-grouped contiguous FP8 GEMM (the warp-specialized kernel's ``GROUPED`` form) on a Hopper GPU.

Each case: fresh random inputs quantized with DeepGEMM's recipe, DeepGEMM's ``m_indices`` layout (each group's
rows padded with -1 to a multiple of 128, empty groups, an all-padding block), ``d`` poisoned with NaN, the result
compared with ``calc_diff`` against the float64 formula on the dequantized inputs, padding rows exactly 0, then a
rerun that must be bitwise identical. Every one-wave design of the kernel, awkward N and K, a partial last block,
out-of-range ids (their blocks left unwritten), a persistent grid smaller than the tile count, the ``nn`` op, fp32
output, CUDA-graph replay with new routing, and the public op's automatic choice against ``backend="gluon"``.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.ops import api as tg
from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

ws = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")

ALIGN = 128
BAR = {torch.bfloat16: 1e-5, torch.float32: 1e-6}
#: the designs an m-grouped call can run: one 128-row wave a tile (the overlap at 128x192 spills: not shipped), not
#: split (the split tail is dense only)
GROUPED_DESIGNS = [n for n, c in ws.VARIANTS.items() if c.waves == 1 and n != "cd_128x192_ov" and c.splits == 1]


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "0")


def _m_indices(sizes: list[int], tail: int = ALIGN) -> torch.Tensor:
    """int32 m_indices: group g's rows padded with -1 to a multiple of 128, then ``tail`` rows of -1."""
    parts = []
    for g, s in enumerate(sizes):
        seg = torch.full((-(-s // ALIGN) * ALIGN,), -1, dtype=torch.int32)
        seg[:s] = g
        parts.append(seg)
    parts.append(torch.full((tail,), -1, dtype=torch.int32))
    return torch.cat(parts).cuda()


def _case(index: torch.Tensor, groups: int, n: int, k: int, seed: int):
    """FP8 operands (A's scales as the check hands them) and the float64 formula (rows of no group: 0)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = index.numel()
    qa, sa = per_token_cast_to_fp8(torch.randn(rows, k, device="cuda", generator=gen))
    qb, sb = per_block_cast_to_fp8(torch.randn(groups, n, k, device="cuda", generator=gen))
    a64, b64 = dequant_per_token(qa, sa).double(), dequant_per_block(qb, sb).double()
    ref = torch.zeros(rows, n, dtype=torch.float64, device="cuda")
    for g in range(groups):
        sel = index == g
        ref[sel] = a64[sel] @ b64[g].T
    return (qa, sa), (qb, sb), ref


def _check(run, d, ref, index, groups, skipped=None) -> None:
    """``run(d)`` against ``ref``: padding rows 0, rows of skipped blocks left NaN, a bitwise rerun."""
    run(d)
    torch.cuda.synchronize()
    written = torch.ones(d.shape[0], dtype=torch.bool, device="cuda") if skipped is None else ~skipped
    assert not d[written].isnan().any(), "rows left unwritten"
    if skipped is not None:
        assert d[skipped].isnan().all(), "blocks of out-of-range ids must be left as they were"
    assert (d[written & (index < 0)] == 0).all(), "padding rows must be written as 0"
    diff = calc_diff(d[written], ref[written])
    assert diff < BAR[d.dtype], f"calc_diff {diff:.2e}"
    again = poisoned(d.shape, d.dtype, "cuda")
    run(again)
    torch.cuda.synchronize()
    assert torch.equal(d[written].view(torch.uint8), again[written].view(torch.uint8)), "rerun not bitwise identical"


# (group sizes, N, K, tail rows of -1): empty groups, a group of one row, N and K off the tiles, a partial last block
CASES = [
    ([300, 0, 128, 1, 77], 256, 512, 128),
    ([129, 256, 40], 200, 1100, 50),
    ([1000, 700, 0, 900], 2112, 7168, 0),
    ([64] * 9, 576, 2048, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"g{len(c[0])}n{c[1]}k{c[2]}")
@pytest.mark.parametrize("name", GROUPED_DESIGNS)
def test_ws_grouped_designs(name, case):
    sizes, n, k, tail = case
    index = _m_indices(sizes, tail)
    a, b, ref = _case(index, len(sizes), n, k, seed=n + k)
    a = (a[0], a[1])
    d = poisoned((index.numel(), n), torch.bfloat16, "cuda")
    cfg = ws.VARIANTS[name]
    _check(lambda dd: ws.ws_plan(a, b, dd, cfg, m_index=index)(a, b, dd, m_index=index), d, ref, index, len(sizes))


@pytest.mark.parametrize("name", ["a_128x128_p", "d_128x128_ov4", "d_128x128_ov8", "c_128x192"])
def test_ws_grouped_persistent_walk(name):
    """Three CTAs over every tile: each CTA walks tiles of several groups, padding and computed ones."""
    sizes = [200, 0, 300, 5, 128]
    index = _m_indices(sizes)
    a, b, ref = _case(index, len(sizes), 520, 1024, seed=5)
    d = poisoned((index.numel(), 520), torch.bfloat16, "cuda")
    cfg = ws.VARIANTS[name]
    _check(lambda dd: ws.ws_plan(a, b, dd, cfg, 3, index)(a, b, dd, m_index=index), d, ref, index, len(sizes))


def test_gluon_op_out_of_range_ids_skip_blocks():
    """Blocks whose first id is outside [-1, G) are not written (as cutile); rows of another id inside a computed
    block are written 0."""
    sizes = [128, 256, 128, 100]
    index = _m_indices(sizes, tail=0)
    index[128:256] = 7  # G = 4: out of range
    index[256:384] = -5
    index[600] = 9  # inside group 3's block: written 0
    a, b, ref = _case(index, len(sizes), 256, 512, seed=3)
    ref[600] = 0
    skipped = torch.zeros(index.numel(), dtype=torch.bool, device="cuda")
    skipped[128:384] = True
    d = poisoned((index.numel(), 256), torch.float32, "cuda")
    op = tg.m_grouped_fp8_fp4_gemm_nt_contiguous
    _check(lambda dd: op(a, b, dd, index, backend="gluon"), d, ref, index, len(sizes), skipped)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_gluon_op(layout, out_dtype):
    """The public op on the gluon backend, both layouts (nn: the weights stored [G, K, N], copied to K-major)."""
    sizes = [500, 0, 333, 129]
    index = _m_indices(sizes)
    a, (qb, sb), ref = _case(index, len(sizes), 384, 1536, seed=11)
    b = (qb, sb) if layout == "nt" else (qb.transpose(1, 2).contiguous(), sb.transpose(1, 2).contiguous())
    op = getattr(tg, f"m_grouped_fp8_fp4_gemm_{layout}_contiguous")
    d = poisoned((index.numel(), 384), out_dtype, "cuda")
    _check(lambda dd: op(a, b, dd, index, backend="gluon"), d, ref, index, len(sizes))


def test_automatic_choice_matches_gluon_bitwise():
    """A shape the automatic choice gives gluon: the public call with default settings is ``backend="gluon"``'s."""
    from tilegemm import config
    from tilegemm.heuristics.gluon import prefers_m_grouped_fp8

    sizes = [1100, 900, 0, 1300, 700]
    index = _m_indices(sizes, tail=0)
    n, k = 4096, 2048
    assert prefers_m_grouped_fp8(index.numel(), n, k, config.get_num_sms())
    a, b, ref = _case(index, len(sizes), n, k, seed=17)
    auto = poisoned((index.numel(), n), torch.bfloat16, "cuda")
    tg.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, auto, index)
    forced = poisoned((index.numel(), n), torch.bfloat16, "cuda")
    tg.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, forced, index, backend="gluon")
    torch.cuda.synchronize()
    assert torch.equal(auto.view(torch.uint8), forced.view(torch.uint8))
    assert calc_diff(auto, ref) < BAR[torch.bfloat16]


@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_hot_lane_fresh_inputs_and_routing(layout):
    """Calls of one signature (the hot lane replays all but the first) on fresh operands and new routing each time
    (group sizes moved, a group emptied), each against its float64 formula, padding rows 0."""
    from tilegemm.backend import hot_lane

    op = getattr(tg, f"m_grouped_fp8_fp4_gemm_{layout}_contiguous")
    for seed, sizes in enumerate([[300, 0, 129, 100], [128, 256, 0, 380], [0, 0, 640, 1]]):
        index = _m_indices(sizes, tail=0)
        assert index.numel() == 768, "one signature: the same rows each time"
        a, (qb, sb), ref = _case(index, len(sizes), 320, 1536, seed=60 + seed)
        b = (qb, sb) if layout == "nt" else (qb.transpose(1, 2).contiguous(), sb.transpose(1, 2).contiguous())
        d = poisoned((index.numel(), 320), torch.bfloat16, "cuda")
        assert op(a, b, d, index, backend="gluon") is d
        torch.cuda.synchronize()
        assert not d.isnan().any() and (d[index < 0] == 0).all()
        assert calc_diff(d, ref) < BAR[torch.bfloat16]
    assert ("gluon", op.op_name) in {(backend, key[0]) for backend, key in hot_lane._HOT}


def test_cuda_graph_replay_with_new_routing():
    """Captured once, replayed after the routing (``m_indices``' contents) and the inputs change in place."""
    sizes = [256, 128, 0, 384]
    index = _m_indices(sizes, tail=0)
    a, b, _ = _case(index, len(sizes), 512, 1024, seed=21)
    d = poisoned((index.numel(), 512), torch.bfloat16, "cuda")
    op = tg.m_grouped_fp8_fp4_gemm_nt_contiguous
    op(a, b, d, index, backend="gluon")  # compile and keep the plan outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(a, b, d, index, backend="gluon")
    new_index = _m_indices([128, 0, 512, 128], tail=0)
    index.copy_(new_index)
    a2, b2, ref = _case(index, len(sizes), 512, 1024, seed=22)
    for live, new in zip((*a, *b), (*a2, *b2)):
        live.copy_(new)
    d.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert not d.isnan().any() and (d[index < 0] == 0).all()
    assert calc_diff(d, ref) < BAR[torch.bfloat16]


@pytest.mark.parametrize("name", ["d_128x128_ov4", "c_128x192", "e_64x128_ov2"])
def test_ws_grouped_row_scale(name):
    """``row_scale`` (the fused experts' down projection): each row times its fp32 entry before the bf16 rounding,
    padding rows 0; a rerun with other scales uses them (the plan reads the call's ``row_scale``)."""
    sizes = [300, 0, 128, 77]
    index = _m_indices(sizes)
    a, b, ref = _case(index, len(sizes), 384, 1024, seed=31)
    scales = [torch.rand(index.numel(), generator=torch.Generator().manual_seed(s)).cuda() + 0.5 for s in (0, 1)]
    first = poisoned((index.numel(), 384), torch.bfloat16, "cuda")
    plan = ws.ws_plan(a, b, first, ws.VARIANTS[name], m_index=index, row_scale=scales[0])
    for scale in scales:
        d = poisoned((index.numel(), 384), torch.bfloat16, "cuda")
        run = lambda dd, scale=scale: plan(a, b, dd, m_index=index, row_scale=scale)  # noqa: E731
        _check(run, d, ref * scale.double()[:, None], index, len(sizes))


def test_ws_row_scale_is_checked():
    index = _m_indices([128])
    a, b, _ = _case(index, 1, 128, 128, seed=0)
    d = torch.empty(index.numel(), 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="row_scale must be fp32"):
        ws.ws_plan(a, b, d, m_index=index, row_scale=torch.ones(index.numel(), device="cuda").half())
    with pytest.raises(ValueError, match="row_scale must be fp32"):
        ws.ws_plan(a, (b[0][0], b[1][0]), d, row_scale=torch.ones(index.numel(), device="cuda"))


@pytest.mark.parametrize("name", ["a_128x128_p", "e_64x128_p"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_ws_gated(activation, name):
    """The gated form (the fused experts' gate/up): ``h = act(g) * u`` of each row's gate and up products quantized
    1x128 into FP8 and MN-major scales, against the same quantization of the float64 ``h``: scales to fp32
    accumulation error, the e4m3 values equal but for the few elements that round the other way at a midpoint;
    padding rows 0, blocks of an out-of-range id left unwritten, a bitwise rerun."""
    from tilegemm.testing import MOE_ACTIVATIONS

    sizes, inter, k = [300, 0, 128, 77], 256, 1024
    index = _m_indices(sizes)
    index[-128:] = len(sizes)  # an out-of-range block: not written
    a, b, ref = _case(index, len(sizes), 2 * inter, k, seed=41)
    h64 = MOE_ACTIVATIONS[activation](ref[:, :inter]) * ref[:, inter:]
    q_ref, s_ref = per_token_cast_to_fp8(h64.float())
    rows = index.numel()
    code = ws.GATED_ACTIVATIONS[activation]
    outs = []
    for _ in range(2):
        hq = poisoned((rows, inter), torch.float8_e4m3fn, "cuda")
        sh = torch.full((inter // 128, rows), float("nan"), device="cuda")
        ws.ws_plan(a, b, hq, ws.VARIANTS[name], m_index=index, gated=code, d_scales=sh)(
            a, b, hq, m_index=index, d_scales=sh
        )
        torch.cuda.synchronize()
        outs.append((hq.view(torch.uint8).clone(), sh.clone()))
    (hq, sh), (hq2, sh2) = outs
    live = index < len(sizes)
    assert torch.equal(hq[live], hq2[live]) and torch.equal(sh[:, live], sh2[:, live]), "rerun not bitwise identical"
    assert sh[:, ~live].isnan().all(), "blocks of out-of-range ids must be left as they were"
    assert (hq[index < 0] == 0).all(), "padding rows must be written as 0"
    # amax from fp32 products with the FP8 MMA's fast accumulation (about 2**-14 of a block's magnitudes)
    torch.testing.assert_close(sh[:, live].t(), s_ref[live], rtol=1e-3, atol=0)
    differ = (hq[live] != q_ref.view(torch.uint8)[live]).float().mean().item()
    assert differ < 0.01, f"{differ:.2%} of the e4m3 values differ from the float64 h's quantization"
    deq = dequant_per_token(hq[live].view(torch.float8_e4m3fn), sh[:, live].t())
    assert calc_diff(deq, dequant_per_token(q_ref[live], s_ref[live])) < 1e-5


def test_ws_gated_is_checked():
    index = _m_indices([128])
    a, b, _ = _case(index, 1, 256, 128, seed=0)
    hq = torch.empty(index.numel(), 128, dtype=torch.float8_e4m3fn, device="cuda")
    with pytest.raises(ValueError, match="d_scales must be fp32"):
        ws.ws_plan(a, b, hq, m_index=index, gated=1, d_scales=torch.empty(1, 128, device="cuda"))
    with pytest.raises(ValueError, match="gated: m-grouped"):
        ws.ws_plan(a, b, hq.bfloat16(), m_index=index, gated=1, d_scales=torch.empty(1, 128, device="cuda"))
