"""FP8 MQA logits (DeepSeek sparse-attention indexer): ragged, paged, and the paged schedule.

Logits are compared with a float64 formula on the upcast FP8 values inside each row's window
(``calc_diff < 1e-6``) and on the unquantized bf16 inputs (``< 1e-3``); with ``clean_logits`` the
``-inf`` mask must be exactly the complement of the windows. The unquantized bar is statistical
(FP8 quantization alone costs about 7e-4, with a spread that exceeds 1e-3 on a few hundred values),
so it is applied where at least ``MIN_VALUES_VS_UNQUANTIZED`` logits are compared.
"""

from __future__ import annotations

import math

import pytest
import torch

import tilegemm as tg
from tilegemm.ops.common import PAGED_MQA_SPLIT_KV, paged_mqa_split_kv
from tilegemm.ops.reference import _common
from tilegemm.testing import backend_device_params, calc_diff

BACKENDS = backend_device_params()
FP8 = torch.float8_e4m3fn
MIN_VALUES_VS_UNQUANTIZED = 1000


def _per_row_cast(x: torch.Tensor):
    """[rows, D] -> fp8 [rows, D] and one fp32 scale per row (amax / 448)."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    scale = amax / 448.0
    return (x.float() / scale).to(FP8), scale.squeeze(-1)


def _cast_q(q_raw: torch.Tensor, weights: torch.Tensor):
    """Per (token, head) FP8 cast of q with the scale folded into the weights (as DeepSeek's indexer does).

    ``w * relu(q . k) == (w * q_scale) * relu(q_fp8 . k)`` for ``q ~= q_fp8 * q_scale`` (``q_scale > 0``).
    """
    dim = q_raw.shape[-1]
    q, q_scale = _per_row_cast(q_raw.reshape(-1, dim))
    return q.view(q_raw.shape), weights * q_scale.view(weights.shape)


def _logits64(q64, k64, scale64, w64):
    """float64 ``scale[j] * sum_h w[i, h] * relu(q[i, h] . k[j])``: q [S,H,D], k [S_kv,D] -> [S, S_kv]."""
    return torch.einsum("ih,ihj->ij", w64, torch.einsum("ihd,jd->ihj", q64, k64).clamp(min=0)) * scale64[None, :]


def _windows(s: int, s_kv: int, kind: str, device):
    if kind == "causal":  # prefill-like: row i sees [max(0, i + off - 40), i + off + 1)
        end = torch.arange(s) + (s_kv - s) + 1
        start = (end - 40).clamp(min=0)
    else:  # random windows, some empty, one full
        a = torch.randint(0, s_kv + 1, (s,))
        b = torch.randint(0, s_kv + 1, (s,))
        start, end = torch.minimum(a, b), torch.maximum(a, b)
        start[0], end[0] = 0, s_kv
        if s > 2:
            start[1] = end[1] = s_kv // 2
    return start.to(torch.int32).to(device), end.to(torch.int32).to(device)


MQA_SHAPES = [(1, 4, 64, 100), (33, 8, 128, 257), (64, 16, 128, 64)]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "raw"])
@pytest.mark.parametrize("windows", ["causal", "random"])
@pytest.mark.parametrize("shape", MQA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_mqa_logits(backend, device, shape, windows, clean):
    s, h, dim, s_kv = shape
    torch.manual_seed(41)
    q_raw = torch.randn(s, h, dim, device=device).bfloat16()
    kv_raw = torch.randn(s_kv, dim, device=device).bfloat16()
    w_raw = torch.randn(s, h, device=device)
    q, weights = _cast_q(q_raw, w_raw)
    kv, kv_scale = _per_row_cast(kv_raw)
    ks, ke = _windows(s, s_kv, windows, device)
    logits = tg.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke, clean_logits=clean, backend=backend)
    assert logits.shape == (s, s_kv) and logits.dtype == torch.float32 and logits.device == q.device
    cols = torch.arange(s_kv, device=device)
    inside = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    if clean:
        assert torch.equal(torch.isneginf(logits), ~inside), "-inf mask differs from the windows"
    assert torch.isfinite(logits[inside]).all()
    ref = _logits64(q.double(), kv.double(), kv_scale.double(), weights.double())
    assert calc_diff(logits[inside], ref[inside]) < 1e-6
    ones = torch.ones(s_kv, dtype=torch.float64, device=device)
    unquantized = _logits64(q_raw.double(), kv_raw.double(), ones, w_raw.double())
    if inside.sum() >= MIN_VALUES_VS_UNQUANTIZED:
        assert calc_diff(logits[inside], unquantized[inside]) < 1e-3
    again = tg.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke, clean_logits=clean, backend=backend)
    assert torch.equal(again[inside], logits[inside])


def test_fp8_mqa_logits_reference_chunks(monkeypatch, elementwise_reference_matmul):
    """Row chunking of the reference (forced to one row per chunk) gives the same bits, with a matmul whose rows do
    not depend on each other (a BLAS GEMM's summation order may follow the matrix sizes)."""
    torch.manual_seed(42)
    s, h, dim, s_kv = 9, 4, 64, 70
    q = torch.randn(s, h, dim).to(FP8)
    kv, kv_scale = _per_row_cast(torch.randn(s_kv, dim))
    weights = torch.randn(s, h)
    ks, ke = _windows(s, s_kv, "random", "cpu")
    whole = tg.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke, backend="pytorch")
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    chunked = tg.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke, backend="pytorch")
    assert torch.equal(whole, chunked)


