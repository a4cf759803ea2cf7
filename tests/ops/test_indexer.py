"""CPU tests of tilegemm.indexer: key quantization, the paged KV-cache builder, ks/ke builders."""

from __future__ import annotations

import pytest
import torch

from tilegemm import indexer
from tilegemm.ops import api


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def test_quantize_keys_roundtrip():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(300, 128, generator=g) * torch.rand(300, 1, generator=g) * 10
    keys[7] = 0  # an all-zero key keeps a finite, positive scale
    data, scale = indexer.quantize_keys(keys.bfloat16())
    assert data.dtype == torch.float8_e4m3fn and data.shape == (300, 128)
    assert scale.dtype == torch.float32 and scale.shape == (300,)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    back = data.float() * scale[:, None]
    assert (back[7] == 0).all()
    # each row's amax maps to 448 (the largest e4m3 value), so the relative error is fp8's
    assert torch.allclose(data.float().abs().amax(1)[keys.abs().amax(1) > 0], torch.tensor(448.0))
    assert _calc_diff(back, keys.bfloat16().float()) < 1e-3


def test_quantize_keys_rejects_bad_input():
    with pytest.raises(ValueError):
        indexer.quantize_keys(torch.randn(2, 3, 4))
    with pytest.raises(TypeError):
        indexer.quantize_keys(torch.ones(2, 4, dtype=torch.int32))


