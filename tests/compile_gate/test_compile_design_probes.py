"""CPU compile gate for the gluon design probe that runs under the installed triton: the FP8 kernel with each MMA
warpgroup a partition of its own (``benchmarks/gluon/wg_split_kernel.py``, issue 51; its results in
``benchmarks/results/gluon/README.md``). It reuses the shipped kernel's pipelined-step helpers
(``fp8_gemm_ws_kernel._ov_issue`` / ``_ov_wait`` / ``_ov_promote``), so a change there must keep it compiling with
the SASS its results describe: ``setmaxnreg`` giving warpgroup 1 its 232 registers, no local memory, four QGMMA
m64n128k32 a warpgroup a K block (two 64-row halves each at 256x128: 16 in all), and with the pipeline (runs of 4
K blocks: 7 steps a warpgroup, 56 QGMMA) one wgmma kept in flight (``WARPGROUP.DEPBAR.LE gsb0, 0x1``).
The 2-CTA multicast probe needs triton >= 3.7.1 and is compiled by its own ``--compile-only``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from compile_gate.sass import dump_sass  # noqa: E402

PROBES = Path(__file__).resolve().parents[2] / "benchmarks" / "gluon"


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(PROBES))
    try:
        import wg_split_probe

        yield wg_split_probe
    finally:
        sys.path.remove(str(PROBES))


@pytest.mark.parametrize(("name", "qgmma", "in_flight"), [("wg_256x128", 16, 0), ("wg_128x128_ov4", 56, 2 * 4)])
def test_wg_split_sass(probe, name: str, qgmma: int, in_flight: int) -> None:
    kernel = probe.compiled(*probe.VARIANTS[name])
    facts = probe.sass_facts(kernel)
    assert facts["local"] == 0, facts
    assert facts["qgmma"] == qgmma, facts
    assert f"try_alloc {probe.MMA_REGS}" in facts["setmaxnreg"], facts
    assert facts["shared"] <= 232448, facts  # a CTA's shared memory on sm_90
    assert dump_sass(kernel.asm["cubin"]).count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == in_flight
