"""Sparse-attention indexers (DeepSeek-V3.2, GLM-MoE-DSA) scored by the MQA-logits ops, against stock (CPU).

Top-k agreement and ties: both sides select by ``torch.topk`` over scores that differ only in fp32 summation order,
so a selected set may differ from stock's only at a near-tie: every key one side selects and the other does not
must score within ``TIE`` (relative to the row's largest score) of the row's k-th largest stock score. Keys the
mask hides are not compared (both sides score them ``-inf`` or ``min``, and which of them fills a row with fewer
visible keys than k is arbitrary; attention masks them anyway).
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from hf_models import build, indexer_inputs, prompt, topk_sorted_flags

from modeling.transformers import measure
from modeling.transformers.indexer_bench import capture_scores
from tilegemm import indexer as scoring
from tilegemm import indexer_mask as index_mask
from tilegemm.testing import calc_diff, dense_index_scores
from tilegemm.transformers import (
    apply_tilegemm_kernel_to_model_type,
    apply_tilegemm_to_model,
    revert_tilegemm_kernel_patches,
    revert_tilegemm_model,
    swap_indexers,
    swapped_indexers,
)
from tilegemm.transformers import indexer as idx

DSA_FAMILIES = ("tiny-deepseek-v32", "tiny-glm-moe-dsa")
TIE = 1e-5


@pytest.fixture(autouse=True)
def _fused_scores_at_every_size(monkeypatch, request):
    """The tiny models' scores are small enough for the torch path (``SMALL_SCORES_BYTES``): the tests run the
    MQA-logits op at every size, except those marked ``small_scores_path`` (the decode rule itself)."""
    if "small_scores_path" not in request.keywords:
        monkeypatch.setattr(scoring, "SMALL_SCORES_BYTES", 0)


def _capture_indexer_calls(model, ids: torch.Tensor) -> list[tuple[torch.nn.Module, tuple, dict]]:
    """Run ``model(ids)`` once and record every indexer call's module, args and kwargs."""
    calls = []
    spec = idx.INDEXER_BY_MODEL_TYPE[model.config.model_type]
    stock = spec.load_class()
    hooks = [
        m.register_forward_pre_hook(lambda mod, a, kw: calls.append((mod, a, dict(kw))), with_kwargs=True)
        for m in model.modules()
        if isinstance(m, stock)
    ]
    with torch.no_grad():
        model(ids, use_cache=False)  # no cache: each recorded call can be replayed as it was
    for h in hooks:
        h.remove()
    return calls


def _stock_scores(module, args, kwargs) -> torch.Tensor:
    """Stock's masked scores ``[B, S, T]``, recomputed by the stock forward with ``topk`` made to return them."""
    captured = {}
    original = torch.Tensor.topk

    def spy(self, k, dim=-1, *a, **kw):
        captured["scores"] = self.clone()
        return original(self, k, dim, *a, **kw)

    torch.Tensor.topk = spy
    try:
        indices = type(module)._tilegemm_stock.forward(module, *args, **kwargs)
    finally:
        torch.Tensor.topk = original
    return captured["scores"], indices


def assert_same_topk(patched: torch.Tensor, stock: torch.Tensor, scores: torch.Tensor, visible: torch.Tensor) -> None:
    """Per row, the visible selected keys agree up to near-ties of the k-th stock score (module docstring)."""
    k = stock.shape[-1]
    kth = scores.topk(k, dim=-1).values[..., -1]
    scale = scores.masked_fill(~visible, 0).abs().amax(dim=-1).clamp_min(1e-30)
    for b, s in itertools.product(range(stock.shape[0]), range(stock.shape[1])):
        a = {int(i) for i in patched[b, s] if visible[b, s, int(i)]}
        c = {int(i) for i in stock[b, s] if visible[b, s, int(i)]}
        for key in a ^ c:
            gap = abs(float(scores[b, s, key]) - float(kth[b, s])) / float(scale[b, s])
            assert gap <= TIE, f"row ({b}, {s}): key {key} selected by one side only, {gap:.2e} from the k-th score"


