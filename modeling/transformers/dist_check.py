"""Distributed ``--compare``: stock vs tilegemm experts on one device and sharded over the ``torchrun`` ranks.

Run with ``torchrun`` (or ``python -m torch.distributed.run``) from the repository root::

    python -m torch.distributed.run --standalone --nproc-per-node 2 modeling/transformers/dist_check.py \\
        --model qwen3-30b-a3b,deepseek-v3 --layers 4 --out results/dist

For each preset (random weights, built identically in every process from ``--seed``):

1. ``1dev``: every rank runs the whole model on its own device (rank 0 reports): stock (transformers' experts),
   then patched with tilegemm; prefill and decode tokens/s. The stock greedy tokens, decoded by the same loop as
   every row (static cache and CUDA graph with ``--cuda-graphs``, else ``generate`` with a dynamic cache), are the
   reference sequence, and the stock teacher-forced logits on it the reference logits.
2. each ``--modes`` layout over all ranks (``tp``: ``DistributedConfig(tp_size=N)``; ``ep``:
   ``DistributedConfig(tp_size=N, ep_size=N)``), sharded by transformers' own plans
   (:func:`tilegemm.transformers.parallel.distribute_model`): stock, then patched, in the same decode loop.

Every row says whether its greedy tokens equal the one-device stock tokens, and the teacher-forced ``calc_diff``,
max |dlogit| and top-1 agreement against the one-device stock logits. Rank 0 prints a table and writes
``dist_check.json`` and ``dist_check.md`` under ``--out``. Without ``torchrun`` only the ``1dev`` rows run.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from modeling.transformers import measure  # noqa: E402
from tilegemm.backend.selector import BACKENDS, get_current_backend  # noqa: E402
from tilegemm.transformers import apply_tilegemm_to_model, presets, revert_tilegemm_model  # noqa: E402
from tilegemm.transformers.monkey_patch import experts_modules  # noqa: E402
from tilegemm.transformers.parallel import (  # noqa: E402
    PARALLEL_MODES,
    distribute_model,
    local_experts,
    parallel_unavailable_reason,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CALC_DIFF_TARGET = 1e-5


def log(message: str) -> None:
    """Progress line on stderr (rank 0 only)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[dist_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="modeling/transformers/dist_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b,deepseek-v3", help="comma-separated presets (or 'tiny')")
    p.add_argument("--layers", type=int, default=None, help="decoder layers of realistic presets (default 4)")
    p.add_argument("--modes", default=",".join(PARALLEL_MODES), help=f"sharded layouts, of {PARALLEL_MODES}")
    p.add_argument("--ep-implementation", default="auto", help="transformers' EP token path (auto, all_to_all, ...)")
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto", help="tilegemm backend of the patch")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=None, help="default: 16 (tiny), 512 (realistic)")
    p.add_argument("--new-tokens", type=int, default=None, help="default: 8 (tiny), 32 (realistic)")
    p.add_argument("--repeats", type=int, default=3, help="timed prefill repetitions (median)")
    p.add_argument("--cuda-graphs", action="store_true", help="both: static cache + CUDA-graph decode loop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory for dist_check.json and dist_check.md")
    return p


def init_distributed(device_type: str) -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)`` from the ``torchrun`` environment; the process group when ``world_size > 1``."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return rank, world, device


