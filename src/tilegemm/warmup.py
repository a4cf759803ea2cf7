"""Compile every kernel a patched model will use before it serves: :func:`precompile`.

tilegemm's kernels are compiled on first use (cuTile's ``tileiras``, Triton for the ``gluon`` backend), one
specialization per kernel config, and the configs are chosen from the call's sizes
(``tilegemm.heuristics.cutile``, ``tilegemm.heuristics.gluon``): for the experts, by routed rows per expert (the
per-slot, block and sorted paths, the block path's row tile), for dense GEMMs by rows (decode, narrow and tiled
kernels). A served model meets a new size
class on some request and that request waits for the compiler (seconds per kernel). :func:`precompile` runs the
model once per token count of :func:`token_buckets`, so every size class it will meet up to ``max_tokens``
tokens per forward has its kernels compiled (and, with the on-disk caches, ``CUDA_TILE_CACHE_DIR`` /
``TRITON_CACHE_DIR``, stored for the next process) and its FP8 weight copies quantized; the forwards after the
first run on several threads so that the compiler runs of different kernels overlap. A short ``generate`` at the
end does the first-call work of a request that the forwards do not (a KV cache, a decode step over it).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

H100_SMS = 132
"""SMs assumed by :func:`token_buckets` when none is given and no GPU is visible."""


def size_classes(tokens: int, moe_shape: tuple[int, int, int, int], sms: int) -> tuple:
    """The kernel configs the choice gives one forward of ``tokens`` tokens through an MoE layer of ``moe_shape``
    ``(top_k, num_experts, H, I)``: dense BF16 and FP8 GEMMs of ``tokens`` rows (the cutile and gluon choices), the
    fused BF16 and FP8 experts and the unfused path's grouped GEMM of ``tokens * top_k`` rows. Two token counts with
    equal tuples run the same kernels."""
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.heuristics import gluon
    from tilegemm.heuristics.cutile import Kind, Problem

    top_k, experts, hidden, inter = moe_shape
    slots = tokens * top_k
    return (
        heuristics.choose(Problem("dense", "bf16", tokens, hidden, hidden, sms)),
        heuristics.choose(Problem("dense", "fp8", tokens, hidden, hidden, sms)),
        gluon.dense_fp8_config(tokens, hidden, hidden, sms),
        heuristics.choose(Problem("moe", "bf16", slots, hidden, inter, sms, groups=experts)),
        heuristics.choose(Problem("moe_fp8", "fp8", slots, hidden, inter, sms, groups=experts)),
        heuristics.choose(Problem("grouped", "bf16", slots, 2 * inter, hidden, sms, groups=experts, kind=Kind.PSUM)),
    )


def token_buckets(
    max_tokens: int, moe_shapes: Iterable[tuple[int, int, int, int]] = (), sms: int | None = None
) -> list[int]:
    """Token counts per forward that reach every kernel the size-based choice distinguishes, up to ``max_tokens``.

    Every power of two ``p <= max_tokens`` and ``p + 1`` (the dense choice switches at powers of two of the rows,
    and Triton specializes integer sizes on divisibility by 16), ``max_tokens``, and for each ``(top_k,
    num_experts, H, I)`` of ``moe_shapes`` the first token count of every run of equal :func:`size_classes` in
    ``[1, max_tokens]`` (the experts' paths and tiles switch at multiples of ``num_experts / top_k``, not at
    powers of two). ``sms``: the SMs of the device (default: this GPU's, else 132, an H100's).

    Returns:
        sorted distinct ints in ``[1, max_tokens]``.

    Raises:
        TypeError, ValueError: ``max_tokens`` is not an int >= 1; a ``moe_shapes`` entry is not four ints >= 1.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens: got {type(max_tokens).__name__} {max_tokens!r}, expected an int >= 1")
    if max_tokens < 1:
        raise ValueError(f"max_tokens: got {max_tokens}, expected an int >= 1")
    if sms is None:
        from tilegemm import config

        sms = config.get_num_sms() or H100_SMS
    counts = {max_tokens}
    p = 1
    while p <= max_tokens:
        counts.update((p, p + 1))
        p *= 2
    for shape in moe_shapes:
        ints = isinstance(shape, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
        if not ints or len(shape) != 4 or min(shape) < 1:
            raise ValueError(f"moe_shapes: got {shape!r}, expected (top_k, num_experts, H, I) ints >= 1")
        previous = None
        for tokens in range(1, max_tokens + 1):
            classes = size_classes(tokens, shape, sms)
            if classes != previous:
                counts.add(tokens)
                previous = classes
    return sorted(t for t in counts if 1 <= t <= max_tokens)


def _moe_shapes(model: torch.nn.Module) -> list[tuple[int, int, int, int]]:
    """``(top_k, num_experts, H, I)`` of the model's fused experts modules (top_k: ``config.num_experts_per_tok``)."""
    top_k = getattr(getattr(model, "config", None), "num_experts_per_tok", None)
    if not isinstance(top_k, int) or top_k < 1:
        return []
    shapes = set()
    for module in model.modules():
        down = getattr(module, "down_proj", None)
        if isinstance(getattr(module, "num_experts", None), int) and getattr(down, "ndim", 0) == 3:
            inter, hidden = down.shape[1:] if getattr(module, "is_transposed", False) else down.shape[2:0:-1]
            if module.num_experts >= 1 and min(hidden, inter) >= 1:
                shapes.add((top_k, module.num_experts, int(hidden), int(inter)))
    return sorted(shapes)


def _device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def default_workers(device: torch.device) -> int:
    """Forwards :func:`precompile` runs at once on ``device``: up to 8 on a GPU (one ``tileiras`` process each, at
    most the CPU count), 1 on a CPU (the reference path compiles nothing)."""
    if device.type != "cuda":
        return 1
    return max(1, min(8, os.cpu_count() or 1))


def precompile(
    model: torch.nn.Module,
    max_tokens: int = 8192,
    *,
    token_counts: Iterable[int] | None = None,
    vocab_size: int | None = None,
    workers: int | None = None,
    generate: bool = True,
    prompt_lengths: Iterable[int] | None = None,
) -> dict[int, float]:
    """Run ``model`` (a patched transformers causal LM) once per token count, then one short ``generate``, so the
    kernels and the per-process first-call work of serving are done up front.

    For each count ``t`` of ``token_counts`` (default :func:`token_buckets` of ``max_tokens`` and the model's
    experts shapes) the model's forward runs on ``input_ids [1, t]`` of random ids in ``[0, vocab_size)``, on the
    model's device, under ``torch.no_grad()`` without a KV cache. The experts and dense layers see ``t`` rows, as in
    a prefill of ``t`` tokens or a decode step of a batch of ``t`` sequences, which is what selects their kernels
    (the kernels do not depend on the routing values); the FP8 weight copies (``"tilegemm_fp8"``,
    ``linear=True, fp8=True``) are quantized on the first call. The smallest count runs first, alone; the others
    run on ``workers`` threads at once, and cuTile's ``tileiras`` runs of different threads overlap
    (:func:`tilegemm.ops.cutile.concurrent.concurrent_tileiras`: the same kernels as one after another, each
    compiled once).

    With ``generate`` (and a model that has ``generate``), a ``generate`` of 2 new tokens after a prompt of each of
    ``prompt_lengths`` tokens follows (default: one prompt of ``min(8, largest count)`` tokens), with the model's
    generation config: its prefill with a KV cache, one decode step reading that cache, and ``generate``'s own
    first-call work (cache, masks, logits processors, the torch kernels of sampling and attention over a cache) that
    a first request would otherwise pay. torch's attention also does first-call work per attention shape: with its
    default backends, cuDNN attention builds an execution plan for each new prompt length (0.6-0.9 s on an H200)
    and for each new key count of a decode step (55 ms), stock transformers alike. Give ``prompt_lengths`` the
    lengths the first requests will have (a server's padded prompt buckets) to build their prefill plans here; the
    decode steps of a request longer than any before still pay theirs, unless cuDNN attention is off
    (``torch.backends.cuda.enable_cudnn_sdp(False)``, a global setting precompile leaves to the caller).

    Nothing is returned from the forwards; the parameters are not touched, the torch random state is restored, and
    a model in training mode is put in ``eval()`` for the calls and back.

    On a CPU, or on the ``pytorch`` backend, nothing is compiled: the forwards run the reference path (harmless
    and as slow as a forward). Training (backward) kernels are not covered. Time: one forward per count plus the
    compiles the counts meet, ``workers`` at a time (seconds each; with a warm ``CUDA_TILE_CACHE_DIR`` a compile
    is a disk-cache hit, tens of milliseconds).

    Args:
        model: a module whose ``forward(input_ids=..., use_cache=False)`` takes token ids ``[B, T]``.
        max_tokens: the most tokens a served forward will carry (prompt tokens of one prefill chunk, or the
            decode batch); memory grows with it (and with ``workers``) as forwards of that many tokens do.
        token_counts: explicit token counts (ints >= 1) instead of the buckets.
        vocab_size: id range of the dummy inputs (default ``model.config.vocab_size``).
        workers: forwards at once after the first (default :func:`default_workers`: 1 on a CPU); 1 runs them one
            after another.
        generate: run the short ``generate`` at the end (skipped for a model without ``generate``).
        prompt_lengths: prompt lengths (ints >= 1) of the short ``generate`` runs, one run each.

    Returns:
        ``{token count: seconds}`` of each forward (the first ones include the compiles; forwards that ran at the
        same time overlap).

    Raises:
        TypeError, ValueError: ``max_tokens``, ``token_counts``, ``workers`` or ``prompt_lengths`` not ints >= 1, or
        no ``vocab_size`` known.
    """
    if token_counts is None:
        counts = token_buckets(max_tokens, _moe_shapes(model))
    else:
        counts = sorted({int(_count("token_counts", t)) for t in token_counts})
    vocab = vocab_size if vocab_size is not None else getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"vocab_size: got {vocab!r}, expected an int >= 1 (pass vocab_size= for this model)")
    device = _device(model)
    if workers is None:
        workers = default_workers(device)
    workers = _count("workers", workers)
    generator = torch.Generator(device="cpu").manual_seed(0)
    inputs = {tokens: torch.randint(0, vocab, (1, tokens), generator=generator) for tokens in counts}
    if prompt_lengths is None:
        lengths = [min(8, counts[-1])] if counts else []
    else:
        lengths = sorted({_count("prompt_lengths", t) for t in prompt_lengths})
    prompts = [torch.randint(0, vocab, (1, t), generator=generator) for t in lengths]
    was_training = model.training
    model.eval()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), _compiling_concurrently(workers):
            times = run_forwards(model, inputs, device, workers)
            if generate and callable(getattr(model, "generate", None)):
                for prompt in prompts:
                    _generate(model, prompt.to(device), device)
    finally:
        model.train(was_training)
    return times


