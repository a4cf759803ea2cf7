"""The MQA ops' FP8 operands: ``fp8_quantize_rows``, ``fp8_paged_append`` and the paged schedule's kernel.

CPU: the reference against the float64 formula (the rotation by the orthonormal Hadamard matrix, one scale per row,
the cast within FP8's rounding), the append's bytes where the block table puts them and nowhere else, bad input,
and the cutile host path with ``cuda.tile.launch`` recorded (one launch per call). GPU (``gpu`` marks): the cutile
kernels against the same float64 formula and against the reference (scales within fp32 rounding, FP8 values equal
or neighbours), bitwise reruns, an append captured in a CUDA graph, and the schedule kernel's rows equal to
``ops.common.paged_mqa_schedule``'s. Machine code: ``tests/compile_gate/test_compile_mqa_prep.py``.
"""

from __future__ import annotations

import pytest
import torch

import tilegemm as tg
from tilegemm import indexer
from tilegemm.ops.common import paged_mqa_schedule
from tilegemm.testing import (
    assert_fp8_rows,
    backend_device_params,
    calc_diff,
    fp8_rows_float64,
    window_ends_float64,
)

FP8 = torch.float8_e4m3fn
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _assert_fp8_rows(q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, hadamard: bool) -> None:
    """``(q, s)`` is the cast of ``x`` (:func:`tilegemm.testing.assert_fp8_rows`), and within ``calc_diff`` 2e-3 of
    the float64 rows."""
    assert_fp8_rows(q, s, x, hadamard)
    y, _ = fp8_rows_float64(x, hadamard)
    if y.numel():
        assert calc_diff(q.double().cpu() * s.double().cpu().unsqueeze(-1), y) < 2e-3


def _rows(shape, dtype, seed=0, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 8
    if x.numel():
        x.view(-1, shape[-1])[0] = 0  # an all-zero row: the scale's floor
    return x.to(dtype).to(device)


ROW_CASES = [((3, 5, 128), True), ((7, 100), False), ((2, 64, 16), True), ((1, 8), True), ((0, 128), True)]
ROW_CASES += [((130, 128), False), ((4, 1), False), ((65, 3, 1000), False)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,hadamard", ROW_CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
)
@pytest.mark.parametrize("backend,device", backend_device_params())
def test_quantize_rows_matches_float64(backend, device, shape, hadamard, dtype):
    x = _rows(shape, dtype, device=device)
    q, s = tg.fp8_quantize_rows(x, hadamard=hadamard, backend=backend)
    _assert_fp8_rows(q, s, x, hadamard)
    q2, s2 = tg.fp8_quantize_rows(x, hadamard=hadamard, backend=backend)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)


def test_quantize_rows_strided_input_and_the_indexer_helpers():
    """A strided ``x`` gives the contiguous copy's result; ``indexer.quantize_rows`` and ``quantize_keys`` are the
    op (the reference recipe: ``hadamard_rotate`` then the cast)."""
    x = _rows((6, 256), torch.bfloat16)[:, ::2]
    q, s = tg.fp8_quantize_rows(x, hadamard=True, backend="pytorch")
    q2, s2 = tg.fp8_quantize_rows(x.contiguous(), hadamard=True, backend="pytorch")
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    q3, s3 = indexer.quantize_rows(indexer.hadamard_rotate(x))
    assert torch.equal(q.view(torch.uint8), q3.view(torch.uint8)) and torch.equal(s, s3)
    k, ks = indexer.quantize_keys(x)
    k2, ks2 = indexer.quantize_rows(x)
    assert torch.equal(k.view(torch.uint8), k2.view(torch.uint8)) and torch.equal(ks, ks2)


