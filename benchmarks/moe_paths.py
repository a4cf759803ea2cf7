"""Fused experts paths, each forced, beside transformers' ``grouped_mm`` experts forward on one GPU.

For each model's full-size experts (one layer's weights; ``tilegemm.bench.moe.MODELS``) and token count, times
``tilegemm.moe_experts`` with ``TILEGEMM_MOE_VARIANT`` set to each path, and transformers'
``grouped_mm_experts_forward`` on a stock experts module holding the same weights: eager (a loop of calls) and
kernel-only (median of 5 replays of a CUDA graph of 5 calls), in us. Checks each output against the float64
formula (``calc_diff``) and each tilegemm output against a rerun (bitwise). Prints one markdown table.

    PYTHONPATH=src python3 benchmarks/moe_paths.py [--paths slots,blocks,sorted] [--budget-s 170]

The path ``unfused`` is tilegemm's unfused transformers experts forward (routing, two m-grouped GEMMs, the
activation and the combine as separate steps) on the stock module. A path ``blocks:w<BW>k<BK>[t<BT>]`` runs the
block kernels with other tiles than the default (``BW`` weight rows, ``BK`` of K per step, row tiles of at least
``BT``), a path ``sorted:u<BN>[k<BK>][w<W>]d<BN>[k<BK>][w<W>]`` the sorted path with 128-row gate/up and down
tiles of those column widths, K steps (default 64) and worker warps (default 8; ``w0``: the compiler's choice):
design sweeps, labelled as such in the table.

Results: ``benchmarks/results/moe/paths_h100.md``. The path the heuristics take is
``tilegemm.heuristics.cutile.moe.moe_decode_sized`` / ``moe_blocks_sized``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import statistics
import sys
import time

import torch

TOKENS = {
    "deepseek-v3": (1, 8, 16, 32, 64, 128, 256),
    "qwen3-30b-a3b": (1, 8, 16, 32, 64, 128, 256, 512),
    "mixtral-8x7b": (1, 2, 4, 8, 16, 64, 256),
}
_BLOCKS_TILES = re.compile(r"blocks:w(\d+)k(\d+)(?:t(\d+))?")
_SORTED_TILES = re.compile(r"sorted:u(\d+)(?:k(\d+))?(?:w(\d+))?d(\d+)(?:k(\d+))?(?:w(\d+))?")


@contextlib.contextmanager
def _forced(path: str):
    """``TILEGEMM_MOE_VARIANT`` set to ``path`` for the block (``blocks:...``: the block kernels with those tiles;
    ``sorted:u<BN>[k<BK>][w<W>]d<BN>[k<BK>][w<W>]``: the sorted path's 128-row gate/up and down tiles)."""
    from tilegemm.heuristics import cutile as heuristics

    saved = heuristics.moe.moe_blocks_config, heuristics.moe.MOE_BLOCKS_MIN_BT
    saved_sorted = dict(heuristics.MOE_UP_CONFIGS), dict(heuristics.MOE_DOWN_CONFIGS)
    tiles = _BLOCKS_TILES.fullmatch(path)
    sorted_tiles = _SORTED_TILES.fullmatch(path)
    if tiles:
        bw, bk, bt = tiles.groups()
        heuristics.moe.moe_blocks_config = functools.partial(saved[0], bw=int(bw), bk=int(bk))
        heuristics.moe.MOE_BLOCKS_MIN_BT = int(bt or saved[1])
    if sorted_tiles:
        up_bn, up_bk, up_w, down_bn, down_bk, down_w = sorted_tiles.groups()
        heuristics.MOE_UP_CONFIGS[128] = _sorted_tile(up_bn, up_bk, up_w)
        heuristics.MOE_DOWN_CONFIGS[128] = _sorted_tile(down_bn, down_bk, down_w)
    os.environ[heuristics.MOE_VARIANT_ENV] = "blocks" if tiles else "sorted" if sorted_tiles else path
    try:
        yield
    finally:
        del os.environ[heuristics.MOE_VARIANT_ENV]
        heuristics.moe.moe_blocks_config, heuristics.moe.MOE_BLOCKS_MIN_BT = saved
        heuristics.MOE_UP_CONFIGS.update(saved_sorted[0])
        heuristics.MOE_DOWN_CONFIGS.update(saved_sorted[1])


def _sorted_tile(bn: str, bk: str | None, warps: str | None):
    """A 128-row sorted-path tile from a ``sorted:`` spec's fields (K step 64 and 8 warps unless given)."""
    from tilegemm.heuristics import cutile as heuristics

    w = 8 if warps is None else int(warps)
    return heuristics.TileConfig(128, int(bn), int(bk or 64), num_worker_warps=w or None)


def _times_us(fn, calls: int = 20) -> tuple[float, float]:
    """(eager us per call over a loop of ``calls``, kernel-only us: median of 5 replays of a 5-call graph)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    eager = (time.perf_counter() - start) / calls * 1e6
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(5):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    replays = []
    for _ in range(5):
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        replays.append((time.perf_counter() - start) / 5 * 1e6)
    return eager, statistics.median(replays)


def _model_rows(model: str, tokens: tuple[int, ...], paths: list[str], deadline: float) -> list[tuple]:
    from transformers.integrations import moe as hf_moe

    import tilegemm
    from tilegemm.bench import moe as bench_moe
    from tilegemm.transformers.experts import unfused_experts_forward

    h, e, k, i, model_type = bench_moe.MODELS[model]
    torch.manual_seed(0)
    w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) / math.sqrt(h)
    w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) / math.sqrt(i)
    module = bench_moe.experts_module(model_type, w13, w2)
    rows = []
    for t in tokens:
        if time.time() > deadline:
            print(f"budget spent: skipping {model} {t}", flush=True)
            continue
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        ids, weights = bench_moe._routing(t, e, k, 1234 + t)
        ref = bench_moe._reference(x, ids, weights, w13, w2)
        args = (x, ids, weights)
        with torch.inference_mode():
            stock = lambda a=args: hf_moe.grouped_mm_experts_forward(module, *a)  # noqa: E731
            rows.append((model, t, "stock grouped_mm", *_times_us(stock), tilegemm.calc_diff(stock(), ref), None))
            for path in paths:
                if path == "unfused":  # tilegemm's unfused transformers experts forward on the same module
                    unfused = lambda a=args: unfused_experts_forward(module, *a)  # noqa: E731
                    first, again = unfused(), unfused()
                    timed = _times_us(unfused)
                    rows.append((model, t, path, *timed, tilegemm.calc_diff(first, ref), torch.equal(first, again)))
                    continue
                with _forced(path):
                    fused = lambda a=args: tilegemm.moe_experts(*a, w13, w2)  # noqa: E731
                    first, again = fused(), fused()
                    timed = _times_us(fused)
                    rows.append((model, t, path, *timed, tilegemm.calc_diff(first, ref), torch.equal(first, again)))
        print(model, t, [f"{r[2]} {r[4]:.0f}" for r in rows if r[1] == t], flush=True)
    return rows


def run(
    paths: list[str], budget_s: float, tokens: tuple[int, ...] | None = None, models: list[str] | None = None
) -> list[tuple]:
    """Rows ``(model, tokens, path, eager us, graph us, calc_diff, bitwise rerun)``, one model's weights at a time
    (``tokens``: these token counts for every model instead of :data:`TOKENS`; ``models``: these of its keys)."""
    deadline, rows = time.time() + budget_s, []
    for model, default in TOKENS.items():
        if models and model not in models:
            continue
        rows += _model_rows(model, tokens or default, paths, deadline)
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    paths_help = "TILEGEMM_MOE_VARIANT values (or blocks:w64k128t16, sorted:u128d256), comma-separated"
    p.add_argument("--paths", default="slots,blocks,sorted", help=paths_help)
    p.add_argument("--budget-s", type=float, default=170.0, help="start no new token count after this many seconds")
    p.add_argument("--tokens", default=None, help="token counts for every model, comma-separated (default: TOKENS)")
    p.add_argument("--models", default=None, help=f"models, comma-separated (default: all of {', '.join(TOKENS)})")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    tokens = tuple(int(v) for v in args.tokens.split(",")) if args.tokens else None
    models = args.models.split(",") if args.models else None
    rows = run([v.strip() for v in args.paths.split(",") if v.strip()], args.budget_s, tokens, models)
    print("\n| model | T | path | eager us | graph us | calc_diff vs f64 | bitwise rerun |")
    print("|---|---|---|---|---|---|---|")
    for model, t, path, eager, graph, diff, same in rows:
        print(f"| {model} | {t} | {path} | {eager:.1f} | {graph:.1f} | {diff:.1e} | {'-' if same is None else same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
