"""Patched MoE inference vs stock transformers: speed and agreement (``python modeling/transformers/infer.py``).

Runs a random-weight preset (``--model tiny``, ``tiny-qwen3-moe``, ``qwen3-30b-a3b --layers 4``,
``deepseek-v3 --layers 4``, ...) or a local checkpoint directory through transformers with tilegemm's
experts (``apply_tilegemm_to_model``). With ``--compare`` it runs the stock model (experts
``grouped_mm``) on the same prompts and reports prefill and decode tokens/s, the max logit difference,
teacher-forced calc_diff / top-1 agreement and greedy token agreement. Nothing is downloaded.

Stock decode is measured with ``generate`` and the dynamic cache and, on a GPU, also with
``cache_implementation="static"`` (transformers compiles the forward); the faster is the peer. The
patched decode uses ``generate`` with the dynamic cache, or with ``--cuda-graphs`` a static cache and
a CUDA-graph-replayed decode step.

On the ``pytorch`` backend (the CPU, or a GPU without cuTile) the models run tilegemm's exact reference, which is
not a fast path: the run reports agreement only (no tokens/s, no ratios) and points at the committed GPU numbers
(:data:`GPU_NUMBERS`).

Run from a checkout: ``python modeling/transformers/infer.py --compare --model tiny`` (or
``python -m modeling.transformers.infer`` from the repository root).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from modeling.transformers import measure  # noqa: E402
from modeling.transformers.cli import positive_int, progress_log  # noqa: E402
from tilegemm.backend.selector import BACKENDS, cutile_unavailable_reason, get_current_backend  # noqa: E402
from tilegemm.transformers import apply_tilegemm_to_model, presets, revert_tilegemm_model  # noqa: E402
from tilegemm.transformers.compat import UnsupportedTransformersError, transformers_version  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Where the speed of the patched models is measured (H100, cutile backend), shown when a run cannot measure it.
GPU_NUMBERS = (
    "README.md (Measured), benchmarks/results/h100.md (the models rows: 4-layer Qwen3-30B-A3B and DeepSeek-V3, "
    "patched vs stock in the same calls) and benchmarks/results/norm/README.md (this script with --compare "
    "--cuda-graphs on an H100)"
)
#: The speed fields of a result row (dropped where the run cannot measure speed: see :func:`speed_measured`).
SPEED_KEYS = ("prefill_ratio", "decode_ratio", "decode_ratio_vs_generate")


log = progress_log("infer")
"""Progress line on stderr (rank 0 only under torchrun)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the CLI (options only; :func:`parse_args` also validates them together)."""
    names = ", ".join([*presets.ALIASES, *presets.PRESETS])
    p = argparse.ArgumentParser(prog="modeling/transformers/infer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help=f"preset ({names}) or a local checkpoint directory")
    p.add_argument("--layers", type=positive_int, default=None, help="decoder layers of a preset (realistic default 4)")
    p.add_argument("--compare", action="store_true", help="also run the stock model and compare")
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto", help="tilegemm backend of the patch")
    p.add_argument("--fp8", action="store_true", help="FP8 experts (and dense layers with --linear)")
    p.add_argument("--linear", action="store_true", help="also swap dense nn.Linear layers to tilegemm")
    p.add_argument("--no-norm", action="store_true", help="keep the stock RMSNorm modules (patch the experts only)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N; default: cuda when available, else cpu")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--prompt-tokens", type=positive_int, default=None, help="default: 16 (tiny), 4096 (realistic)")
    p.add_argument("--new-tokens", type=positive_int, default=None, help="default: 8 (tiny), 64 (realistic)")
    p.add_argument("--cuda-graphs", action="store_true", help="patched decode: static cache + CUDA graph")
    p.add_argument(
        "--stock-static",
        choices=["auto", "on", "off"],
        default="auto",
        help="stock decode with cache_implementation='static' (compiled); auto: on a GPU, realistic models",
    )
    p.add_argument(
        "--repeats", type=positive_int, default=None, help="timed prefill repetitions, median (1 tiny, 3 else)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results as JSON to this path ('-': stdout, table to stderr)")
    return p


def resolve_device(requested: str | None) -> torch.device:
    """``--device`` as a ``torch.device`` (default: cuda when available); ``ValueError`` saying why it can't run."""
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ValueError(f"got {requested!r}, expected cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"got {requested!r}, expected cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{requested!r} requested but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{requested!r} requested but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def backend_problem(backend: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``--backend backend`` cannot run the patched model on ``device`` in ``dtype``, or ``None``."""
    if backend != "cutile":
        return None
    reason = cutile_unavailable_reason()
    if reason is not None:
        return f"the cutile backend cannot run on this machine: {reason}"
    if device.type != "cuda":
        return f"the cutile backend needs --device cuda, got {device}"
    if dtype != torch.bfloat16:
        name = next(k for k, v in DTYPES.items() if v == dtype)
        return f"the cutile backend runs bf16 models; --dtype {name} would run pytorch"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line (argparse errors, exit status 2, for anything that cannot run).

    Adds ``args.device_resolved`` (``torch.device``) and ``args.dtype_resolved`` (``torch.dtype``).
    """
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.device_resolved = resolve_device(args.device)
    except ValueError as exc:
        p.error(f"argument --device: {exc}")
    args.dtype_resolved = DTYPES[args.dtype or ("bf16" if args.device_resolved.type == "cuda" else "fp32")]
    problem = backend_problem(args.backend, args.device_resolved, args.dtype_resolved)
    if problem is not None:
        p.error(f"argument --backend: {problem}")
    return args


class WeightsNotLocalError(ValueError):
    """``--model`` is neither a preset nor a local directory (the CLI never downloads)."""


def _looks_like_hub_name(name: str) -> bool:
    return "/" in name and not name.startswith((".", "/", "~")) and name.count("/") == 1


def load_models(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[tuple[str, Any]]:
    """(name, model) pairs for ``--model``: presets built with random weights, or a local checkpoint."""
    from transformers import AutoModelForCausalLM  # after the CLI's version check

    try:
        chosen = presets.resolve(args.model)
    except KeyError:
        chosen = None
    if chosen is None:
        path = os.path.expanduser(args.model)
        if not os.path.isdir(path):
            hint = "a Hub repository name" if _looks_like_hub_name(args.model) else "not a preset or directory"
            raise WeightsNotLocalError(
                f"--model {args.model!r} is {hint}: this CLI never downloads, the weights must be local. "
                f"Download them yourself (e.g. `huggingface-cli download {args.model} --local-dir DIR`) and pass "
                f"--model DIR, or use a preset: {', '.join([*presets.ALIASES, *presets.PRESETS])}"
            )
        log(f"loading {path} ({dtype}) on {device}")
        kwargs = {"dtype": dtype, "local_files_only": True}
        if device.type != "cpu" and importlib.util.find_spec("accelerate") is not None:
            kwargs["device_map"] = str(device)  # load straight onto the GPU
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
        return [(os.path.basename(os.path.normpath(path)), model.eval())]
    models = []
    for preset in chosen:
        layers = args.layers if args.layers is not None else (None if preset.tiny else 4)
        config = preset.config(layers)
        log(f"building {preset.name} ({config.num_hidden_layers} layers, random weights, {dtype}) on {device}")
        torch.manual_seed(args.seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        models.append((preset.name, model.eval()))
    return models


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else float("nan")


def _measure(model, ids, args, patched: bool, device) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tag = "patched" if patched else "stock"
    log(f"  {tag}: prefill x{args.repeats}")
    out["prefill_tok_s"] = _rate(ids.numel(), measure.time_prefill(model, ids, repeats=args.repeats))
    if patched and args.cuda_graphs:
        graphs = device.type == "cuda"
        log(f"  {tag}: decode {args.new_tokens} tokens, static cache{' + CUDA graph' if graphs else ''}")
        measure.static_greedy(model, ids, min(args.new_tokens, 3), cuda_graph=graphs)  # warm-up
        result = measure.static_greedy(model, ids, args.new_tokens, cuda_graph=graphs)
        out["decode_mode"] = "static+cuda_graph" if graphs and not result.note else "static"
        if result.note:
            out["decode_note"] = result.note
            log(f"  {tag}: {result.note}")
    else:
        runs = 1 if patched else 2  # batch-1 stock decode is launch-bound and noisy: keep its better run
        log(f"  {tag}: decode {args.new_tokens} tokens, dynamic cache (best of {runs})")
        measure.generate_greedy(model, ids, min(args.new_tokens, 2))  # warm-up
        result = max(
            (measure.generate_greedy(model, ids, args.new_tokens) for _ in range(runs)),
            key=lambda r: r.tokens_per_second(),
        )
        out["decode_mode"] = "dynamic"
    out["decode_tok_s"] = result.tokens_per_second()
    out["tokens"] = result.tokens
    if not patched and _want_static(args, device, model):
        log(f"  {tag}: decode, static cache (compiled by transformers; first call compiles)")
        try:
            measure.generate_greedy(model, ids, args.new_tokens, cache="static")
            static = measure.generate_greedy(model, ids, args.new_tokens, cache="static")
            out["decode_static_tok_s"] = static.tokens_per_second()
        except Exception as exc:  # a compile failure must not hide the other numbers
            out["decode_static_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _stock_graph_decode(model, ids, args, device) -> dict[str, Any]:
    """The stock experts in the same static-cache CUDA-graph decode loop as the patched model: the decode
    peer under ``--cuda-graphs`` (:func:`_decode_peer`). Run last, after every other measurement."""
    log("  stock: decode, static cache + CUDA graph with the stock experts (the same loop as patched)")
    try:
        measure.static_greedy(model, ids, min(args.new_tokens, 3), cuda_graph=True)
        graphed = measure.static_greedy(model, ids, args.new_tokens, cuda_graph=True)
    except Exception as exc:
        return {"decode_graph_error": f"{type(exc).__name__}: {exc}"[:300]}
    if graphed.note:
        return {"decode_graph_error": graphed.note}
    return {"decode_graph_tok_s": graphed.tokens_per_second()}


def _want_static(args, device, model) -> bool:
    """auto: on a GPU for realistic models (compiling each tiny demo model would dominate ``make demo``)."""
    tiny = model.config.hidden_size <= 256
    return args.stock_static == "on" or (args.stock_static == "auto" and device.type == "cuda" and not tiny)


def run_one(name: str, model, args, device, dtype) -> dict[str, Any]:
    """Measure one model (stock first when comparing, then patched); returns a result row."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.batch_size, args.prompt_tokens), generator=gen).to(device)
    backend = None if args.backend == "auto" else args.backend
    row: dict[str, Any] = {
        "model": name,
        "model_type": model.config.model_type,
        "layers": model.config.num_hidden_layers,
        "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": _resolved_backend(backend),
        "fp8": args.fp8,
        "linear": args.linear,
        "batch": args.batch_size,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "cuda_graphs": args.cuda_graphs,
        "norm": not args.no_norm,
    }
    stock = None
    if args.compare:
        log(f"{name}: stock (experts {model.config._experts_implementation})")
        stock = _measure(model, ids, args, patched=False, device=device)
    log(f"{name}: patched (tilegemm{'_fp8' if args.fp8 else ''}, backend {row['backend']})")
    apply_tilegemm_to_model(
        model, experts=True, linear=args.linear, fp8=args.fp8, backend=backend, norm=not args.no_norm
    )
    patched = _measure(model, ids, args, patched=True, device=device)
    row["patched"] = {k: v for k, v in patched.items() if k != "tokens"}
    if stock is not None:
        row["stock"] = {k: v for k, v in stock.items() if k != "tokens"}
        row["prefill_ratio"] = patched["prefill_tok_s"] / stock["prefill_tok_s"]
        row.update(measure.greedy_agreement(patched["tokens"], stock["tokens"]))
        # Teacher-forced: the stock greedy sequence fed to both models, logits of the generated positions.
        sequence = torch.cat([ids, stock["tokens"]], dim=1)
        last = stock["tokens"].shape[1]
        log(f"{name}: teacher-forced logits over {last} positions")
        test = measure.teacher_forced_logits(model, sequence, last)
        revert_tilegemm_model(model)
        ref = measure.teacher_forced_logits(model, sequence, last)
        row.update(measure.compare_logits(test, ref))
        if patched["decode_mode"] == "static+cuda_graph":
            row["stock"].update(_stock_graph_decode(model, ids, args, device))
        row.update(_decode_peer(row["stock"], patched["decode_tok_s"], patched["decode_mode"]))
    if not speed_measured(row):
        drop_speed(row)
    return row


def speed_measured(row: dict[str, Any]) -> bool:
    """Whether the row's speeds mean anything: not on the ``pytorch`` backend (the exact reference)."""
    return row["backend"] != "pytorch"


def drop_speed(row: dict[str, Any]) -> None:
    """Remove the tokens/s and ratios from ``row`` (in place) and say where the GPU numbers are."""
    for key in SPEED_KEYS:
        row.pop(key, None)
    for side in ("patched", "stock"):
        for key in [k for k in row.get(side, {}) if k.endswith("_tok_s") or k == "decode_peer_mode"]:
            del row[side][key]
    row["speed"] = f"not measured on the {row['backend']} backend (tilegemm's exact reference); see {GPU_NUMBERS}"


def _decode_peer(stock: dict[str, Any], tok_s: float, mode: str) -> dict[str, Any]:
    """The decode ratio against the stock model in the same loop: with the patched model in the CUDA-graph
    loop, the stock experts in that loop; otherwise the faster of transformers' generate() with the dynamic
    and the static (compiled) cache. Sets ``stock["decode_peer_*"]``; returns the ratios (the second only
    under CUDA graphs: against transformers' own fastest generate(), a different loop)."""
    static = stock.get("decode_static_tok_s", float("-inf"))
    generate = max(stock["decode_tok_s"], static)
    generate_mode = "static" if static > stock["decode_tok_s"] else "dynamic"
    out: dict[str, Any] = {}
    if mode == "static+cuda_graph" and "decode_graph_tok_s" in stock:
        stock["decode_peer_tok_s"], stock["decode_peer_mode"] = stock["decode_graph_tok_s"], mode
        out["decode_ratio_vs_generate"] = tok_s / generate
    else:
        stock["decode_peer_tok_s"], stock["decode_peer_mode"] = generate, generate_mode
    out["decode_ratio"] = tok_s / stock["decode_peer_tok_s"]
    return out


def _resolved_backend(backend: str | None) -> str:
    return backend or get_current_backend()


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, spec)


_MODE_TAG = {"dynamic": "dyn", "static": "sta", "static+cuda_graph": "graph"}


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the result rows (agreement only where the rows carry no speeds)."""
    if rows and not all(speed_measured(r) for r in rows):
        return _agreement_table(rows)
    head = ["model", "batch", "prefill tok/s", "decode tok/s", "max|dlogit|", "calc_diff", "top1", "greedy"]
    lines = []
    for r in rows:
        s, p = r.get("stock"), r["patched"]
        prefill = _fmt(p["prefill_tok_s"], ",.0f")
        decode = _fmt(p["decode_tok_s"], ",.1f") + " " + {"dynamic": "dyn"}.get(p["decode_mode"], p["decode_mode"])
        if s is not None:
            prefill = f"{_fmt(s['prefill_tok_s'], ',.0f')} -> {prefill} ({_fmt(r['prefill_ratio'], '.2f')}x)"
            mode = _MODE_TAG.get(s["decode_peer_mode"], s["decode_peer_mode"])
            peer = f"{_fmt(s['decode_peer_tok_s'], ',.1f')} {mode}"
            decode = f"{peer} -> {decode} ({_fmt(r['decode_ratio'], '.2f')}x)"
        lines.append(
            [
                r["model"],
                str(r["batch"]),
                prefill,
                decode,
                _fmt(r.get("max_logit_diff"), ".2e"),
                _fmt(r.get("calc_diff"), ".1e"),
                _fmt(r.get("top1_agreement"), ".3f"),
                _fmt(r.get("token_agreement"), ".3f"),
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    if rows:
        r = rows[0]
        out.append(
            f"dtype {r['dtype']}, device {r['device']}, backend {r['backend']}, fp8 {r['fp8']}, linear {r['linear']}; "
            "stock = transformers grouped_mm; decode peer = the stock model in the same loop: with --cuda-graphs "
            "the stock experts in the static-cache CUDA-graph loop (graph), else the faster of generate() with the "
            "dynamic (dyn) and the static-compiled (sta) cache, the latter on a GPU for realistic models only; "
            "calc_diff/top1 teacher-forced on the stock greedy tokens; greedy = token agreement."
        )
    return "\n".join(out)


def _agreement_table(rows: list[dict[str, Any]]) -> str:
    """The table of a run on the reference backend: patched against stock logits and tokens, no speeds."""
    head = ["model", "batch", "max|dlogit|", "calc_diff", "top1", "greedy"]
    lines = [
        [
            r["model"],
            str(r["batch"]),
            _fmt(r.get("max_logit_diff"), ".2e"),
            _fmt(r.get("calc_diff"), ".1e"),
            _fmt(r.get("top1_agreement"), ".3f"),
            _fmt(r.get("token_agreement"), ".3f"),
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    r = rows[0]
    compared = "stock" in r
    out.append(
        f"dtype {r['dtype']}, device {r['device']}, backend {r['backend']}, fp8 {r['fp8']}, linear {r['linear']}; "
        + (
            "patched vs stock (transformers grouped_mm): calc_diff/top1 teacher-forced on the stock greedy tokens; "
            "greedy = token agreement."
            if compared
            else "run with --compare for the agreement with the stock model."
        )
    )
    out.append(
        f"Agreement only: the {r['backend']} backend is tilegemm's exact reference, not a fast path, so this run "
        f"reports no speed. GPU numbers (H100, cutile kernels): {GPU_NUMBERS}."
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the CLI; returns the exit status (2: bad arguments or environment)."""
    args = parse_args(argv)
    try:
        transformers_version()
    except UnsupportedTransformersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device, dtype = args.device_resolved, args.dtype_resolved
    try:
        models = _lazy_models(args, device, dtype)
        rows = []
        for name, build in models:
            model = build()
            tiny = model.config.hidden_size <= 256
            args.prompt_tokens = args.prompt_tokens or (16 if tiny else 4096)
            args.new_tokens = args.new_tokens or (8 if tiny else 64)
            args.repeats = args.repeats or (1 if tiny else 3)
            rows.append(run_one(name, model, args, device, dtype))
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except WeightsNotLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # With ``--json -`` stdout carries the JSON alone; the table goes to stderr.
    print(format_table(rows), file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    if args.json:
        text = json.dumps(rows, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
            log(f"wrote {args.json}")
    return 0


def _lazy_models(args, device, dtype):
    """(name, builder) pairs, so only one model is in memory at a time."""
    try:
        chosen = presets.resolve(args.model)
    except KeyError:
        return [(args.model, lambda: load_models(args, device, dtype)[0][1])]
    out = []
    for preset in chosen:
        sub = argparse.Namespace(**{**vars(args), "model": preset.name})
        out.append((preset.name, lambda sub=sub: load_models(sub, device, dtype)[0][1]))
    return out


if __name__ == "__main__":
    sys.exit(main())
