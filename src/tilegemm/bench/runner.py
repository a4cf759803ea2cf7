"""Running a set of families on the GPU: ceilings first, then each family's rows under a time budget.

The budget (``--time-budget``) is split among the selected families in proportion to
:data:`BUDGET_SHARE`; a family that finishes early hands its leftover to the next. A row is only
started while its family's share (plus carried leftover) is not spent; rows not started are listed
in ``skipped`` with the reason, so a cut-short run says what it lacks.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from tilegemm.bench.schema import SCHEMA_VERSION, shape_label

#: Family name -> module under ``tilegemm.bench``; the order is the run order.
FAMILIES = {
    "dense": "dense",
    "m_grouped": "m_grouped",
    "masked": "masked",
    "k_grouped": "k_grouped",
    "mqa": "mqa",
    "moe": "moe",
    "norm": "norm",
    "models": "models",
}
#: Fraction of the time budget each family gets (renormalised over the selected families).
BUDGET_SHARE = {
    "dense": 0.27,
    "m_grouped": 0.16,
    "masked": 0.1,
    "k_grouped": 0.07,
    "mqa": 0.1,
    "moe": 0.15,
    "norm": 0.02,
    "models": 0.13,
}


def family_module(name: str) -> Any:
    """The module of family ``name`` (``specs(size)`` and ``case(spec, dg, dg_reason)``)."""
    return importlib.import_module(f"tilegemm.bench.{FAMILIES[name]}")


def plan(
    families: list[str], size: str, where: dict[str, tuple[str, ...]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The specs each family would run at ``size`` (``quick`` / ``full``), in run order; with ``where`` only
    those whose value of every named key, as a string, is one of the listed ones (``{"m": ("64", "128")}``)."""
    where = where or {}

    def kept(spec: dict[str, Any]) -> bool:
        return all(key in spec and str(spec[key]) in values for key, values in where.items())

    return {f: [s for s in family_module(f).specs(size) if kept(s)] for f in families}


def parse_where(clauses: list[str]) -> dict[str, tuple[str, ...]]:
    """``["m=64,128", "dtype=fp8"]`` -> ``{"m": ("64", "128"), "dtype": ("fp8",)}``; ``ValueError`` on a clause
    that is not ``KEY=V1[,V2...]``."""
    where: dict[str, tuple[str, ...]] = {}
    for clause in clauses:
        key, sep, values = clause.partition("=")
        picked = tuple(v.strip() for v in values.split(",") if v.strip())
        if not sep or not key.strip() or not picked:
            raise ValueError(f"--where: expected KEY=V1[,V2...], got {clause!r}")
        where[key.strip()] = picked
    return where


def run(
    families: list[str],
    size: str,
    time_budget: float | None,
    deepgemm: str = "auto",
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    where: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """Measure ``families`` at ``size``; returns the results document (``meta``, ``rows``, ``skipped``).

    ``on_row(doc)`` is called after every row (e.g. to save partial results); ``where`` filters the rows
    (:func:`plan`).
    """
    from tilegemm.bench import device, peers, timing
    from tilegemm.bench.core import measure_case
    from tilegemm.bench.progress import Progress

    t0 = time.time()
    dg, dg_desc = peers.load_deepgemm(deepgemm)
    meta = device.describe()
    meta.update(schema=SCHEMA_VERSION, size=size, families=families, deepgemm=dg_desc, time_budget_s=time_budget)
    if where:
        meta["where"] = {key: list(values) for key, values in where.items()}
    meta["ceilings"] = device.ceilings()
    meta["ceilings_s"] = round(time.time() - t0, 1)
    doc: dict[str, Any] = {"meta": meta, "rows": [], "skipped": []}
    specs = plan(families, size, where)
    bar = Progress(sum(len(v) for v in specs.values()), enabled=progress)
    bar.write(f"{meta['gpu']}: ceilings {meta['ceilings']}; DeepGEMM: {dg_desc}")
    shares = {f: BUDGET_SHARE.get(f, 0.1) for f in families}
    total_share = sum(shares.values())
    left_over = 0.0
    spent_before = time.time() - t0
    for fam in families:
        mod = family_module(fam)
        allowance = None
        if time_budget is not None:
            allowance = max(0.0, time_budget - spent_before) * shares[fam] / total_share + left_over
        f0 = time.time()
        for i, spec in enumerate(specs[fam]):
            used = time.time() - f0
            if allowance is not None and (used > allowance or time.time() - t0 > time_budget):
                rest = specs[fam][i:]
                doc["skipped"] += [{"family": fam, "spec": s, "reason": "time budget"} for s in rest]
                bar.write(f"[{fam}] time budget spent after {used:.0f}s: {len(rest)} rows not started")
                for _ in rest:
                    bar.update(f"{fam}: skipped")
                break
            case = mod.case(spec, dg, dg_desc)
            r0 = time.time()
            row = measure_case(case, meta["ceilings"])
            row["wall_s"] = round(time.time() - r0, 2)
            doc["rows"].append(row)
            bar.update(f"{fam} {row['dtype']} {shape_label(row['shape'])}")
            if row.get("error"):
                bar.write(f"[{fam}] {row['op']} {shape_label(row['shape'])}: {row['error']}")
            if on_row is not None:
                on_row(doc)
            timing.empty_cache()
        if allowance is not None:
            left_over = max(0.0, allowance - (time.time() - f0))
    bar.close()
    meta["seconds"] = round(time.time() - t0, 1)
    return doc
