"""The hot lane: a call whose signature has run on a backend replays without checks or plan lookup.

Registry level with a toy op (any machine), then the dense GEMMs' signatures and cutile replays with
``cuda.tile.launch`` recorded instead of run (CPU tensors stand in for CUDA ones: only the host path is
under test; the GPU tests run the same calls for real).
"""

from __future__ import annotations

import inspect

import pytest
import torch

import tilegemm
from tilegemm import config
from tilegemm.backend import binding, hot_lane, registry, selector
from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import dispatch, register_impl
from tilegemm.ops import checks, plans


@pytest.fixture
def hot_op(monkeypatch):
    """A toy op with a signature (x's shape and scale) and a cutile replay; records checks, runs and replays."""
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: None)
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    monkeypatch.setattr(registry, "_off_cuda", lambda value: False)  # CPU tensors stand in for CUDA ones
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    monkeypatch.setattr(hot_lane, "_HOT", {})
    log = []

    def check(x, scale):
        log.append("check")
        if scale <= 0:
            raise ValueError("scale must be positive")

    def signature(x, scale):
        if type(scale) is not float:
            return None
        return ("_hot_toy", x.shape, scale), (x, scale)

    @dispatch("_hot_toy", check=check, signature=signature)
    def toy(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor: ...

    @register_impl("_hot_toy", "pytorch")
    def toy_pytorch(x, scale):
        log.append("pytorch")
        return x * scale

    @register_impl("_hot_toy", "cutile")
    def toy_cutile(x, scale):
        log.append("cutile")
        return x * -scale

    @register_replay("_hot_toy", "cutile")
    def toy_replay(derived):
        assert set(derived) == {"x", "scale"}
        log.append("replay built")

        def replay(x, scale):
            log.append("replay")
            return x * -scale

        return replay

    yield toy, log
    for table in (registry._STUBS, registry._IMPLS):
        table.pop("_hot_toy")
    hot_lane._REPLAYS.pop(("_hot_toy", "cutile"))
    hot_lane._REPLAY_OPS.pop("_hot_toy")


def test_second_call_of_a_signature_replays(hot_op):
    toy, log = hot_op
    x = torch.ones(3)
    assert toy(x).tolist() == [-2.0] * 3
    assert log == ["check", "cutile", "replay built"]
    log.clear()
    assert toy(x * 3, scale=2.0).tolist() == [-6.0] * 3  # same signature, by keyword: replayed with the new x
    assert toy(x, 2.0, backend="cutile").tolist() == [-2.0] * 3  # an explicit backend= that matches
    assert log == ["replay", "replay"]


def test_new_signature_backend_or_unkeyed_call_takes_the_full_path(hot_op, monkeypatch):
    toy, log = hot_op
    toy(torch.ones(3))
    log.clear()
    toy(torch.ones(4))  # another shape: a new signature, checked then remembered
    assert log == ["check", "cutile", "replay built"]
    log.clear()
    assert toy(torch.ones(3), backend="pytorch").tolist() == [2.0] * 3
    with selector.use_backend("pytorch"):
        toy(torch.ones(3))
    monkeypatch.setenv("TILEGEMM_BACKEND", "pytorch")
    toy(torch.ones(3))
    monkeypatch.delenv("TILEGEMM_BACKEND")
    assert log == ["check", "pytorch"] * 3  # the pytorch runs never make replays (none registered)
    log.clear()
    toy(torch.ones(3), 2)  # an int scale: no signature, the full path every time
    toy(torch.ones(3), 2)
    assert log == ["check", "cutile"] * 2


def test_no_key_where_no_backend_with_a_replay_can_run(hot_op, monkeypatch):
    """Under the automatic choice an op computes no key when none of the backends that replay it can run here (the
    toy's replay is cutile's, and cutile is made unavailable): the call takes the full path without paying for a key;
    an explicit ``backend=`` still keys."""
    keyed = []

    def stub(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor: ...

    def signature(x, scale):
        keyed.append(1)
        return ("_hot_toy", x.shape, scale), (x, scale)

    lane = hot_lane.Lane("_hot_toy", signature, inspect.signature(stub))
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no cuTile here")
    assert lane.find(None, (torch.ones(3),), {}) is None and not keyed
    assert lane.find("cutile", (torch.ones(3),), {}) is not None and len(keyed) == 1
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: None)
    assert lane.find(None, (torch.ones(3),), {}) is not None and len(keyed) == 2


def test_bad_input_is_never_replayed(hot_op):
    toy, log = hot_op
    toy(torch.ones(3), 1.0)
    with pytest.raises(ValueError, match="positive"):
        toy(torch.ones(3), -1.0)  # a different key (the scale is in it): checked
    with pytest.raises(TypeError, match="_hot_toy"):
        toy(torch.ones(3), 1.0, 5)  # cannot bind: the full path raises


def test_a_replay_that_raises_unsupported_takes_the_full_path(hot_op):
    """A replay may meet what its backend lacks (a JIT specialization the compiler rejects): the call then
    takes the full path, where the backend raises again and the call falls back to pytorch."""
    toy, log = hot_op
    toy(torch.ones(3))

    def rejected(x, scale):
        log.append("replay")
        raise registry.Unsupported("not this specialization")

    assert len(hot_lane._HOT) == 2  # the automatic choice's key and the backend's (explicit backend= shares it)
    for key in hot_lane._HOT:
        hot_lane._HOT[key] = rejected
    registry._IMPLS["_hot_toy"]["cutile"] = rejected
    log.clear()
    with pytest.warns(registry.FallbackWarning, match="not this specialization"):
        assert toy(torch.ones(3)).tolist() == [2.0] * 3
    assert log == ["replay", "check", "replay", "pytorch"]


def test_clear_hot_lane(hot_op):
    toy, log = hot_op
    toy(torch.ones(3))
    hot_lane.clear_hot_lane()
    log.clear()
    toy(torch.ones(3))
    assert log == ["check", "cutile", "replay built"]


def test_flattener_follows_python_binding():
    import inspect

    def stub(a, b, c=1, *, k=2, s=None): ...

    flat = binding.flattener(inspect.signature(stub))
    assert flat((1, 2), {}) == (1, 2, 1, 2, None)
    assert flat((1, 2, 3), {"s": 4}) == (1, 2, 3, 2, 4)
    assert flat((1,), {"b": 2}) is None  # a required argument by keyword: the full path binds it
    assert flat((1, 2), {"a": 1}) is None  # repeated
    assert flat((1, 2), {"zz": 1}) is None  # unknown
    assert flat((1, 2, 3, 4), {}) is None  # too many positionals


# ------------------------------------------------------------------------------ dense GEMMs


def _operands(m=8, n=16, k=256):
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(n, k).bfloat16()
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


def test_dense_signature_refuses_what_it_cannot_vouch_for():
    sig = tilegemm.bf16_gemm_nt.hot_signature
    a, b, d = _operands()
    key, operands = sig(a, b, d, None, "nk", 1.0, 1.0, None)
    assert operands == (a, b, d, None, 1.0, 1.0)
    assert sig(a, b, d, None, "nk", 1.0, 1.0, None)[0] == key  # same metadata, same key
    assert sig(a.clone(), b.clone(), d.clone(), None, "nk", 1.0, 1.0, None)[0] == key  # new tensors
    refused = {
        "a stream": (a, b, d, None, "nk", 1.0, 1.0, object()),
        "an int alpha": (a, b, d, None, "nk", 1, 1.0, None),
        "a bool beta": (a, b, d, None, "nk", 1.0, True, None),
        "an fp16 operand": (a.half(), b, d, None, "nk", 1.0, 1.0, None),
        "an fp16 output": (a, b, d.half(), None, "nk", 1.0, 1.0, None),
        "a misaligned operand": (torch.zeros(2049).bfloat16()[1:].view(8, 256), b, d, None, "nk", 1.0, 1.0, None),
        "an output that requires grad": (a, b, d.float().requires_grad_(), None, "nk", 1.0, 1.0, None),
        "a non-str compiled_dims": (a, b, d, None, 3, 1.0, 1.0, None),
        "a non-tensor": (a.numpy, b, d, None, "nk", 1.0, 1.0, None),
    }
    for what, values in refused.items():
        assert sig(*values) is None, what
    other = [
        sig(a[:4], b, d[:4], None, "nk", 1.0, 1.0, None)[0],  # shape
        sig(a, b, d.float(), None, "nk", 1.0, 1.0, None)[0],  # output dtype
        sig(a, b, d, d, "nk", 1.0, 1.0, None)[0],  # a c
        sig(a, b, d, None, "nk", 1.0, 0.5, None)[0],  # beta
        sig(torch.randn(256, 8).bfloat16().t(), b, d, None, "nk", 1.0, 1.0, None)[0],  # strides
    ]
    assert len({key, *other}) == 1 + len(other)


def test_dense_signatures_give_the_checks_logical_form():
    for layout, (flip_a, flip_b) in checks.LAYOUTS.items():
        a, b, d = _operands()
        a, b = (a.t().contiguous() if flip_a else a), (b.t().contiguous() if flip_b else b)
        _, operands = getattr(tilegemm, f"bf16_gemm_{layout}").hot_signature(a, b, d, None, "nk", 1.0, 1.0, None)
        derived = checks.dense_gemm_check(layout, fp8=False)(a, b, d)
        for got, want in zip(operands[:2], (derived["a"], derived["b"])):
            assert got.shape == want.shape and got.stride() == want.stride() and got.data_ptr() == want.data_ptr()
        a8, b8 = tilegemm.per_token_cast_to_fp8(a.float()), tilegemm.per_block_cast_to_fp8(b.float())
        if flip_a:
            a8 = tuple(x.t().contiguous() for x in tilegemm.per_token_cast_to_fp8(a.t().float()))
        if flip_b:
            b8 = tuple(x.t().contiguous() for x in tilegemm.per_block_cast_to_fp8(b.t().float()))
        sig8 = getattr(tilegemm, f"fp8_gemm_{layout}").hot_signature
        _, operands = sig8(a8, b8, d, None, None, None, None, "nk", False, 1.0, 1.0, None)
        derived = checks.dense_gemm_check(layout, fp8=True)(a8, b8, d)
        for got, want in zip(operands[:2], (derived["a"], derived["b"])):
            assert [(t.shape, t.stride()) for t in got] == [(t.shape, t.stride()) for t in want]
        assert sig8(a8, b8, d, None, [1, 128, 128], None, None, "nk", False, 1.0, 1.0, None) is None  # a list
        assert sig8(list(a8), b8, d, None, None, None, None, "nk", False, 1.0, 1.0, None) is None


def test_m_grouped_signature_refuses_what_it_cannot_vouch_for(monkeypatch):
    """The m-grouped FP8 key: the same for new tensors and new ``m_indices`` values of the same metadata; none for
    what the check would read otherwise (a stream, other dtypes, a misaligned tensor, an output that requires grad,
    value checks on); another key for other metadata, scalars or settings. The ``nn`` op's operands are the check's
    logical form."""
    sig = tilegemm.m_grouped_fp8_gemm_nt_contiguous.hot_signature
    index = torch.zeros(256, dtype=torch.int32)
    a = tilegemm.per_token_cast_to_fp8(torch.randn(256, 512))
    b = tilegemm.per_block_cast_to_fp8(torch.randn(2, 256, 512))
    d = torch.empty(256, 256, dtype=torch.bfloat16)
    rest = (None, None, None, "nk", False, False, True, None, None, None)  # recipes .. expected_m, alignment, stream

    def call(*head, **changed):
        values = dict(zip(sig.parameters, (*head, *rest)))
        values.update(changed)
        return sig(*values.values())

    key, operands = call(a, b, d, index)
    assert operands == (a, b, d, index)
    assert call(tuple(x.clone() for x in a), b, d.clone(), index + 1)[0] == key  # new tensors, new group ids
    misaligned = torch.zeros(256 * 256 + 1, dtype=torch.bfloat16)[1:].view(256, 256)
    refused = {
        "a stream": call(a, b, d, index, stream=object()),
        "int64 m_indices": call(a, b, d, index.long()),
        "bf16 scales": call(a, (b[0], b[1].bfloat16()), d, index),
        "an fp16 output": call(a, b, d.half(), index),
        "a misaligned output": call(a, b, misaligned, index),
        "an output that requires grad": call(a, b, d.float().requires_grad_(), index),
        "a list recipe": call(a, b, d, index, recipe=[1, 128, 128]),
        "an int use_psum_layout": call(a, b, d, index, use_psum_layout=1),
    }
    assert [what for what, found in refused.items() if found is not None] == []
    other = [
        call(a, b, d.float(), index)[0],  # output dtype
        call(a, b, d, index, use_psum_layout=True)[0],
        call(a, b, d, index, alignment=64)[0],
    ]
    monkeypatch.setattr(config, "_num_sms", 66)
    other.append(call(a, b, d, index)[0])
    assert len({key, *other}) == 1 + len(other)
    monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "1")
    assert call(a, b, d, index) is None, "the check reads m_indices' values: full path"
    monkeypatch.delenv("TILEGEMM_CHECK_VALUES")
    bt = tuple(x.transpose(1, 2).contiguous() for x in b)
    nn = tilegemm.m_grouped_fp8_gemm_nn_contiguous.hot_signature
    _, operands = nn(a, bt, d, index, *rest[:7], *rest[8:])
    derived = checks.m_grouped_contiguous_check("nn", fp8=True)(a, bt, d, index)
    assert [(t.shape, t.stride()) for t in operands[1]] == [(t.shape, t.stride()) for t in derived["b"]]


