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

# DeepGEMM v2.6.1's ops (csrc/apis/*.hpp py::arg lists): name -> DeepGEMM's positional parameters as
# (name, default) (None: no default), then tilegemm's keyword-only extensions (before the registry's backend).
_NO = inspect.Parameter.empty
_A_B_D = [("a", _NO), ("b", _NO), ("d", _NO)]
_RECIPES = [("recipe", None), ("recipe_a", None), ("recipe_b", None)]
_DENSE_EXT = [("alpha", 1.0), ("beta", 1.0), ("stream", None)]
_M_EXT = [("alignment", None), ("stream", None)]
_STREAM = [("stream", None)]
_K_GROUPED = [("ks_cpu", _NO), ("grouped_layout", _NO), ("c", None)]
_MQA = [("q", _NO), ("kv", _NO), ("weights", _NO), ("cu_seq_len_k_start", _NO), ("cu_seq_len_k_end", _NO)]
_PAGED = [("q", _NO), ("kv_cache", _NO), ("weights", _NO), ("context_lens", _NO), ("block_table", _NO)]
_PAGED += [("schedule_meta", _NO), ("max_context_len", _NO), ("clean_logits", False)]
SIGNATURES = {
    **{f"bf16_gemm_{lay}": (_A_B_D + [("c", None), ("compiled_dims", cd)], _DENSE_EXT) for lay, cd in
       (("nt", "nk"), ("nn", "nk"), ("tn", "mn"), ("tt", "mn"))},
    **{f"{pre}_gemm_{lay}": (_A_B_D + [("c", None), *_RECIPES, ("compiled_dims", cd), ("disable_ue8m0_cast", False)],
                             _DENSE_EXT) for pre in ("fp8_fp4", "fp8") for lay, cd in
       (("nt", "nk"), ("nn", "nk"), ("tn", "mn"), ("tt", "mn"))},
    "fp8_gemm_nt_skip_head_mid": (_A_B_D + [("head_splits", _NO), ("recipe", None), ("compiled_dims", "nk"),
                                            ("disable_ue8m0_cast", False)], _STREAM),
    "m_grouped_bf16_gemm_nt_contiguous": (_A_B_D + [("grouped_layout", _NO), ("compiled_dims", "nk"),
        ("use_psum_layout", False), ("ensure_zero_padding", True), ("expected_m_for_psum_layout", None)], _M_EXT),
    "m_grouped_bf16_gemm_nn_contiguous": (_A_B_D + [("grouped_layout", _NO), ("compiled_dims", "nk"),
        ("use_psum_layout", False), ("ensure_zero_padding", True)], _M_EXT),
    **{f"m_grouped_{pre}_gemm_nt_contiguous": (_A_B_D + [("grouped_layout", _NO), *_RECIPES, ("compiled_dims", "nk"),
        ("disable_ue8m0_cast", False), ("use_psum_layout", False), ("ensure_zero_padding", True),
        ("expected_m_for_psum_layout", None)], _M_EXT) for pre in ("fp8_fp4", "fp8")},
    **{f"m_grouped_{pre}_gemm_nn_contiguous": (_A_B_D + [("grouped_layout", _NO), *_RECIPES, ("compiled_dims", "nk"),
        ("disable_ue8m0_cast", False), ("use_psum_layout", False), ("ensure_zero_padding", True)], _M_EXT)
       for pre in ("fp8_fp4", "fp8")},
    "m_grouped_bf16_gemm_nt_masked": (_A_B_D + [("masked_m", _NO), ("expected_m", _NO), ("compiled_dims", "nk")],
                                      _STREAM),
    **{f"m_grouped_{pre}_gemm_nt_masked": (_A_B_D + [("masked_m", _NO), ("expected_m", _NO), *_RECIPES,
        ("compiled_dims", "nk"), ("disable_ue8m0_cast", False)], _STREAM) for pre in ("fp8_fp4", "fp8")},
    "k_grouped_bf16_gemm_tn_contiguous": (_A_B_D + _K_GROUPED + [("compiled_dims", "mn"), ("use_psum_layout", False)],
                                          _STREAM),
    **{f"k_grouped_fp8_gemm_{lay}_contiguous": (_A_B_D + _K_GROUPED + [("recipe", (1, 1, 128)), ("compiled_dims", "mn"),
        ("use_psum_layout", False)], _STREAM) for lay in ("tn", "nt")},
    "fp8_fp4_mqa_logits": (_MQA + [("clean_logits", True), ("max_seqlen_k", 0), ("logits_dtype", torch.float32)],
                           _STREAM),
    "fp8_mqa_logits": (_MQA + [("clean_logits", True), ("max_seqlen_k", 0)], _STREAM),
    "get_paged_mqa_logits_metadata": ([("context_lens", _NO), ("block_kv", _NO), ("num_sms", _NO), ("indices", None)],
                                      []),
    "fp8_fp4_paged_mqa_logits": (_PAGED + [("logits_dtype", torch.float32), ("indices", None)], _STREAM),
    "fp8_paged_mqa_logits": (_PAGED + [("indices", None)], _STREAM),
    "einsum": ([("expr", _NO), ("a", _NO), ("b", _NO), ("d", _NO), ("c", None), ("use_cublaslt", False)], _STREAM),
    "fp8_einsum": ([("expr", _NO), ("a", _NO), ("b", _NO), ("d", _NO), ("c", None), ("recipe", (1, 128, 128))],
                   _STREAM),
    "tf32_hc_prenorm_gemm": (_A_B_D + [("sqr_sum", _NO), ("num_splits", None)], _STREAM),
}  # fmt: skip
DESIGN_OPS = set(SIGNATURES)


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
    ops = set(tilegemm.list_ops())
    for name in DESIGN_OPS:
        assert getattr(tilegemm, name).op_name in ops  # fp8_* names are aliases of the fp8_fp4_* ops
    assert tilegemm.fp8_gemm_nt is tilegemm.fp8_fp4_gemm_nt
    assert tilegemm.fp8_m_grouped_gemm_nt_masked is tilegemm.m_grouped_fp8_fp4_gemm_nt_masked


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_match_deepgemm(name):
    """DeepGEMM's parameters (names, order, defaults) are positional-or-keyword; the extensions keyword-only."""
    params = list(inspect.signature(getattr(tilegemm, name)).parameters.values())
    assert params[-1].name == "backend" and params[-1].kind is inspect.Parameter.KEYWORD_ONLY
    positional, extensions = SIGNATURES[name]
    kinds = [p.kind for p in params[:-1]]
    got = [(p.name, p.default) for p in params[:-1]]
    assert got == positional + extensions
    assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(positional) + [
        inspect.Parameter.KEYWORD_ONLY
    ] * len(extensions)
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


