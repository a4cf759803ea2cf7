"""Benchmark of the cutile FP8 MQA-logits ops against the pytorch reference, in the same run.

Issue 6's shapes: plain ``fp8_mqa_logits`` with S in {2048, 8192}, S_kv in {8192, 65536}, H in
{32, 64}, D = 128, causal (queries are the last S of S_kv tokens) and full windows; paged
``fp8_paged_mqa_logits`` with B in {64, 256}, next_n in {1, 2}, average context 8192 and 32768
(lengths uniform in [avg/2, 3avg/2]), H = 64, D = 128, block_kv = 64.

Reported: median time (``triton.testing.do_bench``), TFLOP/s over the valid pairs
(``2 * pairs * H * D / t``), GB/s (plain: all bytes moved; paged: the KV-cache bytes counted
once, and their fraction of the measured device copy bandwidth), the ratio to the reference,
and calc_diff between the two on the valid logits. Value checks are not involved (the ops'
checks are skipped with ``TILEGEMM_CHECK_VALUES=0``). The timed op includes allocating the
``-inf``-filled output, as a caller sees it; the paged schedule is computed once outside.

Usage: ``python tests/benchmark/bench_mqa.py [--out DIR] [--quick] [--explore] [--no-ref]``.
Results: ``DIR/mqa_<gpu>.json`` and ``.md`` (default ``tests/benchmark/results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("TILEGEMM_CHECK_VALUES", "0")
os.environ.setdefault("TILEGEMM_DISABLE_FALLBACK", "1")

from tilegemm import indexer  # noqa: E402
from tilegemm.ops import api  # noqa: E402
from tilegemm.testing import calc_diff  # noqa: E402


def _bench(fn, warmup_ms: float = 50, rep_ms: float = 200) -> float:
    """Median milliseconds of ``fn`` (triton's do_bench: L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (read + write bytes / time) of a ``nbytes`` buffer."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def _gpu_tag() -> str:
    name = torch.cuda.get_device_name(0).lower()
    for tag in ("h100", "h200", "b200", "a100"):
        if tag in name:
            return tag
    return name.replace(" ", "_")


def plain_case(s: int, s_kv: int, h: int, d: int, window: str, ref: bool, variants: dict | None = None) -> list[dict]:
    """Time one plain shape on cutile (and optional kernel variants) and on the reference."""
    g = torch.Generator(device="cuda").manual_seed(s + s_kv + h)
    q = torch.randn(s, h, d, device="cuda", generator=g).to(torch.float8_e4m3fn)
    kv = indexer.quantize_keys(torch.randn(s_kv, d, device="cuda", generator=g))
    w = torch.randn(s, h, device="cuda", generator=g)
    if window == "causal":
        ks, ke = indexer.causal_windows(s, s_kv, device="cuda")
    else:
        ks = torch.zeros(s, dtype=torch.int32, device="cuda")
        ke = torch.full((s,), s_kv, dtype=torch.int32, device="cuda")
    pairs = int((ke - ks).sum())
    flops = 2 * pairs * h * d
    nbytes = q.numel() + kv[0].numel() + 4 * (s_kv + w.numel() + 2 * s) + 4 * s * s_kv
    shape = {"S": s, "S_kv": s_kv, "H": h, "D": d, "window": window, "pairs": pairs}

    def run_cutile():
        return api.fp8_mqa_logits(q, kv, w, ks, ke, backend="cutile")

    out = run_cutile()
    t_cu = _bench(run_cutile)
    rows = []
    peer_ms, diff = None, None
    if ref:
        ref_out = api.fp8_mqa_logits(q, kv, w, ks, ke, backend="pytorch")
        fin = torch.isfinite(ref_out)
        diff = calc_diff(out[fin], ref_out[fin])
        same_mask = bool(torch.equal(torch.isneginf(out), torch.isneginf(ref_out)))
        del ref_out
        peer_ms = _bench(lambda: api.fp8_mqa_logits(q, kv, w, ks, ke, backend="pytorch"), 10, 50)
    else:
        same_mask = None
    del out
    base = {"op": "fp8_mqa_logits", "dtype": "fp8_e4m3", "layout": "mqa", "shape": shape}
    from tilegemm.ops.cutile import mqa

    default = mqa.mqa_logits_config(h, d).__dict__
    extra = {"same_inf_mask": same_mask, "config": default}
    rows.append(_row(base, "cutile", t_cu, flops, nbytes, peer_ms, diff, extra=extra))

    if variants:  # the kernel alone: no -inf fill of the output
        t_raw = _bench(lambda: api.fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False, backend="cutile"))
        rows.append(_row(base, "cutile[clean_logits=False]", t_raw, flops, nbytes, peer_ms, None, {"config": default}))
    for name, over in (variants or {}).items():
        conf = mqa.MqaConfig(**{**mqa.mqa_logits_config(h, d).__dict__, **over})

        def run_var(conf=conf):
            o = torch.full((s, s_kv), float("-inf"), device="cuda")
            mqa.launch_mqa_logits(q, kv[0], kv[1], w, ks, ke, o, conf)
            return o

        rows += _variant_row(base, name, conf, run_var, run_cutile, flops, nbytes, peer_ms)
    return rows