def _build(preset: presets.Preset, args, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    layers = args.layers if args.layers is not None else (None if preset.tiny else 4)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(preset.config(layers), dtype=dtype)
    return model.eval()


def _decode(model, ids: torch.Tensor, args) -> measure.DecodeResult:
    if args.cuda_graphs:
        graphs = ids.device.type == "cuda"
        measure.static_greedy(model, ids, min(args.new_tokens, 3), cuda_graph=graphs)
        return measure.static_greedy(model, ids, args.new_tokens, cuda_graph=graphs)
    measure.generate_greedy(model, ids, min(args.new_tokens, 2))
    return measure.generate_greedy(model, ids, args.new_tokens)


def _measure(model, ids: torch.Tensor, sequence: torch.Tensor | None, args) -> dict[str, Any]:
    """Prefill and decode tokens/s, greedy tokens and (with ``sequence``) teacher-forced logits of one model."""
    prefill = measure.time_prefill(model, ids, repeats=args.repeats)
    decoded = _decode(model, ids, args)
    out = {
        "prefill_tok_s": ids.numel() / prefill,
        "decode_tok_s": decoded.tokens_per_second(),
        "decode_mode": ("static+cuda_graph" if ids.device.type == "cuda" else "static")
        if args.cuda_graphs
        else "dynamic",
        "tokens": decoded.tokens,
    }
    if decoded.note:
        out["decode_note"] = decoded.note
        out["decode_mode"] = "static"
    if sequence is not None:
        out["logits"] = measure.teacher_forced_logits(model, sequence, args.new_tokens)
    return out


def _agreement(result: dict[str, Any], ref_tokens: torch.Tensor, ref_logits: torch.Tensor) -> dict[str, Any]:
    tokens = result.pop("tokens")
    logits = result.pop("logits")
    return {
        "tokens_identical": bool(torch.equal(tokens.cpu(), ref_tokens.cpu())),
        **measure.greedy_agreement(tokens.cpu(), ref_tokens.cpu()),
        **measure.compare_logits(logits, ref_logits),
    }


def _layout_rows(model, name: str, layout: str, ids, sequence, ref, args) -> list[dict[str, Any]]:
    """Stock then patched rows of one layout, compared with ``ref`` (the one-device stock tokens and logits)."""
    rows = []
    backend = None if args.backend == "auto" else args.backend
    for impl in ("stock", "patched"):
        if impl == "patched":
            apply_tilegemm_to_model(model, backend=backend)
        log(f"{name} {layout}: {impl} (experts {model.config._experts_implementation})")
        result = _measure(model, ids, sequence, args)
        row = {"model": name, "layout": layout, "impl": impl, "experts": model.config._experts_implementation}
        row.update(_agreement(result, ref["tokens"], ref["logits"]))
        row.update(result, local_experts=local_experts(experts_modules(model)[0]))
        rows.append(row)
    revert_tilegemm_model(model)
    return rows


def run_preset(preset: presets.Preset, args, world: int, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Every row of one preset: ``1dev`` stock / patched, then each sharded layout."""
    model = _build(preset, args, device, dtype)
    tiny = model.config.hidden_size <= 256
    args = argparse.Namespace(**vars(args))
    args.prompt_tokens = args.prompt_tokens or (16 if tiny else 512)
    args.new_tokens = args.new_tokens or (8 if tiny else 32)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (args.batch_size, args.prompt_tokens), generator=gen).to(device)
    meta = {"layers": model.config.num_hidden_layers, "batch": args.batch_size, "prompt_tokens": args.prompt_tokens}
    meta["new_tokens"] = args.new_tokens

    log(f"{preset.name}: reference = one-device stock greedy tokens (the rows' decode loop), teacher-forced logits")
    tokens = _decode(model, ids, args).tokens
    sequence = torch.cat([ids, tokens], dim=1)
    ref = {"tokens": tokens, "logits": measure.teacher_forced_logits(model, sequence, args.new_tokens)}
    rows = _layout_rows(model, preset.name, "1dev", ids, sequence, ref, args)
    del model
    _empty_cache(device)

    for mode in args.mode_list if world > 1 else []:
        layout = f"{mode}{world}"
        reason = parallel_unavailable_reason(preset.config(1), mode, world)
        if reason is not None:
            log(f"{preset.name} {layout}: skipped ({reason})")
            rows.append({"model": preset.name, "layout": layout, "impl": "-", "skipped": reason})
            continue
        model = distribute_model(_build(preset, args, device, dtype), mode, world, args.ep_implementation)
        rows += _layout_rows(model, preset.name, layout, ids, sequence, ref, args)
        del model
        _empty_cache(device)
    for row in rows:
        row.update(meta)
    return rows


def _empty_cache(device: torch.device) -> None:
    gc.collect()  # a sharded model's hooks hold reference cycles: without this its memory outlives ``del``
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _num(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The result table: one row per (model, layout, experts), agreement against one-device stock."""
    lines = [
        "# Distributed MoE inference: stock vs tilegemm experts, one device vs sharded",
        "",
        "| model | layout | experts | local experts | prefill tok/s | decode tok/s | tokens = 1dev stock "
        "| calc_diff | max abs dlogit | top1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['layout']} | skipped: {r['skipped']} | | | | | | | |")
            continue
        local = r.get("local_experts") or {}
        lines.append(
            f"| {r['model']} ({r['layers']}L) | {r['layout']} | {r['impl']} ({r['experts']}) | "
            f"{local.get('num_experts', '-')} | {_num(r['prefill_tok_s'], ',.0f')} | "
            f"{_num(r['decode_tok_s'], ',.1f')} {r['decode_mode']} | {'yes' if r['tokens_identical'] else 'NO'} "
            f"({_num(r['token_agreement'], '.3f')}) | {_num(r['calc_diff'], '.1e')} | "
            f"{_num(r['max_logit_diff'], '.2e')} | {_num(r['top1_agreement'], '.3f')} |"
        )
    lines += [
        "",
        f"{meta['device']} x{meta['world_size']}, dtype {meta['dtype']}, tilegemm backend {meta['backend']}, "
        f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}. Layouts: 1dev = the whole "
        "model on one device; tpN = DistributedConfig(tp_size=N) (experts cut along the intermediate dimension); "
        f"epN = DistributedConfig(tp_size=N, ep_size=N, ep_implementation={meta['ep_implementation']!r}) "
        "(experts split by expert). Stock and patched share the model and the decode loop. Agreement is against "
        f"the one-device stock run: greedy tokens (identical?) and teacher-forced logits of its tokens "
        f"(target: tokens identical or calc_diff < {CALC_DIFF_TARGET:g}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rank, world, device = init_distributed(device_type)
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    args.mode_list = [m for m in args.modes.split(",") if m]
    if unknown := set(args.mode_list) - set(PARALLEL_MODES):
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; choose from {PARALLEL_MODES}")
    chosen = [p for name in args.model.split(",") if name for p in presets.resolve(name)]
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for preset in chosen:
            rows += run_preset(preset, args, world, device, dtype)
    import transformers

    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": world,
        "dtype": str(dtype).removeprefix("torch."),
        "backend": args.backend if args.backend != "auto" else get_current_backend(),
        "ep_implementation": args.ep_implementation,
        "cuda_graphs": args.cuda_graphs,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
    }
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "dist_check.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2, default=str)
        text = markdown(rows, meta)
        with open(os.path.join(args.out, "dist_check.md"), "w") as f:
            f.write(text)
        print(text, flush=True)
        log(f"wrote {args.out}/dist_check.json and dist_check.md")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
