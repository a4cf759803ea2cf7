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

FP8 rows (``dtype`` fp8): ``tilegemm.fp8_moe_experts`` on the same weights quantized to 128x128 blocks, beside the
bf16 peers above (transformers' paths and ``tilegemm.moe_experts``, the latter as ``tilegemm_bf16``) and tilegemm's
unfused FP8 experts path (``tilegemm_fp8_unfused``: ``unfused_fp8_experts_forward``).

``transformers_deepgemm``: transformers' own ``deepgemm`` experts implementation (``deepgemm_bf16_experts_forward``
on the stock module for bf16 rows, ``deepgemm_fp8_fp4_experts_forward`` on an ``FP8Experts`` module holding the same
FP8 weights for fp8 rows), its kernels the real DeepGEMM of ``--deepgemm`` (:mod:`tilegemm.bench.hf_deepgemm`
points transformers' hub loader at it); without DeepGEMM the row records why. The FP8 op is compared with
the float64 formula of its recipe (quantized ``x`` and ``h``, dequantized weights), the bf16 ones with the bf16
formula; the unfused FP8 path (``h`` rounded to bf16, then quantized) with the FP8 formula at its own bar.
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
QUICK_FP8 = [("qwen3-30b-a3b", 512)]
#: calc_diff bar: every implementation rounds the intermediate activations and the per-slot outputs to bf16
#: (about 1e-5 for transformers' paths, 4e-6 for tilegemm's), on top of the bf16 output.
BAR = 5e-5
#: FP8 rows against the float64 formula of the FP8 recipe (tests/ops/test_fp8_moe_experts.py, ``BAR``, says why it
#: is above an FP8 GEMM's): requantizing ``h`` turns its rounding errors (Hopper's FP8 MMA accumulation in the fused
#: op, the bf16 rounding of ``h`` in the unfused path) into whole e4m3 steps for a few elements per thousand;
#: measured 0.9e-4 to 1.8e-4 on an H100 (2026-11-23).
FP8_BAR = 5e-4
#: batched_mm's per-slot weight copy above this many bytes is not run (it would not fit next to the weights).
BATCHED_MM_MAX_BYTES = 8 * 2**30


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: ``{"dtype", "model", "tokens"}`` (the model's sizes go in the case), bf16
    then fp8, the quick rows first."""
    quick = [("bf16", m, t) for m, t in QUICK] + [("fp8", m, t) for m, t in QUICK_FP8]
    rows = list(quick)
    if size != "quick":
        rows += [(d, m, t) for d in ("bf16", "fp8") for m in MODELS for t in TOKENS if (d, m, t) not in quick]
    return [{"dtype": d, "model": m, "tokens": t} for d, m, t in rows]


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
    flops = 6.0 * t * k * h * i
    if spec.get("dtype", "bf16") == "fp8":
        nbytes = touched * 3 * i * h * (1 + 4 / 128**2) + 2.0 * t * h * 2
        build = lambda: _build_fp8(spec, t, h, e, k, i, dg, dg_reason)  # noqa: E731
        return Case(FAMILY, "fp8_moe_experts", "fp8", shape, flops, nbytes, build, bar=FP8_BAR)
    nbytes = touched * 3 * i * h * 2 + 2.0 * t * h * 2
    build = lambda: _build(spec, t, h, e, k, i, dg, dg_reason)  # noqa: E731
    return Case(FAMILY, "moe_experts", "bf16", shape, flops, nbytes, build, bar=BAR)


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
    e, two_i, h = w13.shape
    config = experts_config(model_type, e, two_i // 2, h)
    cls = _experts_class(model_type)
    with torch.device("meta"):
        module = cls(config)
    module.gate_up_proj = torch.nn.Parameter(w13, requires_grad=False)
    module.down_proj = torch.nn.Parameter(w2, requires_grad=False)
    return module.eval()


def experts_config(model_type: str, experts: int, inter: int, hidden: int) -> Any:
    """A transformers config of ``model_type`` with these experts sizes (SiLU, ``grouped_mm`` experts)."""
    from transformers import AutoConfig

    from tilegemm.transformers.parallel import EXPERT_COUNT_NAMES

    widths = dict.fromkeys(("intermediate_size", "moe_intermediate_size"), inter)
    counts = dict.fromkeys(EXPERT_COUNT_NAMES, experts)
    config = AutoConfig.for_model(model_type, hidden_size=hidden, hidden_act="silu", **widths, **counts)
    config._experts_implementation = "grouped_mm"
    return config


def _experts_class(model_type: str) -> type:
    if model_type == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        return Qwen3MoeExperts
    if model_type == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

        return DeepseekV3Experts
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    return MixtralExperts


def _peer(name: str, sets: list[tuple], model_type: str, check: Any = None) -> Impl:
    """An experts-forward peer run on a stock module per input set (or why it cannot run)."""
    try:
        from transformers.integrations import moe as hf_moe

        from tilegemm.transformers.experts import unfused_experts_forward, unfused_fp8_experts_forward

        fn = {
            "transformers_grouped_mm": getattr(hf_moe, "grouped_mm_experts_forward", None),
            "transformers_batched_mm": getattr(hf_moe, "batched_mm_experts_forward", None),
            "tilegemm_unfused": unfused_experts_forward,
            "tilegemm_fp8_unfused": unfused_fp8_experts_forward,
        }[name]
        if fn is None:
            return Impl(name, f"this transformers has no {name[len('transformers_') :]} experts forward", None)
        mods = [(experts_module(model_type, w13, w2), x, ids, w) for x, ids, w, w13, w2 in sets]
    except Exception as exc:  # transformers missing or too old
        return Impl(name, f"transformers experts module unavailable: {type(exc).__name__}: {exc}", None)

    def call(module, x, ids, w):
        with torch.inference_mode():
            return fn(module, x, ids, w)

    return Impl(name, mods, call, check=check)


def _deepgemm_peer(sets: list[tuple], model_type: str, dg: Any, dg_reason: str, check: Any = None) -> Impl:
    """transformers' ``deepgemm`` experts forward on DeepGEMM ``dg`` (or why it cannot run): bf16 sets
    ``(x, ids, w, w13, w2)`` run ``deepgemm_bf16_experts_forward`` on the stock module, FP8 sets (``w13``/``w2``
    as ``(fp8, scales)`` tuples) ``deepgemm_fp8_fp4_experts_forward`` on transformers' ``FP8Experts``."""
    from tilegemm.bench import hf_deepgemm

    name = "transformers_deepgemm"
    if dg is not None and (not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10)):
        return Impl(name, "transformers' deepgemm experts need an SM90 or SM100 GPU", None)
    hf = hf_deepgemm.install(dg, dg_reason)
    if isinstance(hf, str):
        return Impl(name, hf, None)
    try:
        mods = []
        for x, ids, w, w13, w2 in sets:
            if isinstance(w13, tuple):
                e, two_i, h = w13[0].shape
                module = hf_deepgemm.fp8_experts_module(experts_config(model_type, e, two_i // 2, h), w13, w2)
            else:
                module = experts_module(model_type, w13, w2)
            mods.append((module, x, ids, w))
    except Exception as exc:
        return Impl(name, f"transformers experts module unavailable: {type(exc).__name__}: {exc}", None)
    fp8 = isinstance(sets[0][3], tuple)
    fn = hf.deepgemm_fp8_fp4_experts_forward if fp8 else hf.deepgemm_bf16_experts_forward

    def call(module, x, ids, w):
        with torch.inference_mode():
            return fn(module, x, ids, w)

    return Impl(name, mods, call, check=check, note="transformers.integrations.deepgemm on the local DeepGEMM build")


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


def _input_sets(spec: dict[str, Any], t: int, h: int, e: int, k: int, i: int, weight_bytes: int) -> list[tuple]:
    """Seeded ``(x, ids, weights, w13, w2)`` bf16 input sets, as many as rotate ``weight_bytes`` (what the timed op
    reads per set) plus the hidden states past the L2 cache."""
    seed = inputs.seed_of(FAMILY, spec.get("model"), t, h, e, k, i)
    sets = []
    for s in range(timing.rotation_count(weight_bytes + 2 * t * h)):
        x = inputs.randn((t, h), torch.bfloat16, seed + 4 * s)
        w13 = inputs.randn((e, 2 * i, h), torch.bfloat16, seed + 4 * s + 1).div_(math.sqrt(h))
        w2 = inputs.randn((e, h, i), torch.bfloat16, seed + 4 * s + 2).div_(math.sqrt(i))
        ids, weights = _routing(t, e, k, seed + 4 * s + 3)
        sets.append((x, ids, weights, w13, w2))
    return sets


def _build(spec: dict[str, Any], t: int, h: int, e: int, k: int, i: int, dg: Any = None, dg_reason: str = "") -> Built:
    import tilegemm

    model_type = MODELS.get(spec.get("model"), (0, 0, 0, 0, "qwen3_moe"))[4]
    sets = _input_sets(spec, t, h, e, k, i, weight_bytes=2 * 3 * e * i * h)
    impls = [Impl("tilegemm", sets, lambda x, ids, w, w13, w2: tilegemm.moe_experts(x, ids, w, w13, w2))]
    impls.append(_peer("transformers_grouped_mm", sets, model_type))
    copy_bytes = t * k * 3 * i * h * 2
    if copy_bytes > BATCHED_MM_MAX_BYTES:
        why = f"copies every slot's expert weights ({copy_bytes / 2**30:.0f} GiB)"
        impls.append(Impl("transformers_batched_mm", why, None))
    else:
        impls.append(_peer("transformers_batched_mm", sets, model_type))
    impls.append(_peer("tilegemm_unfused", sets, model_type))
    impls.append(_deepgemm_peer(sets, model_type, dg, dg_reason or "DeepGEMM not loaded"))
    x, ids, weights, w13, w2 = sets[0]
    return Built(impls, diff_check(lambda: _reference(x, ids, weights, w13, w2)))


def _reference_fp8(x, ids, weights, w13, w2) -> torch.Tensor:
    """float64 FP8-recipe experts layer (``tilegemm.fp8_moe_experts``'s formula), one expert at a time."""
    from tilegemm import per_token_cast_to_fp8
    from tilegemm.testing import dequant_per_block, dequant_per_token, fp8_round_trip_per_token

    t, h = x.shape
    inter = w2[0].shape[2]
    x64 = dequant_per_token(*per_token_cast_to_fp8(x))
    out = torch.zeros(t, h, dtype=torch.float64, device=x.device)
    for e in range(w13[0].shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x64[tok] @ dequant_per_block(w13[0][e], w13[1][e]).t()
        hmid = fp8_round_trip_per_token(torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:])
        y = hmid @ dequant_per_block(w2[0][e], w2[1][e]).t()
        out.index_add_(0, tok, y * weights[tok, slot].double()[:, None])
    return out


def _build_fp8(
    spec: dict[str, Any], t: int, h: int, e: int, k: int, i: int, dg: Any = None, dg_reason: str = ""
) -> Built:
    import tilegemm
    from tilegemm.fp8_weights import quantize_weight_blocks

    model_type = MODELS.get(spec.get("model"), (0, 0, 0, 0, "qwen3_moe"))[4]
    sets = _input_sets(spec, t, h, e, k, i, weight_bytes=3 * e * i * h)
    fp8_sets = [(x, ids, w, quantize_weight_blocks(w13), quantize_weight_blocks(w2)) for x, ids, w, w13, w2 in sets]
    fused = Impl("tilegemm", fp8_sets, lambda x, ids, w, q13, q2: tilegemm.fp8_moe_experts(x, ids, w, q13, q2))
    x, ids, weights, w13, w2 = sets[0]
    bf16_check = diff_check(lambda: _reference(x, ids, weights, w13, w2))
    bf16 = lambda x, ids, w, w13, w2: tilegemm.moe_experts(x, ids, w, w13, w2)  # noqa: E731
    grouped_mm = _peer("transformers_grouped_mm", sets, model_type, bf16_check)
    grouped_mm.bar = BAR  # the bf16 paths keep the bf16 rows' bar
    impls = [fused, grouped_mm, Impl("tilegemm_bf16", sets, bf16, check=bf16_check, bar=BAR)]
    fp8_check = diff_check(lambda: _reference_fp8(x, ids, weights, fp8_sets[0][3], fp8_sets[0][4]))
    impls.append(_peer("tilegemm_fp8_unfused", sets, model_type, fp8_check))
    impls.append(_deepgemm_peer(fp8_sets, model_type, dg, dg_reason or "DeepGEMM not loaded", fp8_check))
    return Built(impls, fp8_check)