def _patched_scores(module, args, kwargs) -> torch.Tensor:
    """The masked scores the patched forward hands to ``topk`` (:func:`tilegemm.indexer.index_scores`)."""
    with torch.no_grad():
        return capture_scores(lambda: module(*args, **kwargs))[1]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_patched_indexer_selects_stock_topk(family, dtype, attn):
    """Each indexer call of a tiny model (batch 2, 12 tokens: boolean masks under sdpa, additive under eager):
    the patched top-k equals stock's up to near-ties, and the patched scores equal stock's (``calc_diff < 1e-6`` on
    the visible keys; the masked ones identical in kind: ``-inf`` or below ``-1e30``)."""
    model = build(family, dtype=dtype, attn_implementation=attn)
    ids = prompt()
    calls = _capture_indexer_calls(model, ids)
    assert len(calls) == model.config.num_hidden_layers
    assert swap_indexers(model)
    for module, args, kwargs in calls:
        stock_scores, stock_idx = _stock_scores(module, args, kwargs)
        with torch.no_grad():
            patched_idx = module(*args, **kwargs)
        assert patched_idx.dtype == torch.int32 and patched_idx.shape == stock_idx.shape
        mask = args[3] if len(args) > 3 else kwargs["attention_mask"]
        visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
        assert_same_topk(patched_idx, stock_idx, stock_scores, visible)
        patched_scores = _patched_scores(module, args, kwargs)
        assert calc_diff(patched_scores[visible], stock_scores[visible]) < 1e-6
        assert (patched_scores[~visible] < -1e30).all() and (stock_scores[~visible] < -1e30).all()


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_indexer_swap_alone_keeps_greedy_tokens_and_reverts(family):
    """fp32 model, indexers swapped alone (experts and norms stock): logits within 1e-5 of stock and the same greedy
    tokens (dynamic and static cache); ``revert_tilegemm_model`` restores the stock classes and outputs."""
    model = build(family)
    ids = prompt()
    stock_classes = {type(m) for m in model.modules()}
    with torch.no_grad():
        ref = model(ids).logits
        stock_tokens = measure.generate_greedy(model, ids, 5).tokens
        stock_static = measure.static_greedy(model, ids, 5).tokens
        apply_tilegemm_to_model(model, experts=False, norm=False)
        assert len(swapped_indexers(model)) == model.config.num_hidden_layers
        out = model(ids).logits
        tokens = measure.generate_greedy(model, ids, 5).tokens
        static = measure.static_greedy(model, ids, 5).tokens
    assert calc_diff(out, ref) < 1e-10 or (out - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert torch.equal(tokens, stock_tokens) and torch.equal(static, stock_static)
    assert torch.equal(static, stock_tokens)
    revert_tilegemm_model(model)
    assert not swapped_indexers(model) and {type(m) for m in model.modules()} == stock_classes
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_family_patcher_swaps_indexers_before_creation(family):
    """``apply_tilegemm_kernel_to_<family>`` swaps the indexers of models built afterwards (on by default, off with
    ``indexer=False``); FP8 reaches them with ``fp8=True``."""
    from hf_models import build as build_model

    model_type = {"tiny-deepseek-v32": "deepseek_v32", "tiny-glm-moe-dsa": "glm_moe_dsa"}[family]
    try:
        apply_tilegemm_kernel_to_model_type(model_type, experts=False)
        model = build_model(family)
        assert len(swapped_indexers(model)) == model.config.num_hidden_layers
        assert not any(m._tilegemm_fp8 for m in swapped_indexers(model))
        apply_tilegemm_kernel_to_model_type(model_type, experts=False, indexer=False)
        assert not swapped_indexers(build_model(family))
        apply_tilegemm_kernel_to_model_type(model_type, experts=False, fp8=True)
        assert all(m._tilegemm_fp8 for m in swapped_indexers(build_model(family)))
    finally:
        revert_tilegemm_kernel_patches()
    assert not swapped_indexers(build_model(family))


def test_mask_windows():
    """Windows span each row's visible keys (first .. last + 1), boolean or additive, empty rows ``[0, 0)``."""
    visible = torch.tensor(
        [[[True, True, False, False], [False, True, False, True], [False, False, False, False]]], dtype=torch.bool
    )
    ks, ke = idx.mask_windows(visible)
    assert ks.tolist() == [[0, 1, 0]] and ke.tolist() == [[2, 4, 0]]
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    assert [t.tolist() for t in idx.mask_windows(additive, rows_per_chunk=1)] == [ks.tolist(), ke.tolist()]
    assert [t.tolist() for t in idx.mask_windows(additive.bfloat16().masked_fill(~visible, float("-inf")))] == [
        ks.tolist(),
        ke.tolist(),
    ]


def test_windows_from_key_zero_and_key_windows():
    """``mask_windows(from_key_zero=True)``: the same ``ke`` in one pass (boolean or additive, empty rows 0, one chunk
    or several), every ``ks`` 0; ``key_windows`` takes it for decode rows (up to ``DECODE_WINDOW_ROWS``), the spans
    for longer calls and every key without a mask; ``clean_outside_windows`` only for an additive mask."""
    torch.manual_seed(0)
    visible = torch.rand(2, 9, 13) < 0.4
    visible[0, 3] = False
    ks, ke = index_mask.mask_windows(visible)
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    for mask in (visible, additive, additive.bfloat16().masked_fill(~visible, float("-inf"))):
        for chunk in (None, 4):
            starts, ends = index_mask.mask_windows(mask, rows_per_chunk=chunk, from_key_zero=True)
            assert torch.equal(ends, ke) and ends.dtype == torch.int32 and not starts.any()
    rows = index_mask.DECODE_WINDOW_ROWS
    starts, ends = index_mask.key_windows(visible[:, :rows], 2, rows, 13, visible.device)
    assert starts.tolist() == [[0] * rows] * 2 and torch.equal(ends, ke[:, :rows])
    assert all(torch.equal(a, b) for a, b in zip(index_mask.key_windows(visible, 2, 9, 13, visible.device), (ks, ke)))
    starts, ends = index_mask.key_windows(None, 2, 3, 13, visible.device)
    assert starts.tolist() == [[0] * 3] * 2 and ends.tolist() == [[13] * 3] * 2
    # the op fills -inf outside the windows itself only where the mask's application would not: an additive mask
    assert [index_mask.clean_outside_windows(m) for m in (None, visible, additive)] == [False, False, True]


def test_key_window_ends_are_key_windows_ends():
    """``key_window_ends`` (the paged op's lengths at a decode step): ``key_windows``' ``ke`` for decode rows, with a
    boolean, additive or no mask, in one pass or through ``mask_windows``' chunks (a mask of more than 2**24
    elements a pass); more rows than a decode window holds is an error."""
    torch.manual_seed(1)
    rows = index_mask.DECODE_WINDOW_ROWS
    visible = torch.rand(3, rows, 29) < 0.3
    visible[1, 2] = False  # a row with no visible key: 0
    additive = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    for mask in (visible, additive, None):
        want = index_mask.key_windows(mask, 3, rows, 29, visible.device)[1]
        got = index_mask.key_window_ends(mask, 3, rows, 29, visible.device)
        assert torch.equal(got, want) and got.dtype == torch.int32
    wide = torch.zeros(1, 2, (1 << 24) + 5, dtype=torch.bool)  # two passes of one row
    wide[0, 0, 7], wide[0, 1, -1] = True, True
    assert index_mask.key_window_ends(wide, 1, 2, wide.shape[-1], wide.device).tolist() == [[8, wide.shape[-1]]]
    with pytest.raises(ValueError, match="decode windows hold at most"):
        index_mask.key_window_ends(visible, 3, rows + 1, 29, visible.device)


@pytest.mark.parametrize("variant", ["plain", "decode"], ids=["torch-matmul", "mqa-op"])
def test_decode_step_window_from_key_zero(variant, monkeypatch):
    """A left-padded decode row (its first visible key past 0) scored from key 0: stock's formula on every visible
    key, ``-inf`` exactly where a boolean mask hides one; an additive mask adds to the scores of the window's hidden
    keys as stock's ``scores + mask`` does, ``-inf`` past the last visible key."""
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", variant)
    q, k, w, mask = _random_indexer_inputs()
    q, w, mask = q[:, -1:], w[:, -1:], mask[:, -1:].clone()
    mask[0, 0, :5] = False
    mask[1, 0, -3:] = False
    scale = q.shape[-1] ** -0.5
    ref = dense_index_scores(q, k, w, scale)
    got = idx.index_scores(q, k, w, mask, scale)
    assert torch.equal(torch.isneginf(got), ~mask) and calc_diff(got[mask], ref[mask]) < 1e-6
    lowest = torch.finfo(torch.float32).min
    additive = torch.zeros(mask.shape).masked_fill(~mask, lowest)
    got = idx.index_scores(q, k, w, additive, scale)
    inside = torch.arange(k.shape[1]) < index_mask.mask_windows(mask)[1].unsqueeze(-1)
    assert torch.equal(torch.isneginf(got), ~inside)
    assert calc_diff(got[inside], (ref.float() + additive)[inside]) < 1e-6


_random_indexer_inputs = functools.partial(indexer_inputs, batch=2, rows=40, keys=64, heads=8, dim=64, seed=0)


def test_index_scores_bf16_matches_formula():
    """The BF16 path against stock's formula in float64 on the same bf16 values: ``calc_diff < 1e-6`` (DESIGN.md's
    bar for fp32 output), ``-inf`` exactly where the mask hides a key."""
    q, k, w, mask = _random_indexer_inputs()
    scale = q.shape[-1] ** -0.5
    got = idx.index_scores(q, k, w, mask, scale)
    ref = dense_index_scores(q, k, w, scale)
    assert torch.equal(torch.isneginf(got), ~mask)
    assert calc_diff(got[mask], ref[mask]) < 1e-6


def _decode_step_counting_op_calls(monkeypatch) -> tuple[tuple, float, list]:
    """A decode step's scoring inputs (the last query row of :func:`_random_indexer_inputs`: q, k, w, mask), the
    softmax scale, and the list that each ``bf16_mqa_logits`` call appends to from now on."""
    from tilegemm.ops import api

    q, k, w, mask = _random_indexer_inputs()
    calls = []
    real = api.bf16_mqa_logits
    monkeypatch.setattr(api, "bf16_mqa_logits", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return (q[:, -1:], k, w[:, -1:], mask[:, -1:]), q.shape[-1] ** -0.5, calls


@pytest.mark.small_scores_path
def test_decode_sized_scores_take_torch_path(monkeypatch):
    """A decode step (one query row, small ``[S, H, T]``) scores with torch's fp32 matmul, not the MQA kernel (which
    runs one query row on one CTA); same values as the kernel's path (fp32 products of the same bf16 inputs) and
    the same top-k; a prefill-sized call still takes the op."""
    last, scale, calls = _decode_step_counting_op_calls(monkeypatch)
    small = idx.index_scores(*last[:3], last[3], scale)
    assert calls == []
    monkeypatch.setattr(scoring, "SMALL_SCORES_BYTES", 0)
    fused = idx.index_scores(*last[:3], last[3], scale)
    assert calls == [1] * last[0].shape[0]
    visible = last[3]
    assert torch.equal(torch.isneginf(small), ~visible)
    assert calc_diff(small[visible], fused[visible]) < 1e-6
    ref = dense_index_scores(*last[:3], scale)
    assert calc_diff(small[visible], ref[visible]) < 1e-6


@pytest.mark.small_scores_path
def test_forced_decode_kernel_takes_the_op_at_decode_size(monkeypatch):
    """With ``TILEGEMM_MQA_VARIANT=decode`` (the MQA ops' decode kernel forced) a decode step's bf16 scores go
    through one ``mqa_logits_batched`` call over every sequence instead of torch's matmul, with the same values, its
    scaled weights and window ends from one ``indexer_decode_prepare`` call; ``plain`` keeps the matmul."""
    from tilegemm.ops import api

    last, scale, calls = _decode_step_counting_op_calls(monkeypatch)
    batched, prepared = [], []
    real, real_prepare = api.mqa_logits_batched, api.indexer_decode_prepare
    monkeypatch.setattr(api, "mqa_logits_batched", lambda *a, **kw: batched.append(1) or real(*a, **kw))
    monkeypatch.setattr(api, "indexer_decode_prepare", lambda *a, **kw: prepared.append(1) or real_prepare(*a, **kw))
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "plain")
    small = idx.index_scores(*last, scale)
    assert calls == [] and batched == [] and prepared == []
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")
    fused = idx.index_scores(*last, scale)
    assert calls == [] and batched == [1] and prepared == [1]
    visible = last[3]
    assert torch.equal(torch.isneginf(fused), ~visible) and calc_diff(small[visible], fused[visible]) < 1e-6


@pytest.mark.parametrize("hadamard", [True, False], ids=["hadamard", "plain"])
def test_index_scores_fp8_recipe(hadamard):
    """DeepSeek's FP8 recipe against the unquantized formula: ``calc_diff < 1e-3`` (DESIGN.md's FP8 MQA bar) and a
    top-k overlap with the BF16 path reported by the GPU script; here at least 80% of the top-16 keys agree."""
    q, k, w, mask = _random_indexer_inputs(rows=64, keys=256, heads=16, dim=128, seed=1)
    scale = q.shape[-1] ** -0.5
    got = idx.index_scores(q, k, w, mask, scale, fp8=True, hadamard=hadamard)
    ref = dense_index_scores(q, k, w, scale)
    assert torch.equal(torch.isneginf(got), ~mask)
    assert calc_diff(got[mask], ref[mask]) < 1e-3
    bf16 = idx.index_scores(q, k, w, mask, scale)
    a, b = got.topk(16, dim=-1).indices, bf16.topk(16, dim=-1).indices
    overlap = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).float()[mask.sum(-1) >= 16].mean()
    assert overlap >= 0.8, overlap