def _paged(batch: int, blocks: int, block_kv: int, dim: int, seed: int = 0, device="cpu"):
    """A cache of random bytes and a permuted block table (sequence b's blocks scattered over the cache)."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch * blocks + 3
    cache = torch.randint(0, 256, (num_blocks, block_kv, 1, dim + 4), generator=g, dtype=torch.uint8)
    table = torch.randperm(num_blocks, generator=g)[: batch * blocks].view(batch, blocks).to(torch.int32)
    return cache.to(device), table.to(device)


def _expected_append(cache, table, x, ends, hadamard):
    """The cache after the append, written byte by byte on the CPU from the reference cast."""
    want = cache.cpu().clone()
    batch, count, dim = x.shape
    block_kv = cache.shape[1]
    q, s = tg.fp8_quantize_rows(x.cpu(), hadamard=hadamard, backend="pytorch")
    raw = want.view(want.shape[0], -1)
    for b in range(batch):
        for t in range(count):
            pos = int(ends[b]) - count + t
            blk, slot = int(table[b, pos // block_kv]), pos % block_kv
            raw[blk, slot * dim : (slot + 1) * dim] = q[b, t].view(torch.uint8)
            raw[blk].view(torch.float32)[block_kv * dim // 4 + slot] = s[b, t]
    return want, q, s


APPEND_CASES = [  # (batch, count, ends, block_kv, dim, hadamard)
    (3, 1, [5, 64, 200], 64, 128, True),
    (2, 70, [70, 191], 64, 128, True),
    (1, 3, [3], 16, 64, False),
    (4, 5, [9], 32, 128, True),  # one length for every sequence
    (2, 0, [4, 4], 64, 128, True),
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=lambda c: f"b{c[0]}s{c[1]}kv{c[3]}d{c[4]}{'h' if c[5] else ''}")
@pytest.mark.parametrize("lens_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("backend,device", backend_device_params())
def test_paged_append_writes_its_keys_and_nothing_else(backend, device, lens_dtype, case):
    batch, count, ends, block_kv, dim, hadamard = case
    cache, table = _paged(batch, 4, block_kv, dim, device=device)
    x = _rows((batch, count, dim), torch.bfloat16, seed=1, device=device)
    lens = torch.tensor(ends, dtype=lens_dtype, device=device)
    if len(ends) == 1 and batch > 1:
        lens = lens.reshape(())
    want, q, s = _expected_append(cache, table, x, torch.tensor(ends).expand(batch), hadamard)
    out = tg.fp8_paged_append(x, cache, table, lens, hadamard=hadamard, backend=backend)
    assert out is cache
    if device == "cpu":
        assert torch.equal(cache, want)
    else:  # written exactly where the CPU reference writes; the values the device's cast of the same rows (the
        # rotation's fp32 sums in another order: cuBLAS for pytorch, the tensor cores for cutile)
        changed = cache.cpu() != want
        raw_want = want.view(want.shape[0], -1)
        raw_got = cache.cpu().view(want.shape[0], -1)
        for b in range(batch):
            for t in range(count):
                pos = ends[min(b, len(ends) - 1)] - count + t
                blk, slot = int(table[b, pos // block_kv]), pos % block_kv
                got_q = raw_got[blk, slot * dim : (slot + 1) * dim].view(FP8)
                got_s = raw_got[blk].view(torch.float32)[block_kv * dim // 4 + slot]
                _assert_fp8_rows(got_q[None], got_s.reshape(1), x[b, t : t + 1].cpu(), hadamard)
                changed.view(want.shape[0], -1)[blk, slot * dim : (slot + 1) * dim] = False
                changed.view(want.shape[0], -1)[blk, block_kv * dim + 4 * slot : block_kv * dim + 4 * slot + 4] = False
        assert not changed.any(), "bytes written outside the appended keys"
        assert raw_want.shape == raw_got.shape


def test_paged_append_reads_back_with_the_indexer_helpers():
    """An identity-table cache filled by appends of several sizes reads back (``read_paged_kv_cache``) as
    ``quantize_keys`` of the rotated keys."""
    g = torch.Generator().manual_seed(3)
    batch, dim, total = 2, 64, 150
    keys = torch.randn(batch, total, dim, generator=g).bfloat16()
    cache, table, _ = indexer.build_paged_kv_cache([torch.zeros(total, dim)] * batch, block_kv=64)
    end = 0
    for size in (37, 1, 64, 48):
        end += size
        tg.fp8_paged_append(
            keys[:, end - size : end], cache, table, torch.tensor(end), hadamard=True, backend="pytorch"
        )
    lens = torch.full((batch,), total, dtype=torch.int32)
    for b, (data, scale) in enumerate(indexer.read_paged_kv_cache(cache, table, lens)):
        want = indexer.quantize_keys(indexer.hadamard_rotate(keys[b]))
        assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(scale, want[1])


PREPARE_CASES = [  # (batch, rows, heads, dim, ends, hadamard, mask: None or (dtype, keys))
    (2, 1, 64, 128, [5, 200], True, None),
    (3, 2, 16, 128, [2, 64, 70], True, None),
    (1, 4, 8, 64, [9], False, None),
    (2, 1, 5, 32, [33], True, None),  # 5 heads: query row blocks ragged; one length for both
    (2, 1, 64, 128, [5, 200], True, (torch.bool, 4097)),  # a decode step's mask: rows of 4097 bytes
    (1, 1, 64, 128, [200], True, (torch.bfloat16, 9000)),  # an additive one over two key tiles
    (3, 3, 16, 128, [3, 64, 70], True, (torch.float32, 2500)),  # 3 rows: a tile of 4 rows, two key tiles
    (2, 3, 16, 128, [3, 70], True, (torch.bool, 2048)),  # 3 rows, one tile of 4 x 2048 keys: the ends stored
    (2, 2, 8, 128, [5, 9], True, (torch.bool, 0)),  # no keys: every end 0
    (2, 1, 0, 128, [5, 9], True, (torch.float16, 33)),  # no heads: no query rows to launch for
]


def _mask(batch: int, rows: int, keys: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A ``[B, S, T]`` mask: random visible keys, then row patterns: the first row sees a prefix (causal), the last
    sees nothing, one row only the last key; additive masks hide with ``finfo.min`` or ``-inf`` and show 0 or any
    value above ``min``."""
    g = torch.Generator().manual_seed(batch * 1000 + rows * 10 + keys)
    seen = torch.rand(batch, rows, keys, generator=g) < 0.3
    if keys:
        seen[0, 0] = torch.arange(keys) < keys // 2 + 1
        seen[-1, -1] = False
        if batch * rows > 2:
            seen[1, 0] = torch.arange(keys) == keys - 1
    if dtype == torch.bool:
        return seen.to(device)
    lowest = torch.finfo(dtype).min
    hidden = torch.where(torch.rand(batch, rows, keys, generator=g) < 0.5, lowest, float("-inf"))
    shown = torch.where(torch.rand(batch, rows, keys, generator=g) < 0.5, 0.0, torch.randn(batch, rows, keys))
    return torch.where(seen, shown, hidden).to(dtype).to(device)


