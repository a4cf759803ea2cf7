"""Plot the warpgroup-partition design against the lockstep one per row: ``g_128x128_ov4`` (each MMA warpgroup a
partition of its own) over ``d_128x128_ov8`` (one partition), by the rounds its 128x128 tiles run over the SMs, one
series per run, with the rule's threshold (``heuristics.gluon.DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS``).

    python3 benchmarks/gluon/wg_parts_plot.py OUT.png RUN.json [RUN.json ...]

A run is an ``fp8_ws_sweep.py`` output with both columns (``{"meta", "rows"}``; each row's ``tflops`` by column).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tilegemm.heuristics.gluon import DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS  # noqa: E402

SPLIT, LOCKSTEP = "g_128x128_ov4", "d_128x128_ov8"
MARKERS = "o^sD"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for marker, path in zip(MARKERS, args.runs):
        run = json.loads(Path(path).read_text())
        sms = run["meta"]["sm_count"]
        points = []
        for r in run["rows"]:
            if SPLIT in r["tflops"] and LOCKSTEP in r["tflops"]:
                rounds = math.ceil(r["m"] / 128) * math.ceil(r["n"] / 128) / sms
                points.append((rounds, r["tflops"][SPLIT] / r["tflops"][LOCKSTEP], f"{r['m']}x{r['n']}x{r['k']}"))
        ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, s=28, label=Path(path).stem, zorder=3)
        for x, y, label in points:
            if abs(y - 1) > 0.04:
                ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.axvline(DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS, color="#1b9e77", lw=1.2, ls=":")
    ax.text(DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS * 1.05, ax.get_ylim()[1] * 0.995, "the rule: from 4 rounds", fontsize=8,
            color="#1b9e77", va="top")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("rounds of 128x128 output tiles over the SMs (tiles / SMs)", fontsize=9)
    ax.set_ylabel(f"TFLOP/s of {SPLIT} / {LOCKSTEP}", fontsize=9)
    meta = json.loads(Path(args.runs[0]).read_text())["meta"]
    ax.set_title(
        f"Dense FP8, each MMA warpgroup a partition vs both in one, same process, kernel-only\n"
        f"{meta['gpu']}, triton {meta['versions']['triton']}, {meta['date'][:10]}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
