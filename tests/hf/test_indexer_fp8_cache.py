"""The swapped indexers' FP8 key cache (``swap_indexers(fp8=True, fp8_cache=True)``) on the CPU (pytorch backend).

Keys quantized once on append must be the keys the per-call FP8 recipe quantizes (bitwise), so its scores equal the
per-call path's up to fp32 summation order and its top-k that path's up to near-ties; against the BF16 path (stock's
top-k) the FP8 recipe's top-k overlap is reported, here bounded as ``test_index_scores_fp8_recipe`` bounds it on
random data. A static cache's FP8 writes follow its device counter: ``rewind_static_cache`` rewinds them too.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hf_models import build, indexer_inputs, prompt

from modeling.transformers import measure
from tilegemm import indexer as scoring
from tilegemm.fp8_key_cache import BLOCK_KV, Fp8KeyCache, score_fp8_key_cache
from tilegemm.testing import calc_diff
from tilegemm.transformers import indexer as idx
from tilegemm.transformers import swap_indexers
from tilegemm.transformers.compat import cache_kwargs, rewind_static_cache

DSA_FAMILIES = ("tiny-deepseek-v32", "tiny-glm-moe-dsa")


def test_append_stores_the_recipes_keys_in_deepgemms_layout():
    """Keys appended in runs (the end as a tensor or an int) read back (``read_paged_kv_cache``) as ``quantize_keys``
    of the rotated keys, bitwise; a grown cache keeps them; unwritten slots stay zero."""
    g = torch.Generator().manual_seed(0)
    batch, dim, capacity = 3, 64, 150
    keys = torch.randn(batch, capacity, dim, generator=g).bfloat16()
    cache = Fp8KeyCache(batch, capacity, dim, "cpu")
    end = 0
    for size in (37, 1, 64, 48):
        end += size
        cache.append(keys[:, end - size : end], torch.tensor(end) if size > 1 else end)
    lens = torch.full((batch,), capacity, dtype=torch.int32)
    for rotated in (True, False):
        for b, (data, scale) in enumerate(scoring.read_paged_kv_cache(cache.kv_cache, cache.block_table, lens)):
            want = scoring.quantize_keys(scoring.hadamard_rotate(keys[b]))
            assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(scale, want[1])
        if rotated:
            blocks = cache.blocks
            cache.grow(4 * BLOCK_KV * blocks)
            assert cache.capacity >= 4 * BLOCK_KV * blocks and cache.block_table.shape == (batch, cache.blocks)
            assert not cache.kv_cache.view(batch, cache.blocks, -1)[:, blocks:].any()
    assert torch.equal(cache.sequence(1, 5)[1], scoring.quantize_keys(scoring.hadamard_rotate(keys[1, :5]))[1])
    with pytest.raises(ValueError, match="keys: got shape"):
        cache.append(keys[:1], 3)


_inputs = functools.partial(indexer_inputs, heads=16, dim=128, seed=1)


@pytest.mark.parametrize("rows", [1, 2, 4, 40], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hadamard", [True, False], ids=["hadamard", "plain"])
def test_cache_scores_equal_the_per_call_recipe(rows, hadamard):
    """Decode (paged op, 1-4 rows) and prefill (plain op) over the FP8 key cache: the per-call FP8 path's scores
    within fp32 order (``calc_diff < 1e-9``), ``-inf`` exactly where the mask hides a key, the same top-k up to
    near-ties, and a top-16 overlap with the BF16 path of at least 0.8 (random data)."""
    q, k, w, mask = _inputs(2, rows, 300, seed=rows)
    scale = q.shape[-1] ** -0.5
    cache = Fp8KeyCache(2, 300, q.shape[-1], "cpu", hadamard=hadamard)
    cache.append(k, 300)
    got = score_fp8_key_cache(q, cache, w, mask, scale, 300, backend="pytorch")
    ref = scoring.index_scores(q, k, w, mask, scale, fp8=True, hadamard=hadamard, backend="pytorch")
    assert got.shape == ref.shape == (2, rows, 300) and got.dtype == torch.float32
    assert torch.equal(torch.isneginf(got), ~mask)
    assert calc_diff(got[mask], ref[mask]) < 1e-9
    bf16 = scoring.index_scores(q, k, w, mask, scale, backend="pytorch")
    a, b = got.topk(16, dim=-1).indices, bf16.topk(16, dim=-1).indices
    overlap = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).float().mean()
    assert overlap >= 0.8, overlap
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    got_add = score_fp8_key_cache(q, cache, w, additive, scale, 300, backend="pytorch")
    assert torch.equal(got_add[mask], got[mask]) and (got_add[~mask] < -1e30).all()


@pytest.mark.parametrize("rows", [1, 4, 40], ids=lambda r: f"rows{r}")
def test_scores_with_an_owed_append_equal_append_then_score(rows):
    """The step's keys passed to the scoring (``append=``, as ``fp8_keys_for`` leaves them owed: at decode the kernel
    that casts the queries writes them) give the scores and the cache bytes of an append before the scoring, bitwise
    (the ``pytorch`` backend: the same formulas in the same order)."""
    q, k, w, mask = _inputs(2, rows, 300, seed=10 + rows)
    scale = q.shape[-1] ** -0.5
    before, owed = Fp8KeyCache(2, 300, q.shape[-1], "cpu"), Fp8KeyCache(2, 300, q.shape[-1], "cpu")
    for cache in (before, owed):
        cache.append(k[:, : 300 - rows], 300 - rows)
    before.append(k[:, 300 - rows :], torch.tensor(300))
    want = score_fp8_key_cache(q, before, w, mask, scale, 300, backend="pytorch")
    got = score_fp8_key_cache(q, owed, w, mask, scale, 300, backend="pytorch", append=(k[:, 300 - rows :], 300))
    assert torch.equal(got, want) and torch.equal(owed.kv_cache, before.kv_cache)
    with pytest.raises(ValueError, match="keys: got shape"):
        score_fp8_key_cache(q, owed, w, mask, scale, 300, backend="pytorch", append=(k[:1, -1:], 300))


def test_swap_rejects_fp8_cache_without_fp8():
    model = build("tiny-deepseek-v32")
    with pytest.raises(ValueError, match="fp8_cache=True needs fp8=True"):
        swap_indexers(model, fp8_cache=True)
    with pytest.raises(TypeError, match="fp8_cache"):
        swap_indexers(model, fp8=True, fp8_cache=1)
    assert swap_indexers(model, fp8=True, fp8_cache=True)
    assert all(m._tilegemm_fp8_cache for m in idx.swapped_indexers(model))
    swap_indexers(model)
    assert not any(m._tilegemm_fp8_cache for m in idx.swapped_indexers(model))


def _record_topk(model) -> tuple[list, list]:
    """Forward hooks recording every indexer call's top-k output; returns (records, handles)."""
    records = []
    handles = [
        m.register_forward_hook(lambda mod, a, out: records.append(out.clone())) for m in idx.swapped_indexers(model)
    ]
    return records, handles


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_fp8_cache_decodes_as_the_per_call_recipe(family):
    """fp32 tiny model, dynamic and static cache: with the FP8 key cache every indexer call picks the top-k of the
    per-call FP8 recipe (the same quantized keys; equal up to near-ties, here exactly), so greedy decoding gives the
    same tokens; each layer keeps one FP8 cache on the cache object, sized to the static buffer."""
    model = build(family)
    ids = prompt()
    runs = {}
    for name, cached in (("per_call", False), ("cache", True)):
        swap_indexers(model, fp8=True, fp8_cache=cached)
        records, handles = _record_topk(model)
        with torch.no_grad():
            dynamic = measure.generate_greedy(model, ids, 5).tokens
            static = measure.static_greedy(model, ids, 5).tokens
        for h in handles:
            h.remove()
        runs[name] = (dynamic, static, records)
    assert torch.equal(runs["cache"][0], runs["per_call"][0]) and torch.equal(runs["cache"][1], runs["per_call"][1])
    assert len(runs["cache"][2]) == len(runs["per_call"][2])
    same = [torch.equal(a, b) for a, b in zip(runs["cache"][2], runs["per_call"][2])]
    assert all(same), f"{same.count(False)} of {len(same)} indexer calls differ"


