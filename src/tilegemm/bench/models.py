"""Whole HuggingFace MoE models: the tilegemm-patched model against the stock model, in the same calls.

Models: ``qwen3-30b-a3b``, ``deepseek-v3`` and ``deepseek-v3.2`` from :mod:`tilegemm.transformers.presets` (real
dimensions, random bf16 weights, nothing downloaded) with :data:`LAYERS` decoder layers: all MoE in Qwen3-30B-A3B;
DeepSeek-V3's first 3 are dense as in the real model, so its 4th is the MoE layer; DeepSeek-V3.2 is V3 with the
sparse-attention indexer in every layer (patched: :mod:`tilegemm.transformers.indexer`; at this prompt length its
top-2048 keeps every key, so the row measures the indexer's cost, not its selection). Batch 1 and 32, a
:data:`PROMPT`-token random prompt per sequence. Two rows per (model, batch):

* ``prefill``: one forward over the prompt (no cache, logits of the last position only);
* ``decode``: one step of the static-cache decode loop: every sequence's next token at position
  :data:`PROMPT`, the cache holding the stock model's prompt (the cache's write position is rewound inside
  the step, so each call is the same step).

``tilegemm`` is the model after :func:`tilegemm.transformers.apply_tilegemm_to_model` (experts on
tilegemm's grouped GEMMs); the peer ``transformers`` is the same model object with transformers' default
experts implementation (``grouped_mm``), switched back and forth by the calls. Both run the same call:
``ms`` is one call eagerly (host overhead included), ``graph_ms`` the call captured in a CUDA graph and
replayed (for ``decode``, the decode loop of ``modeling/transformers/infer.py --cuda-graphs``). Times are
per call: ``batch x prompt`` tokens for ``prefill``, ``batch`` tokens for ``decode``.

The peer ``transformers_deepgemm`` is the same model again with transformers' ``deepgemm`` experts implementation,
its kernels the real DeepGEMM of ``--deepgemm`` (:mod:`tilegemm.bench.hf_deepgemm`); without DeepGEMM, or off
Hopper/Blackwell, the row records why.

Correctness is measured against the stock model (its output is the reference, so the peer's calc_diff is
0): ``calc_diff`` of the call's logits on the same inputs (teacher-forced: same prompt, same cache, same
token), under :data:`BAR`; and ``greedy_agreement``: the fraction of equal tokens in :data:`AGREE_TOKENS`
free-running greedy steps of the static-cache loop, each model from its own prefill (reported, not
gated: random weights leave near-ties that either side may break). The greedy runs happen while the row
is built, so the patched model's kernels are compiled before its first timed call (``jit_ms`` is warm).

FLOPs count 2 x the matmul weights each token uses (the routed experts at top-k / E; the LM head on the
last position only), bytes the weights a call must read at least (routed experts: those a uniform routing
is expected to touch); attention over the cache, the embedding gather and activations are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tilegemm.bench import inputs, timing
from tilegemm.bench.core import Built, Case, Impl
from tilegemm.bench.moe import touched_experts

FAMILY = "models"
#: Presets measured (names in :data:`tilegemm.transformers.presets.PRESETS`).
MODELS = ("qwen3-30b-a3b", "deepseek-v3", "deepseek-v3.2")
#: Decoder layers of each model (DeepSeek-V3 needs 4 for one MoE layer; 30 GB of weights).
LAYERS = 4
BATCHES = (1, 32)
PHASES = ("decode", "prefill")
#: Prompt tokens per sequence (the prefill length and the decode step's context).
PROMPT = 512
#: Greedy steps compared between the patched and the stock model.
AGREE_TOKENS = 16
#: calc_diff bar of the logits against the stock model's: both round every layer to bf16 in different
#: orders (measured about 1e-6), and a near-tie of the router may send a token to another expert.
BAR = 1e-3
QUICK = [("qwen3-30b-a3b", "decode", 1)]


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` (one decode step of the smaller model) or ``full`` run (every decode row, then
    every prefill row): ``{"dtype", "model", "layers", "phase", "batch", "prompt"}``."""
    rows = list(QUICK)
    if size != "quick":
        rows += [(m, p, b) for p in PHASES for m in MODELS for b in BATCHES if (m, p, b) not in QUICK]
    return [
        {"dtype": "bf16", "model": m, "layers": LAYERS, "phase": p, "batch": b, "prompt": PROMPT} for m, p, b in rows
    ]


