"""``tilegemm.moe_experts`` against the float64 formula: backend x dtype x shapes, checks, determinism.

The formula: ``out[t] = sum_j w[t, j] * (act(x[t] @ Wg_e.T) * (x[t] @ Wu_e.T)) @ W2_e.T`` over the slots j
whose expert e is in ``[0, E)``, in float64 on the same (rounded) inputs. Shapes cover one token, top-1,
experts with no tokens, expert-parallel sentinel ids (-1 and >= E), H and I that are not multiples of
the tiles, decode- and prefill-sized routings. The ``cutile`` cases need a GPU (marked ``gpu``); the
``pytorch`` ones run anywhere.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tilegemm
from tilegemm.heuristics import cutile as heuristics
from tilegemm.testing import MOE_ACTIVATIONS, backend_device_params, calc_diff

BAR = 1e-5  # bf16 intermediate and bf16 per-slot outputs vs exact float64 math

# (T, k, E, H, I, sentinels)
SHAPES = [
    (1, 8, 16, 256, 128, False),  # one token (decode)
    (5, 1, 4, 128, 64, False),  # top-1
    (7, 2, 64, 192, 96, False),  # most experts get no token; H, I not multiples of the 128/64 tiles
    (33, 4, 8, 136, 72, True),  # sentinels -1 and >= E; H, I only multiples of 8
    (300, 8, 8, 256, 256, False),  # prefill-sized: 128-row tiles, several blocks per expert
]
IDS = [f"T{t}-k{k}-E{e}-H{h}-I{i}" + ("-sentinel" if s else "") for t, k, e, h, i, s in SHAPES]


def _inputs(t, k, e, h, i, sentinels, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / math.sqrt(h)).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) / math.sqrt(i)).to(dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if k <= e else None
    if sentinels:
        drop = torch.rand(t, k, generator=g) < 0.25
        ids = torch.where(drop, torch.where(torch.rand(t, k, generator=g) < 0.5, -1, e), ids)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    return [z.to(device) for z in (x, ids.to(torch.int64), weights, w13, w2)]


def _formula(x, ids, weights, w13, w2, activation="silu"):
    """float64 ``sum_j w * down(act(gate) * up)`` per token, dropped slots contributing nothing (on ``x``'s device)."""
    device = x.device
    x, weights, w13, w2 = (z.double().cpu() for z in (x, weights, w13, w2))
    ids = ids.cpu()
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    act = MOE_ACTIVATIONS[activation]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if 0 <= e < w13.shape[0]:
                gu = w13[e] @ x[t]
                out[t] += weights[t, j] * (w2[e] @ (act(gu[:inter]) * gu[inter:]))
    return out.to(device)


BACKENDS = backend_device_params()


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_matches_formula(strict, backend, device, shape):
    args = _inputs(*shape, torch.bfloat16, device)
    out = tilegemm.moe_experts(*args, backend=backend)
    assert out.shape == args[0].shape and out.dtype == torch.bfloat16 and out.device == args[0].device
    assert calc_diff(out, _formula(*args)) < BAR
    assert torch.equal(out, tilegemm.moe_experts(*args, backend=backend)), "reruns must be bitwise identical"


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_activations(strict, backend, device, activation):
    args = _inputs(9, 2, 4, 128, 64, False, torch.bfloat16, device)
    out = tilegemm.moe_experts(*args, activation=activation, backend=backend)
    assert calc_diff(out, _formula(*args, activation)) < BAR


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_reference_other_dtypes(dtype):
    args = _inputs(6, 2, 4, 64, 32, True, dtype, "cpu")
    out = tilegemm.moe_experts(*args, activation="gelu", backend="pytorch")
    assert out.dtype == dtype
    assert calc_diff(out, _formula(*args, "gelu")) < (1e-5 if dtype == torch.float16 else 1e-10)


def test_every_slot_dropped_gives_zeros():
    x, ids, w, w13, w2 = _inputs(4, 2, 4, 64, 32, False, torch.bfloat16, "cpu")
    out = tilegemm.moe_experts(x, torch.full_like(ids, -1), w, w13, w2, backend="pytorch")
    assert torch.equal(out, torch.zeros_like(out))


def test_matches_unfused_experts_path():
    """The reference equals the routing + m-grouped + combine path on the same rounding points."""
    from tilegemm.routing import moe_route, permute_tokens, unpermute_tokens

    x, ids, w, w13, w2 = _inputs(20, 4, 8, 128, 64, True, torch.bfloat16, "cpu")
    r = moe_route(ids, 8)
    a = permute_tokens(x, r)
    gu = torch.empty(a.shape[0], 128, dtype=torch.float32)
    tilegemm.m_grouped_bf16_gemm_nt_contiguous(a, w13, gu, r.m_indices, backend="pytorch")
    hmid = (F.silu(gu[:, :64]) * gu[:, 64:]).bfloat16()
    y = torch.empty(a.shape[0], 128, dtype=torch.float32)
    tilegemm.m_grouped_bf16_gemm_nt_contiguous(hmid, w2, y, r.m_indices, backend="pytorch")
    wr = torch.where(r.src_slot >= 0, w.reshape(-1)[r.src_slot.clamp(min=0)], 0.0)
    expect = unpermute_tokens((y * wr[:, None]).bfloat16(), r, None)
    assert torch.equal(tilegemm.moe_experts(x, ids, w, w13, w2, backend="pytorch"), expect)


@pytest.mark.parametrize(
    ("change", "err", "needle"),
    [
        (lambda a: a.update(hidden=a["hidden"][0]), ValueError, "hidden"),
        (lambda a: a.update(topk_ids=a["topk_ids"].float()), TypeError, "topk_ids"),
        (lambda a: a.update(topk_ids=a["topk_ids"][:2]), ValueError, "topk_ids"),
        (lambda a: a.update(topk_weights=a["topk_weights"][:, :1]), ValueError, "topk_weights"),
        (lambda a: a.update(w13=a["w13"][:, :-1]), ValueError, "w13"),
        (lambda a: a.update(w13=a["w13"].float()), TypeError, "w13"),
        (lambda a: a.update(w2=a["w2"][:, :, :-1]), ValueError, "w2"),
        (lambda a: a.update(activation="relu"), ValueError, "activation"),
    ],
)
def test_bad_arguments_are_named(change, err, needle):
    x, ids, w, w13, w2 = _inputs(4, 2, 4, 64, 32, False, torch.bfloat16, "cpu")
    kwargs = dict(hidden=x, topk_ids=ids, topk_weights=w, w13=w13, w2=w2)
    change(kwargs)
    with pytest.raises(err, match=needle):
        tilegemm.moe_experts(**kwargs, backend="pytorch")


@pytest.mark.gpu
def test_cutile_graph_capture_replays_new_routing(strict):
    """One CUDA graph replayed with new token values and new routing: no host sync inside the op."""
    x, ids, w, w13, w2 = _inputs(64, 8, 32, 256, 128, True, torch.bfloat16, "cuda")
    tilegemm.moe_experts(x, ids, w, w13, w2, backend="cutile")  # JIT outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tilegemm.moe_experts(x, ids, w, w13, w2, backend="cutile")
    x2, ids2, w_2, _, _ = _inputs(64, 8, 32, 256, 128, True, torch.bfloat16, "cuda", seed=1)
    x.copy_(x2), ids.copy_(ids2), w.copy_(w_2)
    graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(out, _formula(x, ids, w, w13, w2)) < BAR


@pytest.mark.gpu
@pytest.mark.parametrize("variant", heuristics.MOE_VARIANTS)
@pytest.mark.parametrize("shape", [*SHAPES, (40, 8, 16, 256, 128, True)], ids=[*IDS, "T40-k8-E16-sentinel"])
def test_cutile_every_path(strict, monkeypatch, variant, shape):
    """Each fused path forced (``TILEGEMM_MOE_VARIANT``) on every shape, whichever the heuristics would pick, and on
    experts with 20 routed slots each and sentinels: formula, bitwise reruns."""
    monkeypatch.setenv(heuristics.MOE_VARIANT_ENV, variant)
    args = _inputs(*shape, torch.bfloat16, "cuda")
    out = tilegemm.moe_experts(*args, backend="cutile")
    assert calc_diff(out, _formula(*args)) < BAR
    assert torch.equal(out, tilegemm.moe_experts(*args, backend="cutile"))


def test_moe_variant_env_is_checked(monkeypatch):
    monkeypatch.setenv(heuristics.MOE_VARIANT_ENV, "fastest")
    with pytest.raises(ValueError, match="TILEGEMM_MOE_VARIANT"):
        heuristics.choose(heuristics.problem("moe", "bf16", 8, 256, 128, 132, groups=16))  # as the host path reads it


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "k", "e", "h", "i"), [(1, 8, 128, 2048, 768), (512, 8, 128, 2048, 768), (64, 2, 8, 4096, 1024)]
)
def test_cutile_model_sizes(strict, t, k, e, h, i):
    """Qwen3-30B-A3B-sized and Mixtral-like (I reduced) layers against the pytorch backend's exact result."""
    args = _inputs(t, k, e, h, i, False, torch.bfloat16, "cuda")
    out = tilegemm.moe_experts(*args, backend="cutile")
    ref = tilegemm.moe_experts(*args, backend="pytorch")
    assert calc_diff(out, ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "k", "e", "bt"), [(1, 8, 128, 8), (33, 4, 16, 8), (300, 8, 8, 64), (64, 8, 256, 16), (4096, 8, 128, 64)]
)
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_cutile_block_routing_matches_moe_route(t, k, e, bt, id_dtype):
    """The block path's two routing kernels lay the slots out exactly as ``moe_route``'s stable sort, sentinels,
    garbage ids and experts past a multiple of the routing CTA's expert count included; the slots split into one
    chunk, several chunks of one step, and chunks of several steps (4096 tokens)."""
    from tilegemm.ops.cutile import launch, moe_blocks
    from tilegemm.routing import max_padded_rows, moe_route

    g = torch.Generator(device="cuda").manual_seed(t * k + e)
    ids = torch.randint(0, e, (t, k), device="cuda", generator=g)
    ids[0, 0] = -1
    ids[-1, -1] = e  # an expert-parallel sentinel past the last expert
    ids[t // 2, 0] = 2**40 if id_dtype == torch.int64 else 2**30 + 3  # garbage outside int32 / [0, E)
    ids = ids.to(id_dtype)
    weights = torch.rand(t, k, device="cuda", generator=g).bfloat16()
    rows = max_padded_rows(t, k, e, bt)
    routed = moe_blocks.routing(ids, weights, e, bt, rows)
    for kernel, grid, args in routed.launches:
        launch.launch(kernel, grid, args)
    tokens, row_weight, dest, block_expert = routed.row_token, routed.row_weight, routed.dest, routed.block_expert
    ref = moe_route(ids.clamp(min=-1, max=e).long(), e, alignment=bt)

    assert torch.equal(dest.long(), ref.dest_row.view(t, k))
    assert torch.equal(block_expert, ref.m_indices[::bt])
    held = ref.src_slot >= 0
    assert torch.equal(tokens[held].long(), ref.src_slot[held] // k)
    assert torch.equal(row_weight[held], weights.reshape(-1).float()[ref.src_slot[held]])
    assert not tokens[~held].any() and not row_weight[~held].any()  # rows without a slot: token 0, weight 0
