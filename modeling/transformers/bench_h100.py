"""The MoE inference benchmark matrix in one process: realistic presets, prefill / decode at batch 1 and 32, FP8.

For each preset (default ``qwen3-30b-a3b`` and ``deepseek-v3`` with 4 layers) the model is compared stock
vs patched (``infer.run_one``) in stages; the bf16 stages of every preset run first:

1. batch 1, ``--prompt-b1`` tokens (prefill) then ``--new-tokens`` decoded with ``--cuda-graphs``;
2. batch 32, ``--prompt-b32`` tokens each, decode with ``--cuda-graphs``; the stock peer also runs the
   static cache compiled by transformers when enough of ``--deadline`` is left;
3. FP8 experts: teacher-forced logits vs bf16 stock (and its speed).

Stages that would start after ``--deadline`` seconds are skipped (and listed). Results go to
``OUT/infer_raw.json`` (rows of ``infer.py``) and ``OUT/infer_h100.{json,md}`` (benchmark rows),
rewritten after every stage.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402

from modeling.transformers import infer, report  # noqa: E402
from tilegemm.transformers import clear_fp8_cache, revert_tilegemm_model  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--presets", default="qwen3-30b-a3b,deepseek-v3")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--deadline", type=float, default=240.0, help="seconds after which no stage starts")
    p.add_argument("--static-reserve", type=float, default=60.0, help="time left needed to try static compile")
    p.add_argument("--prompt-b1", type=int, default=4096)
    p.add_argument("--prompt-b32", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--fp8-prompt", type=int, default=512)
    p.add_argument("--fp8-new-tokens", type=int, default=16)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="bf16")
    opts = p.parse_args()
    os.makedirs(opts.out, exist_ok=True)
    start = time.perf_counter()
    raw, bench, skipped = [], [], []

    def left() -> float:
        return opts.deadline - (time.perf_counter() - start)

    def save() -> None:
        with open(os.path.join(opts.out, "infer_raw.json"), "w") as f:
            json.dump({"rows": raw, "skipped": skipped}, f, indent=2, default=str)
        with open(os.path.join(opts.out, "infer_h100.json"), "w") as f:
            json.dump(bench, f, indent=2, default=str)
        with open(os.path.join(opts.out, "infer_h100.md"), "w") as f:
            f.write(report.markdown(bench))
            if skipped:
                f.write("\nSkipped (device-time deadline): " + "; ".join(skipped) + "\n")

    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = infer.DTYPES[opts.dtype]
    presets = opts.presets.split(",")
    stage_args = {
        "b1": ["--batch-size", "1", "--prompt-tokens", str(opts.prompt_b1), "--stock-static", "off"],
        "b32": ["--batch-size", "32", "--prompt-tokens", str(opts.prompt_b32)],
        "fp8": ["--batch-size", "1", "--prompt-tokens", str(opts.fp8_prompt), "--fp8", "--stock-static", "off"],
    }
    # Priority order: batch 1 (prefill + decode) of every preset, then batch 32, then FP8 accuracy.
    plan = [(p, s) for s in ("b1", "b32", "fp8") for p in presets]
    current: tuple[str, object] | None = None
    for preset, stage in plan:
        if left() <= 0:
            skipped.append(f"{preset}/{stage}")
            continue
        base = ["--model", preset, "--layers", str(opts.layers), "--compare", "--cuda-graphs", "--dtype", opts.dtype]
        base += ["--device", str(device)]
        if current is None or current[0] != preset:
            current = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            try:
                current = (preset, infer.load_models(infer.parse_args(base), device, dtype)[0][1])
            except Exception as exc:
                traceback.print_exc()
                skipped.append(f"{preset}/{stage}: build failed: {type(exc).__name__}: {exc}"[:300])
                continue
        model = current[1]
        new_tokens = opts.fp8_new_tokens if stage == "fp8" else opts.new_tokens
        args = infer.parse_args([*base, *stage_args[stage], "--new-tokens", str(new_tokens), "--repeats", "3"])
        if args.stock_static == "auto" and device.type == "cuda" and left() < opts.static_reserve:
            args.stock_static = "off"
            skipped.append(f"{preset}/{stage}: stock static-compiled peer")
        infer.log(f"stage {preset}/{stage} ({left():.0f} s left)")
        try:
            row = infer.run_one(preset, model, args, device, dtype)
        except Exception as exc:
            traceback.print_exc()
            skipped.append(f"{preset}/{stage}: failed: {type(exc).__name__}: {exc}"[:300])
            continue
        finally:
            revert_tilegemm_model(model)
            clear_fp8_cache(model)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        raw.append(row)
        bench.extend(report.benchmark_rows(row))
        save()
        print(infer.format_table([row]), flush=True)
    save()
    print(report.markdown(bench))
    if skipped:
        print("skipped:", "; ".join(skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
