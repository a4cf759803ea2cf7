"""CPU compile gate for the gluon kernels (Hopper): every variant the host code can launch, compiled for sm_90a.

``triton.compile`` with an explicit target runs on a machine without a GPU (ptxas ships with triton). The SASS
is checked for what the schedule needs: FP8 wgmma (QGMMA, four m64n128k32 per warpgroup per K block), one
wgmma wait per warpgroup per K block (the promotion waits for its own block only), TMA loads of A, B and both
scales (no global loads in the MMA loop), TMA stores, no local-memory spills, shared memory within a CTA's, and a
proxy fence before each warpgroup's stage release (``tiles.release_stage``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from compile_gate.sass import dump_sass, opcode_counts, sass_summary, stage_releases  # noqa: E402
from tilegemm.heuristics.gluon import SMEM_BYTES, GluonDenseConfig, dense_fp8_config  # noqa: E402
from tilegemm.ops.gluon import aot, fp8_gemm_kernel  # noqa: E402

VARIANTS = [  # (1x128 B scales, addend, output dtype)
    (False, False, torch.bfloat16),
    (False, True, torch.float32),
    (True, False, torch.bfloat16),
    (True, True, torch.float32),
]


@pytest.fixture(scope="module")
def compiled():
    out = {}
    for sb_rows, has_c, dtype in VARIANTS:
        cfg = dense_fp8_config(4096, 4096, 4096, 132, torch.empty(0, dtype=dtype).element_size())
        out[(sb_rows, has_c, dtype)] = (cfg, aot.compile_dense_fp8(cfg, sb_rows=sb_rows, has_c=has_c, out_dtype=dtype))
    return out


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"rows{int(v[0])}-c{int(v[1])}-{str(v[2])[6:]}")
def test_dense_fp8_sass(compiled, variant):
    cfg, kernel = compiled[variant]
    assert kernel.name == fp8_gemm_kernel.fp8_gemm_kernel.__name__
    summary = sass_summary(kernel.asm["cubin"])
    sass = dump_sass(kernel.asm["cubin"])
    ops = opcode_counts(sass)
    assert summary["qgmma"] == 2 * 4, "two MMA warpgroups, four m64n128k32 QGMMAs each per K block"
    assert summary["gmma_group_min"] == 4
    assert ops["WARPGROUP.DEPBAR.LE"] == 2, "one wgmma wait per warpgroup per K block"
    assert summary["ldl"] == summary["stl"] == 0, "register spills"
    assert summary["utmaldg"] == 4, "A, B and both scales by TMA"
    assert summary["utmastg"] == 2, "each warpgroup stores its rows by TMA"
    plain_loads = sum(n for op, n in ops.items() if op.startswith("LDG"))
    assert (plain_loads > 0) == variant[1], "global loads only for the addend C, in the epilogue"
    assert kernel.metadata.shared <= SMEM_BYTES
    assert ops["USETMAXREG.TRY_ALLOC.CTAPOOL"] >= 1, "the MMA warpgroups take registers from the loader"
    assert stage_releases(sass)[1] == 2, (
        "each MMA warpgroup's stage release after a proxy fence (the turn arrivals not)"
    )


def test_deepest_ring_fits():
    """The ring depth the config picks is the deepest that fits: one stage more would not."""
    from tilegemm.heuristics.gluon import fit_stages

    cfg = fit_stages(GluonDenseConfig(stages=16), 2)
    kernel = aot.compile_dense_fp8(cfg)
    assert kernel.metadata.shared <= SMEM_BYTES
    deeper = aot.compile_dense_fp8(cfg._replace(stages=cfg.stages + 1))
    assert deeper.metadata.shared > SMEM_BYTES
