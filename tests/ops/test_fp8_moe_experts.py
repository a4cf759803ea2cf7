"""``tilegemm.fp8_moe_experts`` against the float64 formula of its FP8 recipe: backends x shapes, checks, determinism.

The formula (``tilegemm.ops.api.fp8_moe_experts``): ``x`` quantized 1x128 (``per_token_cast_to_fp8``), the
weights' 128x128 blocks dequantized, gate/up and the gated activation in float64, ``h`` quantized 1x128, the down
projection, the routing weight and the slot sum in float64, on the same FP8 inputs (:data:`BAR` says why its
bar is above an FP8 GEMM's). Shapes cover one token, top-1, experts with no tokens, expert-parallel sentinel ids
and a prefill-sized routing. The ``cutile`` cases need a GPU (marked ``gpu``); the ``pytorch`` ones run anywhere.
"""

from __future__ import annotations

import math

import pytest
import torch

import tilegemm
from tilegemm.bench.moe import FP8_BAR
from tilegemm.heuristics import cutile as heuristics
from tilegemm.testing import (
    MOE_ACTIVATIONS,
    backend_device_params,
    calc_diff,
    dequant_per_block,
    dequant_per_token,
    fp8_round_trip_per_token,
)

#: Against the float64 formula on the same FP8 values. Not DESIGN.md's 1e-5 for FP8 GEMMs: quantizing ``h`` is
#: not continuous. An ``h`` element near a midpoint between two e4m3 values may round either way, and one such
#: element moves its slot's output by about 2%. The kernels' ``h`` carries the accumulation error of Hopper's
#: FP8 MMA, about 2**-14 of a 128-deep block's summed magnitudes, so on an H100 a few elements per thousand
#: land one e4m3 step from the formula: calc_diff 3e-6 to 1.4e-5 on these shapes, 0.9e-4 to 1.8e-4 at model sizes
#: (the unfused FP8 path, which rounds h to bf16 first: 1.0e-4 to 1.5e-4). A wrong scale or operand costs 1e-2.
BAR = 2e-4

# (T, k, E, H, I, sentinels)
SHAPES = [
    (1, 8, 16, 256, 128, False),  # one token (decode)
    (5, 1, 4, 128, 128, False),  # top-1
    (7, 2, 64, 384, 128, False),  # most experts get no token
    (33, 4, 8, 256, 256, True),  # sentinels -1 and >= E
    (300, 8, 8, 256, 256, False),  # prefill-sized: 64-row blocks, several per expert
]
IDS = [f"T{t}-k{k}-E{e}-H{h}-I{i}" + ("-sentinel" if s else "") for t, k, e, h, i, s in SHAPES]


