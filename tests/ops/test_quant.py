"""FP8 casts, scale layouts and the testing helpers (calc_diff, dequantize, bench_kernel)."""

from __future__ import annotations

import math

import pytest
import torch

from tilegemm import (
    get_mk_alignment_for_contiguous_layout,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
    per_block_cast_to_fp8,
    per_token_cast_to_fp8,
    transform_sf_into_required_layout,
)
from tilegemm.testing import (
    assert_rerun_identical,
    bench_kernel,
    calc_diff,
    dequant_per_block,
    dequant_per_token,
    fp8_round_trip_per_token,
    poisoned,
)

FP8 = torch.float8_e4m3fn
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.gpu),
]


def _blockwise_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Loop reference: amax of every rows x cols block of the last two dims of a 2-D tensor."""
    n, k = x.shape
    out = torch.empty(-(-n // rows), -(-k // cols), dtype=torch.float64)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = x[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols].abs().max().double()
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4, 300), (1, 128), (2, 3, 200), (5, 0)], ids=str)
def test_per_token_cast(device, shape):
    torch.manual_seed(51)
    x = torch.randn(*shape, device=device).bfloat16() * 3
    q, s = per_token_cast_to_fp8(x)
    k = shape[-1]
    assert q.dtype == FP8 and q.shape == x.shape and s.dtype == torch.float32
    assert s.shape == (*shape[:-1], -(-k // 128))
    if k == 0:
        return
    rows = x.reshape(-1, k).float()
    amax = _blockwise_amax(rows, 1, 128).clamp(min=1e-4)
    assert torch.allclose(s.reshape(-1, s.shape[-1]).double().cpu(), amax / 448, rtol=1e-6, atol=0)
    back = dequant_per_token(q.reshape(-1, k), s.reshape(-1, s.shape[-1]))
    # Within half an FP8 step of the largest binade (16 units of the scale), per element.
    bound = 16 * s.reshape(-1, s.shape[-1]).double().repeat_interleave(128, -1)[:, :k] * (1 + 1e-6)
    assert ((back - rows.double()).abs() <= bound).all()
    assert calc_diff(back, rows) < 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(300, 200), (128, 128), (3, 130, 257), (1, 1)], ids=str)
def test_per_block_cast(device, shape):
    torch.manual_seed(52)
    x = torch.randn(*shape, device=device) * 0.01
    q, s = per_block_cast_to_fp8(x)
    n, k = shape[-2:]
    assert q.dtype == FP8 and q.shape == x.shape
    assert s.shape == (*shape[:-2], -(-n // 128), -(-k // 128)) and s.dtype == torch.float32
    x2 = x.reshape(-1, n, k)
    s2 = s.reshape(-1, *s.shape[-2:])
    for g in range(x2.shape[0]):
        amax = _blockwise_amax(x2[g].cpu(), 128, 128).clamp(min=1e-4)
        assert torch.allclose(s2[g].double().cpu(), amax / 448, rtol=1e-6, atol=0)
    back = dequant_per_block(q, s)
    assert calc_diff(back, x) < 1e-3


def test_zero_blocks_get_clamped_scale():
    x = torch.zeros(2, 256)
    x[1, 130] = 5.0
    q, s = per_token_cast_to_fp8(x)
    assert torch.equal(q[0].float(), torch.zeros(256))
    assert torch.allclose(s[0], torch.full((2,), 1e-4 / 448))
    assert float(s[1, 1]) == pytest.approx(5.0 / 448) and float(q[1, 130].float()) == 448.0
    qb, sb = per_block_cast_to_fp8(torch.zeros(3, 4))
    assert sb.shape == (1, 1) and float(sb) == pytest.approx(1e-4 / 448) and not qb.float().any()


def test_alignment_helpers():
    assert get_mk_alignment_for_contiguous_layout() == 128
    assert get_tma_aligned_size(5, 4) == 8
    assert get_tma_aligned_size(8, 4) == 8
    assert get_tma_aligned_size(1, 1) == 16
    assert get_tma_aligned_size(17, 2) == 24
    assert get_tma_aligned_size(0, 4) == 0
    with pytest.raises(ValueError):
        get_tma_aligned_size(4, 3)


@pytest.mark.parametrize("shape", [(301, 3), (300, 56), (2, 129, 5), (1, 7, 2), (4097, 1), (3, 4096, 1)], ids=str)
def test_mn_major_tma_aligned(shape):
    torch.manual_seed(53)
    sf = torch.rand(*shape)
    out = get_mn_major_tma_aligned_tensor(sf)
    mn, sf_k = shape[-2:]
    aligned = -(-mn // 4) * 4
    assert out.shape == sf.shape and out.dtype == sf.dtype and torch.equal(out, sf)
    assert out.stride(-2) == 1 and out.stride(-1) == aligned
    if len(shape) == 3:
        assert out.stride(0) == aligned * sf_k
    assert get_mn_major_tma_aligned_tensor(out) is out  # already in layout: returned as is
    # A transposed (non-contiguous) input gives the same values too.
    assert torch.equal(get_mn_major_tma_aligned_tensor(sf.mT.contiguous().mT), sf)


def test_transform_sf():
    torch.manual_seed(54)
    m, n, k = 200, 300, 520
    sfa = torch.rand(m, 5)
    out = transform_sf_into_required_layout(sfa, m, k, (1, 128, 128), is_sfa=True)
    assert torch.equal(out, sfa) and out.stride() == (1, get_tma_aligned_size(m, 4))
    sfb_block = torch.rand(3, 5)
    out = transform_sf_into_required_layout(sfb_block, n, k, (1, 128, 128), is_sfa=False)
    assert torch.equal(out, sfb_block) and out.is_contiguous()
    assert torch.equal(transform_sf_into_required_layout(sfb_block, n, k, (128, 128)), sfb_block)  # 2-element form
    sfb_rows = torch.rand(4, n, 5)
    out = transform_sf_into_required_layout(sfb_rows, n, k, (1, 1, 128), num_groups=4, is_sfa=False)
    assert torch.equal(out, sfb_rows) and out.stride(-2) == 1 and out.stride(0) == get_tma_aligned_size(n, 4) * 5
    with pytest.raises(ValueError, match="shape"):
        transform_sf_into_required_layout(torch.rand(3, 4), n, k, (1, 128, 128), is_sfa=False)
    with pytest.raises(ValueError, match="shape"):
        transform_sf_into_required_layout(sfb_rows, n, k, (1, 1, 128), num_groups=3, is_sfa=False)
    with pytest.raises(ValueError, match="granularity"):
        transform_sf_into_required_layout(torch.rand(n, 9), n, k, (1, 1, 64), is_sfa=False)
    with pytest.raises(ValueError, match="is_sfa"):
        transform_sf_into_required_layout(sfb_block, n, k, (1, 128, 128))
    with pytest.raises(TypeError):
        transform_sf_into_required_layout(torch.ones(3, 5, dtype=torch.float16), n, k, (1, 128, 128), is_sfa=False)
    with pytest.raises(NotImplementedError, match="UE8M0"):
        transform_sf_into_required_layout(torch.ones(3, 5, dtype=torch.int32), n, k, (1, 128, 128), is_sfa=False)


def test_calc_diff():
    torch.manual_seed(55)
    x = torch.randn(100, dtype=torch.float64)
    assert calc_diff(x, x) == 0.0
    assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(x, torch.zeros_like(x)) == pytest.approx(1.0)
    y = x + 1e-3 * torch.randn(100, dtype=torch.float64)
    expected = ((x - y) ** 2).sum() / ((x * x + y * y).sum())
    assert calc_diff(x, y) == pytest.approx(float(expected), rel=1e-9)
    assert math.isnan(calc_diff(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])))
    assert math.isnan(calc_diff(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 2.0])))
    assert isinstance(calc_diff(x.bfloat16(), x.float()), float)


def test_poisoned_and_bench():
    d = poisoned((3, 4), torch.bfloat16)
    assert d.dtype == torch.bfloat16 and torch.isnan(d).all()
    a = torch.randn(64, 64)
    ms = bench_kernel(lambda: a @ a, warmup=1, rep=5, device="cpu")
    assert isinstance(ms, float) and 0 < ms < 1000


def test_assert_rerun_identical():
    """Passes for a deterministic full write; fails on an unwritten element and on a rerun that changes bytes."""
    d = poisoned((2, 3), torch.float32)
    d.fill_(1.0)
    assert_rerun_identical(lambda: d.fill_(1.0), d)
    d[0, 0] = float("nan")
    with pytest.raises(AssertionError, match="unwritten"):
        assert_rerun_identical(lambda: None, d)
    d.fill_(1.0)
    with pytest.raises(AssertionError, match="bitwise"):
        assert_rerun_identical(lambda: d.add_(1e-6), d)


def test_fp8_round_trip_per_token_is_the_cast_and_back():
    """The float64 round trip equals ``per_token_cast_to_fp8`` then ``dequant_per_token`` on fp32-exact values
    (batched rows included), and keeps float64 inputs' shape."""
    g = torch.Generator().manual_seed(0)
    v = (torch.randn(3, 5, 256, generator=g) * torch.logspace(-3, 3, 5)[None, :, None]).double()
    v[0, 0, :128] = 0.0  # an all-zero block: the 1e-4 amax floor
    want = dequant_per_token(*per_token_cast_to_fp8(v.float().reshape(-1, 256))).reshape(v.shape)
    got = fp8_round_trip_per_token(v)
    assert got.dtype == torch.float64 and got.shape == v.shape
    assert torch.equal(got, want)