def _static_step_setup(model, ids, max_len):
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=max_len)
    kw = cache_kwargs(model, cache)
    with torch.no_grad():
        model(input_ids=ids, **kw, cache_position=torch.arange(ids.shape[1]), use_cache=True)
    return cache, kw


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_rewind_static_cache_covers_the_fp8_keys(family):
    """A static cache's decode step at position p writes the FP8 key cache at p only; ``rewind_static_cache(cache, p)``
    and another token rewrite p (every other position keeps its bytes); rewinding again and repeating the first
    token gives back the first step's bytes and top-k bitwise (what a CUDA-graph replay at one position relies on)."""
    model = build(family, dtype=torch.bfloat16)
    swap_indexers(model, fp8=True, fp8_cache=True)
    ids = prompt()
    p = ids.shape[1]
    cache, kw = _static_step_setup(model, ids, p + 4)
    fp8 = getattr(cache, idx.FP8_KEYS_ATTR)
    assert sorted(fp8) == list(range(model.config.num_hidden_layers))
    assert all(c.capacity >= p + 4 and c.batch == ids.shape[0] for c in fp8.values())
    records, handles = _record_topk(model)

    def step(token: int):
        records.clear()
        rewind_static_cache(cache, p)
        token_ids = torch.full((ids.shape[0], 1), token)
        with torch.no_grad():
            model(input_ids=token_ids, **kw, cache_position=torch.tensor([p]), use_cache=True)
        return [c.kv_cache.clone() for c in fp8.values()], [r.clone() for r in records]

    bytes_a, topk_a = step(3)
    bytes_b, _ = step(200)
    bytes_a2, topk_a2 = step(3)
    for h in handles:
        h.remove()
    for a, b, a2, c in zip(bytes_a, bytes_b, bytes_a2, fp8.values()):
        at_p = torch.zeros(c.batch, c.blocks, BLOCK_KV, dtype=torch.bool)
        at_p[:, p // BLOCK_KV, p % BLOCK_KV] = True
        per_token_a = _per_token_bytes(a, c)
        per_token_b = _per_token_bytes(b, c)
        assert torch.equal(per_token_a[~at_p], per_token_b[~at_p])  # only position p was rewritten
        assert not torch.equal(per_token_a[at_p], per_token_b[at_p])
        assert torch.equal(a, a2)
    assert all(torch.equal(x, y) for x, y in zip(topk_a, topk_a2)) and len(topk_a) == model.config.num_hidden_layers


def _per_token_bytes(kv_cache: torch.Tensor, c: Fp8KeyCache) -> torch.Tensor:
    """uint8 ``[batch, blocks, BLOCK_KV, dim + 4]``: each token's key bytes then its scale's bytes."""
    raw = kv_cache.view(c.batch, c.blocks, -1)
    keys = raw[..., : BLOCK_KV * c.dim].reshape(c.batch, c.blocks, BLOCK_KV, c.dim)
    scales = raw[..., BLOCK_KV * c.dim :].reshape(c.batch, c.blocks, BLOCK_KV, 4)
    return torch.cat([keys, scales], dim=-1)


def test_fp8_cache_is_rebuilt_when_a_dynamic_cache_restarts():
    """A dynamic cache whose length is not the FP8 cache's plus the new keys (a new prompt in the same cache object
    after ``reset``/``crop``) rebuilds the FP8 cache from transformers' keys, so the scores still equal the per-call
    recipe's."""
    g = torch.Generator().manual_seed(5)
    keys = torch.randn(2, 20, 64, generator=g)

    class Layer:
        pass

    class Dynamic:
        layers = [Layer()]

    cache = Dynamic()
    first, pending = idx.fp8_keys_for(cache, 0, keys[:, :12], keys[:, :12], True)
    assert first.length == 12 and pending is None  # built from every key
    same, pending = idx.fp8_keys_for(cache, 0, keys[:, 12:13], keys[:, :13], True)
    assert same is first and same.length == 13
    assert torch.equal(pending[0], keys[:, 12:13]) and pending[1] == 13  # the new key, owed to the next score
    same.append(*pending)
    rebuilt, pending = idx.fp8_keys_for(cache, 0, keys[:, :5], keys[:, :5], True)  # restarted at 5 keys
    assert rebuilt is not first and rebuilt.length == 5 and pending is None
    lens = torch.full((2,), 5, dtype=torch.int32)
    for b, (data, _) in enumerate(scoring.read_paged_kv_cache(rebuilt.kv_cache, rebuilt.block_table, lens)):
        want = scoring.quantize_keys(scoring.hadamard_rotate(keys[b, :5]))[0]
        assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_fp8_cache_on_gpu_cutile(family, monkeypatch):
    """bf16 tiny model on the GPU, cutile (fallback disabled): the FP8 key cache's indexer calls pick the per-call
    recipe's top-k (scores within fp32 order), and its static-cache decode loop replayed from a CUDA graph gives the
    eager loop's tokens and the per-call recipe's."""
    from tilegemm.backend.selector import is_backend_available

    if not is_backend_available("cutile"):
        pytest.skip("cutile backend unavailable")
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    # The tiny presets' indexer (4 heads of 32) is below the cutile paged kernel's head sizes (64, 128): fallback
    # disabled, its decode step would raise. 64 heads of 64, as the real indexers' kernels run.
    model = build(family, dtype=torch.bfloat16, device="cuda", index_n_heads=64, index_head_dim=64)
    ids = prompt(device="cuda")
    tokens = {}
    with torch.no_grad():
        for name, cached in (("per_call", False), ("cache", True)):
            swap_indexers(model, fp8=True, fp8_cache=cached, backend="cutile")
            tokens[name] = measure.static_greedy(model, ids, 6, cuda_graph=True)
            tokens[name + "_eager"] = measure.static_greedy(model, ids, 6)
    assert not tokens["cache"].note, tokens["cache"].note
    assert torch.equal(tokens["cache"].tokens, tokens["cache_eager"].tokens)
    assert torch.equal(tokens["cache"].tokens, tokens["per_call"].tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 40])