def _inputs(t, k, e, h, i, sentinels, device, seed=0):
    """bf16 hidden, ids, fp32 weights and the FP8 ``(data, 128x128 scales)`` of random w13 [E, 2I, H], w2 [E, H, I]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).bfloat16()
    w13 = tilegemm.per_block_cast_to_fp8(torch.randn(e, 2 * i, h, generator=g) / math.sqrt(h))
    w2 = tilegemm.per_block_cast_to_fp8(torch.randn(e, h, i, generator=g) / math.sqrt(i))
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    if sentinels:
        drop = torch.rand(t, k, generator=g) < 0.25
        ids = torch.where(drop, torch.where(torch.rand(t, k, generator=g) < 0.5, -1, e), ids)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    move = lambda z: tuple(v.to(device) for v in z) if isinstance(z, tuple) else z.to(device)  # noqa: E731
    return [move(z) for z in (x, ids, weights, w13, w2)]


def _dequant(w: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return dequant_per_block(*(z.cpu() for z in w))


def _formula(x, ids, weights, w13, w2, activation="silu"):
    """float64 FP8-recipe experts per token (module docstring), dropped slots contributing nothing."""
    device = x.device
    x64 = dequant_per_token(*tilegemm.per_token_cast_to_fp8(x.cpu()))
    w13_64, w2_64 = _dequant(w13), _dequant(w2)
    ids, weights = ids.cpu(), weights.cpu().double()
    inter = w2_64.shape[2]
    act = MOE_ACTIVATIONS[activation]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if 0 <= e < w13_64.shape[0]:
                gu = w13_64[e] @ x64[t]
                out[t] += weights[t, j] * (w2_64[e] @ fp8_round_trip_per_token(act(gu[:inter]) * gu[inter:]))
    return out.to(device)


BACKENDS = backend_device_params()


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_matches_formula(strict, backend, device, shape):
    args = _inputs(*shape, device)
    out = tilegemm.fp8_moe_experts(*args, backend=backend)
    assert out.shape == args[0].shape and out.dtype == torch.bfloat16 and out.device == args[0].device
    assert calc_diff(out, _formula(*args)) < BAR
    assert torch.equal(out, tilegemm.fp8_moe_experts(*args, backend=backend)), "reruns must be bitwise identical"


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_activations(strict, backend, device, activation):
    args = _inputs(9, 2, 4, 128, 128, False, device)
    out = tilegemm.fp8_moe_experts(*args, activation=activation, backend=backend)
    assert calc_diff(out, _formula(*args, activation)) < BAR


def test_close_to_the_bf16_experts():
    """FP8 quantization error only: against the bf16 op on the dequantized weights (both quantizations of the
    activations, x and h, cost about 1e-3 on randn data)."""
    x, ids, w, w13, w2 = _inputs(16, 4, 8, 256, 128, True, "cpu")
    out = tilegemm.fp8_moe_experts(x, ids, w, w13, w2, backend="pytorch")
    ref = tilegemm.moe_experts(x, ids, w, _dequant(w13).bfloat16(), _dequant(w2).bfloat16(), backend="pytorch")
    assert 0 < calc_diff(out, ref) < 5e-3


def test_every_slot_dropped_gives_zeros():
    x, ids, w, w13, w2 = _inputs(4, 2, 4, 128, 128, False, "cpu")
    out = tilegemm.fp8_moe_experts(x, torch.full_like(ids, 4), w, w13, w2, backend="pytorch")
    assert torch.equal(out, torch.zeros_like(out))


def _swap_scales(a, key, shape):
    a[key] = (a[key][0], torch.ones(shape))


@pytest.mark.parametrize(
    ("change", "err", "needle"),
    [
        (lambda a: a.update(hidden=a["hidden"].float()), TypeError, "hidden"),
        (lambda a: a.update(topk_ids=a["topk_ids"][:2]), ValueError, "topk_ids"),
        (lambda a: a.update(topk_weights=a["topk_weights"][:, :1]), ValueError, "topk_weights"),
        (lambda a: a.update(w13=a["w13"][0]), TypeError, "w13"),
        (lambda a: a.update(w13=(a["w13"][0].float(), a["w13"][1])), TypeError, "w13"),
        (lambda a: _swap_scales(a, "w13", (4, 1, 1)), ValueError, r"w13\[1\]"),
        (lambda a: _swap_scales(a, "w2", (4, 1, 2)), ValueError, r"w2\[1\]"),
        (lambda a: a.update(w2=(a["w2"][0][:, :, :64], a["w2"][1])), ValueError, r"w2\[0\]"),
        (lambda a: a.update(hidden=a["hidden"][:, :64]), ValueError, "w13"),
        (lambda a: a.update(activation="relu"), ValueError, "activation"),
    ],
)
def test_bad_arguments_are_named(change, err, needle):
    x, ids, w, w13, w2 = _inputs(4, 2, 4, 128, 128, False, "cpu")
    kwargs = dict(hidden=x, topk_ids=ids, topk_weights=w, w13=w13, w2=w2)
    change(kwargs)
    with pytest.raises(err, match=needle):
        tilegemm.fp8_moe_experts(**kwargs, backend="pytorch")


def test_sizes_not_multiples_of_128_are_refused():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 192, generator=g).bfloat16()
    w13 = tilegemm.per_block_cast_to_fp8(torch.randn(2, 128, 192, generator=g))
    w2 = tilegemm.per_block_cast_to_fp8(torch.randn(2, 192, 64, generator=g))
    ids, w = torch.zeros(3, 1, dtype=torch.int64), torch.ones(3, 1)
    with pytest.raises(ValueError, match=r"^hidden: got H=192 .*multiple of 128"):
        tilegemm.fp8_moe_experts(x, ids, w, w13, w2, backend="pytorch")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("backend", "shape"),
    [pytest.param("cutile", (64, 8, 32), id="cutile"), pytest.param("gluon", (96, 4, 8), id="gluon")],
)
def test_graph_capture_replays_new_routing(strict, backend, shape):
    """One CUDA graph replayed with new token values and new routing (sentinels included): no host sync inside the
    op, on either form (gluon: where it runs)."""
    if backend == "gluon" and _gluon_reason():
        pytest.skip(_gluon_reason())
    x, ids, w, w13, w2 = _inputs(*shape, 256, 128, True, "cuda")
    tilegemm.fp8_moe_experts(x, ids, w, w13, w2, backend=backend)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tilegemm.fp8_moe_experts(x, ids, w, w13, w2, backend=backend)
    x2, ids2, w_2, _, _ = _inputs(*shape, 256, 128, True, "cuda", seed=1)
    x.copy_(x2), ids.copy_(ids2), w.copy_(w_2)
    graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(out, _formula(x, ids, w, w13, w2)) < BAR


@pytest.mark.parametrize(
    ("t", "k", "e", "form"),
    [(1, 8, 128, "blocks"), (128, 8, 256, "blocks"), (256, 8, 128, "rows"), (64, 2, 8, "rows"), (3, 1, 1, "blocks")],
)
def test_form_choice(monkeypatch, t, k, e, form):
    """The row form from 16 routed rows per touched expert on average (the H100 crossover), the block form below;
    ``TILEGEMM_MOE_VARIANT`` forces either."""

    def pick():  # as the host path asks: the variant read once, into the problem
        return heuristics.choose(heuristics.problem("moe_fp8", "fp8", t * k, 2048, 1024, 132, groups=e))

    monkeypatch.delenv(heuristics.MOE_VARIANT_ENV, raising=False)
    assert pick().path == ("blocks" if form == "blocks" else "sorted"), pick()
    monkeypatch.setenv(heuristics.MOE_VARIANT_ENV, "sorted")
    assert isinstance(pick(), heuristics.MoEConfig) and pick().path == "sorted"
    monkeypatch.setenv(heuristics.MOE_VARIANT_ENV, "blocks")
    assert isinstance(pick(), heuristics.MoEBlocksConfig) and pick().path == "blocks"


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["blocks", "sorted"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_cutile_both_forms(strict, monkeypatch, form, shape):
    """The block form and the row form forced (``TILEGEMM_MOE_VARIANT``) on every shape, whichever the heuristics
    would pick: formula, bitwise reruns."""
    monkeypatch.setenv(heuristics.MOE_VARIANT_ENV, form)
    args = _inputs(*shape, "cuda")
    out = tilegemm.fp8_moe_experts(*args, backend="cutile")
    assert calc_diff(out, _formula(*args)) < BAR
    assert torch.equal(out, tilegemm.fp8_moe_experts(*args, backend="cutile"))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "k", "e", "h", "i"), [(1, 8, 128, 2048, 768), (512, 8, 128, 2048, 768), (64, 2, 8, 4096, 1024)]
)
def test_cutile_model_sizes(strict, t, k, e, h, i):
    """Qwen3-30B-A3B-sized and Mixtral-like (I reduced) layers against the pytorch backend: two implementations, each
    a few e4m3 steps of ``h`` from the formula (:data:`BAR`), at the harness's FP8 bar (2.0e-4 measured at T = 1 on an
    H100, 2026-11-23)."""
    args = _inputs(t, k, e, h, i, False, "cuda")
    out = tilegemm.fp8_moe_experts(*args, backend="cutile")
    ref = tilegemm.fp8_moe_experts(*args, backend="pytorch")
    assert calc_diff(out, ref) < FP8_BAR


def _gluon_reason() -> str | None:
    """Why the gluon form cannot run here (it needs gluon and, for its routing and quantization kernels, cuTile)."""
    from tilegemm.backend.selector import cutile_unavailable_reason, gluon_unavailable_reason

    if not torch.cuda.is_available():
        return "needs CUDA"
    return gluon_unavailable_reason() or cutile_unavailable_reason()


@pytest.fixture
def gluon_form(strict):
    """Skip where the gluon form cannot run; no fallback to another backend (``strict``)."""
    reason = _gluon_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.usefixtures("gluon_form")
@pytest.mark.gpu
def test_gluon_matches_formula(activation, shape):
    """The gluon form (m-grouped GEMMs, ``ops/gluon/moe_fp8.py``) on every shape: formula, bitwise reruns."""
    args = _inputs(*shape, "cuda")
    out = tilegemm.fp8_moe_experts(*args, activation=activation, backend="gluon")
    assert out.shape == args[0].shape and out.dtype == torch.bfloat16
    assert calc_diff(out, _formula(*args, activation)) < BAR
    assert torch.equal(out, tilegemm.fp8_moe_experts(*args, activation=activation, backend="gluon"))


@pytest.mark.usefixtures("gluon_form")
@pytest.mark.gpu
def test_gluon_short_tiles_skewed(monkeypatch):
    """The 64-row designs (forced) where one expert takes most tokens: its blocks run both 64-row tiles, the last
    partly padding; the others' second halves are skipped. Against the formula, reruns bitwise."""
    from tilegemm.ops.gluon import moe_fp8

    monkeypatch.setattr(moe_fp8, "moe_fp8_ws_designs", lambda *_: ("e_64x128_p", "e_64x128_ov2"))
    t, k, e, h, i = 150, 1, 8, 256, 256
    x, ids, weights, w13, w2 = _inputs(t, k, e, h, i, False, "cuda", seed=5)
    ids = torch.where(torch.arange(t, device="cuda")[:, None] < 140, 3, ids)  # 140+ rows: blocks of 128 and 12+
    out = tilegemm.fp8_moe_experts(x, ids, weights, w13, w2, backend="gluon")
    assert calc_diff(out, _formula(x, ids, weights, w13, w2)) < BAR
    assert torch.equal(out, tilegemm.fp8_moe_experts(x, ids, weights, w13, w2, backend="gluon"))