def build_model(spec: dict[str, Any], device: str | torch.device, seed: int | None = None) -> torch.nn.Module:
    """The causal LM of ``spec`` (``model``, ``layers``) in bf16 on ``device`` (``"meta"``: no memory), eval mode."""
    from transformers import AutoModelForCausalLM

    from tilegemm.transformers.presets import PRESETS

    config = PRESETS[spec["model"]].config(spec["layers"])
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def work(model: torch.nn.Module, batch: int, tokens: int) -> tuple[float, float]:
    """(FLOPs, bytes) of a forward of ``model`` over ``tokens`` tokens whose last ``batch`` reach the LM head."""
    from tilegemm.transformers.monkey_patch import experts_modules

    top_k = model.config.num_experts_per_tok
    head = model.get_output_embeddings().weight
    experts = experts_modules(model)
    skip = {id(model.get_input_embeddings().weight), id(head)}
    skip |= {id(p) for m in experts for p in m.parameters(recurse=False)}
    dense = [p for p in model.parameters() if id(p) not in skip]
    flops = 2.0 * tokens * sum(p.numel() for p in dense) + 2.0 * batch * head.numel()
    nbytes = float(sum(p.numel() * p.element_size() for p in [*dense, head]))
    for m in experts:
        params = list(m.parameters(recurse=False))
        per_expert = sum(p.numel() for p in params) / m.num_experts
        flops += 2.0 * tokens * top_k * per_expert
        nbytes += touched_experts(m.num_experts, top_k, tokens) * per_expert * params[0].element_size()
    return flops, nbytes


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec (FLOPs and bytes counted on a ``meta`` copy of the model)."""
    batch, prompt = spec["batch"], spec["prompt"]
    tokens = batch * prompt if spec["phase"] == "prefill" else batch
    shape = {"model": spec["model"], "layers": spec["layers"], "batch": batch, "prompt": prompt}
    try:
        from tilegemm.transformers.compat import transformers_version

        transformers_version()
        flops, nbytes = work(build_model(spec, "meta"), batch, tokens)
    except ImportError:  # no (recent) transformers: building the row says so
        flops = nbytes = 0.0
    build = lambda: _build(spec, dg, dg_reason)  # noqa: E731
    return Case(FAMILY, spec["phase"], spec["dtype"], shape, flops, nbytes, build, bar=BAR)


class StaticDecode:
    """A static-cache decode loop of ``model`` over ``prompt [B, P]`` with room for ``extra`` more tokens.

    :meth:`prefill` writes the prompt into the cache; :meth:`step` runs one decode step at a position (it
    rewinds the cache's write position there first, so it can be repeated or captured in a CUDA graph).
    """

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, extra: int) -> None:
        from transformers import StaticCache

        self.model, self.prompt = model, prompt
        from tilegemm.transformers.compat import cache_kwargs

        self.cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + extra)
        self.cache_kw = cache_kwargs(model, self.cache)  # once: the signature lookup is host time
        self.position = torch.zeros(1, dtype=torch.long, device=prompt.device)

    @torch.no_grad()
    def prefill(self) -> torch.Tensor:
        """Fill the cache with the prompt; returns the greedy next token ``[B, 1]``."""
        from tilegemm.transformers.compat import rewind_static_cache

        rewind_static_cache(self.cache, 0)
        length = self.prompt.shape[1]
        out = self.model(
            input_ids=self.prompt,
            **self.cache_kw,
            cache_position=torch.arange(length, device=self.prompt.device),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].argmax(-1, keepdim=True)

    @torch.no_grad()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Logits ``[B, V]`` of the step feeding ``token [B, 1]`` at ``position`` (device ops only)."""
        from tilegemm.transformers.compat import rewind_static_cache

        self.position.fill_(position)
        rewind_static_cache(self.cache, position)
        out = self.model(input_ids=token, **self.cache_kw, cache_position=self.position, use_cache=True)
        return out.logits[:, -1]

    def greedy(self, new_tokens: int) -> torch.Tensor:
        """``new_tokens`` greedy tokens ``[B, new_tokens]`` after a fresh prefill."""
        token = self.prefill()
        tokens = [token]
        for i in range(new_tokens - 1):
            token = self.step(token, self.prompt.shape[1] + i).argmax(-1, keepdim=True)
            tokens.append(token)
        return torch.cat(tokens, dim=1)


def _deepgemm_reason(dg: Any, dg_reason: str) -> str | None:
    """Why transformers' ``deepgemm`` experts cannot run here (``None``: they can, on DeepGEMM ``dg``)."""
    from tilegemm.bench import hf_deepgemm

    if dg is not None and (not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10)):
        return "transformers' deepgemm experts need an SM90 or SM100 GPU"
    hf = hf_deepgemm.install(dg, dg_reason)
    return hf if isinstance(hf, str) else None


