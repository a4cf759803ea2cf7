"""CPU tests of tilegemm.routing: expert sort, worst-case sizes, alignment, permute / unpermute round trips."""

from __future__ import annotations

import itertools

import pytest
import torch

from tilegemm.routing import max_padded_rows, moe_route, permute_tokens, unpermute_tokens


def _random_ids(t: int, k: int, e: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # k distinct experts per token, as a router's top-k gives
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)


def _check_layout(ids: torch.Tensor, e: int, align: int) -> None:
    t, k = ids.shape
    r = moe_route(ids, e, align)
    m = max_padded_rows(t, k, e, align)
    assert r.m_indices.shape == (m,) and r.src_slot.shape == (m,) and m % align == 0
    flat = ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < e)
    # counts and psum offsets
    expect_counts = torch.bincount(flat[valid], minlength=e)
    assert torch.equal(r.counts.long(), expect_counts)
    assert torch.equal(r.psum_offsets.long(), torch.cumsum(expect_counts, 0))
    # every valid slot has one row, holding its own expert, and src_slot inverts dest_row
    for s in range(t * k):
        row = int(r.dest_row[s])
        if valid[s]:
            assert row >= 0 and int(r.m_indices[row]) == int(flat[s]) and int(r.src_slot[row]) == s
        else:
            assert row == -1
    # rows not filled by a slot are padding: -1 in both
    filled = torch.zeros(m, dtype=torch.bool)
    filled[r.dest_row[valid]] = True
    assert torch.all(r.m_indices[~filled] == -1) and torch.all(r.src_slot[~filled] == -1)
    # alignment: every block of `align` rows holds one expert or padding only, and segments start aligned
    blocks = r.m_indices.view(-1, align)
    for blk in blocks:
        ex = blk[blk >= 0].unique()
        assert ex.numel() <= 1
        if ex.numel() == 1:
            assert int(blk[0]) == int(ex[0]), "a segment must start at its block's first row"
    # experts appear in increasing order, tokens in order within an expert (stable)
    rows_valid = r.m_indices[filled]
    assert torch.all(rows_valid[1:] >= rows_valid[:-1])
    for x in range(e):
        slots = r.src_slot[r.m_indices == x]
        assert torch.all(slots[1:] > slots[:-1])
    # compact (psum) order
    assert torch.equal(r.sorted_slot[r.compact_row], torch.arange(t * k))
    sorted_ids = flat[r.sorted_slot]
    nvalid = int(valid.sum())
    assert torch.all(sorted_ids[:nvalid] >= 0) and torch.all(sorted_ids[:nvalid] < e)
    assert torch.all(sorted_ids[:nvalid][1:] >= sorted_ids[:nvalid][:-1])


@pytest.mark.parametrize(
    "t,k,e,align", [(1, 1, 1, 128), (37, 2, 8, 128), (300, 8, 64, 128), (64, 6, 160, 128), (50, 4, 16, 16)]
)
def test_layout_random(t, k, e, align):
    _check_layout(_random_ids(t, k, e, seed=t * 1000 + e), e, align)


def test_empty_experts_and_dropped_slots():
    ids = torch.tensor([[3, -1], [3, 5], [7, 3], [-1, 5]], dtype=torch.int32)  # experts 0,1,2,4,6 empty; 7 is >= E
    _check_layout(ids, 7, 128)
    r = moe_route(ids, 7, 128)
    assert r.counts.tolist() == [0, 0, 0, 3, 0, 2, 0]
    assert r.psum_offsets.tolist() == [0, 0, 0, 3, 3, 5, 5]
    # expert 3 occupies rows [0, 3), expert 5 starts at the next 128 boundary
    assert r.m_indices[:3].tolist() == [3, 3, 3] and int(r.m_indices[128]) == 5


def test_all_slots_dropped():
    ids = torch.full((5, 2), -1, dtype=torch.int32)
    r = moe_route(ids, 4)
    assert torch.all(r.m_indices == -1) and torch.all(r.dest_row == -1) and r.counts.sum() == 0


