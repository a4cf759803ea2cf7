"""M-grouped contiguous GEMMs (MoE forward), BF16 and FP8, nt/nn, m_indices and psum layouts.

The reference is a float64 loop over groups on the upcast (dequantized) values. Padding rows
(``-1``, or past ``offs[-1]`` in the psum layout) must be written as exact zeros; no NaN poison
may survive anywhere.
"""

from __future__ import annotations

import pytest
import torch

import tilegemm as tg
from tilegemm import get_mk_alignment_for_contiguous_layout, per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.ops.reference import _common
from tilegemm.testing import backend_device_params, calc_diff, dequant_per_block, dequant_per_token, poisoned

BACKENDS = backend_device_params()
OUT_DTYPES = [torch.float32, torch.bfloat16]
BAR_EXACT = {torch.float32: 1e-6, torch.bfloat16: 1e-5}
ALIGN = get_mk_alignment_for_contiguous_layout()

# (name, per-group row counts, N, K, extra all-padding rows at the end)
CASES = [
    ("four_groups_one_empty", [100, 0, 300, 17], 192, 256, 0),
    ("one_group_m1", [1], 2112, 128, 0),
    ("uneven_nk", [130, 5, 64], 257, 200, 128),
    ("all_padding", [0, 0, 0], 96, 128, 256),
    ("k0", [40, 90], 64, 0, 0),
    ("full_blocks", [128, 0, 256], 160, 384, 0),
]


def contiguous_indices(sizes: list[int], tail: int, device) -> torch.Tensor:
    """DeepGEMM's layout: group g's rows, then -1 rows up to the next multiple of 128; ``tail`` -1 rows after."""
    parts = []
    for g, size in enumerate(sizes):
        aligned = -(-size // ALIGN) * ALIGN
        parts += [torch.full((size,), g, dtype=torch.int32), torch.full((aligned - size,), -1, dtype=torch.int32)]
    parts.append(torch.full((tail,), -1, dtype=torch.int32))
    return torch.cat(parts).to(device)


def psum_offsets(sizes: list[int], device) -> torch.Tensor:
    """``torch._grouped_mm``'s offs: cumulative group ends, no alignment."""
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def reference(a64: torch.Tensor, b64_nk: torch.Tensor, row_group: torch.Tensor) -> torch.Tensor:
    """float64 ``out[r] = a[r] @ b[group(r)].T``, 0 where ``group(r)`` is not a group."""
    out = torch.zeros(a64.shape[0], b64_nk.shape[1], dtype=torch.float64, device=a64.device)
    for g in range(b64_nk.shape[0]):
        rows = (row_group == g).nonzero().flatten()
        out[rows] = a64[rows] @ b64_nk[g].T
    return out


def make_case(sizes, tail, psum: bool, device):
    """(m_indices argument, per-row group ids for the reference, M_sum)."""
    if psum:
        total = sum(sizes)
        m_sum = total + tail + 3  # rows past offs[-1], not a multiple of 128
        offs = psum_offsets(sizes, device)
        row_group = torch.searchsorted(offs.long(), torch.arange(m_sum, device=device), right=True)
        return offs, row_group, m_sum
    idx = contiguous_indices(sizes, tail, device)
    return idx, idx.long(), idx.numel()


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("psum", [False, True], ids=["m_indices", "psum"])
@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_m_grouped_bf16(backend, device, case, layout, psum, out_dtype):
    _, sizes, n, k, tail = case
    torch.manual_seed(11)
    groups = len(sizes)
    m_indices, row_group, m_sum = make_case(sizes, tail, psum, device)
    a = torch.randn(m_sum, k, device=device).bfloat16()
    b_nk = torch.randn(groups, n, k, device=device).bfloat16()
    b = b_nk if layout == "nt" else b_nk.transpose(1, 2).contiguous()
    d = poisoned((m_sum, n), out_dtype, device)
    op = getattr(tg, f"m_grouped_bf16_gemm_{layout}_contiguous")
    assert op(a, b, d, m_indices, use_psum_layout=psum, backend=backend) is d
    ref = reference(a.double(), b_nk.double(), row_group)
    assert not torch.isnan(d).any(), "unwritten rows"
    padding = (row_group < 0) | (row_group >= groups)
    assert (d[padding] == 0).all(), "padding rows must be written as 0"
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("psum", [False, True], ids=["m_indices", "psum"])
@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_m_grouped_fp8(backend, device, case, layout, psum, out_dtype):
    _, sizes, n, k, tail = case
    torch.manual_seed(12)
    groups = len(sizes)
    m_indices, row_group, m_sum = make_case(sizes, tail, psum, device)
    a_raw = torch.randn(m_sum, k, device=device)
    b_raw = torch.randn(groups, n, k, device=device)
    aq, sa = per_token_cast_to_fp8(a_raw)
    bq, sb = per_block_cast_to_fp8(b_raw)  # [G, N, K], scales [G, N/128, K/128]
    b_data = bq if layout == "nt" else bq.transpose(1, 2).contiguous()
    d = poisoned((m_sum, n), out_dtype, device)
    op = getattr(tg, f"m_grouped_fp8_gemm_{layout}_contiguous")
    op((aq, sa), (b_data, sb), d, m_indices, use_psum_layout=psum, backend=backend)
    ref = reference(dequant_per_token(aq, sa), dequant_per_block(bq, sb), row_group)
    assert not torch.isnan(d).any(), "unwritten rows"
    padding = (row_group < 0) | (row_group >= groups)
    assert (d[padding] == 0).all(), "padding rows must be written as 0"
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]
    if k > 0 and not padding.all():
        assert calc_diff(d, reference(a_raw.double(), b_raw.double(), row_group)) < 1e-3


@pytest.mark.parametrize("psum", [False, True], ids=["m_indices", "psum"])
def test_m_grouped_reference_chunking(monkeypatch, psum):
    """The reference's chunked loop (one (block, group) item per chunk) gives the same bits as one chunk."""
    torch.manual_seed(13)
    sizes, n, k = [200, 0, 70, 129], 96, 160
    m_indices, _, m_sum = make_case(sizes, 0, psum, "cpu")
    a = torch.randn(m_sum, k).bfloat16()
    b = torch.randn(len(sizes), n, k).bfloat16()
    d_whole = poisoned((m_sum, n), torch.float32)
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d_whole, m_indices, use_psum_layout=psum, backend="pytorch")
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    d_chunked = poisoned((m_sum, n), torch.float32)
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d_chunked, m_indices, use_psum_layout=psum, backend="pytorch")
    assert torch.equal(d_whole, d_chunked)


def test_m_grouped_reference_contract_violation_is_nan():
    """With value checks off, rows breaking the m_indices contract come out NaN, never a silent wrong answer."""
    from tilegemm.ops.checks import skip_value_checks

    torch.manual_seed(14)
    m_indices = torch.cat([torch.zeros(100, dtype=torch.int32), torch.ones(28, dtype=torch.int32)])  # block mixes 0, 1
    m_indices = torch.cat([m_indices, torch.full((128,), 5, dtype=torch.int32)])  # group 5 of 2: out of range
    a = torch.randn(256, 64).bfloat16()
    b = torch.randn(2, 32, 64).bfloat16()
    d = poisoned((256, 32), torch.float32)
    with skip_value_checks():
        tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend="pytorch")
    assert torch.isnan(d[:100]).all() and torch.isnan(d[128:]).all()  # minority rows / bad ids
    assert calc_diff(d[100:128], a[100:128].double() @ b[1].double().T) < 1e-6  # the block's group (max id)
