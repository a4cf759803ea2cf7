"""Patched models under ``torch.compile(fullgraph=True)`` and ``torch.save`` / ``pickle`` (CPU, tiny models).

Under tracing, every call from a patched module into tilegemm is a ``torch.library`` custom op
(``tilegemm.custom_ops``; eagerly, without autograd, the op's function runs directly), so a patched model traces as
one graph: ``fullgraph=True`` raises on any graph break, and the counting backend sees exactly one graph. The
compiled model (``aot_eager``: the custom ops' fake implementations, functionalization and the real kernels) must
give the eager patched model's logits bit for bit.
"""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys

import pytest
import torch
from hf_models import FAMILIES, build, prompt
from torch.utils._python_dispatch import TorchDispatchMode

from tilegemm import custom_ops
from tilegemm.transformers import apply_tilegemm_to_model, swapped_indexers, swapped_rms_norms
from tilegemm.transformers.monkey_patch import experts_modules


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it is given and runs them with ``aot_eager``."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        self.graphs += 1
        return aot_eager(gm, example_inputs)


def _compile_and_compare(model, ids):
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        eager = model(ids).logits
        got = compiled(ids).logits
    assert backend.graphs == 1, f"{backend.graphs} graphs: the patched model does not trace as one"
    assert torch.equal(got, eager), f"compiled differs from eager by {(got - eager).abs().max().item():.3e}"


CASES = [(f, torch.bfloat16) for f in FAMILIES] + [("tiny-qwen3-moe", torch.float32), ("tiny-gpt-oss", torch.float32)]


@pytest.mark.parametrize(("family", "dtype"), CASES, ids=[f"{f}-{str(d)[6:]}" for f, d in CASES])
def test_patched_model_compiles_whole_and_matches_eager(family, dtype):
    """bf16: the fused experts op and the norm op; fp32 (and gpt-oss's biases): the unfused grouped ops."""
    model = apply_tilegemm_to_model(build(family, dtype=dtype))
    _compile_and_compare(model, prompt())


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_fp8_model_compiles_whole_and_matches_eager(fused):
    """``"tilegemm_fp8"``: the unfused FP8 grouped ops (H=64), or the fused ``fp8_moe_experts`` (H = I = 128), with
    the FP8 weight blocks quantized inside the op and cached on the weight tensors."""
    sizes = dict(hidden_size=128, moe_intermediate_size=128, head_dim=32) if fused else {}
    model = apply_tilegemm_to_model(build("tiny-qwen3-moe", dtype=torch.bfloat16, **sizes), fp8=True)
    _compile_and_compare(model, prompt())
    w13 = experts_modules(model)[0].gate_up_proj
    assert "_tilegemm_fp8_blocks" in w13.__dict__, "the compiled call cached the FP8 blocks on the weight"


def test_module_backend_is_an_op_argument():
    """``backend=`` given to the patch reaches the ops as an argument (no ``use_backend`` scope in the trace)."""
    model = apply_tilegemm_to_model(build("tiny-mixtral", dtype=torch.bfloat16), backend="pytorch", linear=True)
    _compile_and_compare(model, prompt())


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_linear_swap_compiles_whole_and_matches_eager(fp8):
    """``linear=True``: the dense layers (attention, lm_head) through the ``tilegemm::linear`` op."""
    model = apply_tilegemm_to_model(build("tiny-deepseek-v3", dtype=torch.bfloat16), linear=True, fp8=fp8)
    _compile_and_compare(model, prompt())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_training_step_compiles_whole_and_matches_eager(dtype):
    """With gradients: bf16 trains through the fused op's custom op (``tilegemm::moe_experts_train``), fp32 through
    ``tilegemm.grouped_matmul``; the compiled step's gradients equal the eager step's bit for bit.

    Eager attention: transformers' SDPA path is not the same call traced and eager before 5.24 (5.17 traced
    materializes the causal mask and repeats the key/value heads, eager passes ``is_causal`` and GQA), which moves
    the attention gradients by bf16 rounding whatever the experts do."""
    grads = []
    for compiled in (False, True):
        model = build("tiny-qwen3-moe", dtype=dtype, _attn_implementation="eager")
        model = apply_tilegemm_to_model(model).train()
        backend = CountingBackend()
        torch._dynamo.reset()
        run = torch.compile(model, backend=backend, fullgraph=True) if compiled else model
        run(prompt()).logits.float().square().mean().backward()
        assert backend.graphs == int(compiled)
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("experts" in name for name in grads[0])
    assert all(torch.equal(grads[0][name], grads[1][name]) for name in grads[0])


