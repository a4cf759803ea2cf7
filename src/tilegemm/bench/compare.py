"""Comparing a run with a saved baseline: per-row time ratios and the regression gate.

Rows match by :func:`~tilegemm.bench.schema.row_key` (family, op, dtype, shape, settings). The ratio
is ``new / base`` of the kernel-only time when both runs have it, else of the eager time (above 1:
slower now). ``--fail-on-regression PCT`` fails when any matched row is more than PCT percent slower.
"""

from __future__ import annotations

from typing import Any

from tilegemm.bench.report import geomean
from tilegemm.bench.schema import row_key, shape_label


def compare(new: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Per-row ratios of ``new`` against ``base``: ``{"rows": [...], "only_new": n, "only_base": n, "geomean"}``."""
    base_rows = {row_key(r): r for r in base["rows"]}
    out, seen = [], set()
    for r in new["rows"]:
        key = row_key(r)
        b = base_rows.get(key)
        if b is None:
            continue
        seen.add(key)
        kind = "graph_ms" if r.get("graph_ms") and b.get("graph_ms") else "ms"
        ratio = r[kind] / b[kind] if r.get(kind) and b.get(kind) else None
        eager = r["ms"] / b["ms"] if r.get("ms") and b.get("ms") else None
        out.append(
            {
                "key": key,
                "family": r["family"],
                "op": r["op"],
                "dtype": r["dtype"],
                "shape": r["shape"],
                "kind": kind,
                "base_ms": b.get(kind),
                "new_ms": r.get(kind),
                "ratio": ratio,
                "eager_ratio": eager,
            }
        )
    return {
        "rows": out,
        "only_new": sum(1 for r in new["rows"] if row_key(r) not in base_rows),
        "only_base": sum(1 for k in base_rows if k not in seen),
        "geomean": geomean(c["ratio"] for c in out),
        "eager_geomean": geomean(c["eager_ratio"] for c in out),
    }


def regressions(result: dict[str, Any], pct: float) -> list[dict[str, Any]]:
    """Matched rows more than ``pct`` percent slower than the baseline (or measured before, not now)."""
    limit = 1.0 + pct / 100.0
    bad = []
    for c in result["rows"]:
        if c["ratio"] is None and c["base_ms"] is not None:
            bad.append(c)
        elif c["ratio"] is not None and c["ratio"] > limit:
            bad.append(c)
    return bad


def markdown(result: dict[str, Any], pct: float | None = None) -> str:
    """The comparison as a markdown table (worst first) with a geomean line."""
    g = "-" if result["geomean"] is None else f"{result['geomean']:.3f}"
    ge = "-" if result["eager_geomean"] is None else f"{result['eager_geomean']:.3f}"
    lines = [
        f"Compared {len(result['rows'])} rows (new / base; above 1 = slower now); geomean {g} (eager {ge}); "
        f"{result['only_new']} rows only in the new run, {result['only_base']} only in the base.",
        "",
        "| family | op | dtype | shape | time | base us | new us | new/base | eager new/base |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = sorted(result["rows"], key=lambda c: -(c["ratio"] or 0))
    limit = None if pct is None else 1 + pct / 100
    for c in order:
        flag = " **REGRESSION**" if limit and (c["ratio"] is None or c["ratio"] > limit) and c["base_ms"] else ""
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.3f}"
        eager = "-" if c["eager_ratio"] is None else f"{c['eager_ratio']:.3f}"
        base = "-" if c["base_ms"] is None else f"{c['base_ms'] * 1e3:.1f}"
        new = "-" if c["new_ms"] is None else f"{c['new_ms'] * 1e3:.1f}"
        kind = "graph" if c["kind"] == "graph_ms" else "eager"
        lines.append(
            f"| {c['family']} | {c['op']} | {c['dtype']} | {shape_label(c['shape'])} | {kind} | {base} | {new} | "
            f"{ratio}{flag} | {eager} |"
        )
    return "\n".join(lines) + "\n"
