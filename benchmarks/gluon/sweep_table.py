"""What the dense kernel sweeps (``fp8_ws_sweep.py``, ``bf16_ws_sweep.py``) share: their ``--shapes`` rows, a design
named with field overrides (``design_config``), one column of a row checked against the float64 formula and timed
kernel-only, a row's columns timed in turn (repeated, the median kept), the row's progress line, and the TFLOP/s
table printed last.

A row is ``{"m", "n", "k", "tflops": {}, "us": {}, "diff": {}, "error": {}}``; a column is one implementation, by name.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from tilegemm.bench import timing
from tilegemm.testing import calc_diff


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """The (M, N, K) rows of a ``--shapes`` argument, ``"MxNxK,MxNxK,..."`` (empty items skipped)."""
    return [tuple(int(x) for x in item.split("x")) for item in text.split(",") if item]


def design_config(variants: dict[str, Any], spec: str) -> Any:
    """The config (a ``NamedTuple`` of ``variants``) a column ``spec`` names: ``variants[name]``, or with integer
    fields replaced for ``name:field=value[:field=value...]`` (e.g. ``f_128x64_ov2:group_m=1:stages=6``)."""
    name, *fields = spec.split(":")
    if any(field.count("=") != 1 for field in fields):
        raise ValueError(f"{spec!r}: expected name:field=value[:field=value...]")
    overrides = {key: int(value) for key, value in (field.split("=") for field in fields)}
    return variants[name]._replace(**overrides)


def timed(row: dict, name: str, fn, sets: list, out: torch.Tensor, ref: torch.Tensor, budget_ms: float) -> None:
    """Column ``name`` of ``row``: ``fn(*sets[0])`` writes ``out`` (poisoned with NaN first), checked against
    ``ref``, then every set's call is timed kernel-only (one CUDA graph over the sets, rotated past L2); an error is
    recorded and printed instead."""
    try:
        out.fill_(float("nan"))
        fn(*sets[0])
        torch.cuda.synchronize()
        row["diff"][name] = calc_diff(out, ref)
        ms = timing.graph_ms(lambda: [fn(*s) for s in sets], 1, budget_ms=budget_ms) / len(sets)
    except Exception as exc:
        row["error"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  {name}: {row['error'][name]}", flush=True)
        return
    row["us"][name] = ms * 1e3
    row["tflops"][name] = 2 * row["m"] * row["n"] * row["k"] / ms / 1e9


def timed_in_turn(row: dict, columns: dict, sets: list, out: torch.Tensor, ref: torch.Tensor, budget_ms: float,
                  repeat: int = 1) -> None:  # fmt: skip
    """Every column of ``columns`` (name -> call) timed by :func:`timed`, the columns in turn ``repeat`` times (so that
    a drift of the clocks reaches each alike); a column's time is then the median of its runs (``row["samples_us"]``
    keeps them)."""
    for _ in range(repeat):
        for name, call in columns.items():
            timed(row, name, call, sets, out, ref, budget_ms)
            if name in row["us"]:
                row.setdefault("samples_us", {}).setdefault(name, []).append(row["us"][name])
    for name, samples in row.get("samples_us", {}).items():
        row["us"][name] = statistics.median(samples)
        row["tflops"][name] = 2 * row["m"] * row["n"] * row["k"] / row["us"][name] / 1e6


def progress(row: dict, t0: float, bar: float) -> None:
    """One line for a finished row: seconds since ``t0``, each column's TFLOP/s, and the columns whose
    ``calc_diff`` is not under ``bar``."""
    bad = {name: f"{x:.1e}" for name, x in row["diff"].items() if not x < bar}
    print(
        f"{row['m']:5d}x{row['n']:5d}x{row['k']:5d} {time.time() - t0:5.0f}s "
        + " ".join(f"{name}={t:.0f}" for name, t in row["tflops"].items())
        + (f" BAD calc_diff {bad}" if bad else ""),
        flush=True,
    )


def print_table(rows: list[dict], columns: list[str], base: str, base_label: str) -> None:
    """The TFLOP/s of each row's ``columns``, then each column's geomean speed against column ``base``
    (``base_label``) over the rows both ran."""
    print("\nTFLOP/s (kernel-only)   " + " ".join(f"{c[:13]:>13}" for c in columns))
    for r in rows:
        cells = " ".join(f"{r['tflops'][c]:13.0f}" if c in r["tflops"] else f"{'-':>13}" for c in columns)
        print(f"{r['m']:5d}x{r['n']:5d}x{r['k']:5d}   {cells}")
    ratios = []
    for c in columns:
        v = [r["tflops"][c] / r["tflops"][base] for r in rows if c in r["tflops"] and base in r["tflops"]]
        ratios.append(f"{math.exp(sum(map(math.log, v)) / len(v)):13.2f}" if v else f"{'-':>13}")
    print(f"{'geomean / ' + base_label:<24}" + " ".join(ratios))
