"""M-grouped contiguous GEMMs (MoE forward), BF16 and FP8, nt/nn, row-index and psum layouts.

The psum layout is DeepGEMM's (group g is rows ``[align(ends[g-1], alignment), ends[g])``, alignment
128 by default) and, with ``alignment=1``, ``torch._grouped_mm``'s unaligned offsets. The reference
is a float64 loop over groups on the upcast (dequantized) values. Rows of no group (``-1`` rows, psum
gaps before an aligned start, rows past the last group) must be written as exact zeros; no NaN
poison may survive anywhere.
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


def psum_ends(sizes: list[int], alignment: int) -> list[int]:
    """Cumulative group ends where each group starts at the previous end rounded up to ``alignment``."""
    ends, end = [], 0
    for size in sizes:
        end = -(-end // alignment) * alignment + size
        ends.append(end)
    return ends


#: grouped_layout forms: the row-index layout, and the psum layout with these alignments (None: the default 128).
LAYOUT_FORMS = {"m_indices": None, "psum": None, "psum_a1": 1, "psum_a64": 64}


def reference(a64: torch.Tensor, b64_nk: torch.Tensor, row_group: torch.Tensor) -> torch.Tensor:
    """float64 ``out[r] = a[r] @ b[group(r)].T``, 0 where ``group(r)`` is not a group."""
    out = torch.zeros(a64.shape[0], b64_nk.shape[1], dtype=torch.float64, device=a64.device)
    for g in range(b64_nk.shape[0]):
        rows = (row_group == g).nonzero().flatten()
        out[rows] = a64[rows] @ b64_nk[g].T
    return out


def make_case(sizes, tail, form: str, device):
    """(grouped_layout, per-row group ids for the reference (-1: no group), M_sum, op keyword arguments)."""
    if form == "m_indices":
        idx = contiguous_indices(sizes, tail, device)
        return idx, idx.long(), idx.numel(), {}
    alignment = LAYOUT_FORMS[form]
    ends = psum_ends(sizes, alignment or ALIGN)
    m_sum = ends[-1] + tail + 3  # rows past the last end, not a multiple of 128
    row_group = torch.full((m_sum,), -1, dtype=torch.int64)
    for g, (end, size) in enumerate(zip(ends, sizes)):
        row_group[end - size : end] = g
    kwargs = {"use_psum_layout": True} | ({} if alignment is None else {"alignment": alignment})
    return torch.tensor(ends, dtype=torch.int32, device=device), row_group.to(device), m_sum, kwargs


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("form", list(LAYOUT_FORMS))
@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_m_grouped_bf16(backend, device, case, layout, form, out_dtype):
    _, sizes, n, k, tail = case
    torch.manual_seed(11)
    groups = len(sizes)
    grouped_layout, row_group, m_sum, kwargs = make_case(sizes, tail, form, device)
    a = torch.randn(m_sum, k, device=device).bfloat16()
    b_nk = torch.randn(groups, n, k, device=device).bfloat16()
    b = b_nk if layout == "nt" else b_nk.transpose(1, 2).contiguous()
    d = poisoned((m_sum, n), out_dtype, device)
    op = getattr(tg, f"m_grouped_bf16_gemm_{layout}_contiguous")
    assert op(a, b, d, grouped_layout, backend=backend, **kwargs) is d
    ref = reference(a.double(), b_nk.double(), row_group)
    assert not torch.isnan(d).any(), "unwritten rows"
    padding = (row_group < 0) | (row_group >= groups)
    assert (d[padding] == 0).all(), "padding rows must be written as 0"
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("form", list(LAYOUT_FORMS))
@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_m_grouped_fp8(backend, device, case, layout, form, out_dtype):
    _, sizes, n, k, tail = case
    torch.manual_seed(12)
    groups = len(sizes)
    grouped_layout, row_group, m_sum, kwargs = make_case(sizes, tail, form, device)
    a_raw = torch.randn(m_sum, k, device=device)
    b_raw = torch.randn(groups, n, k, device=device)
    aq, sa = per_token_cast_to_fp8(a_raw)
    bq, sb = per_block_cast_to_fp8(b_raw)  # [G, N, K], scales [G, N/128, K/128]
    # nn: b [G, K, N] with scales in the same orientation, [G, K/128, N/128] (DeepGEMM's)
    b = (bq, sb) if layout == "nt" else (bq.transpose(1, 2).contiguous(), sb.transpose(1, 2).contiguous())
    d = poisoned((m_sum, n), out_dtype, device)
    op = getattr(tg, f"m_grouped_fp8_fp4_gemm_{layout}_contiguous")
    op((aq, sa), b, d, grouped_layout, backend=backend, **kwargs)
    ref = reference(dequant_per_token(aq, sa), dequant_per_block(bq, sb), row_group)
    assert not torch.isnan(d).any(), "unwritten rows"
    padding = (row_group < 0) | (row_group >= groups)
    assert (d[padding] == 0).all(), "padding rows must be written as 0"
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]
    if k > 0 and not padding.all():
        assert calc_diff(d, reference(a_raw.double(), b_raw.double(), row_group)) < 1e-3


@pytest.mark.parametrize("form", list(LAYOUT_FORMS))
def test_m_grouped_reference_chunking(monkeypatch, form):
    """The reference's chunked loop (one (block, group) item per chunk) gives the same bits as one chunk."""
    torch.manual_seed(13)
    sizes, n, k = [200, 0, 70, 129], 96, 160
    grouped_layout, _, m_sum, kwargs = make_case(sizes, 0, form, "cpu")
    a = torch.randn(m_sum, k).bfloat16()
    b = torch.randn(len(sizes), n, k).bfloat16()
    d_whole = poisoned((m_sum, n), torch.float32)
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d_whole, grouped_layout, backend="pytorch", **kwargs)
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    d_chunked = poisoned((m_sum, n), torch.float32)
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d_chunked, grouped_layout, backend="pytorch", **kwargs)
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


