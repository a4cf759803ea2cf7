"""Tiny random models of the supported families, and the accuracy helpers of tests/hf."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tilegemm.transformers import presets
from tilegemm.transformers.families import FAMILIES as MODEL_FAMILIES

FAMILIES: tuple[str, ...] = tuple(presets.TINY_BY_MODEL_TYPE.get(f.model_type, f.model_type) for f in MODEL_FAMILIES)
"""The tiny preset of every family of ``tilegemm.transformers.families.FAMILIES`` (the model_type if it has none,
so that tests fail for a family without a preset)."""


_OTHER_COMMON = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
)  # fmt: skip

OTHER_FUSED: dict[str, dict] = {
    "tiny-olmoe": dict(_OTHER_COMMON, model_type="olmoe", num_experts=8, num_experts_per_tok=2),
    "tiny-gpt-oss": dict(
        _OTHER_COMMON,
        model_type="gpt_oss",
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
        layer_types=["full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),  # fmt: skip
}
"""Tiny configs of transformers families with fused experts that the families table does not list (no norm swap,
no before-creation patcher): ``apply_tilegemm_to_model`` takes them through the experts registry. gpt-oss has
biases, interleaved gate/up rows, transposed weights and a clamped SwiGLU: the unfused path."""


def build(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0, **overrides):
    """A tiny random-weight causal LM of preset ``name`` (or of :data:`OTHER_FUSED`) in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if name in OTHER_FUSED:
        kwargs = dict(OTHER_FUSED[name])
        config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    else:
        config = presets.PRESETS[name].config()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def assert_tp_experts_layout(config: Any, local: dict[str, Any], world_size: int) -> None:
    """The experts module of one rank (``tilegemm.transformers.parallel.local_experts``) is laid out as the installed
    transformers' tensor-parallel plan of ``config`` says. A plan with ``moe_tp_experts`` (transformers <= 5.24) cuts
    every expert along the intermediate dimension (``gate_up_proj [E, 2I/N, H]``, ``down_proj [E, H, I/N]``); the
    plans of transformers 5.25 name no experts weight (the style is deprecated for expert parallelism), so every rank
    holds every expert whole."""
    from tilegemm.transformers.parallel import family_plan

    styles = {style for name, style in family_plan(config, "tp").items() if "experts" in name.split(".")}
    assert not local["expert_parallel"], local
    assert local["gate_up_proj"][0] == local["global_gate_up_proj"][0] == local["num_experts"], local
    if "moe_tp_experts" in styles:
        assert local["gate_up_proj"][1] * world_size == local["global_gate_up_proj"][1], local
        assert local["down_proj"][2] * world_size == local["global_down_proj"][2], local
    else:
        assert not styles, f"a tensor-parallel experts style this test does not know: {sorted(styles)}"
        assert local["gate_up_proj"] == local["global_gate_up_proj"], local
        assert local["down_proj"] == local["global_down_proj"], local


