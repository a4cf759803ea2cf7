"""Plot the public dense ops under two tritons from one ``triton_ab.sh`` run packed as in ``triton39_h200.json``.

Each row's speed against its peer (FP8: DeepGEMM, BF16: cuBLAS; kernel-only, both tritons' processes measured the
peer too) under the machine's triton and the bundled one, side by side::

    python benchmarks/gluon/triton_plot.py benchmarks/results/gluon/triton39_h200.json OUT.png [--old t36 --new t39]
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def ratios(run: dict, peer: str) -> dict[str, float]:
    """Peer time over the public op's time per row (``MxNxK``): above 1, tilegemm faster."""
    return {f"{r['m']}x{r['n']}x{r['k']}": r["us"][peer] / r["us"]["tilegemm"] for r in run["rows"]}


def main() -> None:
    """Read the file, draw one panel per dtype, write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--old", default="t36", help="key suffix of the machine's triton (fp8_<old>, bf16_<old>)")
    parser.add_argument("--new", default="t39", help="key suffix of the bundled triton")
    args = parser.parse_args()
    data = json.load(open(args.data))
    panels = [
        ("fp8", "deepgemm", "dense FP8: DeepGEMM time / tilegemm time"),
        ("bf16", "cublas", "dense BF16: cuBLAS time / tilegemm time"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [12, 7]})
    for ax, (dtype, peer, title) in zip(axes, panels):
        old, new = (ratios(data[f"{dtype}_{key}"], peer) for key in (args.old, args.new))
        rows = list(old)
        xs = range(len(rows))
        versions = [data[f"{dtype}_{key}"]["meta"]["versions"]["triton"] for key in (args.old, args.new)]
        ax.bar([x - 0.2 for x in xs], [old[r] for r in rows], 0.4, label=f"triton {versions[0]}", color="#4c72b0")
        ax.bar([x + 0.2 for x in xs], [new[r] for r in rows], 0.4, label=f"triton {versions[1]}", color="#dd8452")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(xs), rows, rotation=40, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, max(1.25, max(list(old.values()) + list(new.values())) * 1.1))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    meta = data["meta"]
    fig.suptitle(f"The public dense ops under two tritons, {meta['gpu']}, {meta['date']} (kernel-only)", fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
