"""K-grouped GEMMs (MoE weight gradient), BF16 and FP8: ``d[g] = a_g.T @ b_g (+ c[g])``, fp32 out."""

from __future__ import annotations

import itertools

import pytest
import torch

import tilegemm as tg
from tilegemm import per_token_cast_to_fp8
from tilegemm.testing import backend_device_params, calc_diff, poisoned

BACKENDS = backend_device_params()
BAR_EXACT = 1e-6

# (name, ks, M, N); the BF16 op takes any per-group K, the FP8 op multiples of 128.
BF16_CASES = [
    ("zeros_inside", [0, 37, 128, 0, 200], 64, 96),
    ("one_group", [256], 1, 2112),
    ("uneven", [130, 1], 129, 257),
    ("all_zero", [0, 0], 16, 32),
]
FP8_CASES = [
    ("zeros_inside", [0, 128, 256, 0, 384], 64, 96),
    ("one_group", [256], 1, 2112),
    ("uneven", [128, 128], 129, 257),
    ("all_zero", [0, 0], 16, 32),
]
C_MODES = ["none", "c", "c_is_d"]


def _ref(a64, b64, ks, c64):
    out = []
    k0 = 0
    for kg in ks:
        out.append(a64[k0 : k0 + kg].T @ b64[k0 : k0 + kg])
        k0 += kg
    ref = torch.stack(out)
    return ref + c64 if c64 is not None else ref


def _c_and_d(mode, groups, m, n, device):
    if mode == "none":
        return None, None, poisoned((groups, m, n), torch.float32, device)
    c = torch.randn(groups, m, n, device=device) * 4
    c64 = c.double()
    if mode == "c_is_d":
        return c, c64, c
    return c, c64, poisoned((groups, m, n), torch.float32, device)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("c_mode", C_MODES)
@pytest.mark.parametrize("case", BF16_CASES, ids=[c[0] for c in BF16_CASES])
def test_k_grouped_bf16(backend, device, case, c_mode):
    _, ks, m, n = case
    torch.manual_seed(31)
    k_sum, groups = sum(ks), len(ks)
    a = torch.randn(k_sum, m, device=device).bfloat16()
    b = torch.randn(k_sum, n, device=device).bfloat16()
    c, c64, d = _c_and_d(c_mode, groups, m, n, device)
    grouped_layout = torch.tensor(ks, dtype=torch.int32, device=device)
    ref = _ref(a.double(), b.double(), ks, c64)
    out = tg.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, grouped_layout, c, backend=backend)
    assert out is d
    assert not torch.isnan(d).any()
    empty = torch.tensor([kg == 0 for kg in ks], device=device)
    expected_empty = c64[empty] if c64 is not None else torch.zeros_like(ref[empty])
    assert torch.equal(d[empty].double(), expected_empty), "groups with K=0 must be c[g] or 0"
    assert calc_diff(d, ref) < BAR_EXACT


def _per_k_cast(x: torch.Tensor):
    """[K_sum, MN] -> (fp8 [K_sum, MN], fp32 [K_sum/128, MN]): 1x128 blocks along K (per column)."""
    q, s = per_token_cast_to_fp8(x.t())
    return q.t().contiguous(), s.t().contiguous()


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("c_mode", C_MODES)
@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_k_grouped_fp8(backend, device, case, c_mode):
    _, ks, m, n = case
    torch.manual_seed(32)
    k_sum, groups = sum(ks), len(ks)
    a_raw = torch.randn(k_sum, m, device=device)
    b_raw = torch.randn(k_sum, n, device=device)
    (aq, sa), (bq, sb) = _per_k_cast(a_raw), _per_k_cast(b_raw)
    c, c64, d = _c_and_d(c_mode, groups, m, n, device)
    a64 = aq.double() * sa.double().repeat_interleave(128, dim=0)
    b64 = bq.double() * sb.double().repeat_interleave(128, dim=0)
    ref = _ref(a64, b64, ks, c64)
    unquantized = _ref(a_raw.double(), b_raw.double(), ks, c64)
    grouped_layout = torch.tensor(ks, dtype=torch.int32, device=device)
    tg.k_grouped_fp8_gemm_tn_contiguous(
        (aq, sa), (bq, sb), d, ks, grouped_layout, c, recipe=(1, 1, 128), backend=backend
    )
    assert not torch.isnan(d).any()
    assert calc_diff(d, ref) < BAR_EXACT
    if k_sum > 0 and c_mode == "none":
        assert calc_diff(d, unquantized) < 1e-3


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_k_grouped_fp8_nt(backend, device, case):
    """DeepGEMM's SM90 k-grouped op: each group's K-major [M, K_g] / [N, K_g] block back to back in a flat
    buffer, scales [M, K_sum/128] (a transposed view, as DeepGEMM's generator passes ``sfa.T``); c is d."""
    _, ks, m, n = case
    torch.manual_seed(33)
    k_sum, groups = sum(ks), len(ks)
    (aq, sa), (bq, sb) = (
        _per_k_cast(torch.randn(k_sum, m, device=device)),
        _per_k_cast(torch.randn(k_sum, n, device=device)),
    )
    flat_a = torch.cat([aq[k0 : k0 + kg].t().flatten() for k0, kg in zip([0, *itertools.accumulate(ks)], ks)])
    flat_b = torch.cat([bq[k0 : k0 + kg].t().flatten() for k0, kg in zip([0, *itertools.accumulate(ks)], ks)])
    c = torch.randn(groups, m, n, device=device) * 4
    a64 = aq.double() * sa.double().repeat_interleave(128, dim=0)
    b64 = bq.double() * sb.double().repeat_interleave(128, dim=0)
    ref = _ref(a64, b64, ks, c.double())
    d = c
    grouped_layout = torch.tensor(ks, dtype=torch.int32, device=device)
    tg.k_grouped_fp8_gemm_nt_contiguous(
        (flat_a, sa.T), (flat_b, sb.T), d, ks, grouped_layout, c, recipe=(1, 1, 128), backend=backend
    )
    assert calc_diff(d, ref) < BAR_EXACT


def test_k_grouped_psum_is_not_implemented():
    a = torch.zeros(128, 8).bfloat16()
    d = torch.zeros(1, 8, 8)
    with pytest.raises(NotImplementedError, match="psum"):
        tg.k_grouped_bf16_gemm_tn_contiguous(
            a, a, d, [128], torch.tensor([128], dtype=torch.int32), use_psum_layout=True
        )
