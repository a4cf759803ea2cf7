"""Stock and patched bf16 logits against the same random-weight model in float64 (teacher-forced prefill).

For a preset at batch 1 and a ``--prompt``-token random prompt: the logits of the stock bf16 model, of the model
patched with tilegemm (each ``--impls`` entry: ``patched`` = the defaults, BF16 experts and RMSNorm; ``fp8`` = FP8
experts and RMSNorm; ``experts`` = BF16 experts only), and of the same model converted to float64 (transformers'
eager experts, sdpa attention). Prints ``calc_diff`` of stock and of each patched variant against float64 and
against stock, whole-prompt and per position (median, and the positions where patched and stock differ most), one
run per ``--seeds`` entry (the seed of the weights and the prompt), a table last, and writes ``--out`` JSON.

It answers whether a patched-vs-stock difference is tilegemm's error or stock's own bf16 rounding: the float64 model
is the truth both are measured against.

    python modeling/transformers/f64_check.py --model qwen3-30b-a3b --layers 4 --prompt 512 --seeds 0,1 --out f.json
    python modeling/transformers/f64_check.py --model deepseek-v3 --layers 4 --prompt 256 --impls patched,fp8 \\
        --f64-device auto --out d.json

The model is built once (:func:`modeling.transformers.build.build_model`), run stock and patched in bf16, then
converted in place to float64: on the GPU when it fits there (a 4-layer Qwen3 preset: about 24 GB), else on the CPU
(``--f64-device auto``; a 4-layer DeepSeek-V3 preset holds one MoE layer of 256 experts, about 120 GB in float64,
which needs a host with that much memory). ``--device cpu`` runs the tiny presets on the CPU (the patched model then
runs tilegemm's ``pytorch`` backend).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import torch

from tilegemm import calc_diff
from tilegemm.transformers import apply_tilegemm_to_model, clear_fp8_cache, revert_tilegemm_model

#: ``--impls`` entry -> ``apply_tilegemm_to_model`` keywords.
IMPLS: dict[str, dict[str, bool]] = {"patched": {}, "fp8": {"fp8": True}, "experts": {"norm": False}}
#: Device memory left free beside the float64 model on a GPU (activations, logits), bytes.
F64_MARGIN = 8 << 30


def _log(message: str) -> None:
    print(f"[f64_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def f64_device(model: torch.nn.Module, device: str, choice: str) -> str:
    """Where the float64 copy runs: ``choice`` unless ``"auto"``, then ``device`` if 4x the model's bytes (its
    float64 size, the bf16 copy freed as it converts) fit that device's free memory, else ``"cpu"``."""
    if choice != "auto":
        return choice
    if torch.device(device).type != "cuda":
        return device
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    f64_bytes = sum(p.numel() * 8 for p in model.parameters())
    free_bytes = torch.cuda.mem_get_info(torch.device(device))[0] + size
    return device if f64_bytes + F64_MARGIN < free_bytes else "cpu"


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits[0].double().cpu()


@torch.no_grad()
def check(
    model_name: str,
    layers: int,
    prompt: int,
    seed: int,
    device: str = "cuda",
    impls: tuple[str, ...] = ("patched",),
    f64: str = "auto",
) -> dict:
    """calc_diff of stock and each of ``impls`` (bf16 logits) against float64 over one random prompt (weights and
    prompt from ``seed``) on ``device``; the float64 model on ``f64`` (a device or ``"auto"``)."""
    from modeling.transformers.build import build_model, free

    model = build_model(model_name, layers, torch.bfloat16, device, seed)
    torch.manual_seed(100 + seed)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), device=device)
    s = _logits(model, ids)
    variants = {}
    for impl in impls:
        apply_tilegemm_to_model(model, **IMPLS[impl])
        variants[impl] = _logits(model, ids)
        revert_tilegemm_model(model)
        clear_fp8_cache(model)
    where = f64_device(model, device, f64)
    _log(f"{model_name} seed {seed}: float64 model on {where}")
    if where == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    if where == "cpu":  # move first: a cross-device copy that casts may stage the float64 tensor on the GPU
        model = model.to(device="cpu")
    model = model.to(device=where, dtype=torch.float64)
    free(device)
    model.set_experts_implementation("eager")
    ref = _logits(model, ids.to(where))
    del model
    free(device)
    out = {"stock_vs_f64": calc_diff(s, ref), "f64_device": where}
    for impl, p in variants.items():
        pos = [(calc_diff(p[i], s[i]), calc_diff(s[i], ref[i]), calc_diff(p[i], ref[i])) for i in range(prompt)]
        worst = sorted(range(prompt), key=lambda i: -pos[i][0])[:5]
        out[f"{impl}_vs_f64"] = calc_diff(p, ref)
        out[f"{impl}_vs_stock"] = calc_diff(p, s)
        out[f"median_position_{impl}_vs_f64"] = sorted(v[2] for v in pos)[prompt // 2]
        out["worst_positions" if impl == "patched" else f"worst_positions_{impl}"] = [
            {"position": i, f"{impl}_vs_stock": pos[i][0], "stock_vs_f64": pos[i][1], f"{impl}_vs_f64": pos[i][2]}
            for i in worst
        ]
    med = sorted(calc_diff(s[i], ref[i]) for i in range(prompt))
    out["median_position_stock_vs_f64"] = med[prompt // 2]
    return out


def markdown(report: dict[str, dict], impls: tuple[str, ...]) -> str:
    """One line per (model, seed): calc_diff against float64 and against stock."""
    cols = " | ".join(f"{i} vs f64 | {i} vs stock" for i in impls)
    lines = [f"| run | f64 on | stock vs f64 | {cols} |", "|---|---|---|" + "---|---|" * len(impls)]
    for key, row in report.items():
        vals = " | ".join(f"{row[f'{i}_vs_f64']:.2e} | {row[f'{i}_vs_stock']:.2e}" for i in impls)
        lines.append(f"| {key} | {row['f64_device']} | {row['stock_vs_f64']:.2e} | {vals} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--impls", default="patched", help=f"comma-separated, of {list(IMPLS)}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--f64-device", default="auto", help="where the float64 model runs (auto: the device if it fits)")
    ap.add_argument("--out", default="f64_check.json")
    args = ap.parse_args(argv)
    impls = tuple(i for i in args.impls.split(",") if i)
    if unknown := set(impls) - set(IMPLS):
        ap.error(f"--impls: unknown {sorted(unknown)}; choose from {list(IMPLS)}")
    out = {}
    for seed in (int(v) for v in args.seeds.split(",")):
        row = check(args.model, args.layers, args.prompt, seed, args.device, impls, args.f64_device)
        out[f"{args.model} seed {seed}"] = row
        print(f"{args.model} seed {seed}: stock vs f64 {row['stock_vs_f64']:.2e}, patched vs f64 "
              f"{row.get('patched_vs_f64', float('nan')):.2e}, patched vs stock "
              f"{row.get('patched_vs_stock', float('nan')):.2e}", flush=True)  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(markdown(out, impls), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
