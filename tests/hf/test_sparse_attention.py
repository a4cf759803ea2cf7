"""Sparse DSA attention (``tilegemm.transformers.sparse_attention``) against the stock masked attention (CPU).

A decode step on ``tilegemm_sparse`` over enough keys per selected one attends to the gathered top-k keys: the same
softmax as stock's dense attention under the index mask, so the logits agree to fp32 summation order (calc_diff below
1e-12), also with left padding (masked keys among the selected) and a top-k wider than the visible keys. Prefill
(several rows) and decode over few keys per selected one run the stock fold itself: the same logits bit for bit.
Also: the switch follows the stock source (``indices=`` handed on), leaves other attention implementations and
non-DSA models alone, is undone by ``revert_tilegemm_model``, reaches models a family patcher builds, and the
indexer then skips its sort.
"""

from __future__ import annotations

import pytest
import torch
from hf_models import build, prompt, topk_sorted_flags

from tilegemm.testing import calc_diff
from tilegemm.transformers import (
    apply_tilegemm_kernel_to_model_type,
    apply_tilegemm_to_model,
    revert_tilegemm_kernel_patches,
    revert_tilegemm_model,
    swapped_indexers,
)
from tilegemm.transformers import sparse_attention as sparse
from tilegemm.transformers.compat import cache_kwargs

DSA_FAMILIES = ("tiny-deepseek-v32", "tiny-glm-moe-dsa")


