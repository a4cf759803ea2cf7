"""Regression tests of issue 16's reproducers: each bad input is a clear error, each edge input works."""

from __future__ import annotations

import fractions
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilegemm as tg
from tilegemm import indexer

FP8 = torch.float8_e4m3fn


def fp8(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).clamp(-400, 400).to(FP8)


def scales(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def paged(**over):
    ctx = torch.tensor([20, 5], dtype=torch.int32)
    kw = dict(q=fp8(2, 1, 2, 64), kv_cache=torch.randint(0, 255, (4, 16, 1, 68), dtype=torch.uint8))
    kw.update(weights=torch.randn(2, 2), context_lens=ctx, block_table=torch.tensor([[0, 1], [2, 3]]).int())
    kw.update(schedule_meta=tg.get_paged_mqa_logits_metadata(ctx, 16, 2), max_context_len=32)
    kw.update(over)
    return kw


def test_k_grouped_fp8_scales_on_another_device_write_nothing():
    d = torch.full((2, 16, 24), math.nan)
    a, b = (fp8(256, 16), torch.empty(2, 16, device="meta")), (fp8(256, 24), scales(2, 24))
    with pytest.raises(ValueError, match=r"a\[1\] \(scales\): expected device cpu"):
        tg.k_grouped_fp8_gemm_tn_contiguous(a, b, d, [0, 256], torch.tensor([0, 256]).int(), backend="pytorch")
    assert d.isnan().all()


@pytest.mark.parametrize("op", ["m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"])
def test_grouped_fp8_scales_device_is_checked(op):
    masked = "masked" in op
    a = (fp8(1, 128, 128), scales(1, 128, 1)) if masked else (fp8(128, 128), scales(128, 1))
    b = (fp8(1, 32, 128), torch.empty(1, 1, 1, device="meta"))
    d = torch.full((1, 128, 32) if masked else (128, 32), math.nan)
    layout = torch.tensor([128]).int() if masked else torch.zeros(128).int()
    with pytest.raises(ValueError, match=r"b\[1\] \(scales\): expected device cpu"):
        getattr(tg, op)(a, b, d, layout, *([64] if masked else []), backend="pytorch")


def _m_grouped_fp8_call(op: str, sb: torch.Tensor, **kw):
    """Call m-grouped FP8 ``op`` (contiguous nt/nn or masked) with G=2, M=N=K=256 and RHS scales ``sb``."""
    g, m, n, k = 2, 256, 256, 256
    if "masked" in op:
        a, d = (fp8(g, m, k), scales(g, m, 2)), torch.full((g, m, n), math.nan)
        return getattr(tg, op)(a, (fp8(g, n, k), sb), d, torch.tensor([m, m]).int(), m, backend="pytorch", **kw), d
    a, d = (fp8(m, k), scales(m, 2)), torch.full((m, n), math.nan)
    b = fp8(g, k, n) if "_nn_" in op else fp8(g, n, k)
    return getattr(tg, op)(a, (b, sb), d, torch.zeros(m).int(), backend="pytorch", **kw), d


M_GROUPED_FP8_OPS = [
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
]


@pytest.mark.parametrize("op", M_GROUPED_FP8_OPS)
def test_m_grouped_fp8_1x128_rhs_scales_name_b_scales(op):
    """1x128 RHS scales (per row of b) name ``b[1]`` and the 128x128-block shape, not ``recipe`` (never passed)."""
    rows = scales(2, 2, 256) if "_nn_" in op else scales(2, 256, 2)  # [G, N, K/128] in the data's orientation
    with pytest.raises(ValueError, match=r"^b\[1\] \(scales\): got shape .*1x128 rows.*expected \[2, 2, 2\] \(128x128"):
        _m_grouped_fp8_call(op, rows)


@pytest.mark.parametrize(
    ("kw", "name"),
    [(dict(recipe=(1, 1, 128)), "recipe"), (dict(recipe_a=(1, 128), recipe_b=(1, 128)), "recipe_a, recipe_b")],
    ids=["recipe", "recipe-pair"],
)
@pytest.mark.parametrize("op", ["m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"])
def test_m_grouped_fp8_1x128_recipe_names_what_was_passed(op, kw, name):
    with pytest.raises(ValueError, match=rf"^{name}: got .*takes \(1, 128, 128\)"):
        _m_grouped_fp8_call(op, scales(2, 256, 2), **kw)


@pytest.mark.parametrize("op", M_GROUPED_FP8_OPS)
def test_m_grouped_fp8_block_scales_still_infer(op):
    """The 128x128 block scales the ops take still pass the check (and the ops' results are finite)."""
    out, d = _m_grouped_fp8_call(op, scales(2, 2, 2))
    assert out is d and torch.isfinite(d).all()


@pytest.mark.parametrize(
    "meta",
    [
        torch.randint(-5, 99, (3, 2)).int(),  # garbage
        tg.get_paged_mqa_logits_metadata(torch.tensor([2000, 5]).int(), 16, 2),  # built for other lengths
    ],
    ids=["garbage", "other-lengths"],
)
def test_paged_schedule_meta_values_are_checked(meta):
    with pytest.raises(ValueError, match="schedule_meta"):
        tg.fp8_paged_mqa_logits(**paged(schedule_meta=meta), backend="pytorch")


def test_paged_schedule_meta_for_another_block_size():
    ctx = torch.tensor([600, 5], dtype=torch.int32)
    kw = paged(context_lens=ctx, kv_cache=torch.zeros(40, 16, 1, 68, dtype=torch.uint8), max_context_len=600)
    kw["block_table"] = torch.arange(80, dtype=torch.int32).view(2, 40) % 40
    for block_kv, ok in ((16, True), (512, False)):
        kw["schedule_meta"] = tg.get_paged_mqa_logits_metadata(ctx, block_kv, 2)
        if ok:
            tg.fp8_paged_mqa_logits(**kw, backend="pytorch")
        else:
            with pytest.raises(ValueError, match="schedule_meta"):
                tg.fp8_paged_mqa_logits(**kw, backend="pytorch")


def test_paged_schedule_meta_on_the_meta_device():
    meta = torch.empty(3, 2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="schedule_meta: expected device cpu"):
        tg.fp8_paged_mqa_logits(**paged(schedule_meta=meta), backend="pytorch")


def test_paged_next_n_zero_is_an_empty_result():
    out = tg.fp8_paged_mqa_logits(**paged(q=fp8(2, 0, 2, 64), weights=torch.randn(0, 2)), backend="pytorch")
    assert out.shape == (0, 32)


def test_fp8_linear_checks_before_the_gemm():
    x, w = torch.randn(4, 256).bfloat16(), torch.randn(8, 256).bfloat16()
    with pytest.raises(TypeError, match="x: got dtype torch.float32"):
        tg.fp8_linear(x.float(), w)
    with pytest.raises(ValueError, match="bias: got shape"):
        tg.fp8_linear(x, w, torch.randn(7).bfloat16())


@pytest.mark.parametrize("psum", [False, True])
def test_m_grouped_n_zero(psum):
    layout = torch.tensor([64, 128]).int() if psum else torch.zeros(128).int()
    d = torch.empty(128, 0)
    a, b = torch.randn(128, 64).bfloat16(), torch.randn(2, 0, 64).bfloat16()
    assert tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=psum, backend="pytorch") is d


