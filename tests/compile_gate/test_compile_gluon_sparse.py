"""CPU compile gate for the gluon sparse decode attention (``ops/gluon/sparse_attention.py``), sm_90a.

Every launch the host makes at DeepSeek-V3.2's shape (keys 192 wide, values 128; mask none / boolean / additive; one
split or several, then the combine kernel) is compiled, and its SASS checked for what the design needs: a step of
the loop loads its selected key rows in 16-byte loads (``LDG.E.128``, a warp a row) and its value rows in 8-byte
ones; a row's dot product is one 32-lane butterfly; no local memory (spills), no shared memory beyond the final
merge's, and a boolean mask read as one byte per selected key.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from compile_gate.sass import dump_sass, opcode_counts, sass_summary  # noqa: E402
from tilegemm.ops.gluon import aot, sparse_attention  # noqa: E402

VARIANTS = [(mask, splits) for mask in (0, 1, 2) for splits in (1, 5)]


@pytest.fixture(scope="module")
def compiled():
    return {v: aot.compile_sparse_decode(mask=v[0], splits=v[1]) for v in VARIANTS}


def _loop(sass: str) -> list[str]:
    """The main loop's body: the instructions from a backward branch's target to the branch, the longest such span
    holding a 16-byte load."""
    at = {}
    lines = sass.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"/\*([0-9a-f]{4,})\*/", line)
        if m:
            at[int(m.group(1), 16)] = i
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"/\*([0-9a-f]{4,})\*/.*\bBRA\b.*?0x([0-9a-f]+)", line)
        if m and int(m.group(2), 16) < int(m.group(1), 16) and int(m.group(2), 16) in at:
            body = lines[at[int(m.group(2), 16)] : i + 1]
            if any("LDG.E.128" in b for b in body):
                loops.append(body)
    assert loops, "no loop with 16-byte loads"
    return max(loops, key=len)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"mask{v[0]}-splits{v[1]}")
def test_sparse_decode_sass(compiled, variant):
    kernel = compiled[variant]
    assert kernel.name == sparse_attention.sparse_decode_kernel.__name__
    sass = dump_sass(kernel.asm["cubin"])
    ops, summary = opcode_counts(sass), sass_summary(kernel.asm["cubin"])
    assert summary["ldl"] == summary["stl"] == 0, "register spills"
    rows_per_thread = sparse_attention.BLOCK_N // sparse_attention.NUM_WARPS // sparse_attention.ROW_LANES
    body = opcode_counts("\n".join(_loop(sass)))
    assert body["LDG.E.128"] == rows_per_thread, "a step loads its key rows in 16-byte loads"
    assert body["LDG.E.64"] == rows_per_thread, "...and its value rows in 8-byte loads"
    assert ops["LDG.E.128"] == rows_per_thread + 1, "...and nothing else 16 bytes wide but the query"
    assert (body["LDG.E.U8"] > 0) == (variant[0] == 1), "a boolean mask: one byte per selected key"
    assert body["SHFL.BFLY"] == 5 * rows_per_thread, "a key row's dot product: one 32-lane butterfly a row"
    assert kernel.metadata.shared <= 4096, "shared memory only for the final merge of the row slots"


def test_combine_kernel_compiles_without_spills():
    kernel = aot.compile_sparse_combine(splits=5)
    summary = sass_summary(kernel.asm["cubin"])
    assert summary["ldl"] == summary["stl"] == 0
    assert opcode_counts(dump_sass(kernel.asm["cubin"]))["STG.E.64"] == 1, "one 8-byte store of the bf16 row a lane"
