"""The split tail (``ops/gluon/split_tail.py``) of both warp-specialized kernels, BF16 and FP8, on a Hopper GPU.

Every split design on grids whose last round is split (or whose single round is): every element written (``d``
poisoned with NaN), within the bar of the float64 formula, reruns of one plan bitwise the result of a fresh plan,
the counters zero after each; CUDA-graph replays on new inputs likewise. Then launches that overlap: one split plan
launched on two streams at once, and two CUDA graphs of it replayed at once on two streams. Each launch has buffers
of its own (a set per stream; a fresh set per captured launch), so every result is bitwise the plan's result alone.
The overlapping launches are queued behind a sleep on each stream so that they start together, on 16 SMs each.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import assert_rerun_identical, calc_diff, dequant_per_block, dequant_per_token, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
ws = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")
split_tail = pytest.importorskip("tilegemm.ops.gluon.split_tail")

KERNELS = {"bf16": bw, "fp8": ws}
DESIGNS = [(kind, name) for kind, module in KERNELS.items() for name, cfg in module.VARIANTS.items() if cfg.splits > 1]
BAR = {"bf16": 1e-5, "fp8": 1e-3}
#: (row tiles, column tiles, K, SMs): two whole rounds of 16 and a tail of 2 tiles; 3 tiles on 16 SMs (no whole
#: round: every tile split); BF16 (K blocks of 64): K of 2 blocks (runs of none) and 18 (uneven shares); FP8 (of
#: 128): K of 2 blocks, 10 (runs of 2 and 3, the last partial) and 56 (runs of 14: the overlap's runs of 8, 4, 2).
GRIDS = {
    "bf16": [(2, 17, 1096, 16), (2, 17, 72, 16), (1, 3, 1096, 16), (2, 17, 7168, 16)],
    "fp8": [(2, 17, 1216, 16), (2, 17, 256, 16), (1, 3, 1216, 16), (2, 17, 7168, 16)],
}
#: Two whole rounds of 16 tiles and a tail of 2 on 16 SMs, K deep enough that overlapping launches run side by side.
OVERLAP_GRID = (2, 17, 7168, 16)


def _case(kind: str, cfg, grid: tuple[int, int, int, int], seed: int):
    """Fresh operands whose tiles (the last row and column tile partial) make ``grid``'s split for ``kind``'s
    kernel, in the layouts it reads, the float64 formula, and the plan's SMs."""
    rows, cols, k, sms = grid
    m, n = rows * cfg.block_m - 7, cols * cfg.block_n - 8
    tiles = rows * cols
    assert split_tail.tail_tiles(tiles, split_tail.split_grid(tiles, sms, cfg.splits), cfg.splits) > 0
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(n, k, device="cuda", generator=g)
    if kind == "bf16":
        a, b = a.bfloat16(), b.bfloat16()
        return a, b, a.double() @ b.double().t(), sms
    qa, sa = per_token_cast_to_fp8(a)
    qb, sb = per_block_cast_to_fp8(b)
    ref = dequant_per_token(qa, sa).double() @ dequant_per_block(qb, sb).double().t()
    return (qa, get_mn_major_tma_aligned_tensor(sa)), (qb, sb), ref, sms


def _plan(kind: str, cfg, a, b, d, sms: int):
    plan = bw.bf16_ws_plan(a, b, d, cfg, sms) if kind == "bf16" else ws.ws_plan(a, b, d, cfg, sms)
    assert plan.tails.split, "the grid's last round is split"
    return plan


def _alone(plan, a, b, d) -> torch.Tensor:
    """The plan's result on these inputs, run alone into a poisoned output."""
    out = poisoned(tuple(d.shape), d.dtype, "cuda")
    plan(a, b, out)
    torch.cuda.synchronize()
    return out


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.view(torch.uint8), y.view(torch.uint8))


