"""Markdown of a results document: the run's machine and ceilings, one table per family, geomean ratios.

Ratios are ``peer time / tilegemm time`` (above 1: tilegemm is faster), kernel-only (CUDA graph)
unless said; a geomean only counts rows where both sides were measured and passed their bar.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from tilegemm.bench.schema import shape_label


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of the positive values (None when there are none)."""
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def peer_names(rows: list[dict[str, Any]]) -> list[str]:
    """Every peer named in ``rows``, in first-seen order."""
    names: list[str] = []
    for r in rows:
        for p in r.get("peers", {}):
            if p not in names:
                names.append(p)
    return names


def _ok(entry: dict[str, Any] | None) -> bool:
    return bool(entry) and entry.get("correct", True) is not False


def speedup(row: dict[str, Any], peer: str, kind: str = "graph_ms") -> float | None:
    """``peer time / tilegemm time`` for ``kind`` (``graph_ms`` / ``ms``); None unless both ran and are correct."""
    p = row.get("peers", {}).get(peer)
    if not _ok(row) or not _ok(p) or not row.get(kind) or not p.get(kind):
        return None
    return p[kind] / row[kind]


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, dtype, peer): geomean and min speedup, kernel-only and eager, with the row count."""
    out = []
    keys = sorted({(r["family"], r["dtype"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for fam, dt in keys:
        sel = [r for r in rows if r["family"] == fam and r["dtype"] == dt]
        for peer in peer_names(sel):
            graph = [s for s in (speedup(r, peer) for r in sel) if s]
            eager = [s for s in (speedup(r, peer, "ms") for r in sel) if s]
            if not graph and not eager:
                continue
            out.append(
                {
                    "family": fam,
                    "dtype": dt,
                    "peer": peer,
                    "geomean": geomean(graph),
                    "min": min(graph) if graph else None,
                    "rows": len(graph),
                    "eager_geomean": geomean(eager),
                    "eager_rows": len(eager),
                }
            )
    return out


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def header(meta: dict[str, Any]) -> str:
    """The machine, versions, ceilings and DeepGEMM status of a run, as markdown lines."""
    ceil = meta.get("ceilings", {})
    v = meta.get("versions", {})
    clocks = meta.get("clocks", {})
    lines = [
        f"GPU: **{meta.get('gpu', '?')}** ({meta.get('sm_count', '?')} SMs), {meta.get('date', '?')}; "
        f"torch {v.get('torch')}, CUDA {v.get('cuda')}, cuda.tile {v.get('cutile')}; "
        f"clocks SM {clocks.get('sm_mhz', '?')}/{clocks.get('max_sm_mhz', '?')} MHz, "
        f"memory {clocks.get('mem_mhz', '?')}/{clocks.get('max_mem_mhz', '?')} MHz.",
        "",
        f"Ceilings measured at the start of the run: copy {_fmt(ceil.get('copy_gbps'), '.0f')} GB/s, "
        f"cuBLAS BF16 {_fmt(ceil.get('bf16_tflops'), '.0f')} TFLOP/s, FP8 {_fmt(ceil.get('fp8_tflops'), '.0f')} "
        f"TFLOP/s (per-tensor), FP8 blockwise {_fmt(ceil.get('fp8_blockwise_tflops'), '.0f')} TFLOP/s (8192^3).",
        "",
        f"DeepGEMM: {meta.get('deepgemm', '?')}. Run: `{meta.get('size', '?')}`, {meta.get('seconds', '?')} s"
        + (f", time budget {meta['time_budget_s']} s" if meta.get("time_budget_s") else "")
        + ".",
    ]
    return "\n".join(lines)


def family_table(rows: list[dict[str, Any]]) -> str:
    """One markdown table of a family's rows: tilegemm's times and rates, then each peer's time and ratio."""
    names = peer_names(rows)
    head = (
        [
            "op",
            "dtype",
            "shape",
            "us (graph)",
            "us (eager)",
            "first call ms",
            "TFLOP/s",
            "GB/s",
            "% copy BW",
            "calc_diff",
        ]
        + [f"{p} us (x)" for p in names]
        + ["notes"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        notes = []
        if r.get("error"):
            notes.append(f"tilegemm: {r['error'][:100]}")
        if r.get("correct") is False:
            notes.append("tilegemm FAILS its bar")
        if r.get("settings"):
            notes.append(", ".join(f"{k}={v}" for k, v in r["settings"].items()))
        if r.get("greedy_agreement") is not None:
            notes.append(f"greedy tokens equal {r['greedy_agreement']:.3f}")
        cells = [
            r["op"],
            r["dtype"],
            shape_label(r["shape"]),
            _us(r.get("graph_ms")),
            _us(r.get("ms")),
            _fmt(r.get("jit_ms"), ".0f"),
            _fmt(r.get("tflops"), ".1f"),
            _fmt(r.get("gbps"), ".0f"),
            _fmt(r["frac_copy_bw"] * 100 if r.get("frac_copy_bw") else None, ".0f"),
            _fmt(r.get("calc_diff"), ".1e"),
        ]
        for p in names:
            entry = r["peers"].get(p)
            if entry is None:
                cells.append("n/a")
                if p in r.get("peer_notes", {}):
                    notes.append(f"{p}: {r['peer_notes'][p][:90]}")
                continue
            s = speedup(r, p) or speedup(r, p, "ms")
            t = entry.get("graph_ms") or entry.get("ms")
            cells.append(f"{_us(t)} ({_fmt(s, '.2f')})" + ("" if _ok(entry) else " WRONG"))
        cells.append("; ".join(notes))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Geomean speedups of tilegemm per (family, dtype, peer) as a markdown table."""
    lines = [
        "| family | dtype | peer | geomean (graph) | min (graph) | rows | geomean (eager) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary(rows):
        lines.append(
            f"| {s['family']} | {s['dtype']} | {s['peer']} | {_fmt(s['geomean'], '.2f')}x | "
            f"{_fmt(s['min'], '.2f')}x | {s['rows']} | {_fmt(s['eager_geomean'], '.2f')}x |"
        )
    return "\n".join(lines)


def markdown(doc: dict[str, Any], title: str = "tilegemm-bench results") -> str:
    """The whole report of a results document."""
    rows = doc["rows"]
    parts = [f"# {title}", "", header(doc.get("meta", {})), ""]
    parts += [
        "Times in microseconds. `(x)` after a peer's time is peer time / tilegemm time (above 1: tilegemm "
        "faster), kernel-only (CUDA-graph replay) where both were captured, eager otherwise. `calc_diff` is "
        "tilegemm's output against a float64 formula on the same inputs (`models`: the stock model's logits); "
        "rates use the kernel-only time.",
        "",
        "## Summary",
        "",
        summary_table(rows),
        "",
    ]
    families = list(dict.fromkeys(r["family"] for r in rows))
    for fam in families:
        parts += [f"## {fam}", "", family_table([r for r in rows if r["family"] == fam]), ""]
    skipped = doc.get("skipped") or []
    if skipped:
        parts += [f"Not run ({len(skipped)} rows): " + ", ".join(sorted({s["reason"] for s in skipped})) + ".", ""]
    return "\n".join(parts)
