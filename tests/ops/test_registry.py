"""Registry behaviour: binding, backend choice, fallback, introspection, the public API's shape."""

import asyncio
import contextlib
import inspect
import logging
import threading
import warnings

import pytest
import torch

import tilegemm
from tilegemm.backend import registry, selector
from tilegemm.backend.registry import FallbackWarning, Unsupported, dispatch, register_impl

DESIGN_OPS = {
    "bf16_gemm_nt",
    "bf16_gemm_nn",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "fp8_gemm_nt",
    "fp8_gemm_nn",
    "fp8_gemm_tn",
    "fp8_gemm_tt",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "fp8_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "fp8_paged_mqa_logits",
}

# The public signatures: (name, default) per parameter, in order.
_DENSE_BF16 = [("a", None), ("b", None), ("d", None), ("c", None), ("alpha", 1.0), ("beta", 1.0), ("stream", None)]
_DENSE_FP8 = _DENSE_BF16[:-1] + [("recipe", None), ("disable_ue8m0_cast", False), ("stream", None)]
SIGNATURES = {
    **{f"bf16_gemm_{lay}": _DENSE_BF16 for lay in ("nt", "nn", "tn", "tt")},
    **{f"fp8_gemm_{lay}": _DENSE_FP8 for lay in ("nt", "nn", "tn", "tt")},
    **{
        f"m_grouped_bf16_gemm_{lay}_contiguous": [
            ("a", None),
            ("b", None),
            ("d", None),
            ("m_indices", None),
            ("use_psum_layout", False),
            ("stream", None),
        ]
        for lay in ("nt", "nn")
    },
    **{
        f"m_grouped_fp8_gemm_{lay}_contiguous": [
            ("a", None),
            ("b", None),
            ("d", None),
            ("m_indices", None),
            ("use_psum_layout", False),
            ("disable_ue8m0_cast", False),
            ("stream", None),
        ]
        for lay in ("nt", "nn")
    },
    "m_grouped_bf16_gemm_nt_masked": [
        ("a", None),
        ("b", None),
        ("d", None),
        ("masked_m", None),
        ("expected_m", None),
        ("stream", None),
    ],
    "m_grouped_fp8_gemm_nt_masked": [
        ("a", None),
        ("b", None),
        ("d", None),
        ("masked_m", None),
        ("expected_m", None),
        ("disable_ue8m0_cast", False),
        ("stream", None),
    ],
    **{
        f"k_grouped_{dt}_gemm_tn_contiguous": [
            ("a", None),
            ("b", None),
            ("d", None),
            ("ks", None),
            ("ks_tensor", None),
            ("c", None),
            ("stream", None),
        ]
        for dt in ("bf16", "fp8")
    },
    "fp8_mqa_logits": [
        ("q", None),
        ("kv", None),
        ("weights", None),
        ("cu_seq_len_k_start", None),
        ("cu_seq_len_k_end", None),
        ("clean_logits", True),
        ("stream", None),
    ],
    "get_paged_mqa_logits_metadata": [("context_lens", None), ("block_kv", None), ("num_sms", None)],
    "fp8_paged_mqa_logits": [
        ("q", None),
        ("kv_cache", None),
        ("weights", None),
        ("context_lens", None),
        ("block_table", None),
        ("schedule_meta", None),
        ("max_context_len", None),
        ("clean_logits", True),
        ("stream", None),
    ],
}


@pytest.fixture
def toy_op():
    """A private op with a pytorch and a cutile impl that record what they received."""
    calls = []

    @dispatch("_toy_op", check=lambda x, scale, flag: None if x >= 0 else (_ for _ in ()).throw(ValueError("x<0")))
    def toy(x: int, scale: float = 2.0, flag: str = "default") -> float: ...

    @register_impl("_toy_op", "pytorch")
    def toy_pytorch(x, scale, flag):
        calls.append(("pytorch", x, scale, flag))
        return x * scale

    @register_impl("_toy_op", "cutile")
    def toy_cutile(x, scale, flag):
        if flag == "unsupported":
            raise Unsupported("flag value not in this kernel")
        calls.append(("cutile", x, scale, flag))
        return -x * scale

    yield toy, calls
    registry._STUBS.pop("_toy_op")
    registry._IMPLS.pop("_toy_op")


