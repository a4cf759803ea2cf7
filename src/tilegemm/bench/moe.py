"""MoE experts layer (routing included, router excluded): ``tilegemm.moe_experts(hidden, ids, weights, w13, w2)``.

Models: Qwen3-30B-A3B (H 2048, 128 experts, top-8, I 768), DeepSeek-V3 (H 7168, 256 experts, top-8,
I 2048), Mixtral-8x7B (H 4096, 8 experts, top-2, I 14336); tokens 1 to 16384. Each row draws a seeded
random routing (k distinct experts per token, softmax weights in fp32) and bf16 weights.

Peers, each given the same inputs through transformers' experts contract
``forward(module, hidden [T, H], top_k_index [T, k], top_k_weights [T, k])`` on a stock experts module of
the model (its ``gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]`` are the op's ``w13`` / ``w2``):
transformers' ``grouped_mm`` and ``batched_mm`` experts forwards, and tilegemm's unfused experts path
(``tilegemm.transformers.experts.unfused_experts_forward``: routing, permute copy, two m-grouped GEMMs,
torch activation and combine). ``batched_mm`` copies every (token, slot)'s expert weights and is skipped
where that copy would not fit. The harness times every implementation eagerly and in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tilegemm.bench import inputs, timing
from tilegemm.bench.core import Built, Case, Impl, diff_check

FAMILY = "moe"
#: name -> (hidden H, experts E, top-k, intermediate I, transformers model type)
MODELS = {
    "qwen3-30b-a3b": (2048, 128, 8, 768, "qwen3_moe"),
    "deepseek-v3": (7168, 256, 8, 2048, "deepseek_v3"),
    "mixtral-8x7b": (4096, 8, 2, 14336, "mixtral"),
}
TOKENS = (1, 8, 64, 512, 4096, 16384)
QUICK = [("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 512), ("mixtral-8x7b", 8)]
#: calc_diff bar: every implementation rounds the intermediate activations and the per-slot outputs to bf16
#: (about 1e-5 for transformers' paths, 4e-6 for tilegemm's), on top of the bf16 output.
BAR = 5e-5
#: batched_mm's per-slot weight copy above this many bytes is not run (it would not fit next to the weights).
BATCHED_MM_MAX_BYTES = 8 * 2**30


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: ``{"dtype", "model", "tokens"}`` (the model's sizes go in the case)."""
    pairs = list(QUICK)
    if size != "quick":
        pairs += [(m, t) for m in MODELS for t in TOKENS if (m, t) not in QUICK]
    return [{"dtype": "bf16", "model": m, "tokens": t} for m, t in pairs]


def _sizes(spec: dict[str, Any]) -> tuple[int, int, int, int]:
    """(H, E, k, I) of a spec: its model's, or explicit ``hidden``/``experts``/``top_k``/``inter`` (tiny rows)."""
    h, e, k, i, _ = MODELS.get(spec.get("model"), (None, None, None, None, None))
    return spec.get("hidden", h), spec.get("experts", e), spec.get("top_k", k), spec.get("inter", i)