def test_call_backend_is_the_current_choice_while_the_call_runs(cutile_present):
    """A call's ``backend=`` is a scope of the one current choice: the implementation (and any op it calls) sees it,
    the caller does not after the call."""
    seen = []

    @dispatch("_scoped_op")
    def op(x: int) -> int: ...

    for backend in ("pytorch", "cutile"):
        register_impl("_scoped_op", backend)(lambda x: seen.append(selector.get_current_backend()) or x)
    try:
        with tilegemm.use_backend("pytorch"):
            op(1, backend="cutile")
            op(1)
            assert selector.get_current_backend() == "pytorch"
        assert seen == ["cutile", "pytorch"]
        with selector.BackendScope(None) as name:  # None: the current choice stands
            assert name is None and selector.selected_backend() is None
    finally:
        registry._STUBS.pop("_scoped_op")
        registry._IMPLS.pop("_scoped_op")


def test_unknown_backend_lists_known_ones(toy_op):
    toy, _ = toy_op
    known = r"\['gluon', 'cutile', 'pytorch'\]"
    with pytest.raises(ValueError, match=known):
        toy(1, backend="triton")
    with pytest.raises(ValueError, match=known):
        tilegemm.set_backend("cuda")
    with pytest.raises(ValueError, match=known):
        with tilegemm.use_backend("tensorrt"):
            pass


