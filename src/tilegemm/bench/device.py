"""The machine a run measures: GPU name, clocks, versions, date, and the ceilings every row is read against.

Ceilings are measured once at the start of a run, on the same GPU, with the same timer as the rows:

* ``copy_gbps``: device-to-device copy of a 1 GiB buffer, read + write bytes over time;
* ``bf16_tflops``: cuBLAS BF16 ``torch.matmul`` on 8192^3;
* ``fp8_tflops``: cuBLAS FP8 ``torch._scaled_mm`` on 8192^3 with per-tensor scales (the FP8 peak);
* ``fp8_blockwise_tflops``: the same with 1x128 / 128x128 block scales, where the installed torch has it.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from typing import Any

import torch

from tilegemm.bench import timing

NO_GPU_MESSAGE = """\
tilegemm-bench: no CUDA GPU here.

Running benchmarks needs a CUDA GPU (compute capability >= 8.0) with torch's CUDA build and
cuda-tile[tileiras] installed. On such a machine:

    tilegemm-bench --quick --save results.json        # or: python -m tilegemm.bench --quick
    make bench PY=python3                              # the --full set, into benchmarks/results/

Without a GPU, saved results can still be read back:

    tilegemm-bench --from results.json --markdown results.md --plot plots/ [--compare base.json]
    tilegemm-bench render --from benchmarks/results/h100.json --readme README.md
"""


NO_CUTILE_MESSAGE = """\
tilegemm-bench: this GPU machine has no cutile backend (cuda.tile / tileiras not importable), so every row would
time tilegemm's pytorch reference backend instead of its kernels. Install cuda-tile[tileiras], or make it importable
(the device bundle's setup.sh puts it on PYTHONPATH: extend PYTHONPATH after it, do not replace it).
"""


def has_cutile() -> bool:
    """True when tilegemm's cutile backend can run here (what the harness times)."""
    from tilegemm import get_available_backends

    return "cutile" in get_available_backends()


def has_gpu() -> bool:
    """True when torch sees a CUDA device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def _clocks() -> dict[str, Any]:
    """SM / memory clocks (current and max, MHz) from nvidia-smi, or {} when it is not there."""
    query = "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    keys = ["sm_mhz", "max_sm_mhz", "mem_mhz", "max_mem_mhz", "power_limit_w", "driver"]
    vals = [v.strip() for v in out.split(",")]
    return dict(zip(keys, vals)) if len(vals) == len(keys) else {}


def versions() -> dict[str, str | None]:
    """torch / CUDA / cuda.tile / triton / python versions (None where not installed)."""
    info: dict[str, str | None] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import cuda.tile as ct

        info["cutile"] = getattr(ct, "__version__", "?")
    except Exception:
        info["cutile"] = None
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    try:
        from importlib.metadata import version

        info["tilegemm"] = version("tilegemm")
    except Exception:
        import tilegemm

        info["tilegemm"] = getattr(tilegemm, "__version__", None)
    return info


def describe() -> dict[str, Any]:
    """GPU name, SM count, memory, clocks, versions and date of this run (CUDA needed for the GPU fields)."""
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "clocks": _clocks(),
        "versions": versions(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def _copy_gbps(nbytes: int = 2**30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = timing.eager_ms(lambda: dst.copy_(src), budget_ms=100)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _tflops(ms: float, n: int) -> float:
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def _bf16_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, b.t(), out=out)
    return _tflops(timing.eager_ms(lambda: torch.matmul(a, b.t(), out=out), budget_ms=150), n)


def _fp8_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")

    def call():
        return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    call()
    return _tflops(timing.eager_ms(call, budget_ms=150), n)


def _fp8_blockwise_tflops(n: int = 8192) -> float | None:
    from tilegemm.bench import peers

    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    from tilegemm import per_block_cast_to_fp8, per_token_cast_to_fp8

    qa, sa = per_token_cast_to_fp8(a)
    qb, sb = per_block_cast_to_fp8(b)
    call = peers.cublas_fp8_blockwise(qa, sa, qb, sb, torch.bfloat16)
    if isinstance(call, str):
        return None
    call()
    return _tflops(timing.eager_ms(call, budget_ms=150), n)


def ceilings() -> dict[str, float | None]:
    """Measure the device ceilings (copy bandwidth, cuBLAS BF16/FP8 peaks); a failed one is None."""
    out: dict[str, float | None] = {}
    for name, fn in (
        ("copy_gbps", _copy_gbps),
        ("bf16_tflops", _bf16_tflops),
        ("fp8_tflops", _fp8_tflops),
        ("fp8_blockwise_tflops", _fp8_blockwise_tflops),
    ):
        try:
            val = fn()
            out[name] = None if val is None else round(val, 1)
        except Exception:
            out[name] = None
        torch.cuda.empty_cache()
    return out