def test_stock_and_patched_trace_the_same_number_of_graphs():
    """torch._dynamo.explain: tilegemm adds no graph break to a model that has none."""
    model = build("tiny-deepseek-v3", dtype=torch.bfloat16)
    ids = prompt()
    counts = []
    for patch in (False, True):
        if patch:
            apply_tilegemm_to_model(model)
        torch._dynamo.reset()
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(ids)
        counts.append((explained.graph_count, explained.graph_break_count))
    assert counts == [(1, 0), (1, 0)], counts


# ------------------------------------------------------------------------------------- custom ops

SAMPLES = {
    "tilegemm::experts_moe": lambda: (
        torch.randn(5, 16).bfloat16(),
        torch.randint(0, 4, (5, 2)),
        torch.rand(5, 2),
        torch.randn(4, 16, 16).bfloat16(),
        torch.randn(4, 16, 8).bfloat16(),
        "silu",
        None,
    ),  # fmt: skip
    "tilegemm::experts_fp8_moe": lambda: (
        torch.randn(3, 128).bfloat16(),
        torch.randint(0, 2, (3, 2)),
        torch.rand(3, 2),
        torch.randn(2, 256, 128).bfloat16(),
        torch.randn(2, 128, 128).bfloat16(),
        "silu",
        None,
    ),  # fmt: skip
    "tilegemm::experts_grouped_linear": lambda: (
        torch.randn(7, 16),
        torch.randn(3, 8, 16),
        torch.tensor([2, 5, 6], dtype=torch.int32),
        False,
        None,
    ),  # fmt: skip
    "tilegemm::experts_grouped_linear_fp8": lambda: (
        torch.randn(7, 16).bfloat16(),
        torch.randn(3, 16, 8).bfloat16(),
        torch.tensor([2, 5, 7], dtype=torch.int32),
        True,
        None,
    ),  # fmt: skip
    "tilegemm::linear": lambda: (torch.randn(5, 16).bfloat16(), torch.randn(8, 16).bfloat16(), False, None),
    "tilegemm::rms_norm": lambda: (torch.randn(3, 16).bfloat16(), torch.randn(16).bfloat16(), 1e-6, "pytorch"),
    "tilegemm::indexer_scores": lambda: (
        torch.randn(2, 5, 4, 32).bfloat16(),
        torch.randn(2, 7, 32).bfloat16(),
        torch.randn(2, 5, 4),
        torch.ones(7, 7, dtype=torch.bool).tril(2)[2:].expand(2, 5, 7).clone(),
        32**-0.5,
        False,
        True,
        None,
    ),  # fmt: skip
    "tilegemm::sparse_decode_attention": lambda: (
        torch.randn(2, 4, 32).bfloat16(),
        torch.randn(2, 2, 9, 32).bfloat16(),
        torch.randn(2, 2, 9, 16).bfloat16(),
        torch.tensor([[0, 3, 8], [5, 1, 2]], dtype=torch.int32),
        0.25,
        torch.ones(2, 9, dtype=torch.bool),
        None,
    ),  # fmt: skip
}
"""One sample call per op of ``custom_ops.MODEL_OPS``: an op added there without a sample here fails below."""


