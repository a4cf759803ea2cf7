"""The check the gluon design probes (``multicast_probe.py``, ``wg_split_probe.py``) run on a kernel before timing
it: every check shape against the float64 formula (``calc_diff``) and a rerun on a small grid (each CTA walking many
tiles) compared bitwise, in a child process with a time limit, so that a hang (a barrier never completed) is reported
and does not stop the run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable

from fp8_ws_sweep import DESIGN_CHECKS


def check_shapes(run: Callable) -> None:
    """Child process body: ``run(a, b, d, small_grid)`` on every check shape; one ``RESULT`` line a shape."""
    import torch
    from fp8_ws_sweep import quant, reference

    from tilegemm.testing import calc_diff

    for m, n, k in DESIGN_CHECKS:
        a, b = quant(m, n, k, 3)
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        run(a, b, d, False)
        first = d.clone()
        d.fill_(float("nan"))
        run(a, b, d, True)
        torch.cuda.synchronize()
        res = {
            "shape": f"{m}x{n}x{k}",
            "diff": calc_diff(first, reference(a, b)),
            "bitwise": bool(torch.equal(first, d)),
        }
        print("RESULT", json.dumps(res), flush=True)


def check_in_child(code: str, label: str, timeout_s: float = 100.0) -> list[dict]:
    """Run ``code`` (python calling :func:`check_shapes`) in a child process; the shapes it reported, and those it did
    not with the reason (an error, or a timeout: a hang)."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
        stdout, err = out.stdout, "" if out.returncode == 0 else (out.stderr or out.stdout)[-800:]
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = f"timeout after {timeout_s:.0f} s (hang)"
    results = [json.loads(x) for x in re.findall(r"^RESULT (.*)$", stdout, re.M)]
    done = {r["shape"] for r in results}
    results += [{"shape": f"{m}x{n}x{k}", "error": err} for m, n, k in DESIGN_CHECKS if f"{m}x{n}x{k}" not in done]
    for r in results:
        print(f"  check {label}: {r}", flush=True)
    return results


def passed(results: list[dict], bar: float = 1e-5) -> bool:
    """Every shape within ``bar`` of the float64 formula and bitwise equal on the rerun."""
    return all("diff" in r and r["diff"] < bar and r["bitwise"] for r in results)