@pytest.mark.parametrize("alpha", [fractions.Fraction(1, 3), 2**64])
def test_real_alpha_beta(alpha):
    a, b, c = torch.randn(8, 256).bfloat16(), torch.randn(16, 256).bfloat16(), torch.randn(8, 16)
    d = tg.bf16_gemm_nt(a, b, torch.empty(8, 16), c, alpha=alpha, beta=alpha, backend="pytorch")
    want = float(alpha) * (a.double() @ b.double().T + c.double())
    assert tg.calc_diff(d, want) < 1e-6


def test_alpha_outside_a_float():
    a, b = torch.randn(8, 256).bfloat16(), torch.randn(16, 256).bfloat16()
    with pytest.raises(ValueError, match="alpha: got int"):
        tg.bf16_gemm_nt(a, b, torch.empty(8, 16), alpha=10**400, backend="pytorch")


def test_d_that_requires_grad():
    a, b = torch.randn(8, 256).bfloat16(), torch.randn(16, 256).bfloat16()
    with pytest.raises(ValueError, match="d: requires grad"):
        tg.bf16_gemm_nt(a, b, torch.empty(8, 16, requires_grad=True), backend="pytorch")
    with torch.no_grad():
        tg.bf16_gemm_nt(a, b, torch.empty(8, 16, requires_grad=True), backend="pytorch")


def _mqa_wide() -> torch.Tensor:
    q, kv, w = fp8(4, 2, 64), (fp8(32, 64), scales(32)), torch.randn(4, 2)
    return tg.fp8_mqa_logits(q, kv, w, torch.zeros(4).int(), torch.zeros(4).int(), max_seqlen_k=2**62)