@pytest.mark.parametrize(
    "case", PREPARE_CASES, ids=lambda c: f"b{c[0]}s{c[1]}h{c[2]}d{c[3]}{'h' if c[5] else ''}-{c[6] and c[6][1]}"
)
@pytest.mark.parametrize("backend,device", backend_device_params())
def test_indexer_prepare_is_the_append_the_cast_and_the_weights(backend, device, case):
    """``fp8_indexer_prepare`` = ``fp8_paged_append`` of the keys + ``fp8_quantize_rows`` of the queries + the
    weights times ``weight_scale`` times the query scales, on the same backend bit for bit (the kernel runs the ops'
    tile code on the same tiles); the cast within the float64 formula's FP8 rounding; with a mask, its rows' last
    visible key + 1 (no mask: ``None``); a rerun the same bits."""
    batch, rows, heads, dim, ends, hadamard, masked = case
    mask = None if masked is None else _mask(batch, rows, masked[1], masked[0], device)
    cache, table = _paged(batch, 4, 64, dim, device=device)
    q = _rows((batch, rows, heads, dim), torch.bfloat16, seed=3, device=device)
    k = _rows((batch, rows, dim), torch.bfloat16, seed=4, device=device)
    w = torch.randn(batch, rows, heads, generator=torch.Generator().manual_seed(5)).to(device)
    lens = torch.tensor(ends, dtype=torch.int32, device=device)
    if len(ends) == 1 and batch > 1:
        lens = lens.reshape(())
    want_cache = cache.clone()
    tg.fp8_paged_append(k, want_cache, table, lens, hadamard=hadamard, backend=backend)
    want_q, want_s = tg.fp8_quantize_rows(q, hadamard=hadamard, backend=backend)
    kw = dict(hadamard=hadamard, weight_scale=0.3, attention_mask=mask, backend=backend)
    q8, w8, window_ends = tg.fp8_indexer_prepare(q, k, w, cache, table, lens, **kw)
    assert q8.shape == q.shape and q8.dtype == FP8 and w8.shape == w.shape and w8.dtype == torch.float32
    assert torch.equal(cache, want_cache)
    assert torch.equal(q8.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(w8, w * 0.3 * want_s)
    if heads:
        _assert_fp8_rows(q8.cpu(), (w8 / (w * 0.3)).cpu(), q.cpu(), hadamard)
    if mask is None:
        assert window_ends is None
    else:
        assert window_ends.dtype == torch.int32 and window_ends.device == q.device
        assert torch.equal(window_ends.cpu(), window_ends_float64(mask))
    again = tg.fp8_indexer_prepare(q, k, w, cache.clone(), table, lens, **kw)
    assert torch.equal(again[0].view(torch.uint8), q8.view(torch.uint8)) and torch.equal(again[1], w8)
    assert (again[2] is None) if mask is None else torch.equal(again[2], window_ends)


DECODE_PREPARE_CASES = [  # (batch, rows, heads, weights dtype, mask: None or (dtype, keys))
    (1, 1, 64, torch.float32, (torch.bool, 4097)),  # a decode step: one tile of 8192 keys
    (2, 1, 64, torch.float32, (torch.bfloat16, 9000)),  # two key tiles in turn
    (3, 3, 5, torch.bfloat16, (torch.float32, 2500)),  # tiles of 4 rows and 2048 keys; 5 heads (padded to 8)
    (2, 4, 64, torch.float16, (torch.bool, 70000)),  # 35 key tiles
    (2, 2, 8, torch.float32, (torch.bool, 0)),  # no keys: every end 0
    (2, 1, 64, torch.float32, None),
    (2, 1, 0, torch.float32, (torch.bool, 33)),  # no heads: the ends alone
]


@pytest.mark.parametrize(
    "case", DECODE_PREPARE_CASES, ids=lambda c: f"b{c[0]}s{c[1]}h{c[2]}{str(c[3])[6:]}-{c[4] and c[4][1]}"
)
@pytest.mark.parametrize("backend,device", backend_device_params())
def test_indexer_decode_prepare_is_the_weights_and_the_ends(backend, device, case):
    """``indexer_decode_prepare``: ``weights * weight_scale`` in fp32 bit for bit (torch's multiply), each mask row's
    last visible key + 1 as the float64 product gives it (``None`` without a mask), the same bits on a rerun."""
    batch, rows, heads, dtype, masked = case
    w = torch.randn(batch, rows, heads, generator=torch.Generator().manual_seed(heads)).to(dtype).to(device)
    mask = None if masked is None else _mask(batch, rows, masked[1], masked[0], device)
    got, ends = tg.indexer_decode_prepare(w, mask, weight_scale=0.07, backend=backend)
    assert got.dtype == torch.float32 and got.shape == w.shape and torch.equal(got, w.float() * 0.07)
    if mask is None:
        assert ends is None
    else:
        assert (
            ends.dtype == torch.int32 and ends.device == w.device and torch.equal(ends.cpu(), window_ends_float64(mask))
        )
    again = tg.indexer_decode_prepare(w, mask, weight_scale=0.07, backend=backend)
    assert torch.equal(again[0], got) and ((again[1] is None) if mask is None else torch.equal(again[1], ends))


@pytest.mark.parametrize(
    "args,error,message",
    [
        ((torch.ones(2, 1, 4, dtype=torch.int32), None), TypeError, "weights"),
        ((torch.ones(2, 4), None), ValueError, "weights"),
        ((torch.ones(2, 1, 4), torch.ones(2, 1, 9, dtype=torch.int64)), TypeError, "attention_mask"),
        ((torch.ones(2, 1, 4), torch.ones(2, 2, 9, dtype=torch.bool)), ValueError, "expected \\[B=2, S=1, T\\]"),
        ((torch.ones(2, 1, 4), [[True]]), TypeError, "attention_mask"),
    ],
)
def test_indexer_decode_prepare_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        tg.indexer_decode_prepare(*args)
    with pytest.raises(ValueError, match="weight_scale"):
        tg.indexer_decode_prepare(torch.ones(2, 1, 4), weight_scale=float("inf"))


@pytest.mark.parametrize("backend,device", backend_device_params())
def test_indexer_prepare_without_keys(backend, device):
    """No keys to append (``k`` of 0 tokens): the queries and weights as ``fp8_quantize_rows`` gives them, the cache
    untouched."""
    cache, table = _paged(2, 2, 64, 128, device=device)
    q = _rows((2, 1, 64, 128), torch.bfloat16, seed=6, device=device)
    k = torch.zeros(2, 0, 128, dtype=torch.bfloat16, device=device)
    w = torch.randn(2, 1, 64, generator=torch.Generator().manual_seed(7)).to(device)
    lens = torch.tensor([5, 70], dtype=torch.int32, device=device)
    before = cache.clone()
    q8, w8, _ = tg.fp8_indexer_prepare(q, k, w, cache, table, lens, hadamard=True, weight_scale=2.0, backend=backend)
    want_q, want_s = tg.fp8_quantize_rows(q, hadamard=True, backend=backend)
    assert torch.equal(cache, before) and torch.equal(q8.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(w8, w * 2.0 * want_s)


def _prepare_args(**over):
    cache, table = _paged(2, 2, 64, 128)
    args = dict(q=torch.randn(2, 1, 4, 128).bfloat16(), k=torch.randn(2, 1, 128).bfloat16())
    args.update(weights=torch.ones(2, 1, 4))
    args.update(kv_cache=cache, block_table=table, context_lens=torch.tensor([3, 100], dtype=torch.int32))
    args.update(over)
    return args


def _append_args(**over):
    cache, table = _paged(2, 2, 64, 128)
    args = dict(x=torch.randn(2, 3, 128).bfloat16(), kv_cache=cache, block_table=table)
    args.update(context_lens=torch.tensor([3, 100], dtype=torch.int32), hadamard=True)
    args.update(over)
    return args


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda: tg.fp8_quantize_rows([1.0, 2.0]), TypeError, "x"),
        (lambda: tg.fp8_quantize_rows(torch.ones(3, 4, dtype=torch.int32)), TypeError, "x"),
        (lambda: tg.fp8_quantize_rows(torch.ones(3, 96), hadamard=True), ValueError, "power of two"),
        (lambda: tg.fp8_quantize_rows(torch.ones(3, 0)), ValueError, "D >= 1"),
        (lambda: tg.fp8_quantize_rows(torch.ones(3, 4), hadamard=1), TypeError, "hadamard"),
        (lambda: tg.fp8_paged_append(**_append_args(x=torch.randn(2, 3, 64))), ValueError, "kv_cache"),
        (lambda: tg.fp8_paged_append(**_append_args(x=torch.randn(3, 3, 128))), ValueError, "block_table"),
        (lambda: tg.fp8_paged_append(**_append_args(kv_cache=torch.zeros(5, 64, 1, 132))), TypeError, "kv_cache"),
        (lambda: tg.fp8_paged_append(**_append_args(block_table=torch.zeros(2, 2))), TypeError, "block_table"),
        (lambda: tg.fp8_paged_append(**_append_args(context_lens=torch.tensor([3.0, 4.0]))), TypeError, "context_lens"),
        (lambda: tg.fp8_paged_append(**_append_args(context_lens=torch.tensor([3, 4, 5]))), ValueError, "context_lens"),
        (lambda: tg.fp8_paged_append(**_append_args(context_lens=torch.tensor([2, 9]))), ValueError, "ends at 2"),
        (lambda: tg.fp8_paged_append(**_append_args(context_lens=torch.tensor([3, 129]))), ValueError, "ends at 129"),
        (
            lambda: tg.fp8_paged_append(**_append_args(block_table=torch.tensor([[0, 1], [2, 99]], dtype=torch.int32))),
            ValueError,
            "block 99",
        ),
    ],
)
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(
    "over,error,message",
    [
        (dict(q=torch.randn(2, 1, 128)), ValueError, "q"),
        (dict(q=torch.randn(2, 1, 4, 64)), ValueError, "k: got shape"),
        (dict(q=torch.randn(2, 1, 4, 96), k=torch.randn(2, 1, 96)), ValueError, "power of two"),
        (dict(weights=torch.ones(2, 1, 5)), ValueError, "weights"),
        (dict(weights=torch.ones(2, 1, 4, dtype=torch.int32)), TypeError, "weights"),
        (dict(k=torch.randn(3, 1, 128)), ValueError, "k"),
        (dict(k=torch.randn(2, 1, 128, dtype=torch.float64)), TypeError, "k"),
        (dict(weight_scale=float("nan")), ValueError, "weight_scale"),
        (dict(weight_scale="2"), TypeError, "weight_scale"),
        (dict(context_lens=torch.tensor([0, 9])), ValueError, "ends at 0"),
        (dict(kv_cache=torch.zeros(5, 64, 1, 68, dtype=torch.uint8)), ValueError, "kv_cache"),
        (dict(attention_mask=torch.ones(2, 1, 9, dtype=torch.int32)), TypeError, "attention_mask"),
        (dict(attention_mask=torch.ones(2, 9, dtype=torch.bool)), ValueError, "attention_mask"),
        (dict(attention_mask=torch.ones(2, 2, 9, dtype=torch.bool)), ValueError, "expected \\[B=2, S=1, T\\]"),
        (dict(attention_mask=[[True]]), TypeError, "attention_mask"),
    ],
    ids=lambda v: ",".join(v) if isinstance(v, dict) else None,
)
def test_indexer_prepare_bad_input(over, error, message):
    with pytest.raises(error, match=message):
        tg.fp8_indexer_prepare(**_prepare_args(**over), hadamard=True)