@pytest.mark.parametrize("block_kv", [16, 32, 64])
@pytest.mark.parametrize("shuffle", [False, True])
def test_paged_cache_layout_and_roundtrip(block_kv, shuffle):
    g = torch.Generator().manual_seed(block_kv)
    lens = [1, block_kv, 3 * block_kv + 5, 0, 200]
    dim = 64
    keys = [torch.randn(n, dim, generator=g) for n in lens]
    cache, table, ctx = indexer.build_paged_kv_cache(
        keys, block_kv, num_blocks=40, max_blocks=20, generator=g if shuffle else None
    )
    assert cache.dtype == torch.uint8 and cache.shape == (40, block_kv, 1, dim + 4)
    assert table.dtype == torch.int32 and table.shape == (5, 20)
    assert ctx.tolist() == lens
    # DeepGEMM's byte layout, checked by hand for one token: block bytes = block_kv*D keys, then scales
    b, j = 2, 2 * block_kv + 3
    blk, slot = int(table[b, j // block_kv]), j % block_kv
    raw = cache.reshape(40, -1)[blk]
    data, scale = indexer.quantize_keys(keys[b])
    assert torch.equal(raw[slot * dim : (slot + 1) * dim], data[j].view(torch.uint8))
    got_scale = raw[block_kv * dim + 4 * slot : block_kv * dim + 4 * slot + 4].view(torch.float32)
    assert torch.equal(got_scale, scale[j : j + 1])
    # every sequence reads back exactly
    for (d_back, s_back), k in zip(indexer.read_paged_kv_cache(cache, table, ctx), keys):
        d_ref, s_ref = indexer.quantize_keys(k) if k.shape[0] else (d_back, s_back)
        assert torch.equal(d_back.view(torch.uint8), d_ref.view(torch.uint8))
        assert torch.equal(s_back, s_ref)
    # blocks are distinct across sequences
    used = [int(table[b, i]) for b, n in enumerate(lens) for i in range(-(-n // block_kv))]
    assert len(set(used)) == len(used)


def test_paged_cache_rejects_small_sizes():
    keys = [torch.randn(40, 64)]
    with pytest.raises(ValueError):
        indexer.build_paged_kv_cache(keys, 16, num_blocks=2)
    with pytest.raises(ValueError):
        indexer.build_paged_kv_cache(keys, 16, max_blocks=2)


@pytest.mark.parametrize("next_n", [1, 3])
@pytest.mark.parametrize("two_d", [False, True])
def test_reference_paged_op_over_built_cache_equals_plain_op(next_n, two_d):
    """The paged reference op over a built cache equals the plain op over the same (quantized) keys."""
    g = torch.Generator().manual_seed(next_n)
    h, dim, block_kv = 16, 64, 16
    lens = [37, 5, 64, 100]
    keys = [torch.randn(n, dim, generator=g) for n in lens]
    cache, table, ctx = indexer.build_paged_kv_cache(keys, block_kv, num_blocks=32, generator=g)
    batch = len(lens)
    q = torch.randn(batch, next_n, h, dim, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, h, generator=g)
    if two_d:
        ctx_arg = torch.stack([ctx - torch.randint(0, 3, (1,), generator=g).int() * t for t in range(next_n)], 1)
        ctx_arg = ctx_arg.clamp_min(0).int()
    else:
        ctx_arg = ctx
    width = max(lens) + 7
    meta = api.get_paged_mqa_logits_metadata(ctx_arg, block_kv, 4, backend="pytorch")
    paged = api.fp8_paged_mqa_logits(q, cache, w, ctx_arg, table, meta, width, clean_logits=True, backend="pytorch")
    assert paged.shape == (batch * next_n, width)
    for b in range(batch):
        kv = indexer.quantize_keys(keys[b])
        rows = slice(b * next_n, (b + 1) * next_n)
        if two_d:
            ke = ctx_arg[b].clone()
        else:
            ke = ctx[b] - next_n + torch.arange(next_n, dtype=torch.int32) + 1
        ks = torch.zeros_like(ke)
        plain = api.fp8_mqa_logits(q[b], kv, w[rows], ks, ke.int(), backend="pytorch")
        n = lens[b]
        # same exact fp32 formula, different summation order: equal up to fp32 rounding, same -inf mask
        assert torch.equal(torch.isneginf(paged[rows, :n]), torch.isneginf(plain))
        torch.testing.assert_close(paged[rows, :n], plain, rtol=1e-5, atol=1e-5)
        assert torch.isneginf(paged[rows, n:]).all()


def test_causal_windows():
    ks, ke = indexer.causal_windows(4, 10)
    assert ks.tolist() == [0, 0, 0, 0] and ke.tolist() == [7, 8, 9, 10]
    ks, ke = indexer.causal_windows(4, 10, window=8)
    assert ks.tolist() == [0, 0, 1, 2] and ke.tolist() == [7, 8, 9, 10]
    assert ks.dtype == ke.dtype == torch.int32
    with pytest.raises(ValueError):
        indexer.causal_windows(11, 10)


def test_packed_causal_windows_match_per_sequence_causal():
    q_lens, kv_lens = [3, 0, 5, 2], [3, 4, 9, 2]
    ks, ke = indexer.packed_causal_windows(q_lens, kv_lens)
    assert ks.shape == ke.shape == (sum(q_lens),)
    row, base = 0, 0
    for nq, nk in zip(q_lens, kv_lens):
        ks_b, ke_b = indexer.causal_windows(nq, nk)
        assert torch.equal(ks[row : row + nq], ks_b + base)
        assert torch.equal(ke[row : row + nq], ke_b + base)
        row, base = row + nq, base + nk


def test_packed_windows_give_block_diagonal_logits():
    """Packed prefill through the op: each sequence's rows equal that sequence alone."""
    g = torch.Generator().manual_seed(3)
    q_lens, kv_lens, h, dim = [4, 6], [9, 6], 8, 64
    q = torch.randn(sum(q_lens), h, dim, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(sum(q_lens), h, generator=g)
    kv = indexer.quantize_keys(torch.randn(sum(kv_lens), dim, generator=g))
    ks, ke = indexer.packed_causal_windows(q_lens, kv_lens)
    out = api.fp8_mqa_logits(q, kv, w, ks, ke, backend="pytorch")
    ks0, ke0 = indexer.causal_windows(4, 9)
    alone = api.fp8_mqa_logits(q[:4], (kv[0][:9], kv[1][:9]), w[:4], ks0, ke0, backend="pytorch")
    torch.testing.assert_close(out[:4, :9], alone, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isneginf(out[:4, :9]), torch.isneginf(alone))
    assert torch.isneginf(out[:4, 9:]).all()
    assert torch.isneginf(out[4:, :9]).all()


def test_context_parallel_windows():
    seq, cp = 16, 2
    seen = []
    for rank in range(cp):
        pos, ks, ke = indexer.context_parallel_windows(seq, cp, rank)
        assert pos.shape == ks.shape == ke.shape == (seq // cp,)
        assert torch.equal(ke.long(), pos + 1) and (ks == 0).all()
        seen += pos.tolist()
        # zig-zag: equal causal work per rank
        assert int((ke - ks).sum()) == seq * (seq + 1) // 2 // cp
    assert sorted(seen) == list(range(seq))
    with pytest.raises(ValueError):
        indexer.context_parallel_windows(10, 3, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("lens_on_gpu", [True, False])
def test_read_paged_kv_cache_block_ids_on_the_gpu(lens_on_gpu, monkeypatch):
    """On a GPU the used block ids are checked in the read of context_lens (no sync of their own); with
    context_lens on the CPU they follow TILEGEMM_CHECK_VALUES, as the ops' value checks do."""
    cache, table, lens = indexer.build_paged_kv_cache([torch.randn(20, 64), torch.randn(5, 64)], 16, device="cuda")
    table[0, 1] = cache.shape[0]
    if not lens_on_gpu:
        lens = lens.cpu()
        monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match=r"^block_table\[0, 1\]: got block id 3, expected"):
        indexer.read_paged_kv_cache(cache, table, lens)


def test_cached_constants_are_views_of_one_buffer_per_device(monkeypatch):
    """``cached_constant``: the first ``n`` elements of one buffer per name and device (at least 4096, grown by at
    least doubling, the old buffer kept), equal to a fresh ``make(n)``; the key windows' numbers come from it."""
    from tilegemm.ops import common

    monkeypatch.setattr(common, "_CONSTANTS", {})
    monkeypatch.setattr(common, "_RETIRED_CONSTANTS", [])
    dev = torch.device("cpu")
    first = common.key_numbers(10, dev)
    assert torch.equal(first, torch.arange(1, 11, dtype=torch.int32))
    again = common.key_numbers(4000, dev)
    assert again.data_ptr() == first.data_ptr() and torch.equal(again, torch.arange(1, 4001, dtype=torch.int32))
    grown = common.key_numbers(5000, dev)
    assert torch.equal(grown, torch.arange(1, 5001, dtype=torch.int32))
    assert common._CONSTANTS[("key_numbers", dev)].numel() == 8192
    assert [t.data_ptr() for t in common._RETIRED_CONSTANTS] == [first.data_ptr()]
    ones = common.cached_constant("ones", 7, dev, lambda n, d: torch.ones(n, device=d))
    assert torch.equal(ones, torch.ones(7))