def test_worst_case_size_is_tight_and_safe():
    """The static size bounds every routing, and some routing needs all of it."""
    for t, k, e, align in [(10, 2, 8, 128), (200, 4, 16, 128), (3, 2, 32, 128), (130, 1, 2, 128)]:
        m = max_padded_rows(t, k, e, align)
        need = []
        for seed in range(5):
            ids = _random_ids(t, k, e, seed) if k <= e else torch.randint(0, e, (t, k), dtype=torch.int32)
            r = moe_route(ids, e, align)
            padded = int(((r.counts.long() + align - 1) // align * align).sum())
            assert padded <= m
            need.append(padded)
        # adversarial routing: one slot per expert as far as slots go, the rest on expert 0
        slots = t * k
        flat = torch.zeros(slots, dtype=torch.int32)
        flat[: min(e, slots)] = torch.arange(min(e, slots), dtype=torch.int32)
        r = moe_route(flat.view(t, k), e, align)
        padded = int(((r.counts.long() + align - 1) // align * align).sum())
        assert padded <= m
        assert m - padded < align * 2, (t, k, e, m, padded)


def test_max_padded_rows_formula():
    assert max_padded_rows(0, 8, 64) == 0
    assert max_padded_rows(1, 1, 1) == 128
    assert max_padded_rows(4, 2, 256) == 8 * 128  # 8 slots, at most 8 non-empty experts
    assert max_padded_rows(1024, 1, 1) == 1024  # one expert: no padding beyond the next multiple of 128
    with pytest.raises(ValueError):
        max_padded_rows(-1, 1, 1)


@pytest.mark.parametrize("layout", ["indices", "psum"])
def test_round_trip_expert_mlp(layout):
    """permute -> per-expert linear map -> unpermute equals the direct per-token MoE sum."""
    t, k, e, h, n = 45, 3, 6, 16, 10
    g = torch.Generator().manual_seed(7)
    ids = _random_ids(t, k, e, 11)
    ids[4, 1] = -1  # one dropped slot
    w = torch.rand(t, k, generator=g, dtype=torch.float64)
    x = torch.randn(t, h, generator=g, dtype=torch.float64)
    mats = torch.randn(e, n, h, generator=g, dtype=torch.float64)
    r = moe_route(ids, e)
    xs = permute_tokens(x, r, layout)
    ys = torch.zeros(xs.shape[0], n, dtype=torch.float64)
    if layout == "indices":
        for row in range(xs.shape[0]):
            ex = int(r.m_indices[row])
            if ex >= 0:
                ys[row] = mats[ex] @ xs[row]
            else:
                assert torch.all(xs[row] == 0)
    else:
        start = 0
        for ex, end in enumerate(r.psum_offsets.tolist()):
            ys[start:end] = xs[start:end] @ mats[ex].T
            start = end
        assert torch.all(xs[start:] == 0)  # dropped slots sort last, zero rows
    out = unpermute_tokens(ys, r, w.to(torch.float32), layout, out_dtype=torch.float64)
    ref = torch.zeros(t, n, dtype=torch.float64)
    for ti, j in itertools.product(range(t), range(k)):
        ex = int(ids[ti, j])
        if 0 <= ex < e:
            ref[ti] += w[ti, j].float().double() * (mats[ex] @ x[ti])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_permute_fp8_rows_and_unpermute_without_weights():
    t, k, e = 9, 2, 4
    ids = _random_ids(t, k, e, 3)
    x = torch.randn(t, 32).to(torch.float8_e4m3fn)
    r = moe_route(ids, e)
    xs = permute_tokens(x, r)
    assert xs.dtype == torch.float8_e4m3fn and xs.shape == (max_padded_rows(t, k, e), 32)
    for row in range(xs.shape[0]):
        s = int(r.src_slot[row])
        expect = x[s // k].view(torch.uint8) if s >= 0 else torch.zeros(32, dtype=torch.uint8)
        assert torch.equal(xs[row].view(torch.uint8), expect)
    # unweighted combine of an identity expert sums each token k times
    xf = torch.randn(t, 5)
    back = unpermute_tokens(permute_tokens(xf, r), r)
    torch.testing.assert_close(back, k * xf)


def _index_gradients(x, y, r, layout, dout_x, dout_y):
    """Gradients through plain ``index_select`` gathers (autograd's own adjoints), the reference."""
    tokens = torch.where(
        (r.src_slot if layout == "indices" else r.sorted_slot) >= 0,
        torch.div(r.src_slot if layout == "indices" else r.sorted_slot, r.top_k, rounding_mode="floor"),
        -1,
    )
    if layout == "psum":
        tokens = torch.where(r.dest_row[r.sorted_slot] >= 0, tokens, -1)
        rows = torch.where(r.dest_row >= 0, r.compact_row, r.dest_row)
    else:
        rows = r.dest_row
    keep_t = (tokens >= 0)[:, None]
    xs = torch.where(keep_t, x.index_select(0, tokens.clamp(min=0)), 0.0)
    keep_r = (rows >= 0)[:, None]
    out = torch.where(keep_r, y.index_select(0, rows.clamp(min=0)), 0.0).view(r.num_tokens, r.top_k, y.shape[1]).sum(1)
    return torch.autograd.grad((xs, out), (x, y), (dout_x, dout_y))


@pytest.mark.parametrize("layout", ["indices", "psum"])
@pytest.mark.parametrize("t,k,e", [(45, 3, 6), (1, 1, 1), (0, 2, 4), (20, 8, 160)])
def test_permute_unpermute_gradients_are_adjoint_gathers(layout, t, k, e):
    """The backward of permute is the gather-sum over each token's k rows and that of unpermute a row gather:
    equal to autograd through index_select (float64), and bitwise identical on rerun (no scatter-add)."""
    ids = _random_ids(t, k, e, 5) if t else torch.zeros(0, k, dtype=torch.int32)
    if t > 4:
        ids[4, 0] = -1  # a dropped slot
    r = moe_route(ids, e, 16)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(t, 7, generator=g, dtype=torch.float64, requires_grad=True)
    rows = max_padded_rows(t, k, e, 16) if layout == "indices" else t * k
    y = torch.randn(rows, 5, generator=g, dtype=torch.float64, requires_grad=True)
    dxs = torch.randn(rows, 7, generator=g, dtype=torch.float64)
    dout = torch.randn(t, 5, generator=g, dtype=torch.float64)
    xs = permute_tokens(x, r, layout)
    out = unpermute_tokens(y, r, None, layout)
    got = torch.autograd.grad((xs, out), (x, y), (dxs, dout))
    want = _index_gradients(x, y, r, layout, dxs, dout)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    outs = (permute_tokens(x, r, layout), unpermute_tokens(y, r, None, layout))
    again = torch.autograd.grad(outs, (x, y), (dxs, dout))
    assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_permute_gradient_sums_in_fp32_once():
    """A bf16 token's gradient is its k rows' sum in fp32, rounded once to bf16."""
    t, k, e = 30, 8, 16
    r = moe_route(_random_ids(t, k, e, 9), e)
    x = torch.randn(t, 64, dtype=torch.bfloat16, requires_grad=True)
    dxs = torch.randn(r.src_slot.shape[0], 64, dtype=torch.bfloat16)
    (dx,) = torch.autograd.grad(permute_tokens(x, r), x, dxs)
    want = torch.zeros(t, 64, dtype=torch.float32)
    for row, slot in enumerate(r.src_slot.tolist()):
        if slot >= 0:
            want[slot // k] += dxs[row].float()
    assert torch.equal(dx, want.to(torch.bfloat16))


def test_bad_inputs():
    with pytest.raises(ValueError):
        moe_route(torch.zeros(4, dtype=torch.int32), 4)
    with pytest.raises(TypeError):
        moe_route(torch.zeros(4, 2), 4)
    with pytest.raises(ValueError):
        moe_route(torch.zeros(4, 2, dtype=torch.int32), 0)


@pytest.mark.parametrize("seed", range(4))
def test_aligned_layout_helpers_match_moe_route(seed):
    """expert_counts / expert_ends / aligned_blocks describe moe_route's aligned layout: the rows of expert e are
    ``[starts[e], ends[e])``, each block's expert is the m_indices of its first row, dropped ids count for none."""
    from tilegemm.routing import aligned_blocks, expert_counts, expert_ends

    g = torch.Generator().manual_seed(seed)
    experts = 9
    ids = torch.randint(-2, experts + 2, (70, 3), generator=g)  # dropped ids on both sides
    routing = moe_route(ids, experts, alignment=128)
    counts = expert_counts(ids, experts)
    assert torch.equal(counts, routing.counts)
    ends = expert_ends(counts, 128)
    rows = routing.m_indices.shape[0]
    starts, block_expert = aligned_blocks(ends, rows, 128)
    assert torch.equal(block_expert, torch.where(routing.m_indices[::128] >= 0, routing.m_indices[::128], -1))
    for e in range(experts):
        in_e = torch.nonzero(routing.m_indices == e).flatten()
        if in_e.numel():
            assert int(in_e[0]) == int(starts[e]) and int(in_e[-1]) + 1 == int(ends[e])
        assert int(starts[e]) % 128 == 0 and int(starts[e + 1]) >= int(ends[e])
    assert int(starts[-1]) <= rows
