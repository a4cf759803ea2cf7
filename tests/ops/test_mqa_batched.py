"""``mqa_logits_batched``: the MQA logits of ``B`` sequences in one call, each sequence against its own keys.

CPU: the reference against the float64 formula and against the ragged ops per sequence (bit for bit), bad input,
and the cutile host path with ``cuda.tile.launch`` recorded (one launch of the batched decode kernel for a decode
step, the ragged path per sequence otherwise; the hot lane's replay). GPU (``gpu`` marks): the batched kernel's
logits inside every window are the per-sequence decode kernel's bit for bit, also from a CUDA graph. The kernel's
machine code is read by the compile gate (``tests/compile_gate/test_compile_mqa.py``).
"""

from __future__ import annotations

import pytest
import torch

import tilegemm as tg
from tilegemm.ops import checks
from tilegemm.testing import calc_diff

FP8 = torch.float8_e4m3fn


def _operands(dtype: str, batch: int, rows: int, keys: int, heads: int = 4, dim: int = 32, seed: int = 0, device="cpu"):
    """``(q, kv, weights, ks, ke)`` of a batched call: windows anywhere inside ``[0, keys]``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, rows, heads, dim, generator=g)
    k = torch.randn(batch, keys, dim, generator=g)
    w = torch.randn(batch, rows, heads, generator=g)
    ks = torch.randint(0, keys + 1, (batch, rows), generator=g, dtype=torch.int32)
    ke = torch.minimum(
        ks + torch.randint(0, keys + 1, (batch, rows), generator=g, dtype=torch.int32), torch.tensor(keys)
    )
    ke = ke.to(torch.int32)
    if dtype == "bf16":
        kv = k.bfloat16().to(device)
        q = q.bfloat16()
    else:
        kv = (k.to(FP8).to(device), (torch.rand(batch, keys, generator=g) + 0.5).to(device))
        q = q.to(FP8)
    return q.to(device), kv, w.to(device), ks.to(device), ke.to(device)


def _exact(q, kv, w, ks, ke) -> torch.Tensor:
    """The formula in float64 on the operands' values, ``-inf`` outside each window: [B, S, T]."""
    keys, scale = (kv, None) if not isinstance(kv, tuple) else kv
    scores = torch.einsum("bshd,btd->bsht", q.double().cpu(), keys.double().cpu()).relu()
    logits = torch.einsum("bsh,bsht->bst", w.double().cpu(), scores)
    if scale is not None:
        logits = logits * scale.double().cpu()[:, None, :]
    cols = torch.arange(logits.shape[-1])
    inside = (cols >= ks.cpu()[..., None]) & (cols < ke.cpu()[..., None])
    return torch.where(inside, logits, float("-inf"))


def _per_sequence(q, kv, w, ks, ke, clean=True, backend="pytorch") -> torch.Tensor:
    op = tg.bf16_mqa_logits if not isinstance(kv, tuple) else tg.fp8_mqa_logits
    keys = (kv if not isinstance(kv, tuple) else kv[0]).shape[1]
    parts = [torch.empty(0, q.shape[1], keys, device=q.device)]
    for b in range(q.shape[0]):
        kv_b = kv[b] if not isinstance(kv, tuple) else (kv[0][b], kv[1][b])
        parts.append(op(q[b], kv_b, w[b], ks[b], ke[b], clean, backend=backend)[None])
    return torch.cat(parts)


SHAPES = [(1, 1, 50), (3, 1, 77), (2, 4, 129), (4, 3, 1), (0, 2, 10), (2, 0, 10), (2, 2, 0)]  # (B, S, T)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_matches_float64_and_the_ragged_ops(dtype, shape):
    args = _operands(dtype, *shape)
    out = tg.mqa_logits_batched(*args, backend="pytorch")
    assert out.shape == shape and out.dtype == torch.float32
    want = _exact(*args)
    assert torch.equal(torch.isneginf(out), torch.isneginf(want))
    finite = torch.isfinite(want)
    if finite.any():
        assert calc_diff(out[finite].double(), want[finite]) < 1e-9
    assert torch.equal(out, _per_sequence(*args))
    unclean = tg.mqa_logits_batched(*args, False, backend="pytorch")
    assert torch.equal(unclean[finite], out[finite])