def test_dense_calls_replay_with_the_new_tensors(recorded_launches, monkeypatch):
    checked = []
    original = checks.dense._gemm_placement
    monkeypatch.setattr(checks.dense, "_gemm_placement", lambda *args, **kw: checked.append(1) or original(*args, **kw))
    for call, fp8 in ((tilegemm.bf16_gemm_nt, False), (tilegemm.fp8_gemm_nt, True)):
        recorded_launches.clear()
        checked.clear()
        for _ in range(3):
            a, b, d = _operands()
            if fp8:
                a, b = tilegemm.per_token_cast_to_fp8(a.float()), tilegemm.per_block_cast_to_fp8(b.float())
            assert call(a, b, d, backend="cutile") is d
            data = (a[0], b[0]) if fp8 else (a, b)
            launched = recorded_launches[-1]
            assert any(x is d for x in launched)  # this call's output ...
            assert {x.data_ptr() for x in data} <= {x.data_ptr() for x in launched if isinstance(x, torch.Tensor)}
        assert len(checked) == 1  # ... and only the first call was checked
        assert len(recorded_launches) == 3


def test_plan_reads_c_not_d_after_a_call_where_c_was_d(recorded_launches):
    """A plan is keyed by metadata only: one first built for ``c is d`` must read the next call's own ``c``."""
    a, b, d = _operands()
    tilegemm.bf16_gemm_nt(a, b, d, d, backend="cutile")
    c = torch.randn_like(d)
    tilegemm.bf16_gemm_nt(a, b, d, c, backend="cutile")
    launched = recorded_launches[-1]
    assert launched[2] is d and launched[3] is c  # (A, B, D, C, ...) of the kernel


