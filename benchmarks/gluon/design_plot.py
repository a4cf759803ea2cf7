"""Plot the FP8 design probes' runs: each design's speed against DeepGEMM in the same process (geomean over the rows,
the bar; every row, the dots), one panel per run.

    python3 benchmarks/gluon/design_plot.py OUT.png RUN.json [RUN.json ...]

A run is a ``multicast_probe.py`` or ``wg_split_probe.py`` output (``{"meta", "rows"}``; each row's ``tflops`` by
column, ``deepgemm`` among them).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: Bar colour by design family (a column's name prefix).
COLOURS = {"mc_": "#d95f02", "wg_": "#1b9e77", "tilegemm": "#7570b3"}
OTHER = "#999999"


def _colour(name: str) -> str:
    return next((c for prefix, c in COLOURS.items() if name.startswith(prefix)), OTHER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.2), squeeze=False)
    for ax, path, run in zip(axes[0], args.runs, runs):
        rows = run["rows"]
        names = [c for c in rows[0]["tflops"] if c != "deepgemm"]
        ratios = {c: [r["tflops"][c] / r["tflops"]["deepgemm"] for r in rows if c in r["tflops"]] for c in names}
        geo = {c: math.exp(sum(map(math.log, v)) / len(v)) for c, v in ratios.items()}
        y = range(len(names))
        ax.barh(list(y), [geo[c] for c in names], color=[_colour(c) for c in names], alpha=0.85)
        for i, c in enumerate(names):
            ax.scatter(ratios[c], [i] * len(ratios[c]), s=9, color="black", zorder=3)
            ax.text(1.28, i, f"{geo[c]:.2f}", va="center", ha="right", fontsize=8, weight="bold")
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_yticks(list(y), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0.4, 1.3)
        meta = run["meta"]
        ax.set_title(f"{Path(path).stem}\n{meta['gpu']}, triton {meta['triton']}, {meta['date'][:10]}", fontsize=9)
        ax.set_xlabel("TFLOP/s over DeepGEMM 2.6.1, same process (bar: geomean; dots: rows)", fontsize=8)
    fig.suptitle("Dense FP8 designs, kernel-only, 8 DeepSeek-V3 rows (M >= 512)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