# ------------------------------------------------------------------------------ cutile host path (launches recorded)


def test_each_call_is_one_launch(launches):
    """The row cast: one launch over row blocks; the append: one launch over (row blocks, sequences), the lengths
    as given (one length: index 0); the schedule: one CTA; past the kernels' rows, the reference's error."""
    from tilegemm.ops.cutile import mqa_prep

    x = torch.randn(3, 70, 128).bfloat16()
    tg.fp8_quantize_rows(x, hadamard=True, backend="cutile")
    grid, kernel, args = launches[-1]
    assert grid == (14, 1, 1) and kernel is mqa_prep.get_kernel("quantize_rows") and args[0].shape == (210, 128)
    cache, table = _paged(3, 2, 64, 128)
    tg.fp8_paged_append(x[:, :2], cache, table, torch.tensor(66), hadamard=True, backend="cutile")
    grid, kernel, args = launches[-1]
    assert grid == (1, 3, 1) and kernel is mqa_prep.get_kernel("paged_append") and args[2].shape == (1,)
    assert args[-2] is False and args[-1] == 64  # PER_SEQUENCE, BLOCK_KV
    meta = tg.get_paged_mqa_logits_metadata(torch.tensor([5, 300], dtype=torch.int32), 64, 7, backend="cutile")
    grid, kernel, args = launches[-1]
    assert grid == (1, 1, 1) and kernel is mqa_prep.get_kernel("paged_schedule") and args[1] is meta
    assert meta.shape == (8, 2) and len(launches) == 3
    q = torch.randn(3, 1, 40, 128).bfloat16()  # 40 query rows a sequence: 3 row blocks, then 1 of keys
    tg.fp8_indexer_prepare(q, x[:, :1], torch.ones(3, 1, 40), cache, table, torch.tensor(66), backend="cutile")
    grid, kernel, args = launches[-1]
    assert grid == (4, 3, 1) and kernel is mqa_prep.get_kernel("indexer_prepare") and args[0].shape == (3, 40, 128)
    assert tuple(args[-6:]) == (False, 64, mqa_prep.MASK_NONE, 1, 8192, False) and len(launches) == 4
    mask = torch.rand(3, 1, 4097) < 0.5  # one tile of 8192 keys a sequence first: grid 1 + 3 + 1; its ends stored
    _, _, ends = tg.fp8_indexer_prepare(q, x[:, :1], torch.ones(3, 1, 40), cache, table, torch.tensor(66),
                                        attention_mask=mask, backend="cutile")  # fmt: skip
    grid, kernel, args = launches[-1]
    assert grid == (5, 3, 1) and args[10].dtype == torch.uint8 and args[10].shape == mask.shape and args[11] is ends
    assert ends.dtype == torch.int32 and ends.shape == (3, 1)
    assert tuple(args[-4:]) == (mqa_prep.MASK_BOOL, 1, 8192, True) and args[-12] == 0.0  # bool: no mask_min read
    q3 = torch.randn(3, 3, 8, 128).bfloat16()  # 3 rows: tiles of 4 x 2048, 5 over 9000 keys; 24 query rows: 2 blocks
    mask = torch.zeros(3, 3, 9000, dtype=torch.bfloat16)
    _, _, ends = tg.fp8_indexer_prepare(q3, x[:, :3], torch.ones(3, 3, 8), cache, table, torch.tensor(66),
                                        attention_mask=mask, backend="cutile")  # fmt: skip
    grid, kernel, args = launches[-1]
    assert grid == (5 + 2 + 1, 3, 1) and tuple(args[-4:]) == (mqa_prep.MASK_ADDITIVE, 4, 2048, False)
    assert args[-12] == torch.finfo(torch.bfloat16).min and args[10] is mask and len(launches) == 6
    assert args[11] is ends and not ends.any()  # zeroed for the tiles' atomics (the launch is recorded)
    w, ends = tg.indexer_decode_prepare(torch.ones(3, 1, 40), mask[:, :1] > 0, backend="cutile")  # 2 tiles of 8192
    grid, kernel, args = launches[-1]
    assert grid == (3, 1, 1) and kernel is mqa_prep.get_kernel("decode_prepare") and args[2] is w and args[3] is ends
    assert tuple(args[-4:]) == (1, 64, mqa_prep.MASK_BOOL, 8192) and len(launches) == 7
    tg.indexer_decode_prepare(torch.ones(3, 3, 40), mask, weight_scale=0.5, backend="cutile")  # rows in one block
    grid, kernel, args = launches[-1]
    assert grid == (3, 1, 1) and tuple(args[-6:]) == (0.5, torch.finfo(torch.bfloat16).min, 4, 64, 2, 2048)
    with pytest.raises(RuntimeError, match="rotated rows of a power of two up to 128"):  # fallback disabled
        tg.fp8_quantize_rows(torch.randn(2, 256), hadamard=True, backend="cutile")


