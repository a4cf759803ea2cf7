"""Distributed ``--compare``: stock vs tilegemm on one device and sharded over the ``torchrun`` ranks (any number).

Run with ``torchrun`` (or ``python -m torch.distributed.run``) from the repository root::

    python -m torch.distributed.run --standalone --nproc-per-node 4 modeling/transformers/dist_check.py \\
        --model qwen3-30b-a3b,deepseek-v3 --layers 4 --batch-size 1,32 --impls stock,patched,fp8 --out results/dist

For each preset (random weights, :func:`modeling.transformers.build.build_model`: identical in every process and
layout) and each ``--batch-size`` entry:

1. ``1dev``: every rank runs the whole model on its own device (rank 0 reports): each ``--impls`` row (``stock``:
   transformers' experts; ``patched``: tilegemm's defaults, BF16 experts and RMSNorm; ``fp8``: FP8 experts and
   RMSNorm; ``experts``: BF16 experts only); prefill and decode tokens/s. The stock greedy tokens, decoded by the
   same loop as every row (static cache and CUDA graph with ``--cuda-graphs``, else ``generate`` with a dynamic
   cache), are the reference sequence, and the stock teacher-forced logits on it the reference logits
   (``--reference-dir`` saves them, or loads them in a run with ``--skip-1dev``).
2. each ``--modes`` layout over all ranks (``tp``: ``DistributedConfig(tp_size=N)``; ``ep``:
   ``DistributedConfig(tp_size=N, ep_size=N)``), sharded by transformers' own plans: the same rows in the same loop.

Every row says whether its greedy tokens equal the one-device stock tokens, the teacher-forced ``calc_diff``,
max |dlogit| and top-1 agreement against the one-device stock logits, and ``calc_diff`` against the stock row of
its own layout. ``--step-times`` adds each rank's CUDA-graph decode step with and without the experts
(``step_profile.py``'s measurement): the per-rank step profile. A layout or FP8 copy that would not fit the
device's free memory is a row that says so. Rank 0 prints a table last and writes ``dist_check.json`` and
``dist_check.md`` under ``--out``. Without ``torchrun`` only the ``1dev`` rows run.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from modeling.transformers import measure  # noqa: E402
from modeling.transformers.build import build_model, free  # noqa: E402
from modeling.transformers.cli import positive_ints, progress_log  # noqa: E402
from tilegemm.backend.selector import BACKENDS, get_current_backend  # noqa: E402
from tilegemm.transformers import (  # noqa: E402
    apply_tilegemm_to_model,
    clear_fp8_cache,
    presets,
    revert_tilegemm_model,
)
from tilegemm.transformers.monkey_patch import experts_modules  # noqa: E402
from tilegemm.transformers.parallel import (  # noqa: E402
    PARALLEL_MODES,
    local_experts,
    parallel_unavailable_reason,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CALC_DIFF_TARGET = 1e-5
#: Row name -> ``apply_tilegemm_to_model`` keywords (``None``: the stock model).
IMPLS: dict[str, dict[str, bool] | None] = {
    "stock": None,
    "patched": {},
    "fp8": {"fp8": True},
    "experts": {"norm": False},
}
#: Device memory kept free beside a model (activations, cache, CUDA graphs, NCCL buffers), bytes.
MEMORY_MARGIN = 6 << 30


log = progress_log("dist_check")
"""Progress line on stderr (rank 0 only under torchrun)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="modeling/transformers/dist_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="qwen3-30b-a3b,deepseek-v3",
        help="comma-separated presets (or 'tiny'), each optionally NAME:LAYERS (e.g. qwen3-30b-a3b:48,deepseek-v3:5)",
    )
    p.add_argument("--layers", type=int, default=None, help="decoder layers of realistic presets (default 4)")
    p.add_argument("--modes", default=",".join(PARALLEL_MODES), help=f"sharded layouts, of {PARALLEL_MODES}")
    p.add_argument("--impls", default="stock,patched", help=f"rows per layout, of {list(IMPLS)} (stock first)")
    p.add_argument("--ep-implementation", default="auto", help="transformers' EP token path (auto, all_to_all, ...)")
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto", help="tilegemm backend of the patch")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--batch-size", type=positive_ints, default=[1], help="comma-separated batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default: 16 (tiny), 512 (realistic)")
    p.add_argument("--new-tokens", type=int, default=None, help="default: 8 (tiny), 32 (realistic)")
    p.add_argument("--repeats", type=int, default=3, help="timed prefill repetitions (median)")
    p.add_argument("--cuda-graphs", action="store_true", help="both: static cache + CUDA-graph decode loop")
    p.add_argument("--step-times", action="store_true", help="each rank's graph decode step, with/without experts")
    p.add_argument("--skip-1dev", action="store_true", help="no one-device rows (reference from --reference-dir)")
    p.add_argument("--reference-dir", default=None, help="where the one-device stock reference is saved / loaded")
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