def test_psum_gap_rows_use_no_weights():
    """DeepGEMM's psum meaning: rows between a group's end and the next aligned start are no group's (written 0),
    even when they hold data; with alignment=1 the same ends are torch's and those rows belong to the next group."""
    torch.manual_seed(15)
    ends = torch.tensor([100, 300], dtype=torch.int32)
    a = torch.randn(320, 64).bfloat16()
    b = torch.randn(2, 48, 64).bfloat16()
    d = poisoned((320, 48), torch.float32)
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True, backend="pytorch")
    a64, b64 = a.double(), b.double()
    assert calc_diff(d[:100], a64[:100] @ b64[0].T) < 1e-6
    assert (d[100:128] == 0).all() and (d[300:] == 0).all()
    assert calc_diff(d[128:300], a64[128:300] @ b64[1].T) < 1e-6
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True, alignment=1, backend="pytorch")
    assert calc_diff(d[100:300], a64[100:300] @ b64[1].T) < 1e-6


def test_set_mk_alignment_is_the_psum_default():
    """``set_mk_alignment_for_contiguous_layout`` sets the group-start alignment ``alignment=None`` means."""
    torch.manual_seed(16)
    ends = torch.tensor([10, 80], dtype=torch.int32)
    a = torch.randn(80, 32).bfloat16()
    b = torch.randn(2, 16, 32).bfloat16()
    d_set, d_kw = poisoned((80, 16), torch.float32), poisoned((80, 16), torch.float32)
    try:
        tg.set_mk_alignment_for_contiguous_layout(64)
        tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d_set, ends, use_psum_layout=True, backend="pytorch")
    finally:
        tg.set_mk_alignment_for_contiguous_layout(128)
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d_kw, ends, use_psum_layout=True, alignment=64, backend="pytorch")
    assert torch.equal(d_set, d_kw) and (d_kw[10:64] == 0).all()