@pytest.mark.parametrize(("t", "k", "e", "h", "i"), [(512, 8, 16, 2048, 768), (300, 2, 4, 4096, 1024)])
@pytest.mark.usefixtures("gluon_form")
@pytest.mark.gpu
def test_gluon_model_sizes_and_automatic_choice(t, k, e, h, i):
    """Prefill-sized layers (128+ rows per expert): against the pytorch backend at the harness's FP8 bar, and the
    automatic choice (gluon here, :func:`tilegemm.heuristics.gluon.prefers_fp8_moe_experts`) bitwise equal to
    ``backend="gluon"``."""
    from tilegemm.heuristics.gluon import prefers_fp8_moe_experts

    assert prefers_fp8_moe_experts(t, k, e, h, i)
    args = _inputs(t, k, e, h, i, False, "cuda")
    out = tilegemm.fp8_moe_experts(*args, backend="gluon")
    assert calc_diff(out, tilegemm.fp8_moe_experts(*args, backend="pytorch")) < FP8_BAR
    assert torch.equal(out, tilegemm.fp8_moe_experts(*args))


@pytest.mark.parametrize(
    ("t", "k", "e", "h", "i", "gluon"),
    [
        (256, 8, 32, 2048, 768, True),
        (255, 8, 32, 2048, 768, False),  # below the rows per expert
        (1, 8, 128, 2048, 768, False),
        (16384, 8, 256, 7168, 2048, True),  # DeepSeek-V3 prefill
        (32768, 8, 256, 7168, 2048, True),  # 294,656 worst-case rows: [M, H] just below 2**31 elements
        (65536, 8, 256, 7168, 2048, False),  # [M, H] past int32
    ],
)
def test_gluon_rule(t, k, e, h, i, gluon):
    """The gluon form from :data:`~tilegemm.heuristics.gluon.MOE_FP8_MIN_ROWS_PER_EXPERT` routed rows per expert,
    where its buffers stay in int32 (a call it could not take would fall back to pytorch, not to cutile)."""
    from tilegemm.heuristics import gluon as gluon_heuristics

    assert gluon_heuristics.prefers_fp8_moe_experts(t, k, e, h, i) == gluon
    if t * k >= gluon_heuristics.MOE_FP8_MIN_ROWS_PER_EXPERT * e:
        assert gluon_heuristics.moe_fp8_buffers_fit(t, k, e, h, i) == gluon
