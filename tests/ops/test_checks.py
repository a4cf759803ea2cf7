# ruff: noqa: E501  (the bad-input table reads best one case per line)
"""Bad input raises before anything runs: the right error type, naming the argument, `d` untouched."""

import math

import pytest
import torch

import tilegemm
from tilegemm.ops import checks

FP8 = torch.float8_e4m3fn


def fp8(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).clamp(-400, 400).to(FP8)


def scales(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def poisoned(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, math.nan, dtype=dtype)


def dense_bf16(**over):
    kw = dict(a=torch.randn(8, 256).bfloat16(), b=torch.randn(16, 256).bfloat16(), d=poisoned(8, 16))
    kw.update(over)
    return kw


def dense_fp8(**over):
    kw = dict(a=(fp8(8, 256), scales(8, 2)), b=(fp8(16, 256), scales(1, 2)), d=poisoned(8, 16))
    kw.update(over)
    return kw


def m_grouped(**over):
    m_indices = torch.tensor([0] * 128 + [-1] * 128 + [1] * 128, dtype=torch.int32)
    kw = dict(a=torch.randn(384, 64).bfloat16(), b=torch.randn(2, 32, 64).bfloat16(), d=poisoned(384, 32))
    kw["grouped_layout"] = m_indices
    kw.update(over)
    return kw


def masked(**over):
    kw = dict(a=torch.randn(2, 16, 64).bfloat16(), b=torch.randn(2, 32, 64).bfloat16(), d=poisoned(2, 16, 32))
    kw.update(masked_m=torch.tensor([3, 16], dtype=torch.int32), expected_m=8)
    kw.update(over)
    return kw


def k_grouped(**over):
    kw = dict(
        a=torch.randn(96, 16).bfloat16(), b=torch.randn(96, 24).bfloat16(), d=poisoned(3, 16, 24), ks_cpu=[32, 0, 64]
    )
    kw["grouped_layout"] = torch.tensor([32, 0, 64]).int()
    kw.update(over)
    return kw


def k_grouped_fp8(**over):
    kw = dict(
        a=(fp8(256, 16), scales(2, 16)), b=(fp8(256, 24), scales(2, 24)), d=poisoned(2, 16, 24), ks_cpu=[128, 128]
    )
    kw["grouped_layout"] = torch.tensor([128, 128]).int()
    kw.update(over)
    return kw


def mqa(**over):
    s, s_kv, h, dim = 4, 32, 2, 64
    kw = dict(q=fp8(s, h, dim), kv=(fp8(s_kv, dim), scales(s_kv)), weights=torch.randn(s, h))
    kw.update(cu_seq_len_k_start=torch.zeros(s, dtype=torch.int32), cu_seq_len_k_end=torch.full((s,), 32).int())
    kw.update(over)
    return kw


def paged(**over):
    b, next_n, h, dim, block_kv = 2, 1, 2, 64, 16
    ctx = torch.tensor([20, 5], dtype=torch.int32)
    kw = dict(q=fp8(b, next_n, h, dim), kv_cache=torch.randint(0, 255, (4, block_kv, 1, dim + 4), dtype=torch.uint8))
    kw.update(weights=torch.randn(b * next_n, h), context_lens=ctx, block_table=torch.tensor([[0, 1], [2, 3]]).int())
    kw.update(schedule_meta=tilegemm.get_paged_mqa_logits_metadata(ctx, block_kv, 2), max_context_len=32)
    kw.update(over)
    return kw


CASES = [
    # (id, op, kwargs, exception, message fragment)
    ("a-not-tensor", "bf16_gemm_nt", dense_bf16(a=[[1.0]]), TypeError, "a:"),
    ("a-dtype", "bf16_gemm_nt", dense_bf16(a=torch.randn(8, 256).half()), TypeError, "a: got dtype"),
    ("a-ndim", "bf16_gemm_nt", dense_bf16(a=torch.randn(1, 8, 256).bfloat16()), ValueError, "a: got a 3-D"),
    ("k-mismatch", "bf16_gemm_nt", dense_bf16(b=torch.randn(16, 128).bfloat16()), ValueError, "disagree on K"),
    ("nn-k-mismatch", "bf16_gemm_nn", dense_bf16(b=torch.randn(16, 256).bfloat16()), ValueError, "disagree on K"),
    ("d-shape", "bf16_gemm_nt", dense_bf16(d=poisoned(16, 8)), ValueError, "d: got shape"),
    ("d-dtype", "bf16_gemm_nt", dense_bf16(d=poisoned(8, 16, dtype=torch.float16)), TypeError, "d: got dtype"),
    ("d-strided", "bf16_gemm_nt", dense_bf16(d=poisoned(16, 8).T), ValueError, "contiguous"),
    ("c-shape", "bf16_gemm_nt", dense_bf16(c=torch.randn(8, 15)), ValueError, "c: got shape"),
    ("alpha-type", "bf16_gemm_nt", dense_bf16(alpha="2"), TypeError, "alpha"),
    ("beta-bool", "bf16_gemm_nt", dense_bf16(beta=True), TypeError, "beta"),
    ("stream-type", "bf16_gemm_nt", dense_bf16(stream=0), TypeError, "stream"),
    ("device-mix", "bf16_gemm_nt", dense_bf16(d=torch.empty(8, 16, device="meta")), ValueError, "d: expected device cpu"),
    ("fp8-not-tuple", "fp8_gemm_nt", dense_fp8(a=fp8(8, 256)), TypeError, "a:"),
    ("fp8-data-dtype", "fp8_gemm_nt", dense_fp8(a=(torch.randn(8, 256), scales(8, 2))), TypeError, "a[0]"),
    ("fp8-scale-dtype", "fp8_gemm_nt", dense_fp8(a=(fp8(8, 256), scales(8, 2).half())), TypeError, "a[1]"),
    ("sa-shape", "fp8_gemm_nt", dense_fp8(a=(fp8(8, 256), scales(8, 3))), ValueError, "a[1] (scales)"),
    ("sb-shape", "fp8_gemm_nt", dense_fp8(b=(fp8(16, 256), scales(2, 2))), ValueError, "b[1] (scales)"),
    ("recipe-mismatch", "fp8_gemm_nt", dense_fp8(recipe=(1, 1, 128)), ValueError, "recipe"),
    ("recipe-unknown", "fp8_gemm_nt", dense_fp8(recipe=(1, 64, 64)), ValueError, "recipe"),
    ("m-indices-dtype", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(grouped_layout=torch.zeros(384).long()), TypeError, "grouped_layout"),
    ("m-indices-len", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(grouped_layout=torch.zeros(100).int()), ValueError, "grouped_layout"),
    ("m-indices-range", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(grouped_layout=torch.full((384,), 2).int()), ValueError, "group 2"),
    ("m-indices-misaligned", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(grouped_layout=torch.tensor([0] * 100 + [1] * 284).int()), ValueError, "mix groups"),
    ("psum-decreasing", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(grouped_layout=torch.tensor([200, 100]).int(), use_psum_layout=True), ValueError, "non-decreasing"),
    ("psum-past-end", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(grouped_layout=torch.tensor([200, 400]).int(), use_psum_layout=True), ValueError, "non-decreasing"),
    ("grouped-b-k", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(b=torch.randn(2, 32, 48).bfloat16()), ValueError, "disagree on K"),
    ("masked-m-range", "m_grouped_bf16_gemm_nt_masked", masked(masked_m=torch.tensor([3, 17]).int()), ValueError, "masked_m"),
    ("masked-m-len", "m_grouped_bf16_gemm_nt_masked", masked(masked_m=torch.tensor([3]).int()), ValueError, "masked_m"),
    ("expected-m-type", "m_grouped_bf16_gemm_nt_masked", masked(expected_m=8.0), TypeError, "expected_m"),
    ("expected-m-negative", "m_grouped_bf16_gemm_nt_masked", masked(expected_m=-1), ValueError, "expected_m"),
    ("masked-b-groups", "m_grouped_bf16_gemm_nt_masked", masked(b=torch.randn(3, 32, 64).bfloat16()), ValueError, "b: got shape"),
    ("ks-sum", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(ks_cpu=[32, 0, 63]), ValueError, "sum(ks_cpu)"),
    ("ks-negative", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(ks_cpu=[32, -1, 65]), ValueError, "ks_cpu:"),
    ("ks-type", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(ks_cpu=torch.tensor([32, 0, 64])), TypeError, "ks_cpu:"),
    ("ks-groups", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(ks_cpu=[32, 64]), ValueError, "ks_cpu:"),
    ("ks-layout-values", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(grouped_layout=torch.tensor([32, 64, 0]).int()), ValueError, "grouped_layout"),
    ("k-grouped-d-dtype", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(d=poisoned(3, 16, 24, dtype=torch.bfloat16)), TypeError, "d: got dtype"),
    ("k-grouped-fp8-ks", "k_grouped_fp8_gemm_tn_contiguous", k_grouped_fp8(ks_cpu=[64, 192]), ValueError, "multiples of 128"),
    ("k-grouped-fp8-sa", "k_grouped_fp8_gemm_tn_contiguous", k_grouped_fp8(a=(fp8(256, 16), scales(16, 2))), ValueError, "a[1] (scales)"),
    ("mqa-q-dtype", "fp8_mqa_logits", mqa(q=torch.randn(4, 2, 64)), TypeError, "q: got dtype"),
    ("mqa-weights", "fp8_mqa_logits", mqa(weights=torch.randn(4, 3)), ValueError, "weights"),
    ("mqa-window-order", "fp8_mqa_logits", mqa(cu_seq_len_k_start=torch.full((4,), 10).int(), cu_seq_len_k_end=torch.full((4,), 5).int()), ValueError, "window"),
    ("mqa-window-end", "fp8_mqa_logits", mqa(cu_seq_len_k_end=torch.full((4,), 33).int()), ValueError, "S_kv=32"),
    ("mqa-kv-dim", "fp8_mqa_logits", mqa(kv=(fp8(32, 128), scales(32))), ValueError, "kv[0]"),
    ("paged-ctx-dtype", "fp8_paged_mqa_logits", paged(context_lens=torch.tensor([20, 5])), TypeError, "context_lens"),
    ("paged-cache-dim", "fp8_paged_mqa_logits", paged(kv_cache=torch.zeros(4, 16, 1, 64, dtype=torch.uint8)), ValueError, "kv_cache"),
    ("paged-block-range", "fp8_paged_mqa_logits", paged(block_table=torch.tensor([[0, 4], [2, 3]]).int()), ValueError, "block_table"),
    ("paged-max-len", "fp8_paged_mqa_logits", paged(max_context_len=16), ValueError, "max_context_len"),
    ("paged-table-short", "fp8_paged_mqa_logits", paged(context_lens=torch.tensor([40, 5]).int(), max_context_len=40), ValueError, "block_table"),
    # DeepGEMM's scale orientation: a transposed operand's scales are transposed too
    ("nn-sb-old-orientation", "fp8_gemm_nn", dense_fp8(b=(fp8(256, 16), scales(1, 2))), ValueError, "b[1] (scales)"),
    ("tn-sa-old-orientation", "fp8_gemm_tn", dense_fp8(a=(fp8(256, 8), scales(8, 2)), b=(fp8(256, 16), scales(2, 1))), ValueError, "a[1] (scales)"),
    ("recipe-and-pair", "fp8_gemm_nt", dense_fp8(recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(128, 128)), ValueError, "recipe"),
    ("recipe-a-alone", "fp8_gemm_nt", dense_fp8(recipe_a=(1, 128)), ValueError, "recipe_b"),
    ("recipe-gran-k-32", "fp8_gemm_nt", dense_fp8(recipe_a=(1, 32), recipe_b=(128, 32)), NotImplementedError, "gran_k=32"),
    ("fp4-operand", "fp8_fp4_gemm_nt", dense_fp8(b=(torch.zeros(16, 128, dtype=torch.int8), scales(1, 2))), NotImplementedError, "FP4"),
    ("ue8m0-int-scales", "fp8_fp4_gemm_nt", dense_fp8(a=(fp8(8, 256), torch.zeros(8, 1, dtype=torch.int32))), NotImplementedError, "UE8M0"),
    ("compiled-dims-type", "bf16_gemm_nt", dense_bf16(compiled_dims=3), TypeError, "compiled_dims"),
    ("m-grouped-row-scales", "m_grouped_fp8_fp4_gemm_nt_contiguous", dict(a=(fp8(128, 128), scales(128, 1)), b=(fp8(2, 32, 128), scales(2, 32, 1)), d=poisoned(128, 32), grouped_layout=torch.zeros(128).int()), ValueError, "128x128"),
    ("expected-m-without-psum", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(expected_m_for_psum_layout=64), ValueError, "expected_m_for_psum_layout"),
    ("alignment-zero", "m_grouped_bf16_gemm_nt_contiguous", m_grouped(alignment=0), ValueError, "alignment"),
    ("k-grouped-psum", "k_grouped_bf16_gemm_tn_contiguous", k_grouped(use_psum_layout=True), NotImplementedError, "psum"),
    ("k-grouped-nt-numel", "k_grouped_fp8_gemm_nt_contiguous", k_grouped_fp8(a=(fp8(255 * 16), scales(16, 2))), ValueError, "sum(ks_cpu)"),
    ("mqa-fp4-q", "fp8_fp4_mqa_logits", mqa(q=(fp8(4, 2, 64), torch.zeros(4, 2, dtype=torch.int32))), NotImplementedError, "FP4"),
    ("mqa-logits-dtype", "fp8_fp4_mqa_logits", mqa(logits_dtype=torch.float16), TypeError, "logits_dtype"),
    ("mqa-bf16-weights-fp32-logits", "fp8_fp4_mqa_logits", mqa(weights=torch.randn(4, 2).bfloat16()), TypeError, "weights"),
    ("mqa-max-seqlen", "fp8_fp4_mqa_logits", mqa(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    ("paged-indices", "fp8_fp4_paged_mqa_logits", paged(indices=torch.zeros(3, dtype=torch.int32)), ValueError, "indices"),
    ("einsum-expr", "einsum", dict(expr="ij,jk->ik", a=torch.zeros(2, 2).bfloat16(), b=torch.zeros(2, 2).bfloat16(), d=torch.zeros(2, 2)), ValueError, "expr"),
    ("einsum-dims", "einsum", dict(expr="bhr,hdr->bhd", a=torch.zeros(2, 3, 4).bfloat16(), b=torch.zeros(3, 5, 6).bfloat16(), d=torch.zeros(2, 3, 5)), ValueError, "'r'"),
    ("hc-b-dtype", "tf32_hc_prenorm_gemm", dict(a=torch.zeros(4, 8).bfloat16(), b=torch.zeros(2, 8).bfloat16(), d=torch.zeros(4, 2), sqr_sum=torch.zeros(4)), TypeError, "b: got dtype"),
    ("hc-splits-shape", "tf32_hc_prenorm_gemm", dict(a=torch.zeros(4, 8).bfloat16(), b=torch.zeros(2, 8), d=torch.zeros(4, 2), sqr_sum=torch.zeros(4), num_splits=2), ValueError, "d: got"),
    ("meta-num-sms", "get_paged_mqa_logits_metadata", dict(context_lens=torch.tensor([5]).int(), block_kv=64, num_sms=0), ValueError, "num_sms"),
    ("meta-block-kv", "get_paged_mqa_logits_metadata", dict(context_lens=torch.tensor([5]).int(), block_kv="64", num_sms=4), TypeError, "block_kv"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_and_leaves_d_untouched(case):
    _, op, kwargs, exc, fragment = case
    d = kwargs.get("d")
    before = d.clone() if isinstance(d, torch.Tensor) and d.device.type != "meta" else None
    with pytest.raises(exc) as info:
        getattr(tilegemm, op)(**kwargs, backend="pytorch")
    assert fragment in str(info.value)
    if before is not None:
        assert torch.equal(d.isnan(), before.isnan()), "d was written before the error"


def test_value_checks_can_be_skipped(monkeypatch):
    """Inside skip_value_checks() the host-syncing checks (here: 128-row alignment) do not run."""
    kwargs = m_grouped(grouped_layout=torch.tensor([0] * 100 + [1] * 284).int())
    with checks.skip_value_checks():
        assert not checks.value_checks_enabled()
        tilegemm.m_grouped_bf16_gemm_nt_contiguous(**kwargs, backend="pytorch")  # no ValueError now
    a, b, d = kwargs["a"].float(), kwargs["b"].float(), kwargs["d"]
    torch.testing.assert_close(d[128:], a[128:] @ b[1].T)  # the blocks that keep the contract are right


def test_m_indices_group_tails_padded_with_minus_one_are_valid():
    m_indices = torch.tensor([0] * 100 + [-1] * 28 + [1] * 5 + [-1] * 123 + [-1] * 128, dtype=torch.int32)
    kwargs = m_grouped(grouped_layout=m_indices)
    tilegemm.m_grouped_bf16_gemm_nt_contiguous(**kwargs, backend="pytorch")
    a, b, d = kwargs["a"].float(), kwargs["b"].float(), kwargs["d"]
    torch.testing.assert_close(d[:100], a[:100] @ b[0].T)
    torch.testing.assert_close(d[128:133], a[128:133] @ b[1].T)
    assert torch.equal(d[100:128], torch.zeros(28, 32)) and torch.equal(d[133:], torch.zeros(251, 32))


def test_skip_value_checks_context():
    assert checks.value_checks_enabled()
    with checks.skip_value_checks():
        assert not checks.value_checks_enabled()
    assert checks.value_checks_enabled()


def test_recipe_inference():
    sb_block, sb_row = scales(2, 3), scales(200, 3)
    assert checks.resolve_recipe(sb_block, 200, 300, None) == (1, 128, 128)
    assert checks.resolve_recipe(sb_row, 200, 300, None) == (1, 1, 128)
    assert checks.resolve_recipe(sb_row, 200, 300, [1, 1, 128]) == (1, 1, 128)
    assert checks.resolve_recipe(sb_row, 200, 300, None, (1, 128), (1, 128)) == (1, 1, 128)
    assert checks.resolve_recipe(sb_block, 200, 300, None, (1, 128), (128, 128)) == (1, 128, 128)


def test_checks_return_the_logical_form():
    """Every layout collapses to a [M, K], b [N, K] with the scales transposed along with the data."""
    aq, sa = fp8(256, 8), scales(2, 8)  # tn: a [K, M], sa [K/128, M]
    bq, sb = fp8(256, 16), scales(2, 1)  # tn: b [K, N], sb [K/128, N/128]
    derived = checks.dense_gemm_check("tn", fp8=True)((aq, sa), (bq, sb), poisoned(8, 16))
    (la, lsa), (lb, lsb) = derived["a"], derived["b"]
    assert torch.equal(la.view(torch.uint8), aq.t().view(torch.uint8)) and torch.equal(lsa, sa.t())
    assert torch.equal(lb.view(torch.uint8), bq.t().view(torch.uint8)) and torch.equal(lsb, sb.t())
    assert derived["recipe"] == (1, 128, 128) and "compiled_dims" not in derived


def test_visible_lengths():
    one_d = checks.visible_lengths(torch.tensor([5, 9]).int(), 3)
    assert one_d.tolist() == [[3, 4, 5], [7, 8, 9]]
    two_d = torch.tensor([[1, 2], [3, 4]]).int()
    assert checks.visible_lengths(two_d, 2).tolist() == two_d.tolist()