# ------------------------------------------------------------------------------ paged schedule


def _schedule_py(lens: list[int], split: int, num_sms: int) -> list[tuple[int, int]]:
    """Independent loop: list every (batch, split) work unit, give SM i the next q (+1 for i < r) of them."""
    units = [(b, j) for b, n in enumerate(lens) for j in range(-(-n // split))]
    q, r = divmod(len(units), num_sms)
    rows, pos = [], 0
    for i in range(num_sms):
        rows.append(units[pos] if pos < len(units) else (len(lens), 0))
        pos += q + (1 if i < r else 0)
    rows.append((len(lens), 0))
    return rows


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("block_kv", [16, 64, 48])
@pytest.mark.parametrize(
    "lens,num_sms",
    [([1000, 0, 5, 4096, 257], 8), ([300], 132), ([0, 0], 4), ([7000, 3000, 12000, 1, 256, 512], 78)],
    ids=["mixed", "fewer_units_than_sms", "all_empty", "larger"],
)
def test_paged_mqa_metadata(backend, device, lens, num_sms, block_kv):
    split = paged_mqa_split_kv(block_kv)
    assert split % block_kv == 0 and split % PAGED_MQA_SPLIT_KV == 0
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    meta = tg.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, backend=backend)
    assert meta.dtype == torch.int32 and meta.shape == (num_sms + 1, 2) and meta.device == context_lens.device
    rows = [tuple(r) for r in meta.cpu().tolist()]
    assert rows == _schedule_py(lens, split, num_sms)
    # Balance: SM i's share is the units between its start and the next start; shares differ by <= 1.
    starts = [sum(-(-n // split) for n in lens[:b]) + j for b, j in rows]
    shares = [starts[i + 1] - starts[i] for i in range(num_sms)]
    assert sum(shares) == sum(-(-n // split) for n in lens) and max(shares) - min(shares) <= 1


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_paged_mqa_metadata_2d_uses_row_max(backend, device):
    ctx2d = torch.tensor([[250, 251, 700], [0, 0, 0], [3000, 2999, 2998]], dtype=torch.int32, device=device)
    ctx1d = ctx2d.amax(dim=1)
    meta2d = tg.get_paged_mqa_logits_metadata(ctx2d, 64, 10, backend=backend)
    meta1d = tg.get_paged_mqa_logits_metadata(ctx1d, 64, 10, backend=backend)
    assert torch.equal(meta2d, meta1d)


# ------------------------------------------------------------------------------------- paged


def _build_paged(lens_max: list[int], block_kv: int, dim: int, device, gen: torch.Generator):
    """Random per-token keys, a shuffled block table, and DeepGEMM's cache bytes holding them.

    Returns (kv_cache uint8 [num_blocks, block_kv, 1, D+4], block_table int32, keys fp8 list, scales
    list, raw keys list). Unused slots and blocks hold random bytes (some of them NaN patterns);
    unused block-table entries hold -1 or out-of-range ids.
    """
    batch = len(lens_max)
    blocks_per = [-(-n // block_kv) for n in lens_max]
    max_blocks = max(blocks_per) + 1
    num_blocks = sum(blocks_per) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    key_bytes = torch.randint(0, 256, (num_blocks, block_kv * dim), generator=gen, dtype=torch.uint8)
    scale_bytes = torch.randint(0, 256, (num_blocks, block_kv * 4), generator=gen, dtype=torch.uint8)
    table = torch.full((batch, max_blocks), -1, dtype=torch.int32)
    table[:, -1] = num_blocks + 7  # out of range, never visible
    keys, scales, raws, used = [], [], [], 0
    for b, n in enumerate(lens_max):
        raw = torch.randn(n, dim, generator=gen).bfloat16()
        kq, ks = _per_row_cast(raw)
        keys.append(kq), scales.append(ks), raws.append(raw)
        for i in range(blocks_per[b]):
            blk = int(perm[used])
            used += 1
            table[b, i] = blk
            lo, hi = i * block_kv, min(n, (i + 1) * block_kv)
            kb = key_bytes[blk].view(block_kv, dim)
            kb[: hi - lo] = kq[lo:hi].view(torch.uint8)
            sb = scale_bytes[blk].view(torch.float32)
            sb[: hi - lo] = ks[lo:hi]
    cache = torch.cat([key_bytes, scale_bytes], dim=1).view(num_blocks, block_kv, 1, dim + 4)
    return cache.to(device), table.to(device), keys, scales, raws


PAGED_CASES = [
    # (name, B, next_n, H, D, block_kv, context lens (1-D list or 2-D rows))
    ("next1_bkv64", 3, 1, 8, 64, 64, [1000, 1, 3000]),
    ("next2_bkv16", 2, 2, 4, 128, 16, [37, 64]),
    ("next3_bkv64", 3, 3, 8, 64, 64, [2, 700, 129]),
    ("ctx2d_next2", 2, 2, 4, 64, 16, [[20, 21], [70, 5]]),
    ("ctx2d_next3_bkv64", 2, 3, 8, 128, 64, [[0, 1, 2], [130, 131, 132]]),
]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("scheduled", [True, False], ids=["schedule", "no_schedule"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "raw"])
@pytest.mark.parametrize("case", PAGED_CASES, ids=[c[0] for c in PAGED_CASES])
def test_fp8_paged_mqa_logits(backend, device, case, clean, scheduled):
    _, batch, next_n, h, dim, block_kv, ctx = case
    gen = torch.Generator().manual_seed(43)
    ctx_t = torch.tensor(ctx, dtype=torch.int32)
    lens_max = ctx_t.amax(dim=1).tolist() if ctx_t.dim() == 2 else ctx
    cache, table, keys, scales, raws = _build_paged(lens_max, block_kv, dim, device, gen)
    q_raw = torch.randn(batch, next_n, h, dim, generator=gen).bfloat16()
    w_raw = torch.randn(batch * next_n, h, generator=gen)
    q, weights = _cast_q(q_raw, w_raw)
    q, weights = q.to(device), weights.to(device)
    context_lens = ctx_t.to(device)
    max_context_len = max(lens_max) + 5
    meta = tg.get_paged_mqa_logits_metadata(context_lens, block_kv, 4) if scheduled else None
    logits = tg.fp8_paged_mqa_logits(
        q, cache, weights, context_lens, table, meta, max_context_len, clean_logits=clean, backend=backend
    )
    assert logits.shape == (batch * next_n, max_context_len) and logits.dtype == torch.float32
    logits = logits.cpu()

    visible = torch.zeros(batch * next_n, max_context_len, dtype=torch.bool)
    ref = torch.zeros(batch * next_n, max_context_len, dtype=torch.float64)
    unq = torch.zeros_like(ref)
    w64 = weights.cpu().double()
    for b in range(batch):
        for t in range(next_n):
            row = b * next_n + t
            n_vis = int(ctx_t[b, t]) if ctx_t.dim() == 2 else int(ctx_t[b]) - next_n + t + 1
            n_vis = max(0, n_vis)
            visible[row, :n_vis] = True
            qk = q[b, t].cpu().double() @ keys[b][:n_vis].double().T  # [H, n_vis]
            ref[row, :n_vis] = (w64[row] @ qk.clamp(min=0)) * scales[b][:n_vis].double()
            qk_raw = q_raw[b, t].double() @ raws[b][:n_vis].double().T
            unq[row, :n_vis] = w_raw[row].double() @ qk_raw.clamp(min=0)
    if clean:
        assert torch.equal(torch.isneginf(logits), ~visible), "-inf mask differs from the visible lengths"
    assert torch.isfinite(logits[visible]).all()
    assert calc_diff(logits[visible], ref[visible]) < 1e-6
    if visible.sum() >= MIN_VALUES_VS_UNQUANTIZED:
        assert calc_diff(logits[visible], unq[visible]) < 1e-3


def test_paged_reference_chunks(monkeypatch, elementwise_reference_matmul):
    """Column chunking of the paged reference (one block per chunk) gives the same bits: the blocks, their scales and
    the visible-length mask of each chunk land in its columns. With a column-independent matmul: MKL's fp32 GEMM
    sums the head-weighted scores (M 1, K 4) in an order that depends on the number of columns on some CPUs."""
    gen = torch.Generator().manual_seed(44)
    cache, table, *_ = _build_paged([150, 40], 16, 64, "cpu", gen)
    q = torch.randn(2, 2, 4, 64, generator=gen).to(FP8)
    weights = torch.randn(4, 4, generator=gen)
    ctx = torch.tensor([150, 40], dtype=torch.int32)
    meta = tg.get_paged_mqa_logits_metadata(ctx, 16, 2)
    whole = tg.fp8_paged_mqa_logits(q, cache, weights, ctx, table, meta, 160, True, backend="pytorch")
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    chunked = tg.fp8_paged_mqa_logits(q, cache, weights, ctx, table, meta, 160, True, backend="pytorch")
    assert torch.equal(whole, chunked)
    assert math.isinf(float(whole[0, 155])) and float(whole[0, 155]) < 0
