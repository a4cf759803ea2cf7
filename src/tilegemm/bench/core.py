"""One benchmark row: a :class:`Case` builds its inputs and implementations; :func:`measure_case` times them.

Every implementation (tilegemm first, then each peer) goes through the same steps, in this order:
first call on input set 0 (its wall time is the JIT / first-call cost), correctness of that output
against the row's float64 formula (``calc_diff``), eager median over the rotating input sets, and
kernel-only time from a CUDA graph of several calls. A step that raises is recorded with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tilegemm.bench import timing

#: Default calc_diff bar (DESIGN.md: vs the exact formula on the same (dequantized) inputs, bf16 out).
DEFAULT_BAR = 1e-5


@dataclass
class Impl:
    """One implementation of a row.

    ``sets`` holds the argument tuple of each rotating input set in this implementation's own
    formats (or a string: why it cannot run this row); ``call(*args)`` is what is timed;
    ``result(returned, *args)`` gives, after a call, the tensor compared with the reference (it may
    crop); ``None`` compares what the call returned. ``check`` replaces :attr:`Built.check` for this
    implementation (e.g. to add measurements that only it has).
    """

    name: str
    sets: list[tuple] | str
    call: Callable[..., Any]
    result: Callable[..., torch.Tensor] | None = None
    note: str | None = None
    reset: Callable[[], Any] | None = None  # run before the checked first call (e.g. zero an accumulator)
    check: Callable[[torch.Tensor], dict[str, Any]] | None = None
    bar: float | None = None  # replaces the case's calc_diff bar for this implementation (its own recipe)


def ready_calls(name: str, calls: list[Callable[[], Any] | str], note: str) -> Impl:
    """A peer's :class:`Impl` of one ready no-argument call per input set (as :func:`peers.cublas_fp8_blockwise`
    returns them), or, where the first of ``calls`` is a string, that reason why it cannot run this row."""
    if isinstance(calls[0], str):
        return Impl(name, calls[0], None)
    return Impl(name, [(f,) for f in calls], lambda f: f(), note=note)


@dataclass
class Built:
    """What :meth:`Case.build` returns: the implementations and the check of an output of set 0."""

    impls: list[Impl]
    check: Callable[[torch.Tensor], dict[str, Any]]


@dataclass
class Case:
    """A row to measure: identity, work counts (for TFLOP/s and GB/s) and a builder of inputs.

    ``flops`` counts useful multiply-adds x2; ``bytes`` every byte a kernel must move at least
    (operands read once, output written once); ``bar`` is the calc_diff an implementation must beat.
    """

    family: str
    op: str
    dtype: str
    shape: dict[str, Any]
    flops: float
    bytes: float
    build: Callable[[], Built]
    settings: dict[str, Any] = field(default_factory=dict)
    bar: float = DEFAULT_BAR
    note: str | None = None


def diff_check(reference: Callable[[], torch.Tensor]) -> Callable[[torch.Tensor], dict[str, Any]]:
    """A ``Built.check`` comparing an output with ``reference()`` (float64, computed once, lazily)."""
    cache: dict[str, torch.Tensor] = {}

    def check(out: torch.Tensor) -> dict[str, Any]:
        if "ref" not in cache:
            cache["ref"] = reference()
        from tilegemm.testing import calc_diff

        return {"calc_diff": calc_diff(out, cache["ref"])}

    return check


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def measure_impl(impl: Impl, built: Built, bar: float, graph_calls: int | None = None) -> dict[str, Any]:
    """Time one implementation: ``{"jit_ms", "calc_diff", "correct", "ms", "graph_ms", "error"?, "note"?}``."""
    sets = impl.sets
    assert not isinstance(sets, str)
    entry: dict[str, Any] = {"ms": None, "graph_ms": None, "calc_diff": None, "jit_ms": None}
    if impl.note:
        entry["note"] = impl.note
    try:
        held: dict[str, Any] = {}
        if impl.reset is not None:
            impl.reset()
        entry["jit_ms"] = round(timing.first_call_ms(lambda: held.setdefault("out", impl.call(*sets[0]))), 3)
        out = held["out"] if impl.result is None else impl.result(held["out"], *sets[0])
        checked = (impl.check or built.check)(out)
        entry.update(checked)
        diff = entry["calc_diff"]
        entry["correct"] = diff is not None and math.isfinite(diff) and diff < bar and checked.get("ok", True)
        entry["ms"] = timing.eager_ms(timing.Cycler(sets, impl.call))
    except Exception as exc:
        entry["error"] = _short(exc)
        return entry
    try:
        calls = graph_calls or max(4, len(sets))
        entry["graph_ms"] = timing.graph_ms(timing.Cycler(sets, impl.call), calls)
    except Exception as exc:
        entry["graph_error"] = _short(exc)
    timing.sync()
    return entry


def _rates(entry: dict[str, Any], case: Case, ceil: dict[str, Any]) -> None:
    ms = entry.get("graph_ms") or entry.get("ms")
    if not ms:
        return
    tflops = case.flops / (ms * 1e-3) / 1e12
    gbps = case.bytes / (ms * 1e-3) / 1e9
    entry["tflops"] = round(tflops, 2)
    entry["gbps"] = round(gbps, 1)
    peak = ceil.get("fp8_tflops") if case.dtype.startswith("fp8") else ceil.get("bf16_tflops")
    if peak:
        entry["frac_peak_flops"] = round(tflops / peak, 4)
    if ceil.get("copy_gbps"):
        entry["frac_copy_bw"] = round(gbps / ceil["copy_gbps"], 4)


def _round(entry: dict[str, Any]) -> dict[str, Any]:
    for key in ("ms", "graph_ms"):
        if isinstance(entry.get(key), float):
            entry[key] = round(entry[key], 5)
    return entry


def measure_case(case: Case, ceil: dict[str, Any]) -> dict[str, Any]:
    """Build ``case`` and measure every implementation; returns the results row (see :mod:`.schema`)."""
    row: dict[str, Any] = {
        "family": case.family,
        "op": case.op,
        "dtype": case.dtype,
        "shape": dict(case.shape),
        "settings": dict(case.settings),
        "flops": case.flops,
        "bytes": case.bytes,
        "bar": case.bar,
        "ms": None,
        "graph_ms": None,
        "calc_diff": None,
        "peers": {},
        "peer_notes": {},
    }
    if case.note:
        row["note"] = case.note
    try:
        built = case.build()
    except Exception as exc:
        row["error"] = f"building inputs failed: {_short(exc)}"
        return row
    for impl in built.impls:
        if isinstance(impl.sets, str):
            entry = None
            reason = impl.sets
        else:
            entry = measure_impl(impl, built, impl.bar or case.bar)
            reason = entry.get("error")
            _rates(entry, case, ceil)
            _round(entry)
        if impl.name == "tilegemm":
            if entry is None:
                row["error"] = reason
            else:
                row.update({k: v for k, v in entry.items() if k != "error"})
                if reason:
                    row["error"] = reason
        elif entry is None or entry.get("ms") is None:
            row["peers"][impl.name] = None
            row["peer_notes"][impl.name] = reason or "failed"
        else:
            row["peers"][impl.name] = entry
            if entry.get("graph_error"):
                row["peer_notes"][impl.name] = f"no CUDA graph: {entry['graph_error']}"
    del built
    timing.empty_cache()
    return row
