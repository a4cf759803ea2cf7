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
its token counts, the process's model build seconds, the cache files and cuTile cache entries after it (the cuTile
cache is one SQLite file, ``cache.db``, one row per compiled kernel), and per phase (precompile, first request,
second request) what cuTile's JIT did: kernels compiled in the process, of them disk-cache hits and ``tileiras``
runs, their seconds, and for the requests the kernels and signatures compiled. From the repository root::

    python modeling/transformers/warmup_bench.py --model qwen3-30b-a3b --layers 4 --out "$OUT/warmup_bench.json"

The scenarios share a ``--budget`` of seconds (default 110), each at most ``--scenario-timeout`` (default 50); one
that would start past the budget or runs past its time is stopped and marked so. ``--scenarios`` runs some of them;
``--profile N`` runs each first request under cProfile and reports its top N functions (cumulative and own time);
``--no-cudnn-attention`` turns torch's cuDNN attention off in every scenario (it builds a plan per new sequence
length on its first call: benchmarks/warmup/sdpa_first_call.py).
The last lines printed are a table of the four scenarios.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root and src/ importable
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[0:1] = [str(_ROOT), str(_ROOT / "src")]

import argparse  # noqa: E402
import contextlib  # noqa: E402
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
    parser.add_argument("--workers", type=positive_int, default=None, help="tilegemm.precompile's workers")
    parser.add_argument("--no-generate", action="store_true", help="tilegemm.precompile(generate=False)")
    parser.add_argument(
        "--warm-prompt",
        action="store_true",
        help="tilegemm.precompile(prompt_lengths=(8, --prompt-tokens)): its short generate also runs at the requests' "
        "prompt length",
    )
    parser.add_argument("--budget", type=float, default=110.0, help="seconds for all scenarios")
    parser.add_argument("--scenario-timeout", type=float, default=50.0, help="seconds for one scenario")
    parser.add_argument("--scenarios", default=None, help="comma-separated names of SCENARIOS to run (default: all)")
    parser.add_argument("--profile", type=positive_int, default=None, help="cProfile the first request: top N rows")
    parser.add_argument(
        "--no-cudnn-attention", action="store_true", help="torch.backends.cuda.enable_cudnn_sdp(False) in each scenario"
    )
    parser.add_argument("--out", default=None, help="JSON path (default: $OUT/warmup_bench.json, else stdout only)")
    parser.add_argument("--child", choices=("request", "precompile"), help=argparse.SUPPRESS)
    return parser


class _JitLog:
    """Counts cuTile's JIT work per phase: kernels compiled in this process (``kernel._compile``), disk-cache
    hits and ``tileiras`` runs among them, their seconds; the kernel names and signatures when ``detail``."""

    def __init__(self) -> None:
        self.phase = "build"
        self.phases: dict[str, dict[str, Any]] = {}
        self.installed = False
        try:
            from cuda.tile import _compile, _execution
        except ImportError:
            return
        log = self
        compile_method, lookup, cubin = _execution.kernel._compile, _compile.cache_lookup, _compile.compile_cubin

        def counted_compile(kernel, signature, *args, **kwargs):
            begin = time.perf_counter()
            try:
                return compile_method(kernel, signature, *args, **kwargs)
            finally:
                entry = log.entry()
                entry["compiles"] += 1
                entry["compile_s"] += time.perf_counter() - begin
                if entry["detail"] is not None and len(entry["detail"]) < 40:
                    entry["detail"].append(f"{getattr(kernel, '_pyfunc', kernel).__name__}: {str(signature)[:600]}")

        def counted_lookup(*args, **kwargs):
            found = lookup(*args, **kwargs)
            log.entry()["cache_hits" if found is not None else "cache_misses"] += 1
            return found

        def counted_cubin(*args, **kwargs):
            log.entry()["tileiras_runs"] += 1
            return cubin(*args, **kwargs)

        _execution.kernel._compile = counted_compile
        _compile.cache_lookup, _compile.compile_cubin = counted_lookup, counted_cubin
        self.installed = True

    def entry(self) -> dict[str, Any]:
        if self.phase not in self.phases:
            detail = [] if self.phase.endswith("request") else None
            self.phases[self.phase] = {"compiles": 0, "compile_s": 0.0, "cache_hits": 0, "cache_misses": 0,
                                       "tileiras_runs": 0, "detail": detail}  # fmt: skip
        return self.phases[self.phase]

    def report(self) -> dict[str, Any]:
        return {phase: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in entry.items()}
                for phase, entry in self.phases.items()}  # fmt: skip


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


