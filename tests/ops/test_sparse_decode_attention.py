"""``sparse_decode_attention``: one query row per sequence over the keys its indices select.

Bars (DESIGN.md): calc_diff < 1e-5 against float64 on the operands' values (a bf16 output rounded once; the fp32
reference itself is < 1e-12 from float64 in fp32); zeros for a row whose selected keys are all hidden; every output
element written; bitwise-identical reruns, through the op and from a CUDA graph (GPU tests, the ``gluon`` kernel).
"""

from __future__ import annotations

import pytest
import torch

import tilegemm
from tilegemm.ops.reference.attention import gather_rows
from tilegemm.testing import calc_diff

# (batch, heads, key heads, keys, head dim, value dim, selected): DeepSeek-V3.2's shape, grouped heads, a single
# index, awkward dims, every key selected.
SHAPES = [
    (1, 128, 128, 4097, 192, 128, 2048),
    (2, 16, 16, 300, 192, 128, 100),
    (3, 8, 2, 77, 64, 64, 33),
    (2, 4, 1, 50, 128, 96, 1),
    (2, 6, 3, 129, 80, 40, 129),
]
MASKS = ["none", "bool", "additive", "row_hidden"]


def _case(shape, mask_kind: str, dtype=torch.bfloat16, index_dtype=torch.int32, device="cpu", seed: int = 0):
    batch, heads, kv_heads, keys, dim, dim_v, count = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, dim, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, keys, dim, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, keys, dim_v, generator=g).to(dtype)
    indices = torch.stack([torch.randperm(keys, generator=g)[:count] for _ in range(batch)]).to(index_dtype)
    mask = None
    if mask_kind != "none":
        visible = torch.rand(batch, keys, generator=g) > 0.25
        if mask_kind == "row_hidden":
            visible[0] = False
        mask = visible
        if mask_kind == "additive":
            mask = torch.zeros(batch, keys, dtype=dtype).masked_fill(~visible, float("-inf"))
    args = [t.to(device) if isinstance(t, torch.Tensor) else t for t in (q, k, v, indices)]
    return (*args, dim**-0.5, None if mask is None else mask.to(device))