@pytest.mark.parametrize(
    "call, name",
    [
        (_mqa_wide, "max_seqlen_k"),
        (lambda: tg.fp8_paged_mqa_logits(**paged(max_context_len=2**62)), "max_context_len"),
        (lambda: tg.get_paged_mqa_logits_metadata(torch.tensor([20, 5]).int(), 16, 2**62), "num_sms"),
    ],
    ids=["mqa", "paged", "metadata"],
)
def test_huge_outputs_are_refused(call, name):
    with tg.use_backend("pytorch"), pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("fn", [tg.per_token_cast_to_fp8, tg.per_block_cast_to_fp8, tg.per_channel_cast_to_fp8])
@pytest.mark.parametrize("x, error", [(torch.tensor(1.0), ValueError), ([[1.0] * 128], TypeError)], ids=["0-d", "list"])
def test_quant_helpers_name_x(fn, x, error):
    with pytest.raises(error, match=rf"{fn.__name__}: x:"):
        fn(x)


def test_calc_diff_refuses_meta_and_mismatched_shapes():
    with pytest.raises(ValueError, match="meta"):
        tg.calc_diff(torch.ones(3, device="meta"), torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="shape"):
        tg.calc_diff(torch.ones(3), torch.ones(4))


KG = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
TSF = "transform_sf_into_required_layout"
LAYOUT = torch.tensor([128]).int()


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: tg.ceil_to_ue8m0([1.0, 3.0]), TypeError, "ceil_to_ue8m0: x: got list"),
        (lambda: tg.ceil_to_ue8m0(3.0), TypeError, "ceil_to_ue8m0: x: got float"),
        (lambda: tg.ceil_to_ue8m0(torch.tensor([True])), TypeError, "ceil_to_ue8m0: x: got dtype torch.bool"),
        (lambda: tg.pack_ue8m0_to_int([1.0] * 4), TypeError, "pack_ue8m0_to_int: x: got list"),
        (lambda: tg.pack_ue8m0_to_int(torch.tensor(1.0)), ValueError, r"pack_ue8m0_to_int: x: got shape \[\]"),
        (lambda: tg.pack_ue8m0_to_int(torch.ones(4).bfloat16()), TypeError, "pack_ue8m0_to_int: x: got dtype"),
        (lambda: tg.get_tma_aligned_size([5], 4), TypeError, "get_tma_aligned_size: x: got list"),
        (lambda: tg.get_tma_aligned_size(5, 4.0), TypeError, "get_tma_aligned_size: element_size: got float"),
        (lambda: tg.get_mn_major_tma_aligned_tensor([[1.0]]), TypeError, "get_mn_major_tma_aligned_tensor: sf:"),
        (lambda: tg.get_mn_major_tma_aligned_tensor(torch.tensor(1.0)), ValueError, "tma_aligned_tensor: sf:"),
        (lambda: tg.get_mn_major_tma_aligned_packed_ue8m0_tensor([[1.0]]), TypeError, "packed_ue8m0_tensor: sf:"),
        (lambda: tg.get_mn_major_tma_aligned_packed_ue8m0_tensor(torch.tensor(1.0)), ValueError, "ue8m0_tensor: sf:"),
        (lambda: getattr(tg, KG)([[1.0]], LAYOUT, None, 128, 128), TypeError, f"{KG}: sf: got list"),
        (lambda: getattr(tg, KG)(torch.tensor(1.0), LAYOUT, None, 128, 128), ValueError, f"{KG}: sf: got shape"),
        (lambda: getattr(tg, KG)(torch.ones(1, 4), [128], None, 128, 128), TypeError, f"{KG}: grouped_layout:"),
        (lambda: getattr(tg, KG)(torch.ones(1, 4), LAYOUT, 128, 128, 128), TypeError, f"{KG}: ks_cpu: got int"),
        (lambda: getattr(tg, TSF)([[1.0]], 1, 128, (1, 128, 128), is_sfa=True), TypeError, f"{TSF}: sf must"),
        (lambda: getattr(tg, TSF)(torch.tensor(1.0), 1, 128, (1, 128, 128), is_sfa=True), ValueError, "sf has shape"),
        (lambda: getattr(tg, TSF)(torch.ones(1, 1), 1, 128, 128, is_sfa=True), TypeError, f"{TSF}: recipe: got int"),
        (lambda: getattr(tg, TSF)(torch.ones(1, 1), [1], 128, (1, 128, 128), is_sfa=True), TypeError, f"{TSF}: mn:"),
    ],
    ids=[
        "ceil-list", "ceil-float", "ceil-bool", "pack-list", "pack-0d", "pack-bf16", "tma-size-list",
        "tma-size-float", "mn-major-list", "mn-major-0d", "packed-list", "packed-0d", "k-grouped-list",
        "k-grouped-0d", "k-grouped-layout-list", "k-grouped-ks-int", "transform-list", "transform-0d",
        "transform-recipe-int", "transform-mn-list",
    ],
)  # fmt: skip
def test_ue8m0_and_layout_helpers_name_their_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_ceil_to_ue8m0_takes_0d_and_integer_tensors():
    out = tg.ceil_to_ue8m0(torch.tensor(3.0))
    assert out.shape == () and out.dtype == torch.float32 and float(out) == 4.0
    assert torch.equal(tg.ceil_to_ue8m0(torch.tensor([3, -5, 8])), torch.tensor([4.0, 8.0, 8.0]))