def paged_case(
    batch: int, next_n: int, avg: int, ref: bool, variants: dict | None = None, num_sms: int = 0
) -> list[dict]:
    """Time one paged decode shape (H=64, D=128, block_kv=64)."""
    h, d, block_kv = 64, 128, 64
    g = torch.Generator(device="cuda").manual_seed(batch * 31 + avg + next_n)
    lens = torch.randint(avg // 2, avg * 3 // 2 + 1, (batch,), device="cuda", generator=g, dtype=torch.int32)
    per_seq = (lens + block_kv - 1) // block_kv
    max_blocks = int(per_seq.max())
    num_blocks = int(per_seq.sum())
    # a shuffled cache filled directly in DeepGEMM's byte layout (random keys, positive scales)
    cache = torch.empty(num_blocks, block_kv * (d + 4), dtype=torch.uint8, device="cuda")
    keys = torch.randn(num_blocks, block_kv * d, device="cuda", generator=g).to(torch.float8_e4m3fn)
    cache[:, : block_kv * d] = keys.view(torch.uint8)
    scales = torch.rand(num_blocks, block_kv, device="cuda", generator=g) * 0.01 + 0.001
    cache[:, block_kv * d :] = scales.view(torch.uint8)
    cache = cache.view(num_blocks, block_kv, 1, d + 4)
    perm = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
    table = torch.zeros(batch, max_blocks, dtype=torch.int32, device="cuda")
    starts = torch.cumsum(per_seq, 0) - per_seq
    cols = torch.arange(max_blocks, device="cuda")
    used = cols[None, :] < per_seq[:, None]
    table[used] = perm[(starts[:, None] + cols[None, :])[used].long()]
    q = torch.randn(batch, next_n, h, d, device="cuda", generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, h, device="cuda", generator=g)
    width = int(lens.max())
    sms = num_sms or torch.cuda.get_device_properties(0).multi_processor_count
    meta = api.get_paged_mqa_logits_metadata(lens, block_kv, sms, backend="cutile")
    t_meta = _bench(lambda: api.get_paged_mqa_logits_metadata(lens, block_kv, sms, backend="cutile"))

    visible = lens[:, None].long() - next_n + torch.arange(next_n, device="cuda")[None, :] + 1
    pairs = int(visible.clamp_min(0).sum())
    flops = 2 * pairs * h * d
    kv_bytes = int(lens.long().sum()) * (d + 4)
    shape = {"B": batch, "next_n": next_n, "avg_ctx": avg, "H": h, "D": d, "block_kv": block_kv, "num_sms": sms}

    def run_cutile():
        return api.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, width, backend="cutile")

    out = run_cutile()
    t_cu = _bench(run_cutile)
    peer_ms, diff, same_mask = None, None, None
    if ref:
        ref_out = api.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, width, backend="pytorch")
        fin = torch.isfinite(ref_out)
        diff = calc_diff(out[fin], ref_out[fin])
        same_mask = bool(torch.equal(torch.isneginf(out), torch.isneginf(ref_out)))
        del ref_out
        peer_ms = _bench(
            lambda: api.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, width, backend="pytorch"), 10, 50
        )
    del out
    base = {"op": "fp8_paged_mqa_logits", "dtype": "fp8_e4m3", "layout": "paged", "shape": shape}
    from tilegemm.ops.cutile import mqa

    default = mqa.paged_mqa_config(h, d, next_n, block_kv).__dict__
    extra = {"metadata_us": t_meta * 1e3, "same_inf_mask": same_mask, "config": default}
    rows = [_row(base, "cutile", t_cu, flops, kv_bytes, peer_ms, diff, extra=extra)]

    for name, (occ, parts, ck) in (variants or {}).items():
        conf = mqa.paged_mqa_config(h, d, next_n, block_kv)
        conf = mqa.PagedMqaConfig(**{**conf.__dict__, "ck": ck, "parts": parts, "occupancy": occ})
        kernel = mqa.paged_kernel_for(occ)

        def run_var(kernel=kernel, conf=conf):
            o = torch.full((batch * next_n, width), float("-inf"), device="cuda")
            mqa.launch_paged_mqa_logits(q, cache, w, lens, table, meta, o, conf, kernel=kernel)
            return o

        rows += _variant_row(base, name, conf, run_var, run_cutile, flops, kv_bytes, peer_ms)
    return rows