def test_cache_scores_on_gpu_cutile(rows, monkeypatch):
    """The paged (decode) and plain (prefill) kernels over the FP8 key cache: the per-call recipe's scores within fp32
    order, ``-inf`` exactly where the mask hides a key, every element written (no NaN), bitwise reruns, and the same
    scores from a CUDA graph that appends and scores."""
    from tilegemm.backend.selector import is_backend_available

    if not is_backend_available("cutile"):
        pytest.skip("cutile backend unavailable")
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    q, k, w, mask = (t.cuda() for t in _inputs(2, rows, 4000, heads=64, seed=rows))
    scale = q.shape[-1] ** -0.5
    cache = Fp8KeyCache(2, 4000, q.shape[-1], "cuda")
    cache.append(k, 4000)
    got = score_fp8_key_cache(q, cache, w, mask, scale, 4000, backend="cutile")
    ref = scoring.index_scores(q, k, w, mask, scale, fp8=True, backend="cutile")
    torch.cuda.synchronize()
    assert not torch.isnan(got).any() and torch.equal(torch.isneginf(got), ~mask)
    assert calc_diff(got[mask], ref[mask]) < 1e-6
    assert torch.equal(score_fp8_key_cache(q, cache, w, mask, scale, 4000, backend="cutile"), got)
    new_key, end = k[:, -1:], torch.tensor(4000, device="cuda")

    def step():
        cache.append(new_key, end)
        return score_fp8_key_cache(q, cache, w, mask, scale, 4000, backend="cutile")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step().clone()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    # The step re-appends the last key (a tile of one row) and scores: the same step run eagerly, bitwise, and
    # ``got`` within fp32 order.
    assert torch.equal(out, eager)
    assert calc_diff(out[mask], got[mask]) < 1e-6
    if rows <= 4:  # decode: the key owed to the kernel that casts the queries and reduces the mask, eager and graphed
        owed = score_fp8_key_cache(q, cache, w, mask, scale, 4000, backend="cutile", append=(new_key, end))
        fused_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(fused_graph):
            fused = score_fp8_key_cache(q, cache, w, mask, scale, 4000, backend="cutile", append=(new_key, end))
        fused_graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(owed, eager) and torch.equal(fused, eager)
