"""Plot a ``src_ab.sh`` run packed as in ``pinned_spills_h200.json``: two src trees, one panel per triton.

The file holds ``<triton>_<tree>_<round>`` runs of ``fp8_ws_sweep.py`` (``t36_main_1``, ``t36_pinned_1``, ...). Each bar
is a column's speed against DeepGEMM in the same process (DeepGEMM time over the column's time, kernel-only),
geomean over the rounds; one bar pair (first tree, second tree) per row and column::

    python benchmarks/gluon/src_ab_plot.py benchmarks/results/gluon/pinned_spills_h200.json OUT.png \
        [--trees main,pinned] [--columns tilegemm,d_128x128_ov8]
"""

from __future__ import annotations

import argparse
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def ratios(runs: list[dict], column: str) -> dict[str, float]:
    """DeepGEMM time over ``column``'s time per row (``MxNxK``), geomean over ``runs``: above 1, faster."""
    per_row: dict[str, list[float]] = {}
    for run in runs:
        for r in run["rows"]:
            per_row.setdefault(f"{r['m']}x{r['n']}x{r['k']}", []).append(r["us"]["deepgemm"] / r["us"][column])
    return {row: math.exp(sum(map(math.log, xs)) / len(xs)) for row, xs in per_row.items()}


def main() -> None:
    """Read the file, draw one panel per triton, write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--trees", default="main,pinned", help="the two trees' keys, the earlier first")
    parser.add_argument("--columns", default="tilegemm,d_128x128_ov8", help="the sweep's columns to draw")
    args = parser.parse_args()
    data = json.load(open(args.data))
    trees, columns = args.trees.split(","), args.columns.split(",")
    tritons = sorted({key.split("_")[0] for key in data if key != "meta"})
    fig, axes = plt.subplots(1, len(tritons), figsize=(7.5 * len(tritons), 5.5), squeeze=False)
    colors = {trees[0]: ("#9bb3d6", "#4c72b0"), trees[1]: ("#f0b890", "#dd8452")}
    for ax, triton in zip(axes[0], tritons):
        runs = {t: [v for k, v in data.items() if k.startswith(f"{triton}_{t}_")] for t in trees}
        version = runs[trees[0]][0]["meta"]["versions"]["triton"]
        width = 0.8 / (2 * len(columns))
        top = 1.25
        for c, column in enumerate(columns):
            for t, tree in enumerate(trees):
                values = ratios(runs[tree], column)
                rows = list(values)
                offset = (2 * c + t - len(columns) + 0.5) * width
                ax.bar(
                    [x + offset for x in range(len(rows))],
                    [values[r] for r in rows],
                    width,
                    label=f"{column}, {tree}",
                    color=colors[tree][c % 2],
                )
                top = max(top, max(values.values()) * 1.1)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(rows)), rows, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"triton {version}: DeepGEMM time / column's time", fontsize=10)
        ax.set_ylim(0, top)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    meta = data["meta"]
    fig.suptitle(f"Dense FP8 on 128x128 tiles, {' vs '.join(trees)}, {meta['gpu']}, {meta['date']} (kernel-only)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
