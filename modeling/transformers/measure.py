"""Timing and agreement measurements of a causal LM: prefill, greedy decode (generate or a static-cache
loop, optionally replayed from a CUDA graph) and teacher-forced logits. Used by ``modeling/transformers/infer.py``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch

from tilegemm.transformers.compat import cache_kwargs, rewind_static_cache


def sync(device: torch.device) -> None:
    """Wait for the device (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def time_prefill(model, input_ids: torch.Tensor, repeats: int = 3, warmup: int = 1) -> float:
    """Median seconds of one full-prompt forward (no cache, logits of the last position only)."""
    times = []
    for i in range(warmup + repeats):
        sync(input_ids.device)
        start = time.perf_counter()
        model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
        sync(input_ids.device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


class _StepClock:
    """A ``generate`` streamer that timestamps every step (after a device sync)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stamps: list[float] = []

    def put(self, value) -> None:  # noqa: D102 - streamer protocol
        sync(self.device)
        self.stamps.append(time.perf_counter())

    def end(self) -> None:  # noqa: D102
        sync(self.device)
        self.stamps.append(time.perf_counter())


@dataclass
class DecodeResult:
    """Greedy decode: ``tokens [B, new_tokens]`` and the seconds of its ``new_tokens - 1`` decode steps."""

    tokens: torch.Tensor
    decode_seconds: float
    steps: int
    note: str = ""

    def tokens_per_second(self) -> float:
        """Decoded tokens per second over the batch (prefill and first token excluded)."""
        return self.tokens.shape[0] * self.steps / self.decode_seconds if self.decode_seconds > 0 else float("nan")


@torch.no_grad()
def generate_greedy(model, input_ids: torch.Tensor, new_tokens: int, cache: str = "dynamic") -> DecodeResult:
    """``model.generate`` greedy with ``cache`` (``"dynamic"`` or ``"static"``: transformers compiles the
    forward on a GPU); decode time from the first generated token to the last."""
    clock = _StepClock(input_ids.device)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        streamer=clock,
        attention_mask=torch.ones_like(input_ids),
        pad_token_id=0,
    )
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    out = model.generate(input_ids, **kwargs)
    # stamps: [prompt, token 1, ..., token N, end]; decode = token 1 -> token N.
    steps = new_tokens - 1
    seconds = clock.stamps[new_tokens] - clock.stamps[1] if steps > 0 else 0.0
    return DecodeResult(out[:, input_ids.shape[1] :], seconds, steps)


@torch.no_grad()
def static_greedy(model, input_ids: torch.Tensor, new_tokens: int, cuda_graph: bool = False) -> DecodeResult:
    """Greedy decode with a ``StaticCache`` and a fixed-shape step, replayed from a CUDA graph if asked.

    The prefill and two warm-up steps run eagerly (kernels compiled, cache allocated; the cache's write
    position is rewound after them), then the decode step ``(token [B,1], position) -> next token`` is
    captured once and replayed ``new_tokens - 1`` times with the inputs updated in place. Without
    ``cuda_graph`` the same step runs eagerly.
    """
    from transformers import StaticCache

    batch, prompt = input_ids.shape
    device = input_ids.device
    cache = StaticCache(config=model.config, max_cache_len=prompt + new_tokens)
    cache_kw = cache_kwargs(model, cache)  # once: the signature lookup is host time
    out = model(
        input_ids=input_ids,
        **cache_kw,
        cache_position=torch.arange(prompt, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens = [token.clone()]
    position = torch.tensor([prompt], device=device, dtype=torch.long)

    def step() -> torch.Tensor:
        logits = model(input_ids=token, **cache_kw, cache_position=position, use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    graph, note = None, ""
    use_graph = cuda_graph and new_tokens > 1 and device.type == "cuda"
    side = torch.cuda.Stream(device) if use_graph else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for _ in range(2):  # warm-up at the first decode position (kernels compiled before any capture)
            step()
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)
    rewind_static_cache(cache, prompt)
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                next_token = step()
        except Exception as exc:  # report it and decode eagerly rather than lose the measurement
            graph, note = None, f"CUDA graph capture failed ({type(exc).__name__}: {exc})"[:300]
    sync(device)
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        if graph is not None:
            graph.replay()
        else:
            next_token = step()
        tokens.append(next_token.clone())
        token.copy_(next_token)
        position.add_(1)
    sync(device)
    seconds = time.perf_counter() - start
    return DecodeResult(torch.cat(tokens, dim=1), seconds, new_tokens - 1, note)


@torch.no_grad()
def teacher_forced_logits(model, sequence: torch.Tensor, last: int) -> torch.Tensor:
    """fp32 logits of the last ``last`` positions of ``sequence [B, L]`` (one forward, no cache)."""
    return model(input_ids=sequence, use_cache=False, logits_to_keep=last).logits.float()


def compare_logits(test: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max |test - ref|, ``calc_diff`` (float64) and the top-1 agreement of two logit tensors."""
    t, r = test.double(), ref.double()
    denom = (t * t + r * r).sum()
    calc = float(1 - 2 * (t * r).sum() / denom) if denom > 0 else 0.0
    return {
        "max_logit_diff": float((t - r).abs().max()),
        "calc_diff": calc,
        "top1_agreement": float((test.argmax(-1) == ref.argmax(-1)).float().mean()),
    }


def greedy_agreement(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Fraction of equal tokens of two ``[B, N]`` greedy runs and the mean first divergence step."""
    equal = a == b
    first = torch.where(equal.all(dim=1), a.shape[1], (~equal).int().argmax(dim=1))
    return {"token_agreement": float(equal.float().mean()), "first_divergence": float(first.float().mean())}