# ------------------------------------------------------------------------------ paged MQA logits


def _paged_operands(next_n=2, h=64, d=128, block_kv=64, seed=0):
    """CPU operands of a paged call over 3 sequences, in the op's parameter order (q .. schedule_meta)."""
    from tilegemm import indexer

    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(n, d, generator=g) for n in (130, 7, 300)]
    cache, table, ctx = indexer.build_paged_kv_cache(keys, block_kv, num_blocks=20, generator=g)
    q = torch.randn(3, next_n, h, d, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(3 * next_n, h, generator=g)
    meta = tilegemm.get_paged_mqa_logits_metadata(ctx, block_kv, 4, backend="pytorch")
    return q, cache, w, ctx, table, meta


def test_paged_signature_refuses_what_it_cannot_vouch_for():
    sig = tilegemm.fp8_paged_mqa_logits.hot_signature
    sig4 = tilegemm.fp8_fp4_paged_mqa_logits.hot_signature
    q, cache, w, ctx, table, meta = _paged_operands()
    key, operands = sig(q, cache, w, ctx, table, meta, 320, False, None, None)
    assert all(x is y for x, y in zip(operands, (q, cache, w, ctx, table, meta)))
    assert (
        sig(q.clone(), cache.clone(), w.clone(), ctx.clone(), table.clone(), meta.clone(), 320, False, None, None)[0]
        == key
    )
    key4, operands4 = sig4((q, None), cache, w, ctx, table, meta, 320, False, torch.float32, None, None)
    assert operands4[0] is q
    q_strided = q.transpose(0, 1).contiguous().transpose(0, 1)
    refused = {
        "a stream": (q, cache, w, ctx, table, meta, 320, False, None, object()),
        "indices": (q, cache, w, ctx, table, meta, 320, False, torch.zeros(3, dtype=torch.int32), None),
        "a non-contiguous q": (q_strided, cache, w, ctx, table, meta, 320, False, None, None),
        "int64 lengths": (q, cache, w, ctx.long(), table, meta, 320, False, None, None),
        "bf16 weights with fp32 logits": (q, cache, w.bfloat16(), ctx, table, meta, 320, False, None, None),
        "a tensor width": (q, cache, w, ctx, table, meta, torch.tensor(320), False, None, None),
        "an int clean_logits": (q, cache, w, ctx, table, meta, 320, 0, None, None),
        "a non-tensor": (q, cache.numpy(), w, ctx, table, meta, 320, False, None, None),
    }
    for what, values in refused.items():
        assert sig(*values) is None, what
    assert sig4((q, torch.ones(1)), cache, w, ctx, table, meta, 320, False, torch.float32, None, None) is None  # FP4
    other = [
        sig(q[:2], cache, w[:4], ctx[:2], table[:2], meta, 320, False, None, None)[0],  # batch
        sig(q, cache, w, ctx, table, meta, 512, False, None, None)[0],  # width
        sig(q, cache, w, ctx, table, meta, 320, True, None, None)[0],  # clean_logits
        sig(q, cache, w, ctx[:, None].expand(3, 2).contiguous(), table, meta, 320, False, None, None)[0],  # 2-D lengths
        sig4(q, cache, w.bfloat16(), ctx, table, meta, 320, False, torch.bfloat16, None, None)[0],  # bf16
    ]
    assert len({key, *other}) == 1 + len(other)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEGEMM_CHECK_VALUES", "1")
        assert sig(q, cache, w, ctx, table, meta, 320, False, None, None) is None  # value checks run on every call


def test_paged_views_read_the_cache_bytes():
    """Keys and scales as views of DeepGEMM's block layout (keys token-major, then the block's fp32 scales)."""
    from tilegemm.ops.cutile import mqa

    q, cache, *_ = _paged_operands(d=64, block_kv=32)
    raw = cache.view(torch.uint8).reshape(cache.shape[0], -1)
    for base in (cache, torch.cat([cache, cache])[cache.shape[0] :]):  # also at a storage offset
        keys, scales = mqa.paged_views(base, 64)
        assert keys.shape == (20, 32, 64) and scales.shape == (20, 32)
        assert torch.equal(keys.view(torch.uint8).reshape(20, -1), raw[:, : 32 * 64])
        assert torch.equal(scales.contiguous().view(torch.uint8).reshape(20, -1), raw[:, 32 * 64 :])


@pytest.mark.parametrize("fp4_form", [False, True])
def test_paged_calls_replay_what_the_full_path_launched(recorded_launches, monkeypatch, fp4_form):
    from tilegemm.ops.cutile import mqa

    monkeypatch.setattr(mqa, "_check_arch", lambda t: 90)
    checked = []
    original = checks.mqa._same_device
    monkeypatch.setattr(checks.mqa, "_same_device", lambda tensors: checked.append(1) or original(tensors))
    call = tilegemm.fp8_fp4_paged_mqa_logits if fp4_form else tilegemm.fp8_paged_mqa_logits
    calls = [_paged_operands(seed=seed) for seed in range(3)]  # same metadata, new tensors
    checked.clear()
    for q, cache, w, ctx, table, meta in calls:
        out = call((q, None) if fp4_form else q, cache, w, ctx, table, meta, 320, True, backend="cutile")
        assert out.shape == (6, 320) and out.dtype == torch.float32 and bool(torch.isneginf(out).all())
        launched = recorded_launches[-1]
        assert launched[0] is q and launched[4] is ctx and launched[5] is table and launched[6] is meta
        assert launched[7].data_ptr() == out.data_ptr()  # this call's own output
    assert len(checked) == 1 and len(recorded_launches) == 3  # only the first call was checked
    full, replayed = recorded_launches[0], recorded_launches[1]
    arrays = [(x.shape, x.stride(), x.dtype) for x in full[:8]]
    assert arrays == [(x.shape, x.stride(), x.dtype) for x in replayed[:8]]
    assert full[8:] == replayed[8:]  # the same constants


def test_a_forced_decode_variant_takes_a_new_plan(recorded_launches, monkeypatch):
    """``TILEGEMM_DECODE_VARIANT`` is part of the plan key and of the hot-lane key: setting it between two calls of
    one shape builds the forced variant's plan instead of replaying the first."""

    monkeypatch.delenv("TILEGEMM_DECODE_VARIANT", raising=False)
    a, b, d = _operands(m=16, n=64, k=256)
    tilegemm.bf16_gemm_nt(a, b, d, backend="cutile")
    tilegemm.bf16_gemm_nt(a, b, d, backend="cutile")
    before = dict(plans._PLANS)
    monkeypatch.setenv("TILEGEMM_DECODE_VARIANT", "w64k128")
    tilegemm.bf16_gemm_nt(a, b, d, backend="cutile")
    new = [key for key in plans._PLANS if key not in before]
    assert len(new) == 1 and "w64k128" in new[0]
    assert len(recorded_launches) == 3


# ------------------------------------------------------------------------------ ragged MQA logits


def _ragged_operands(bf16: bool, seed: int = 0, s: int = 3, s_kv: int = 300, h: int = 64, d: int = 128):
    """CPU operands of a ragged call (q, kv, weights, ks, ke): bf16, or fp8 with (keys, fp32 scales)."""
    g = torch.Generator().manual_seed(seed)
    q, keys = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g)
    w = torch.randn(s, h, generator=g)
    ke = torch.randint(1, s_kv + 1, (s,), generator=g, dtype=torch.int32)
    ks = torch.zeros(s, dtype=torch.int32)
    if bf16:
        return q.bfloat16(), keys.bfloat16(), w, ks, ke
    fp8 = torch.float8_e4m3fn
    return q.to(fp8), (keys.to(fp8), torch.rand(s_kv, generator=g)), w, ks, ke