def test_calc_diff_refuses_tensors_on_two_devices():
    with pytest.raises(ValueError, match="x is on cpu but y is on meta"):
        tg.calc_diff(torch.ones(3), torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="x is on meta but y is on cpu"):
        tg.calc_diff(torch.ones(3, device="meta"), torch.ones(3))


@pytest.mark.gpu
def test_calc_diff_refuses_cuda_and_cpu():
    with pytest.raises(ValueError, match="x is on cuda:0 but y is on cpu"):
        tg.calc_diff(torch.ones(3, device="cuda"), torch.ones(3))


def test_grouped_matmul_errors_name_its_arguments():
    x, w = torch.randn(8, 16).bfloat16(), torch.randn(2, 4, 16).bfloat16()
    with pytest.raises(ValueError, match="offs"):
        tg.grouped_matmul(x, w, torch.tensor([4, 9]).int())
    with pytest.raises(TypeError, match="offs"):
        tg.grouped_matmul(x, w, torch.tensor([4, 8]))
    with pytest.raises(ValueError, match="x .* w"):
        tg.grouped_matmul(x, torch.randn(2, 4, 15).bfloat16(), torch.tensor([4, 8]).int())


# ------------------------------------------------------- einsum, fp8_moe_experts and the indexer helpers (issue 45)


@pytest.mark.parametrize("expr", [["bmk,bnk->mn"], {"bmk,bnk->mn": 1}, None, 3], ids=["list", "dict", "None", "int"])
def test_einsum_expr_of_another_type_names_expr(expr):
    a, b, d = torch.randn(2, 4, 8).bfloat16(), torch.randn(2, 6, 8).bfloat16(), torch.zeros(4, 6)
    with pytest.raises(TypeError, match=r"^expr: got .*expected a str"):
        tg.einsum(expr, a, b, d, backend="pytorch")
    with pytest.raises(TypeError, match=r"^expr: got .*expected a str"):
        tg.fp8_einsum(expr, (fp8(2, 4, 128), scales(2, 4, 1)), (fp8(2, 6, 128), scales(2, 1, 1)), d)
    assert d.eq(0).all()