def run_forwards(
    model: torch.nn.Module, inputs: dict[int, torch.Tensor], device: torch.device, workers: int
) -> dict[int, float]:
    """``model(input_ids=inputs[t], use_cache=False)`` under ``no_grad`` for each ``t`` in ascending order: the
    first alone, the rest on ``workers`` threads (each on ``device``); ``{t: seconds}`` in ascending ``t``."""
    counts = sorted(inputs)

    def forward(tokens: int) -> float:
        with torch.no_grad(), _on(device):
            ids = inputs[tokens].to(device)
            start = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - start

    times = {counts[0]: forward(counts[0])} if counts else {}
    rest = counts[1:]
    if workers == 1 or len(rest) <= 1:
        times.update((tokens, forward(tokens)) for tokens in rest)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(rest)), thread_name_prefix="tilegemm-precompile") as pool:
            times.update(zip(rest, pool.map(forward, rest)))
    return {tokens: times[tokens] for tokens in counts}


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _compiling_concurrently(workers: int):
    """cuTile's concurrent ``tileiras`` runs for ``workers > 1`` where cuTile is importable; else nothing."""
    if workers == 1:
        return contextlib.nullcontext()
    try:
        from tilegemm.ops.cutile.concurrent import concurrent_tileiras
    except ImportError:
        return contextlib.nullcontext()
    return concurrent_tileiras(workers)


def _generate(model: torch.nn.Module, prompt: torch.Tensor, device: torch.device) -> None:
    """One ``generate`` of 2 new tokens after ``prompt`` with the model's generation config (``pad_token_id``
    from it, else its first ``eos_token_id``, else 0)."""
    config = getattr(model, "generation_config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        eos = getattr(config, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    with torch.no_grad():
        model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=2,
            min_new_tokens=2,
            pad_token_id=0 if pad is None else int(pad),
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: got {type(value).__name__} {value!r}, expected ints >= 1")
    if value < 1:
        raise ValueError(f"{name}: got {value}, expected ints >= 1")
    return value