def _decode(model, ids: torch.Tensor, args) -> measure.DecodeResult:
    if args.cuda_graphs:
        graphs = ids.device.type == "cuda"
        measure.static_greedy(model, ids, min(args.new_tokens, 3), cuda_graph=graphs)
        return measure.static_greedy(model, ids, args.new_tokens, cuda_graph=graphs)
    measure.generate_greedy(model, ids, min(args.new_tokens, 2))
    return measure.generate_greedy(model, ids, args.new_tokens)


def _gather(value: Any) -> list[Any]:
    """``value`` of every rank (rank order); ``[value]`` without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _agreed(reason: str | None) -> str | None:
    """The first rank's reason to skip, if any rank has one: every rank skips or none (the rows hold collectives)."""
    return next((r for r in _gather(reason) if r is not None), None)


def _step_times(model, ids: torch.Tensor, args) -> dict[str, Any]:
    """Each rank's CUDA-graph decode step with and without the experts, after a prefill of ``ids`` (ms)."""
    from modeling.transformers.step_profile import DecodeStep, experts_removed, graph_step_ms

    step = DecodeStep(model, ids)
    full = graph_step_ms(step, args.replays)
    with experts_removed(model):
        rest = graph_step_ms(step, args.replays)
    del step
    ranks = _gather((full, rest))
    return {
        "rank_graph_step_ms": [r[0] for r in ranks],
        "rank_no_experts_step_ms": [r[1] for r in ranks],
        "graph_step_ms": max(r[0] for r in ranks),
        "no_experts_step_ms": max(r[1] for r in ranks),
    }


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
    if args.step_times and ids.is_cuda:
        out.update(_step_times(model, ids, args))
    return out