def test_hadamard_is_orthonormal():
    x, y = torch.randn(5, 64, dtype=torch.float64).float(), torch.randn(7, 64).float()
    rotated = idx.hadamard_rotate(x) @ idx.hadamard_rotate(y).t()
    assert torch.allclose(rotated, x @ y.t(), atol=1e-4)
    with pytest.raises(ValueError, match="power of two"):
        idx.hadamard_rotate(torch.randn(3, 48))


BAD_SCORING = [
    (lambda q, k, w, m: (q[0], k, w, m), ValueError, "q: got shape"),
    (lambda q, k, w, m: (q, k[:1], w, m), ValueError, "k: got shape"),
    (lambda q, k, w, m: (q, k[..., :32], w, m), ValueError, "k: got shape"),
    (lambda q, k, w, m: (q, k, w[..., :3], m), ValueError, "weights: got shape"),
    (lambda q, k, w, m: (q, k, w, m[:, :, :5]), ValueError, "attention_mask: got shape"),
    (lambda q, k, w, m: (q, k, w, m.int()), TypeError, "attention_mask: got dtype"),
    (lambda q, k, w, m: (q.int(), k, w, m), TypeError, "q: got dtype"),
    (lambda q, k, w, m: (q, k.tolist(), w, m), TypeError, "k: got list"),
]