def _build(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Built:
    """Build the model, compare greedy decodes, and return the variants of the row's call."""
    from tilegemm.testing import calc_diff
    from tilegemm.transformers import EXPERTS_NAME, apply_tilegemm_to_model, revert_tilegemm_model
    from tilegemm.transformers.compat import transformers_version

    transformers_version()
    seed = inputs.seed_of(FAMILY, spec["model"], spec["layers"], spec["batch"], spec["prompt"])
    model = build_model(spec, timing.DEVICE, seed)
    stock = model.config._experts_implementation
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (spec["batch"], spec["prompt"]), generator=gen)
    prompt = prompt.to(timing.DEVICE)

    def select(patched: bool | str) -> None:
        """``True``: tilegemm's patch; ``False``: the stock model; a string: that experts implementation."""
        current = model.config._experts_implementation
        target = EXPERTS_NAME if patched is True else stock if patched is False else patched
        if target == current:
            return
        if target == EXPERTS_NAME:
            apply_tilegemm_to_model(model)
        elif current == EXPERTS_NAME:
            revert_tilegemm_model(model, target)
        else:
            model.set_experts_implementation(target)

    decode = StaticDecode(model, prompt, AGREE_TOKENS)
    select(False)
    stock_tokens = decode.greedy(AGREE_TOKENS)
    select(True)
    agreement = float((decode.greedy(AGREE_TOKENS) == stock_tokens).float().mean())
    if spec["phase"] == "prefill":
        del decode  # frees the cache

        def run() -> torch.Tensor:
            with torch.no_grad():
                return model(input_ids=prompt, use_cache=False, logits_to_keep=1).logits[:, -1]

    else:
        select(False)
        decode.prefill()  # the context of every timed step: the stock model's prompt
        token = stock_tokens[:, :1].clone()

        def run() -> torch.Tensor:
            return decode.step(token, spec["prompt"])

    def variant(patched: bool | str) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            select(patched)
            return run()

        return call

    reference = variant(False)()

    def check(out: torch.Tensor) -> dict[str, Any]:
        return {"calc_diff": calc_diff(out, reference)}

    impls = [
        Impl("tilegemm", [()], variant(True), check=lambda out: {**check(out), "greedy_agreement": agreement}),
        Impl("transformers", [()], variant(False), note=f"experts_implementation={stock}"),
    ]
    why = _deepgemm_reason(dg, dg_reason)
    if why is None:
        impls.append(Impl("transformers_deepgemm", [()], variant("deepgemm"), note="experts_implementation=deepgemm"))
    else:
        impls.append(Impl("transformers_deepgemm", why, None))
    return Built(impls, check)
