"""One MoE experts layer in training: forward + backward, tilegemm's patched experts beside transformers' on one GPU.

For each model's full-size experts (one layer's weights; ``tilegemm.bench.moe.MODELS``) and token count, times a
training step of the experts alone: ``out = forward(module, x, ids, w)``, then ``out.backward(dy)``, with gradients
to the hidden states, both weight tensors and the routing weights. Three forwards on the same stock experts module
(weights requiring gradients):

* ``transformers``: ``transformers.integrations.moe.grouped_mm_experts_forward`` (``torch._grouped_mm``);
* ``tilegemm``: ``tilegemm.transformers.experts.tilegemm_experts_forward``, what a patched bf16 model runs: the
  fused op with its fused backward (``tilegemm.autograd.moe_experts``);
* ``tilegemm_unfused``: ``unfused_experts_forward``, the path of fp16/fp32 models and modules the fused op does not
  cover (routing, permuted copy, two m-grouped GEMMs through ``tilegemm.grouped_matmul``'s autograd, the module's
  activation, the weighted combine).

Times: eager, the median of ``--reps`` steps, each between CUDA events, gradients set to ``None`` outside the timed
region (``fwd`` times the forward alone, autograd recording); and kernel-only, the same step captured in a CUDA graph
and replayed (``None`` where the path cannot be captured: the unfused path reads group sizes on the host). Each
path's output and gradients are compared with autograd on the float64 formula (``calc_diff``) and with
transformers', and a rerun of each tilegemm path must be bitwise identical. Prints one markdown table and writes
``--out`` JSON.

    PYTHONPATH=src python3 benchmarks/moe_train.py [--models qwen3-30b-a3b] [--tokens 2048,8192,16384]
        [--out F.json] [--plot F.png]
    python3 benchmarks/moe_train.py --from F.json [--plot F.png]     # the table (and plot) of a saved run

Results: ``benchmarks/results/moe/train_h100.json`` and ``results/moe/README.md`` ("Training").
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


PATHS = ("transformers", "tilegemm", "tilegemm_unfused")
NAMES = ("out", "x", "w13", "w2", "routing_weights")


def _graph_ms(fn, reps: int) -> float | None:
    """Median ms of replaying ``fn`` (one training step) captured in a CUDA graph; ``None`` if it cannot be captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    times = []
    for _ in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def run(model: str, tokens: int, reps: int) -> dict:
    """One row: the three training steps on the same inputs, their times and accuracy."""
    from transformers.integrations import moe as hf_moe

    from tilegemm.bench import inputs
    from tilegemm.bench.moe import MODELS, _routing, experts_module
    from tilegemm.testing import calc_diff, moe_experts_float64
    from tilegemm.transformers.experts import tilegemm_experts_forward, unfused_experts_forward

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
    forwards = {
        "transformers": hf_moe.grouped_mm_experts_forward,
        "tilegemm": tilegemm_experts_forward,
        "tilegemm_unfused": unfused_experts_forward,
    }

    def step(forward):
        def fn():
            for t in leaves.values():
                t.grad = None
            return forward(module, x, ids, weights), lambda out: out.backward(dy)

        return fn

    def results(forward) -> dict:
        out, backward = step(forward)()
        backward(out)
        torch.cuda.synchronize()
        return {"out": out.detach().clone(), **{n: t.grad.detach().clone() for n, t in leaves.items()}}

    row = {"model": model, "tokens": tokens, "hidden": h, "experts": e, "top_k": k, "inter": i}
    got = {}
    for name in PATHS:
        got[name] = results(forwards[name])
        fwd_ms, total_ms = _step_ms(step(forwards[name]), reps)
        row[f"{name}_fwd_us"], row[f"{name}_fwd_bwd_us"] = fwd_ms * 1e3, total_ms * 1e3

        def whole(fn=step(forwards[name])):
            out, backward = fn()
            backward(out)

        graph_ms = _graph_ms(whole, reps)
        row[f"{name}_fwd_bwd_graph_us"] = None if graph_ms is None else graph_ms * 1e3
        if name != "transformers":
            again = results(forwards[name])
            row[f"{name}_rerun_bitwise"] = all(torch.equal(again[n], got[name][n]) for n in NAMES)
    truth = moe_experts_float64(x, ids, weights, module.gate_up_proj, module.down_proj, dy)
    for name in PATHS:
        row[f"{name}_calc_diff_vs_float64"] = {n: float(calc_diff(got[name][n], truth[n])) for n in NAMES}
    row["calc_diff_vs_transformers"] = {n: float(calc_diff(got["tilegemm"][n], got["transformers"][n])) for n in NAMES}
    for name in PATHS[1:]:
        row[f"{name}_speedup_fwd_bwd"] = row["transformers_fwd_bwd_us"] / row[f"{name}_fwd_bwd_us"]
        row[f"{name}_speedup_fwd"] = row["transformers_fwd_us"] / row[f"{name}_fwd_us"]
    if row["tilegemm_fwd_bwd_graph_us"] and row["transformers_fwd_bwd_graph_us"]:
        row["tilegemm_speedup_fwd_bwd_graph"] = row["transformers_fwd_bwd_graph_us"] / row["tilegemm_fwd_bwd_graph_us"]
    return row


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def markdown(meta: dict, rows: list[dict], reps: int) -> str:
    """The rows as a markdown table (times in us; speedups against transformers)."""
    lines = [
        f"{meta['gpu']}, {meta['date']}, torch {meta['torch']}; eager: median of {reps} steps; graph: the step "
        "replayed from a CUDA graph (- : not capturable); us\n",
        "| model | tokens | transformers fwd+bwd eager / graph | tilegemm fwd+bwd eager / graph "
        "| speedup eager / graph | tilegemm unfused eager | fwd: transformers / tilegemm "
        "| calc_diff vs float64, worst of out and grads: transformers / tilegemm | reruns bitwise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        worst = {p: max(r[f"{p}_calc_diff_vs_float64"].values()) for p in PATHS}
        graph = r.get("tilegemm_speedup_fwd_bwd_graph")
        bitwise = all(r[f"{p}_rerun_bitwise"] for p in PATHS[1:])
        lines.append(
            f"| {r['model']} | {r['tokens']} | {_us(r['transformers_fwd_bwd_us'])} / "
            f"{_us(r['transformers_fwd_bwd_graph_us'])} | {_us(r['tilegemm_fwd_bwd_us'])} / "
            f"{_us(r['tilegemm_fwd_bwd_graph_us'])} | {r['tilegemm_speedup_fwd_bwd']:.2f}x / "
            f"{'-' if graph is None else f'{graph:.2f}x'} | {_us(r['tilegemm_unfused_fwd_bwd_us'])} "
            f"({r['tilegemm_unfused_speedup_fwd_bwd']:.2f}x) | {_us(r['transformers_fwd_us'])} / "
            f"{_us(r['tilegemm_fwd_us'])} ({r['tilegemm_speedup_fwd']:.2f}x) | {worst['transformers']:.1e} / "
            f"{worst['tilegemm']:.1e} | {'yes' if bitwise else 'NO'} |"
        )
    return "\n".join(lines)


def plot(meta: dict, rows: list[dict], path: str) -> None:
    """Bar chart of the fwd+bwd times (eager and CUDA graph) per token count, written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [
        ("transformers_fwd_bwd_us", "transformers grouped_mm, eager"),
        ("transformers_fwd_bwd_graph_us", "transformers, CUDA graph"),
        ("tilegemm_fwd_bwd_us", "tilegemm fused, eager"),
        ("tilegemm_fwd_bwd_graph_us", "tilegemm fused, CUDA graph"),
        ("tilegemm_unfused_fwd_bwd_us", "tilegemm unfused, eager"),
    ]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.16
    for i, (key, label) in enumerate(series):
        xs = [j + (i - 2) * width for j in range(len(rows))]
        ax.bar(xs, [(r[key] or 0) / 1e3 for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [f"{r['model']}\n{r['tokens']} tokens" for r in rows], fontsize=8)
    ax.set_ylabel("forward + backward, ms (lower is better)")
    ax.set_title(f"One experts layer, training step, {meta['gpu']}, {meta['date']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from tilegemm.bench.moe import MODELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-30b-a3b", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="moe_train.json")
    ap.add_argument("--from", dest="source", help="render the table (and --plot) of this JSON instead of measuring")
    ap.add_argument("--plot", help="also write a bar chart of the times to this PNG")
    args = ap.parse_args(argv)
    if args.source:
        with open(args.source) as f:
            saved = json.load(f)
        print(markdown(saved["meta"], saved["rows"], args.reps))
        if args.plot:
            plot(saved["meta"], saved["rows"], args.plot)
        return 0
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
    print(markdown(meta, rows, args.reps))
    if args.plot:
        plot(meta, rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
