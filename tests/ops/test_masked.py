"""M-grouped masked GEMMs (CUDA-graph MoE decode), BF16 and FP8.

Rows ``< masked_m[g]`` must match the float64 formula; rows past it must keep ``d``'s poison
bit for bit (they are not written).
"""

from __future__ import annotations

import pytest
import torch

import tilegemm as tg
from tilegemm import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import backend_device_params, calc_diff, dequant_per_block, dequant_per_token, poisoned

BACKENDS = backend_device_params()
OUT_DTYPES = [torch.float32, torch.bfloat16]
BAR_EXACT = {torch.float32: 1e-6, torch.bfloat16: 1e-5}

# (name, masked_m per group, Mmax, N, K)
CASES = [
    ("mixed", [5, 0, 64, 1], 64, 192, 256),
    ("one_group_m1", [1], 16, 2112, 128),
    ("uneven_nk", [33, 130, 0], 130, 257, 200),
    ("all_empty", [0, 0], 32, 64, 128),
    ("k0", [3, 8], 8, 96, 0),
]


def _poison(shape, dtype, device) -> torch.Tensor:
    """NaN poison with distinct payload bits per element, so 'kept bit for bit' means something."""
    d = poisoned(shape, dtype, device)
    bits = d.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
    bits |= torch.arange(bits.numel(), device=device).view(bits.shape).to(bits.dtype) & 0x3F
    return d


def _check(d, poison_bits, ref, masked_m, out_dtype):
    groups, m_max, _ = d.shape
    rows = torch.arange(m_max, device=d.device)
    valid = rows[None, :] < masked_m.to(d.device)[:, None]  # [G, Mmax]
    int_dtype = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
    assert torch.equal(d.view(int_dtype)[~valid], poison_bits[~valid]), "rows past masked_m were written"
    assert not torch.isnan(d[valid]).any(), "valid rows left unwritten"
    assert calc_diff(d[valid], ref[valid]) < BAR_EXACT[out_dtype]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_masked_bf16(backend, device, case, out_dtype):
    _, ms, m_max, n, k = case
    torch.manual_seed(21)
    groups = len(ms)
    a = torch.randn(groups, m_max, k, device=device).bfloat16()
    b = torch.randn(groups, n, k, device=device).bfloat16()
    masked_m = torch.tensor(ms, dtype=torch.int32, device=device)
    d = _poison((groups, m_max, n), out_dtype, device)
    poison_bits = d.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32).clone()
    out = tg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m=max(ms), backend=backend)
    assert out is d
    ref = torch.einsum("gmk,gnk->gmn", a.double(), b.double())
    _check(d, poison_bits, ref, masked_m, out_dtype)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_masked_fp8(backend, device, case, out_dtype):
    _, ms, m_max, n, k = case
    torch.manual_seed(22)
    groups = len(ms)
    a_raw = torch.randn(groups, m_max, k, device=device)
    b_raw = torch.randn(groups, n, k, device=device)
    aq, sa = per_token_cast_to_fp8(a_raw)  # scales [G, Mmax, K/128]
    bq, sb = per_block_cast_to_fp8(b_raw)  # scales [G, N/128, K/128]
    masked_m = torch.tensor(ms, dtype=torch.int32, device=device)
    d = _poison((groups, m_max, n), out_dtype, device)
    poison_bits = d.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32).clone()
    tg.m_grouped_fp8_gemm_nt_masked((aq, sa), (bq, sb), d, masked_m, expected_m=max(ms), backend=backend)
    ref = torch.einsum("gmk,gnk->gmn", dequant_per_token(aq, sa), dequant_per_block(bq, sb))
    _check(d, poison_bits, ref, masked_m, out_dtype)
    if k > 0 and max(ms) > 0:
        valid = torch.arange(m_max, device=device)[None, :] < masked_m[:, None]
        unquantized = torch.einsum("gmk,gnk->gmn", a_raw.double(), b_raw.double())
        assert calc_diff(d[valid], unquantized[valid]) < 1e-3
