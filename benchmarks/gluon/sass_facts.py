"""The SASS facts the gluon design probes report for a compiled kernel: registers (``.maxnreg`` and each
partition's ``setmaxnreg``), local memory, and the counts of the instructions that matter (QGMMA, TMA loads and
multicast loads, remote barrier arrives)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton

#: ``USETMAXREG.DEALLOC|TRY_ALLOC.CTAPOOL [UPn,] 0x..``: a partition's register count after ``setmaxnreg``.
_SETMAXNREG = r"USETMAXREG\.(\w+)\.CTAPOOL\s+(?:UP\d+,\s*)?(0x[0-9a-f]+)"


def sass_facts(kernel) -> dict:
    """Registers (``.maxnreg`` and ``USETMAXREG``), local memory and the counts of the instructions that matter."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        cuobjdump = Path("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(cuobjdump), "--dump-sass", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M)
    count = lambda prefix: sum(op.startswith(prefix) for op in ops)  # noqa: E731
    return {
        "maxnreg": re.findall(r"\.maxnreg (\d+)", kernel.asm["ptx"]),
        "shared": kernel.metadata.shared,
        "setmaxnreg": [f"{kind.lower()} {int(n, 16)}" for kind, n in re.findall(_SETMAXNREG, sass)],
        "local": count("STL") + count("LDL"),
        "qgmma": count("QGMMA"),
        "tma_multicast": count("UTMALDG.2D.MULTICAST"),
        "tma_loads": count("UTMALDG"),
        "remote_arrive": count("SYNCS.ARRIVE.TRANS64.RED"),
        "instructions": len(ops),
    }