def _fp8_moe_operands(hidden_dim: int, inter: int):
    experts, tokens = 2, 3
    hidden = torch.randn(tokens, hidden_dim).bfloat16()
    ids, weights = torch.zeros(tokens, 1, dtype=torch.int32), torch.ones(tokens, 1)
    blocks = lambda n: -(-n // 128)  # noqa: E731
    w13 = (fp8(experts, 2 * inter, hidden_dim), scales(experts, blocks(2 * inter), blocks(hidden_dim)))
    w2 = (fp8(experts, hidden_dim, inter), scales(experts, blocks(hidden_dim), blocks(inter)))
    return hidden, ids, weights, w13, w2


@pytest.mark.parametrize(
    ("hidden_dim", "inter", "name"), [(96, 128, "hidden"), (200, 128, "hidden"), (128, 64, "w13"), (128, 192, "w13")]
)
def test_fp8_moe_experts_unaligned_dims_name_the_operand(hidden_dim, inter, name):
    with pytest.raises(ValueError, match=rf"^{name}(\[0\])?: got .*multiple of 128.*w2"):
        tg.fp8_moe_experts(*_fp8_moe_operands(hidden_dim, inter), backend="pytorch")


# The indexer helpers: every argument of the wrong type is a TypeError naming it, every value out of range a
# ValueError naming it (before: AttributeError / RuntimeError from inside torch, or a silent result).
INDEXER_BAD_CALLS = [
    (lambda: indexer.causal_windows(2.5, 5), TypeError, "s_q"),
    (lambda: indexer.causal_windows(2, 5.0), TypeError, "s_kv"),
    (lambda: indexer.causal_windows("2", 5), TypeError, "s_q"),
    (lambda: indexer.causal_windows(-1, 5), ValueError, "s_q"),
    (lambda: indexer.causal_windows(6, 5), ValueError, "s_q"),
    (lambda: indexer.causal_windows(2, 5, window=1.5), TypeError, "window"),
    (lambda: indexer.causal_windows(2, 5, window=0), ValueError, "window"),
    (lambda: indexer.packed_causal_windows([1.5], [3]), TypeError, r"q_lens\[0\]"),
    (lambda: indexer.packed_causal_windows([1], [-3]), ValueError, r"kv_lens\[0\]"),
    (lambda: indexer.packed_causal_windows([4], [3]), ValueError, r"q_lens\[0\]"),
    (lambda: indexer.packed_causal_windows(3, [3]), TypeError, "q_lens"),
    (lambda: indexer.packed_causal_windows([1, 2], [3]), ValueError, "kv_lens"),
    (lambda: indexer.packed_causal_windows(torch.tensor([1.0]), [3]), TypeError, "q_lens"),
    (lambda: indexer.context_parallel_windows(8.0, 2, 0), TypeError, "seq_len"),
    (lambda: indexer.context_parallel_windows(8, 0, 0), ValueError, "cp_size"),
    (lambda: indexer.context_parallel_windows(8, 2, -1), ValueError, "cp_rank"),
    (lambda: indexer.context_parallel_windows(8, 2, 2), ValueError, "cp_rank"),
    (lambda: indexer.quantize_keys([[1.0, 2.0]]), TypeError, "keys"),
    (lambda: indexer.build_paged_kv_cache(torch.randn(40, 64), 16), ValueError, "keys"),
    (lambda: indexer.build_paged_kv_cache(torch.ones(3, 40, 64, dtype=torch.int32), 16), TypeError, "keys"),
    (lambda: indexer.build_paged_kv_cache(torch.randn(0, 40, 64), 16), ValueError, "keys"),
    (lambda: indexer.build_paged_kv_cache(5, 16), TypeError, "keys"),
    (lambda: indexer.build_paged_kv_cache([torch.randn(40, 64)], 16.0), TypeError, "block_kv"),
    (lambda: indexer.build_paged_kv_cache([torch.randn(40, 64)], 0), ValueError, "block_kv"),
    (lambda: indexer.build_paged_kv_cache([torch.randn(40, 64)], 16, num_blocks=-1), ValueError, "num_blocks"),
    (lambda: indexer.build_paged_kv_cache([torch.randn(40, 64)], 16, max_blocks=2.5), TypeError, "max_blocks"),
    (lambda: indexer.build_paged_kv_cache([[1.0] * 64], 16), TypeError, r"keys\[0\]"),
    (lambda: indexer.build_paged_kv_cache([torch.randn(40, 64), [1.0]], 16), TypeError, r"keys\[1\]"),
    (lambda: indexer.build_paged_kv_cache([(torch.randn(4, 64), torch.ones(4))], 16), TypeError, r"keys\[0\]\[0\]"),
]


@pytest.mark.parametrize(("call", "error", "name"), INDEXER_BAD_CALLS, ids=[n for _, _, n in INDEXER_BAD_CALLS])
def test_indexer_helpers_name_their_arguments(call, error, name):
    with pytest.raises(error, match=rf"^({name}): got"):
        call()


def _paged_cache():
    return indexer.build_paged_kv_cache([torch.randn(20, 64), torch.randn(5, 64)], 16)


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        (lambda c, t, n: (c, t, [20, 5]), TypeError, "context_lens"),
        (lambda c, t, n: (c, t, n.float()), TypeError, "context_lens"),
        (lambda c, t, n: (c, t, torch.tensor([20, -5], dtype=torch.int32)), ValueError, r"context_lens\[1\]"),
        (lambda c, t, n: (c, t, torch.tensor([33, 5], dtype=torch.int32)), ValueError, r"context_lens\[0\]"),
        (lambda c, t, n: (c, t, n[:1]), ValueError, "context_lens"),
        (lambda c, t, n: (c, t.tolist(), n), TypeError, "block_table"),
        (lambda c, t, n: (c.float(), t, n), TypeError, "kv_cache"),
        (lambda c, t, n: (c.flatten(), t, n), ValueError, "kv_cache"),
    ],
    ids=["list", "float", "negative", "past-the-table", "short", "table-list", "cache-float", "cache-1d"],
)
def test_read_paged_kv_cache_names_its_arguments(change, error, name):
    with pytest.raises(error, match=rf"^{name}: got"):
        indexer.read_paged_kv_cache(*change(*_paged_cache()))


