"""Benchmark result rows of ``infer.py --compare`` comparisons, in the layout of benchmarks/results.

Each comparison row of ``infer.run_one`` becomes a ``moe_prefill`` and a ``moe_decode`` row (and an
accuracy row) with the shared keys ``op, dtype, layout, shape, backend, tflops, peer, peer_tflops, ratio,
calc_diff, gpu, date``. Model throughput is tokens/s, not TFLOP/s: ``tflops``/``peer_tflops`` are ``None``
and the rates are in ``tok_s``/``peer_tok_s``.
"""

from __future__ import annotations

import datetime
from typing import Any

PREFILL_TARGET = 1.25
DECODE_TARGET = {1: 1.5}
DECODE_TARGET_DEFAULT = 1.2
FP8_CALC_DIFF_BAR = 1e-2


def benchmark_rows(row: dict[str, Any], date: str | None = None) -> list[dict[str, Any]]:
    """The benchmark rows of one ``--compare`` result row."""
    date = date or datetime.date.today().isoformat()
    stock, patched = row["stock"], row["patched"]
    base = {
        "dtype": row["dtype"] + ("+fp8" if row["fp8"] else ""),
        "layout": "psum",
        "backend": row["backend"],
        "tflops": None,
        "peer_tflops": None,
        "calc_diff": row.get("calc_diff"),
        "top1_agreement": row.get("top1_agreement"),
        "token_agreement": row.get("token_agreement"),
        "gpu": row["device"],
        "date": date,
    }
    shape = {"model": row["model"], "layers": row["layers"], "batch": row["batch"], "prompt": row["prompt_tokens"]}
    out = [
        {
            **base,
            "op": "moe_prefill",
            "shape": shape,
            "tok_s": patched["prefill_tok_s"],
            "peer": "transformers grouped_mm",
            "peer_tok_s": stock["prefill_tok_s"],
            "ratio": row["prefill_ratio"],
            "target": PREFILL_TARGET,
        },
        {
            **base,
            "op": "moe_decode",
            "shape": {**shape, "new_tokens": row["new_tokens"], "mode": patched["decode_mode"]},
            "tok_s": patched["decode_tok_s"],
            "peer": "stock model in the same decode loop (see peer_mode)",
            "peer_tok_s": stock["decode_peer_tok_s"],
            "peer_mode": stock.get("decode_peer_mode"),
            "peer_dynamic_tok_s": stock["decode_tok_s"],
            "peer_static_tok_s": stock.get("decode_static_tok_s"),
            "peer_static_error": stock.get("decode_static_error"),
            "stock_graph_tok_s": stock.get("decode_graph_tok_s"),
            "ratio": row["decode_ratio"],
            "ratio_vs_generate": row.get("decode_ratio_vs_generate"),
            "target": DECODE_TARGET.get(row["batch"], DECODE_TARGET_DEFAULT),
        },
    ]
    if row["fp8"]:
        out.append(
            {
                **base,
                "op": "moe_fp8_teacher_forced",
                "shape": {**shape, "positions": row["new_tokens"]},
                "tok_s": None,
                "peer": "bf16 stock logits",
                "peer_tok_s": None,
                "ratio": None,
                "target": FP8_CALC_DIFF_BAR,
            }
        )
    return out


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _extra(r: dict[str, Any]) -> str:
    if r["op"] != "moe_decode":
        return "-"
    static = _num(r.get("peer_static_tok_s"), ",.1f")
    if r.get("peer_static_error"):
        static = "error"
    return f"{_num(r.get('peer_dynamic_tok_s'), ',.1f')} / {static} / {_num(r.get('stock_graph_tok_s'), ',.1f')}"


def markdown(rows: list[dict[str, Any]], title: str = "MoE inference, tilegemm vs stock transformers") -> str:
    """A markdown table of benchmark rows."""
    lines = [
        f"# {title}",
        "",
        "| op | model | batch | mode | dtype | tok/s | peer tok/s | ratio | target | calc_diff | top1 | greedy "
        "| stock dyn / static / graph tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["shape"]
        target = r.get("target")
        target_text = "-" if target is None else (f"<{target:g}" if r["op"].endswith("forced") else f">={target:g}x")
        lines.append(
            f"| {r['op']} | {s['model']} ({s['layers']}L) | {s['batch']} | {s.get('mode', '-')} | {r['dtype']} | "
            f"{_num(r['tok_s'], ',.1f')} | {_num(r['peer_tok_s'], ',.1f')} | {_num(r['ratio'], '.2f')} | "
            f"{target_text} | {_num(r['calc_diff'], '.1e')} | {_num(r['top1_agreement'], '.3f')} | "
            f"{_num(r['token_agreement'], '.3f')} | {_extra(r)} |"
        )
    if rows:
        lines += [
            "",
            f"GPU: {rows[0]['gpu']}, date {rows[0]['date']}, backend {rows[0]['backend']}. Peer: transformers "
            "grouped_mm (prefill); decode peer = the stock model in the same loop: in infer.py's static-cache "
            "CUDA-graph loop when the patched model ran there ('graph'), else the faster of generate() with the "
            "dynamic cache (transformers switches to batched_mm) and with the static cache (compiled). "
            "calc_diff / top1: teacher-forced logits of the stock greedy tokens; greedy: free-running token agreement.",
        ]
    return "\n".join(lines) + "\n"
