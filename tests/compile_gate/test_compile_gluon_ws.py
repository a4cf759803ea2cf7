"""CPU compile gate for the prototype gluon FP8 kernel ``fp8_gemm_ws`` (Hopper): every design, compiled for sm_90a.

``triton.compile`` with an explicit target runs without a GPU (ptxas ships with triton); the SASS is read with
cuobjdump. What each design needs: ``setmaxnreg`` in the SASS (``USETMAXREG``: the MMA warps in the default
partition take the registers the loader warp gives up), no local-memory spills, the FP8 wgmma (QGMMA) count of
one K block in the main loop (four m64n128k32 per 128-row wave, four m64n64k32 more for a 192-wide tile) issued
in groups of four (not serialized), registers within the default partition's ``setmaxnreg`` budget, and shared
memory within a CTA's. The designs with the next step's wgmma before the promotion (``OVERLAP``) compile but ptxas
serializes their wgmma (C7514) and spills: they are strict xfails, to be noticed when that changes.

Run as a script (``python tests/compile_gate/test_compile_gluon_ws.py``) to print the facts table.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from compile_gate.sass import cuobjdump_path, dump_sass, loop_bodies, opcode_counts, sass_summary  # noqa: E402
from tilegemm.ops.gluon import fp8_gemm_ws as ws  # noqa: E402

GOOD = ["a_128x128", "a_128x128_p", "b_256x128", "b_256x128_np", "c_128x192"]
OVERLAP = [name for name, cfg in ws.VARIANTS.items() if cfg.overlap]


def _tools_reason() -> str | None:
    """Why the gate cannot run here (no ptxas or cuobjdump), or ``None``."""
    from triton import knobs

    try:
        ptxas = knobs.nvidia.ptxas.path
    except Exception as exc:  # triton raises when its bundled ptxas is missing
        return f"no ptxas: {exc}"
    exe = cuobjdump_path()
    if shutil.which(exe) is None:
        return f"no cuobjdump ({exe})"
    for tool in (ptxas, exe):
        if subprocess.run([tool, "--version"], capture_output=True).returncode != 0:
            return f"{tool} does not run"
    return None


def sass_facts(kernel) -> dict:
    """What the gate checks of a compiled ``fp8_gemm_ws_kernel``, read from its SASS and PTX."""
    cubin = kernel.asm["cubin"]
    sass = dump_sass(cubin)
    ops = opcode_counts(sass)
    summary = sass_summary(cubin)
    loop = max((b for b in loop_bodies(sass) if any("QGMMA" in t for t in b)), key=len, default=[])
    budgets = [int(x) for x in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"])]
    return {
        "usetmaxreg": sum(n for op, n in ops.items() if op.startswith("USETMAXREG")),
        "stl": summary["stl"],
        "ldl": summary["ldl"],
        "qgmma_per_k_block": sum(1 for t in loop if "QGMMA" in t),
        "qgmma_shapes": sorted({m.group(0) for t in loop for m in [re.search(r"QGMMA\.\w+", t)] if m}),
        "gmma_group_min": summary["gmma_group_min"],
        "max_register": max(int(x) for x in re.findall(r"\bR(\d+)\b", sass)),
        "mma_budget": max(budgets, default=0),  # the default partition's setmaxnreg (the largest decrease)
        "shared_bytes": kernel.metadata.shared,
        "utmaldg": summary["utmaldg"],
        "utmastg": summary["utmastg"],
    }


@pytest.fixture(scope="module")
def facts():
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    out = {}
    for name in ws.VARIANTS:
        try:
            out[name] = sass_facts(ws.compile_ws(ws.VARIANTS[name]))
        except Exception as exc:
            out[name] = exc
    return out


def _get(facts, name):
    got = facts[name]
    if isinstance(got, Exception):
        raise got
    return got


@pytest.mark.parametrize("name", GOOD)
def test_ws_sass(facts, name):
    cfg = ws.VARIANTS[name]
    f = _get(facts, name)
    assert f["usetmaxreg"] >= 1, "setmaxnreg: the MMA warps take the loader warp's registers"
    assert f["stl"] == f["ldl"] == 0, "register spills"
    per_wave = 4 + (4 if cfg.block_n == 192 else 0)
    assert f["qgmma_per_k_block"] == cfg.waves * per_wave, "QGMMA m64nNk32 per K block: 4 per 128-wide sub-tile"
    want = {"QGMMA.64x128x32"} | ({"QGMMA.64x64x32"} if cfg.block_n == 192 else set())
    assert set(f["qgmma_shapes"]) == want
    assert f["gmma_group_min"] == 4, "each sub-tile's four wgmma in one group (ptxas did not serialize them)"
    assert 0 < f["max_register"] < f["mma_budget"] <= 240, "registers within the default partition's budget"
    assert f["shared_bytes"] <= ws.SMEM_BYTES
    assert f["utmaldg"] == 3 + (cfg.block_n == 192), "A, B (one or two sub-tiles) and A's scales by TMA"


@pytest.mark.parametrize("name", OVERLAP)
@pytest.mark.xfail(strict=True, reason="ptxas serializes the overlapped wgmma (C7514) and spills")
def test_ws_overlap_sass(facts, name):
    f = _get(facts, name)
    assert f["stl"] == f["ldl"] == 0 and f["gmma_group_min"] >= 4


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_ws_ring_fits(out_dtype):
    """The ring depth :func:`ws_config` picks fits beside the output staging tiles; one stage more would not."""
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    cfg = ws.ws_config(ws.Problem(4096, 4096, 4096, out_dtype), ws.VARIANTS["c_128x192"])
    assert ws.compile_ws(cfg, out_dtype).metadata.shared <= ws.SMEM_BYTES
    if cfg.stages < 8:
        assert ws.stage_bytes(cfg) * (cfg.stages + 1) + ws.staging_bytes(cfg, out_dtype.itemsize) > ws.SMEM_BYTES


if __name__ == "__main__":
    cols = ["usetmaxreg", "stl", "ldl", "qgmma_per_k_block", "gmma_group_min", "max_register", "mma_budget"]
    print("| variant | config | " + " | ".join(cols) + " | shared | QGMMA shapes |")
    print("|---" * (len(cols) + 4) + "|")
    for name, cfg in ws.VARIANTS.items():
        try:
            f = sass_facts(ws.compile_ws(cfg))
        except Exception as exc:
            print(f"| {name} | FAILED: {type(exc).__name__}: {str(exc)[:200]} |")
            continue
        stages = ws.ws_config(ws.Problem(4096, 4096, 4096, torch.bfloat16), cfg).stages
        shape = (
            f"{128 * cfg.waves}x{cfg.block_n} s{stages}{' P' if cfg.persistent else ''}{' OV' if cfg.overlap else ''}"
        )
        row = " | ".join(str(f[c]) for c in cols)
        print(f"| {name} | {shape} | {row} | {f['shared_bytes']} | {' '.join(f['qgmma_shapes'])} |")
