"""Where one decode step's time goes: stock vs tilegemm experts, on one device or sharded over ``torchrun`` ranks.

For a preset (random weights) at batch ``B`` after a ``P``-token prefill into a ``StaticCache``, for the stock model,
the model with tilegemm's experts only, and the model patched with tilegemm's defaults (experts and RMSNorm
modules), at one decode position:

* ``graph_step_ms``: one decode step replayed from a CUDA graph (the step of ``infer.py --cuda-graphs`` and
  ``dist_check.py --cuda-graphs``), mean of ``--replays``;
* ``no_experts_graph_step_ms``: the same with every experts module returning zeros; the difference,
  ``experts_ms``, is what the experts cost inside the real step (routing and attention unchanged);
* ``eager_step_ms``: the same step launched eagerly (the host launching every kernel);
* from one profiled eager step: the kernel count, their summed device time, the NCCL share, the top kernels.

A CUDA-graph step runs its kernels back to back, so ``kernels`` x a few microseconds is a floor under the step
that sharding does not lower: every rank launches the same kernels, on half the data, plus the all-reduces.

Run from the repository root (one device, or ``--mode tp|ep`` over the ``torchrun`` ranks)::

    python modeling/transformers/step_profile.py --model qwen3-30b-a3b --layers 48 --batch-size 32 --out s.json
    python -m torch.distributed.run --standalone --nproc-per-node 2 modeling/transformers/step_profile.py \\
        --mode tp --model qwen3-30b-a3b --layers 48 --batch-size 32 --out s_tp2.json

On the CPU only the eager step and the CPU-side profile run. Rank 0 prints a table and writes ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from modeling.transformers.build import build_model  # noqa: E402
from modeling.transformers.cli import positive_int  # noqa: E402
from modeling.transformers.dist_check import init_distributed  # noqa: E402
from modeling.transformers.measure import sync  # noqa: E402
from tilegemm.transformers import apply_tilegemm_to_model, presets, revert_tilegemm_model  # noqa: E402
from tilegemm.transformers.compat import cache_kwargs, rewind_static_cache  # noqa: E402
from tilegemm.transformers.monkey_patch import experts_modules  # noqa: E402
from tilegemm.transformers.norm import swapped_rms_norms  # noqa: E402
from tilegemm.transformers.parallel import PARALLEL_MODES  # noqa: E402

#: The rows: the stock model, tilegemm's experts alone (``norm=False``), and the default patch (experts and the
#: RMSNorm modules), each its ``apply_tilegemm_to_model`` keywords (``None``: stock).
IMPLS: dict[str, dict[str, bool] | None] = {"stock": None, "experts": {"norm": False}, "patched": {}}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="modeling/transformers/step_profile.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b", help="a preset name (see tilegemm.transformers.presets)")
    p.add_argument("--layers", type=positive_int, default=None, help="decoder layers of a realistic preset (default 4)")
    p.add_argument("--mode", choices=PARALLEL_MODES, default=None, help="shard over the torchrun ranks")
    p.add_argument("--fp8", action="store_true", help="patched: FP8 experts (weights cast once, 128x128 blocks)")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--prompt-tokens", type=positive_int, default=128)
    p.add_argument("--replays", type=positive_int, default=20, help="timed CUDA-graph replays per measurement")
    p.add_argument("--top", type=positive_int, default=15, help="kernels listed per row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON file (rank 0)")
    return p


class DecodeStep:
    """One greedy decode step at a fixed position of a ``StaticCache`` filled by a prefill of ``input_ids``."""

    def __init__(self, model, input_ids: torch.Tensor, slack: int = 64):
        from transformers import StaticCache

        batch, self.prompt = input_ids.shape
        device = input_ids.device
        self.model = model
        # the cache's own write counter advances on every step: ``slack`` steps between rewinds
        self.cache = StaticCache(config=model.config, max_cache_len=self.prompt + slack)
        positions = torch.arange(self.prompt, device=device)
        self.cache_kw = cache_kwargs(model, self.cache)
        model(input_ids=input_ids, **self.cache_kw, cache_position=positions, use_cache=True, logits_to_keep=1)
        self.token = torch.ones(batch, 1, dtype=torch.long, device=device)
        self.position = torch.tensor([self.prompt], device=device)

    def rewind(self) -> None:
        """Move the cache's write position back to the first decode position."""
        rewind_static_cache(self.cache, self.prompt)

    def __call__(self) -> torch.Tensor:
        out = self.model(input_ids=self.token, **self.cache_kw, cache_position=self.position, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _timed(run: Callable[[], Any], repeats: int, device: torch.device) -> float:
    _barrier()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    sync(device)
    return (time.perf_counter() - start) / repeats * 1e3


def graph_step_ms(step: DecodeStep, replays: int) -> float:
    """Mean milliseconds of ``step`` replayed from a CUDA graph (warm-up on a side stream, then one capture)."""
    device = step.token.device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    step.rewind()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    step.rewind()
    try:
        return _timed(graph.replay, replays, device)
    finally:
        step.rewind()
        del graph


def eager_step_ms(step: DecodeStep, repeats: int = 5) -> float:
    """Mean milliseconds of ``step`` launched eagerly (after one warm-up)."""
    step()
    step.rewind()
    try:
        return _timed(step, repeats, step.token.device)
    finally:
        step.rewind()


@contextlib.contextmanager
def experts_removed(model) -> Iterator[None]:
    """Every experts module returns zeros (the routing before it still runs): the step without the experts."""
    modules = experts_modules(model)
    own = [module.__dict__.get("forward") for module in modules]  # a forward set on the instance, if any
    for module in modules:
        module.forward = lambda hidden_states, *args, **kwargs: torch.zeros_like(hidden_states)
    try:
        yield
    finally:
        for module, forward in zip(modules, own):
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def kernel_profile(step: DecodeStep, top: int) -> dict[str, Any]:
    """The device kernels of one eager ``step`` under ``torch.profiler``: count, summed time, NCCL, top by time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if step.token.is_cuda else [])
    step.rewind()
    sync(step.token.device)
    with profile(activities=activities) as prof:
        step()
        sync(step.token.device)
    step.rewind()
    kernels = [(e.name, e.device_time / 1e3) for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU]
    by_name: dict[str, list[float]] = {}
    for name, ms in kernels:
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += ms
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "kernels": len(kernels),
        "kernel_ms": sum(ms for _, ms in kernels),
        "nccl_kernels": sum("nccl" in name.lower() for name, _ in kernels),
        "nccl_ms": sum(ms for name, ms in kernels if "nccl" in name.lower()),
        "top_kernels": [{"name": name, "count": int(c), "ms": ms} for name, (c, ms) in ranked],
    }


def _patch(model, impl: str, fp8: bool) -> None:
    """Make ``model`` row ``impl`` of :data:`IMPLS`: stock, or patched with that row's keywords."""
    revert_tilegemm_model(model)
    if IMPLS[impl] is not None:
        apply_tilegemm_to_model(model, fp8=fp8, **IMPLS[impl])


def profile_model(model, input_ids: torch.Tensor, args) -> list[dict[str, Any]]:
    """The rows of :func:`main` for one (possibly sharded) model, one per :data:`IMPLS` entry."""
    rows, steps = [], {}
    graphs = input_ids.is_cuda
    for impl in IMPLS:
        _patch(model, impl, args.fp8)
        step = steps[impl] = DecodeStep(model, input_ids)
        row: dict[str, Any] = {"impl": impl, "experts": model.config._experts_implementation}
        row["norms"] = len(swapped_rms_norms(model))
        if graphs:
            row["graph_step_ms"] = graph_step_ms(step, args.replays)
            with experts_removed(model):
                row["no_experts_graph_step_ms"] = graph_step_ms(step, args.replays)
            row["experts_ms"] = row["graph_step_ms"] - row["no_experts_graph_step_ms"]
        row["eager_step_ms"] = eager_step_ms(step)
        rows.append(row)
    # profiled last: no CUDA-graph capture after the profiler has run in this process
    for row, impl in zip(rows, IMPLS):
        _patch(model, impl, args.fp8)
        row.update(kernel_profile(steps[impl], args.top))
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """One line per row: step times, experts share, kernels."""

    def num(row: dict[str, Any], key: str) -> str:
        ranks = row.get(f"rank_{key}")
        if ranks and max(ranks) - min(ranks) >= 0.005:
            return f"{min(ranks):.2f}-{max(ranks):.2f}"
        return f"{row[key]:.2f}" if key in row else "-"

    lines = [
        f"# One decode step: {meta['model']} ({meta['layers']}L), batch {meta['batch']}, "
        f"{meta['prompt_tokens']}-token context, {meta['layout']}",
        "",
        "| impl | tilegemm norms | graph step ms | without experts ms | experts ms | eager step ms | kernels | "
        "kernel ms | NCCL ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['impl']} ({r['experts']}) | {r.get('norms', 0)} | {num(r, 'graph_step_ms')} | "
            f"{num(r, 'no_experts_graph_step_ms')} | {num(r, 'experts_ms')} | {num(r, 'eager_step_ms')} | "
            f"{r['kernels']} | {r['kernel_ms']:.2f} | {r['nccl_ms']:.2f} ({r['nccl_kernels']}) |"
        )
    lines += ["", f"{meta['device']} x{meta['world_size']}, torch {meta['torch']}, transformers "]
    lines[-1] += f"{meta['transformers']}, {meta['date']}; kernels from one profiled eager step (rank 0); a-b: the "
    lines[-1] += "ranks' range."
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    rank, world, device = init_distributed(device_type)
    if args.mode is None and world > 1:
        raise SystemExit("several ranks: name the layout with --mode tp|ep")
    (preset,) = presets.resolve(args.model)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layers = args.layers if args.layers is not None else (None if preset.tiny else 4)
    mode = args.mode if args.mode is not None and world > 1 else None
    model = build_model(preset, layers, dtype, device, args.seed, mode, world)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (args.batch_size, args.prompt_tokens), generator=gen)
    with torch.no_grad():
        rows = profile_model(model, ids.to(device), args)
    per_rank = [rows]
    if world > 1:
        per_rank = [None] * world
        dist.all_gather_object(per_rank, rows)
    for i, row in enumerate(rows):  # each rank's step: the slowest sets the pace of the collectives
        for key in ("graph_step_ms", "no_experts_graph_step_ms", "experts_ms", "eager_step_ms"):
            if key in row:
                row[f"rank_{key}"] = [r[i][key] for r in per_rank]
    import transformers

    meta = {
        "model": preset.name,
        "layers": model.config.num_hidden_layers,
        "batch": args.batch_size,
        "prompt_tokens": args.prompt_tokens,
        "layout": f"{args.mode}{world}" if args.mode and world > 1 else "1dev",
        "patched_fp8": args.fp8,
        "world_size": world,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
    }
    if rank == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(markdown(rows, meta), flush=True)
    if world > 1:
        _barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