def _exact(q, k, v, indices, scale, mask) -> torch.Tensor:
    """The op's formula in float64 on the operands' values, head by head (zeros for an all-hidden row)."""
    batch, heads, _ = q.shape
    groups = heads // k.shape[1]
    out = torch.zeros(batch, heads, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        rows = indices[b].long().cpu()
        logits_bias = torch.zeros(len(rows), dtype=torch.float64)
        if mask is not None:
            at = mask[b].cpu()[rows]
            logits_bias = at.double() if at.dtype != torch.bool else torch.where(at, 0.0, float("-inf")).double()
        for h in range(heads):
            keys = k[b, h // groups].cpu().double()[rows]
            logits = keys @ q[b, h].cpu().double() * scale + logits_bias
            if torch.isinf(logits).all():
                continue
            out[b, h] = torch.softmax(logits, 0) @ v[b, h // groups].cpu().double()[rows]
    return out


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pytorch_matches_float64(shape, mask_kind):
    args = _case(shape, mask_kind)
    out = tilegemm.sparse_decode_attention(*args, backend="pytorch")
    assert out.shape == (shape[0], shape[1], shape[5]) and out.dtype == torch.bfloat16
    exact = _exact(*args)
    assert calc_diff(out.double(), exact) < 1e-5
    if mask_kind == "row_hidden":
        assert (out[0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_pytorch_dtypes(dtype, index_dtype):
    args = _case(SHAPES[2], "bool", dtype=dtype, index_dtype=index_dtype)
    out = tilegemm.sparse_decode_attention(*args, backend="pytorch")
    assert out.dtype == dtype
    assert calc_diff(out.double(), _exact(*args)) < (1e-12 if dtype == torch.float32 else 1e-5)


def test_strided_operands_and_automatic_choice():
    """q, k and v need only a contiguous last dimension; on the CPU the automatic choice is the reference."""
    q, k, v, indices, scale, mask = _case(SHAPES[1], "bool")
    wide_q = torch.zeros(q.shape[0], q.shape[1], 2 * q.shape[2], dtype=q.dtype)
    wide_q[..., : q.shape[2]] = q
    k_heads_last = k.transpose(1, 2).contiguous().transpose(1, 2)  # [B, Hk, T, D] with T-major storage
    out = tilegemm.sparse_decode_attention(wide_q[..., : q.shape[2]], k_heads_last, v, indices, scale, mask)
    assert torch.equal(out, tilegemm.sparse_decode_attention(q, k, v, indices, scale, mask, backend="pytorch"))


def test_gather_rows_is_exact():
    """Row gathers as 8-byte words where the rows allow, element-wise otherwise: the same bits either way."""
    g = torch.Generator().manual_seed(3)
    for dim in (192, 80, 5):
        x = torch.randn(2, 3, 40, dim, generator=g).bfloat16()
        indices = torch.randint(0, 40, (2, 7), generator=g)
        expected = torch.stack([x[b][:, indices[b]] for b in range(2)])
        assert torch.equal(gather_rows(x, indices), expected)
        assert torch.equal(
            gather_rows(x[:, :, 1:], indices % 39), torch.stack([x[b, :, 1:][:, indices[b] % 39] for b in range(2)])
        )


def _bad(change):
    q, k, v, indices, scale, mask = _case(SHAPES[1], "bool")
    args = dict(q=q, k=k, v=v, indices=indices, scale=scale, mask=mask)
    change(args)
    return args


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a: a.update(q=a["q"].long()), TypeError, "q: got dtype torch.int64"),
        (lambda a: a.update(k=a["k"].float()), TypeError, "k: got dtype torch.float32"),
        (lambda a: a.update(q=a["q"][:, None]), ValueError, "q: got a 4-D tensor"),
        (lambda a: a.update(v=a["v"][:, :, :-1]), ValueError, r"v: got shape .*\(\[B, Hk, T, Dv\]"),
        (lambda a: a.update(k=a["k"][:, :, :, :-1]), ValueError, r"k: got shape .*q's batch and head dim"),
        (lambda a: a.update(k=a["k"][:, :3], v=a["v"][:, :3]), ValueError, "expected a divisor of q's 16 heads"),
        (lambda a: a.update(q=a["q"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "last dimension"),
        (lambda a: a.update(indices=a["indices"].float()), TypeError, "indices: got dtype torch.float32"),
        (lambda a: a.update(indices=a["indices"][:, :0]), ValueError, "K >= 1"),
        (lambda a: a.update(scale=0.0), ValueError, "scale: got 0.0"),
        (lambda a: a.update(scale=float("nan")), ValueError, "scale: got nan"),
        (lambda a: a.update(scale="1"), TypeError, "scale: got str"),
        (lambda a: a.update(mask=a["mask"][:, :-1]), ValueError, r"mask: got shape .*\[B, T\]"),
        (lambda a: a.update(mask=a["mask"].int()), TypeError, "mask: got dtype torch.int32"),
        (lambda a: a.update(stream=1), TypeError, "stream: got int"),
    ],
)
def test_bad_input(change, error, message):
    with pytest.raises(error, match=message):
        tilegemm.sparse_decode_attention(**_bad(change))


@pytest.mark.parametrize("backend", ["pytorch", pytest.param("gluon", marks=pytest.mark.gpu)])
def test_no_keys_gives_zeros(backend):
    """A cache with no keys (T = 0): every index selects nothing, every row is zeros."""
    device = "cuda" if backend == "gluon" else "cpu"
    q, k, v = torch.randn(2, 4, 64), torch.zeros(2, 2, 0, 64), torch.zeros(2, 2, 0, 32)
    args = [t.bfloat16().to(device) for t in (q, k, v)] + [torch.zeros(2, 3, dtype=torch.int32, device=device), 0.5]
    out = tilegemm.sparse_decode_attention(*args, backend=backend)
    assert out.shape == (2, 4, 32) and not out.any()


@pytest.mark.parametrize("backend", ["pytorch", pytest.param("gluon", marks=pytest.mark.gpu)])
def test_indices_outside_the_keys_select_nothing(backend):
    """``-1`` padding (and any index outside ``[0, T)``) selects no key: the same as leaving it out."""
    device = "cuda" if backend == "gluon" else "cpu"
    q, k, v, indices, scale, mask = _case(SHAPES[2], "bool", device=device)
    padded = indices.clone()
    padded[:, ::3] = -1
    padded[0, 1] = k.shape[2]
    padded[1, 1] = -(2**31)
    kept = [padded[b][(padded[b] >= 0) & (padded[b] < k.shape[2])] for b in range(padded.shape[0])]
    got = tilegemm.sparse_decode_attention(q, k, v, padded, scale, mask, backend=backend)
    for b, rows in enumerate(kept):
        want = tilegemm.sparse_decode_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], rows[None], scale,
                                                mask[b : b + 1], backend="pytorch")  # fmt: skip
        assert calc_diff(got[b : b + 1].double().cpu(), want.double().cpu()) < 1e-5


# ---------------------------------------------------------------------------------------------- the gluon kernel

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gluon_matches_float64(shape, mask_kind, monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    args = _case(shape, mask_kind, device="cuda", index_dtype=torch.int64 if shape[0] == 2 else torch.int32)
    out = tilegemm.sparse_decode_attention(*args, backend="gluon")
    assert not torch.isnan(out).any()
    assert calc_diff(out.double().cpu(), _exact(*args)) < 1e-5
    if mask_kind == "row_hidden":
        assert (out[0] == 0).all()
    again = tilegemm.sparse_decode_attention(*args, backend="gluon")
    assert torch.equal(out.view(torch.uint8), again.view(torch.uint8))


@gpu
@pytest.mark.parametrize("programs_per_sm", [1, 8, 64], ids=lambda n: f"pps{n}")
def test_gluon_splits(programs_per_sm, monkeypatch):
    """One split per head (the output written directly), several (merged by the combine kernel), one per block."""
    from tilegemm.backend import hot_lane
    from tilegemm.ops.gluon import sparse_attention

    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setattr(sparse_attention, "PROGRAMS_PER_SM", programs_per_sm)
    hot_lane.clear_hot_lane()  # a replay keeps the split of the call it replays
    args = _case((2, 64, 64, 3000, 192, 128, 700), "bool", device="cuda")
    out = tilegemm.sparse_decode_attention(*args)
    assert calc_diff(out.double().cpu(), _exact(*args)) < 1e-5


@gpu
def test_gluon_is_the_automatic_choice_and_graph_capturable(monkeypatch):
    """On a Hopper GPU the automatic choice is the kernel; replayed from a CUDA graph it gives the eager bits."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    args = _case(SHAPES[0], "bool", device="cuda")
    eager = tilegemm.sparse_decode_attention(*args)
    assert torch.equal(eager, tilegemm.sparse_decode_attention(*args, backend="gluon"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tilegemm.sparse_decode_attention(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = tilegemm.sparse_decode_attention(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)


@gpu
def test_gluon_empty_batch():
    """No sequences: an empty output and no launch."""
    q, k, v = torch.zeros(0, 4, 64), torch.zeros(0, 4, 10, 64), torch.zeros(0, 4, 10, 32)
    args = [t.bfloat16().cuda() for t in (q, k, v)] + [torch.zeros(0, 3, dtype=torch.int32, device="cuda"), 0.5]
    assert tilegemm.sparse_decode_attention(*args, backend="gluon").shape == (0, 4, 32)


@gpu
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_gluon_replays_give_the_full_paths_bits(mask_kind, monkeypatch):
    """A call whose key has run replays the plan (the compiled kernels relaunched) on its own tensors: the same bits
    as the full path (the JIT launch) on them."""
    from tilegemm.backend import hot_lane
    from tilegemm.ops.gluon import sparse_attention, tma

    made = []
    monkeypatch.setattr(sparse_attention, "Relaunch", lambda *args: made.append(tma.Relaunch(*args)) or made[-1])
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    hot_lane.clear_hot_lane()
    tilegemm.sparse_decode_attention(*_case(SHAPES[1], mask_kind, device="cuda", seed=1))  # the full path
    assert hot_lane._HOT
    assert made and all(r.direct is not None for r in made), "the kernels (no descriptors) relaunch directly"
    for seed in (2, 3):
        args = _case(SHAPES[1], mask_kind, device="cuda", seed=seed)
        replayed = tilegemm.sparse_decode_attention(*args)
        hot_lane.clear_hot_lane()
        full = tilegemm.sparse_decode_attention(*args)
        assert torch.equal(replayed.view(torch.uint8), full.view(torch.uint8))
        assert calc_diff(replayed.double().cpu(), _exact(*args)) < 1e-5


def test_signature_keys_what_the_plan_reads(monkeypatch):
    """The hot-lane key holds every tensor's metadata, the scale and ``set_num_sms``; calls it cannot vouch for
    (a stream, a mask the check would copy, an int scale) take the full path."""
    from tilegemm import config

    sig = tilegemm.sparse_decode_attention.hot_signature
    q, k, v, indices, scale, mask = _case(SHAPES[1], "bool")
    key, operands = sig(q, k, v, indices, scale, mask, None)
    assert all(x is y for x, y in zip(operands, (q, k, v, indices, scale, mask)))
    assert sig(q.clone(), k.clone(), v.clone(), indices.clone(), scale, mask.clone(), None)[0] == key
    wide = torch.ones(2, 600, dtype=torch.bool)[:, ::2]
    for what, values in {
        "a stream": (q, k, v, indices, scale, mask, object()),
        "a strided mask": (q, k, v, indices, scale, wide, None),
        "an int scale": (q, k, v, indices, 1, mask, None),
    }.items():
        assert sig(*values) is None, what
    other = [
        sig(q, k, v, indices, scale, None, None)[0],
        sig(q, k, v, indices.long(), scale, mask, None)[0],
        sig(q, k, v, indices, scale * 2, mask, None)[0],
        sig(q[:1], k[:1], v[:1], indices[:1], scale, mask[:1], None)[0],
    ]
    monkeypatch.setattr(config, "_num_sms", 7)
    other.append(sig(q, k, v, indices, scale, mask, None)[0])
    assert len({key, *other}) == 1 + len(other)