def touched_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts ``tokens`` tokens route to under a uniform top-``top_k`` routing."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec. FLOPs count the three GEMMs of every routed slot; bytes the weights
    of the experts a uniform routing is expected to touch plus the hidden states in and out."""
    t = spec["tokens"]
    h, e, k, i = _sizes(spec)
    touched = touched_experts(e, k, t)
    shape = {"model": spec.get("model", "custom"), "tokens": t, "hidden": h, "experts": e, "top_k": k, "inter": i}
    nbytes = touched * 3 * i * h * 2 + 2.0 * t * h * 2
    build = lambda: _build(spec, t, h, e, k, i)  # noqa: E731
    return Case(FAMILY, "moe_experts", "bf16", shape, 6.0 * t * k * h * i, nbytes, build, bar=BAR)


def _routing(t: int, e: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=timing.DEVICE).manual_seed(seed)
    scores = torch.rand(t, e, device=timing.DEVICE, generator=g)
    ids = scores.topk(k, dim=-1).indices
    weights = torch.softmax(torch.randn(t, k, device=timing.DEVICE, generator=g), dim=-1)
    return ids, weights


def experts_module(model_type: str, w13: torch.Tensor, w2: torch.Tensor) -> torch.nn.Module:
    """A stock transformers experts module of ``model_type`` (``qwen3_moe``, ``deepseek_v3``, ``mixtral``)
    holding ``w13 [E, 2I, H]`` as ``gate_up_proj`` and ``w2 [E, H, I]`` as ``down_proj`` (built on ``meta``,
    so no weights are allocated twice)."""
    from transformers import AutoConfig

    e, two_i, h = w13.shape
    config = AutoConfig.for_model(
        model_type,
        hidden_size=h,
        intermediate_size=two_i // 2,
        moe_intermediate_size=two_i // 2,
        num_experts=e,
        n_routed_experts=e,
        num_local_experts=e,
        hidden_act="silu",
    )
    config._experts_implementation = "grouped_mm"
    cls = _experts_class(model_type)
    with torch.device("meta"):
        module = cls(config)
    module.gate_up_proj = torch.nn.Parameter(w13, requires_grad=False)
    module.down_proj = torch.nn.Parameter(w2, requires_grad=False)
    return module.eval()


def _experts_class(model_type: str) -> type:
    if model_type == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        return Qwen3MoeExperts
    if model_type == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

        return DeepseekV3Experts
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    return MixtralExperts


def _peer(name: str, sets: list[tuple], model_type: str) -> Impl:
    """An experts-forward peer run on a stock module per input set (or why it cannot run)."""
    try:
        from transformers.integrations import moe as hf_moe

        from tilegemm.transformers.experts import unfused_experts_forward

        fn = {
            "transformers_grouped_mm": getattr(hf_moe, "grouped_mm_experts_forward", None),
            "transformers_batched_mm": getattr(hf_moe, "batched_mm_experts_forward", None),
            "tilegemm_unfused": unfused_experts_forward,
        }[name]
        if fn is None:
            return Impl(name, f"this transformers has no {name[len('transformers_') :]} experts forward", None)
        mods = [(experts_module(model_type, w13, w2), x, ids, w) for x, ids, w, w13, w2 in sets]
    except Exception as exc:  # transformers missing or too old
        return Impl(name, f"transformers experts module unavailable: {type(exc).__name__}: {exc}", None)

    def call(module, x, ids, w):
        with torch.inference_mode():
            return fn(module, x, ids, w)

    return Impl(name, mods, call)


def _reference(x, ids, weights, w13, w2) -> torch.Tensor:
    """float64 experts layer, one expert at a time (its weights cast to float64 one at a time)."""
    t, h = x.shape
    inter = w2.shape[2]
    out = torch.zeros(t, h, dtype=torch.float64, device=x.device)
    x64 = x.double()
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x64[tok] @ w13[e].double().t()
        hmid = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y = hmid @ w2[e].double().t()
        out.index_add_(0, tok, y * weights[tok, slot].double()[:, None])
    return out


def _build(spec: dict[str, Any], t: int, h: int, e: int, k: int, i: int) -> Built:
    import tilegemm

    model_type = MODELS.get(spec.get("model"), (0, 0, 0, 0, "qwen3_moe"))[4]
    seed = inputs.seed_of(FAMILY, spec.get("model"), t, h, e, k, i)
    weight_bytes = 2 * 3 * e * i * h
    nsets = timing.rotation_count(weight_bytes + 2 * t * h)
    sets = []
    for s in range(nsets):
        x = inputs.randn((t, h), torch.bfloat16, seed + 4 * s)
        w13 = inputs.randn((e, 2 * i, h), torch.bfloat16, seed + 4 * s + 1).div_(math.sqrt(h))
        w2 = inputs.randn((e, h, i), torch.bfloat16, seed + 4 * s + 2).div_(math.sqrt(i))
        ids, weights = _routing(t, e, k, seed + 4 * s + 3)
        sets.append((x, ids, weights, w13, w2))
    impls = [Impl("tilegemm", sets, lambda x, ids, w, w13, w2: tilegemm.moe_experts(x, ids, w, w13, w2))]
    impls.append(_peer("transformers_grouped_mm", sets, model_type))
    copy_bytes = t * k * 3 * i * h * 2
    if copy_bytes > BATCHED_MM_MAX_BYTES:
        why = f"copies every slot's expert weights ({copy_bytes / 2**30:.0f} GiB)"
        impls.append(Impl("transformers_batched_mm", why, None))
    else:
        impls.append(_peer("transformers_batched_mm", sets, model_type))
    impls.append(_peer("tilegemm_unfused", sets, model_type))
    x, ids, weights, w13, w2 = sets[0]
    return Built(impls, diff_check(lambda: _reference(x, ids, weights, w13, w2)))