@pytest.mark.parametrize(("row", "col", "block"), [(0, 1, 3), (0, 0, 2**31 - 1), (1, 0, -1)])
def test_read_paged_kv_cache_names_a_block_id_out_of_range(row, col, block):
    """A used block id outside [0, num_blocks) is a ValueError naming the table entry and the id (before: a bare
    IndexError from inside torch, or a device-side assert on a GPU)."""
    cache, table, lens = _paged_cache()
    assert cache.shape[0] == 3
    table[row, col] = block
    with pytest.raises(
        ValueError, match=rf"^block_table\[{row}, {col}\]: got block id {block}, expected .*< num_blocks"
    ):
        indexer.read_paged_kv_cache(cache, table, lens)


def test_read_paged_kv_cache_ignores_unused_table_entries():
    """Entries past a sequence's ceil(L / block_kv) blocks are not read, so any value there is fine."""
    cache, table, lens = _paged_cache()
    want = indexer.read_paged_kv_cache(cache, table, lens)
    table[1, 1] = 10**6  # sequence 1 has 5 keys: one block
    got = indexer.read_paged_kv_cache(cache, table, lens)
    for (d_want, s_want), (d_got, s_got) in zip(want, got):
        assert torch.equal(d_want.view(torch.uint8), d_got.view(torch.uint8)) and torch.equal(s_want, s_got)


def test_build_paged_kv_cache_takes_one_batched_tensor():
    """keys [B, L, D] is B sequences of L keys: the same cache as the list of its rows."""
    keys = torch.randn(3, 40, 64, generator=torch.Generator().manual_seed(0))
    cache, table, lens = indexer.build_paged_kv_cache(keys, 16)
    cache_list, table_list, lens_list = indexer.build_paged_kv_cache(list(keys), 16)
    assert lens.tolist() == [40, 40, 40]
    assert torch.equal(cache, cache_list) and torch.equal(table, table_list) and torch.equal(lens, lens_list)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    s_q=st.one_of(st.integers(-5, 40), st.floats(-5, 40), st.text(max_size=2), st.none(), st.booleans()),
    s_kv=st.one_of(st.integers(-5, 40), st.floats(-5, 40)),
)
def test_causal_windows_any_input_is_a_result_or_a_named_error(s_q, s_kv):
    """Whatever the lengths: correct windows for ints 0 <= s_q <= s_kv, else TypeError/ValueError naming one."""
    try:
        ks, ke = indexer.causal_windows(s_q, s_kv)
    except (TypeError, ValueError) as exc:
        assert str(exc).split(":")[0] in ("s_q", "s_kv")
        valid = all(isinstance(v, int) and not isinstance(v, bool) for v in (s_q, s_kv)) and 0 <= s_q <= s_kv
        assert not valid, f"valid lengths refused: {exc}"
        return
    assert isinstance(s_q, int) and isinstance(s_kv, int) and not isinstance(s_q, bool)
    assert ke.tolist() == list(range(s_kv - s_q + 1, s_kv + 1)) and ks.eq(0).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.one_of(st.integers(-3, 40), st.floats(-3, 40)), min_size=1, max_size=3))
def test_read_paged_kv_cache_any_context_lens(lens):
    """Integer lengths within the table read back that many keys; negative, too long or fractional ones are errors
    naming ``context_lens``."""
    cache, table, _ = indexer.build_paged_kv_cache([torch.randn(40, 64)] * len(lens), 16)
    is_int = all(isinstance(n, int) for n in lens)
    context_lens = torch.tensor(lens, dtype=torch.int32 if is_int else torch.float32)
    if is_int and all(0 <= n <= 48 for n in lens):
        out = indexer.read_paged_kv_cache(cache, table, context_lens)
        assert [len(data) for data, _ in out] == lens
        return
    with pytest.raises((TypeError, ValueError), match=r"^context_lens(\[\d\])?: got"):
        indexer.read_paged_kv_cache(cache, table, context_lens)
