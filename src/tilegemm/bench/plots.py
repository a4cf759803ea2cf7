"""PNG plots of a results document (matplotlib, Agg backend; imported only when plotting is asked for).

One figure per family, four panels: kernel-only time per shape, TFLOP/s per shape with the cuBLAS
peaks as lines, GB/s per shape with the copy bandwidth as a line, and a roofline (achieved TFLOP/s
against arithmetic intensity, FLOP per byte moved, under ``min(peak, intensity x copy bandwidth)``).
tilegemm and every peer are drawn; a peer that did not run a shape has no point there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tilegemm.bench.report import peer_names
from tilegemm.bench.schema import shape_label

_COLORS = {
    "tilegemm": "#d62728",
    "deepgemm": "#1f77b4",
    "cublas": "#2ca02c",
    "cublas_loop": "#2ca02c",
    "transformers": "#9467bd",
}


def _series(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any] | None]:
    if name == "tilegemm":
        return [r if r.get("ms") and r.get("correct", True) is not False else None for r in rows]
    return [r["peers"].get(name) for r in rows]


def _time(entry: dict[str, Any] | None) -> float | None:
    if not entry:
        return None
    return entry.get("graph_ms") or entry.get("ms")


def _rate(entry: dict[str, Any] | None, row: dict[str, Any], what: str) -> float | None:
    t = _time(entry)
    if not t:
        return None
    return (row["flops"] / 1e12 if what == "tflops" else row["bytes"] / 1e9) / (t * 1e-3)


def row_labels(rows: list[dict[str, Any]]) -> list[str]:
    """The x-axis label of each row: dtype and shape, led by the op where rows differ by it alone
    (``models``: prefill and decode of one shape)."""
    labels = [f"{r['dtype']} {shape_label(r['shape'])}" for r in rows]
    if len(set(labels)) < len(labels):
        labels = [f"{r['op']} {label}" for r, label in zip(rows, labels)]
    return labels


def family_figure(rows: list[dict[str, Any]], meta: dict[str, Any], family: str, path: str | Path) -> Path:
    """Draw ``family``'s rows into ``path`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["tilegemm"] + peer_names(rows)
    labels = row_labels(rows)
    x = list(range(len(rows)))
    width = max(10.0, min(60.0, 0.22 * len(rows) + 6))
    fig, axes = plt.subplots(2, 2, figsize=(width, 11))
    (ax_t, ax_f), (ax_b, ax_r) = axes
    ceil = meta.get("ceilings", {})
    for name in names:
        series = _series(rows, name)
        color = _COLORS.get(name)
        if not any(_time(e) for e in series):
            continue
        nan = float("nan")  # a shape the implementation did not run breaks its line
        ax_t.plot(x, [_time(e) * 1e3 if _time(e) else nan for e in series], "o-", ms=3, lw=1, label=name, color=color)
        for ax, what in ((ax_f, "tflops"), (ax_b, "gbps")):
            ys = [_rate(e, r, what) if _time(e) else nan for e, r in zip(series, rows)]
            ax.plot(x, ys, "o-", ms=3, lw=1, label=name, color=color)
        pts = [(r["flops"] / r["bytes"], _rate(e, r, "tflops")) for e, r in zip(series, rows) if _time(e)]
        if pts:
            ax_r.scatter(*zip(*pts), s=12, label=name, color=color)
    for key, style, label in (("bf16_tflops", "--", "cuBLAS BF16 peak"), ("fp8_tflops", ":", "cuBLAS FP8 peak")):
        if ceil.get(key):
            ax_f.axhline(ceil[key], ls=style, color="gray", lw=1, label=label)
            ax_r.axhline(ceil[key], ls=style, color="gray", lw=1, label=label)
    if ceil.get("copy_gbps"):
        ax_b.axhline(ceil["copy_gbps"], ls="--", color="gray", lw=1, label="copy bandwidth")
        ai = [r["flops"] / r["bytes"] for r in rows if r.get("bytes")]
        if ai:
            lo, hi = min(ai) / 2, max(ai) * 2
            peak = max(ceil.get("fp8_tflops") or 0, ceil.get("bf16_tflops") or 0) or None
            xs = [lo * (hi / lo) ** (i / 50) for i in range(51)]
            ys = [x_ * ceil["copy_gbps"] / 1e3 for x_ in xs]
            if peak:
                ys = [min(y, peak) for y in ys]
            ax_r.plot(xs, ys, "-", color="black", lw=1, label="roof (copy BW, peak)")
    ax_t.set_ylabel("time per call, us (kernel-only)")
    ax_t.set_yscale("log")
    ax_f.set_ylabel("TFLOP/s")
    ax_b.set_ylabel("GB/s (bytes moved / time)")
    ax_r.set_xscale("log")
    ax_r.set_yscale("log")
    ax_r.set_xlabel("arithmetic intensity, FLOP / byte")
    ax_r.set_ylabel("TFLOP/s")
    ax_r.set_title("roofline")
    for ax in (ax_t, ax_f, ax_b):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.grid(True, alpha=0.3)
    for ax in (ax_t, ax_f, ax_b, ax_r):
        ax.legend(fontsize=7)
    ax_r.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{family} on {meta.get('gpu', '?')} ({str(meta.get('date', ''))[:10]})")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_all(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """One PNG per family of ``doc`` into ``out_dir`` (``<family>.png``); returns the paths."""
    rows = doc["rows"]
    out = []
    for fam in dict.fromkeys(r["family"] for r in rows):
        sel = [r for r in rows if r["family"] == fam]
        out.append(family_figure(sel, doc.get("meta", {}), fam, Path(out_dir) / f"{fam}.png"))
    return out
