"""First-request time of a patched model with cold and warm kernel caches, and with ``tilegemm.precompile``.

tilegemm's kernels are compiled on first use and stored on disk (cuTile: ``CUDA_TILE_CACHE_DIR``; Triton, for the
gluon backend: ``TRITON_CACHE_DIR``). Each scenario runs in a fresh Python process (nothing compiled in memory)
with its own cache directories, builds the preset (random weights, ``--layers`` decoder layers), patches it with
``apply_tilegemm_to_model`` and times requests; a request is ``generate`` of ``--new-tokens`` greedy tokens after a
``--prompt-tokens`` prompt (one prefill, then batch-1 decode steps):

* ``cold``: empty cache directories; the first request waits for every compile it needs;
* ``warm``: the directories ``cold`` filled; the first request loads compiled kernels;
* ``precompile_warm``: the same directories; ``tilegemm.precompile(model, max_tokens=--max-tokens)`` first;
* ``precompile_cold``: new empty directories; ``tilegemm.precompile`` first, so it pays every compile.

Each reports the first and second request's seconds (the second is the steady state), the precompile seconds and
its token counts, the process's model build seconds and the cache files after it. From the repository root::

    python modeling/transformers/warmup_bench.py --model qwen3-30b-a3b --layers 4 --out "$OUT/warmup_bench.json"

The scenarios share a ``--budget`` of seconds (default 280); one that would start past it is skipped and marked so.
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
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from modeling.transformers.cli import positive_int  # noqa: E402

CACHE_ENV = ("CUDA_TILE_CACHE_DIR", "TRITON_CACHE_DIR")
"""The on-disk kernel caches each scenario points at its own directories."""

SCENARIOS: tuple[tuple[str, str, bool], ...] = (
    ("cold", "a", False),
    ("warm", "a", False),
    ("precompile_warm", "a", True),
    ("precompile_cold", "b", True),
)
"""(name, cache directory set, whether ``tilegemm.precompile`` runs before the requests), in run order."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-30b-a3b", help="a preset of tilegemm.transformers.presets")
    parser.add_argument("--layers", type=positive_int, default=4, help="decoder layers of the preset")
    parser.add_argument("--prompt-tokens", type=positive_int, default=512)
    parser.add_argument("--new-tokens", type=positive_int, default=8)
    parser.add_argument("--max-tokens", type=positive_int, default=512, help="tilegemm.precompile's max_tokens")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for all scenarios")
    parser.add_argument("--out", default=None, help="JSON path (default: $OUT/warmup_bench.json, else stdout only)")
    parser.add_argument("--child", choices=("request", "precompile"), help=argparse.SUPPRESS)
    return parser


def _request(model, ids, new_tokens: int) -> float:
    import torch

    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
        )  # fmt: skip
    if ids.is_cuda:
        torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - start


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One scenario in this process: build, patch, (precompile), two requests; returns the measurements."""
    start = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    import tilegemm
    from tilegemm.backend.selector import cutile_unavailable_reason
    from tilegemm.transformers import apply_tilegemm_to_model, presets

    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = presets.PRESETS[args.model].config(layers=args.layers)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    apply_tilegemm_to_model(model)
    ids = torch.randint(0, config.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    if device == "cuda":
        torch.cuda.synchronize()
    result: dict[str, Any] = {
        "build_s": time.perf_counter() - start,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "backend": tilegemm.get_current_backend(),
        "cutile_unavailable": cutile_unavailable_reason(),
    }
    if args.child == "precompile":
        begin = time.perf_counter()
        times = tilegemm.precompile(model, max_tokens=args.max_tokens)
        result["precompile_s"] = time.perf_counter() - begin
        result["precompile_forward_s"] = {str(t): round(s, 4) for t, s in times.items()}
    result["first_request_s"] = _request(model, ids, args.new_tokens)
    result["second_request_s"] = _request(model, ids, args.new_tokens)
    return result


def _cache_files(dirs: dict[str, str]) -> dict[str, int]:
    return {env: sum(len(files) for _, _, files in os.walk(path)) for env, path in dirs.items()}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    start = time.perf_counter()
    root = tempfile.mkdtemp(prefix="tilegemm-warmup-")
    dirs = {s: {env: os.path.join(root, s, env.lower()) for env in CACHE_ENV} for s in ("a", "b")}
    common = ["--model", args.model, "--layers", str(args.layers), "--prompt-tokens", str(args.prompt_tokens),
              "--new-tokens", str(args.new_tokens), "--max-tokens", str(args.max_tokens)]  # fmt: skip
    scenarios: dict[str, Any] = {}
    for name, cache, precompile in SCENARIOS:
        left = args.budget - (time.perf_counter() - start)
        if left < 20:
            scenarios[name] = {"skipped": f"budget of {args.budget:.0f} s spent"}
            continue
        for path in dirs[cache].values():
            os.makedirs(path, exist_ok=True)
        env = {**os.environ, **dirs[cache]}
        command = [sys.executable, __file__, *common, "--child", "precompile" if precompile else "request"]
        begin = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            scenarios[name] = {"skipped": f"ran past the budget ({left:.0f} s left when it started)"}
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            scenarios[name] = {"error": done.stderr[-4000:], "returncode": done.returncode}
            continue
        scenarios[name] = {**json.loads(lines[-1][len("RESULT ") :]), "process_s": time.perf_counter() - begin}
        scenarios[name]["cache_files_after"] = _cache_files(dirs[cache])
        print(f"{name}: {json.dumps(scenarios[name])}", flush=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": args.model,
        "layers": args.layers,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "max_tokens": args.max_tokens,
        "cache_env": list(CACHE_ENV),
        "scenarios": scenarios,
        "summary": {
            name: {key: scenarios[name].get(key) for key in ("precompile_s", "first_request_s", "second_request_s")}
            for name in scenarios
        },
    }
    out = args.out or (os.path.join(os.environ["OUT"], "warmup_bench.json") if os.environ.get("OUT") else None)
    text = json.dumps(report, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
