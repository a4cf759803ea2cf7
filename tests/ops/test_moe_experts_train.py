"""``tilegemm.autograd.moe_experts`` (``moe_experts_forward`` / ``moe_experts_backward``) against autograd on the
float64 formula: backend x dtype x activation x shapes, partial gradients, the saved layout, determinism, checks.

The formula: ``out[t] = sum_j w[t, j] * (act(x[t] @ Wg_e.T) * (x[t] @ Wu_e.T)) @ W2_e.T`` over the slots j whose
expert e is in ``[0, E)``; its gradients to ``x``, ``w``, ``w13`` and ``w2`` come from float64 autograd on the
same (rounded) inputs. The ``cutile`` cases need a GPU (marked ``gpu``); the ``pytorch`` ones run anywhere.
"""

from __future__ import annotations

import math

import pytest
import torch

import tilegemm
import tilegemm.autograd
import tilegemm.custom_ops
from tilegemm.ops import api
from tilegemm.ops.common import MoETrainState
from tilegemm.routing import max_padded_rows
from tilegemm.testing import backend_device_params, calc_diff, moe_experts_float64

# bf16: gate/up, h, y, dy, dgate/dup and each input-gradient row are rounded once each (ops/reference/moe.py);
# measured 2e-7 to 7.8e-6 on these shapes (pytorch backend, every result); the GPU sums in other orders.
BAR_BF16 = 2e-5
BAR_FP32 = 1e-10  # fp32 operands: fp32 products and sums (pytorch backend)
NAMES = ("out", "d_hidden", "d_topk_weights", "d_w13", "d_w2")

# (T, k, E, H, I, sentinels)
SHAPES = [
    (1, 8, 16, 256, 128, False),  # one token
    (5, 1, 4, 128, 64, False),  # top-1
    (7, 2, 64, 192, 96, False),  # most experts get no token; H, I not multiples of the tiles
    (33, 4, 8, 136, 72, True),  # sentinels -1 and >= E; H, I only multiples of 8
    (300, 8, 8, 256, 256, False),  # several 128-row blocks per expert
]
IDS = [f"T{t}-k{k}-E{e}-H{h}-I{i}" + ("-sentinel" if s else "") for t, k, e, h, i, s in SHAPES]
BACKENDS = backend_device_params()


def _inputs(t, k, e, h, i, sentinels, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / math.sqrt(h)).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) / math.sqrt(i)).to(dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    if sentinels:
        drop = torch.rand(t, k, generator=g) < 0.25
        ids = torch.where(drop, torch.where(torch.rand(t, k, generator=g) < 0.5, -1, e), ids)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1).to(dtype)
    grad = torch.randn(t, h, generator=g).to(dtype)
    return [z.to(device) for z in (x, ids, weights, w13, w2)], grad.to(device)


def _truth(x, ids, weights, w13, w2, grad, activation):
    """float64 output and gradients (to x, weights, w13, w2) of the formula, on the CPU."""
    cpu = [t.cpu() for t in (x, ids, weights, w13, w2, grad)]
    exact = moe_experts_float64(*cpu, activation)
    return [exact[name] for name in ("out", "x", "routing_weights", "w13", "w2")]


def _run(args, grad, backend, activation="silu", needs=(True, True, True, True)):
    """Output and the four gradients (``None`` where not requested) of ``tilegemm.autograd.moe_experts``."""
    x, ids, weights, w13, w2 = args
    leaves = [z.detach().clone().requires_grad_(need) for z, need in zip((x, weights, w13, w2), needs, strict=True)]
    with tilegemm.use_backend(backend):
        out = tilegemm.autograd.moe_experts(leaves[0], ids, leaves[1], leaves[2], leaves[3], activation)
        if any(needs):
            out.backward(grad)
    return [out.detach(), *(z.grad for z in leaves)]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_matches_float64_autograd(strict, backend, device, shape, activation):
    args, grad = _inputs(*shape, torch.bfloat16, device)
    results = _run(args, grad, backend, activation)
    for name, mine, exact, like in zip(NAMES, results, _truth(*args, grad, activation), (args[0], args[0], *args[2:])):
        assert mine.shape == like.shape and mine.dtype == like.dtype and mine.device == like.device, name
        assert torch.isfinite(mine).all(), name
        assert calc_diff(mine, exact.to(mine.device)) < BAR_BF16, (name, calc_diff(mine, exact.to(mine.device)))
    again = _run(args, grad, backend, activation)
    assert all(torch.equal(a, b) for a, b in zip(results, again)), "reruns must be bitwise identical"


