"""The multi-GPU checks of the MoE harness in one command: correctness and speed at several world sizes, each piece
under a timeout, the whole within a time budget; results under ``--out`` (at most 4 files) and a short table last.

Parts (``--part``):

* ``correctness``: DeepSeek-V3 at batch 32, sharded vs one device (``route_check.py``): fp32 (4 layers: one MoE
  layer) and bf16 (5 layers, batch 1 and 32), TP and EP at each world size > 1, with the routing flips and the
  logits grouped by them; then stock and patched bf16 against float64 (``f64_check.py``), DeepSeek-V3 (4 layers)
  and Qwen3-30B-A3B (4 layers).
* ``speed``: ``dist_check.py --cuda-graphs --step-times`` at each world size: the ``--models`` (default Qwen3-30B-A3B
  48 layers and DeepSeek-V3 5 layers, what one GPU holds), batch 1 and 32, stock / patched (BF16 experts + RMSNorm)
  / fp8 (FP8 experts + RMSNorm) in the same static-cache CUDA-graph loop, each rank's decode step with and without
  the experts; world size 1 first (it saves the one-device reference the sharded runs compare with); then the
  ``--deep`` preset (DeepSeek-V3 12 layers, first 3 dense) at each world size > 1, largest first (a world size where
  it does not fit is a row that says so).
* ``all``: both, correctness first.

Pieces run in order until the budget is spent; a piece that would start with less than its minimum left is listed
as not run. Each piece is a ``torchrun`` (or plain) process group killed at its timeout. ``--dry-run`` runs the
same pieces on the CPU (gloo) with the tiny DeepSeek-V3 preset and a few tokens.

    bash modeling/transformers/dist_suite.sh --out $OUT --part correctness --world-sizes 2,4
    bash modeling/transformers/dist_suite.sh --out $OUT --part speed --world-sizes 1,2,4
    bash modeling/transformers/dist_suite.sh --out /tmp/s --dry-run --world-sizes 1,4
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HARNESS = "modeling/transformers"


@dataclass
class Piece:
    """One command of the suite: ``argv`` (a script and its options), ``nproc`` ranks (``torchrun`` when > 1 or
    ``launcher``), a timeout and the least time worth starting it with; its JSON result file."""

    name: str
    argv: list[str]
    nproc: int = 1
    timeout: float = 120.0
    minimum: float = 30.0
    result: str = ""
    launcher: bool = False
    outcome: dict[str, Any] = field(default_factory=dict)

    def command(self, python: str) -> list[str]:
        """The full command line."""
        if self.nproc > 1 or self.launcher:
            return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.nproc),
                    *self.argv]  # fmt: skip
        return [python, *self.argv]


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="modeling/transformers/dist_suite.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results directory ($OUT)")
    p.add_argument("--part", choices=["correctness", "speed", "all"], default="all")
    p.add_argument("--world-sizes", type=_ints, default=[1, 2, 4], help="comma-separated rank counts")
    p.add_argument("--models", default=None, help="speed: NAME:LAYERS,... (default qwen3-30b-a3b:48,deepseek-v3:5)")
    p.add_argument("--deep", default=None, help="speed: the deeper preset NAME:LAYERS (default deepseek-v3:12)")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--impls", default="stock,patched,fp8")
    p.add_argument("--backend", default="auto", help="speed: tilegemm backend of the patched rows (dist_check)")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for every piece together")
    p.add_argument("--only", default="", help="comma-separated piece names to run (default: all of the part)")
    p.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny DeepSeek-V3, few tokens")
    p.add_argument("--list", action="store_true", help="print the pieces and their commands, run nothing")
    p.add_argument("--work", default=os.environ.get("DIST_SUITE_WORK", "/tmp/dist_suite_work"),
                   help="scratch directory of the pieces (emptied first)")  # fmt: skip
    return p


def pieces(args, work: Path) -> list[Piece]:
    """The pieces of ``args.part`` in run order."""
    dry = args.dry_run
    device = ["--device", "cpu"] if dry else []
    sharded = sorted((w for w in args.world_sizes if w > 1), reverse=True)
    out: list[Piece] = []
    if args.part in ("correctness", "all"):
        fp32_layers = 4  # one MoE layer (the first 3 are dense); 5 ran out of memory on a 141 GB H200
        model = "tiny-deepseek-v3" if dry else "deepseek-v3"
        tokens = ["--prompt-tokens", "16", "--new-tokens", "4"] if dry else []
        for w in sharded:
            name = f"routes_fp32_w{w}"
            layers = [] if dry else ["--layers", str(fp32_layers)]
            argv = [f"{HARNESS}/route_check.py", "--model", model, *layers, "--dtypes", "fp32", "--batch-size", "32",
                    *(tokens or ["--prompt-tokens", "64", "--new-tokens", "8"]),
                    "--out", str(work / name), *device]  # fmt: skip
            out.append(Piece(name, argv, w, 180, 60, str(work / name / "route_check.json")))
            name = f"routes_bf16_w{w}"
            layers = [] if dry else ["--layers", "5"]
            argv = [f"{HARNESS}/route_check.py", "--model", model, *layers, "--dtypes", "bf16", "--batch-size", "1,32",
                    *(tokens or ["--prompt-tokens", "128", "--new-tokens", "16"]), "--impls", "stock,patched,fp8",
                    "--out", str(work / name), *device]  # fmt: skip
            out.append(Piece(name, argv, w, 150, 50, str(work / name / "route_check.json")))
        for name, preset, prompt in (("f64_dsv3", "deepseek-v3", "256"), ("f64_qwen3", "qwen3-30b-a3b", "512")):
            tiny = "tiny-deepseek-v3" if "dsv3" in name else "tiny-qwen3-moe"
            preset, layers, prompt = (tiny, "3" if "dsv3" in name else "2", "12") if dry else (preset, "4", prompt)
            argv = [f"{HARNESS}/f64_check.py", "--model", preset, "--layers", layers, "--prompt", prompt, "--seeds",
                    "0", "--impls", "patched,fp8", "--out", str(work / name / "f64.json"), *device]  # fmt: skip
            out.append(Piece(name, argv, 1, 240 if "dsv3" in name else 120, 60, str(work / name / "f64.json")))
        # interleave: every first-priority piece (largest world size, then f64 of DeepSeek-V3) before the rest
        order = [p for p in out if p.name.endswith(f"_w{sharded[0]}")] if sharded else []
        order += [p for p in out if p.name == "f64_dsv3"]
        order += [p for p in out if p not in order]
        out = order
    if args.part in ("speed", "all"):
        models = args.models or ("tiny-deepseek-v3" if dry else "qwen3-30b-a3b:48,deepseek-v3:5")
        deep = args.deep or ("tiny-deepseek-v3:4" if dry else "deepseek-v3:12")
        tokens = ["--prompt-tokens", "8", "--new-tokens", "4", "--repeats", "1"] if dry else [
            "--prompt-tokens", "256", "--new-tokens", "16", "--repeats", "2"]  # fmt: skip
        ref = work / "reference"
        common = ["--batch-size", args.batch_sizes, "--impls", args.impls, "--backend", args.backend, "--cuda-graphs",
                  "--step-times", *tokens, *device]  # fmt: skip
        for w in sorted(args.world_sizes):
            name = f"speed_w{w}"
            skip = ["--skip-1dev"] if w > 1 and 1 in args.world_sizes else []
            argv = [f"{HARNESS}/dist_check.py", "--model", models, *common, "--reference-dir", str(ref), *skip,
                    "--out", str(work / name)]  # fmt: skip
            out.append(Piece(name, argv, w, 240, 60, str(work / name / "dist_check.json"), launcher=True))
        for w in sharded:  # largest first: where the deeper preset fits for sure
            name = f"deep_w{w}"
            argv = [f"{HARNESS}/dist_check.py", "--model", deep, *common, "--skip-1dev", "--out", str(work / name)]
            out.append(Piece(name, argv, w, 180, 60, str(work / name / "dist_check.json")))
    if args.only:
        wanted = {v for v in args.only.split(",") if v}
        out = [p for p in out if p.name in wanted]
    return out


def run_piece(piece: Piece, python: str, env: dict[str, str], timeout: float, log) -> None:
    """Run ``piece`` in its own process group, killed after ``timeout`` seconds; fills ``piece.outcome``."""
    cmd = piece.command(python)
    log.write(f"\n===== {piece.name}: {shlex.join(cmd)} (timeout {timeout:.0f} s)\n")
    log.flush()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                output, _ = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                output = ""
        status = f"timed out after {timeout:.0f} s"
    seconds = time.monotonic() - start
    log.write(output or "")
    log.write(f"===== {piece.name}: {status}, {seconds:.0f} s\n")
    log.flush()
    result = None
    if piece.result and Path(piece.result).exists():
        result = json.loads(Path(piece.result).read_text())
    tail = "\n".join((output or "").strip().splitlines()[-8:]) if status != "ok" else ""
    piece.outcome = {"status": status, "seconds": seconds, "command": shlex.join(cmd), "result": result, "tail": tail}


# ---------------------------------------------------------------- summaries (the short tables printed last)


def _f(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def _group(g: dict[str, Any] | None) -> str:
    if not g or not g.get("positions"):
        return "0"
    return f"{g['positions']}: {g['calc_diff']:.1e}"


def routes_summary(result: dict[str, Any]) -> list[str]:
    """One line per route_check row."""
    lines = []
    for r in result["rows"]:
        head = f"| {r['model']} {r['layers']}L {r['dtype']} | {r.get('batch', '-')} | {r['layout']} | {r['impl']} |"
        if "routing" not in r:
            lines.append(f"{head} {r.get('skipped') or r.get('error')} | | | | | |")
            continue
        rt = r["routing"]
        same = "-" if "tokens_identical" not in r else ("yes" if r["tokens_identical"] else "NO")
        lines.append(f"{head} {r['calc_diff']:.1e} | {r['max_logit_diff']:.2e} | {same} | "
                     f"{rt['flipped_tokens']}/{rt['tokens']} | {_group(rt['no_flip_upstream'])} | "
                     f"{_group(rt['flip_upstream'])} |")  # fmt: skip
    return lines


def speed_summary(results: list[dict[str, Any]]) -> list[str]:
    """One line per (model, batch, layout): decode tok/s of stock and each patch (x stock, x the one-device row of the
    same impl), prefill x stock, calc_diff, the decode step and the step without experts (slowest rank), and the
    bound the rest sets on the patched speedup (stock step / patched step without experts)."""
    rows = [r for res in results for r in res["rows"]]
    one_dev = {(r["model"], r["layers"], r.get("batch"), r["impl"]): r for r in rows if r["layout"] == "1dev"}
    keys: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        keys.setdefault((r["model"], r["layers"], r.get("batch"), r["layout"]), {})[r["impl"]] = r
    lines = []
    for (model, layers, batch, layout), impls in keys.items():
        if "-" in impls:  # the whole layout was skipped
            lines.append(f"| {model} {layers}L | - | {layout} | skipped: {impls['-'].get('skipped')} |")
            continue
        stock = impls.get("stock", {})
        cells = []
        for impl in ("stock", "patched", "fp8"):
            r = impls.get(impl)
            if r is None or "decode_tok_s" not in r:
                note = "" if r is None else ("skip" if "skipped" in r else "error")
                cells.append(note or "-")
                continue
            base = stock.get("decode_tok_s")
            one = one_dev.get((model, layers, batch, impl), {}).get("decode_tok_s")
            x = f" {r['decode_tok_s'] / base:.2f}x" if impl != "stock" and base else ""
            scale = f" ({r['decode_tok_s'] / one:.2f}x 1dev)" if one and layout != "1dev" else ""
            cells.append(f"{r['decode_tok_s']:,.0f}{x}{scale}")
        patched = impls.get("patched", {})
        prefill = (patched.get("prefill_tok_s") or 0) / stock["prefill_tok_s"] if stock.get("prefill_tok_s") else None
        steps = " / ".join(
            f"{impls[i]['graph_step_ms']:.2f}, {impls[i]['no_experts_step_ms']:.2f}"
            for i in ("stock", "patched") if "graph_step_ms" in impls.get(i, {})
        )  # fmt: skip
        rest = patched.get("no_experts_step_ms")
        bound = stock["graph_step_ms"] / rest if rest and "graph_step_ms" in stock else None
        lines.append(
            f"| {model} {layers}L | {batch} | {layout} | {' | '.join(cells)} | {_f(prefill, '.2f')} | "
            f"{_f(stock.get('calc_diff'), '.1e')} / {_f(patched.get('calc_diff'), '.1e')} | "
            f"{_f(patched.get('vs_layout_stock_calc_diff'), '.1e')} | {steps or '-'} | {_f(bound, '.2f')} |"
        )
    return lines


def f64_summary(name: str, result: dict[str, Any]) -> list[str]:
    """One line per f64_check run."""
    lines = []
    for key, r in result.items():
        vals = " | ".join(f"{_f(r.get(f'{i}_vs_f64'), '.2e')} ({_f(r.get(f'{i}_vs_stock'), '.1e')})"
                          for i in ("patched", "fp8"))  # fmt: skip
        lines.append(f"| {key} | {r['f64_device']} | {r['stock_vs_f64']:.2e} | {vals} |")
    return lines


def summary(done: list[Piece], skipped: list[tuple[str, str]]) -> str:
    """The short tables printed last: pieces, routing, float64, speed."""
    lines = ["## dist_suite", "", "| piece | status | s |", "|---|---|---|"]
    lines += [f"| {p.name} | {p.outcome['status']} | {p.outcome['seconds']:.0f} |" for p in done]
    lines += [f"| {name} | not run: {why} | |" for name, why in skipped]
    routes = [p for p in done if p.name.startswith("routes") and p.outcome.get("result")]
    if routes:
        lines += ["", "| model dtype | batch | layout | impl | calc_diff vs 1dev stock | max dlogit | tokens = | "
                  "flipped tokens | no flip upstream: n: calc_diff | flip upstream: n: calc_diff |",
                  "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for p in routes:
            lines += routes_summary(p.outcome["result"])
    f64 = [p for p in done if p.name.startswith("f64") and p.outcome.get("result")]
    if f64:
        lines += ["", "| f64 run | f64 on | stock vs f64 | patched vs f64 (vs stock) | fp8 vs f64 (vs stock) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for p in f64:
            lines += f64_summary(p.name, p.outcome["result"])
    speed = [p.outcome["result"] for p in done if p.name.startswith(("speed", "deep")) and p.outcome.get("result")]
    if speed:
        lines += ["", "| model | batch | layout | stock tok/s | patched tok/s (x stock) | fp8 tok/s (x stock) | "
                  "prefill patched x stock | calc_diff vs 1dev stock: stock / patched | patched vs layout stock | "
                  "step ms, w/o experts: stock / patched | bound: stock step / patched rest |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        lines += speed_summary(speed)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 when every piece that ran succeeded."""
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    work = Path(args.work)
    todo = pieces(args, work)
    python = sys.executable
    if args.list:
        for p in todo:
            print(f"{p.name} (timeout {p.timeout:.0f} s): {shlex.join(p.command(python))}")
        return 0
    marker = work / ".dist_suite_work"
    if work.exists() and any(work.iterdir()) and not marker.exists():
        raise SystemExit(f"--work {work}: not empty and not a dist_suite scratch directory; choose another")
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)  # no stale result or reference of an earlier run is read as this run's
    work.mkdir(parents=True)
    marker.touch()
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if args.dry_run:
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    deadline = time.monotonic() + args.budget
    done, skipped = [], []
    with open(out / "suite.log", "w") as log:
        for piece in todo:
            left = deadline - time.monotonic()
            if left < piece.minimum:
                skipped.append((piece.name, f"{left:.0f} s of the budget left, needs {piece.minimum:.0f}"))
                continue
            print(f"[dist_suite {time.strftime('%H:%M:%S')}] {piece.name} (up to {min(piece.timeout, left):.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
            run_piece(piece, python, env, min(piece.timeout, left), log)
            done.append(piece)
            if piece.outcome["tail"]:
                print(piece.outcome["tail"], file=sys.stderr, flush=True)
    report = {
        "args": {k: v for k, v in vars(args).items()},
        "pieces": [{"name": p.name, **p.outcome} for p in done],
        "not_run": [{"name": n, "why": w} for n, w in skipped],
    }
    (out / "suite.json").write_text(json.dumps(report, indent=1, default=str))
    tables = []
    for p in done:
        for md in sorted(Path(p.result).parent.glob("*.md")) if p.result else []:
            tables.append(f"## {p.name}\n\n{md.read_text()}")
    text = summary(done, skipped)
    (out / "suite.md").write_text("\n".join(tables) + "\n" + text)
    print(text, flush=True)
    return 0 if all(p.outcome["status"] == "ok" for p in done) else 1


if __name__ == "__main__":
    sys.exit(main())