@pytest.mark.parametrize("grid", range(4), ids=lambda i: f"grid{i}")
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind, name", DESIGNS)
def test_split_tail(kind, name, out, grid):
    cfg = KERNELS[kind].VARIANTS[name]
    a, b, ref, sms = _case(kind, cfg, GRIDS[kind][grid], seed=sum(GRIDS[kind][grid]))
    d = poisoned(tuple(ref.shape), out, "cuda")
    fresh = lambda: _plan(kind, cfg, a, b, d, sms)(a, b, d)  # noqa: E731
    fresh()
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < BAR[kind]
    assert_rerun_identical(fresh, d)
    plan = _plan(kind, cfg, a, b, d, sms)
    again = poisoned(tuple(ref.shape), out, "cuda")
    plan(a, b, again)
    plan(a, b, again)
    torch.cuda.synchronize()
    assert _same(again, d), "not the result of a fresh plan"
    assert not plan.tails().counters.any(), "the tail's counters are not reset"


@pytest.mark.parametrize("kind, name", DESIGNS)
def test_split_tail_graph_replays(kind, name):
    """A split plan captured in a CUDA graph, replayed three times on new inputs: each replay bitwise the result of
    a fresh plan on those inputs, within the bar of the float64 formula."""
    cfg = KERNELS[kind].VARIANTS[name]
    grid = GRIDS[kind][0]
    a, b, _, sms = _case(kind, cfg, grid, seed=11)
    d = torch.empty(grid[0] * cfg.block_m - 7, grid[1] * cfg.block_n - 8, device="cuda", dtype=torch.bfloat16)
    plan = _plan(kind, cfg, a, b, d, sms)
    plan(a, b, d)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(a, b, d)
    for seed in (12, 13, 14):
        a2, b2, ref, _ = _case(kind, cfg, grid, seed)
        for dst, src in zip(_flat(a, b), _flat(a2, b2)):
            dst.copy_(src)
        d.fill_(float("nan"))
        graph.replay()
        fresh = _alone(_plan(kind, cfg, a, b, d, sms), a, b, d)
        assert calc_diff(d, ref) < BAR[kind]
        assert _same(d, fresh)


def _flat(a, b) -> list[torch.Tensor]:
    """The operand tensors of ``a`` and ``b`` (a BF16 matrix, or an FP8 (data, scales) pair each)."""
    return [t for x in (a, b) for t in (x if isinstance(x, tuple) else (x,))]


@pytest.mark.parametrize("kind, name", DESIGNS)
def test_split_plan_on_two_streams_at_once(kind, name):
    cfg = KERNELS[kind].VARIANTS[name]
    first, second = (_case(kind, cfg, OVERLAP_GRID, seed) for seed in (1, 2))
    outs = [poisoned(tuple(x[2].shape), torch.bfloat16, "cuda") for x in (first, second)]
    plan = _plan(kind, cfg, first[0], first[1], outs[0], OVERLAP_GRID[3])
    expected = [_alone(plan, x[0], x[1], d) for x, d in zip((first, second), outs)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(8):
        for d in outs:
            d.fill_(float("nan"))
        torch.cuda.synchronize()
        for (a, b, _, _), d, stream in zip((first, second), outs, streams):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(2_000_000)
                plan(a, b, d)
        torch.cuda.synchronize()
        assert all(_same(d, want) for d, want in zip(outs, expected)), "a launch read another's partials"
    sets = [plan.tails(stream) for stream in streams]
    assert sets[0].workspace.data_ptr() != sets[1].workspace.data_ptr(), "the two streams share buffers"
    assert not any(s.counters.any() for s in sets), "the counters are not reset"


@pytest.mark.parametrize("kind, name", DESIGNS)
def test_split_plan_graphs_replayed_at_once(kind, name):
    """Two graphs, each capturing the plan on its own inputs, replayed at once on two streams, three times."""
    cfg = KERNELS[kind].VARIANTS[name]
    cases = [_case(kind, cfg, OVERLAP_GRID, seed) for seed in (3, 4)]
    outs = [poisoned(tuple(x[2].shape), torch.bfloat16, "cuda") for x in cases]
    plan = _plan(kind, cfg, cases[0][0], cases[0][1], outs[0], OVERLAP_GRID[3])
    expected = [_alone(plan, x[0], x[1], d) for x, d in zip(cases, outs)]
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    for graph, (a, b, _, _), d in zip(graphs, cases, outs):
        with torch.cuda.graph(graph):
            plan(a, b, d)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(3):
        for d in outs:
            d.fill_(float("nan"))
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(2_000_000)
                graph.replay()
        torch.cuda.synchronize()
        assert all(_same(d, want) for d, want in zip(outs, expected)), "a replay read another's partials"
