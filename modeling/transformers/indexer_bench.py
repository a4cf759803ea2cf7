"""Sparse-attention indexers on one GPU: tilegemm's patched indexer against the stock one, in the same loop.

``python modeling/transformers/indexer_bench.py --out $OUT`` (from the repository root) measures, on a
random-weight realistic preset (default ``deepseek-v3.2``: indexer 64 heads of 128, top-2048):

1. ``prefill``: one indexer module's forward over a whole causal prompt of 4k / 16k / 64k tokens (no cache):
   stock (``[1, S, H, S]`` fp32 scores; an out-of-memory is caught and reported with its length, and stock is
   not tried at longer ones), patched BF16 (``bf16_mqa_logits``) and patched FP8 (DeepSeek's recipe). Per
   variant: median ms, peak memory above the inputs; patched vs stock top-k agreement on sampled rows (keys
   chosen by one side only must be near-ties, as in ``tests/hf/test_indexer_patch.py``), and FP8 against
   BF16: the top-k overlap and the scores' ``calc_diff``.
2. ``decode_module``: the indexer's decode step (one query per sequence over a static key cache of 4k / 16k / 64k
   keys, ``--decode-batches`` sequences, the cache write included, the cache's write position rewound in the step)
   replayed from a CUDA graph and timed eagerly (wall clock, host included), each variant: stock; patched BF16
   (torch's matmul at decode size); ``bf16_kernel``, patched BF16 through ``bf16_mqa_logits`` with its decode
   kernel forced (``TILEGEMM_MQA_VARIANT=decode``); patched FP8 quantizing the whole cache per call; ``fp8_cache``,
   patched FP8 over the FP8 key cache (``fp8_cache=True``: keys quantized on append, ``fp8_paged_mqa_logits``).
   Top-k overlap of each with stock and of the FP8 ones with BF16.
3. ``kernels``: the MQA-logits ops alone at decode size (``--kernel-rows`` query rows, the indexer's heads, the same
   key counts), each call replayed from a CUDA graph: torch's fp32 matmul (the BF16 decode path today), the plain
   kernel and the decode kernel (BF16 and FP8), and ``fp8_paged_mqa_logits`` on the same keys; ``calc_diff`` of
   the decode kernel against the plain one.
4. ``decode_model``: the whole model (``--layers``, default 4: three dense layers and one MoE layer) decode step
   with a static cache of the same lengths (filled with random keys) replayed from a CUDA graph: stock,
   indexers patched alone, indexers and the sparse attention, everything patched (indexers, sparse attention,
   experts, norms), everything patched on the cutile backend (the sparse attention gathers for SDPA instead of its
   gluon kernel), and everything patched with the FP8 key cache (``MODEL_VARIANTS``); logits ``calc_diff`` vs stock;
   each also timed eagerly (wall clock, host included).

5. ``decode_profile``: one eager decode step of one indexer (stock, patched BF16, FP8 key cache) under torch's
   profiler: its kernels with their device microseconds, most first.
``--parts`` picks the parts (default all five). Writes ``indexer_bench.json`` and ``indexer_bench.md`` under
``--out`` (and the JSON to ``--json`` too, if given); prints the tables last. ``--device cpu --preset tiny-deepseek-v32
--contexts 64 --decode-contexts 64`` runs the same code on the CPU (no CUDA graphs, no timing meaning): the
smoke test in ``tests/hf/test_indexer_patch.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from modeling.transformers.cli import positive_ints, progress_log  # noqa: E402
from tilegemm import indexer as scoring  # noqa: E402
from tilegemm.env import MQA_VARIANT  # noqa: E402
from tilegemm.ops import api  # noqa: E402
from tilegemm.testing import calc_diff, dense_index_scores  # noqa: E402
from tilegemm.transformers import indexer as idx  # noqa: E402
from tilegemm.transformers.compat import cache_kwargs, rewind_static_cache  # noqa: E402
from tilegemm.transformers.presets import PRESETS  # noqa: E402

SAMPLE_ROWS = 128
TIE = 1e-5
PARTS = ("prefill", "decode_module", "kernels", "decode_model", "decode_profile")
#: The decode step's variants of one indexer: stock, then the patched settings (:func:`set_variant`).
DECODE_VARIANTS = ("stock", "bf16", "bf16_kernel", "fp8", "fp8_cache")


log = progress_log("indexer_bench")
"""Progress line on stderr (rank 0 only under torchrun)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="deepseek-v3.2", help="a DSA preset of tilegemm.transformers.presets")
    p.add_argument("--contexts", type=positive_ints, default=[4096, 16384, 65536], help="prefill lengths")
    p.add_argument("--decode-contexts", type=positive_ints, default=[4096, 16384, 65536], help="decode cache lengths")
    p.add_argument("--layers", type=int, default=4, help="decoder layers of the whole-model decode (0: skip it)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per measurement")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=".", help="folder for indexer_bench.json and indexer_bench.md")
    p.add_argument("--json", default=None, help="also write the JSON result to this path")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts to run, of {','.join(PARTS)}")
    p.add_argument(
        "--decode-batches", type=positive_ints, default=[1], help="sequences per decode step of the decode_module part"
    )
    p.add_argument("--kernel-rows", type=positive_ints, default=[1], help="query rows of the kernels part")
    return p


