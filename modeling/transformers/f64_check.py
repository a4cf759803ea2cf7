"""Stock and patched bf16 logits against the same random-weight model in float64 (teacher-forced prefill).

For a preset at batch 1 and a ``--prompt``-token random prompt: the logits of the stock bf16 model, of the model
patched with tilegemm (``apply_tilegemm_to_model``), and of a float64 copy of the stock model (transformers' eager
experts, sdpa attention). Prints ``calc_diff`` of stock and patched against float64 and of patched against stock,
whole-prompt and per position (median, and the positions where patched and stock differ most), one run per
``--seeds`` entry (the seed of the weights and the prompt), and writes ``--out`` JSON.

It answers whether a patched-vs-stock difference is tilegemm's error or stock's own bf16 rounding: the float64 model
is the truth both are measured against.

    python modeling/transformers/f64_check.py --model qwen3-30b-a3b --layers 4 --prompt 512 --seeds 0,1 --out f.json

On a GPU by default (the float64 copy of a 4-layer Qwen3 preset takes about 13 GB); ``--device cpu`` runs the tiny
presets on the CPU (the patched model then runs tilegemm's ``pytorch`` backend).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make src/ importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch

from tilegemm import calc_diff
from tilegemm.bench.models import build_model
from tilegemm.transformers import apply_tilegemm_to_model


@torch.no_grad()
def check(model_name: str, layers: int, prompt: int, seed: int, device: str = "cuda") -> dict:
    """calc_diff of stock / patched bf16 logits against float64 over one random prompt (weights and prompt from
    ``seed``) on ``device``."""
    stock = build_model({"model": model_name, "layers": layers}, device, seed=seed)
    torch.manual_seed(100 + seed)
    ids = torch.randint(0, stock.config.vocab_size, (1, prompt), device=device)
    f64 = copy.deepcopy(stock).double()
    f64.set_experts_implementation("eager")
    ref = f64(input_ids=ids, use_cache=False).logits[0].double()
    del f64
    s = stock(input_ids=ids, use_cache=False).logits[0].double()
    p = apply_tilegemm_to_model(copy.deepcopy(stock))(input_ids=ids, use_cache=False).logits[0].double()
    pos = [(calc_diff(p[i], s[i]), calc_diff(s[i], ref[i]), calc_diff(p[i], ref[i])) for i in range(prompt)]
    worst = sorted(range(prompt), key=lambda i: -pos[i][0])[:5]
    return {
        "stock_vs_f64": calc_diff(s, ref),
        "patched_vs_f64": calc_diff(p, ref),
        "patched_vs_stock": calc_diff(p, s),
        "median_position_stock_vs_f64": sorted(v[1] for v in pos)[prompt // 2],
        "median_position_patched_vs_f64": sorted(v[2] for v in pos)[prompt // 2],
        "worst_positions": [
            {"position": i, "patched_vs_stock": pos[i][0], "stock_vs_f64": pos[i][1], "patched_vs_f64": pos[i][2]}
            for i in worst
        ],  # fmt: skip
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="f64_check.json")
    args = ap.parse_args(argv)
    out = {}
    for seed in (int(v) for v in args.seeds.split(",")):
        row = check(args.model, args.layers, args.prompt, seed, args.device)
        out[f"{args.model} seed {seed}"] = row
        print(f"{args.model} seed {seed}: stock vs f64 {row['stock_vs_f64']:.2e}, patched vs f64 "
              f"{row['patched_vs_f64']:.2e}, patched vs stock {row['patched_vs_stock']:.2e}", flush=True)  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