def _profiled(run, rows: int) -> tuple[float, dict[str, list[str]]]:
    """``run()``'s result under cProfile, and the ``rows`` functions of most cumulative and of most own time, each
    as ``"seconds calls file:line(function)"``."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    result = profile.runcall(run)
    stats = pstats.Stats(profile)
    top: dict[str, list[str]] = {}
    for key, column in (("cumulative", 3), ("own", 2)):
        order = sorted(stats.stats.items(), key=lambda item: item[1][column], reverse=True)[:rows]
        top[key] = [f"{v[column]:.4f} {v[1]} {f}:{line}({name})" for (f, line, name), v in order]
    return result, top


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One scenario in this process: build, patch, (precompile), two requests; returns the measurements."""
    start = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    jit = _JitLog()

    import tilegemm
    from tilegemm.backend.selector import cutile_unavailable_reason
    from tilegemm.transformers import apply_tilegemm_to_model, presets

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
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
        jit.phase = "precompile"
        begin = time.perf_counter()
        lengths = (8, args.prompt_tokens) if args.warm_prompt else None
        times = tilegemm.precompile(
            model, max_tokens=args.max_tokens, workers=args.workers, generate=not args.no_generate,
            prompt_lengths=lengths,
        )  # fmt: skip
        result["precompile_s"] = time.perf_counter() - begin
        result["precompile_forward_s"] = {str(t): round(s, 4) for t, s in times.items()}
    jit.phase = "first_request"
    if args.profile:
        result["first_request_s"], result["first_request_profile"] = _profiled(
            lambda: _request(model, ids, args.new_tokens), args.profile
        )
    else:
        result["first_request_s"] = _request(model, ids, args.new_tokens)
    jit.phase = "second_request"
    result["second_request_s"] = _request(model, ids, args.new_tokens)
    result["jit_instrumented"] = jit.installed
    result["jit"] = jit.report()
    return result


def _cache_files(dirs: dict[str, str]) -> dict[str, int]:
    return {env: sum(len(files) for _, _, files in os.walk(path)) for env, path in dirs.items()}


def _cutile_entries(path: str) -> int | None:
    """Rows of cuTile's cache database in ``path`` (one per compiled kernel), ``None`` if there is none."""
    import sqlite3

    db = os.path.join(path, "cache.db")
    if not os.path.exists(db):
        return None
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT COUNT(*) FROM cache").fetchone()[0]


def _table(scenarios: dict[str, Any]) -> str:
    """The scenarios as a text table: seconds and the JIT's compiles / tileiras runs per phase."""
    head = f"{'scenario':<16} {'precompile s':>12} {'1st req s':>9} {'2nd req s':>9} {'pre jit':>9} {'1st jit':>9}"
    lines = [head, "-" * len(head)]
    for name, row in scenarios.items():
        if "first_request_s" not in row:
            lines.append(f"{name:<16} {row.get('skipped') or 'error (see JSON)'}")
            continue
        jit = row.get("jit", {})
        counts = {phase: f"{e['compiles']}/{e['tileiras_runs']}" for phase, e in jit.items()}
        pre = f"{row['precompile_s']:.2f}" if "precompile_s" in row else "-"
        lines.append(f"{name:<16} {pre:>12} {row['first_request_s']:>9.3f} {row['second_request_s']:>9.3f} "
                     f"{counts.get('precompile', '0/0'):>9} {counts.get('first_request', '0/0'):>9}")  # fmt: skip
    lines.append("jit: kernels compiled in the process / tileiras runs among them")
    return "\n".join(lines)


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
    common += ["--workers", str(args.workers)] if args.workers else []
    common += ["--no-generate"] if args.no_generate else []
    common += ["--warm-prompt"] if args.warm_prompt else []
    common += ["--profile", str(args.profile)] if args.profile else []
    common += ["--no-cudnn-attention"] if args.no_cudnn_attention else []
    chosen = args.scenarios.split(",") if args.scenarios else [name for name, _, _ in SCENARIOS]
    unknown = set(chosen) - {name for name, _, _ in SCENARIOS}
    if unknown:
        raise SystemExit(f"--scenarios: unknown {sorted(unknown)}; choose from {[n for n, _, _ in SCENARIOS]}")
    scenarios: dict[str, Any] = {}
    for name, cache, precompile in (s for s in SCENARIOS if s[0] in chosen):
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
            timeout = min(left, args.scenario_timeout)
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            scenarios[name] = {"skipped": f"ran past its {timeout:.0f} s ({left:.0f} s of the budget left then)"}
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            scenarios[name] = {"error": done.stderr[-4000:], "returncode": done.returncode}
            continue
        scenarios[name] = {**json.loads(lines[-1][len("RESULT ") :]), "process_s": time.perf_counter() - begin}
        scenarios[name]["cache_files_after"] = _cache_files(dirs[cache])
        scenarios[name]["cutile_cache_entries_after"] = _cutile_entries(dirs[cache]["CUDA_TILE_CACHE_DIR"])
        print(f"{name}: {json.dumps(scenarios[name])}", flush=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": args.model,
        "layers": args.layers,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "max_tokens": args.max_tokens,
        "workers": args.workers,
        "generate": not args.no_generate,
        "cudnn_attention": not args.no_cudnn_attention,
        "precompile_prompt_lengths": [8, args.prompt_tokens] if args.warm_prompt else None,
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
    print(_table(scenarios), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