@pytest.mark.parametrize(
    "make,error,message", BAD_SCORING, ids=[b[2].split(":")[0] + str(i) for i, b in enumerate(BAD_SCORING)]
)
def test_index_scores_bad_input(make, error, message, monkeypatch):
    """Bad input raises naming the argument before any MQA op runs."""
    from tilegemm.ops import api

    def forbidden(*a, **kw):
        raise AssertionError("an MQA op ran on bad input")

    monkeypatch.setattr(api, "bf16_mqa_logits", forbidden)
    monkeypatch.setattr(api, "fp8_mqa_logits", forbidden)
    q, k, w, mask = _random_indexer_inputs(batch=2, rows=4, keys=8)
    with pytest.raises(error, match=message):
        idx.index_scores(*make(q, k, w, mask), 0.125)
    with pytest.raises(ValueError, match="softmax_scale"):
        idx.index_scores(q, k, w, mask, 0.0)


def test_swap_indexers_bad_switch_and_changed_stock(monkeypatch):
    model = build("tiny-deepseek-v32")
    with pytest.raises(TypeError, match="fp8"):
        swap_indexers(model, fp8="yes")
    assert swap_indexers(build("tiny-qwen3-moe")) == []
    monkeypatch.setattr(idx, "STOCK_SCORING", (*idx.STOCK_SCORING, ("a line stock does not have",)))
    idx.stock_formula_matches.cache_clear()
    idx._warned.clear()
    try:
        with pytest.warns(UserWarning, match="left stock"):
            assert swap_indexers(model) == []
    finally:
        idx.stock_formula_matches.cache_clear()


