"""DeepGEMM v2.6.1's own test calls, with its generators' conventions, against ``tilegemm as deep_gemm``.

Each test builds its inputs the way DeepGEMM's ``tests/generators.py`` does (K-major / MN-major
operands made by ``.T.contiguous().T``, the ``test_alias`` form that passes ``(a[0].T, a[1].T)`` to
the ``nn``/``tn``/``tt`` ops, psum ends with 128-aligned group starts, k-grouped K-major blocks)
and calls the op exactly as DeepGEMM's ``test_bf16.py`` / ``test_fp8_fp4.py`` / ``test_attention.py``
/ ``test_einsum.py`` / ``test_hyperconnection.py`` / ``test_layout.py`` do (positional and keyword
arguments, no ``backend=``: the current backend runs). Shapes are small so the CPU runs them; the
same tests run on the GPU through the default backend (``gpu``-marked parameters).
"""

from __future__ import annotations

import random

import pytest
import torch

import tilegemm as deep_gemm
from tilegemm.testing import calc_diff

DEVICES = [
    pytest.param(("pytorch", "cpu"), id="pytorch-cpu"),
    pytest.param(
        (None, "cuda"),
        id="default-cuda",
        marks=pytest.mark.gpu,
    ),
]


@pytest.fixture(params=DEVICES)
def device(request):
    """The device; the op calls below carry no ``backend=``: the backend comes from ``use_backend``."""
    backend, dev = request.param
    random.seed(0)
    torch.manual_seed(0)
    if backend is None:
        yield dev
    else:
        with deep_gemm.use_backend(backend):
            yield dev