@pytest.fixture
def cutile_present(monkeypatch):
    """Pretend the cutile backend can run (no GPU here): only the registry's logic is under test."""
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: None)
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})  # as if `tilegemm.ops.cutile` had imported
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    monkeypatch.delenv("TILEGEMM_DISABLE_FALLBACK", raising=False)


def test_public_api_has_every_design_op():
    assert DESIGN_OPS <= set(tilegemm.list_ops())
    for name in DESIGN_OPS:
        assert callable(getattr(tilegemm, name))


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_match_design(name):
    params = list(inspect.signature(getattr(tilegemm, name)).parameters.values())
    assert params[-1].name == "backend" and params[-1].kind is inspect.Parameter.KEYWORD_ONLY
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params[:-1]]
    assert got == SIGNATURES[name]
    assert getattr(tilegemm, name).__doc__ and len(getattr(tilegemm, name).__doc__) > 80


def test_stub_defaults_are_applied(toy_op, cutile_present):
    toy, calls = toy_op
    assert toy(3, backend="pytorch") == 6.0
    assert calls[-1] == ("pytorch", 3, 2.0, "default")
    assert toy(3, flag="x", backend="cutile") == -6.0
    assert calls[-1] == ("cutile", 3, 2.0, "x")


def test_bad_binding_is_a_type_error(toy_op):
    toy, _ = toy_op
    with pytest.raises(TypeError, match="_toy_op"):
        toy(1, 2.0, "a", "extra")


def test_binding_matches_python_rules(toy_op):
    toy, calls = toy_op
    assert toy(flag="f", x=3, backend="pytorch") == 6.0  # keywords in any order, defaults filled
    assert calls[-1] == ("pytorch", 3, 2.0, "f")
    for bad in (lambda: toy(), lambda: toy(1, x=2), lambda: toy(1, nope=2)):  # missing, repeated, unknown
        with pytest.raises(TypeError, match="_toy_op"):
            bad()


def test_check_runs_before_any_backend(toy_op):
    toy, calls = toy_op
    with pytest.raises(ValueError):
        toy(-1, backend="pytorch")
    assert calls == []


def test_choice_order(toy_op, cutile_present, monkeypatch):
    toy, calls = toy_op
    assert selector.get_current_backend() == "cutile"  # default: available cutile
    monkeypatch.setenv("TILEGEMM_BACKEND", "pytorch")
    assert selector.get_current_backend() == "pytorch"
    tilegemm.set_backend("cutile")
    try:
        assert selector.get_current_backend() == "cutile"  # set_backend beats the env
        with tilegemm.use_backend("pytorch"):
            assert toy(1) == 2.0  # context beats set_backend
            assert toy(1, backend="cutile") == -2.0  # the call's keyword beats everything
        assert toy(1) == -2.0
    finally:
        tilegemm.set_backend(None)
    assert [c[0] for c in calls] == ["pytorch", "cutile", "cutile"]


def test_unknown_backend_lists_known_ones(toy_op):
    toy, _ = toy_op
    known = r"\['cutile', 'pytorch'\]"
    with pytest.raises(ValueError, match=known):
        toy(1, backend="triton")
    with pytest.raises(ValueError, match=known):
        tilegemm.set_backend("cuda")
    with pytest.raises(ValueError, match=known):
        with tilegemm.use_backend("tensorrt"):
            pass


def test_env_backend_is_validated(monkeypatch):
    monkeypatch.setenv("TILEGEMM_BACKEND", "nope")
    with pytest.raises(ValueError, match=r"TILEGEMM_BACKEND: got 'nope', expected one of \['cutile', 'pytorch'\]"):
        selector.get_current_backend()
    monkeypatch.setenv("TILEGEMM_BACKEND", "cuda")
    with pytest.raises(ValueError, match="TILEGEMM_BACKEND"):
        selector.get_current_backend()