def test_every_model_op_has_a_sample():
    assert set(custom_ops.MODEL_OPS) == set(SAMPLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_model_op_passes_opcheck(name):
    """torch.library.opcheck: schema, fake implementation against the real one, and (for the differentiable
    rms_norm) the autograd registration."""
    torch.manual_seed(0)
    torch.library.opcheck(custom_ops.MODEL_OPS[name], SAMPLES[name]())


def test_model_op_names_are_tilegemm_ops():
    with pytest.raises(ValueError, match="^name: got 'indexer'"):
        custom_ops.model_op("indexer", fake=lambda: None)


class _DispatchedOps(TorchDispatchMode):
    """Records the name of every op the dispatcher runs inside it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_model_ops_run_their_function_eagerly_and_the_op_where_autograd_records():
    """Eagerly a model op calls its function (the custom op's dispatch is only host time); with a tensor that
    requires grad it goes through the op, whose autograd formula gives the gradient."""
    x, weight = torch.randn(3, 16), torch.rand(16) + 0.5
    with _DispatchedOps() as eager:
        y = custom_ops.rms_norm_forward(x, weight, 1e-6, "pytorch")
    assert "tilegemm.rms_norm.default" not in eager.names and eager.names
    x.requires_grad_()
    with _DispatchedOps() as recorded:
        y_grad = custom_ops.rms_norm_forward(x, weight, 1e-6, "pytorch")
    assert "tilegemm.rms_norm.default" in recorded.names
    assert torch.equal(y, y_grad.detach())
    y_grad.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.no_grad(), _DispatchedOps() as no_grad:
        custom_ops.rms_norm_forward(x, weight, 1e-6, "pytorch")
    assert "tilegemm.rms_norm.default" not in no_grad.names


# ------------------------------------------------------------------------------------- pickling


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("family", [*FAMILIES, "tiny-olmoe"])
def test_torch_save_and_pickle_round_trip(family):
    model = apply_tilegemm_to_model(build(family, dtype=torch.bfloat16))
    ids = prompt()
    before = _logits(model, ids)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for clone in (loaded, pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert [type(m) for m in swapped_rms_norms(clone)] == [type(m) for m in swapped_rms_norms(model)]
        assert clone.config._experts_implementation == "tilegemm"
        assert torch.equal(_logits(clone, ids), before)
    if family in FAMILIES:
        assert swapped_rms_norms(loaded), "the RMSNorm swap survives the round trip"
    for module in swapped_rms_norms(model) + swapped_indexers(model):  # the stock class plus the swap
        rebuild, (stock, *_) = module.__reduce_ex__(2)
        assert rebuild.__name__ == "_rebuild_swapped" and stock is type(module).__bases__[0]


def test_torch_load_in_a_fresh_process(tmp_path):
    """A pickled patched model loads and runs where tilegemm was never imported: unpickling the swapped norms and
    the experts' registration marker imports tilegemm.transformers, which registers the experts functions."""
    ids = prompt()
    for family in ("tiny-qwen3-moe", "tiny-olmoe"):
        model = apply_tilegemm_to_model(build(family, dtype=torch.bfloat16))
        torch.save({"model": model, "ids": ids, "logits": _logits(model, ids)}, tmp_path / f"{family}.pt")
    script = (
        "import sys, torch\n"
        "for family in sys.argv[1:]:\n"
        "    saved = torch.load(f'{family}.pt', weights_only=False)\n"
        "    with torch.no_grad():\n"
        "        out = saved['model'](saved['ids']).logits\n"
        "    assert torch.equal(out, saved['logits']), family\n"
        "    print(family, saved['model'].config._experts_implementation)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "tiny-qwen3-moe", "tiny-olmoe"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["tiny-qwen3-moe", "tilegemm", "tiny-olmoe", "tilegemm"]


def _dsa_decode_step_compiles(**patch) -> None:
    """``torch.compile(fullgraph=True)`` of a tiny DeepSeek-V3.2's decode step (after an eager prefill), patched with
    ``patch``; raises where the step does not trace as one graph."""
    from tilegemm.transformers.compat import cache_kwargs

    model = apply_tilegemm_to_model(build("tiny-deepseek-v32", index_topk=3), **patch)
    ids = prompt(length=14)
    torch._dynamo.reset()
    with torch.no_grad():
        cache = cache_kwargs(model, model(ids[:, :-1], use_cache=True).past_key_values)
        eager = model(ids[:, -1:], use_cache=True, **copy.deepcopy(cache)).logits
        got = torch.compile(model, backend="aot_eager", fullgraph=True)(ids[:, -1:], use_cache=True, **cache).logits
    assert torch.equal(got, eager)


def test_dsa_decode_step_without_the_sparse_attention_compiles_whole():
    """The patched indexers (a custom op), experts and norms: the decode step traces as one graph."""
    _dsa_decode_step_compiles(sparse_attention=False)


@pytest.mark.parametrize("path", ["gather", "op"])
def test_dsa_decode_step_on_the_sparse_attention_compiles_whole(path, monkeypatch):
    """The sparse attention's decode step: without the kernel (the selected rows gathered, SDPA) and through the
    ``tilegemm::sparse_decode_attention`` op (as on a GPU where the kernel runs; here the op's reference)."""
    from tilegemm.transformers import sparse_attention

    monkeypatch.setattr(sparse_attention, "_kernel_runs", lambda query: path == "op")
    _dsa_decode_step_compiles()
