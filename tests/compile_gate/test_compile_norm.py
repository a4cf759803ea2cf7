"""CPU compile gate for the RMSNorm kernel (``ops/cutile/norm.py``), sm_90 and sm_100.

Every tile :func:`heuristics.rms_norm_config` picks (rows of 1 to ``NORM_MAX_COLS`` elements), bf16 rows with a
bf16 weight; fp32 and fp16 rows, and bf16 rows with an fp32 weight (fp32 output), at the largest tile; rows whose
pitch is not a multiple of 16 bytes. Each is compiled with ``export_kernel`` (no GPU) and its SASS checked: no
LDL/STL spills, and the occupancy hint holds (``NORM_OCCUPANCY`` CTAs fit an SM in registers and shared memory).
"""

from __future__ import annotations

import pytest

ct = pytest.importorskip("cuda.tile")

from compile_gate.sass import compile_all, launch_resources, sass_summary  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.ops.cutile import aot, norm  # noqa: E402

ARCHS = aot.ARCHS
_F32 = aot.scalar(ct.float32)
SHARED_PER_SM = 228 * 1024
REGISTERS_PER_SM = 65536


def _params(cfg: heuristics.NormConfig, x_dtype, w_dtype, out_dtype, align_bytes: int = 16) -> list:
    arrays = [aot.array(x_dtype, 2, align_bytes=align_bytes), aot.array(w_dtype, 1), aot.array(out_dtype, 2)]
    return [*arrays, _F32, _F32, *norm.kernel_constants(cfg)]


def _configs() -> list[heuristics.NormConfig]:
    return sorted({heuristics.rms_norm_config(h) for h in range(1, heuristics.NORM_MAX_COLS + 1)}, key=lambda c: c.cols)


def _variants():
    """(id, params) of every kernel variant the op launches."""
    bf16 = ct.bfloat16
    out = [(f"bf16-{c.rows}x{c.cols}", _params(c, bf16, bf16, bf16)) for c in _configs()]
    big = heuristics.rms_norm_config(heuristics.NORM_MAX_COLS)
    out.append(("f32-big", _params(big, ct.float32, ct.float32, ct.float32)))
    out.append(("f16-big", _params(big, ct.float16, ct.float16, ct.float16)))
    out.append(("bf16-f32-weight-big", _params(big, bf16, ct.float32, ct.float32)))
    odd = heuristics.rms_norm_config(97)
    out.append(("bf16-unaligned-rows", _params(odd, bf16, bf16, bf16, align_bytes=2)))
    return out


VARIANTS = _variants()


def _summary(cubin: bytes) -> dict[str, int]:
    return {**sass_summary(cubin), **launch_resources(cubin)}


@pytest.fixture(scope="module")
def compiled():
    jobs = [(vid, norm.get_kernel(), params, arch) for vid, params in VARIANTS for arch in ARCHS]
    return compile_all(jobs, aot.compile_cubin, _summary)


def test_every_row_length_has_a_tile():
    for h in (1, 2, 3, 127, 128, 129, 2048, 7168, heuristics.NORM_MAX_COLS):
        cfg = heuristics.rms_norm_config(h)
        assert cfg.cols >= h and cfg.cols < 2 * h and cfg.rows * cfg.cols <= heuristics.NORM_TILE_ELEMS
    assert heuristics.rms_norm_config(heuristics.NORM_MAX_COLS + 1) is None
    assert heuristics.rms_norm_config(0) is None


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid", [v[0] for v in VARIANTS])
def test_norm_kernel_sass(compiled, vid, arch):
    s = compiled[(vid, arch)]
    if isinstance(s, Exception):
        raise s
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: spills {s['ldl']} LDL / {s['stl']} STL"
    ctas = heuristics.NORM_OCCUPANCY
    assert ctas * s["threads"] * s["registers"] <= REGISTERS_PER_SM, f"{vid} {arch}: {s}"
    assert ctas * s["shared"] <= SHARED_PER_SM, f"{vid} {arch}: {s}"