def test_use_backend_does_not_leak_between_asyncio_tasks(monkeypatch):
    """Two tasks on one thread: a scope entered in one is invisible to the other while it is suspended."""
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    outside = selector.get_current_backend()
    other = "cutile" if outside == "pytorch" else "pytorch"

    async def scoped(entered: asyncio.Event, done: asyncio.Event) -> list[str]:
        with tilegemm.use_backend(other):
            entered.set()
            await done.wait()  # suspended inside the scope while the other task runs
            return [selector.get_current_backend()]

    async def unscoped(entered: asyncio.Event, done: asyncio.Event) -> list[str]:
        await entered.wait()
        seen = [selector.get_current_backend()]
        with tilegemm.use_backend(outside):
            await asyncio.sleep(0)
            seen.append(selector.get_current_backend())
        done.set()
        return seen

    async def main() -> tuple[list[str], list[str]]:
        entered, done = asyncio.Event(), asyncio.Event()
        a, b = await asyncio.gather(scoped(entered, done), unscoped(entered, done))
        return a, b

    a, b = asyncio.run(main())
    assert a == [other] and b == [outside, outside]
    assert selector.get_current_backend() == outside


def test_use_backend_in_suspended_generator_does_not_leak(monkeypatch):
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    outside = selector.get_current_backend()
    other = "cutile" if outside == "pytorch" else "pytorch"

    def gen():
        with tilegemm.use_backend(other):
            yield selector.get_current_backend()
            yield selector.get_current_backend()

    g = gen()
    assert next(g) == other
    assert selector.get_current_backend() == outside  # the caller, while the generator is suspended
    with tilegemm.use_backend(other):
        assert selector.get_current_backend() == other
        assert next(g) == other
    assert selector.get_current_backend() == outside
    g.close()
    assert selector.get_current_backend() == outside


def test_use_backend_through_contextlib_applies_to_the_with_block(monkeypatch):
    """A @contextmanager wrapping use_backend and ExitStack.enter_context scope the caller's block."""
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    outside = selector.get_current_backend()
    other = "cutile" if outside == "pytorch" else "pytorch"

    @contextlib.contextmanager
    def wrapped():
        with tilegemm.use_backend(other) as name:
            yield name

    with wrapped() as name:
        assert name == other and selector.get_current_backend() == other
    with contextlib.ExitStack() as stack:
        stack.enter_context(tilegemm.use_backend(other))
        assert selector.get_current_backend() == other
    assert selector.get_current_backend() == outside


def test_use_backend_is_per_thread(monkeypatch):
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    outside = selector.get_current_backend()
    other = "cutile" if outside == "pytorch" else "pytorch"
    seen = []
    with tilegemm.use_backend(other):
        thread = threading.Thread(target=lambda: seen.append(selector.get_current_backend()))
        thread.start()
        thread.join()
        assert selector.get_current_backend() == other
    assert seen == [outside]


def test_dispatch_decisions_logged_at_debug(toy_op, cutile_present, caplog):
    toy, _ = toy_op
    with caplog.at_level(logging.DEBUG, logger="tilegemm.dispatch"):
        toy(1, backend="cutile")
        with pytest.warns(FallbackWarning):
            toy(1, flag="unsupported", backend="cutile")
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tilegemm.dispatch"]
    assert records[0] == (logging.DEBUG, "_toy_op -> cutile")
    assert records[1][0] == logging.DEBUG and records[1][1].startswith("_toy_op -> pytorch (fallback from cutile")


def test_no_dispatch_log_by_default(toy_op, caplog, monkeypatch):
    toy, _ = toy_op
    monkeypatch.delenv("TILEGEMM_DEBUG", raising=False)
    with caplog.at_level(logging.INFO, logger="tilegemm.dispatch"):
        toy(1, backend="pytorch")
    assert not [r for r in caplog.records if r.name == "tilegemm.dispatch"]


@pytest.mark.parametrize("text", ["0", "false", "No", "OFF", ""])
def test_disable_fallback_false_values_warn(toy_op, cutile_present, monkeypatch, text):
    toy, _ = toy_op
    registry.reset_fallback_warnings()
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", text)
    with pytest.warns(FallbackWarning):
        assert toy(2, flag="unsupported", backend="cutile") == 4.0