@pytest.mark.parametrize("backend,device", [p for p in BACKENDS if p.values[0] == "pytorch"])
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
def test_fp32_is_exact(backend, device, activation):
    args, grad = _inputs(33, 4, 8, 136, 72, True, torch.float32, device)
    for name, mine, exact in zip(NAMES, _run(args, grad, backend, activation), _truth(*args, grad, activation)):
        assert calc_diff(mine, exact.to(mine.device)) < BAR_FP32, name


NEEDS = [(True, False, False, False), (False, True, False, False), (False, False, True, True)]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("needs", NEEDS)
def test_only_the_requested_gradients(strict, backend, device, needs):
    """Inputs that need no gradient get none, and the ones computed equal those of a full backward."""
    args, grad = _inputs(33, 4, 8, 136, 72, True, torch.bfloat16, device)
    full = _run(args, grad, backend)
    part = _run(args, grad, backend, needs=needs)
    assert torch.equal(part[0], full[0])
    for name, got, want, need in zip(NAMES[1:], part[1:], full[1:], needs):
        assert (got is not None) == need, name
        if need:
            assert torch.equal(got, want), name


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("sizes", [(0, 2, 4, 64, 32), (5, 0, 4, 64, 32), (5, 2, 4, 64, 0)], ids=["T0", "k0", "I0"])
def test_empty_sizes(strict, backend, device, sizes):
    """An empty size: zero output and zero gradients of the right shapes."""
    t, k, e, h, i = sizes
    x = torch.randn(t, h, device=device).to(torch.bfloat16)
    ids = torch.zeros(t, k, dtype=torch.int64, device=device)
    weights = torch.ones(t, k, device=device, dtype=torch.bfloat16)
    w13 = torch.randn(e, 2 * i, h, device=device).to(torch.bfloat16)
    w2 = torch.randn(e, h, i, device=device).to(torch.bfloat16)
    results = _run([x, ids, weights, w13, w2], torch.ones_like(x), backend)
    for name, got, like in zip(NAMES, results, (x, x, weights, w13, w2)):
        assert got.shape == like.shape and not got.any(), name


@pytest.mark.gpu
def test_cutile_keeps_the_reference_layout(strict):
    """Both backends' forwards keep the same routing (bitwise) and the same rows (to bf16 rounding): a backward
    on either backend can follow a forward on the other."""
    args, _ = _inputs(300, 8, 8, 256, 256, False, torch.bfloat16, "cuda")
    out_c, state_c = api.moe_experts_forward(*args, backend="cutile")
    out_r, state_r = api.moe_experts_forward(*args, backend="pytorch")
    for name in ("row_token", "row_weight", "dest", "ends"):
        assert torch.equal(getattr(state_c, name), getattr(state_r, name)), name
    live = state_r.row_weight > 0
    for name in ("gate_up", "h", "y"):
        assert calc_diff(getattr(state_c, name)[live], getattr(state_r, name)[live]) < 1e-5, name
    assert calc_diff(out_c, out_r) < 1e-5


def test_state_fields_and_sizes():
    """The saved layout: routing fields, worst-case row count, dropped slots at -1."""
    args, _ = _inputs(33, 4, 8, 136, 72, True, torch.bfloat16, "cpu")
    out, state = api.moe_experts_forward(*args, backend="pytorch")
    rows = max_padded_rows(33, 4, 8, 128)
    assert isinstance(state, MoETrainState) and out.shape == (33, 136)
    assert state.row_token.shape == state.row_weight.shape == (rows,) and state.gate_up.shape == (rows, 144)
    ids = args[1]
    dropped = (ids < 0) | (ids >= 8)
    assert torch.equal(state.dest < 0, dropped)
    rows_used = state.dest[~dropped].long()
    assert torch.equal(state.row_token[rows_used].long(), torch.nonzero(~dropped)[:, 0])
    assert int(state.ends[-1]) <= rows and (state.row_weight[state.row_weight != 0] > 0).all()


