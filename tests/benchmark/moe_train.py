"""One MoE experts layer in training: forward + backward, tilegemm's patched experts beside transformers' on one GPU.

For each model's full-size experts (one layer's weights; ``tilegemm.bench.moe.MODELS``) and token count, times a
training step of the experts alone: ``out = forward(module, x, ids, w)``, then ``out.backward(dy)``, with gradients
to the hidden states, both weight tensors and the routing weights. Two forwards on the same stock experts module
(weights requiring gradients):

* ``transformers``: ``transformers.integrations.moe.grouped_mm_experts_forward`` (``torch._grouped_mm``);
* ``tilegemm``: ``tilegemm.transformers.experts.tilegemm_experts_forward``, what a patched model runs. With
  gradients it takes the unfused path (routing, permuted copy, two m-grouped GEMMs through
  ``tilegemm.grouped_matmul``'s autograd, the module's activation, the weighted combine).

Times are eager (training steps are not captured in CUDA graphs by default): the median of ``--reps`` steps, each
between CUDA events, gradients zeroed outside the timed region; ``fwd`` times the forward alone (autograd
recording). Every gradient of tilegemm's step is compared with transformers' (``calc_diff``; both are bf16
computations of the same math, so this bounds their disagreement, not either one's error) and with a rerun of
tilegemm's step (bitwise). Prints one markdown table and writes ``--out`` JSON.

    PYTHONPATH=src python3 tests/benchmark/moe_train.py [--models qwen3-30b-a3b] [--tokens 2048,8192,16384]

Results: ``tests/benchmark/results/moe/train_h100.json`` and ``results/moe/README.md`` ("Training").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

DEFAULT_TOKENS = (2048, 8192, 16384)


def _step_ms(fn, reps: int) -> tuple[float, float]:
    """(forward ms, forward + backward ms): medians over ``reps`` steps of ``fn() -> (out, backward)``."""
    fwd, total = [], []
    for _ in range(reps + 2):
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        out, backward = fn()
        mid.record()
        backward(out)
        end.record()
        end.synchronize()
        fwd.append(start.elapsed_time(mid))
        total.append(start.elapsed_time(end))
    return statistics.median(fwd[2:]), statistics.median(total[2:])


def run(model: str, tokens: int, reps: int) -> dict:
    """One row: both training steps on the same inputs, their times and how closely their gradients agree."""
    from transformers.integrations import moe as hf_moe

    from tilegemm.bench import inputs
    from tilegemm.bench.moe import MODELS, _routing, experts_module
    from tilegemm.testing import calc_diff
    from tilegemm.transformers.experts import tilegemm_experts_forward

    h, e, k, i, model_type = MODELS[model]
    seed = inputs.seed_of("moe_train", model, tokens)
    w13 = inputs.randn((e, 2 * i, h), torch.bfloat16, seed + 1).div_(math.sqrt(h))
    w2 = inputs.randn((e, h, i), torch.bfloat16, seed + 2).div_(math.sqrt(i))
    module = experts_module(model_type, w13, w2).train()
    for p in (module.gate_up_proj, module.down_proj):
        p.requires_grad_(True)
    x = inputs.randn((tokens, h), torch.bfloat16, seed + 3).requires_grad_(True)
    ids, weights = _routing(tokens, e, k, seed + 4)
    weights = weights.to(torch.bfloat16).requires_grad_(True)
    dy = inputs.randn((tokens, h), torch.bfloat16, seed + 5)
    leaves = {"x": x, "w13": module.gate_up_proj, "w2": module.down_proj, "routing_weights": weights}

    def step(forward):
        def fn():
            for t in leaves.values():
                t.grad = None
            return forward(module, x, ids, weights), lambda out: out.backward(dy)

        return fn

    row = {"model": model, "tokens": tokens, "hidden": h, "experts": e, "top_k": k, "inter": i}
    grads = {}
    for name, forward in (("transformers", hf_moe.grouped_mm_experts_forward), ("tilegemm", tilegemm_experts_forward)):
        fn = step(forward)
        out, backward = fn()
        backward(out)
        torch.cuda.synchronize()
        grads[name] = {"out": out.detach().clone(), **{n: t.grad.detach().clone() for n, t in leaves.items()}}
        fwd_ms, total_ms = _step_ms(fn, reps)
        row[f"{name}_fwd_us"], row[f"{name}_fwd_bwd_us"] = fwd_ms * 1e3, total_ms * 1e3
    fn = step(tilegemm_experts_forward)  # a rerun: tilegemm's gradients must be bitwise identical
    out, backward = fn()
    backward(out)
    again = {"out": out.detach(), **{n: t.grad for n, t in leaves.items()}}
    row["tilegemm_rerun_bitwise"] = all(torch.equal(again[n], grads["tilegemm"][n]) for n in again)
    row["speedup_fwd_bwd"] = row["transformers_fwd_bwd_us"] / row["tilegemm_fwd_bwd_us"]
    row["speedup_fwd"] = row["transformers_fwd_us"] / row["tilegemm_fwd_us"]
    row["calc_diff_vs_transformers"] = {
        n: float(calc_diff(grads["tilegemm"][n], grads["transformers"][n])) for n in grads["tilegemm"]
    }
    return row


def main(argv: list[str] | None = None) -> int:
    from tilegemm.bench.moe import MODELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-30b-a3b", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="moe_train.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_train.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    started = time.time()
    for model in args.models.split(","):
        for tokens in map(int, args.tokens.split(",")):
            print(f"[{time.time() - started:6.1f}s] {model} tokens={tokens}", file=sys.stderr, flush=True)
            rows.append(run(model, tokens, args.reps))
    meta = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{meta['gpu']}, {meta['date']}; eager, median of {args.reps} steps; us\n")
    print("| model | tokens | transformers fwd+bwd | tilegemm fwd+bwd | speedup | fwd: transformers / tilegemm | "
          "calc_diff of grads (x, w13, w2, routing w) | rerun bitwise |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cd = r["calc_diff_vs_transformers"]
        diffs = ", ".join(f"{cd[n]:.1e}" for n in ("x", "w13", "w2", "routing_weights"))
        print(
            f"| {r['model']} | {r['tokens']} | {r['transformers_fwd_bwd_us']:.0f} | {r['tilegemm_fwd_bwd_us']:.0f} | "
            f"{r['speedup_fwd_bwd']:.2f}x | {r['transformers_fwd_us']:.0f} / {r['tilegemm_fwd_us']:.0f} "
            f"({r['speedup_fwd']:.2f}x) | {diffs} | "
            f"{'yes' if r['tilegemm_rerun_bitwise'] else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