def _decode_logits(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill logits of ``ids[:, :-1]`` and the logits of one decode step of ``ids[:, -1:]`` after it."""
    with torch.no_grad():
        head = model(ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1], use_cache=True)
        cache = cache_kwargs(model, head.past_key_values)
        step = model(ids[:, -1:], attention_mask=mask, use_cache=True, **cache)
    return head.logits, step.logits


def _pair(family: str, **overrides):
    stock = build(family, **overrides)
    patched = build(family, **overrides)
    apply_tilegemm_to_model(patched, experts=False, norm=False, indexer=False)
    return stock, patched


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_stock_attention_hands_the_indices_on(family):
    model = build(family)
    attention = sparse._attention_class(model)
    assert attention is not None and sparse.hands_indices_on(attention)


@pytest.fixture(params=["gather", "op"])
def decode_path(request, monkeypatch) -> tuple[str, list]:
    """The decode path under test: ``gather`` (SDPA over the gathered keys: no kernel here) or ``op``
    (:func:`tilegemm.sparse_decode_attention`, as on a GPU where its kernel runs; here its reference). Returns its
    name and the list each op call appends its arguments' shapes to."""
    from tilegemm.ops import api

    calls = []
    if request.param == "op":
        real = api.sparse_decode_attention
        monkeypatch.setattr(sparse, "_kernel_runs", lambda query: True)
        monkeypatch.setattr(
            api, "sparse_decode_attention", lambda *a, **kw: calls.append([tuple(t.shape) for t in a[:4]]) or real(*a)
        )
    return request.param, calls


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_decode_step_matches_the_masked_attention(family, decode_path):
    """14 keys, k = 3: the decode step attends to its 3 selected keys (the gather: at least GATHER_MIN_KEYS_PER_INDEX
    keys per selected one)."""
    stock, patched = _pair(family, index_topk=3)
    assert patched.config._attn_implementation == sparse.SPARSE_ATTENTION
    ids = prompt(length=14)
    stock_head, stock_step = _decode_logits(stock, ids)
    head, step = _decode_logits(patched, ids)
    assert torch.equal(head, stock_head)
    assert calc_diff(step, stock_step) < 1e-12
    path, calls = decode_path
    c = patched.config
    one = [(2, c.num_attention_heads, c.qk_head_dim), (2, c.num_attention_heads, 14, c.qk_head_dim)]
    one += [(2, c.num_attention_heads, 14, c.v_head_dim), (2, 3)]
    assert calls == ([one] * c.num_hidden_layers if path == "op" else [])


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_padding_and_a_top_k_wider_than_the_visible_keys(family, decode_path):
    """Left padding hides all but one key of the first sequence: its top-2 selects a hidden key (scored -inf), which
    the mask at the selected keys keeps hidden."""
    stock, patched = _pair(family, index_topk=2)
    ids = prompt(length=10)
    mask = torch.ones_like(ids)
    mask[0, :9] = 0
    _, stock_step = _decode_logits(stock, ids, mask)
    _, step = _decode_logits(patched, ids, mask)
    assert calc_diff(step, stock_step) < 1e-12


def test_few_keys_per_selected_one_keep_the_masked_attention():
    """14 keys, k = 6: fewer than GATHER_MIN_KEYS_PER_INDEX per selected one, without the kernel the stock fold
    itself (bit for bit); with it (any number of keys per selected one) the same logits to fp32 order."""
    assert 14 < sparse.GATHER_MIN_KEYS_PER_INDEX * 6
    stock, patched = _pair("tiny-deepseek-v32", index_topk=6)
    ids = prompt(length=14)
    stock_logits = _decode_logits(stock, ids)
    assert all(torch.equal(a, b) for a, b in zip(_decode_logits(patched, ids), stock_logits))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sparse, "_kernel_runs", lambda query: True)
        assert calc_diff(_decode_logits(patched, ids)[1], stock_logits[1]) < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_decode_step_on_the_kernel_gpu(family, monkeypatch):
    """On a Hopper GPU the decode step runs the ``gluon`` kernel (fallback disabled): fp32 logits within 1e-9 of
    stock's (the same softmax, another summation order)."""
    from tilegemm.backend import selector
    from tilegemm.ops import api

    if not selector.is_backend_available("gluon"):
        pytest.skip(f"gluon: {selector.unavailable_reason('gluon')}")
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    ran = []
    real = api.sparse_decode_attention
    monkeypatch.setattr(api, "sparse_decode_attention", lambda *a, **kw: ran.append(a[0].device) or real(*a, **kw))
    stock, patched = (model.cuda() for model in _pair(family, index_topk=3))
    ids = prompt(length=14).cuda()
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    _, stock_step = _decode_logits(stock, ids, mask)
    _, step = _decode_logits(patched, ids, mask)
    assert ran and calc_diff(step.double(), stock_step.double()) < 1e-9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathered_attention_equals_the_folded_mask(dtype):
    """The function alone, one decode row of 64 keys of which 8 are selected (some hidden by the mask): the gathered
    SDPA against SDPA over every key under the folded mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    q, k, v = (torch.randn(2, 4, n, 16, generator=g).to(dtype) for n in (1, 64, 64))
    indices = torch.stack([torch.randperm(64, generator=g)[:8] for _ in range(2)])[:, None].int()
    mask = torch.rand(2, 1, 1, 64, generator=g) > 0.3
    mask[..., indices[0, 0, 0]] = True
    got, _ = sparse.sparse_attention_forward(module, q, k, v, mask, scaling=0.25, indices=indices)
    want, _ = sdpa_attention_forward(module, q, k, v, sparse._index_mask(mask, indices, 64, dtype), 0.0, 0.25)
    assert calc_diff(got.double(), want.double()) < (1e-12 if dtype == torch.float32 else 1e-5)


def test_switch_only_from_sdpa_and_only_dsa_models():
    eager = build("tiny-deepseek-v32", _attn_implementation="eager")
    assert not sparse.use_sparse_attention(eager) and eager.config._attn_implementation == "eager"
    other = build("tiny-deepseek-v3")
    apply_tilegemm_to_model(other, experts=False)
    assert other.config._attn_implementation == "sdpa"


def test_revert_restores_sdpa():
    model = build("tiny-deepseek-v32")
    apply_tilegemm_to_model(model)
    assert model.config._attn_implementation == sparse.SPARSE_ATTENTION
    revert_tilegemm_model(model)
    assert model.config._attn_implementation == "sdpa"
    assert not sparse.restore_attention(model)


def test_off_by_switch_and_through_the_family_patcher():
    model = build("tiny-deepseek-v32")
    apply_tilegemm_to_model(model, sparse_attention=False)
    assert model.config._attn_implementation == "sdpa"
    try:
        apply_tilegemm_kernel_to_model_type("deepseek_v32")
        assert build("tiny-deepseek-v32").config._attn_implementation == sparse.SPARSE_ATTENTION
    finally:
        revert_tilegemm_kernel_patches()


def test_indexer_skips_its_sort_under_sparse_attention():
    model = build("tiny-deepseek-v32")
    apply_tilegemm_to_model(model, experts=False, norm=False)
    indexers = swapped_indexers(model)
    with topk_sorted_flags(indexers) as flags, torch.no_grad():
        model(prompt(), use_cache=False)
    assert len(flags) == len(indexers) == model.config.num_hidden_layers and not any(flags)


def test_source_checks_find_lines_in_order_whatever_the_formatting():
    """``compat.lines_in_order``, the check behind ``hands_indices_on`` and the indexer swap's: whitespace never
    matters, steps must come in order, and a step of alternatives takes the earliest found."""
    from tilegemm.transformers.compat import lines_in_order, squash, squashed_source

    source = squash("a = f(x)\nif  cond :\n    b = g( a )\nreturn b\n")
    assert lines_in_order(source, ("a = f(x)", "b = g(a)", "return b"))
    assert not lines_in_order(source, ("b = g(a)", "a = f(x)"))
    assert lines_in_order(source, (("b = h(a)", "b = g(a)"), "return b"))
    assert not lines_in_order(source, (("b = h(a)", "c = g(a)"),))
    assert squashed_source(len) is None  # a builtin has no source
    assert "sparse_indices=topk_indices" in squashed_source(sparse._attention_class(build("tiny-deepseek-v32")).forward)


@pytest.mark.gpu
def test_decode_step_on_the_kernel_compiles_whole_gpu(monkeypatch):
    """``torch.compile(fullgraph=True)`` of the decode step on a Hopper GPU: the kernel inside the
    ``tilegemm::sparse_decode_attention`` op, the eager step's logits bit for bit."""
    import copy

    from tilegemm.backend import selector

    if not selector.is_backend_available("gluon"):
        pytest.skip(f"gluon: {selector.unavailable_reason('gluon')}")
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    model = _pair("tiny-deepseek-v32", index_topk=3)[1].cuda()
    ids = prompt(length=14).cuda()
    torch._dynamo.reset()
    with torch.no_grad():
        cache = cache_kwargs(model, model(ids[:, :-1], use_cache=True).past_key_values)
        eager = model(ids[:, -1:], use_cache=True, **copy.deepcopy(cache)).logits
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(ids[:, -1:], use_cache=True, **cache).logits, eager)