def test_indexer_bench_smoke_on_cpu(tmp_path):
    """The GPU script's code path on the CPU with a tiny preset: every part runs, writes its JSON and markdown (and
    ``--json``), the patched BF16 top-k agrees with stock (up to near-ties, with the decode kernel forced too), FP8's
    overlap with BF16 is reported, the FP8 key cache picks the per-call recipe's keys."""
    import json

    from modeling.transformers import indexer_bench

    argv = ["--device", "cpu", "--preset", "tiny-deepseek-v32", "--contexts", "64", "--decode-contexts", "48"]
    only = ["--json", str(tmp_path / "only.json")]
    assert indexer_bench.main([*argv, "--layers", "3", "--reps", "1", "--out", str(tmp_path), *only]) == 0
    result = json.loads((tmp_path / "indexer_bench.json").read_text())
    (row,) = result["prefill"]
    assert row["bf16"]["vs_stock"]["worst_tie_gap"] <= TIE and row["bf16"]["calc_diff_vs_f64"] < 1e-6
    assert 0.5 <= row["fp8"]["vs_bf16"]["topk_overlap"] <= 1.0 and row["fp8"]["vs_bf16"]["calc_diff"] < 1e-3
    (dec,) = result["decode_module"]
    assert dec["bf16"]["topk_overlap_vs_stock"] == 1.0 and dec["bf16_kernel"]["topk_overlap_vs_stock"] == 1.0
    assert dec["fp8_cache"]["topk_overlap_vs_bf16"] == dec["fp8"]["topk_overlap_vs_bf16"] >= 0.5
    (kern,) = result["kernels"]
    assert all("graph_us" in kern[name] for name, *_ in indexer_bench.KERNEL_VARIANTS), kern
    assert kern["bf16_decode"]["calc_diff_vs_plain"] < 1e-9 and kern["fp8_decode"]["calc_diff_vs_plain"] < 1e-9
    (model,) = result["decode_model"]
    assert model["indexer"]["calc_diff_vs_stock"] < 1e-6 and "error" not in model["all"]
    gathered, patched = model["all_gather"]["calc_diff_vs_stock"], model["all"]["calc_diff_vs_stock"]
    assert gathered <= patched + 1e-6 and "error" not in model["all_fp8_cache"]
    (prof,) = result["decode_profile"]
    for variant in indexer_bench.PROFILE_VARIANTS:
        assert prof[variant]["kernels"] >= 1 and prof[variant]["total_us"] > 0, prof[variant]
    text = (tmp_path / "indexer_bench.md").read_text()
    assert "## Prefill" in text and "## MQA-logits ops at decode size" in text and "kernel by kernel" in text
    assert json.loads((tmp_path / "only.json").read_text())["kernels"] == result["kernels"]


