"""Sharded vs one-device logits with the routing flips that explain them (run under ``torchrun``, any world size).

For a preset (random weights, :func:`modeling.transformers.build.build_model`, identical on every rank), each
``--dtypes`` entry and each ``--batch-size`` entry, over one random ``[B, prompt + new]`` sequence:

* reference: the whole model on this rank's device, stock: teacher-forced logits of the last ``--new-tokens``
  positions, the top-k expert ids of every MoE layer (router hooks, :mod:`modeling.transformers.routes`) and
  ``--decode-tokens`` greedy tokens (``generate``, dynamic cache) from the prompt;
* rows ``1dev`` (stock again: the device's own run-to-run difference; patched), then ``tpN`` and ``epN`` over the
  ``N`` ranks (stock, patched), each compared with the reference: ``calc_diff``, max |dlogit|, top-1 agreement,
  greedy tokens identical, and the routing flips with the logits grouped by them (:func:`routes.flip_report`).

In fp32 a sharding defect shows as a difference far above fp32 rounding (``calc_diff`` >> 1e-10) on positions
downstream of no flip; in bf16 rounding amplified by routing shows as small differences downstream of no flip and
large ones downstream of flips. Rank 0 prints the table last and writes ``route_check.json`` / ``.md`` under
``--out``::

    python -m torch.distributed.run --standalone --nproc-per-node 4 modeling/transformers/route_check.py \\
        --model deepseek-v3 --layers 4 --dtypes fp32 --batch-size 32 --out $OUT/routes
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from modeling.transformers import measure  # noqa: E402
from modeling.transformers.build import build_model, free  # noqa: E402
from modeling.transformers.cli import positive_ints, progress_log  # noqa: E402
from modeling.transformers.routes import RouteRecorder, flip_report  # noqa: E402
from tilegemm.transformers import apply_tilegemm_to_model, presets, revert_tilegemm_model  # noqa: E402
from tilegemm.transformers.parallel import PARALLEL_MODES, parallel_unavailable_reason  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


log = progress_log("route_check")
"""Progress line on stderr (rank 0 only under torchrun)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="modeling/transformers/route_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v3", help="a preset name")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: 4 realistic, preset's tiny)")
    p.add_argument("--dtypes", default="fp32", help=f"comma-separated, of {sorted(DTYPES)}")
    p.add_argument("--batch-size", type=positive_ints, default=[32], help="comma-separated batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=8, help="teacher-forced logit positions compared (the last)")
    p.add_argument("--decode-tokens", type=int, default=4, help="greedy tokens compared (0: none)")
    p.add_argument("--modes", default=",".join(PARALLEL_MODES), help=f"sharded layouts, of {PARALLEL_MODES}")
    p.add_argument("--impls", default="stock,patched", help="stock, patched (tilegemm defaults), fp8")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory for route_check.json and route_check.md")
    return p


#: Row name -> ``apply_tilegemm_to_model`` keywords (``None``: stock).
IMPLS: dict[str, dict[str, bool] | None] = {"stock": None, "patched": {}, "fp8": {"fp8": True}}


def _set_impl(model, impl: str) -> None:
    revert_tilegemm_model(model)
    if IMPLS[impl] is not None:
        apply_tilegemm_to_model(model, **IMPLS[impl])


def _observe(model, recorder: RouteRecorder, sequence: torch.Tensor, ids: torch.Tensor, args) -> dict[str, Any]:
    recorder.reset()
    logits = measure.teacher_forced_logits(model, sequence, args.new_tokens).cpu()
    routes = recorder.take()
    tokens = measure.generate_greedy(model, ids, args.decode_tokens).tokens.cpu() if args.decode_tokens else None
    recorder.reset()
    return {"logits": logits, "routes": routes, "tokens": tokens}


def _row(base: dict[str, Any], seen: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    row = dict(base, **measure.compare_logits(seen["logits"], ref["logits"]))
    if seen["tokens"] is not None:
        row["tokens_identical"] = bool(torch.equal(seen["tokens"], ref["tokens"]))
        row.update(measure.greedy_agreement(seen["tokens"], ref["tokens"]))
    row["routing"] = flip_report(ref["routes"], seen["routes"], ref["logits"], seen["logits"])
    return row


def _inputs(vocab: int, batch: int, args, device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(args.seed + batch)
    sequence = torch.randint(0, vocab, (batch, args.prompt_tokens + args.new_tokens), generator=gen).to(device)
    return sequence, sequence[:, : args.prompt_tokens]


def _rows_of(model, layout: str, dtype_name: str, refs: dict[int, dict], args, device) -> list[dict[str, Any]]:
    recorder = RouteRecorder(model)
    rows = []
    try:
        for impl in args.impl_list:
            try:
                _set_impl(model, impl)
            except Exception as exc:  # an impl the model cannot take (e.g. FP8 on this layout): a row says why
                rows.append({"layout": layout, "impl": impl, "dtype": dtype_name, "error": repr(exc)[:300]})
                continue
            for batch, ref in refs.items():
                sequence, ids = _inputs(model.config.vocab_size, batch, args, device)
                log(f"{dtype_name} batch {batch} {layout} {impl}")
                base = {"layout": layout, "impl": impl, "dtype": dtype_name, "batch": batch}
                try:
                    rows.append(_row(base, _observe(model, recorder, sequence, ids, args), ref))
                except Exception as exc:
                    rows.append({**base, "error": repr(exc)[:300]})
    finally:
        recorder.remove()
        revert_tilegemm_model(model)
    return rows


def run(args, world: int, device: torch.device) -> list[dict[str, Any]]:
    """Every row (module docstring) of this rank."""
    (preset,) = presets.resolve(args.model)
    layers = args.layers if args.layers is not None else (None if preset.tiny else 4)
    rows: list[dict[str, Any]] = []
    for dtype_name in args.dtype_list:
        dtype = DTYPES[dtype_name]
        model = build_model(preset, layers, dtype, device, args.seed)
        recorder = RouteRecorder(model)
        refs = {}
        for batch in args.batch_size:
            sequence, ids = _inputs(model.config.vocab_size, batch, args, device)
            log(f"{dtype_name} batch {batch}: reference (one device, stock)")
            refs[batch] = _observe(model, recorder, sequence, ids, args)
        recorder.remove()
        one_device = argparse.Namespace(**vars(args))
        one_device.impl_list = ["stock", *[i for i in args.impl_list if i != "stock"]]  # stock: run-to-run
        rows += _rows_of(model, "1dev", dtype_name, refs, one_device, device)
        del model, recorder
        free(device)
        for mode in args.mode_list if world > 1 else []:
            layout = f"{mode}{world}"
            reason = parallel_unavailable_reason(preset.config(1), mode, world)
            if reason is not None:
                rows.append({"layout": layout, "impl": "-", "dtype": dtype_name, "skipped": reason})
                continue
            model = build_model(preset, layers, dtype, device, args.seed, mode=mode, world_size=world)
            rows += _rows_of(model, layout, dtype_name, refs, args, device)
            del model
            free(device)
    for row in rows:
        row.update(model=preset.name, layers=layers or preset.config().num_hidden_layers)
    return rows


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _group(g: dict[str, Any]) -> str:
    if not g or not g.get("positions"):
        return "0"
    return f"{g['positions']}: {g['calc_diff']:.1e} / {g['max_logit_diff']:.2g}"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The table: agreement with the one-device stock reference and the routing flips behind it."""
    lines = [
        f"# Sharded vs one-device logits and routing flips: {meta['model']} ({meta['layers']}L)",
        "",
        "| dtype | batch | layout | impl | calc_diff | max abs dlogit | top1 | tokens = ref | flipped tokens | "
        "flips per MoE layer | no flip upstream: n: calc_diff / max | flip upstream: n: calc_diff / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append(f"| {r['dtype']} | {r.get('batch', '-')} | {r['layout']} | {r['impl']} | "
                         f"{r.get('skipped') or r.get('error')} | | | | | | | |")  # fmt: skip
            continue
        rt = r["routing"]
        tokens = "-" if "tokens_identical" not in r else ("yes" if r["tokens_identical"] else "NO")
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['layout']} | {r['impl']} | {r['calc_diff']:.1e} | "
            f"{r['max_logit_diff']:.2e} | {r['top1_agreement']:.3f} | {tokens} | "
            f"{rt['flipped_tokens']} / {rt['tokens']} | {rt['flips_per_layer']} | {_group(rt['no_flip_upstream'])} | "
            f"{_group(rt['flip_upstream'])} |"
        )
    lines += [
        "",
        f"{meta['device']} x{meta['world_size']}, torch {meta['torch']}, transformers {meta['transformers']}, "
        f"{meta['date']}. Reference: the whole model on one device, stock, same weights; logits of the last "
        f"{meta['new_tokens']} of {meta['prompt_tokens'] + meta['new_tokens']} positions. A flipped token routes to "
        "another expert set than the reference at some MoE layer; 'flip upstream' = logit positions with a flip at "
        "or before them in their sequence (attention carries it forward).",
    ]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line, with ``dtype_list``, ``mode_list`` and ``impl_list`` (checked)."""
    args = build_parser().parse_args(argv)
    args.dtype_list = [d for d in args.dtypes.split(",") if d]
    args.mode_list = [m for m in args.modes.split(",") if m]
    args.impl_list = [i for i in args.impls.split(",") if i]
    for name, values, known in (("--dtypes", args.dtype_list, DTYPES), ("--modes", args.mode_list, PARALLEL_MODES),
                                ("--impls", args.impl_list, IMPLS)):  # fmt: skip
        if unknown := set(values) - set(known):
            raise SystemExit(f"{name}: unknown {sorted(unknown)}; choose from {sorted(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from modeling.transformers.dist_check import init_distributed

    args = parse(argv)
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rank, world, device = init_distributed(device_type)
    with torch.no_grad():
        rows = run(args, world, device)
    import transformers

    meta = {
        "model": args.model,
        "layers": rows[0]["layers"] if rows else args.layers,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "decode_tokens": args.decode_tokens,
        "world_size": world,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
    }
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "route_check.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        text = markdown(rows, meta)
        Path(args.out, "route_check.md").write_text(text)
        print(text, flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