def test_disable_fallback_bad_value_names_the_variable(toy_op, cutile_present, monkeypatch):
    toy, calls = toy_op
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "maybe")
    with pytest.raises(ValueError, match="TILEGEMM_DISABLE_FALLBACK: got 'maybe'"):
        toy(2, flag="unsupported", backend="cutile")
    assert calls == []


def test_unsupported_case_falls_back_with_one_warning(toy_op, cutile_present):
    toy, calls = toy_op
    with pytest.warns(FallbackWarning, match="flag value not in this kernel"):
        assert toy(2, flag="unsupported", backend="cutile") == 4.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert toy(5, flag="unsupported", backend="cutile") == 10.0  # same (op, reason): silent
    registry.reset_fallback_warnings()
    with pytest.warns(FallbackWarning):
        toy(2, flag="unsupported", backend="cutile")
    assert [c[0] for c in calls] == ["pytorch"] * 3


@pytest.mark.parametrize("text", ["1", "true", "YES", "On"])
def test_disable_fallback_raises(toy_op, cutile_present, monkeypatch, text):
    toy, calls = toy_op
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", text)
    with pytest.raises(RuntimeError, match="fallback is disabled"):
        toy(2, flag="unsupported", backend="cutile")
    assert calls == []


def test_unavailable_cutile_falls_back(toy_op, monkeypatch):
    toy, calls = toy_op
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no CUDA GPU")
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    with pytest.warns(FallbackWarning, match="no CUDA GPU"):
        assert toy(1, backend="cutile") == 2.0
    assert calls == [("pytorch", 1, 2.0, "default")]


def test_cpu_tensors_never_reach_cutile(cutile_present):
    pytest.importorskip("cuda.tile")  # the real cutile impl of bf16_gemm_nt must be registered
    a = torch.randn(4, 8).bfloat16()
    b = torch.randn(3, 8).bfloat16()
    d = torch.empty(4, 3)
    with pytest.warns(FallbackWarning, match="CUDA tensors"):
        tilegemm.bf16_gemm_nt(a, b, d, backend="cutile")
    torch.testing.assert_close(d, a.float() @ b.float().T)


def test_introspection_without_gpu(monkeypatch):
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no CUDA GPU")
    assert selector.get_available_backends() == ["pytorch"]
    assert tilegemm.get_available_backends_for_op("bf16_gemm_nt") == ["pytorch"]
    with pytest.raises(ValueError, match="not_an_op"):
        tilegemm.get_available_backends_for_op("not_an_op")


def test_failed_backend_import_falls_back(toy_op, monkeypatch):
    toy, calls = toy_op
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {"cutile": "ImportError: no cuda.tile"})
    with pytest.warns(FallbackWarning, match="failed to import"):
        assert toy(1, backend="cutile") == 2.0
    assert calls == [("pytorch", 1, 2.0, "default")]


def test_every_op_has_a_pytorch_impl():
    for name in DESIGN_OPS:
        assert "pytorch" in registry.get_registered_backends_for_op(name)


def test_availability_detection_never_raises():
    selector.cutile_unavailable_reason.cache_clear()
    reason = selector.cutile_unavailable_reason()
    assert reason is None or isinstance(reason, str)
    if not torch.cuda.is_available():
        assert reason == "no CUDA GPU"


def test_config_setters():
    tilegemm.set_num_sms(0)
    with pytest.raises(ValueError):
        tilegemm.set_num_sms(-1)
    with pytest.raises(TypeError):
        tilegemm.set_num_sms(1.5)
    tilegemm.set_tc_util(50)
    assert tilegemm.get_tc_util() == 0.5
    tilegemm.set_tc_util(0.75)
    assert tilegemm.get_tc_util() == 0.75
    for bad in (0.0, 1.5, 1, 101):
        with pytest.raises(ValueError):
            tilegemm.set_tc_util(bad)
    tilegemm.set_tc_util(1.0)