def test_ragged_signature_refuses_what_it_cannot_vouch_for(monkeypatch):
    monkeypatch.delenv("TILEGEMM_MQA_VARIANT", raising=False)
    sig = tilegemm.bf16_mqa_logits.hot_signature
    sig8 = tilegemm.fp8_mqa_logits.hot_signature
    sig4 = tilegemm.fp8_fp4_mqa_logits.hot_signature
    q, kv, w, ks, ke = _ragged_operands(bf16=True)
    key, operands = sig(q, kv, w, ks, ke, False, 0, torch.float32, None)
    assert all(x is y for x, y in zip(operands, (q, kv, w, ks, ke)))
    assert sig(q.clone(), kv.clone(), w.clone(), ks.clone(), ke.clone(), False, 0, torch.float32, None)[0] == key
    q8, kv8, w8, ks8, ke8 = _ragged_operands(bf16=False)
    assert sig8(q8, kv8, w8, ks8, ke8, False, 0, None) is not None
    assert sig4((q8, None), kv8, w8, ks8, ke8, False, 0, torch.float32, None)[1][0] is q8
    refused = {
        "a stream": (q, kv, w, ks, ke, False, 0, torch.float32, object()),
        "a non-contiguous kv": (q, kv.t().contiguous().t(), w, ks, ke, False, 0, torch.float32, None),
        "int64 windows": (q, kv, w, ks.long(), ke, False, 0, torch.float32, None),
        "bf16 weights": (q, kv, w.bfloat16(), ks, ke, False, 0, torch.float32, None),
        "an int clean_logits": (q, kv, w, ks, ke, 0, 0, torch.float32, None),
        "fp8 operands": (q8, kv8[0], w, ks, ke, False, 0, torch.float32, None),
    }
    for what, values in refused.items():
        assert sig(*values) is None, what
    assert sig8(q8, (kv8[0], kv8[1].double()), w8, ks8, ke8, False, 0, None) is None  # fp64 key scales
    other = [
        sig(q[:2], kv, w[:2], ks[:2], ke[:2], False, 0, torch.float32, None)[0],  # rows
        sig(q, kv, w, ks, ke, True, 0, torch.float32, None)[0],  # clean_logits
        sig(q, kv, w, ks, ke, False, 64, torch.float32, None)[0],  # compressed
        sig(q, kv, w, ks, ke, False, 0, torch.bfloat16, None)[0],  # logits dtype
    ]
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")
    other.append(sig(q, kv, w, ks, ke, False, 0, torch.float32, None)[0])  # the forced variant
    monkeypatch.setattr(config, "_num_sms", 66)
    other.append(sig(q, kv, w, ks, ke, False, 0, torch.float32, None)[0])  # set_num_sms: the decode kernel's grid
    assert len({key, *other}) == 1 + len(other)
    monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "1")
    assert sig(q, kv, w, ks, ke, False, 0, torch.float32, None) is None  # value checks run on every call


