"""cutile grouped GEMMs on the GPU: every layout x dtype against a float64 reference.

Each case: fresh random inputs, ``d`` poisoned with NaN, the cutile result (fallback disabled)
compared in float64 with ``calc_diff`` against the exact formula (FP8: on the dequantized values,
and against the unquantized math), padding rows checked to be exactly 0, masked rows past
``masked_m`` checked to be untouched or 0, and a rerun that must be bitwise identical. Shapes are
the benchmark's (G, m) x (N, K) sets with sizes reduced, plus one group, 256 groups, empty groups, unaligned psum
segments, out-of-range group ids, CUDA-graph capture of the masked op with ``masked_m`` changed
between replays, and the routing helpers feeding the op end to end inside a graph.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.ops import api as tg
from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.routing import moe_route, permute_tokens, unpermute_tokens
from tilegemm.testing import calc_diff, poisoned

pytestmark = pytest.mark.gpu

BAR_BF16 = 1e-5
BAR_FP8_EXACT = {torch.bfloat16: 1e-5, torch.float32: 1e-6}
BAR_FP8_UNQUANT = 1e-3
ALIGN = 128

# (G, m per group) x (N, K): the benchmark's sets with fewer rows per group where they are large.
CONTIG_GM = [(4, 1024), (8, 512), (128, 96), (256, 40)]
CONTIG_NK = [(4096, 7168), (1536, 2048), (2048, 768)]
MASKED_GM = [(32, 192), (6, 1024), (32, 20), (6, 20)]


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """A fallback to the pytorch backend would make these tests meaningless: make it an error."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setenv("TILEGEMM_CHECK_VALUES", "0")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _group_sizes(groups: int, m: int, seed: int, empty: int = 0) -> list[int]:
    """Random per-group row counts around ``m`` (0.5m..1.5m), the first ``empty`` groups empty."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(max(1, m // 2), m + m // 2 + 1, (groups,), generator=g).tolist()
    for i in range(min(empty, groups)):
        sizes[i] = 0
    return sizes


def _m_indices(sizes: list[int]) -> torch.Tensor:
    """int32 m_indices for 128-aligned segments (-1 padding), as a MoE layout builds it."""
    parts = []
    for gi, s in enumerate(sizes):
        padded = -(-s // ALIGN) * ALIGN
        seg = torch.full((padded,), -1, dtype=torch.int32)
        seg[:s] = gi
        parts.append(seg)
    parts.append(torch.full((ALIGN,), -1, dtype=torch.int32))  # an all-padding block at the end
    return torch.cat(parts).cuda()


def _ref_contiguous(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor, psum: bool) -> torch.Tensor:
    """float64 reference of the m-grouped contiguous ops (b as [G, N, K]; upcast one group at a time)."""
    rows, n = a.shape[0], b.shape[1]
    a64 = a.double()
    out = torch.zeros(rows, n, dtype=torch.float64, device=a.device)
    if psum:
        start = 0
        for gi, end in enumerate(m_indices.tolist()):
            out[start:end] = a64[start:end] @ b[gi].double().T
            start = end
        return out
    for gi in range(b.shape[0]):
        sel = m_indices == gi
        out[sel] = a64[sel] @ b[gi].double().T
    return out


def _bf16_operands(rows, groups, n, k, nn, seed):
    gen = _gen(seed)
    a = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
    b_nt = torch.randn(groups, n, k, device="cuda", generator=gen).bfloat16()
    b = b_nt.transpose(1, 2).contiguous() if nn else b_nt
    return a, b, b_nt


def _fp8_operands(rows, groups, n, k, nn, seed):
    gen = _gen(seed)
    xa = torch.randn(rows, k, device="cuda", generator=gen)
    xb = torch.randn(groups, n, k, device="cuda", generator=gen)
    qa, sa = per_token_cast_to_fp8(xa)
    qb, sb = per_block_cast_to_fp8(xb)
    a_deq = qa.double() * sa.double().repeat_interleave(128, 1)[:, :k]
    b_deq = qb.double() * sb.double().repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]
    b = (qb.transpose(1, 2).contiguous(), sb.transpose(1, 2).contiguous()) if nn else (qb, sb)  # data + scales
    return (qa, sa), b, a_deq, b_deq, xa.double(), xb.double()


def _contiguous_op(fp8: bool, layout: str):
    return getattr(tg, f"m_grouped_{'fp8' if fp8 else 'bf16'}_gemm_{layout}_contiguous")


def _run_twice(fn, d):
    out = fn(d).clone()
    d2 = poisoned(d.shape, d.dtype, "cuda")
    out2 = fn(d2)
    assert torch.equal(out.view(torch.uint8), out2.view(torch.uint8)), "rerun not bitwise identical"
    return out


# ---------------------------------------------------------------------------- contiguous


@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize("nk", CONTIG_NK, ids=lambda s: f"n{s[0]}k{s[1]}")
@pytest.mark.parametrize("gm", CONTIG_GM, ids=lambda s: f"g{s[0]}m{s[1]}")
def test_m_grouped_bf16_contiguous(gm, nk, layout):
    groups, m = gm
    n, k = nk
    n = min(n, max(256, 2**28 // (groups * k)))  # keep B (and its float64 copy per group) small
    sizes = _group_sizes(groups, m, seed=groups + n, empty=1)
    for psum in (False, True):
        if psum:
            index = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
            rows = int(index[-1]) + 77  # rows past offs[-1] must be written 0
        else:
            index = _m_indices(sizes)
            rows = index.numel()
        a, b, b_nt = _bf16_operands(rows, groups, n, k, layout == "nn", seed=rows)
        d = poisoned((rows, n), torch.bfloat16, "cuda")
        out = _run_twice(
            lambda dd, a=a, b=b, i=index, p=psum: _contiguous_op(False, layout)(
                a, b, dd, i, use_psum_layout=p, alignment=1
            ),
            d,
        )
        ref = _ref_contiguous(a, b_nt, index, psum)
        assert not out.isnan().any(), "rows left unwritten"
        diff = calc_diff(out, ref)
        assert diff < BAR_BF16, f"psum={psum}: calc_diff {diff:.3e}"
        pad = (index == -1) if not psum else torch.arange(rows, device="cuda") >= index[-1]
        assert torch.all(out[pad] == 0), "padding rows must be 0"


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["nt", "nn"])
@pytest.mark.parametrize(
    "case", [(4, 1024, 4096, 7168), (128, 96, 1536, 2048), (256, 40, 2048, 768), (1, 300, 512, 512)]
)
@pytest.mark.xdist_group("gpu_memory")  # up to 19 GiB of operands and float64 references
def test_m_grouped_fp8_contiguous(case, layout, out_dtype):
    groups, m, n, k = case
    sizes = _group_sizes(groups, m, seed=groups * 7 + k, empty=1 if groups > 1 else 0)
    for psum in (False, True):
        if psum:
            index = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
            rows = int(index[-1]) + 33
        else:
            index = _m_indices(sizes)
            rows = index.numel()
        a, b, a_deq, b_deq, xa, xb = _fp8_operands(rows, groups, n, k, layout == "nn", seed=rows + n)
        d = poisoned((rows, n), out_dtype, "cuda")
        out = _run_twice(
            lambda dd, a=a, b=b, i=index, p=psum: _contiguous_op(True, layout)(
                a, b, dd, i, use_psum_layout=p, alignment=1
            ),
            d,
        )
        assert not out.isnan().any(), "rows left unwritten"
        exact = _ref_contiguous(a_deq, b_deq, index, psum)
        diff = calc_diff(out, exact)
        assert diff < BAR_FP8_EXACT[out_dtype], f"psum={psum}: vs dequantized formula {diff:.3e}"
        assert calc_diff(out, _ref_contiguous(xa, xb, index, psum)) < BAR_FP8_UNQUANT


def test_m_grouped_one_group_and_256_groups():
    for groups, m in ((1, 1000), (256, 64)):
        sizes = _group_sizes(groups, m, seed=groups, empty=3 if groups > 1 else 0)
        index = _m_indices(sizes)
        a, b, b_nt = _bf16_operands(index.numel(), groups, 512, 1024, False, seed=groups)
        d = poisoned((index.numel(), 512), torch.float32, "cuda")
        out = _run_twice(lambda dd, a=a, b=b, i=index: tg.m_grouped_bf16_gemm_nt_contiguous(a, b, dd, i), d)
        assert calc_diff(out, _ref_contiguous(a, b_nt, index, False)) < BAR_BF16


def test_m_grouped_out_of_range_ids_skip_tiles():
    """Group ids outside [0, G) other than -1 skip their block (left unwritten), never fault."""
    sizes = [128, 256, 128]
    index = _m_indices(sizes)
    index[128:256] = 7  # G = 3: out of range
    index[256:384] = -5
    a, b, b_nt = _bf16_operands(index.numel(), 3, 256, 512, False, seed=3)
    d = poisoned((index.numel(), 256), torch.float32, "cuda")
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, index)
    torch.cuda.synchronize()
    assert torch.isnan(d[128:384]).all(), "out-of-range blocks must be skipped"
    ok = torch.ones(index.numel(), dtype=torch.bool, device="cuda")
    ok[128:384] = False
    ref = _ref_contiguous(a, b_nt, index, False)
    assert calc_diff(d[ok], ref[ok]) < BAR_BF16
    # psum offsets that are not monotone / exceed the rows are clamped, never out of bounds
    offs = torch.tensor([300, 100, 10**6], dtype=torch.int32, device="cuda")
    tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, offs, use_psum_layout=True, alignment=1)
    torch.cuda.synchronize()


# -------------------------------------------------------------------------------- masked


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("nk", [(4096, 7168), (7168, 2048)], ids=lambda s: f"n{s[0]}k{s[1]}")
@pytest.mark.parametrize("gm", MASKED_GM, ids=lambda s: f"g{s[0]}m{s[1]}")
@pytest.mark.xdist_group("gpu_memory")  # up to 28 GiB of operands and float64 references
def test_masked(gm, nk, fp8):
    groups, m = gm
    n, k = nk
    mmax = 1024 if m <= 192 else 1536
    sizes = _group_sizes(groups, m, seed=groups + m)
    sizes[0] = 0
    sizes[-1] = min(mmax, sizes[-1])
    masked_m = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    if fp8:
        (qa, sa), (qb, sb), a_deq, b_deq, xa, xb = _fp8_operands(groups * mmax, groups, n, k, False, seed=n + m)
        a = (qa.view(groups, mmax, k), sa.view(groups, mmax, -1))
        b = (qb, sb)
        a64, b64 = a_deq.view(groups, mmax, k), b_deq
        op = tg.m_grouped_fp8_gemm_nt_masked
    else:
        a0, b, _ = _bf16_operands(groups * mmax, groups, n, k, False, seed=n + m)
        a = a0.view(groups, mmax, k)
        a64, b64 = a.double(), b.double()
        op = tg.m_grouped_bf16_gemm_nt_masked
    d = poisoned((groups, mmax, n), torch.bfloat16, "cuda")
    out = _run_twice(lambda dd: op(a, b, dd, masked_m, m), d)
    ref = torch.einsum("gmk,gnk->gmn", a64, b64)
    for gi, s in enumerate(sizes):
        # DeepGEMM's contract: rows past masked_m are unspecified; the kernel writes 0 to those of the last
        # row tile it computes (whole-tile stores) and leaves the rest alone.
        past = out[gi, s:]
        assert (past.isnan() | (past == 0)).all(), f"group {gi}: rows past masked_m hold computed values"
        assert not out[gi, :s].isnan().any(), f"group {gi}: valid rows left unwritten"
    valid = torch.arange(mmax, device="cuda")[None, :] < masked_m[:, None]
    diff = calc_diff(out[valid], ref[valid])
    assert diff < (BAR_FP8_EXACT[torch.bfloat16] if fp8 else BAR_BF16), f"calc_diff {diff:.3e}"


def test_masked_cuda_graph_replay_with_new_masked_m():
    groups, mmax, n, k = 8, 512, 1024, 2048
    a0, b, _ = _bf16_operands(groups * mmax, groups, n, k, False, seed=5)
    a = a0.view(groups, mmax, k)
    masked_m = torch.zeros(groups, dtype=torch.int32, device="cuda")
    d = torch.zeros(groups, mmax, n, dtype=torch.bfloat16, device="cuda")
    tg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 64)  # JIT warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tg.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, 64)
    ref = torch.einsum("gmk,gnk->gmn", a.double(), b.double())
    for seed in range(3):
        sizes = _group_sizes(groups, 64 * (seed + 1), seed=seed)
        sizes[seed] = 0
        masked_m.copy_(torch.tensor(sizes, dtype=torch.int32))
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for gi, s in enumerate(sizes):
            assert (d[gi, s:].isnan() | (d[gi, s:] == 0)).all()
            assert calc_diff(d[gi, :s], ref[gi, :s]) < BAR_BF16 if s else True


# ----------------------------------------------------------------------------- k-grouped


def _k_ref(a64, b64, ks, c64=None):
    outs, start = [], 0
    for kk in ks:
        outs.append(a64[start : start + kk].T @ b64[start : start + kk])
        start += kk
    out = torch.stack(outs)
    return out + c64 if c64 is not None else out


@pytest.mark.parametrize("with_c", [False, True, "alias"])
@pytest.mark.parametrize("case", [(4, 2048, 2048, [1024, 0, 3000, 512]), (8, 4096, 1536, None), (1, 256, 384, [777])])
def test_k_grouped_bf16(case, with_c):
    groups, m, n, ks = case
    ks = ks or [0, 1024, 2048, 100, 4096, 0, 640, 1536]
    gen = _gen(groups + m)
    a = torch.randn(sum(ks), m, device="cuda", generator=gen).bfloat16()
    b = torch.randn(sum(ks), n, device="cuda", generator=gen).bfloat16()
    c = torch.randn(groups, m, n, device="cuda", generator=gen) if with_c else None
    ref = _k_ref(a.double(), b.double(), ks, c.double() if c is not None else None)
    ks_t = torch.tensor(ks, dtype=torch.int32, device="cuda")

    def call(dd):
        if with_c == "alias":
            dd.copy_(c)
            return tg.k_grouped_bf16_gemm_tn_contiguous(a, b, dd, ks, ks_t, c=dd)
        return tg.k_grouped_bf16_gemm_tn_contiguous(a, b, dd, ks, ks_t, c=c)

    out = _run_twice(call, poisoned((groups, m, n), torch.float32, "cuda"))
    assert calc_diff(out, ref) < BAR_BF16


@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped_fp8(with_c):
    groups, m, n = 4, 1024, 1536
    ks = [1024, 0, 2048, 384]
    gen = _gen(11)
    xa = torch.randn(sum(ks), m, device="cuda", generator=gen)
    xb = torch.randn(sum(ks), n, device="cuda", generator=gen)
    # 1x128 along K: quantize the transposed [M, K_sum] rows, scales back to [K_sum/128, M]
    qa_t, sa_t = per_token_cast_to_fp8(xa.T.contiguous())
    qb_t, sb_t = per_token_cast_to_fp8(xb.T.contiguous())
    qa, sa = qa_t.T.contiguous(), sa_t.T.contiguous()
    qb, sb = qb_t.T.contiguous(), sb_t.T.contiguous()
    a_deq = qa.double() * sa.double().repeat_interleave(128, 0)
    b_deq = qb.double() * sb.double().repeat_interleave(128, 0)
    c = torch.randn(groups, m, n, device="cuda", generator=gen) if with_c else None
    c64 = c.double() if c is not None else None
    ks_t = torch.tensor(ks, dtype=torch.int32, device="cuda")
    out = _run_twice(
        lambda dd: tg.k_grouped_fp8_gemm_tn_contiguous((qa, sa), (qb, sb), dd, ks, ks_t, c=c),
        poisoned((groups, m, n), torch.float32, "cuda"),
    )
    assert calc_diff(out, _k_ref(a_deq, b_deq, ks, c64)) < BAR_FP8_EXACT[torch.float32]
    assert calc_diff(out, _k_ref(xa.double(), xb.double(), ks, c64)) < BAR_FP8_UNQUANT


# ----------------------------------------------------------------------- routing + graph


@pytest.mark.parametrize("layout", ["indices", "psum"])
def test_routing_to_grouped_gemm_in_cuda_graph(layout):
    """topk ids -> moe_route -> permute -> m-grouped GEMM -> unpermute, captured once, replayed on new routing."""
    t, topk, e, h, n = 512, 4, 16, 1024, 768
    gen = _gen(21)
    x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
    w = torch.randn(e, n, h, device="cuda", generator=gen).bfloat16()
    ids = torch.zeros(t, topk, dtype=torch.int64, device="cuda")
    weights = torch.rand(t, topk, device="cuda", generator=gen)

    def forward():
        r = moe_route(ids, e)
        xs = permute_tokens(x, r, layout)
        ys = torch.empty(xs.shape[0], n, dtype=torch.bfloat16, device="cuda")
        index = r.m_indices if layout == "indices" else r.psum_offsets
        tg.m_grouped_bf16_gemm_nt_contiguous(xs, w, ys, index, use_psum_layout=layout == "psum", alignment=1)
        return unpermute_tokens(ys, r, weights, layout, out_dtype=torch.float32)

    ids.copy_(torch.rand(t, e, device="cuda", generator=gen).topk(topk, dim=1).indices)
    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    for rep in range(2):
        scores = torch.rand(t, e, device="cuda", generator=gen)
        scores[:, rep] += 2.0  # an overloaded expert
        scores[:, 5] -= 5.0  # an empty expert
        ids.copy_(scores.topk(topk, dim=1).indices)
        graph.replay()
        torch.cuda.synchronize()
        all_experts = torch.einsum("th,enh->ten", x.double(), w.double())  # [T, E, N]
        picked = all_experts.gather(1, ids[:, :, None].expand(t, topk, n))  # [T, k, N]
        ref = (weights.double()[:, :, None] * picked).sum(1)
        assert calc_diff(out, ref) < 1e-5