MASKS = {
    "none": lambda: None,
    "bool": lambda: torch.rand(2, 3, 40) < 0.5,
    "additive": lambda: torch.zeros(2, 3, 40, dtype=torch.bfloat16),
    "strided bool": lambda: (torch.rand(2, 40, 3) < 0.5).transpose(1, 2),
    "no keys": lambda: torch.ones(2, 3, 0, dtype=torch.bool),
}


@pytest.mark.parametrize("runs", [True, False], ids=["rows", "no rows"])
@pytest.mark.parametrize("name", list(MASKS))
def test_mask_inputs_kind_and_operands(name, runs):
    """What both prepare plans hand their kernel of a mask (``mqa_prep.mask_inputs``): ``MASK_NONE`` without a
    mask, without query rows (no launch) or without keys (every end 0), with placeholders for the mask and ends;
    else the mask contiguous, a boolean one as uint8 bytes, and the ends given; ``mask_min`` the additive mask's
    dtype minimum (a key is visible above it), 0 otherwise."""
    pytest.importorskip("cuda.tile")
    from tilegemm.ops.cutile import mqa_prep

    mask = MASKS[name]()
    masking = mqa_prep.mask_inputs(mask, runs, torch.device("cpu"))
    ends = torch.empty(2, 3, dtype=torch.int32)
    passed_mask, passed_ends = masking.operands(mask, ends)
    if not runs or name in ("none", "no keys"):
        assert masking.kind == mqa_prep.MASK_NONE and masking.mask_min == 0.0
        assert passed_mask is masking.no_mask and passed_ends is masking.no_ends
        return
    additive = name == "additive"
    assert masking.kind == (mqa_prep.MASK_ADDITIVE if additive else mqa_prep.MASK_BOOL)
    assert masking.mask_min == (torch.finfo(torch.bfloat16).min if additive else 0.0)
    assert passed_ends is ends and passed_mask.is_contiguous() and passed_mask.shape == mask.shape
    assert passed_mask.dtype == (torch.bfloat16 if additive else torch.uint8)
    assert torch.equal(passed_mask.bool() if not additive else passed_mask, mask)
    assert (passed_mask is mask) == additive  # an additive contiguous mask as given; a boolean one viewed as bytes