def align(x: int, y: int) -> int:
    return -(-x // y) * y


def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


# ------------------------------------------------------------------------------- GEMMs (test_bf16 / test_fp8_fp4)


def generate_normal(m, n, k, a_k_major, b_k_major, accumulate, out_dtype, device, use_bf16, block_b=True):
    """DeepGEMM's ``generate_normal``: operands in K- or MN-major storage (same logical [M, K], [N, K])."""
    a = torch.randn((m, k), device=device, dtype=torch.bfloat16)
    b = torch.randn((n, k), device=device, dtype=torch.bfloat16)
    d = (
        torch.randn((m, n), device=device, dtype=out_dtype) * 32
        if accumulate
        else torch.empty((m, n), device=device, dtype=out_dtype)
    )
    c = d if accumulate else None
    ref_d = (a.float() @ b.float().t() + (c if accumulate else 0)).to(out_dtype)
    if use_bf16:
        a = a if a_k_major else a.T.contiguous().T
        b = b if b_k_major else b.T.contiguous().T
        return a, b, c, d, ref_d
    a = deep_gemm.per_token_cast_to_fp8(a, use_ue8m0=False)
    b = deep_gemm.per_block_cast_to_fp8(b, use_ue8m0=False) if block_b else deep_gemm.per_token_cast_to_fp8(b, False)
    a = a if a_k_major else (a[0].T.contiguous().T, a[1])
    b = b if b_k_major else (b[0].T.contiguous().T, b[1])
    return a, b, c, d, ref_d


MAJORS = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("majors", MAJORS, ids=["NT", "NN", "TN", "TT"])
@pytest.mark.parametrize("accumulate,out_dtype", [(False, torch.bfloat16), (True, torch.float), (False, torch.float)])
@pytest.mark.parametrize("test_alias", [False, True])
def test_bf16_gemm(device, majors, accumulate, out_dtype, test_alias):
    m, n, k = 129, 256, 384
    a_k, b_k = majors
    a, b, c, d, ref_d = generate_normal(m, n, k, a_k, b_k, accumulate, out_dtype, device, use_bf16=True)
    major_opt = ("N" if a_k else "T") + ("T" if b_k else "N")
    func_name = f"bf16_gemm_{major_opt.lower() if test_alias else 'nt'}"
    if test_alias:
        a = a if a_k else a.T
        b = b if b_k else b.T
        assert a.is_contiguous() and b.is_contiguous()
    getattr(deep_gemm, func_name)(a, b, d, c=c)
    assert calc_diff(d, ref_d) < 1e-5


@pytest.mark.parametrize("majors", MAJORS, ids=["NT", "NN", "TN", "TT"])
@pytest.mark.parametrize("kind", ["fwd_bf16", "wgrad_1d1d_fp32_acc"])
@pytest.mark.parametrize("test_alias", [False, True])
def test_fp8_fp4_gemm(device, majors, kind, test_alias):
    """SM90's cases: 1D2D (128x128 RHS blocks, recipe inferred) and 1D1D with accumulation (recipe (1, 1, 128))."""
    m, n, k = 128, 256, 512
    a_k, b_k = majors
    accumulate = kind != "fwd_bf16"
    out_dtype = torch.float if accumulate else torch.bfloat16
    recipe = (1, 1, 128) if accumulate else None
    a, b, c, d, ref_d = generate_normal(
        m, n, k, a_k, b_k, accumulate, out_dtype, device, use_bf16=False, block_b=not accumulate
    )
    major_opt = ("N" if a_k else "T") + ("T" if b_k else "N")
    func_name = f"fp8_fp4_gemm_{major_opt.lower() if test_alias else 'nt'}"
    if test_alias:
        a = a if a_k else (a[0].T, a[1].T)
        b = b if b_k else (b[0].T, b[1].T)
        assert a[0].is_contiguous() and b[0].is_contiguous()
    getattr(deep_gemm, func_name)(a, b, d, c=c, disable_ue8m0_cast=True, recipe=recipe, recipe_a=None, recipe_b=None)
    assert calc_diff(d, ref_d) < 0.001


def generate_m_grouped_contiguous(num_groups, expected_m_per_group, n, k, b_k_major, device, use_bf16, use_psum):
    """DeepGEMM's ``generate_m_grouped_contiguous``: aligned groups; psum ends are the actual (unaligned) ends."""
    actual_ms = [int(expected_m_per_group * random.uniform(0.7, 1.3)) for _ in range(num_groups)]
    aligned_ms = [align(x, deep_gemm.get_mk_alignment_for_contiguous_layout()) for x in actual_ms]
    m = sum(aligned_ms)
    a = torch.randn((m, k), device=device, dtype=torch.bfloat16)
    b = torch.randn((num_groups, n, k), device=device, dtype=torch.bfloat16)
    grouped_layout = torch.empty(num_groups if use_psum else m, device=device, dtype=torch.int32)
    d = torch.empty((m, n), device=device, dtype=torch.bfloat16)
    ref_d = torch.randn((m, n), device=device, dtype=torch.bfloat16)
    start = 0
    for i, (actual_m, aligned_m) in enumerate(zip(actual_ms, aligned_ms)):
        actual_end, aligned_end = start + actual_m, start + aligned_m
        if use_psum:
            grouped_layout[i] = actual_end
        else:
            grouped_layout[start:actual_end] = i
            grouped_layout[actual_end:aligned_end] = -1
        a[actual_end:aligned_end] = 0
        ref_d[start:aligned_end] = a[start:aligned_end] @ b[i].t()
        start = aligned_end
    if use_bf16:
        return m, a, b if b_k_major else b.mT.contiguous().mT, grouped_layout, d, ref_d
    a = deep_gemm.per_token_cast_to_fp8(a, use_ue8m0=False)
    bq = torch.empty_like(b, dtype=torch.float8_e4m3fn)
    sb = torch.empty((num_groups, ceil_div(n, 128), ceil_div(k, 128)), device=device, dtype=torch.float)
    for i in range(num_groups):
        bq[i], sb[i] = deep_gemm.per_block_cast_to_fp8(b[i], use_ue8m0=False)
    return m, a, (bq, sb) if b_k_major else (bq.mT.contiguous().mT, sb), grouped_layout, d, ref_d


@pytest.mark.parametrize("use_bf16", [True, False], ids=["bf16", "fp8"])
@pytest.mark.parametrize("use_psum_layout", [False, True], ids=["indices", "psum"])
@pytest.mark.parametrize("b_k_major", [True, False], ids=["NT", "NN"])
@pytest.mark.parametrize("test_alias", [False, True])
def test_m_grouped_gemm_contiguous(device, use_bf16, use_psum_layout, b_k_major, test_alias):
    num_groups, expected_m, n, k = 3, 160, 256, 256
    alignment = deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout()
    deep_gemm.set_mk_alignment_for_contiguous_layout(alignment)
    m, a, b, grouped_layout, d, ref_d = generate_m_grouped_contiguous(
        num_groups, expected_m, n, k, b_k_major, device, use_bf16, use_psum_layout
    )
    dtype = "bf16" if use_bf16 else "fp8_fp4"
    func_name = f"m_grouped_{dtype}_gemm_{('nt' if b_k_major else 'nn') if test_alias else 'nt'}_contiguous"
    if test_alias and not b_k_major:
        b = b.mT if use_bf16 else (b[0].mT, b[1].mT)
    kwargs = dict(use_psum_layout=use_psum_layout, ensure_zero_padding=True)
    if not use_bf16:
        kwargs.update(disable_ue8m0_cast=True, recipe=None, recipe_a=None, recipe_b=None)
    getattr(deep_gemm, func_name)(a, b, d, grouped_layout, **kwargs)
    bar = 1e-5 if use_bf16 else 0.001
    if use_psum_layout:
        for j in range(num_groups):
            start = 0 if j == 0 else align(int(grouped_layout[j - 1]), alignment)
            end = int(grouped_layout[j])
            assert calc_diff(d[start:end], ref_d[start:end]) < bar
        for current_m in grouped_layout.cpu().tolist():  # check_*_psum_zero_padding
            assert torch.equal(
                d[current_m : align(current_m, alignment)], torch.zeros_like(d[current_m : align(current_m, alignment)])
            )
    else:
        assert calc_diff(d, ref_d) < bar


def layout_masked_to_psum(x: torch.Tensor, psum_m: torch.Tensor) -> torch.Tensor:
    num_groups, max_m, _ = x.size()
    x_psum = torch.zeros_like(x).view(num_groups * max_m, -1)
    last = 0
    for i in range(num_groups):
        x_psum[last : psum_m[i]] = x[i, : psum_m[i] - last]
        last = align(int(psum_m[i]), deep_gemm.get_mk_alignment_for_contiguous_layout())
    return x_psum


@pytest.mark.parametrize("use_bf16", [True, False], ids=["bf16", "fp8"])
@pytest.mark.parametrize("use_psum_layout", [False, True], ids=["masked", "psum"])
def test_m_grouped_gemm_masked(device, use_bf16, use_psum_layout):
    num_groups, max_m, expected_m, n, k = 4, 256, 40, 128, 256
    a = torch.randn((num_groups, max_m, k), device=device, dtype=torch.bfloat16)
    b = torch.randn((num_groups, n, k), device=device, dtype=torch.bfloat16)
    d = torch.empty((num_groups, max_m, n), device=device, dtype=torch.bfloat16)
    ref_d = torch.einsum("gmk,gnk->gmn", a.float(), b.float())
    masked_m = torch.tensor([int(expected_m * random.uniform(0.7, 1.3)) for _ in range(num_groups)], dtype=torch.int)
    psum_m, prev = [], 0
    for j in range(num_groups):
        prev = (0 if j == 0 else align(prev, deep_gemm.get_mk_alignment_for_contiguous_layout())) + int(masked_m[j])
        psum_m.append(prev)
    masked_m, psum_m = masked_m.to(device), torch.tensor(psum_m, dtype=torch.int, device=device)
    if not use_bf16:
        aq, sa = deep_gemm.per_token_cast_to_fp8(a, use_ue8m0=False)
        bq, sb = deep_gemm.per_block_cast_to_fp8(b, use_ue8m0=False)
        a, b = (aq, sa), (bq, sb)
    op = deep_gemm.m_grouped_bf16_gemm_nt_contiguous if use_bf16 else deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous
    if use_psum_layout:
        a_psum = layout_masked_to_psum(a, psum_m) if use_bf16 else tuple(layout_masked_to_psum(x, psum_m) for x in a)
        d_psum = layout_masked_to_psum(d, psum_m)
        op(a_psum, b, d_psum, psum_m, use_psum_layout=True, expected_m_for_psum_layout=int(expected_m * 1.2))
    elif use_bf16:
        deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)
    else:
        deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, int(expected_m * 1.2), disable_ue8m0_cast=True)
    for j in range(num_groups):
        rows = int(masked_m[j])
        if use_psum_layout:
            start = 0 if j == 0 else align(int(psum_m[j - 1]), deep_gemm.get_mk_alignment_for_contiguous_layout())
            got = d_psum[start : int(psum_m[j])]
        else:
            got = d[j, :rows]
        assert calc_diff(got, ref_d[j, :rows]) < (1e-5 if use_bf16 else 0.001)


