"""Where the FP8 indexer's top-k departs from BF16's: the recipe or the kernels? (CPU, no GPU needed.)

``PYTHONPATH=src:. python3 benchmarks/fp8_topk_recipe.py OUT.json [--contexts 4096,16384,65536]``: the DeepSeek-V3.2
preset's indexer (random weights, as ``modeling/transformers/indexer_bench.py`` builds it), one decode step per
context over random bf16 keys (``indexer_bench.decode_step``). From the step's own q, k and weights (captured from
the patched BF16 forward) it scores every key in float64 five ways and compares each top-k (the preset's 2048)
with the BF16 path's (tilegemm's, on the CPU: the float formula in fp32):

* ``f64``: the unquantized formula; its top-k against BF16's measures fp32 summation order (near-ties only);
* ``fp8_f64`` / ``fp8_plain_f64``: DeepSeek's FP8 recipe (per (token, head) query scales, per-token key scales,
  with / without the Hadamard rotation), evaluated exactly in float64 on the FP8 values: the recipe alone;
* ``fp8_op``: the recipe through the ops (``index_scores(fp8=True)``, pytorch backend): what the kernels compute.

If ``fp8_op`` and ``fp8_f64`` overlap BF16's top-k alike, the departure is the recipe's (FP8 rounding of q and k),
not the kernels'. Prints a table, writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from modeling.transformers import indexer_bench as bench
from tilegemm import indexer as scoring
from tilegemm.ops.common import fp8_cast_rows
from tilegemm.transformers.presets import PRESETS


def _f64_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 ``sum_h w[h] * relu(q[h] . k[t])`` for one query row: q [H, D], k [T, D], w [H] -> [T]."""
    return (w.double()[:, None] * (q.double() @ k.double().T).clamp_min(0)).sum(0)


def _fp8_f64(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, hadamard: bool) -> torch.Tensor:
    """The FP8 recipe's scores, exact in float64 on its FP8 values and scales."""
    q8, qs = fp8_cast_rows(q, hadamard)
    k8, ks = fp8_cast_rows(k, hadamard)
    return _f64_scores(q8.double(), k8.double(), w.double() * qs.double()) * ks.double()


def _overlap(a: torch.Tensor, b: torch.Tensor, topk: int) -> float:
    ia, ib = set(a.topk(topk).indices.tolist()), set(b.topk(topk).indices.tolist())
    return len(ia & ib) / len(ib)


def _capture(call) -> dict[str, torch.Tensor]:
    """Run a patched BF16 indexer step and capture the first query row's q [H, D], the keys [T, D], the weights with
    the softmax scale [H], the BF16 path's scores and the FP8 recipe's through the ops (pytorch backend)."""
    captured = {}
    original = scoring.index_scores

    def spy(q, k, weights, mask, scale, *a, **kw):
        captured.update(q=q[0, 0], k=k[0], w=weights[0, 0] * scale)
        captured["bf16"] = original(q, k, weights, mask, scale, *a, **kw)
        captured["fp8_op"] = original(q, k, weights, mask, scale, True, True, "pytorch")
        return captured["bf16"]

    scoring.index_scores = spy
    try:
        call()
    finally:
        scoring.index_scores = original
    return captured


def run(contexts: list[int]) -> list[dict]:
    config = PRESETS["deepseek-v3.2"].config(1)
    device = torch.device("cpu")
    module, stock, rope, rotary = bench.make_indexer(config, device)
    bench.set_variant(module, stock, "bf16", rope)
    topk = module.index_topk
    rows = []
    for length in contexts:
        captured = _capture(bench.decode_step(config, module, rotary, length, device)())
        q, k, w = captured["q"], captured["k"], captured["w"]
        bf16 = captured["bf16"][0, 0].double()
        ways = {
            "f64": _f64_scores(q, k, w),
            "fp8_f64": _fp8_f64(q, k, w, True),
            "fp8_plain_f64": _fp8_f64(q, k, w, False),
            "fp8_op": captured["fp8_op"][0, 0].double(),
        }
        row = {"context": length, "topk": min(topk, length)}
        for name, scores in ways.items():
            row[name] = {"topk_overlap_vs_bf16": _overlap(scores, bf16, row["topk"])}
        row["fp8_op"]["topk_overlap_vs_fp8_f64"] = _overlap(ways["fp8_op"], ways["fp8_f64"], row["topk"])
        rows.append(row)
        cells = "  ".join(f"{name} {row[name]['topk_overlap_vs_bf16']:.4f}" for name in ways)
        print(f"{length:6d}: {cells}  (fp8_op vs fp8_f64 {row['fp8_op']['topk_overlap_vs_fp8_f64']:.4f})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--contexts", default="4096,16384,65536")
    args = p.parse_args(argv)
    rows = run([int(c) for c in args.contexts.split(",")])
    result = {"preset": "deepseek-v3.2", "device": "cpu", "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