def test_env_backend_is_validated(monkeypatch):
    monkeypatch.setenv("TILEGEMM_BACKEND", "nope")
    with pytest.raises(
        ValueError, match=r"TILEGEMM_BACKEND: got 'nope', expected one of \['gluon', 'cutile', 'pytorch'\]"
    ):
        selector.get_current_backend()
    monkeypatch.setenv("TILEGEMM_BACKEND", "cuda")
    with pytest.raises(ValueError, match="TILEGEMM_BACKEND"):
        selector.get_current_backend()


#: Scoping tests switch between pytorch and cutile whether or not cutile can run: its warning is not under test.
_SCOPING_ONLY = pytest.mark.filterwarnings("ignore:tilegemm.use_backend:UserWarning")


@_SCOPING_ONLY
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


@_SCOPING_ONLY
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


@_SCOPING_ONLY
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


@_SCOPING_ONLY
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
    with pytest.warns(FallbackWarning, match="flag value not in this kernel") as caught:
        assert toy(2, flag="unsupported", backend="cutile") == 4.0
    assert caught[0].filename == __file__  # the line that called the op
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


@pytest.fixture
def cutile_absent(monkeypatch):
    """The cutile backend cannot run (as on a machine without a GPU); the user's choice is restored after."""
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no CUDA GPU")
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    monkeypatch.delenv("TILEGEMM_DISABLE_FALLBACK", raising=False)
    yield
    tilegemm.set_backend(None)


def test_set_backend_says_at_once_when_the_backend_cannot_run(toy_op, cutile_absent):
    """The choice stands (``get_current_backend`` names it) but a FallbackWarning, with the reason, says at the
    caller's line that its calls run on pytorch; once per process."""
    toy, calls = toy_op
    with pytest.warns(FallbackWarning, match=r"set_backend\('cutile'\).*cutile unavailable: no CUDA GPU") as caught:
        tilegemm.set_backend("cutile")
    assert caught[0].filename == __file__
    assert tilegemm.get_current_backend() == "cutile"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        tilegemm.set_backend("cutile")  # said once
        tilegemm.set_backend("pytorch")  # always runs
    with pytest.warns(FallbackWarning, match=r"use_backend\('cutile'\).*no CUDA GPU") as caught:
        with tilegemm.use_backend("cutile"):
            assert tilegemm.get_current_backend() == "cutile"
            with pytest.warns(FallbackWarning, match="_toy_op"):
                assert toy(1) == 2.0
    assert caught[0].filename == __file__ and calls == [("pytorch", 1, 2.0, "default")]


def test_set_backend_that_cannot_run_raises_without_fallback(cutile_absent, monkeypatch):
    """``TILEGEMM_DISABLE_FALLBACK=1``: choosing a backend that cannot run here is an error, and nothing changes."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    tilegemm.set_backend("pytorch")
    with pytest.raises(RuntimeError, match=r"set_backend\('cutile'\).*no CUDA GPU.*fallback is disabled"):
        tilegemm.set_backend("cutile")
    assert tilegemm.get_current_backend() == "pytorch"
    with pytest.raises(RuntimeError, match=r"use_backend\('gluon'\).*fallback is disabled"):
        with tilegemm.use_backend("gluon"):
            pass
    assert tilegemm.get_current_backend() == "pytorch"


def test_set_backend_that_can_run_is_silent(cutile_present):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        tilegemm.set_backend("cutile")
        with tilegemm.use_backend("pytorch"):
            pass
    tilegemm.set_backend(None)


def test_introspection_without_gpu(monkeypatch):
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no CUDA GPU")
    assert selector.get_available_backends() == ["pytorch"]
    assert tilegemm.get_available_backends_for_op("bf16_gemm_nt") == ["pytorch"]
    with pytest.raises(ValueError, match="not_an_op"):
        tilegemm.get_available_backends_for_op("not_an_op")


PUBLIC_OPS = sorted(n for n in tilegemm.__all__ if hasattr(getattr(tilegemm, n), "op_name"))


@pytest.mark.parametrize("name", PUBLIC_OPS)
def test_every_public_op_name_is_taken_where_an_op_name_is(name):
    """DeepGEMM's aliases (``fp8_gemm_nt`` is ``fp8_fp4_gemm_nt``) name their op in every function taking an op name."""
    op = getattr(tilegemm, name).op_name
    assert registry.canonical_op(name) == op
    assert tilegemm.get_available_backends_for_op(name) == tilegemm.get_available_backends_for_op(op)
    assert "pytorch" in tilegemm.get_available_backends_for_op(name)
    assert registry.get_registered_backends_for_op(name) == registry.get_registered_backends_for_op(op)
    assert registry.get_impl(name, "pytorch") is registry.get_impl(op, "pytorch")


