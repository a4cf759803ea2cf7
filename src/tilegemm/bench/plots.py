"""PNG plots of a results document (matplotlib, Agg backend; imported only when plotting is asked for).

One figure per family, about 1000 px wide (the README's width): tilegemm's speedup over each peer (peer time /
tilegemm time, above 1: tilegemm faster) against the work of the row (FLOPs per call, log scale), one panel per
dtype, one colour per peer, a dashed line at 1.0, each peer's geomean
in the legend below the panels. Points only: rows are separate problems, so nothing joins them. The speedup is
kernel-only (CUDA-graph replay); a row without graph times uses the eager times and is drawn hollow. A peer that
did not run a row, or a row either side got wrong, has no point there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tilegemm.bench import report
from tilegemm.bench.schema import shape_label

#: How to get what the plots need (pyproject's ``bench`` extra: matplotlib and tqdm).
INSTALL_HINT = 'pip install "tilegemm[bench]"'

#: The width of a figure in inches at :data:`DPI` (1000 px, the README's width).
WIDTH_IN = 10.0
DPI = 100
#: Okabe-Ito's colours (told apart by most colour-blind readers; yellow left out: too faint on white), one per peer
#: of a figure in the order the peers first appear.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#000000", "#999999")
#: Speedup ticks: readable round numbers on a log axis.
TICKS = (0.125, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)


def require_matplotlib() -> None:
    """Return when matplotlib imports; else raise ``ImportError`` naming the extra to install."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"plots need matplotlib ({exc}): {INSTALL_HINT}") from None


def peer_color(name: str, peers: list[str]) -> str:
    """The colour of peer ``name`` in a figure of ``peers``: the palette entry at its place (distinct within the
    figure for up to eight peers)."""
    return PALETTE[peers.index(name) % len(PALETTE)]


def row_labels(rows: list[dict[str, Any]]) -> list[str]:
    """A label per row: dtype and shape, led by the op where rows differ by it alone
    (``models``: prefill and decode of one shape)."""
    labels = [f"{r['dtype']} {shape_label(r['shape'])}" for r in rows]
    if len(set(labels)) < len(labels):
        labels = [f"{r['op']} {label}" for r, label in zip(rows, labels)]
    return labels


def ratio_points(rows: list[dict[str, Any]], peer: str) -> list[tuple[float, float, bool]]:
    """``(flops, speedup, kernel_only)`` of each row of ``rows`` where tilegemm and ``peer`` both ran correctly:
    the kernel-only speedup where both have one (``kernel_only`` True), else the eager one."""
    points = []
    for r in rows:
        s = report.speedup(r, peer, "graph_ms")
        graph = s is not None
        if s is None:
            s = report.speedup(r, peer, "ms")
        if s is not None and r.get("flops"):
            points.append((float(r["flops"]), s, graph))
    return points


def _log_ticks(lo: float, hi: float) -> list[float]:
    """The :data:`TICKS` within ``[lo, hi]`` (1.0 always among them)."""
    return [t for t in TICKS if lo <= t <= hi] or [1.0]


def ratio_figure(rows: list[dict[str, Any]], meta: dict[str, Any], family: str) -> Any:
    """The figure of ``family``'s rows (a matplotlib ``Figure``; see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    peers = report.peer_names(rows)
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(WIDTH_IN, 0.6 + 2.9 * len(dtypes)), squeeze=False)
    handles: dict[str, Any] = {}
    eager_seen = False
    for ax, dtype in zip(axes[:, 0], dtypes):
        sel = [r for r in rows if r["dtype"] == dtype]
        ys: list[float] = []
        for peer in peers:
            pts = ratio_points(sel, peer)
            if not pts:
                continue
            color = peer_color(peer, peers)
            gm = report.geomean([s for _, s, g in pts if g]) or report.geomean([s for _, s, _ in pts])
            label = f"{peer} ({dtype}: geomean {gm:.2f}x, {len(pts)} rows)"
            for kernel_only in (True, False):
                xs = [f / 1e9 for f, _, g in pts if g == kernel_only]
                vs = [s for _, s, g in pts if g == kernel_only]
                if not xs:
                    continue
                eager_seen |= not kernel_only
                face = color if kernel_only else "none"
                h = ax.scatter(xs, vs, s=22, marker="o", facecolors=face, edgecolors=color, linewidths=1.0, alpha=0.85)
                handles.setdefault(label, h)
            ys += [s for _, s, _ in pts]
        ax.axhline(1.0, color="#555555", ls="--", lw=1.0, zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        if ys:
            lo, hi = min(ys + [1.0]) / 1.15, max(ys + [1.0]) * 1.15
            ax.set_ylim(lo, hi)
            ax.yaxis.set_major_locator(FixedLocator(_log_ticks(lo, hi)))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_ylabel(f"{dtype}: speedup")
        ax.grid(True, which="major", alpha=0.3)
    axes[-1, 0].set_xlabel("work per call, GFLOP (log scale)")
    date = str(meta.get("date", ""))[:10]
    fig.suptitle(
        f"{family}: tilegemm speedup over each peer (peer time / tilegemm time; above 1 = tilegemm faster), "
        f"kernel-only\n{meta.get('gpu', '?')}, {date}",
        fontsize=10,
    )
    if eager_seen:
        handles["hollow: eager times (no kernel-only time for the row)"] = plt.Line2D(
            [], [], ls="none", marker="o", mfc="none", mec="#555555"
        )
    ncol = 2 if len(handles) > 3 else 1
    rows_of_legend = math.ceil(len(handles) / ncol)
    bottom = (0.2 + 0.2 * rows_of_legend) / fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    return fig


def family_figure(rows: list[dict[str, Any]], meta: dict[str, Any], family: str, path: str | Path) -> Path:
    """Draw ``family``'s rows into ``path`` (PNG, :data:`WIDTH_IN` x :data:`DPI` px wide); returns the path."""
    import matplotlib.pyplot as plt

    fig = ratio_figure(rows, meta, family)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_all(doc: dict[str, Any], out_dir: str | Path, progress: bool = False) -> list[Path]:
    """One PNG per family of ``doc`` into ``out_dir`` (``<family>.png``); returns the paths. ``progress``: a bar
    (or a line per family) on stderr."""
    from tilegemm.bench.progress import Progress

    rows = doc["rows"]
    families = list(dict.fromkeys(r["family"] for r in rows))
    bar = Progress(len(families), enabled=progress)
    out = []
    for fam in families:
        sel = [r for r in rows if r["family"] == fam]
        out.append(family_figure(sel, doc.get("meta", {}), fam, Path(out_dir) / f"{fam}.png"))
        bar.update(f"plot {fam}")
    bar.close()
    return out