@pytest.mark.parametrize("rows,keys,stored", [(1, 8192, True), (1, 8193, False), (4, 2048, True), (3, 2049, False)])
def test_prepare_ends_stored_where_one_tile_spans_the_keys(launches, rows, keys, stored):
    """Up to one mask tile's keys a row (8,192 at one query row, 2,048 at up to four) the prepare kernel stores the
    ends (``MASK_STORE``; the output uninitialised before the launch, one mask CTA a row block); past that its tiles
    combine by atomics into ends zeroed first (one CTA a tile)."""
    from tilegemm.ops.cutile import mqa_prep

    q, k = torch.randn(2, rows, 8, 128).bfloat16(), torch.randn(2, rows, 128).bfloat16()
    cache, table = _paged(2, 2, 64, 128)
    mask = torch.ones(2, rows, keys, dtype=torch.bool)
    _, _, ends = tg.fp8_indexer_prepare(q, k, torch.ones(2, rows, 8), cache, table, torch.tensor(66),
                                        attention_mask=mask, backend="cutile")  # fmt: skip
    grid, _, args = launches[-1]
    tile_rows, tile_cols = (1, 8192) if rows == 1 else (4, 2048)
    mask_ctas = -(-rows // tile_rows) * -(-keys // tile_cols)
    query_ctas, key_ctas = -(-rows * 8 // 16), -(-rows // 16)
    assert args[-1] is stored and args[11] is ends and grid == (mask_ctas + query_ctas + key_ctas, 2, 1)
    assert mask_ctas == (1 if stored else 2) and mqa_prep.ends_stored(mqa_prep.MASK_BOOL, rows, keys) is stored
    if not stored:
        assert not ends.any()  # zeroed for the atomics (the launch is recorded, not run)


# ------------------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu


@gpu
def test_gpu_kernels_and_reference_agree(monkeypatch):
    """The cutile cast of the indexer's rows (64 heads of 128, bf16) against the reference: scales within fp32
    rounding, FP8 values equal or neighbours (the rotation's sums in another order), equal in nearly all."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    x = _rows((4, 3, 64, 128), torch.bfloat16, seed=5, device="cuda")
    q, s = tg.fp8_quantize_rows(x, hadamard=True, backend="cutile")
    q_ref, s_ref = tg.fp8_quantize_rows(x, hadamard=True, backend="pytorch")
    assert torch.allclose(s, s_ref, rtol=1e-6, atol=0)
    a, b = q.float(), q_ref.float()
    assert (a == b).float().mean() > 0.999
    step = (b.abs() * 2**-3).clamp_min(2**-9)
    assert ((a - b).abs() <= step * 1.01).all()


@gpu
def test_gpu_append_in_a_cuda_graph(monkeypatch):
    """A decode step's append captured with its lengths on the device: each replay writes the next position (the
    lengths advanced between replays), the bytes the eager call writes."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    cache, table = _paged(2, 3, 64, 128, device="cuda")
    eager_cache = cache.clone()
    x = _rows((2, 1, 128), torch.bfloat16, seed=2, device="cuda")
    lens = torch.tensor([10, 100], dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tg.fp8_paged_append(x, cache.clone(), table, lens, hadamard=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tg.fp8_paged_append(x, cache, table, lens, hadamard=True)
    for _ in range(3):
        lens += 1
        graph.replay()
        tg.fp8_paged_append(x, eager_cache, table, lens.clone(), hadamard=True)
    torch.cuda.synchronize()
    assert torch.equal(cache, eager_cache)


@gpu
@pytest.mark.parametrize("next_n", [0, 1, 2, 3])
@pytest.mark.parametrize("num_sms", [1, 7, 132, 255])
def test_gpu_schedule_kernel_is_the_reference(monkeypatch, next_n, num_sms):
    """Lengths of 0 to 70k keys over 1 to 300 sequences (several of the kernel's chunks), 1-D and 2-D."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    g = torch.Generator().manual_seed(num_sms * 10 + next_n)
    for batch in (1, 5, 16, 17, 300):
        shape = (batch,) if next_n == 1 else (batch, next_n)
        lens = torch.randint(0, 70000, shape, generator=g, dtype=torch.int32)
        lens[torch.rand(shape, generator=g) < 0.3] = 0
        lens = lens.cuda()
        for block_kv in (64, 32):
            got = tg.get_paged_mqa_logits_metadata(lens, block_kv, num_sms, backend="cutile")
            assert torch.equal(got, paged_mqa_schedule(lens, block_kv, num_sms)), (batch, block_kv)