def test_backward_checks_name_the_argument():
    args, grad = _inputs(5, 2, 4, 64, 32, False, torch.bfloat16, "cpu")
    x, _, weights, w13, w2 = args
    _, state = api.moe_experts_forward(*args, backend="pytorch")
    with pytest.raises(TypeError, match="state"):
        api.moe_experts_backward(grad, x, weights, w13, w2, tuple(state))
    with pytest.raises(ValueError, match="grad_out"):
        api.moe_experts_backward(grad[:3], x, weights, w13, w2, state)
    with pytest.raises(ValueError, match="state.h"):
        api.moe_experts_backward(grad, x, weights, w13, w2, state._replace(h=state.h[:, :8]))
    with pytest.raises(TypeError, match="needs"):
        api.moe_experts_backward(grad, x, weights, w13, w2, state, needs=(True,))
    with pytest.raises(ValueError, match="activation"):
        tilegemm.autograd.moe_experts(x, args[1], weights, w13, w2, "relu")


def test_compiles_as_one_node():
    """``torch.compile(fullgraph=True)`` traces the op (its fake implementation) and gives the eager gradients."""
    args, grad = _inputs(7, 2, 4, 64, 32, False, torch.float32, "cpu")

    def step(x, ids, weights, w13, w2):
        return tilegemm.autograd.moe_experts(x, ids, weights, w13, w2).square().sum()

    eager = [z.clone().requires_grad_(z.is_floating_point()) for z in args]
    compiled = [z.clone().requires_grad_(z.is_floating_point()) for z in args]
    with tilegemm.use_backend("pytorch"):
        step(*eager).backward()
        torch.compile(step, fullgraph=True, backend="eager")(*compiled).backward()
    for a, b in zip(eager, compiled):
        if a.is_floating_point():
            assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-6)


def test_custom_ops_pass_opcheck():
    """The two custom ops: schema, fake (meta) implementation, autograd registration."""
    args, grad = _inputs(7, 2, 4, 64, 32, True, torch.bfloat16, "cpu")
    x, ids, weights, w13, w2 = args
    leaves = [t.clone().requires_grad_() for t in (x, weights, w13, w2)]
    with tilegemm.use_backend("pytorch"):
        torch.library.opcheck(
            tilegemm.custom_ops.moe_experts_train, (leaves[0], ids, leaves[1], leaves[2], leaves[3], "silu")
        )
        _, state = api.moe_experts_forward(*args)
        grad_args = (grad, x, weights, w13, w2, *state, "silu", [True, False, True, True], "pytorch")
        torch.library.opcheck(tilegemm.custom_ops.moe_experts_grad, grad_args)


def test_forward_checks_the_call_once(monkeypatch):
    """``tilegemm.autograd.moe_experts`` checks its arguments once; the forward it runs trusts that check."""
    from tilegemm.ops.checks import moe

    args, _ = _inputs(5, 2, 4, 64, 32, False, torch.bfloat16, "cpu")
    seen = []
    original = moe._moe_tokens_check
    monkeypatch.setattr(moe, "_moe_tokens_check", lambda *a: seen.append(1) or original(*a))
    with tilegemm.use_backend("pytorch"):
        out = tilegemm.autograd.moe_experts(*args)
        assert len(seen) == 1
        assert torch.equal(out, api.moe_experts_forward(*args)[0])  # the same forward, checked once more
    assert len(seen) == 2


def test_backend_argument_reaches_the_forward_and_the_backward(monkeypatch):
    """``backend=`` is an argument of ``tilegemm::moe_experts_train`` (no ``use_backend`` scope needed, so a patched
    module's backend traces under ``torch.compile``), and the backward runs on it too."""
    from tilegemm.backend import registry

    args, grad = _inputs(5, 2, 4, 64, 32, False, torch.bfloat16, "cpu")
    seen = []
    forward, backward = registry.call_checked, api.moe_experts_backward
    monkeypatch.setattr(registry, "call_checked", lambda n, a, b=None: seen.append((n, b)) or forward(n, a, b))
    monkeypatch.setattr(api, "moe_experts_backward", lambda *a, **kw: seen.append(kw["backend"]) or backward(*a, **kw))
    x = args[0].clone().requires_grad_()
    out = tilegemm.autograd.moe_experts(x, *args[1:], backend="pytorch")
    out.backward(grad)
    assert seen == [("moe_experts_forward", "pytorch"), "pytorch"]
    assert torch.equal(out, api.moe_experts_forward(*args, backend="pytorch")[0])