@pytest.mark.gpu
@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_patched_indexer_on_gpu_cutile(family, monkeypatch):
    """bf16 tiny model on the GPU, cutile's BF16 MQA kernel (fallback disabled): each indexer call selects stock's
    top-k up to near-ties with scores within ``calc_diff < 1e-6`` of stock's; the FP8 recipe runs; the static-cache
    decode loop replayed from a CUDA graph gives the stock greedy tokens."""
    from tilegemm.backend.selector import is_backend_available

    if not is_backend_available("cutile"):
        pytest.skip("cutile backend unavailable")
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    model = build(family, dtype=torch.bfloat16, device="cuda")
    ids = prompt(device="cuda")
    calls = _capture_indexer_calls(model, ids)
    swap_indexers(model, backend="cutile")
    for module, args, kwargs in calls:
        stock_scores, stock_idx = _stock_scores(module, args, kwargs)
        mask = args[3]
        visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
        with torch.no_grad():
            patched_idx = module(*args, **kwargs)
        assert_same_topk(patched_idx.cpu(), stock_idx.cpu(), stock_scores.cpu(), visible.cpu())
        patched_scores = _patched_scores(module, args, kwargs)
        assert calc_diff(patched_scores[visible], stock_scores[visible]) < 1e-6
    swap_indexers(model, fp8=True, backend="cutile")
    for module, args, kwargs in calls:
        with torch.no_grad():
            assert module(*args, **kwargs).shape == _stock_scores(module, args, kwargs)[1].shape
    revert_tilegemm_model(model)
    with torch.no_grad():
        stock_tokens = measure.static_greedy(model, ids, 6, cuda_graph=True)
        swap_indexers(model, backend="cutile")
        patched = measure.static_greedy(model, ids, 6, cuda_graph=True)
        eager = measure.static_greedy(model, ids, 6)
    assert not patched.note and not stock_tokens.note, (patched.note, stock_tokens.note)
    assert torch.equal(patched.tokens, eager.tokens)  # the graph replays the patched step
    assert torch.equal(patched.tokens, stock_tokens.tokens)