def test_k_grouped_gemm_contiguous(device):
    """SM90's k-grouped FP8 op: ``k_grouped_fp8_gemm_nt_contiguous`` with K-major groups, c = d, one empty group."""
    num_groups, m, n = 3, 128, 192
    ks_cpu = [align(int(300 * random.uniform(0.7, 1.3)), 128) for _ in range(num_groups)]
    ks_cpu[1] = 0
    k = sum(ks_cpu)
    grouped_layout = torch.tensor(ks_cpu, device=device, dtype=torch.int32)
    a = torch.randn((k, m), device=device, dtype=torch.bfloat16)
    b = torch.randn((k, n), device=device, dtype=torch.bfloat16)
    c = torch.randn((num_groups, m, n), device=device, dtype=torch.float) * 32
    d = c
    ref_d = torch.empty_like(c)
    start = 0
    for i, group_k in enumerate(ks_cpu):
        ref_d[i] = c[i] + (a[start : start + group_k].float().T @ b[start : start + group_k].float())
        start += group_k
    # k_grouped_per_channel_cast_to_fp8, then the K-major regrouping of the generator
    aq, sa = deep_gemm.per_channel_cast_to_fp8(a, use_ue8m0=False)
    bq, sb = deep_gemm.per_channel_cast_to_fp8(b, use_ue8m0=False)
    new_a = torch.empty((k * m,), dtype=aq.dtype, device=device)
    new_b = torch.empty((k * n,), dtype=bq.dtype, device=device)
    prefix = 0
    for group_k in ks_cpu:
        new_a[prefix * m : (prefix + group_k) * m] = aq[prefix : prefix + group_k].T.flatten()
        new_b[prefix * n : (prefix + group_k) * n] = bq[prefix : prefix + group_k].T.flatten()
        prefix += group_k
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous(
        (new_a, sa.T), (new_b, sb.T), d, ks_cpu, grouped_layout, c, recipe=(1, 1, 128), use_psum_layout=False
    )
    assert calc_diff(d, ref_d) < 0.001


def test_k_grouped_bf16_gemm_tn(device):
    num_groups, m, n = 3, 64, 96
    ks_cpu = [128, 0, 256]
    k = sum(ks_cpu)
    a = torch.randn((k, m), device=device, dtype=torch.bfloat16)
    b = torch.randn((k, n), device=device, dtype=torch.bfloat16)
    c = torch.randn((num_groups, m, n), device=device, dtype=torch.float) * 32
    ref_d = c.clone()
    ref_d[0] += a[:128].float().T @ b[:128].float()
    ref_d[2] += a[128:].float().T @ b[128:].float()
    d = c
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, torch.tensor(ks_cpu, device=device).int(), c)
    assert calc_diff(d, ref_d) < 1e-5


# --------------------------------------------------------------------------------------- test_attention


def apply_skip_head_mid(d: torch.Tensor, head_splits):
    left, mid, right = head_splits
    m, n = d.shape
    d = d.view(m, n // (left + right), -1)
    d_mid = torch.zeros((m, d.shape[1], mid), dtype=d.dtype, device=d.device)
    return torch.cat([d[:, :, :left], d_mid, d[:, :, -right:]], dim=2).view(m, -1)


def test_gemm_skip_head_mid(device):
    head_splits = (128, 64, 128)
    m, n, k = 128, 1024, 512
    a, b, _, d, ref_d = generate_normal(m, n, k, True, True, False, torch.bfloat16, device, use_bf16=False)
    d = apply_skip_head_mid(d, head_splits)
    ref_d = apply_skip_head_mid(ref_d, head_splits)
    deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, d, head_splits, disable_ue8m0_cast=True)
    assert calc_diff(d, ref_d) < 0.001


def ref_mqa_logits(q, kv, weights, ks, ke):
    seq_len_kv = kv.shape[0]
    score = torch.einsum("mhd,nd->hmn", q.float(), kv.float())
    logits = torch.einsum("hmn,hm->mn", score.relu(), weights.transpose(0, 1).float())
    cols = torch.arange(seq_len_kv, device=q.device)
    mask = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    return logits.masked_fill(~mask, float("-inf"))