# ------------------------------------------------------------------------------------------------ helpers


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Median ms of ``reps`` calls (each waited for) after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_eager_ms(
    variants: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], rounds: int, device: torch.device
) -> dict[str, float]:
    """Median eager ms (host included, each call waited for) of every variant's ``call``, the variants timed in turn
    round after round (``setup()`` first, then one untimed call, then the timed one; the order rotates each round),
    so that drift of the host's speed reaches every variant alike. ``variants``: name -> ``(setup, call)``."""
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            setup, call = variants[name]
            setup()
            call()
            sync(device)
            start = time.perf_counter()
            call()
            sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_extra_gib(fn: Callable[[], Any], device: torch.device) -> float | None:
    """GiB allocated at the peak of one ``fn()`` call above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**30


def capture_graph(fn: Callable[[], Any], device: torch.device) -> tuple[Any, Any]:
    """``fn`` captured in a CUDA graph after two eager warm-ups on a side stream, replayed once: ``(graph, its
    output)``; on the CPU ``(None, fn())``."""
    if device.type != "cuda":
        return None, fn()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    sync(device)
    return graph, out


def replay_ms(graph: Any, reps: int, device: torch.device) -> float:
    """Median ms of one replay of ``graph``, each timed alone between two events (the graph's launch included)."""
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_replay_ms(fn: Callable[[], Any], reps: int, device: torch.device) -> tuple[float, Any]:
    """Capture ``fn`` in a CUDA graph (:func:`capture_graph`) and return the median ms of a replay
    (:func:`replay_ms`) and the graph's output; on the CPU the eager time and output."""
    graph, out = capture_graph(fn, device)
    if graph is None:
        return timed_ms(fn, reps, device), out
    return replay_ms(graph, reps, device), out


def interleaved_graph_ms(graphs: dict[str, Any], rounds: int, replays: int, device: torch.device) -> dict[str, float]:
    """Kernel-only ms of a step: every graph of ``graphs`` (name -> CUDA graph) replayed ``replays`` times back to
    back between two events (the GPU never waits for the host), the variants in turn round after round (the order
    rotating), the median over ``rounds`` of ms per replay. Empty on the CPU."""
    if device.type != "cuda" or not graphs:
        return {}
    names = list(graphs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            graphs[name].replay()
            sync(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / replays)
    return {name: statistics.median(t) for name, t in times.items()}


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def model_module(model_type: str):
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def set_variant(module: torch.nn.Module, stock: type, variant: str, rope: str) -> None:
    """``stock``, ``bf16``, ``bf16_kernel``, ``fp8`` or ``fp8_cache``: the module's class and the patched settings
    (``bf16_kernel`` is ``bf16`` under :func:`mqa_variant`)."""
    if variant == "stock":
        module.__class__ = stock
        return
    module.__class__ = idx.tilegemm_indexer_class(stock, rope)
    module._tilegemm_backend = None
    module._tilegemm_fp8 = variant.startswith("fp8")
    module._tilegemm_hadamard = True
    module._tilegemm_fp8_cache = variant == "fp8_cache"


@contextlib.contextmanager
def mqa_variant(name: str | None):
    """``$TILEGEMM_MQA_VARIANT`` set to ``name`` (``None``: unset) inside the block, restored after: the MQA ops read
    it per call, so a graph captured inside keeps the kernel it chose."""
    old = os.environ.pop(MQA_VARIANT, None)
    if name is not None:
        os.environ[MQA_VARIANT] = name
    try:
        yield
    finally:
        os.environ.pop(MQA_VARIANT, None)
        if old is not None:
            os.environ[MQA_VARIANT] = old


def capture_scores(call: Callable[[], Any]) -> tuple[Any, torch.Tensor]:
    """Run ``call`` (a patched indexer forward) and return its output and the scores it handed to ``topk``."""
    captured = {}
    original = scoring.index_scores

    def spy(*a, **kw):
        captured["scores"] = original(*a, **kw)
        return captured["scores"]

    scoring.index_scores = spy
    try:
        out = call()
    finally:
        scoring.index_scores = original
    return out, captured["scores"]


def capture_stock_scores(call: Callable[[], Any]) -> tuple[Any, torch.Tensor]:
    """Run a stock indexer forward and return its output and the scores it handed to ``Tensor.topk``."""
    captured = {}
    original = torch.Tensor.topk

    def spy(self, k, dim=-1, *a, **kw):
        captured["scores"] = self
        return original(self, k, dim, *a, **kw)

    torch.Tensor.topk = spy
    try:
        out = call()
    finally:
        torch.Tensor.topk = original
    return out, captured["scores"]


def topk_agreement(a: torch.Tensor, b: torch.Tensor, scores_b: torch.Tensor, visible: torch.Tensor) -> dict:
    """Rows ``[R, k]`` of indices ``a`` vs reference ``b`` (scored ``scores_b`` ``[R, T]``): the fraction of rows
    whose visible selected sets are equal, the worst relative distance from the row's k-th score of a key chosen by
    one side only (near-tie if <= TIE), and the mean overlap ``|A & B| / |B|``."""
    k = b.shape[-1]
    kth = scores_b.topk(k, dim=-1).values[:, -1]
    scale = scores_b.masked_fill(~visible, 0).abs().amax(dim=-1).clamp_min(1e-30)
    equal, worst, overlaps = 0, 0.0, []
    for r in range(b.shape[0]):
        sa = {int(i) for i in a[r].tolist() if visible[r, int(i)]}
        sb = {int(i) for i in b[r].tolist() if visible[r, int(i)]}
        equal += sa == sb
        overlaps.append(len(sa & sb) / max(1, len(sb)))
        for key in sa ^ sb:
            worst = max(worst, abs(float(scores_b[r, key]) - float(kth[r])) / float(scale[r]))
    return {"rows_equal": equal / b.shape[0], "worst_tie_gap": worst, "overlap": statistics.fmean(overlaps)}


# ------------------------------------------------------------------------------------------------ prefill


def indexer_call(module, hidden, q_resid, pe, mask, positions, cache) -> Callable[[], torch.Tensor]:
    """One forward of ``module`` as it is now (stock or swapped), without autograd: ``cache`` goes in by the keyword
    its forward takes (:func:`cache_kwargs`: ``cache`` from transformers 5.24, ``past_key_values`` before), looked
    up once here rather than on every timed call."""
    cache_kw = cache_kwargs(module, cache)

    def call() -> torch.Tensor:
        with torch.no_grad():
            return module(hidden, q_resid, pe, mask, positions, **cache_kw)

    return call


def make_indexer(config, device: torch.device):
    """The stock indexer of ``config``'s model type alone, as a model built from ``config`` holds it: with the
    attention implementation such a model gets (SDPA, transformers' default where supported), which the swapped
    indexer reads (``indexer.MASK_ATTENTION``)."""
    if getattr(config, "_attn_implementation", None) is None:
        config._attn_implementation = "sdpa"
    mod = model_module(config.model_type)
    spec = idx.INDEXER_BY_MODEL_TYPE[config.model_type]
    stock = getattr(mod, spec.indexer_class)
    torch.manual_seed(0)
    module = stock(config, 0).to(device=device, dtype=torch.bfloat16).eval()
    module.weights_proj.float()  # transformers keeps it in fp32 (_keep_in_fp32_modules)
    rotary = getattr(mod, stock.__name__.replace("Indexer", "RotaryEmbedding"))(config).to(device)
    if not idx.stock_formula_matches(stock, spec.rope):
        raise RuntimeError(f"{stock.__name__}.forward differs from the formula tilegemm replaces")
    return module, stock, spec.rope, rotary


def indexer_inputs(config, module, rotary, length: int, device: torch.device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(1, length, config.hidden_size, device=device, generator=g).bfloat16()
    q_resid = torch.randn(1, length, config.q_lora_rank, device=device, generator=g).bfloat16()
    positions = torch.arange(length, device=device)[None]
    cos, sin = rotary(hidden, positions)
    return hidden, q_resid, (cos, sin), positions


def prefill(config, contexts: list[int], reps: int, device: torch.device) -> list[dict]:
    module, stock, rope, rotary = make_indexer(config, device)
    rows, stock_oom_at = [], None
    for length in contexts:
        log(f"prefill {length}")
        hidden, q_resid, pe, positions = indexer_inputs(config, module, rotary, length, device, length)
        mask = torch.ones(length, length, dtype=torch.bool, device=device).tril_()[None]
        sample = torch.linspace(0, length - 1, min(length, SAMPLE_ROWS), device=device).round().long().unique()
        visible = mask[0, sample]
        row: dict[str, Any] = {"context": length, "heads": module.n_heads, "head_dim": module.head_dim}
        kept: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for variant in ("stock", "bf16", "fp8"):
            if variant == "stock" and stock_oom_at is not None:
                row["stock"] = {"error": f"not run: out of memory at {stock_oom_at}"}
                continue
            set_variant(module, stock, variant, rope)
            call = indexer_call(module, hidden, q_resid, pe, mask, positions, None)
            try:
                ms = timed_ms(call, reps if length <= 16384 else max(2, reps // 2), device)
                peak = peak_extra_gib(call, device)
                capture = capture_stock_scores if variant == "stock" else capture_scores
                out, scores = capture(call)
                kept[variant] = (out[0, sample].clone(), scores[0, sample].clone())
                del out, scores
                row[variant] = {"ms": ms, "peak_gib": peak}
            except Exception as exc:  # an OOM of stock is a result; anything else too, with its message
                if is_oom(exc) and variant == "stock":
                    stock_oom_at = length
                row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "oom": is_oom(exc)}
            free(device)
        if "stock" in kept and "bf16" in kept:
            agree = topk_agreement(kept["bf16"][0], kept["stock"][0], kept["stock"][1], visible)
            row["bf16"]["vs_stock"] = agree
            finite = visible
            row["bf16"]["vs_stock"]["calc_diff"] = calc_diff(kept["bf16"][1][finite], kept["stock"][1][finite])
            row["bf16"]["speedup"] = row["stock"]["ms"] / row["bf16"]["ms"]
        if "bf16" in kept:
            ref = sampled_formula(module, hidden, q_resid, pe, sample)
            row["bf16"]["calc_diff_vs_f64"] = calc_diff(kept["bf16"][1][visible], ref[visible])
        if "bf16" in kept and "fp8" in kept:
            agree = topk_agreement(kept["fp8"][0], kept["bf16"][0], kept["bf16"][1], visible)
            row["fp8"]["vs_bf16"] = {
                "topk_overlap": agree["overlap"],
                "rows_equal": agree["rows_equal"],
                "calc_diff": calc_diff(kept["fp8"][1][visible], kept["bf16"][1][visible]),
            }
            row["fp8"]["speed_vs_bf16"] = row["bf16"]["ms"] / row["fp8"]["ms"]
        rows.append(row)
        del hidden, q_resid, pe, mask, kept
        free(device)
    set_variant(module, stock, "stock", rope)
    return rows


def sampled_formula(module, hidden, q_resid, pe, sample) -> torch.Tensor:
    """Stock's formula in float64 for the sampled query rows, from the module's own q and k (captured from a
    patched forward's :func:`index_scores` arguments)."""
    captured = {}
    original = scoring.index_scores

    def spy(q, k, weights, mask, scale, *a, **kw):
        captured.update(q=q[:, sample], k=k, w=weights[:, sample], scale=scale)
        return original(q[:, :1], k, weights[:, :1], None if mask is None else mask[:, :1], scale)

    stock = type(module).__dict__.get("_tilegemm_stock", type(module))
    set_variant(module, stock, "bf16", idx.INDEXER_BY_MODEL_TYPE[module.config.model_type].rope)
    scoring.index_scores = spy
    try:
        with torch.no_grad():
            module(hidden, q_resid, pe, None, None)  # no cache
    finally:
        scoring.index_scores = original
    ref = dense_index_scores(captured["q"], captured["k"], captured["w"], captured["scale"])[0]
    cols = torch.arange(ref.shape[-1], device=ref.device)
    return ref.masked_fill(cols[None, :] > sample[:, None], float("-inf"))


# ------------------------------------------------------------------------------------------------ decode


class StaticKeys:
    """A static indexer key cache for one layer, as transformers' static layers keep it: ``update_indexer`` writes at
    the device counter ``indexer_cumulative_length`` and advances it (graph-safe), ``layers`` holds the one layer
    (so :func:`rewind_static_cache` rewinds it and the FP8 key cache follows the counter)."""

    def __init__(self, keys: torch.Tensor, position: int) -> None:
        self.keys = keys
        self.indexer_cumulative_length = torch.tensor(position, device=keys.device)
        self.layers = [self]

    def update_indexer(self, k: torch.Tensor, layer_idx: int) -> torch.Tensor:
        positions = self.indexer_cumulative_length + torch.arange(k.shape[1], device=k.device)
        self.indexer_cumulative_length.add_(k.shape[1])
        self.keys.index_copy_(1, positions, k)
        return self.keys


def _overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|A & B| / |B|`` of two top-k index rows."""
    sb = set(b.tolist())
    return len(set(a.tolist()) & sb) / max(1, len(sb))


def decode_step(
    config, module, rotary, length: int, device: torch.device, batch: int = 1
) -> Callable[[], Callable[[], torch.Tensor]]:
    """The indexer's decode step over a static key cache of ``length`` random keys per sequence (``batch`` sequences,
    one query each at position ``length``, every key visible): returns ``step_of_module()``, which gives the step of
    ``module`` as it is now (stock or a swapped variant): the cache's write position rewound (a device op: captured
    with the step), then one forward."""
    g = torch.Generator(device=device).manual_seed(length)
    keys = torch.randn(batch, length + 1, module.head_dim, device=device, generator=g).bfloat16()
    cache = StaticKeys(keys, length)
    hidden = torch.randn(batch, 1, config.hidden_size, device=device, generator=g).bfloat16()
    q_resid = torch.randn(batch, 1, config.q_lora_rank, device=device, generator=g).bfloat16()
    position = torch.full((batch, 1), length, device=device)
    pe = rotary(hidden, position)
    mask = torch.ones(batch, 1, length + 1, dtype=torch.bool, device=device)

    def step_of_module() -> Callable[[], torch.Tensor]:
        forward = indexer_call(module, hidden, q_resid, pe, mask, position, cache)

        def call() -> torch.Tensor:
            rewind_static_cache(cache, length)  # a device op: captured with the step
            return forward()

        return call

    return step_of_module


def decode_module(
    config, contexts: list[int], reps: int, device: torch.device, batches: list[int] = (1,)
) -> list[dict]:
    """:data:`DECODE_VARIANTS`' decode step of one indexer per batch size and context: the CUDA-graph replay and the
    eager (wall-clock, host included) median ms, top-k overlaps of the first sequence."""
    module, stock, rope, rotary = make_indexer(config, device)
    rows = []
    for batch in batches:
        for length in contexts:
            log(f"decode_module batch {batch} context {length}")
            step_of_module = decode_step(config, module, rotary, length, device, batch)
            row: dict[str, Any] = {"batch": batch, "context": length}
            outs, eager_calls, graphs = {}, {}, {}
            for variant in DECODE_VARIANTS:
                set_variant(module, stock, variant, rope)
                call = step_of_module()
                try:
                    with mqa_variant("decode" if variant == "bf16_kernel" else None):
                        graph, out = capture_graph(call, device)
                        ms = timed_ms(call, reps * 20, device) if graph is None else replay_ms(graph, reps * 20, device)
                    outs[variant] = out.clone()
                    row[variant] = {"graph_ms": ms}
                    if graph is not None:
                        graphs[variant] = graph
                    eager_calls[variant] = (functools.partial(set_variant, module, stock, variant, rope), call)
                except Exception as exc:
                    row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                free(device)
            for variant, ms in interleaved_graph_ms(graphs, max(5, reps), 20, device).items():
                row[variant]["graph_b2b_ms"] = ms
            graphs.clear()
            eager_calls.pop("bf16_kernel", None)  # the same eager path as bf16 (the variant is forced per call)
            for variant, eager in interleaved_eager_ms(eager_calls, reps * 10, device).items():
                row[variant]["eager_ms"] = eager
            for variant in DECODE_VARIANTS[1:]:
                if "stock" in outs and variant in outs:
                    row[variant]["topk_overlap_vs_stock"] = _overlap(outs[variant][0, 0], outs["stock"][0, 0])
                    row[variant]["speedup"] = row["stock"]["graph_ms"] / row[variant]["graph_ms"]
                    if "graph_b2b_ms" in row[variant]:
                        row[variant]["speedup_b2b"] = row["stock"]["graph_b2b_ms"] / row[variant]["graph_b2b_ms"]
                    if "eager_ms" in row[variant]:
                        row[variant]["eager_speedup"] = row["stock"]["eager_ms"] / row[variant]["eager_ms"]
                if variant.startswith("fp8") and "bf16" in outs and variant in outs:
                    row[variant]["topk_overlap_vs_bf16"] = _overlap(outs[variant][0, 0], outs["bf16"][0, 0])
                    row[variant]["speed_vs_bf16"] = row["bf16"]["graph_ms"] / row[variant]["graph_ms"]
                    if "graph_b2b_ms" in row[variant]:
                        row[variant]["speed_vs_bf16_b2b"] = row["bf16"]["graph_b2b_ms"] / row[variant]["graph_b2b_ms"]
                    row[variant]["eager_speed_vs_bf16"] = row["bf16"]["eager_ms"] / row[variant]["eager_ms"]
            rows.append(row)
    set_variant(module, stock, "stock", rope)
    return rows


#: The variants whose decode step the ``decode_profile`` part breaks into kernels.
PROFILE_VARIANTS = ("stock", "bf16", "fp8_cache")


def step_kernels(call: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """One eager run of ``call`` (after two warm-up runs) under torch's profiler: its CUDA kernels (on the CPU: its
    CPU ops), each name's summed microseconds and count, most time first, and the totals."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        call()
    sync(device)
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        call()
        sync(device)
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    found: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == kind and (cuda or event.cpu_parent is None):
            entry = found.setdefault(event.name, [0.0, 0])
            entry[0] += event.time_range.elapsed_us()
            entry[1] += 1
    top = sorted(found.items(), key=lambda item: -item[1][0])
    return {
        "kernels": sum(count for _, count in found.values()),
        "total_us": sum(us for us, _ in found.values()),
        "top": [{"name": name[:120], "us": us, "count": count} for name, (us, count) in top],
    }


def decode_profile(config, contexts: list[int], device: torch.device) -> list[dict]:
    """The indexer's decode step (as :func:`decode_module` runs it) of :data:`PROFILE_VARIANTS`, kernel by kernel."""
    module, stock, rope, rotary = make_indexer(config, device)
    rows = []
    for length in contexts:
        log(f"decode_profile {length}")
        step_of_module = decode_step(config, module, rotary, length, device)
        row: dict[str, Any] = {"context": length}
        for variant in PROFILE_VARIANTS:
            set_variant(module, stock, variant, rope)
            try:
                row[variant] = step_kernels(step_of_module(), device)
            except Exception as exc:
                row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(row)
    set_variant(module, stock, "stock", rope)
    return rows


#: The ops of the kernels part: (name, ``$TILEGEMM_MQA_VARIANT`` forced while it is captured, operands, op).
KERNEL_VARIANTS = (
    ("torch_bf16", None, "bf16", lambda *a: scoring._float_logits(*a)),
    ("bf16_plain", "plain", "bf16", lambda *a: api.bf16_mqa_logits(*a)),
    ("bf16_decode", "decode", "bf16", lambda *a: api.bf16_mqa_logits(*a)),
    ("fp8_plain", "plain", "fp8", lambda *a: api.fp8_mqa_logits(*a)),
    ("fp8_decode", "decode", "fp8", lambda *a: api.fp8_mqa_logits(*a)),
    ("fp8_paged", None, "paged", lambda *a: api.fp8_paged_mqa_logits(*a)),
)


def kernel_operands(heads: int, dim: int, rows: int, length: int, device: torch.device) -> dict[str, Any]:
    """A decode call's operands: the last ``rows`` of ``length`` causal queries, bf16 and FP8 (DeepSeek's recipe,
    per-token key scales), and the same FP8 keys as a paged cache (block_kv 64)."""
    g = torch.Generator(device=device).manual_seed(length + rows)
    q = torch.randn(rows, heads, dim, device=device, generator=g).bfloat16()
    k = torch.randn(length, dim, device=device, generator=g).bfloat16()
    w = torch.randn(rows, heads, device=device, generator=g) * heads**-0.5
    ks, ke = scoring.causal_windows(rows, length, device=device)
    q8, q_scale = scoring.quantize_rows(q)
    kv8 = scoring.quantize_keys(k)
    cache, table, lens = scoring.build_paged_kv_cache([kv8], 64, device=device)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    meta = api.get_paged_mqa_logits_metadata(lens, 64, num_sms)
    return {
        "bf16": (q, k, w, ks, ke),
        "fp8": (q8, kv8, (w * q_scale).contiguous(), ks, ke),
        "paged": (q8[None], cache, (w * q_scale).contiguous(), lens, table, meta, length),
    }


def kernels(config, contexts: list[int], rows_list: list[int], reps: int, device: torch.device) -> list[dict]:
    module, *_ = make_indexer(config, device)
    heads, dim = module.n_heads, module.head_dim
    del module
    rows_out = []
    for length in contexts:
        for rows in rows_list:
            log(f"kernels {length} keys, {rows} rows")
            ops = kernel_operands(heads, dim, rows, length, device)
            row: dict[str, Any] = {"context": length, "rows": rows, "heads": heads, "head_dim": dim}
            outs = {}
            for name, forced, operands, op in KERNEL_VARIANTS:
                try:
                    with mqa_variant(forced):
                        ms, out = graph_replay_ms(functools.partial(op, *ops[operands]), reps * 20, device)
                    outs[name] = out.clone()
                    row[name] = {"graph_us": ms * 1e3}
                except Exception as exc:
                    row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            valid = torch.isfinite(outs["bf16_plain"]) if "bf16_plain" in outs else None
            for dtype in ("bf16", "fp8"):
                plain, decode = outs.get(f"{dtype}_plain"), outs.get(f"{dtype}_decode")
                if plain is not None and decode is not None and valid is not None:
                    row[f"{dtype}_decode"]["calc_diff_vs_plain"] = calc_diff(decode[valid], plain[valid])
                    row[f"{dtype}_decode"]["speedup_vs_plain"] = (
                        row[f"{dtype}_plain"]["graph_us"] / row[f"{dtype}_decode"]["graph_us"]
                    )
            if "torch_bf16" in row and "bf16_decode" in outs:
                row["bf16_decode"]["speedup_vs_torch"] = row["torch_bf16"]["graph_us"] / row["bf16_decode"]["graph_us"]
            rows_out.append(row)
            free(device)
    return rows_out


#: The whole-model decode step's variants: stock, indexers patched alone, indexers and the sparse attention, everything
#: patched (BF16 indexers, sparse attention), everything patched under the cutile backend (so the sparse attention
#: gathers its keys for SDPA instead of running the gluon kernel), everything patched with the FP8 key cache.
MODEL_VARIANTS = ("stock", "indexer", "sparse", "all", "all_gather", "all_fp8_cache")


def decode_model(preset: str, layers: int, contexts: list[int], reps: int, device: torch.device) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from tilegemm.bench.models import StaticDecode
    from tilegemm.transformers import apply_tilegemm_to_model, revert_tilegemm_model, swap_indexers

    config = PRESETS[preset].config(layers)
    torch.manual_seed(0)
    log(f"building {preset} with {layers} layers")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    stock_experts = model.config._experts_implementation
    rows = []
    for length in contexts:
        log(f"decode_model {length}")
        prompt = torch.randint(0, config.vocab_size, (1, 16), device=device)
        decode = StaticDecode(model, prompt, length)
        row: dict[str, Any] = {"context": length, "layers": layers}
        try:
            revert_tilegemm_model(model, stock_experts)
            decode.prefill()
            g = torch.Generator(device=device).manual_seed(length)
            for layer in decode.cache.layers:  # a full context of random keys, values and indexer keys
                for name in ("keys", "values", "indexer_keys"):
                    t = getattr(layer, name, None)
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        t.copy_(torch.randn(t.shape, device=device, generator=g).to(t.dtype))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            continue
        token = prompt[:, :1].clone()
        logits, eager_calls = {}, {}

        def patch(variant: str) -> None:
            revert_tilegemm_model(model, stock_experts)
            if variant in ("indexer", "sparse"):
                apply_tilegemm_to_model(model, experts=False, norm=False, sparse_attention=variant == "sparse")
            elif variant != "stock":
                apply_tilegemm_to_model(model)
            if variant == "all_fp8_cache":
                swap_indexers(model, fp8=True, fp8_cache=True)

        for variant in MODEL_VARIANTS:
            patch(variant)
            step = functools.partial(decode.step, token, length)
            if variant == "all_gather":
                step = functools.partial(_under_backend, "cutile", step)
            try:
                ms, out = graph_replay_ms(step, reps * 4, device)
                peak = peak_extra_gib(step, device)
                logits[variant] = out.float().clone()
                row[variant] = {"graph_ms": ms, "peak_gib": peak}
                eager_calls[variant] = (functools.partial(patch, variant), step)
            except Exception as exc:
                row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            free(device)
        for variant, eager in interleaved_eager_ms(eager_calls, reps * 2, device).items():
            row[variant]["eager_ms"] = eager
        for variant in MODEL_VARIANTS[1:]:
            if "stock" in logits and variant in logits:
                row[variant]["calc_diff_vs_stock"] = calc_diff(logits[variant], logits["stock"])
                row[variant]["speedup"] = row["stock"]["graph_ms"] / row[variant]["graph_ms"]
                row[variant]["eager_speedup"] = row["stock"]["eager_ms"] / row[variant]["eager_ms"]
        rows.append(row)
        del decode
        free(device)
    revert_tilegemm_model(model, stock_experts)
    return rows


def _under_backend(backend: str, step: Callable[[], Any]) -> Any:
    """``step()`` inside ``use_backend(backend)``."""
    from tilegemm import use_backend

    with use_backend(backend):
        return step()


# ------------------------------------------------------------------------------------------------ report


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _cell(entry: dict | None, key: str, spec: str = ".3g") -> str:
    if entry is None:
        return "-"
    if "error" in entry:
        return "OOM" if entry.get("oom") or "out of memory" in entry["error"] else "error"
    return _fmt(entry.get(key), spec)


def markdown(result: dict) -> str:
    lines = [f"# Indexer: tilegemm vs stock ({result['preset']}, {result['device']})", ""]
    lines += [f"torch {result['torch']}, transformers {result['transformers']}, {result['when']}", ""]
    lines += ["## Prefill (one indexer, causal prompt, no cache)", ""]
    lines += [
        "| context | stock ms | stock peak GiB | bf16 ms | bf16 peak GiB | speedup | top-k rows equal | worst tie gap "
        "| bf16 calc_diff vs f64 | fp8 ms | fp8 top-k overlap vs bf16 | fp8 calc_diff vs bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("prefill", []):
        s, b, f = r.get("stock"), r.get("bf16"), r.get("fp8")
        vs = (b or {}).get("vs_stock", {})
        f8 = (f or {}).get("vs_bf16", {})
        lines.append(
            f"| {r['context']} | {_cell(s, 'ms')} | {_cell(s, 'peak_gib')} | {_cell(b, 'ms')} | {_cell(b, 'peak_gib')} "
            f"| {_cell(b, 'speedup')} | {_fmt(vs.get('rows_equal'))} | {_fmt(vs.get('worst_tie_gap'))} "
            f"| {_cell(b, 'calc_diff_vs_f64')} | {_cell(f, 'ms')} | {_fmt(f8.get('topk_overlap'))} "
            f"| {_fmt(f8.get('calc_diff'))} |"
        )
    lines += ["", "## Decode step, one indexer (static key cache; CUDA-graph replay, then eager wall-clock)", ""]
    lines += [
        "| batch | context | stock ms | bf16 ms | speedup | bf16_kernel ms | speedup | fp8 ms | speedup | fp8_cache ms "
        "| speedup | fp8_cache vs bf16 speed | fp8_cache top-k overlap vs bf16 | bf16 top-k overlap vs stock "
        "| eager: stock ms | bf16 ms | speedup | fp8_cache ms | vs bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("decode_module", []):
        s, b, bk, f, fc = (r.get(v) for v in DECODE_VARIANTS)
        lines.append(
            f"| {r.get('batch', 1)} | {r['context']} | {_cell(s, 'graph_ms')} | {_cell(b, 'graph_ms')} "
            f"| {_cell(b, 'speedup')} | {_cell(bk, 'graph_ms')} | {_cell(bk, 'speedup')} | {_cell(f, 'graph_ms')} "
            f"| {_cell(f, 'speedup')} | {_cell(fc, 'graph_ms')} | {_cell(fc, 'speedup')} "
            f"| {_cell(fc, 'speed_vs_bf16')} "
            f"| {_cell(fc, 'topk_overlap_vs_bf16')} | {_cell(b, 'topk_overlap_vs_stock')} | {_cell(s, 'eager_ms')} "
            f"| {_cell(b, 'eager_ms')} | {_cell(b, 'eager_speedup')} | {_cell(fc, 'eager_ms')} "
            f"| {_cell(fc, 'eager_speed_vs_bf16')} |"
        )
    title = "## Decode step, one indexer, kernel-only (CUDA graphs replayed back to back, the variants in turn)"
    lines += ["", title, ""]
    lines += [
        "| batch | context | stock ms | bf16 ms | speedup | fp8 ms | speedup | fp8_cache ms | speedup "
        "| fp8_cache vs bf16 speed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("decode_module", []):
        s, b, _, f, fc = (r.get(v) for v in DECODE_VARIANTS)
        if not (s or {}).get("graph_b2b_ms"):
            continue
        lines.append(
            f"| {r.get('batch', 1)} | {r['context']} | {_cell(s, 'graph_b2b_ms')} | {_cell(b, 'graph_b2b_ms')} "
            f"| {_cell(b, 'speedup_b2b')} | {_cell(f, 'graph_b2b_ms')} | {_cell(f, 'speedup_b2b')} "
            f"| {_cell(fc, 'graph_b2b_ms')} | {_cell(fc, 'speedup_b2b')} | {_cell(fc, 'speed_vs_bf16_b2b')} |"
        )
    lines += ["", "## MQA-logits ops at decode size (CUDA graph, us)", ""]
    lines += [
        "| context | rows | " + " | ".join(name for name, *_ in KERNEL_VARIANTS) + " | bf16 decode vs plain "
        "| bf16 decode vs torch | fp8 decode vs plain | decode calc_diff vs plain (bf16, fp8) |",
        "|---|---|" + "---|" * (len(KERNEL_VARIANTS) + 4),
    ]
    for r in result.get("kernels", []):
        times = " | ".join(_cell(r.get(name), "graph_us", ".1f") for name, *_ in KERNEL_VARIANTS)
        bd, fd = r.get("bf16_decode"), r.get("fp8_decode")
        lines.append(
            f"| {r['context']} | {r['rows']} | {times} | {_cell(bd, 'speedup_vs_plain')} "
            f"| {_cell(bd, 'speedup_vs_torch')} | {_cell(fd, 'speedup_vs_plain')} "
            f"| {_cell(bd, 'calc_diff_vs_plain')}, {_cell(fd, 'calc_diff_vs_plain')} |"
        )
    lines += ["", "## Decode step, whole model (static cache, CUDA graph)", ""]
    lines += [
        "| context | layers | stock ms | stock peak GiB | "
        + " | ".join(f"{v} ms | speedup | calc_diff vs stock" for v in MODEL_VARIANTS[1:])
        + " |",
        "|---|---|---|---|" + "---|" * (3 * (len(MODEL_VARIANTS) - 1)),
    ]
    for r in result.get("decode_model", []):
        s = r.get("stock")
        cells = " | ".join(
            f"{_cell(r.get(v), 'graph_ms')} | {_cell(r.get(v), 'speedup')} | {_cell(r.get(v), 'calc_diff_vs_stock')}"
            for v in MODEL_VARIANTS[1:]
        )
        lines.append(f"| {r['context']} | {r['layers']} | {_cell(s, 'graph_ms')} | {_cell(s, 'peak_gib')} | {cells} |")
    if any("eager_ms" in (r.get("stock") or {}) for r in result.get("decode_model", [])):
        lines += ["", "## Decode step, whole model, eager (wall clock, host included)", ""]
        lines += [
            "| context | layers | stock ms | " + " | ".join(f"{v} ms | speedup" for v in MODEL_VARIANTS[1:]) + " |",
            "|---|---|---|" + "---|" * (2 * (len(MODEL_VARIANTS) - 1)),
        ]
        for r in result.get("decode_model", []):
            cells = " | ".join(
                f"{_cell(r.get(v), 'eager_ms')} | {_cell(r.get(v), 'eager_speedup')}" for v in MODEL_VARIANTS[1:]
            )
            lines.append(f"| {r['context']} | {r['layers']} | {_cell(r.get('stock'), 'eager_ms')} | {cells} |")
    if result.get("decode_profile"):
        lines += ["", "## Decode step, one indexer, kernel by kernel (one eager step, device us)", ""]
        lines += ["| context | variant | kernels | total us | top kernels (us, count) |", "|---|---|---|---|---|"]
        for r in result["decode_profile"]:
            for v in PROFILE_VARIANTS:
                e = r.get(v) or {}
                top = "; ".join(f"`{k['name'][:60]}` {k['us']:.1f} x{k['count']}" for k in e.get("top", [])[:8])
                total = _cell(e, "total_us", ".1f")
                lines.append(f"| {r['context']} | {v} | {_fmt(e.get('kernels'))} | {total} | {top} |")
    errors = [
        f"- {part} {r.get('context')} {name}: {entry['error']}"
        for part in PARTS
        for r in result.get(part, [])
        for name, entry in r.items()
        if isinstance(entry, dict) and "error" in entry
    ]
    errors += [f"- {part}: {msg}" for part, msg in result.get("errors", {}).items()]
    if errors:
        lines += ["", "## Errors and skips", "", *errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    import transformers

    config = PRESETS[args.preset].config(1)
    if config.model_type not in idx.INDEXER_BY_MODEL_TYPE:
        print(f"{args.preset} has no indexer tilegemm patches", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    result: dict[str, Any] = {
        "preset": args.preset,
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "errors": {},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        print(f"--parts: unknown {unknown}, expected some of {list(PARTS)}", file=sys.stderr)
        return 2
    runs = {
        "prefill": lambda: prefill(config, args.contexts, args.reps, device),
        "decode_module": lambda: decode_module(config, args.decode_contexts, args.reps, device, args.decode_batches),
        "kernels": lambda: kernels(config, args.decode_contexts, args.kernel_rows, args.reps, device),
        "decode_model": lambda: decode_model(args.preset, args.layers, args.decode_contexts, args.reps, device),
        "decode_profile": lambda: decode_profile(config, args.decode_contexts, device),
    }
    parts = [(p, runs[p]) for p in PARTS if p in wanted and (p != "decode_model" or args.layers > 0)]
    for part, run in parts:
        try:
            result[part] = run()
        except Exception as exc:
            result["errors"][part] = f"{type(exc).__name__}: {exc}"[:500]
            traceback.print_exc()
        free(device)
        (out / "indexer_bench.json").write_text(json.dumps(result, indent=2))
        (out / "indexer_bench.md").write_text(markdown(result))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