@pytest.mark.parametrize("forced", [None, "decode"])
@pytest.mark.parametrize("name", ["bf16_mqa_logits", "fp8_mqa_logits", "fp8_fp4_mqa_logits"])
def test_ragged_calls_replay_what_the_full_path_launched(recorded_launches, monkeypatch, name, forced):
    """The first call takes the full path (checked), the next ones replay it: the same kernels, grids and
    constants, on each call's own tensors and output."""
    import cuda.tile as ct

    from tilegemm.ops.cutile import mqa

    monkeypatch.setattr(mqa, "_check_arch", lambda t: 90)
    if forced is None:
        monkeypatch.delenv("TILEGEMM_MQA_VARIANT", raising=False)
    else:
        monkeypatch.setenv("TILEGEMM_MQA_VARIANT", forced)
    launches = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launches.append((grid, kernel, args)))
    checked = []
    original = checks.mqa._same_device
    monkeypatch.setattr(checks.mqa, "_same_device", lambda tensors: checked.append(1) or original(tensors))
    call = getattr(tilegemm, name)
    bf16 = name.startswith("bf16")
    per_call = []
    for seed in range(3):
        q, kv, w, ks, ke = _ragged_operands(bf16, seed=seed)
        before = len(launches)
        out = call((q, None) if name.startswith("fp8_fp4") else q, kv, w, ks, ke, True, backend="cutile")
        assert out.shape == (3, 300) and out.dtype == torch.float32
        made = launches[before:]
        assert len(made) == 2  # the logits kernel, then the clean kernel
        keys = kv if bf16 else kv[0]
        assert made[0][2][0] is q and made[0][2][1] is keys and made[0][2][3] is w
        assert made[0][2][6].data_ptr() == out.data_ptr() and made[1][2][2].data_ptr() == out.data_ptr()
        if not bf16:
            assert made[0][2][2] is kv[1]
        else:
            assert bool((made[0][2][2] == 1).all()) and made[0][2][2].shape == (300,)
        per_call.append(
            [(grid, kernel, tuple(a for a in args if not isinstance(a, torch.Tensor))) for grid, kernel, args in made]
        )
    assert len(checked) == 1  # only the first call was checked
    assert per_call[0] == per_call[1] == per_call[2]
    decode_grid = per_call[0][0][0][1] > 1  # the decode kernel splits the keys over a second grid dim
    assert decode_grid == (forced == "decode")


