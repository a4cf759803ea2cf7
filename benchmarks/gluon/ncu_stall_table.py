"""Where a kernel's warps wait: the stall reasons of ``ncu_stalls.sh``'s per-instruction sampling, summed.

    python3 benchmarks/gluon/ncu_stall_table.py source_f_128x64_ov2.csv source_deepgemm.csv [--loop-min N]

For each CSV (``ncu --page source --print-source sass --csv``): the share of every stall reason over all samples and
over the K loop's instructions (those executed at least ``--loop-min`` times), then the loop's most sampled
instructions with their three largest reasons. Prints markdown.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os


def table(path: str, loop_min: int, top: int) -> str:
    """The markdown summary of one per-instruction CSV."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel, header, data = rows[0][1], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def value(row, name):
        return float(row[col[name]] or 0)

    everything, loop = collections.Counter(), collections.Counter()
    for row in data:
        in_loop = value(row, "Instructions Executed") >= loop_min
        for reason in reasons:
            everything[reason] += value(row, reason)
            if in_loop:
                loop[reason] += value(row, reason)
    lines = [f"### {os.path.basename(path)}: `{kernel[:90]}`", ""]
    for label, counts in (("all instructions", everything), (f"K loop (executed >= {loop_min} times)", loop)):
        total = sum(counts.values()) or 1
        shares = ", ".join(f"{reason[6:]} {n / total:.1%}" for reason, n in counts.most_common(8))
        lines.append(f"- {label}, {int(total)} samples: {shares}")
    lines += ["", "| K-loop instruction | samples | largest reasons |", "|---|---|---|"]
    hot = [row for row in data if value(row, "Instructions Executed") >= loop_min]
    for row in sorted(hot, key=lambda r: -value(r, "Warp Stall Sampling (All Samples)"))[:top]:
        by = sorted(((value(row, r), r[6:]) for r in reasons), reverse=True)[:3]
        text = " ".join(row[col["Source"]].split())[:70]
        reasons_text = ", ".join(f"{name} {int(n)}" for n, name in by if n)
        lines.append(f"| `{text}` | {int(value(row, 'Warp Stall Sampling (All Samples)'))} | {reasons_text} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="+", help="ncu_stalls.sh's source_<impl>.csv files")
    parser.add_argument("--loop-min", type=int, default=7000, help="executions that make an instruction the loop's")
    parser.add_argument("--top", type=int, default=10, help="loop instructions listed")
    args = parser.parse_args()
    print("\n\n".join(table(path, args.loop_min, args.top) for path in args.csv))


if __name__ == "__main__":
    main()
