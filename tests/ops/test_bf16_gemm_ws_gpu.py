"""The gluon warp-specialized BF16 kernel (``bf16_gemm_ws``) on a Hopper GPU: every design over awkward shapes.

Each case: fresh random bf16 inputs, ``d`` poisoned with NaN, the result compared with ``calc_diff`` against the
float64 product, then a rerun that must be bitwise identical; also a persistent grid smaller than the tile count, an
fp32 output, a second call of the plan on new operands, and the checks' refusals. The split designs (``_sk``) on
grids whose last round is split: ``test_split_tail_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.testing import assert_rerun_identical, calc_diff, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")

# M = 1, M and N off the tiles, K = 8 (one partial K block) and K past the last full block, a DeepSeek-sized row.
SHAPES = [(1, 256, 64), (129, 136, 8), (300, 200, 1096), (257, 520, 640), (1000, 2112, 7168), (4097, 264, 2048)]
BAR = 1e-5


def _case(m: int, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    return a, b, a.double() @ b.double().t()


def _check(a, b, ref, d, **kwargs) -> None:
    plan = bw.bf16_ws_plan(a, b, d, **kwargs)
    run = lambda: plan(a, b, d)  # noqa: E731
    run()
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < BAR
    assert_rerun_identical(run, d)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(bw.VARIANTS))
def test_bf16_ws(name, shape):
    a, b, ref = _case(*shape, seed=sum(shape))
    _check(a, b, ref, poisoned(shape[:2], torch.bfloat16, "cuda"), cfg=bw.VARIANTS[name])


@pytest.mark.parametrize("name", list(bw.VARIANTS))
def test_bf16_ws_walk_and_fp32(name):
    """Three CTAs over many tiles, into an fp32 output."""
    a, b, ref = _case(1000, 1000, 1024, seed=7)
    _check(a, b, ref, poisoned((1000, 1000), torch.float32, "cuda"), cfg=bw.VARIANTS[name], num_sms=3)


def test_bf16_ws_plan_relaunches_on_new_operands(monkeypatch):
    """Later runs of a plan (the compiled kernel's relaunch) read the operands they are given, and go straight to
    triton's C launcher under the installed triton (its descriptor wrapper is one ``tma.Relaunch`` knows)."""
    from tilegemm.ops.gluon import tma

    made = []
    monkeypatch.setattr(bw, "Relaunch", lambda *args: made.append(tma.Relaunch(*args)) or made[-1])
    a, b, _ = _case(300, 520, 512, seed=1)
    d = torch.empty(300, 520, device="cuda", dtype=torch.bfloat16)
    plan = bw.bf16_ws_plan(a, b, d)
    plan(a, b, d)
    assert len(made) == 1 and made[0].direct is not None
    for seed in (2, 3):
        a2, b2, ref = _case(300, 520, 512, seed=seed)
        d2 = poisoned((300, 520), torch.bfloat16, "cuda")
        plan(a2, b2, d2)
        torch.cuda.synchronize()
        assert calc_diff(d2, ref) < BAR


def test_bf16_ws_refuses():
    a = torch.randn(64, 128, device="cuda").bfloat16()
    d = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must be bf16"):
        bw.bf16_ws_plan(a.half(), a[:64].half(), d)
    with pytest.raises(ValueError, match="TMA-ready"):
        bw.bf16_ws_plan(a, a.t().contiguous().t()[:64], d)
    with pytest.raises(ValueError, match="shapes"):
        bw.bf16_ws_plan(a, a[:, :64], d)


# The public op on the gluon backend: (M, N, K), each design the rule picks there, and shapes off the tiles.
PUBLIC_SHAPES = [(256, 4096, 7168), (512, 2112, 1024), (384, 1536, 2048), (160, 7168, 2048), (300, 200, 1096)]
PUBLIC_SHAPES += [(2048, 2112, 7168)]  # 272 128x128 tiles: on 132 SMs two rounds and a split tail
PUBLIC_SHAPES += [(112, 8192, 1024)]  # fewer rows than a 128-row tile, 128 64x128 tiles: the automatic choice too


@pytest.mark.parametrize("shape", PUBLIC_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_public_bf16_gemm_nt_on_gluon(shape, out):
    """``bf16_gemm_nt(..., backend="gluon")`` against float64, every element written, reruns bitwise; the automatic
    choice, where :func:`tilegemm.heuristics.gluon.prefers_dense_bf16` takes the shape, is the same kernel."""
    import tilegemm
    from tilegemm.heuristics import gluon as rules

    a, b, ref = _case(*shape, seed=sum(shape))
    d = poisoned(shape[:2], out, "cuda")
    run = lambda: tilegemm.bf16_gemm_nt(a, b, d, backend="gluon")  # noqa: E731
    run()
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < BAR
    assert_rerun_identical(run, d)
    if rules.prefers_dense_bf16(*shape, torch.cuda.get_device_properties(0).multi_processor_count):
        auto = poisoned(shape[:2], out, "cuda")
        tilegemm.bf16_gemm_nt(a, b, auto)
        assert torch.equal(auto, d)


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_public_bf16_layouts_the_kernel_does_not_read_fall_back(layout):
    """An MN-major operand: the gluon kernel makes no copies, so a forced gluon call falls back to the default
    backend with a warning, and the result is the product."""
    import tilegemm
    from tilegemm.backend.registry import FallbackWarning

    m, n, k = 256, 512, 1024
    a, b, ref = _case(m, n, k, seed=3)
    a_arg = a.t().contiguous() if layout[0] == "t" else a
    b_arg = b.t().contiguous() if layout[1] == "n" else b
    d = poisoned((m, n), torch.bfloat16, "cuda")
    with pytest.warns(FallbackWarning):
        getattr(tilegemm, f"bf16_gemm_{layout}")(a_arg, b_arg, d, backend="gluon")
    assert calc_diff(d, ref) < BAR


def test_public_bf16_addend_falls_back():
    """An addend (``c``) is not the gluon kernel's: a forced gluon call falls back with a warning."""
    import tilegemm
    from tilegemm.backend.registry import FallbackWarning

    a, b, ref = _case(256, 512, 1024, seed=4)
    c = torch.randn(256, 512, device="cuda").bfloat16()
    d = poisoned((256, 512), torch.bfloat16, "cuda")
    with pytest.warns(FallbackWarning):
        tilegemm.bf16_gemm_nt(a, b, d, c, backend="gluon")
    assert calc_diff(d, ref + c.double()) < BAR