def test_aliases_are_the_public_ones():
    """The alias map is derived from the public names bound to an op of another name, not written by hand."""
    aliases = {n: getattr(tilegemm, n).op_name for n in PUBLIC_OPS if getattr(tilegemm, n).op_name != n}
    assert aliases == registry._ALIASES
    assert {"fp8_gemm_nt", "fp8_gemm_nn", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked"} <= {*aliases}
    with pytest.raises(ValueError, match="fp8_gemm_nt"):  # the message lists the aliases too
        registry.canonical_op("fp8_gemm_xx")


def test_failed_backend_import_falls_back(toy_op, monkeypatch):
    toy, calls = toy_op
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {"cutile": "ImportError: no cuda.tile"})
    with pytest.warns(FallbackWarning, match="failed to import"):
        assert toy(1, backend="cutile") == 2.0
    assert calls == [("pytorch", 1, 2.0, "default")]


def test_every_op_has_a_pytorch_impl():
    for name in tilegemm.list_ops():
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
    assert tilegemm.get_tc_util() == 50  # DeepGEMM's int percentage
    tilegemm.set_tc_util(0)
    assert tilegemm.get_tc_util() == 100  # DeepGEMM: 0 means 100
    tilegemm.set_tc_util(0.75)
    assert tilegemm.get_tc_util() == 75
    for bad in (0.0, 1.5, -1, 101):
        with pytest.raises(ValueError):
            tilegemm.set_tc_util(bad)
    tilegemm.set_tc_util(100)


def test_deepgemm_runtime_setters():
    """DeepGEMM's JIT/launch settings are accepted and read back; the alignment is the psum default."""
    assert tilegemm.get_mk_alignment_for_contiguous_layout() == 128
    assert tilegemm.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    assert tilegemm.get_theoretical_mk_alignment_for_contiguous_layout(expected_m=32) == 128
    tilegemm.set_mk_alignment_for_contiguous_layout(64)
    assert tilegemm.get_m_alignment_for_contiguous_layout() == tilegemm.get_k_alignment_for_contiguous_layout() == 64
    tilegemm.set_mk_alignment_for_contiguous_layout(128)
    assert tilegemm.get_pdl() is False
    tilegemm.set_pdl(True)
    assert tilegemm.get_pdl() is True
    tilegemm.set_pdl(False)
    tilegemm.set_ignore_compile_dims(True)
    tilegemm.set_ignore_compile_dims(False)
    tilegemm.set_block_size_multiple_of(64)
    tilegemm.set_block_size_multiple_of((64, 32))
    tilegemm.set_block_size_multiple_of(1)
    with pytest.raises(TypeError):
        tilegemm.set_pdl(1)
    with pytest.raises(ValueError):
        tilegemm.set_mk_alignment_for_contiguous_layout(0)


def test_mega_moe_raises_naming_the_feature():
    for fn in (tilegemm.fp8_fp4_mega_moe, tilegemm.bf16_mega_moe, tilegemm.get_symm_buffer_for_mega_moe):
        with pytest.raises(NotImplementedError, match="mega-MoE"):
            fn()
