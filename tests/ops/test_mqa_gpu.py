"""GPU tests of the cutile MQA-logits ops against float64 math and the pytorch reference.

Bars (docs/design.md): calc_diff < 1e-6 against the exact formula on the dequantized FP8 values
(fp32 output), < 1e-3 against the unquantized inputs; ``-inf`` masks identical to the
reference's; bitwise identical reruns. Plus CUDA-graph capture of metadata + paged op, and
out-of-range indices that must not fault.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm import indexer
from tilegemm.ops import api
from tilegemm.testing import calc_diff

pytestmark = pytest.mark.gpu

DEV = "cuda"


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """A silent fallback to pytorch would make these tests compare the reference with itself."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _logits64(q: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 ``scale[j] * sum_h w[i, h] * relu(q[i, h] . keys[j])`` for q [S, H, D], keys [S_kv, D]."""
    scores = torch.einsum("shd,kd->shk", q.double(), keys.double()).relu_()
    return torch.einsum("sh,shk->sk", w.double(), scores) * scale.double()[None, :]


def _valid_diff(out: torch.Tensor, exact: torch.Tensor, valid: torch.Tensor) -> float:
    return calc_diff(out[valid], exact[valid])


def _windows(kind: str, s: int, s_kv: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "causal":
        return indexer.causal_windows(s, s_kv)
    if kind == "sliding":
        return indexer.causal_windows(s, s_kv, window=s_kv // 3)
    if kind == "full":
        return torch.zeros(s, dtype=torch.int32), torch.full((s,), s_kv, dtype=torch.int32)
    ks = torch.randint(0, s_kv + 1, (s,), generator=g, dtype=torch.int32)
    ke = ks + (torch.rand(s, generator=g) * (s_kv - ks + 1)).long().clamp_max(s_kv - ks).int()
    ke[::7] = ks[::7]  # some empty windows
    return ks, ke


PLAIN_CASES = [
    # S, S_kv, H, D, window kind
    (300, 1000, 64, 128, "causal"),
    (257, 999, 32, 128, "ragged"),
    (128, 520, 8, 64, "ragged"),
    (64, 700, 128, 128, "full"),
    (77, 300, 96, 64, "ragged"),
    (200, 4096, 64, 128, "sliding"),
    (33, 129, 16, 128, "ragged"),
    (130, 777, 64, 32, "ragged"),
    (65, 300, 20, 32, "causal"),
    (129, 300, 48, 64, "ragged"),  # two MMA chains per key tile (sm_90), padded heads, an odd row count
    (131, 500, 48, 32, "causal"),  # ... at D = 32: three CTAs per SM (sm_90)
    # tiles that divide the output and keys: stores (and one chain's key-scale loads) unchecked (mqa.tiles_inside)
    (256, 1024, 64, 64, "ragged"),  # ... with two key tiles per iteration (sm_90)
    (132, 384, 64, 64, "full"),  # ... three key tiles: the last pair ends past the keys
    (128, 640, 32, 128, "causal"),
    (96, 256, 64, 32, "ragged"),
]


@pytest.mark.parametrize("s,s_kv,h,d,kind", PLAIN_CASES)
def test_fp8_mqa_logits_matches_math(s, s_kv, h, d, kind):
    g = torch.Generator().manual_seed(s * 7 + h)
    q_f = torch.randn(s, h, d, generator=g)
    k_f = torch.randn(s_kv, d, generator=g)
    w = torch.randn(s, h, generator=g)
    ks, ke = _windows(kind, s, s_kv, g)
    q8 = q_f.to(torch.float8_e4m3fn)
    kv = indexer.quantize_keys(k_f)
    args = [t.to(DEV) for t in (q8,)] + [(kv[0].to(DEV), kv[1].to(DEV)), w.to(DEV), ks.to(DEV), ke.to(DEV)]

    out = api.fp8_mqa_logits(*args, backend="cutile")
    ref = api.fp8_mqa_logits(*args, backend="pytorch")
    torch.cuda.synchronize()
    assert out.shape == (s, s_kv) and out.dtype == torch.float32
    cols = torch.arange(s_kv)
    valid = ((cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])).to(DEV)
    assert torch.equal(torch.isneginf(out), ~valid), "-inf mask differs from the windows"
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs from the reference"
    assert torch.isfinite(out[valid]).all()
    exact = _logits64(q8.float(), kv[0].float(), kv[1], w).to(DEV)
    assert _valid_diff(out, exact, valid) < 1e-6
    unquant = _logits64(q_f, k_f, torch.ones(s_kv), w).to(DEV)
    assert _valid_diff(out, unquant, valid) < 1e-3
    # bitwise identical rerun; clean_logits=False agrees inside the windows
    assert torch.equal(api.fp8_mqa_logits(*args, backend="cutile"), out)
    raw = api.fp8_mqa_logits(*args, clean_logits=False, backend="cutile")
    assert torch.equal(raw[valid], out[valid])


def test_fp8_mqa_logits_out_of_range_windows_do_not_fault():
    """The kernel clamps windows: ks < 0 and ke > S_kv read nothing outside the arrays."""
    from tilegemm.ops.cutile import mqa

    g = torch.Generator().manual_seed(1)
    s, s_kv, h, d = 70, 333, 64, 128
    q8 = torch.randn(s, h, d, generator=g).to(torch.float8_e4m3fn).to(DEV)
    kv = tuple(t.to(DEV) for t in indexer.quantize_keys(torch.randn(s_kv, d, generator=g)))
    w = torch.randn(s, h, generator=g).to(DEV)
    ks = torch.randint(-1000, 100, (s,), generator=g, dtype=torch.int32).to(DEV)
    ke = torch.randint(200, 5000, (s,), generator=g, dtype=torch.int32).to(DEV)
    out = mqa.fp8_mqa_logits(q8, kv, w, ks, ke, True, 0, torch.float32, None)
    ref = api.fp8_mqa_logits(q8, kv, w, ks.clamp_min(0), ke.clamp_max(s_kv), backend="pytorch")
    torch.cuda.synchronize()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    assert calc_diff(out[fin], ref[fin]) < 1e-6


PAGED_CASES = [
    # B, next_n, H, D, block_kv, 2-D context_lens, num_sms
    (5, 1, 64, 128, 64, False, 132),
    (7, 2, 32, 128, 16, True, 8),
    (3, 3, 8, 64, 32, False, 5),
    (4, 4, 128, 128, 64, True, 132),
    (6, 2, 48, 64, 16, False, 3),
    (2, 1, 64, 128, 32, False, 1),
    (9, 2, 32, 128, 64, True, 132),
]


def _paged_inputs(b, next_n, h, d, block_kv, two_d, seed, longest=None):
    """Random paged inputs; ``longest``: the longest sequence's length, which is then also the output width (no
    padding columns)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(next_n, 3000, (b,), generator=g).tolist()
    if next_n == 1:
        lens[-1] = 0  # a sequence with no keys: its rows are all -inf
    if longest is not None:
        lens = [min(n, longest) for n in lens]
        lens[0] = longest
    keys_f = [torch.randn(n, d, generator=g) for n in lens]
    cache, table, ctx = indexer.build_paged_kv_cache(
        keys_f, block_kv, num_blocks=sum(-(-n // block_kv) for n in lens) + 9, generator=g
    )
    # entries past each sequence's blocks are garbage: the kernel must clamp, never fault
    used = torch.tensor([-(-n // block_kv) for n in lens])
    pad = torch.arange(table.shape[1])[None, :] >= used[:, None]
    table = torch.cat([table, torch.zeros(b, 3, dtype=torch.int32)], 1)
    pad = torch.cat([pad, torch.ones(b, 3, dtype=torch.bool)], 1)
    table[pad] = torch.randint(-50, 10**6, (int(pad.sum()),), generator=g, dtype=torch.int32)
    if two_d:
        drop = torch.randint(0, 40, (b, next_n), generator=g, dtype=torch.int32)
        ctx_arg = (ctx[:, None] - drop).clamp_min(0)
        ctx_arg[:, -1] = ctx
    else:
        ctx_arg = ctx
    q_f = torch.randn(b, next_n, h, d, generator=g)
    w = torch.randn(b * next_n, h, generator=g)
    width = max(lens) + (100 if longest is None else 0)
    return keys_f, cache, table, ctx, ctx_arg, q_f, w, width


@pytest.mark.parametrize("b,next_n,h,d,block_kv,two_d,num_sms", PAGED_CASES)
def test_fp8_paged_mqa_logits_matches_math(b, next_n, h, d, block_kv, two_d, num_sms):
    _check_paged(b, next_n, h, d, block_kv, two_d, num_sms)


@pytest.mark.parametrize("next_n,longest", [(2, 640), (1, 640), (2, 1024)])
def test_fp8_paged_mqa_logits_output_exactly_as_wide_as_the_longest(next_n, longest):
    """No padding columns: the last split's chunks past the length (640 keys: a 256-key split whose second 128-key
    chunk starts at the output's end) are computed and their stores fall outside the output."""
    _check_paged(5, next_n, 64, 128, 64, True, 132, longest=longest)


def _check_paged(b, next_n, h, d, block_kv, two_d, num_sms, longest=None):
    """The cutile op against float64 on the dequantized and the unquantized keys, the -inf mask, a bitwise rerun
    and ``clean_logits=False`` on the valid logits."""
    keys_f, cache, table, ctx, ctx_arg, q_f, w, width = _paged_inputs(
        b, next_n, h, d, block_kv, two_d, b * 100 + h, longest
    )
    q8 = q_f.to(torch.float8_e4m3fn)
    cache_d, table_d, ctx_d, q_d, w_d = (t.to(DEV) for t in (cache, table, ctx_arg, q8, w))

    meta = api.get_paged_mqa_logits_metadata(ctx_d, block_kv, num_sms, backend="cutile")
    meta_ref = api.get_paged_mqa_logits_metadata(ctx_d, block_kv, num_sms, backend="pytorch")
    assert torch.equal(meta, meta_ref)
    out = api.fp8_paged_mqa_logits(q_d, cache_d, w_d, ctx_d, table_d, meta, width, clean_logits=True, backend="cutile")
    ref = api.fp8_paged_mqa_logits(q_d, cache_d, w_d, ctx_d, table_d, meta, width, clean_logits=True, backend="pytorch")
    torch.cuda.synchronize()
    assert out.shape == (b * next_n, width)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs from the reference"

    rows_exact, rows_unq, valid = [], [], []
    kv_back = indexer.read_paged_kv_cache(cache, table, ctx)
    cols = torch.arange(width)
    for i in range(b):
        data, scale = kv_back[i]
        n = data.shape[0]
        e = torch.full((next_n, width), float("-inf"), dtype=torch.float64)
        u = e.clone()
        e[:, :n] = _logits64(q8[i].float(), data.float(), scale, w[i * next_n : (i + 1) * next_n])
        u[:, :n] = _logits64(q_f[i], keys_f[i], torch.ones(n), w[i * next_n : (i + 1) * next_n])
        vis = ctx_arg[i] if two_d else ctx[i] - next_n + torch.arange(next_n) + 1
        rows_exact.append(e)
        rows_unq.append(u)
        valid.append(cols[None, :] < vis[:, None])
    exact, unquant, valid = torch.cat(rows_exact).to(DEV), torch.cat(rows_unq).to(DEV), torch.cat(valid).to(DEV)
    assert torch.equal(torch.isneginf(out), ~valid)
    assert _valid_diff(out, exact, valid) < 1e-6
    assert _valid_diff(out, unquant, valid) < 1e-3
    again = api.fp8_paged_mqa_logits(
        q_d, cache_d, w_d, ctx_d, table_d, meta, width, clean_logits=True, backend="cutile"
    )
    assert torch.equal(again, out)
    raw = api.fp8_paged_mqa_logits(q_d, cache_d, w_d, ctx_d, table_d, meta, width, clean_logits=False, backend="cutile")
    assert torch.equal(raw[valid], out[valid])
    # without a schedule (the paged decode kernel, or where it does not take the rows the op's own schedule): the
    # same chunks' math, so the same bits
    unscheduled = api.fp8_paged_mqa_logits(
        q_d, cache_d, w_d, ctx_d, table_d, None, width, clean_logits=True, backend="cutile"
    )
    assert torch.equal(unscheduled, out)


def test_fp8_paged_mqa_logits_cuda_graph():
    """Metadata + paged op captured in one CUDA graph, replayed with new q, weights and lengths."""
    b, next_n, h, d, block_kv, num_sms = 6, 2, 64, 128, 64, 16
    keys_f, cache, table, ctx, _, q_f, w, width = _paged_inputs(b, next_n, h, d, block_kv, False, 7)
    cache_d, table_d = cache.to(DEV), table.to(DEV)
    q_s = q_f.to(torch.float8_e4m3fn).to(DEV)
    w_s, ctx_s = w.to(DEV), ctx.to(DEV)

    def step():
        meta = api.get_paged_mqa_logits_metadata(ctx_s, block_kv, num_sms, backend="cutile")
        return api.fp8_paged_mqa_logits(
            q_s, cache_d, w_s, ctx_s, table_d, meta, width, clean_logits=True, backend="cutile"
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # JIT warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_s = step()

    g = torch.Generator().manual_seed(11)
    for _ in range(2):
        q_s.copy_(torch.randn(b, next_n, h, d, generator=g).to(torch.float8_e4m3fn))
        w_s.copy_(torch.randn(b * next_n, h, generator=g))
        new_ctx = (ctx - torch.randint(0, 500, (b,), generator=g, dtype=torch.int32)).clamp_min(next_n)
        ctx_s.copy_(new_ctx)
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        assert torch.equal(out_s, eager)
        meta = api.get_paged_mqa_logits_metadata(ctx_s, block_kv, num_sms, backend="pytorch")
        ref = api.fp8_paged_mqa_logits(
            q_s, cache_d, w_s, ctx_s, table_d, meta, width, clean_logits=True, backend="pytorch"
        )
        assert torch.equal(torch.isneginf(out_s), torch.isneginf(ref))
        fin = torch.isfinite(ref)
        assert calc_diff(out_s[fin], ref[fin]) < 1e-6