def _variant_row(base, name, conf, run_var, run_default, flops, nbytes, peer_ms) -> list[dict]:
    """Time kernel variant ``name`` (its output checked against the default cutile path): one row, or none
    if it fails (reported; a variant is an experiment)."""
    try:
        out, ref = run_var(), run_default()
        fin = torch.isfinite(ref)
        diff = calc_diff(out[fin], ref[fin])
        del out, ref
        ms = _bench(run_var)
        return [_row(base, f"cutile[{name}]", ms, flops, nbytes, peer_ms, diff, {"config": conf.__dict__})]
    except Exception as exc:
        print(f"variant {name} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return []


def _row(base, backend, ms, flops, nbytes, peer_ms, diff, extra=None) -> dict:
    row = dict(base)
    row.update(
        backend=backend,
        time_us=ms * 1e3,
        tflops=flops / ms / 1e9,
        gbps=nbytes / ms / 1e6,
        peer="pytorch",
        peer_time_us=None if peer_ms is None else peer_ms * 1e3,
        peer_tflops=None if peer_ms is None else flops / peer_ms / 1e9,
        ratio=None if peer_ms is None else peer_ms / ms,
        calc_diff=diff,
        gpu=torch.cuda.get_device_name(0),
        date=datetime.date.today().isoformat(),
    )
    row.update(extra or {})
    print(json.dumps(row), flush=True)
    return row


def _table(rows: list[dict], copy_gbps: float) -> str:
    lines = [
        f"Copy bandwidth (read+write, 1 GiB): {copy_gbps:.0f} GB/s",
        "",
        "| op | shape | backend | time us | TFLOP/s | GB/s | % copy BW | ref us | ratio | calc_diff |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sh = ",".join(f"{k}={v}" for k, v in r["shape"].items() if k != "pairs")
        pct = f"{100 * r['gbps'] / copy_gbps:.0f}" if r["op"].startswith("fp8_paged") else ""
        ref_us = "" if r["peer_time_us"] is None else f"{r['peer_time_us']:.0f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.1f}x"
        diff = "" if r["calc_diff"] is None else f"{r['calc_diff']:.1e}"
        lines.append(
            f"| {r['op']} | {sh} | {r['backend']} | {r['time_us']:.1f} | {r['tflops']:.0f} | {r['gbps']:.0f} | {pct} "
            f"| {ref_us} | {ratio} | {diff} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--quick", action="store_true", help="only the target shapes")
    p.add_argument("--explore", action="store_true", help="also time kernel variants (hints) on the target shapes")
    p.add_argument("--no-ref", action="store_true", help="skip the reference (no ratios)")
    args = p.parse_args(argv)
    t0 = time.time()
    torch.manual_seed(0)
    copy_gbps = copy_bandwidth_gbps()
    print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    ref = not args.no_ref

    plain_variants, paged_variants = {}, {}
    if args.explore:
        plain_variants = {"bk64": {"bk": 64}}  # name: config override
        paged_variants = {  # name: (occupancy, parts, ck)
            f"occ{o},parts{p},ck{c}": (o, p, c)
            for o, p, c in ((2, 1, 256), (2, 2, 64), (8, 8, 64), (3, 2, 128), (4, 4, 128), (8, 4, 64))
        }

    rows: list[dict] = []
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"mqa_{_gpu_tag()}"

    def save() -> str:  # after every shape, so a cut-off run keeps what it measured
        meta = {"copy_gbps": copy_gbps, "gpu": torch.cuda.get_device_name(0), "seconds": time.time() - t0}
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        table = _table(rows, copy_gbps)
        stem.with_suffix(".md").write_text(f"# MQA logits benchmark ({meta['gpu']})\n\n{table}\n")
        return table

    if args.quick:
        plain_shapes = [(2048, 8192, 64, "causal"), (2048, 8192, 32, "causal")]
        paged_shapes = [(64, 1, 8192), (64, 2, 8192)]
    else:
        plain_shapes = [
            (s, s_kv, h, win)
            for s in (2048, 8192)
            for s_kv in (8192, 65536)
            for h in (32, 64)
            for win in ("causal", "full")
        ]
        paged_shapes = [(b, nn, avg) for b in (64, 256) for nn in (1, 2) for avg in (8192, 32768)]
    for b, nn, avg in paged_shapes:
        target = (b, avg) in ((64, 8192), (256, 32768))
        try:
            rows += paged_case(b, nn, avg, ref, paged_variants if target else None)
        except Exception as exc:
            print(f"paged {b},{nn},{avg} failed: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
        torch.cuda.empty_cache()
        save()

    for s, s_kv, h, win in plain_shapes:
        target = (s, s_kv, h, win) == (2048, 8192, 64, "causal")
        try:
            rows += plain_case(s, s_kv, h, 128, win, ref, plain_variants if target else None)
        except Exception as exc:
            print(f"plain {s},{s_kv},{h},{win} failed: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
        torch.cuda.empty_cache()
        save()
    print(save(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
