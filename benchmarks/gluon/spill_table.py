"""Registers and local-memory spills of FP8 ws designs compiled for sm_90a under the installed triton (CPU only).

For each design of ``fp8_gemm_ws.VARIANTS`` named: STL / LDL counts and the highest register of its SASS (dense
form, bf16 output). Run it once per triton and per ``src`` tree to compare, e.g. with a bundled triton unpacked
at /tmp/tri_3.9.0 (``pip install --no-deps --target /tmp/tri_3.9.0 triton==3.9.0``)::

    CUOBJDUMP=/tmp/tri_3.9.0/triton/backends/nvidia/bin/cuobjdump PYTHONPATH=/tmp/tri_3.9.0:src:tests \\
        python benchmarks/gluon/spill_table.py d_128x128_ov8 g_128x128_ov4
"""

from __future__ import annotations

import re
import sys

import triton
from compile_gate.sass import dump_sass, sass_summary

from tilegemm.ops.gluon import aot
from tilegemm.ops.gluon import fp8_gemm_ws as ws


def main() -> None:
    """Compile each design named on the command line and print one line per design."""
    for name in sys.argv[1:]:
        kernel = aot.compile_dense_fp8_ws(ws.VARIANTS[name])
        facts, sass = sass_summary(kernel.asm["cubin"]), dump_sass(kernel.asm["cubin"])
        top = max(int(r) for r in re.findall(r"\bR(\d+)\b", sass))
        print(f"triton {triton.__version__} {name}: STL {facts['stl']} LDL {facts['ldl']} max R{top}", flush=True)


if __name__ == "__main__":
    main()