def test_earlier_release_form_is_recognized_and_swapped():
    """Releases before 5.24 call the cache parameter ``past_key_values`` (and some flatten q before the score
    matmul): the guard accepts that form, and the swapped forward takes ``past_key_values=``."""
    import inspect
    import linecache
    import textwrap

    spec = idx.INDEXER_BY_MODEL_TYPE["deepseek_v32"]
    stock = spec.load_class()
    source = textwrap.dedent(inspect.getsource(inspect.unwrap(stock.forward)))
    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("@"))
    source = source.replace("cache", "past_key_values").replace(
        "torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale",
        "torch.matmul(q.flatten(1, 2).float(), k.transpose(-1, -2).float()) * self.softmax_scale",
    )
    namespace: dict = {}
    filename = "<earlier release of DeepseekV32Indexer.forward>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # inspect reads it there
    exec(compile(source, filename, "exec"), inspect.unwrap(stock.forward).__globals__, namespace)
    earlier = type("EarlierIndexer", (stock,), {"forward": namespace["forward"]})
    assert idx.stock_formula_matches(earlier, spec.rope)
    model = build("tiny-deepseek-v32")
    calls = _capture_indexer_calls(model, prompt())
    module, args, kwargs = calls[0]
    module.__class__ = idx.tilegemm_indexer_class(stock, spec.rope)
    kwargs = {("past_key_values" if k == "cache" else k): v for k, v in kwargs.items()}
    with torch.no_grad():
        got = module(*args, **kwargs)
    assert got.dtype == torch.int32 and got.shape[:2] == args[0].shape[:2]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", DSA_FAMILIES)
def test_topk_skips_the_sort_where_attention_reads_a_mask(family, attn, monkeypatch):
    """transformers' DSA attention scatters the indexer's top-k into a mask under eager and SDPA attention (checked
    in this transformers' source), so the swapped forward skips the sort: the same logits, bit for bit, as the swap
    with the sort; called under another attention implementation, the indexer returns stock's sorted top-k."""
    model = build(family, attn_implementation=attn)
    stock = idx.INDEXER_BY_MODEL_TYPE[model.config.model_type].load_class()
    assert idx.topk_order_unread(stock)
    ids = prompt()
    calls = _capture_indexer_calls(model, ids)
    swap_indexers(model)
    with topk_sorted_flags(swapped_indexers(model)) as flags, torch.no_grad():
        out = model(ids, use_cache=False).logits
    assert len(flags) == model.config.num_hidden_layers and not any(flags)
    swapped = type(swapped_indexers(model)[0])
    monkeypatch.setattr(swapped, "_tilegemm_topk_order_unread", False)
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, out)
    monkeypatch.undo()
    module, args, kwargs = calls[0]
    monkeypatch.setattr(module.config, "_attn_implementation", "flash_attention_2")
    with topk_sorted_flags([module]) as flags, torch.no_grad():
        got = module(*args, **kwargs)
        scores = _patched_scores(module, args, kwargs)
    assert flags and all(flags) and torch.equal(got, scores.topk(got.shape[-1], dim=-1).indices.to(torch.int32))


def test_topk_order_read_by_an_attention_keeps_the_sort(tmp_path, monkeypatch):
    """A modeling module whose attention hands the top-k on under SDPA too (not only into a mask) keeps the sort."""
    (tmp_path / "dsa_order_read.py").write_text(
        "from torch import nn\n\n\n"
        "class Indexer(nn.Module):\n    def forward(self, x):\n        return x\n\n\n"
        "class Attention(nn.Module):\n"
        "    def forward(self, x):\n"
        "        topk_indices = self.indexer(x)\n"
        "        sparse_indices = topk_indices\n"
        "        return self.attend(x, indices=sparse_indices)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import dsa_order_read

    assert not idx.topk_order_unread(dsa_order_read.Indexer)
