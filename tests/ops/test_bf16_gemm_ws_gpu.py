"""The gluon warp-specialized BF16 kernel (``bf16_gemm_ws``) on a Hopper GPU: every design over awkward shapes.

Each case: fresh random bf16 inputs, ``d`` poisoned with NaN, the result compared with ``calc_diff`` against the
float64 product, then a rerun that must be bitwise identical; also a persistent grid smaller than the tile count, an
fp32 output, a second call of the plan on new operands, and the checks' refusals. The split designs (``_sk``) on
grids whose last round is split: every element written, reruns and CUDA-graph replays on new inputs bitwise equal
to a fresh plan's result, the tail's counters zero after each.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.testing import assert_rerun_identical, calc_diff, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
split_tail = pytest.importorskip("tilegemm.ops.gluon.split_tail")

# M = 1, M and N off the tiles, K = 8 (one partial K block) and K past the last full block, a DeepSeek-sized row.
SHAPES = [(1, 256, 64), (129, 136, 8), (300, 200, 1096), (257, 520, 640), (1000, 2112, 7168), (4097, 264, 2048)]
BAR = 1e-5


def _case(m: int, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    return a, b, a.double() @ b.double().t()


def _check(a, b, ref, d, **kwargs) -> None:
    plan = bw.bf16_ws_plan(a, b, d, **kwargs)
    run = lambda: plan(a, b, d)  # noqa: E731
    run()
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < BAR
    assert_rerun_identical(run, d)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(bw.VARIANTS))
def test_bf16_ws(name, shape):
    a, b, ref = _case(*shape, seed=sum(shape))
    _check(a, b, ref, poisoned(shape[:2], torch.bfloat16, "cuda"), cfg=bw.VARIANTS[name])


@pytest.mark.parametrize("name", list(bw.VARIANTS))
def test_bf16_ws_walk_and_fp32(name):
    """Three CTAs over many tiles, into an fp32 output."""
    a, b, ref = _case(1000, 1000, 1024, seed=7)
    _check(a, b, ref, poisoned((1000, 1000), torch.float32, "cuda"), cfg=bw.VARIANTS[name], num_sms=3)


SPLIT_DESIGNS = [name for name, cfg in bw.VARIANTS.items() if cfg.splits > 1]
#: (row tiles, column tiles, K, SMs): two whole rounds of 16 and a tail of 2 tiles split 4 ways; 3 tiles on 16 SMs
#: (no whole round: every tile split); K of 2 blocks (two runs of each tile have none) and of 18 (uneven shares).
SPLIT_GRIDS = [(2, 17, 1096, 16), (2, 17, 72, 16), (1, 3, 1096, 16), (2, 17, 7168, 16)]


def _split_case(cfg, grid: tuple[int, int, int, int], seed: int):
    """Operands whose tiles (the last row and column tile partial) make ``grid``'s tail, and the plan's SMs."""
    rows, cols, k, sms = grid
    m, n = rows * cfg.block_m - 7, cols * cfg.block_n - 8
    tiles = rows * cols
    assert split_tail.tail_tiles(tiles, split_tail.split_grid(tiles, sms, cfg.splits), cfg.splits) > 0
    return (*_case(m, n, k, seed), sms)


@pytest.mark.parametrize("grid", SPLIT_GRIDS, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", SPLIT_DESIGNS)
def test_bf16_ws_split_tail(name, out, grid):
    cfg = bw.VARIANTS[name]
    a, b, ref, sms = _split_case(cfg, grid, seed=sum(grid))
    d = poisoned(tuple(ref.shape), out, "cuda")
    plan = bw.bf16_ws_plan(a, b, d, cfg, sms)
    _check(a, b, ref, d, cfg=cfg, num_sms=sms)
    again = poisoned(tuple(ref.shape), out, "cuda")
    plan(a, b, again)
    plan(a, b, again)
    torch.cuda.synchronize()
    assert torch.equal(again.view(torch.uint8), d.view(torch.uint8)), "not the result of a fresh plan"
    assert not plan.tail.counters.any(), "the tail's counters are not reset"


@pytest.mark.parametrize("name", SPLIT_DESIGNS)
def test_bf16_ws_split_tail_graph_replays(name):
    """A split plan captured in a CUDA graph, replayed three times on new inputs: each replay bitwise the result of
    a fresh plan on those inputs (the counters reset by every launch), within the bar of the float64 product."""
    cfg = bw.VARIANTS[name]
    a, b, _, sms = _split_case(cfg, SPLIT_GRIDS[0], seed=11)
    d = torch.empty(a.shape[0], b.shape[0], device="cuda", dtype=torch.bfloat16)
    plan = bw.bf16_ws_plan(a, b, d, cfg, sms)
    plan(a, b, d)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(a, b, d)
    for seed in (12, 13, 14):
        a2, b2, ref = _case(a.shape[0], b.shape[0], a.shape[1], seed)
        a.copy_(a2)
        b.copy_(b2)
        d.fill_(float("nan"))
        graph.replay()
        fresh = poisoned(tuple(d.shape), d.dtype, "cuda")
        bw.bf16_ws_plan(a, b, fresh, cfg, sms)(a, b, fresh)
        torch.cuda.synchronize()
        assert calc_diff(d, ref) < BAR
        assert torch.equal(d.view(torch.uint8), fresh.view(torch.uint8))
        assert not plan.tail.counters.any()


def test_bf16_ws_plan_relaunches_on_new_operands():
    """Later runs of a plan (the compiled kernel's relaunch) read the operands they are given."""
    a, b, _ = _case(300, 520, 512, seed=1)
    d = torch.empty(300, 520, device="cuda", dtype=torch.bfloat16)
    plan = bw.bf16_ws_plan(a, b, d)
    plan(a, b, d)
    for seed in (2, 3):
        a2, b2, ref = _case(300, 520, 512, seed=seed)
        d2 = poisoned((300, 520), torch.bfloat16, "cuda")
        plan(a2, b2, d2)
        torch.cuda.synchronize()
        assert calc_diff(d2, ref) < BAR


def test_bf16_ws_refuses():
    a = torch.randn(64, 128, device="cuda").bfloat16()
    d = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must be bf16"):
        bw.bf16_ws_plan(a.half(), a[:64].half(), d)
    with pytest.raises(ValueError, match="TMA-ready"):
        bw.bf16_ws_plan(a, a.t().contiguous().t()[:64], d)
    with pytest.raises(ValueError, match="shapes"):
        bw.bf16_ws_plan(a, a[:, :64], d)


# The public op on the gluon backend: (M, N, K), each design the rule picks there, and shapes off the tiles.
PUBLIC_SHAPES = [(256, 4096, 7168), (512, 2112, 1024), (384, 1536, 2048), (160, 7168, 2048), (300, 200, 1096)]
PUBLIC_SHAPES += [(2048, 2112, 7168)]  # 272 128x128 tiles: on 132 SMs two rounds and a split tail


@pytest.mark.parametrize("shape", PUBLIC_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_public_bf16_gemm_nt_on_gluon(shape, out):
    """``bf16_gemm_nt(..., backend="gluon")`` against float64, every element written, reruns bitwise; the automatic
    choice, where :func:`tilegemm.heuristics.gluon.prefers_dense_bf16` takes the shape, is the same kernel."""
    import tilegemm
    from tilegemm.heuristics import gluon as rules

    a, b, ref = _case(*shape, seed=sum(shape))
    d = poisoned(shape[:2], out, "cuda")
    run = lambda: tilegemm.bf16_gemm_nt(a, b, d, backend="gluon")  # noqa: E731
    run()
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < BAR
    assert_rerun_identical(run, d)
    if rules.prefers_dense_bf16(*shape):
        auto = poisoned(shape[:2], out, "cuda")
        tilegemm.bf16_gemm_nt(a, b, auto)
        assert torch.equal(auto, d)


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_public_bf16_layouts_the_kernel_does_not_read_fall_back(layout):
    """An MN-major operand: the gluon kernel makes no copies, so a forced gluon call falls back to the default
    backend with a warning, and the result is the product."""
    import tilegemm
    from tilegemm.backend.registry import FallbackWarning

    m, n, k = 256, 512, 1024
    a, b, ref = _case(m, n, k, seed=3)
    a_arg = a.t().contiguous() if layout[0] == "t" else a
    b_arg = b.t().contiguous() if layout[1] == "n" else b
    d = poisoned((m, n), torch.bfloat16, "cuda")
    with pytest.warns(FallbackWarning):
        getattr(tilegemm, f"bf16_gemm_{layout}")(a_arg, b_arg, d, backend="gluon")
    assert calc_diff(d, ref) < BAR


def test_public_bf16_addend_falls_back():
    """An addend (``c``) is not the gluon kernel's: a forced gluon call falls back with a warning."""
    import tilegemm
    from tilegemm.backend.registry import FallbackWarning

    a, b, ref = _case(256, 512, 1024, seed=4)
    c = torch.randn(256, 512, device="cuda").bfloat16()
    d = poisoned((256, 512), torch.bfloat16, "cuda")
    with pytest.warns(FallbackWarning):
        tilegemm.bf16_gemm_nt(a, b, d, c, backend="gluon")
    assert calc_diff(d, ref + c.double()) < BAR
