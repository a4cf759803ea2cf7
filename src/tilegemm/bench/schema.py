"""The results file: ``{"meta": {...}, "rows": [...], "skipped": [...]}``, and reading it back.

A row (one shape of one op) carries at least ``family``, ``op``, ``dtype``, ``shape`` (dict), ``ms``
(eager median), ``graph_ms`` (kernel-only, CUDA-graph replay), ``calc_diff`` (vs a float64 formula on
the same inputs; ``models`` rows: vs the stock model's logits) and ``peers`` = ``{name: {"ms",
"graph_ms", "calc_diff", ...} or None}``; a peer that is None has its reason in ``peer_notes[name]``.
Times are milliseconds; ``None`` means not measured (the reason is in ``error`` / ``peer_notes``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
REQUIRED_ROW_KEYS = ("family", "op", "dtype", "shape", "ms", "graph_ms", "calc_diff", "peers")
PEER_KEYS = ("ms", "graph_ms", "calc_diff")


def row_key(row: dict[str, Any]) -> str:
    """A stable identity of a row across runs: family, op, dtype, shape and non-default settings."""
    shape = ",".join(f"{k}={row['shape'][k]}" for k in sorted(row["shape"]))
    settings = row.get("settings") or {}
    extra = ",".join(f"{k}={settings[k]}" for k in sorted(settings))
    return f"{row['family']}|{row['op']}|{row['dtype']}|{shape}" + (f"|{extra}" if extra else "")


def shape_label(shape: dict[str, Any], short: bool = True) -> str:
    """``M=1 N=2112 K=7168`` style label of a shape dict (``short`` drops derived keys such as ``valid_rows``)."""
    hidden = {"valid_rows", "pairs", "m_sum", "k_sum", "num_sms"} if short else set()
    return " ".join(f"{k}={v}" for k, v in shape.items() if k not in hidden)


def validate_row(row: dict[str, Any]) -> list[str]:
    """Problems with one row (empty when it is well-formed)."""
    problems = [f"missing {k!r}" for k in REQUIRED_ROW_KEYS if k not in row]
    if problems:
        return problems
    if not isinstance(row["shape"], dict) or not row["shape"]:
        problems.append("shape must be a non-empty dict")
    for key in ("ms", "graph_ms", "calc_diff"):
        val = row[key]
        if val is not None and not isinstance(val, (int, float)):
            problems.append(f"{key} must be a number or null, got {type(val).__name__}")
    if row["ms"] is None and not row.get("error"):
        problems.append("ms is null without an 'error'")
    if not isinstance(row["peers"], dict):
        problems.append("peers must be a dict")
        return problems
    notes = row.get("peer_notes") or {}
    for name, peer in row["peers"].items():
        if peer is None:
            if not notes.get(name):
                problems.append(f"peer {name!r} is null without a reason in peer_notes")
            continue
        missing = [k for k in PEER_KEYS if k not in peer]
        if missing:
            problems.append(f"peer {name!r} lacks {missing}")
    return problems


def validate(doc: dict[str, Any]) -> list[str]:
    """Problems with a whole results document (empty when it is well-formed)."""
    problems = []
    if not isinstance(doc, dict) or "rows" not in doc or "meta" not in doc:
        return ["a results file is a dict with 'meta' and 'rows'"]
    for i, row in enumerate(doc["rows"]):
        problems += [f"row {i}: {p}" for p in validate_row(row)]
    return problems


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def save(doc: dict[str, Any], path: str | Path) -> None:
    """Write ``doc`` as JSON (NaN becomes null, so the file is strict JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(doc), indent=1) + "\n")


def load(path: str | Path) -> dict[str, Any]:
    """Read a results file; a bare list of rows is accepted as ``{"meta": {}, "rows": list}``.

    Raises ``ValueError`` naming the problems when a row is malformed.
    """
    doc = json.loads(Path(path).read_text())
    if isinstance(doc, list):
        doc = {"meta": {}, "rows": doc}
    problems = validate(doc)
    if problems:
        raise ValueError(f"{path}: not a tilegemm-bench results file: " + "; ".join(problems[:5]))
    doc.setdefault("skipped", [])
    return doc


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from several runs (e.g. one per family): rows and skipped rows concatenated, a
    later run's row replacing an earlier one with the same :func:`row_key`; ``meta`` of the first run
    with ``merged_from`` listing each run's date, families and ceilings (those of an already merged document
    included). ValueError if the GPUs differ."""
    if len(docs) == 1:
        return docs[0]
    gpus = {d["meta"].get("gpu") for d in docs}
    if len(gpus) > 1:
        raise ValueError(f"refusing to merge runs from different GPUs: {sorted(map(str, gpus))}")
    rows: dict[str, dict[str, Any]] = {}
    for d in docs:
        for r in d["rows"]:
            rows[row_key(r)] = r
    meta = dict(docs[0]["meta"])
    keys = ("date", "families", "size", "seconds", "ceilings", "deepgemm")
    meta["merged_from"] = [  # a merged document brings the runs it was merged from
        run for d in docs for run in d["meta"].get("merged_from") or [{k: d["meta"].get(k) for k in keys}]
    ]
    meta["seconds"] = sum(d["meta"].get("seconds") or 0 for d in docs)
    meta["families"] = list(dict.fromkeys(r["family"] for r in rows.values()))
    skipped: dict[str, dict[str, Any]] = {}
    for d in docs:
        for entry in d.get("skipped", []):
            if not _measured(entry, rows.values()):
                skipped[json.dumps([entry.get("family"), entry.get("spec")], sort_keys=True)] = entry
    return {"meta": meta, "rows": list(rows.values()), "skipped": list(skipped.values())}


def _measured(entry: dict[str, Any], rows: Iterable[dict[str, Any]]) -> bool:
    """Whether a skipped entry (family and spec) was measured by a row of a merged run: same family and dtype, and
    the row's shape holds every other item of the spec."""
    spec = dict(entry.get("spec") or {})
    dtype = spec.pop("dtype", None)
    return any(
        r["family"] == entry.get("family")
        and (dtype is None or r["dtype"] == dtype)
        and all(r["shape"].get(k) == v for k, v in spec.items())
        for r in rows
    )


def best_ms(entry: dict[str, Any] | None) -> float | None:
    """The time a comparison uses: kernel-only (``graph_ms``) when measured, else eager ``ms``."""
    if not entry:
        return None
    return entry.get("graph_ms") or entry.get("ms")
