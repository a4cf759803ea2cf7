"""The prototype gluon FP8 kernel ``fp8_gemm_ws`` on a Hopper GPU: every design over awkward shapes.

Each case: fresh random inputs quantized with DeepGEMM's recipe (A 1x128 per row, B 128x128 blocks, A's scales
MN-major and TMA-aligned), ``d`` poisoned with NaN, the kernel's result compared with ``calc_diff`` against the
float64 formula on the dequantized inputs, then a rerun that must be bitwise identical. Also: a persistent grid
smaller than the tile count (each CTA walks several tiles), a side stream, and an fp32 output. The split designs
(``_sk``) on grids whose last round is split: ``test_split_tail_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import assert_rerun_identical, calc_diff, dequant_per_block, dequant_per_token, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

ws = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")

# M not a multiple of the tile (and M = 1), K = 128 (one block) and K past the last full block, N not a multiple
# of 128 (or of 192), and a DeepSeek-sized row. K blocks 1, 2, 3, 5, 9: every tail of the overlap runs (2 + 1, 4 + 1).
SHAPES = [
    (1, 256, 128),
    (129, 136, 256),
    (200, 264, 384),
    (300, 200, 1100),
    (257, 520, 640),
    (1000, 2112, 7168),
    (4097, 576, 2048),
]
BAR = 1e-3


def _case(m: int, n: int, k: int, seed: int = 0):
    """FP8 operands in the layouts the kernel reads and the float64 formula of the recipe."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(n, k, device="cuda", generator=g)
    qa, sa = per_token_cast_to_fp8(a)
    qb, sb = per_block_cast_to_fp8(b)
    ref = dequant_per_token(qa, sa).double() @ dequant_per_block(qb, sb).double().t()
    return (qa, get_mn_major_tma_aligned_tensor(sa)), (qb, sb), ref


def _check(a, b, ref, d, **kwargs) -> None:
    run = lambda: ws.ws_plan(a, b, d, **kwargs)(a, b, d)  # noqa: E731
    run()
    torch.cuda.synchronize()
    diff = calc_diff(d, ref)
    assert diff < BAR, f"calc_diff {diff}"
    assert_rerun_identical(run, d)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(ws.VARIANTS))
def test_ws_bf16(name, shape):
    m, n, k = shape
    a, b, ref = _case(m, n, k, seed=m + n + k)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    _check(a, b, ref, d, cfg=ws.VARIANTS[name])


@pytest.mark.parametrize("name", [n for n, c in ws.VARIANTS.items() if c.persistent])
def test_ws_persistent_walk(name):
    """Three CTAs over many tiles: every CTA runs several tiles through the ring and the epilogue."""
    a, b, ref = _case(1000, 1000, 1024, seed=7)
    d = poisoned((1000, 1000), torch.bfloat16, "cuda")
    _check(a, b, ref, d, cfg=ws.VARIANTS[name], num_sms=3)


@pytest.mark.parametrize("name", list(ws.VARIANTS))
def test_ws_fp32_out(name):
    a, b, ref = _case(300, 520, 1100, seed=3)
    d = poisoned((300, 520), torch.float32, "cuda")
    _check(a, b, ref, d, cfg=ws.VARIANTS[name])


def test_ws_stream():
    """The launch goes to the stream it is given: queued behind a sleep there, it has not run when another stream
    looks, and has once that stream is synchronized."""
    a, b, ref = _case(512, 384, 512, seed=11)
    d = poisoned((512, 384), torch.bfloat16, "cuda")
    run = ws.ws_plan(a, b, d)
    run(a, b, d)  # compile outside the timed-sensitive part
    d.fill_(float("nan"))
    torch.cuda.synchronize()
    main, side = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(main):
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
        run(a, b, d, stream=side)
        untouched = bool(torch.isnan(d).all().item())  # runs on ``main``, which does not wait for ``side``
    side.synchronize()
    assert untouched, "the kernel ran before the sleep queued ahead of it on its stream"
    assert not torch.isnan(d).any()
    assert calc_diff(d, ref) < BAR


def test_public_fp8_gemm_nt_split_tail():
    """``fp8_gemm_nt`` on gluon at 2048x2112x7168 (on 132 SMs: two rounds of 128x128 tiles and a split tail of 8):
    within the bar of the dequantized formula, every element written, reruns bitwise identical."""
    import tilegemm

    a, b, ref = _case(2048, 2112, 7168, seed=5)
    d = poisoned((2048, 2112), torch.bfloat16, "cuda")
    run = lambda: tilegemm.fp8_gemm_nt(a, b, d, backend="gluon")  # noqa: E731
    run()
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < BAR
    assert_rerun_identical(run, d)
