"""Plot the FP8 key cache's decode step against BF16's, from ``indexer_bench`` runs (``decode_module`` part).

``python3 benchmarks/plot_fp8_key_cache.py OUT.png LABEL=RUN.json [LABEL=RUN.json ...]``: one group of bars per
(sequences, keys), one bar per run: the FP8 key cache's speed over BF16's in the same process (kernel-only: graphs
replayed back to back, ``speed_vs_bf16_b2b``; the one-replay column where a run has no other), a line at 1.0.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def speeds(path: str) -> dict[tuple[int, int], float]:
    """``{(batch, context): FP8 key cache speed / BF16 speed}`` of one run."""
    with open(path) as f:
        rows = json.load(f)["decode_module"]
    out = {}
    for r in rows:
        fp8 = r.get("fp8_cache", {})
        value = fp8.get("speed_vs_bf16_b2b", fp8.get("speed_vs_bf16"))
        if value is not None:
            out[(r["batch"], r["context"])] = value
    return out


def main(out: str, runs: list[str]) -> int:
    labelled = [run.split("=", 1) for run in runs]
    data = {label: speeds(path) for label, path in labelled}
    keys = sorted({k for d in data.values() for k in d})
    width = 0.8 / max(1, len(data))
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, (label, d) in enumerate(data.items()):
        xs = [j + (i - (len(data) - 1) / 2) * width for j in range(len(keys))]
        ax.bar(xs, [d.get(k, 0.0) for k in keys], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(keys)), [f"{b} seq\n{t // 1024}k keys" for b, t in keys])
    ax.set_ylabel("FP8 key cache step / BF16 step (speed)")
    ax.set_title("DeepSeek-V3.2 indexer decode step, one indexer, CUDA graph (NVIDIA H200)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