def prompt(batch: int = 2, length: int = 12, vocab: int = 256, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    """Random token ids ``[batch, length]``."""
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(device)


def indexer_inputs(
    batch: int, rows: int, keys: int, heads: int, dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random inputs of a DSA indexer's scoring: bf16 queries ``[B, S, H, D]`` and keys ``[B, T, D]``, fp32 head
    weights ``[B, S, H]`` (scaled by ``H**-0.5``), and a causal boolean mask ``[B, S, T]`` whose ``S`` query rows are
    the last of ``T`` keys, with the second sequence's first 5 keys hidden (left padding)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, rows, heads, dim, generator=g).bfloat16()
    k = torch.randn(batch, keys, dim, generator=g).bfloat16()
    w = torch.randn(batch, rows, heads, generator=g) * heads**-0.5
    pos = torch.arange(rows)[:, None] + keys - rows
    mask = (torch.arange(keys)[None, :] <= pos).expand(batch, rows, keys).clone()
    mask[1, :, :5] = False  # left padding of the second sequence
    return q, k, w, mask


def bf16_step(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``|x|`` (8 significant bits), elementwise, as fp32."""
    mag = x.float().abs().clamp(min=torch.finfo(torch.bfloat16).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def _round_once_linear(original: Callable) -> Callable:
    def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if input.dtype != torch.bfloat16 or input.device.type != "cpu":
            return original(input, weight, bias)
        out = input.float() @ weight.float().t()
        return (out if bias is None else out + bias.float()).bfloat16()

    return linear


def _round_once_grouped_mm(original: Callable) -> Callable:
    def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any, offs: torch.Tensor | None = None, **kw: Any):
        if args or kw or offs is None or mat_a.dtype != torch.bfloat16 or mat_a.device.type != "cpu":
            return original(mat_a, mat_b, *args, offs=offs, **kw)
        out = torch.zeros(mat_a.shape[0], mat_b.shape[-1], dtype=torch.float32)
        start = 0
        for group, end in enumerate(offs.tolist()):  # [T, K] rows of each group @ its [K, N] weight
            out[start:end] = mat_a[start:end].float() @ mat_b[group].float()
            start = end
        return out.bfloat16()

    return grouped_mm


@contextlib.contextmanager
def bf16_gemms_round_once() -> Iterator[None]:
    """Within the block, bf16 CPU ``F.linear`` and ``F.grouped_mm`` (what stock transformers calls) give the fp32
    product rounded once to bf16, the tilegemm reference backend's GEMM.

    CPUs differ there: with bf16 dot instructions torch's kernels round once, on AVX2-only CPUs they round partial
    sums on the way. Tests that hold a patched model to stock's bf16 rounding *sequence* bit for bit (or within one
    step) run both sides in this block, so their verdict says the same on every CPU: what they test is which
    intermediates are rounded, not how a BLAS accumulates."""
    patched = {}
    for owner, name, wrap in (
        (torch.nn.functional, "linear", _round_once_linear),
        (torch.nn.functional, "grouped_mm", _round_once_grouped_mm),
        (torch, "_grouped_mm", _round_once_grouped_mm),
    ):
        if hasattr(owner, name):
            patched[(owner, name)] = getattr(owner, name)
            setattr(owner, name, wrap(patched[(owner, name)]))
    try:
        yield
    finally:
        for (owner, name), original in patched.items():
            setattr(owner, name, original)


@dataclasses.dataclass
class Compared:
    """One forward of a model before and after a patch, with the discrete choices of each (routers and indexers,
    :class:`modeling.transformers.routes.RouteRecorder`)."""

    stock: torch.Tensor  # fp32 logits [B, L, V]
    patched: torch.Tensor  # fp32 logits [B, L, V]
    flips: int  # (layer, token) choices that differ
    clean: torch.Tensor  # [B, L] bool: no flip at this or an earlier position of the sequence

    def describe(self) -> str:
        return f"{self.flips} flipped choices, {int(self.clean.sum())} of {self.clean.numel()} positions clean"


def compare_with_flips(model: torch.nn.Module, ids: torch.Tensor, patch: Callable[[], Any]) -> Compared:
    """Logits of ``model(ids)`` before and after ``patch()``, and where they may differ by more than rounding.

    A one-ulp change upstream (the patched experts or norms) can swap a near-tie expert or key in or out of a
    token's top-k (routers; the sparse-attention indexers of DeepSeek-V3.2 / GLM-MoE-DSA): a discrete jump that no
    rounding bar covers, and that reaches every later position of its sequence through attention. Rounding bars hold
    on the ``clean`` positions, downstream of no flip (as the sharded checks do, ``routes.flip_report``)."""
    from modeling.transformers.routes import RouteRecorder, downstream_of_flip, flips

    recorder = RouteRecorder(model)
    try:
        stock = model(ids).logits.float()
        stock_routes = recorder.take()
        patch()
        patched = model(ids).logits.float()
        routes = recorder.take()
    finally:
        recorder.remove()
    flipped = flips(stock_routes, routes, ids.shape[0])
    return Compared(stock, patched, int(flipped.sum()), ~downstream_of_flip(flipped))


def assert_within_one_bf16_step(test: torch.Tensor, ref: torch.Tensor) -> None:
    """Every element of ``test`` is ``ref`` or a bf16 neighbour of it."""
    diff = (test.float() - ref.float()).abs()
    bound = torch.maximum(bf16_step(test), bf16_step(ref))
    worst = (diff / bound).max().item()
    assert worst <= 1.0, f"max |test - ref| is {worst:.2f} bf16 steps (bar: 1)"


def assert_max_abs_within_one_bf16_step(test: torch.Tensor, ref: torch.Tensor) -> None:
    """``max |test - ref|`` is at most one bf16 step at the tensor's largest magnitude.

    For chains whose two sides round the same steps but accumulate GEMMs in different orders (cutile vs
    cuBLAS): a one-ulp change of an intermediate moves a result by a fraction of its *terms'* bf16 step, which
    exceeds the step of a result that cancels to near zero, so the elementwise bar does not apply there.
    """
    diff = (test.float() - ref.float()).abs().max()
    bound = bf16_step(torch.maximum(test.float().abs().max(), ref.float().abs().max()))
    assert diff <= bound, f"max |test - ref| = {diff.item():.3e} > one bf16 step at max |ref| ({bound.item():.3e})"


def reference_experts(module, x, index, weights) -> torch.Tensor:
    """float64 ``sum_j w[t,j] * down[e] @ act(gate_up[e] @ x[t])``; ids outside [0, E) contribute nothing."""
    x64 = x.double()
    out = torch.zeros_like(x64)
    w_up = module.gate_up_proj.double()
    w_down = module.down_proj.double()
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            if not 0 <= e < module.num_experts:
                continue
            gate, up = (w_up[e] @ x64[t]).chunk(2)
            h = module.act_fn(gate) * up
            out[t] += float(weights[t, j]) * (w_down[e] @ h)
    return out


def routing(module, tokens: int, top_k: int = 2, seed: int = 0, weight_dtype=torch.float32):
    """Random distinct top-k expert ids and positive weights for ``tokens`` tokens."""
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(module.num_experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g).to(weight_dtype)
    return index, weights


@contextlib.contextmanager
def topk_sorted_flags(indexers: list[torch.nn.Module]):
    """Inside the block, ``torch.Tensor.topk`` spied: yields the list of the ``sorted`` argument of every call inside a
    forward of ``indexers`` (the routers' top-k left out), in order; the spy and its hooks are gone after it."""
    flags, inside = [], []
    original = torch.Tensor.topk

    def spy(self, k, dim=-1, largest=True, sorted=True):
        if inside:
            flags.append(sorted)
        return original(self, k, dim, largest, sorted)

    hooks = [m.register_forward_pre_hook(lambda mod, args: inside.append(mod)) for m in indexers]
    hooks += [m.register_forward_hook(lambda mod, args, out: inside.clear()) for m in indexers]
    torch.Tensor.topk = spy
    try:
        yield flags
    finally:
        torch.Tensor.topk = original
        for hook in hooks:
            hook.remove()