@pytest.mark.parametrize("logits_dtype", [torch.bfloat16, torch.float], ids=["bf16", "fp32"])
@pytest.mark.parametrize("compressed_logits,clean_logits", [(False, True), (True, False)], ids=["full", "compressed"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_mqa_logits(device, logits_dtype, compressed_logits, clean_logits, head_dim):
    seq_len, seq_len_kv, num_heads = 64, 256, 32
    q = torch.randn(seq_len, num_heads, head_dim, device=device, dtype=torch.bfloat16)
    kv = torch.randn(seq_len_kv, head_dim, device=device, dtype=torch.bfloat16)
    weights = torch.randn(seq_len, num_heads, device=device, dtype=torch.float32)
    ks = torch.zeros(seq_len, dtype=torch.int, device=device)
    ke = torch.arange(seq_len, dtype=torch.int, device=device) + (seq_len_kv - seq_len)
    ks[seq_len // 2 :] = 17  # a shifted window start for half the rows
    ref_logits = ref_mqa_logits(q, kv, weights, ks, ke)
    q_in = q.to(torch.float8_e4m3fn), None
    kv_amax = kv.abs().float().amax(dim=1, keepdim=True).clamp(1e-4)  # per_custom_dims_cast_to_fp8(kv, (0,))
    kv_sf = kv_amax / 448.0
    kv_in = ((kv * (1.0 / kv_sf)).to(torch.float8_e4m3fn), kv_sf.squeeze())
    simulated = ref_mqa_logits(q_in[0].float(), kv_in[0].float() * kv_in[1][:, None], weights, ks, ke)
    kernel_kwargs = dict(
        q=q_in, kv=kv_in, weights=weights, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke,
        clean_logits=clean_logits, max_seqlen_k=0, logits_dtype=logits_dtype,
    )  # fmt: skip
    if compressed_logits:
        kernel_kwargs["max_seqlen_k"] = int((ke - ks).max())
    logits = deep_gemm.fp8_fp4_mqa_logits(**kernel_kwargs)
    assert logits.dtype == logits_dtype
    if compressed_logits:
        assert logits.size() == (seq_len, kernel_kwargs["max_seqlen_k"])
        tmp = torch.full((seq_len, seq_len_kv), float("-inf"), device=device)
        for i in range(seq_len):
            tmp[i, ks[i] : ke[i]] = logits[i, : ke[i] - ks[i]].float()
        logits = tmp
    neginf = ref_logits == float("-inf")
    assert torch.equal(logits == float("-inf"), neginf)
    logits = logits.float().masked_fill(neginf, 0)
    assert calc_diff(logits, ref_logits.masked_fill(neginf, 0)) < 1e-3
    assert calc_diff(logits, simulated.masked_fill(neginf, 0)) < (3e-5 if logits_dtype == torch.bfloat16 else 5e-6)


def test_legacy_fp8_mqa_logits_is_fp32(device):
    q = torch.randn(8, 32, 64, device=device).to(torch.float8_e4m3fn)
    kv = (torch.randn(16, 64, device=device).to(torch.float8_e4m3fn), torch.rand(16, device=device))
    w = torch.randn(8, 32, device=device)
    ks, ke = torch.zeros(8, dtype=torch.int, device=device), torch.full((8,), 16, dtype=torch.int, device=device)
    legacy = deep_gemm.fp8_mqa_logits(q, kv, w, ks, ke, True, 0)
    new = deep_gemm.fp8_fp4_mqa_logits((q, None), kv, w, ks, ke, True, 0, torch.float32)
    assert legacy.dtype == torch.float32 and torch.equal(legacy, new)


@pytest.mark.parametrize("logits_dtype", [torch.bfloat16, torch.float], ids=["bf16", "fp32"])
@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_mqa_logits(device, logits_dtype, next_n):
    batch_size, num_heads, head_dim, block_kv, avg_kv = 4, 32, 128, 64, 300
    q = torch.randn((batch_size, next_n, num_heads, head_dim), device=device, dtype=torch.bfloat16)
    weights = torch.randn((batch_size * next_n, num_heads), device=device, dtype=torch.float)
    context_lens = torch.randint(int(0.7 * avg_kv), int(1.3 * avg_kv), (batch_size,), device=device, dtype=torch.int)
    num_blocks_per_query = (context_lens + block_kv - 1) // block_kv
    max_model_len = int(num_blocks_per_query.max()) * block_kv
    num_total_blocks = int(num_blocks_per_query.sum())
    kv_cache = torch.randn((num_total_blocks, block_kv, 1, head_dim), device=device, dtype=torch.bfloat16)
    block_table = torch.zeros((batch_size, int(num_blocks_per_query.max())), device=device, dtype=torch.int)
    pool, offset = torch.randperm(num_total_blocks, device=device).int(), 0
    for i, nb in enumerate(num_blocks_per_query.tolist()):
        block_table[i, :nb] = pool[offset : offset + nb]
        offset += nb
    # kv_cache_cast_to_fp8
    amax = kv_cache.abs().float().amax(dim=3, keepdim=True).clamp(1e-4)
    sf = amax / 448.0
    scaled = (kv_cache * (1.0 / sf)).to(torch.float8_e4m3fn)
    kv_back = scaled.float() * sf
    kv_in = torch.empty((num_total_blocks, block_kv * (head_dim + 4)), device=device, dtype=torch.uint8)
    kv_in[:, : block_kv * head_dim] = scaled.view(num_total_blocks, block_kv * head_dim).view(torch.uint8)
    kv_in[:, block_kv * head_dim :] = sf.view(num_total_blocks, block_kv).view(torch.uint8)
    kv_in = kv_in.view(num_total_blocks, block_kv, 1, head_dim + 4)
    q_in = q.to(torch.float8_e4m3fn), None
    # 2-D context lens, the last token sees the whole context (DeepGEMM's generator)
    ctx = ((context_lens.unsqueeze(1) + 1) * torch.rand(batch_size, next_n, device=device)).int()
    ctx[:, -1] = context_lens
    kernel_kwargs = dict(
        q=q_in, kv_cache=kv_in, weights=weights, context_lens=ctx, block_table=block_table,
        schedule_meta=deep_gemm.get_paged_mqa_logits_metadata(ctx, block_kv, 8, indices=None),
        max_context_len=max_model_len, clean_logits=False, logits_dtype=logits_dtype, indices=None,
    )  # fmt: skip
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(**kernel_kwargs)
    assert logits.dtype == logits_dtype and logits.shape == (batch_size * next_n, max_model_len)
    positions = torch.arange(max_model_len, device=device)[None, :]
    visible = positions < ctx.view(-1, 1)
    ref = torch.zeros(batch_size * next_n, max_model_len, device=device)
    for bi in range(batch_size):
        keys = kv_back[block_table[bi].long()].view(-1, head_dim)[:max_model_len]
        s = torch.einsum("thd,jd->thj", q_in[0][bi].float(), keys).relu()
        ref[bi * next_n : (bi + 1) * next_n] = torch.einsum("thj,th->tj", s, weights[bi * next_n : (bi + 1) * next_n])
    got = logits.float().masked_fill(~visible, 0)
    assert calc_diff(got, ref.masked_fill(~visible, 0)) < (3e-5 if logits_dtype == torch.bfloat16 else 5e-6)


# ----------------------------------------------------------------------------------------- test_einsum


def test_einsum_bmk_bnk_mn(device):
    for dtype in (torch.float, torch.bfloat16):
        a = torch.randn((5, 128, 256), dtype=torch.bfloat16, device=device)
        b = torch.randn((5, 384, 256), dtype=torch.bfloat16, device=device)
        d = torch.randn((128, 384), dtype=dtype, device=device)
        c = d if dtype == torch.float else None
        ref_d = (c if dtype == torch.float else 0) + torch.bmm(a.float(), b.float().mT).sum(0)
        deep_gemm.einsum("bmk,bnk->mn", a, b, d, c=c)
        assert calc_diff(d, ref_d) < 1e-5


@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_einsum_heads(device, expr):
    bsz, h, r, dd = 4, 8, 256, 128
    x = torch.randn((bsz, h, r if expr[2] == "r" else dd), device=device, dtype=torch.bfloat16)
    fy = torch.randn((h, dd, r + 128), device=device, dtype=torch.bfloat16)
    y = fy[:, :, :r]
    ref_z = torch.einsum(expr, x.double(), y.double())
    z = torch.empty((bsz, h, dd if expr.endswith("bhd") else r), device=device, dtype=torch.bfloat16)
    deep_gemm.einsum(expr, x, y, z)
    assert calc_diff(z, ref_z) < 1e-5


def test_fp8_einsum_bhr_hdr_bhd(device):
    bsz, h, r, dd = 4, 8, 512, 256
    x = torch.randn((bsz, h, r), device=device, dtype=torch.bfloat16)
    y = torch.randn((h, dd, r), device=device, dtype=torch.bfloat16)
    ref_z = torch.einsum("bhr,hdr->bhd", x.float(), y.float())
    x_fp8 = deep_gemm.per_token_cast_to_fp8(x.view(-1, r), use_ue8m0=True)
    x_fp8 = x_fp8[0].view(bsz, h, r), x_fp8[1].view(bsz, h, ceil_div(r, 128))
    y_fp8 = (torch.empty_like(y, dtype=torch.float8_e4m3fn),
             torch.empty((h, ceil_div(dd, 128), ceil_div(r, 128)), device=device, dtype=torch.float))  # fmt: skip
    for i in range(h):
        y_fp8[0][i], y_fp8[1][i] = deep_gemm.per_block_cast_to_fp8(y[i], use_ue8m0=True)
    z = torch.empty((bsz, h, dd), device=device, dtype=torch.bfloat16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", x_fp8, y_fp8, z)
    assert calc_diff(z, ref_z) < 1e-3


def test_fp8_einsum_bhd_bhr_hdr(device):
    bsz, h, dd, r = 256, 4, 128, 64
    x = torch.randn((bsz, h, dd), device=device, dtype=torch.bfloat16)
    y = torch.randn((bsz, h, r), device=device, dtype=torch.bfloat16)
    z_0 = torch.randn((h, dd, r), device=device, dtype=torch.float32) * 10
    ref_z = z_0 + torch.einsum("bhd,bhr->hdr", x.float(), y.float())
    x_fp8 = deep_gemm.per_channel_cast_to_fp8(x.view(bsz, -1), use_ue8m0=True)
    y_fp8 = deep_gemm.per_channel_cast_to_fp8(y.view(bsz, -1), use_ue8m0=True)
    x_fp8 = (x_fp8[0].view(bsz, h, dd), x_fp8[1].view(ceil_div(bsz, 128), h, dd))
    y_fp8 = (y_fp8[0].view(bsz, h, r), y_fp8[1].view(ceil_div(bsz, 128), h, r))
    z = z_0.clone()
    deep_gemm.fp8_einsum("bhd,bhr->hdr", x_fp8, y_fp8, z, z, recipe=(1, 1, 128))
    assert calc_diff(z, ref_z) < 1e-3


# ---------------------------------------------------------------------------------- test_hyperconnection


@pytest.mark.parametrize("num_splits", [None, 4])
def test_hc_prenorm_gemm(device, num_splits):
    m, n, k = 37, 24, 1024
    a = torch.randn((m, k), dtype=torch.bfloat16, device=device)
    b = torch.randn((n, k), dtype=torch.float, device=device)
    d = torch.empty((m, n) if num_splits is None else (num_splits, m, n), dtype=torch.float, device=device)
    s = torch.empty((m,) if num_splits is None else (num_splits, m), dtype=torch.float, device=device)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=num_splits)
    final_d = d if num_splits is None else d.sum(0)
    final_s = s if num_splits is None else s.sum(0)
    b_tf32 = (b.view(torch.int32) + 0x1000 & ~0x1FFF).view(torch.float)  # TF32: 10 mantissa bits, to nearest
    ref_d = a.double() @ b_tf32.double().T
    ref_s = a.double().square().sum(-1)
    assert max(calc_diff(final_d, ref_d), calc_diff(final_s, ref_s)) < 1e-8


# ------------------------------------------------------------------------------------------ test_layout


def packed_ue8m0_torch(x: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's test_layout reference of the packed UE8M0 layout."""
    ue8m0 = (x.view(torch.int) >> 23).to(torch.uint8)
    mn, k = x.shape[-2], x.shape[-1]
    remove = x.dim() == 2
    if remove:
        x, ue8m0 = x.unsqueeze(0), ue8m0.unsqueeze(0)
    bsz = x.shape[0]
    aligned_mn, aligned_k = deep_gemm.get_tma_aligned_size(mn, 4), align(k, 4)
    padded = torch.zeros((bsz, aligned_mn, aligned_k), device=x.device, dtype=torch.uint8)
    padded[:, :mn, :k] = ue8m0
    padded = padded.view(-1).view(dtype=torch.int).view(bsz, aligned_mn, aligned_k // 4)
    transposed = torch.zeros((bsz, aligned_k // 4, aligned_mn), device=x.device, dtype=torch.int).mT
    transposed[:, :, :] = padded
    out = transposed[:, :mn, :]
    return out.squeeze(0) if remove else out


@pytest.mark.parametrize("mn,k", [(4096, 128), (4097, 7168), (129, 7296)])
@pytest.mark.parametrize("num_groups", [1, 2])
@pytest.mark.parametrize("with_transpose", [True, False])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_sf_layout_kernels(device, mn, k, num_groups, with_transpose, use_ue8m0):
    x = torch.randn((num_groups * mn, k), dtype=torch.bfloat16, device=device)
    x, fp32_sf = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=128)
    fp32_sf = fp32_sf if num_groups == 1 else fp32_sf.view(num_groups, mn, -1)
    fp32_sf = fp32_sf if with_transpose else fp32_sf.transpose(-1, -2).contiguous().transpose(-1, -2)
    if use_ue8m0:
        packed = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(fp32_sf)
        ref = packed_ue8m0_torch(fp32_sf)
        assert torch.equal(packed, ref) and packed.shape == ref.shape and packed.stride() == ref.stride()
    else:
        out = deep_gemm.get_mn_major_tma_aligned_tensor(fp32_sf)
        tma_aligned_mn, sf_k = deep_gemm.get_tma_aligned_size(mn, fp32_sf.element_size()), ceil_div(k, 128)
        if num_groups > 1:
            assert out.size(0) == num_groups and out.stride(0) == tma_aligned_mn * sf_k
        assert out.shape[-2:] == (mn, sf_k) and out.stride()[-2:] == (1, tma_aligned_mn)
        assert torch.equal(fp32_sf, out)


def test_k_grouped_sf_layout_kernels(device):
    mn, gran_k = 256, 128
    ks_cpu = [align(int(random.uniform(0.7, 1.3) * 384), gran_k) for _ in range(5)]
    grouped_layout = torch.tensor(ks_cpu, dtype=torch.int, device=device)
    x = torch.randn((sum(ks_cpu), mn), dtype=torch.bfloat16, device=device)
    _, fp32_sf = deep_gemm.per_channel_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k)
    packed = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        fp32_sf, grouped_layout, ks_cpu, gran_k, gran_k
    )
    split_packed = packed.split([ceil_div(k, gran_k * 4) for k in ks_cpu])
    split_sf = fp32_sf.split([k // gran_k for k in ks_cpu])
    for i in range(len(ks_cpu)):
        assert torch.equal(split_packed[i], packed_ue8m0_torch(split_sf[i].T).T)


def test_ue8m0_casts_are_powers_of_two(device):
    x = torch.randn(64, 300, device=device)
    q, sf = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert (
        torch.equal(sf, deep_gemm.ceil_to_ue8m0(sf)) and (sf >= x.abs().view(64, -1).amax(1)[:, None] / 448 / 2).all()
    )
    qb, sfb = deep_gemm.per_block_cast_to_fp8(x, use_ue8m0=True)
    assert torch.equal(sfb, deep_gemm.ceil_to_ue8m0(sfb))
    _, sf32 = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    assert sf32.shape == (64, ceil_div(300, 32))
    _, packed = deep_gemm.per_token_cast_to_fp8(torch.randn(8, 512, device=device), True, 32, True)
    assert packed.dtype == torch.int32 and packed.shape == (8, 4)


# ------------------------------------------------------------------ cuBLASLt baseline (test_bf16 / test_fp8_fp4)


@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["d-bf16", "d-fp32"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["", "acc"])
@pytest.mark.parametrize(("m", "n", "k"), [(64, 128, 256), (37, 48, 160), (1, 16, 32)])
def test_cublaslt_gemm(device, layout, dtype, out_dtype, accumulate, m, n, k):
    """``cublaslt_gemm_*`` as DeepGEMM's baseline calls it: bare bf16 or FP8 operands (no scales), ``c=`` to
    accumulate; ``d`` against the float64 product of the operands' own values."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(n, k, device=device).to(dtype)
    c = torch.randn(m, n, device=device).to(out_dtype) if accumulate else None
    d = torch.full((m, n), float("nan"), device=device, dtype=out_dtype)
    ref = a.double() @ b.double().T + (c.double() if c is not None else 0)
    a_in = a if layout[0] == "n" else a.T.contiguous()
    b_in = b if layout[1] == "t" else b.T.contiguous()
    getattr(deep_gemm, f"cublaslt_gemm_{layout}")(a_in, b_in, d, c=c)
    bar = 1e-5 if out_dtype == torch.bfloat16 else 6e-7  # DeepGEMM's test_cublaslt_gemm bars
    assert calc_diff(d, ref) < bar


def test_cublaslt_gemm_c_is_d_and_mn_major(device):
    """``c`` may be ``d`` (DeepGEMM's in-place accumulation), and operands may be MN-major views."""
    a = torch.randn(96, 64, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(128, 64, device=device).to(torch.float8_e4m3fn)
    d = torch.randn(96, 128, device=device)
    ref = a.double() @ b.double().T + d.double()
    deep_gemm.cublaslt_gemm_nt(a.T.contiguous().T, b.T.contiguous().T, d, c=d)
    assert calc_diff(d, ref) < 6e-7


def test_cublaslt_gemm_is_one_implementation_on_every_backend():
    """No backend lacks it, so fallback-disabled calls never refuse it: each backend's implementation runs cuBLAS
    through torch (the exact product on CPU tensors, called directly here), and it is the same function on each."""
    from tilegemm.backend import registry
    from tilegemm.ops.reference import cublaslt

    registry._load_backends()
    a = torch.randn(40, 96).to(torch.float8_e4m3fn)
    b = torch.randn(24, 96).to(torch.float8_e4m3fn)
    c = torch.randn(40, 24)
    for backend in ("pytorch", "cutile", "gluon"):
        if backend in registry._IMPORT_ERRORS:
            continue  # this machine cannot import that backend (then calls fall back to the same implementation)
        for layout in ("nt", "nn", "tn", "tt"):
            impl = registry._IMPLS[f"cublaslt_gemm_{layout}"][backend]
            assert impl is cublaslt.cublaslt_gemm, (backend, layout)
            d = torch.full((40, 24), float("nan"))
            impl(a=a, b=b, d=d, c=c, stream=None)
            assert calc_diff(d, a.double() @ b.double().T + c.double()) < 1e-12, (backend, layout)


def test_cublaslt_gemm_bad_input_names_the_argument():
    a = torch.randn(8, 32).bfloat16()
    with pytest.raises(TypeError, match=r"^b: got dtype torch.float8_e4m3fn, expected a's dtype"):
        deep_gemm.cublaslt_gemm_nt(a, torch.randn(16, 32).to(torch.float8_e4m3fn), torch.empty(8, 16))
    with pytest.raises(TypeError, match=r"^a: got dtype torch.float16"):
        deep_gemm.cublaslt_gemm_nt(a.half(), a, torch.empty(8, 8))
    with pytest.raises(ValueError, match=r"^a and b disagree on K"):
        deep_gemm.cublaslt_gemm_nt(a, torch.randn(16, 16).bfloat16(), torch.empty(8, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cutile", "gluon", "pytorch"])
def test_cublaslt_gemm_fp8_on_every_backend_without_fallback(monkeypatch, backend):
    """DeepGEMM's FP8 cuBLAS baseline on CUDA tensors runs on whichever backend is chosen, fallback disabled."""
    if backend not in deep_gemm.get_available_backends():
        pytest.skip(f"{backend} unavailable here")
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    a = torch.randn(256, 512, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(384, 512, device="cuda").to(torch.float8_e4m3fn)
    d = torch.empty(256, 384, device="cuda", dtype=torch.bfloat16)
    deep_gemm.cublaslt_gemm_nt(a, b, d, backend=backend)
    assert calc_diff(d, a.double() @ b.double().T) < 1e-5


# --------------------------------------------------------------------- deep_gemm.utils / deep_gemm.testing names

#: The public names of DeepGEMM 2.6.1's ``deep_gemm.utils`` (math, layout, dist) and ``deep_gemm.testing``
#: (bench, numeric, utils) that its tests and transformers' integration import.
UTILS_NAMES = (
    "ceil_div", "align", "ceil_to_ue8m0", "pack_ue8m0_to_int", "per_token_cast_to_fp8", "per_channel_cast_to_fp8",
    "per_block_cast_to_fp8", "per_custom_dims_cast_to_fp8", "per_token_cast_to_fp4", "transpose_packed_fp4",
    "unpack_ue8m0_from_int", "cast_back_from_fp4", "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor", "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "set_mk_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout",
    "get_k_alignment_for_contiguous_layout", "init_dist", "uneven_all_gather", "dist_print",
)  # fmt: skip
TESTING_NAMES = (
    "bench", "bench_kineto", "empty_suppress", "suppress_stdout_stderr", "calc_diff", "count_bytes",
    "assert_bitwise_equal", "get_arch_major", "test_filter", "ignore_env",
)  # fmt: skip


def test_utils_and_testing_have_deepgemms_names():
    import importlib

    missing = [n for n in UTILS_NAMES if not callable(getattr(deep_gemm.utils, n, None))]
    missing += [f"testing.{n}" for n in TESTING_NAMES if not callable(getattr(deep_gemm.testing, n, None))]
    assert missing == []
    for sub in ("tilegemm.utils.math", "tilegemm.utils.layout", "tilegemm.utils.dist"):
        importlib.import_module(sub)  # ``from deep_gemm.utils.math import ...`` works too
    assert deep_gemm.utils.per_token_cast_to_fp8 is deep_gemm.per_token_cast_to_fp8


@pytest.mark.parametrize(("x", "y"), [(0, 1), (1, 128), (128, 128), (129, 128), (7, 3)])
def test_ceil_div_and_align(x, y):
    assert deep_gemm.utils.ceil_div(x, y) == -(-x // y)
    assert deep_gemm.utils.align(x, y) == -(-x // y) * y
    assert deep_gemm.utils.align(x, y) % y == 0 and 0 <= deep_gemm.utils.align(x, y) - x < y


def test_ceil_div_bad_input():
    with pytest.raises(TypeError, match="^y: "):
        deep_gemm.utils.ceil_div(3, 2.0)
    with pytest.raises(ValueError, match="^y: expected an int >= 1, got 0"):
        deep_gemm.utils.ceil_div(3, 0)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize(("m", "n", "gran_k"), [(4, 256, 128), (3, 70, 32), (8, 64, 128)])
def test_per_token_cast_to_fp4_against_float64(use_ue8m0, m, n, gran_k):
    """Every code is the E2M1 value nearest to ``x / scale`` (ties to the smaller magnitude), the scale is
    ``amax / 6`` per row per ``gran_k`` (a power of two at or above it with ``use_ue8m0``), and the round trip
    through ``cast_back_from_fp4`` gives ``code * scale``."""
    x = torch.randn(m, n, dtype=torch.float32) * 3
    packed, sf = deep_gemm.utils.per_token_cast_to_fp4(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    assert packed.dtype == torch.int8 and list(packed.shape) == [m, n // 2] and list(sf.shape) == [m, -(-n // gran_k)]
    x64 = torch.nn.functional.pad(x.double(), (0, sf.shape[1] * gran_k - n)).view(m, -1, gran_k)
    amax = x64.abs().amax(-1).clamp(min=1e-4) / 6
    if use_ue8m0:
        assert torch.all(sf.double() >= amax) and torch.all(sf.double() < 2 * amax + 1e-30)
    else:
        assert torch.allclose(sf.double(), amax, rtol=1e-6)
    scaled = (x64 / sf.double().unsqueeze(-1)).view(m, -1)[:, :n]
    nearest = E2M1[(scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)] * scaled.sign()
    back = deep_gemm.utils.cast_back_from_fp4(packed, sf, gran_k=gran_k).double()
    expect = nearest * sf.double().repeat_interleave(gran_k, dim=1)[:, :n]
    ties = ((scaled.abs().unsqueeze(-1) - E2M1).abs().sort(-1).values[..., :2].diff(dim=-1).abs() < 1e-9).squeeze(-1)
    assert torch.equal(back[~ties], expect[~ties].abs() * back[~ties].sign()) or torch.allclose(
        back[~ties], expect[~ties]
    )


def test_packed_fp4_transpose_and_packed_scales():
    x = torch.randn(6, 64)
    packed, sf = deep_gemm.utils.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert sf.dtype == torch.int32 and list(sf.shape) == [6, 1]  # two scales padded to four, packed in one int
    values = deep_gemm.utils.cast_back_from_fp4(packed, sf, gran_k=32, use_packed_ue8m0=True)
    unpacked_t = deep_gemm.utils.transpose_packed_fp4(packed)
    assert list(unpacked_t.shape) == [64, 3]
    codes = torch.stack((packed & 0x0F, (packed >> 4) & 0x0F), -1).view(6, 64)
    codes_t = torch.stack((unpacked_t & 0x0F, (unpacked_t >> 4) & 0x0F), -1).view(64, 6)
    assert torch.equal(codes_t, codes.T)
    assert torch.all((values == 0) | (values.abs() >= 0.5 * values.abs().max() / 12))


def test_per_custom_dims_cast_to_fp8():
    x = torch.randn(4, 5, 6)
    q, s = deep_gemm.utils.per_custom_dims_cast_to_fp8(x, (1,), use_ue8m0=False)
    assert q.dtype == torch.float8_e4m3fn and list(s.shape) == [5]
    assert torch.allclose(s, x.abs().amax(dim=(0, 2)) / 448)
    assert calc_diff(q.double() * s.double().view(1, 5, 1), x) < 1e-3


def test_count_bytes_and_assert_bitwise_equal():
    a = torch.empty(3, 4, dtype=torch.bfloat16)
    fp8 = (torch.empty(2, 8, dtype=torch.float8_e4m3fn), torch.empty(2, 1))
    assert deep_gemm.testing.count_bytes(a, None, fp8, [a]) == 24 + 16 + 8 + 24
    x = torch.randn(5, 7)
    deep_gemm.testing.assert_bitwise_equal(x, x.clone())
    y = x.clone()
    y[2, 3] += 1
    with pytest.raises(AssertionError, match=r"first at element \(2, 3\)"):
        deep_gemm.testing.assert_bitwise_equal(x, y, "probe")


def test_test_filter_and_ignore_env(monkeypatch, capsys):
    calls = []
    deep_gemm.testing.test_filter(lambda: False)(lambda: calls.append(1))()
    deep_gemm.testing.test_filter(lambda: True)(lambda: calls.append(2))()
    assert calls == [2] and "Filtered by" in capsys.readouterr().out
    monkeypatch.setenv("TILEGEMM_PROBE_ENV", "1")
    import os

    seen = []
    deep_gemm.testing.ignore_env("TILEGEMM_PROBE_ENV", lambda: True)(
        lambda: seen.append(os.environ.get("TILEGEMM_PROBE_ENV"))
    )()
    deep_gemm.testing.ignore_env("TILEGEMM_PROBE_ENV", lambda: False)(
        lambda: seen.append(os.environ.get("TILEGEMM_PROBE_ENV"))
    )()
    assert seen == [None, "1"] and os.environ["TILEGEMM_PROBE_ENV"] == "1"


def test_bench_kineto_matching():
    """bench_kineto's reading of the profiler rows: seconds per launch of the kernels a substring names, 0 when
    none does, and an error when a substring names two kernels (DeepGEMM's rule)."""
    from tilegemm.kernel_timing import match_kernels

    rows = [("_bf16_gemm_body_K123", 4e-3, 40), ("nvjet_tst_64x8", 2e-3, 10), ("elementwise_kernel", 1e-3, 5)]
    assert match_kernels(rows, ("bf16_gemm", "nvjet", "reduce")) == [1e-4, 2e-4, 0.0]
    rows.append(("_splitk_bf16_gemm_reduce", 1e-3, 10))
    with pytest.raises(AssertionError, match="matches 2 kernels"):
        match_kernels(rows, ("bf16_gemm",))
    assert match_kernels(rows, ("bf16_gemm",), with_multiple_kernels=True) == [pytest.approx(5e-3 / 50)]


# ------------------------------------------------------------------------------------ kernel names in profiles


def test_kernel_names_carry_deepgemms_profiler_filters():
    """A cuTile or Gluon kernel's symbol starts with its Python function's name; DeepGEMM's benchmarks find its
    kernels by substring (``bench_kineto(fn, "bf16_gemm")``), so each entry point of a DeepGEMM op carries the
    substring DeepGEMM's test of that op filters on."""
    pytest.importorskip("cuda.tile")
    from tilegemm.ops.cutile import decode, einsum, gemm_kernels, grouped, mqa, prenorm

    bf16 = [gemm_kernels._bf16_gemm_body, decode._decode_bf16_gemm_body, decode._decode_bf16_gemm_lean]
    bf16 += [decode._narrow_bf16_gemm_body, grouped.get_kernel.bodies["m_bf16"], grouped.get_kernel.bodies["k_bf16"]]
    fp8 = [
        gemm_kernels._fp8_gemm_body,
        decode._decode_fp8_gemm_body,
        decode._decode_fp8_gemm_lean,
        decode._narrow_fp8_gemm_body,
    ]
    fp8 += [grouped.get_kernel.bodies["m_fp8"], grouped.get_kernel.bodies["k_fp8"]]
    names = {fn.__name__ for fn in bf16 + fp8}
    assert all("bf16_gemm" in fn.__name__ for fn in bf16), names
    assert all("gemm_" in fn.__name__ and "bf16_gemm" not in fn.__name__ for fn in fp8), names
    assert "bmn_bnk_mn_gemm_impl" in einsum._bmn_bnk_mn_gemm_impl.__name__
    assert "gemm" in einsum._heads_gemm_body.__name__ and "gemm" not in einsum._reduce_body.__name__
    assert "tf32_hc_prenorm_gemm" in prenorm._tf32_hc_prenorm_gemm_body.__name__
    clean = mqa.mqa_clean_logits_kernel._pyfunc.__name__  # a @ct.kernel object: its Python function's name
    assert "clean_logits" in clean and "mqa_logits" not in clean
    for helper in (gemm_kernels._splitk_reduce_body,):  # second kernels of an op must not match its filter
        assert "gemm" not in helper.__name__