def _agreement(result: dict[str, Any], ref: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    tokens = result.pop("tokens")
    logits = result.get("logits")
    if ref is None or logits is None:
        return {"tokens_identical": None}
    return {
        "tokens_identical": bool(torch.equal(tokens.cpu(), ref["tokens"].cpu())),
        **measure.greedy_agreement(tokens.cpu(), ref["tokens"].cpu()),
        **measure.compare_logits(logits, ref["logits"].to(logits.device)),
    }


def _free_bytes(device: torch.device) -> int | None:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def _fp8_fit_problem(model, device: torch.device) -> str | None:
    """Why the FP8 copies of the experts (half the bf16 bytes) would not fit beside the model, or ``None``."""
    from torch.distributed.tensor import DTensor

    free_bytes = _free_bytes(device)
    if free_bytes is None:
        return None
    need = 0
    for module in experts_modules(model):
        for name in ("gate_up_proj", "up_proj", "down_proj"):
            w = getattr(module, name, None)
            if isinstance(w, torch.Tensor):
                w = w.to_local() if isinstance(w, DTensor) else w
                need += w.numel() * 1.02  # e4m3 bytes and the fp32 block scales
    if need + MEMORY_MARGIN > free_bytes:
        return f"FP8 expert copies need {need / 2**30:.1f} GiB, {free_bytes / 2**30:.1f} GiB free"
    return None


def _layout_rows(model, name: str, layout: str, batches: dict[int, dict[str, Any]], args) -> list[dict[str, Any]]:
    """One row per (impl, batch) of one layout, compared with ``batches[b]["ref"]`` (one-device stock) and with this
    layout's own stock row."""
    rows = []
    backend = None if args.backend == "auto" else args.backend
    stock_logits: dict[int, torch.Tensor] = {}
    for impl in args.impl_list:
        revert_tilegemm_model(model)
        base = {"model": name, "layout": layout, "impl": impl}
        problem = _agreed(_fp8_fit_problem(model, batches_device(batches))) if impl == "fp8" else None
        if problem is not None:
            log(f"{name} {layout}: {impl} skipped ({problem})")
            rows += [{**base, "batch": b, "skipped": problem} for b in batches]
            continue
        if IMPLS[impl] is not None:
            apply_tilegemm_to_model(model, backend=backend, **IMPLS[impl])
        for batch, data in batches.items():
            log(f"{name} {layout} batch {batch}: {impl} (experts {model.config._experts_implementation})")
            row = {**base, "batch": batch, "experts": model.config._experts_implementation}
            try:
                result = _measure(model, data["ids"], data["sequence"], args)
            except Exception as exc:  # one failing row (an op, a capture) must not lose the others
                log(f"{name} {layout} batch {batch}: {impl} failed: {exc!r}"[:400])
                rows.append({**row, "error": repr(exc)[:400]})
                continue
            row.update(_agreement(result, data["ref"]))
            logits = result.pop("logits", None)
            if impl == "stock" and logits is not None:
                stock_logits[batch] = logits
            elif logits is not None and batch in stock_logits:
                row["vs_layout_stock_calc_diff"] = measure.compare_logits(logits, stock_logits[batch])["calc_diff"]
            row.update(result, local_experts=local_experts(experts_modules(model)[0]))
            rows.append(row)
        if impl == "fp8":
            clear_fp8_cache(model)
    revert_tilegemm_model(model)
    return rows


def batches_device(batches: dict[int, dict[str, Any]]) -> torch.device:
    """The device of the batches' inputs."""
    return next(iter(batches.values()))["ids"].device


def _reference_path(args, preset: presets.Preset, layers: int, batch: int, dtype: torch.dtype) -> Path | None:
    if args.reference_dir is None:
        return None
    key = f"{preset.name}_{layers}L_b{batch}_p{args.prompt_tokens}_n{args.new_tokens}_{str(dtype)[6:]}_s{args.seed}"
    return Path(args.reference_dir) / f"{key}_{'graph' if args.cuda_graphs else 'dyn'}.pt"


@functools.cache
def _param_bytes(name: str, layers: int | None, dtype: torch.dtype) -> tuple[int, int]:
    """``(expert bytes, other bytes)`` of preset ``name``'s parameters (counted on a ``meta`` model)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(presets.PRESETS[name].config(layers), dtype=dtype)
    experts = {id(p) for m in experts_modules(model) for p in m.parameters()}
    sizes = [(id(p) in experts, p.numel() * p.element_size()) for p in model.parameters()]
    return sum(n for e, n in sizes if e), sum(n for e, n in sizes if not e)


def _model_bytes(preset: presets.Preset, layers: int | None, dtype: torch.dtype, world: int, mode: str | None) -> int:
    """Parameter bytes one rank holds (the experts split over ``world`` ranks, the rest whole: an upper bound)."""
    experts, rest = _param_bytes(preset.name, layers, dtype)
    return rest + experts // (world if mode is not None else 1)


def _fit_problem(preset, layers, dtype, world, mode, device) -> str | None:
    free_bytes = _free_bytes(device)
    if free_bytes is None:
        return None
    need = _model_bytes(preset, layers, dtype, world, mode)
    if need + MEMORY_MARGIN > free_bytes:
        return f"needs ~{need / 2**30:.0f} GiB per device, {free_bytes / 2**30:.0f} GiB free"
    return None


def parse_models(text: str, layers: int | None) -> list[tuple[presets.Preset, int | None]]:
    """``(preset, decoder layers)`` of each comma-separated ``NAME`` or ``NAME:LAYERS`` (``layers`` by default;
    ``None``: the harness default, 4 for a realistic preset and the preset's own count for a tiny one)."""
    out = []
    for item in (v for v in text.split(",") if v):
        name, _, count = item.partition(":")
        for preset in presets.resolve(name):
            chosen = int(count) if count else layers
            out.append((preset, chosen if chosen is not None else (None if preset.tiny else 4)))
    return out


def run_preset(
    preset: presets.Preset, layers: int | None, args, world: int, device: torch.device, dtype: torch.dtype
) -> list[dict]:
    """Every row of one preset with ``layers`` decoder layers: ``1dev`` rows, then each sharded layout."""
    args = argparse.Namespace(**vars(args))
    config = preset.config(layers)
    tiny = config.hidden_size <= 256
    args.prompt_tokens = args.prompt_tokens or (16 if tiny else 512)
    args.new_tokens = args.new_tokens or (8 if tiny else 32)
    layers = config.num_hidden_layers
    meta = {"layers": layers, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens}
    batches: dict[int, dict[str, Any]] = {}
    for batch in args.batch_size:
        gen = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, config.vocab_size, (batch, args.prompt_tokens), generator=gen).to(device)
        batches[batch] = {"ids": ids, "sequence": None, "ref": None}
    rows: list[dict[str, Any]] = []

    if not args.skip_1dev:
        problem = _agreed(_fit_problem(preset, layers, dtype, 1, None, device))
        if problem is not None:
            log(f"{preset.name} 1dev: skipped ({problem})")
            rows.append({"model": preset.name, "layout": "1dev", "impl": "-", "skipped": problem})
        else:
            model = build_model(preset, layers, dtype, device, args.seed)
            for batch, data in batches.items():
                log(f"{preset.name} batch {batch}: reference = one-device stock greedy tokens, teacher-forced logits")
                tokens = _decode(model, data["ids"], args).tokens
                data["sequence"] = torch.cat([data["ids"], tokens], dim=1)
                logits = measure.teacher_forced_logits(model, data["sequence"], args.new_tokens)
                data["ref"] = {"tokens": tokens.cpu(), "logits": logits.cpu()}
                path = _reference_path(args, preset, layers, batch, dtype)
                if path is not None and int(os.environ.get("RANK", "0")) == 0:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(data["ref"], path)
            rows += _layout_rows(model, preset.name, "1dev", batches, args)
            del model
            free(device)
    else:
        for batch, data in batches.items():
            path = _reference_path(args, preset, layers, batch, dtype)
            if path is not None and path.exists():
                data["ref"] = torch.load(path)
                data["sequence"] = torch.cat([data["ids"], data["ref"]["tokens"].to(device)], dim=1)
            else:
                log(f"{preset.name} batch {batch}: no one-device reference ({path}); agreement vs layout stock only")

    for batch, data in batches.items():
        if data["sequence"] is None:  # no reference: teacher-force the prompt's own continuation of zeros
            pad = torch.zeros(batch, args.new_tokens, dtype=torch.long, device=device)
            data["sequence"] = torch.cat([data["ids"], pad], dim=1)

    for mode in args.mode_list if world > 1 else []:
        layout = f"{mode}{world}"
        reason = _agreed(
            parallel_unavailable_reason(preset.config(1), mode, world)
            or _fit_problem(preset, layers, dtype, world, mode, device)
        )
        if reason is not None:
            log(f"{preset.name} {layout}: skipped ({reason})")
            rows.append({"model": preset.name, "layout": layout, "impl": "-", "skipped": reason})
            continue
        model = build_model(preset, layers, dtype, device, args.seed, mode, world, args.ep_implementation)
        rows += _layout_rows(model, preset.name, layout, batches, args)
        del model
        free(device)
    for row in rows:
        for key, value in meta.items():
            row.setdefault(key, value)
    return rows


def _num(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def _steps(r: dict[str, Any]) -> str:
    if "rank_graph_step_ms" not in r:
        return "-"
    full, rest = r["rank_graph_step_ms"], r["rank_no_experts_step_ms"]
    span = lambda v: f"{min(v):.2f}" if max(v) - min(v) < 0.005 else f"{min(v):.2f}-{max(v):.2f}"  # noqa: E731
    return f"{span(full)} / {span(rest)}"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The result table: one row per (model, batch, layout, impl), agreement against one-device stock."""
    lines = [
        "# Distributed MoE inference: stock vs tilegemm, one device vs sharded",
        "",
        "| model | batch | layout | impl | local experts | prefill tok/s | decode tok/s | x stock "
        "| tokens = 1dev stock | calc_diff | max abs dlogit | top1 | vs layout stock | step ms / w/o experts (ranks) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    stock = {(r["model"], r.get("batch"), r["layout"]): r for r in rows if r["impl"] == "stock" and "error" not in r}
    for r in rows:
        head = f"| {r['model']} ({r.get('layers', '-')}L) | {r.get('batch', '-')} | {r['layout']} | {r['impl']} |"
        if "skipped" in r or "error" in r:
            lines.append(f"{head} {'skipped' if 'skipped' in r else 'error'}: {r.get('skipped') or r['error']} "
                         "| | | | | | | | | |")  # fmt: skip
            continue
        local = r.get("local_experts") or {}
        ref = stock.get((r["model"], r["batch"], r["layout"]))
        ratio = r["decode_tok_s"] / ref["decode_tok_s"] if ref and ref.get("decode_tok_s") else None
        same = r["tokens_identical"]
        tokens = "-" if same is None else f"{'yes' if same else 'NO'} ({_num(r.get('token_agreement'), '.3f')})"
        lines.append(
            f"{head} {local.get('num_experts', '-')} | {_num(r['prefill_tok_s'], ',.0f')} | "
            f"{_num(r['decode_tok_s'], ',.1f')} | {_num(ratio, '.2f')} | {tokens} | {_num(r.get('calc_diff'), '.1e')} "
            f"| {_num(r.get('max_logit_diff'), '.2e')} | {_num(r.get('top1_agreement'), '.3f')} | "
            f"{_num(r.get('vs_layout_stock_calc_diff'), '.1e')} | {_steps(r)} |"
        )
    lines += [
        "",
        f"{meta['device']} x{meta['world_size']}, dtype {meta['dtype']}, tilegemm backend {meta['backend']}, "
        f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}, decode loop "
        f"{'static cache + CUDA graph' if meta['cuda_graphs'] else 'generate (dynamic cache)'}. Layouts: 1dev = the "
        "whole model on one device; tpN = DistributedConfig(tp_size=N) (experts cut along the intermediate "
        "dimension up to transformers 5.24, whole on every rank from 5.25); epN = DistributedConfig(tp_size=N, "
        f"ep_size=N, ep_implementation={meta['ep_implementation']!r}) "
        "(experts split by expert). impl: stock = transformers' experts; patched = tilegemm BF16 experts + RMSNorm; "
        "fp8 = tilegemm FP8 experts + RMSNorm; experts = tilegemm BF16 experts only. All rows of a layout share the "
        "model and the decode loop. Agreement is against the one-device stock run: greedy tokens (identical?) and "
        "teacher-forced logits of its tokens; 'vs layout stock' = calc_diff against the stock row of the same "
        "layout. Step ms: each rank's CUDA-graph decode step and the same step with the experts returning zeros.",
    ]
    return "\n".join(lines) + "\n"


def _write(rows: list[dict[str, Any]], meta: dict[str, Any], out: str, final: bool) -> None:
    """``dist_check.json`` and ``dist_check.md`` under ``out``; the table printed when ``final``."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "dist_check.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2, default=str)
    text = markdown(rows, meta)
    with open(os.path.join(out, "dist_check.md"), "w") as f:
        f.write(text)
    if final:
        print(text, flush=True)
        log(f"wrote {out}/dist_check.json and dist_check.md")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    args.replays = 20
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rank, world, device = init_distributed(device_type)
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    args.mode_list = [m for m in args.modes.split(",") if m]
    args.impl_list = [i for i in args.impls.split(",") if i]
    if unknown := set(args.mode_list) - set(PARALLEL_MODES):
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; choose from {PARALLEL_MODES}")
    if unknown := set(args.impl_list) - set(IMPLS):
        raise SystemExit(f"--impls: unknown {sorted(unknown)}; choose from {list(IMPLS)}")
    args.impl_list = ["stock", *[i for i in args.impl_list if i != "stock"]]  # stock first: the layout's baseline
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
    rows: list[dict[str, Any]] = []
    models = parse_models(args.model, args.layers)
    with torch.no_grad():
        for i, (preset, layers) in enumerate(models):
            rows += run_preset(preset, layers, args, world, device, dtype)
            if rank == 0:  # after every preset: a run stopped later keeps what it measured
                _write(rows, meta, args.out, final=i == len(models) - 1)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