def test_paged_schedule_replays_the_same_ops(recorded_launches, monkeypatch):
    """``get_paged_mqa_logits_metadata``: the first call is checked, later calls of its key replay the schedule
    kernel (one launch) on their own lengths; ``indices`` or int64 lengths take the full path. The kernel's values
    are the reference's: ``tests/ops/test_mqa_prep.py`` (GPU)."""
    sig = tilegemm.get_paged_mqa_logits_metadata.hot_signature
    ctx = torch.tensor([130, 7, 300], dtype=torch.int32)
    assert sig(ctx, 64, 4, None) is not None
    assert sig(ctx, 64, 4, torch.zeros(3, dtype=torch.int32)) is None and sig(ctx.long(), 64, 4, None) is None
    assert sig(ctx, 64, 4, None)[0] != sig(ctx, 32, 4, None)[0] != sig(ctx, 64, 8, None)[0]
    checked = []
    original = checks.mqa._context_lens
    monkeypatch.setattr(checks.mqa, "_context_lens", lambda *a: checked.append(1) or original(*a))
    for lengths in ([130, 7, 300], [1, 2000, 65], [0, 0, 9]):
        ctx = torch.tensor(lengths, dtype=torch.int32)
        meta = tilegemm.get_paged_mqa_logits_metadata(ctx, 64, 4, backend="cutile")
        lens, out = recorded_launches[-1][:2]
        assert out is meta and meta.shape == (5, 2) and torch.equal(lens.view(-1), ctx)
    assert len(checked) == 1 and len(recorded_launches) == 3