def _bad(dtype="bf16", **change):
    q, kv, w, ks, ke = _operands(dtype, 2, 3, 40)
    args = dict(q=q, kv=kv, weights=w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke)
    args.update(change)
    return args


@pytest.mark.parametrize(
    "args,error,message",
    [
        (_bad(q=torch.randn(2, 3, 4, 32)), TypeError, "q"),
        (_bad(q=torch.randn(3, 4, 32).bfloat16()), ValueError, "q"),
        (_bad(kv=(torch.randn(2, 40, 32).bfloat16(), torch.ones(2, 40))), TypeError, "kv"),
        (_bad(kv=torch.randn(3, 40, 32).bfloat16()), ValueError, "kv"),
        (_bad("fp8", kv=torch.randn(2, 40, 32).to(FP8)), TypeError, "kv"),
        (_bad("fp8", kv=(torch.randn(2, 40, 32).to(FP8), torch.ones(2, 41))), ValueError, r"kv\[1\]"),
        (_bad(weights=torch.randn(2, 3, 4).bfloat16()), TypeError, "weights"),
        (_bad(cu_seq_len_k_end=torch.full((2, 3), 41, dtype=torch.int32)), ValueError, "cu_seq_len_k_end"),
        (_bad(cu_seq_len_k_start=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "cu_seq_len_k_start"),
        (_bad(cu_seq_len_k_start=torch.zeros(6, dtype=torch.int32)), ValueError, "cu_seq_len_k_start"),
        (_bad(clean_logits=1), TypeError, "clean_logits"),
    ],
)
def test_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        tg.mqa_logits_batched(**args, backend="pytorch")


# ------------------------------------------------------------------------------ cutile host path (launches recorded)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_decode_step_is_one_launch_of_the_batched_kernel(launches, dtype):
    """8 sequences of one query row over 16384 keys (64 heads of 128): one launch, grid ``(1, parts, 8)``, the
    ``parts`` spread over all eight sequences (fewer than one sequence's); the hot lane replays it on new
    tensors."""
    from tilegemm.heuristics import cutile as heuristics
    from tilegemm.ops.cutile import mqa_decode_kernels

    for seed in range(3):
        q, kv, w, ks, ke = _operands(dtype, 8, 1, 16384, heads=64, dim=128, seed=seed)
        out = tg.mqa_logits_batched(q, kv, w, ks, ke, False, backend="cutile")
        assert out.shape == (8, 1, 16384)
    assert len(launches) == 3
    base = heuristics.bf16_mqa_logits_config(64, 128) if dtype == "bf16" else heuristics.mqa_logits_config(64, 128)
    conf = heuristics.mqa_decode_config(base, 1, 16384, 132, 90, 8)
    single = heuristics.mqa_decode_config(base, 1, 16384, 132, 90)
    assert conf.parts < single.parts
    last = launches[-1][2]  # the replay launched on the last call's own operands
    assert last[0] is q and last[3] is w and last[4] is ks and last[5] is ke
    if dtype == "fp8":
        assert last[1] is kv[0] and last[2] is kv[1]
    else:
        assert last[1] is kv and bool((last[2] == 1).all()) and last[2].shape == (8, 16384)
    for grid, kernel, args in launches:
        assert grid == (1, conf.parts, 8) and args[6].shape == (8, 1, 16384)
        assert kernel is mqa_decode_kernels.decode_batched_kernel_for(conf.occupancy)
        assert args[7:] == mqa_decode_kernels.decode_constants(conf, 128)


def test_the_hot_lane_skips_the_check(launches, monkeypatch):
    checked = []
    original = checks.mqa._stream
    monkeypatch.setattr(checks.mqa, "_stream", lambda stream: checked.append(1) or original(stream))
    for seed in range(3):
        tg.mqa_logits_batched(*_operands("bf16", 4, 1, 4096, heads=64, dim=128, seed=seed), backend="cutile")
    assert len(checked) == 1 and len(launches) == 3


def test_prefill_runs_the_ragged_path_per_sequence(launches):
    """Rows that take the plain kernel (a prefill): the ragged op's launches, per sequence, into the batch's rows."""
    from tilegemm.ops.cutile import mqa_kernels

    q, kv, w, ks, ke = _operands("bf16", 3, 64, 4096, heads=64, dim=128)
    out = tg.mqa_logits_batched(q, kv, w, ks, ke, backend="cutile")
    assert out.shape == (3, 64, 4096)
    assert len(launches) == 6  # the plain kernel and the clean kernel, per sequence
    for b in range(3):
        (_, plain, args), (_, clean, _) = launches[2 * b : 2 * b + 2]
        assert clean is mqa_kernels.mqa_clean_logits_kernel and plain is not clean
        assert args[0].data_ptr() == q[b].data_ptr() and args[6].shape == (64, 4096)


def test_the_indexer_scores_a_decode_step_in_one_call(monkeypatch):
    """``index_scores`` over 3 sequences, decode-sized (forced here: on the CPU the chooser keeps the ragged path):
    one ``mqa_logits_batched`` call, the same scores as the per-sequence path."""
    from tilegemm import indexer
    from tilegemm.ops import api

    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 1, 4, 32, generator=g).bfloat16()
    k = torch.randn(3, 50, 32, generator=g).bfloat16()
    w = torch.randn(3, 1, 4, generator=g)
    mask = torch.rand(3, 1, 50, generator=g) > 0.3
    calls = []
    original = api.mqa_logits_batched
    monkeypatch.setattr(api, "mqa_logits_batched", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    for fp8 in (False, True):
        calls.clear()
        monkeypatch.delenv("TILEGEMM_MQA_VARIANT", raising=False)
        ragged = indexer.index_scores(q, k, w, mask, 0.25, fp8=fp8)
        assert calls == []
        monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")
        batched = indexer.index_scores(q, k, w, mask, 0.25, fp8=fp8)
        assert calls == [1]
        assert torch.equal(batched, ragged)


# ------------------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("batch,rows,keys", [(1, 1, 4096), (8, 1, 16385), (3, 2, 5000), (32, 1, 4096)])
def test_gpu_batched_kernel_gives_the_decode_kernels_bits(monkeypatch, dtype, batch, rows, keys):
    """Inside every window the batched kernel's logits are the per-sequence decode kernel's bit for bit (the same
    tile math); with ``clean_logits`` every other element is ``-inf``; within the design's bar of float64."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")
    args = _operands(dtype, batch, rows, keys, heads=64, dim=128, device="cuda")
    out = tg.mqa_logits_batched(*args, backend="cutile")
    ref = _per_sequence(*args, backend="cutile")
    assert torch.equal(out, ref)
    want = _exact(*args)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isneginf(out.cpu()), ~finite)
    assert calc_diff(out.cpu()[finite].double(), want[finite]) < 1e-5


@gpu
def test_gpu_batched_kernel_in_a_cuda_graph(monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    args = _operands("bf16", 8, 1, 8192, heads=64, dim=128, device="cuda")
    eager = tg.mqa_logits_batched(*args, False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tg.mqa_logits_batched(*args, False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = tg.mqa_logits_batched(*args, False)
    graph.replay()
    torch.cuda.synchronize()
    inside = torch.isfinite(_exact(*args)).cuda()
    assert torch.equal(replayed[inside], eager[inside])
