"""BF16 MQA logits (``bf16_mqa_logits``): the indexer's scores on bf16 inputs, no quantization.

Logits are compared with the float64 formula on the same bf16 values inside each row's window (``calc_diff <
1e-6``, fp32 output: the bf16 products are exact in fp32, only the fp32 sums round); with ``clean_logits`` the
``-inf`` mask is exactly the complement of the windows; reruns are bitwise equal. Bad input raises before any
kernel runs, naming the argument.
"""

from __future__ import annotations

import pytest
import torch

import tilegemm as tg
from tilegemm.ops.reference import _common
from tilegemm.testing import backend_device_params, calc_diff

BACKENDS = backend_device_params()


def _logits64(q: torch.Tensor, kv: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 ``sum_h w[i, h] * relu(q[i, h] . kv[j])``: q [S, H, D], kv [S_kv, D], w [S, H] -> [S, S_kv]."""
    scores = torch.einsum("ihd,jd->ihj", q.double(), kv.double()).clamp(min=0)
    return torch.einsum("ih,ihj->ij", w.double(), scores)


def _windows(s: int, s_kv: int, kind: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "causal":  # the indexer's prefill: the queries are the last s of s_kv tokens
        end = torch.arange(s) + (s_kv - s) + 1
        start = torch.zeros_like(end)
    else:  # random windows, one empty, one full
        a, b = torch.randint(0, s_kv + 1, (s,)), torch.randint(0, s_kv + 1, (s,))
        start, end = torch.minimum(a, b), torch.maximum(a, b)
        start[0], end[0] = 0, s_kv
        if s > 2:
            start[1] = end[1] = s_kv // 2
    return start.to(torch.int32).to(device), end.to(torch.int32).to(device)


# (S, H, D, S_kv): one query (decode), odd sizes, the indexers' heads (32, 64) at D = 128.
SHAPES = [(1, 4, 64, 100), (33, 8, 128, 257), (64, 64, 128, 200), (17, 32, 128, 130), (5, 16, 32, 7)]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "raw"])
@pytest.mark.parametrize("windows", ["causal", "random"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_mqa_logits(backend, device, shape, windows, clean):
    s, h, dim, s_kv = shape
    torch.manual_seed(43)
    q = torch.randn(s, h, dim, device=device).bfloat16()
    kv = torch.randn(s_kv, dim, device=device).bfloat16()
    weights = torch.randn(s, h, device=device)
    ks, ke = _windows(s, s_kv, windows, device)
    logits = tg.bf16_mqa_logits(q, kv, weights, ks, ke, clean_logits=clean, backend=backend)
    assert logits.shape == (s, s_kv) and logits.dtype == torch.float32 and logits.device == q.device
    cols = torch.arange(s_kv, device=device)
    inside = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    if clean:
        assert torch.equal(torch.isneginf(logits), ~inside), "-inf mask differs from the windows"
    assert torch.isfinite(logits[inside]).all()
    ref = _logits64(q, kv, weights)
    assert calc_diff(logits[inside], ref[inside]) < 1e-6
    again = tg.bf16_mqa_logits(q, kv, weights, ks, ke, clean_logits=clean, backend=backend)
    assert torch.equal(again[inside], logits[inside])


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_bf16_mqa_logits_compressed_and_bf16_out(backend, device):
    """``max_seqlen_k > 0`` gives ``out[i, j] = logits[i, ks[i] + j]``; bf16 logits are the fp32 ones rounded once."""
    torch.manual_seed(44)
    s, h, dim, s_kv = 20, 8, 64, 90
    q = torch.randn(s, h, dim, device=device).bfloat16()
    kv = torch.randn(s_kv, dim, device=device).bfloat16()
    weights = torch.randn(s, h, device=device)
    ke = torch.randint(1, s_kv + 1, (s,), device=device, dtype=torch.int32)
    ks = (ke - 30).clamp(min=0).to(torch.int32)
    full = tg.bf16_mqa_logits(q, kv, weights, ks, ke, backend=backend)
    packed = tg.bf16_mqa_logits(q, kv, weights, ks, ke, max_seqlen_k=30, backend=backend)
    assert packed.shape == (s, 30)
    for i in range(s):
        n = int(ke[i] - ks[i])
        assert torch.equal(packed[i, :n], full[i, int(ks[i]) : int(ke[i])])
        assert torch.isneginf(packed[i, n:]).all()
    low = tg.bf16_mqa_logits(q, kv, weights, ks, ke, logits_dtype=torch.bfloat16, backend=backend)
    assert low.dtype == torch.bfloat16 and torch.equal(low, full.bfloat16())


def test_bf16_mqa_logits_reference_chunks(monkeypatch, elementwise_reference_matmul):
    """Row chunking of the reference (forced to one row per chunk: bounded memory at any S_kv) gives the same bits,
    with a matmul whose rows do not depend on each other (a BLAS GEMM's summation order may follow the sizes)."""
    torch.manual_seed(45)
    s, h, dim, s_kv = 9, 4, 64, 70
    q, kv, weights = torch.randn(s, h, dim).bfloat16(), torch.randn(s_kv, dim).bfloat16(), torch.randn(s, h)
    ks, ke = _windows(s, s_kv, "random", "cpu")
    whole = tg.bf16_mqa_logits(q, kv, weights, ks, ke, backend="pytorch")
    monkeypatch.setattr(_common, "CHUNK_BYTES", 1)
    assert torch.equal(whole, tg.bf16_mqa_logits(q, kv, weights, ks, ke, backend="pytorch"))


def _good():
    s, h, dim, s_kv = 3, 4, 32, 6
    return dict(
        q=torch.randn(s, h, dim).bfloat16(),
        kv=torch.randn(s_kv, dim).bfloat16(),
        weights=torch.randn(s, h),
        cu_seq_len_k_start=torch.zeros(s, dtype=torch.int32),
        cu_seq_len_k_end=torch.full((s,), s_kv, dtype=torch.int32),
    )


BAD = [
    ("q", lambda a: a["q"].float(), TypeError, "q: got dtype torch.float32"),
    ("q", lambda a: a["q"].to(torch.float8_e4m3fn), TypeError, "q: got dtype"),
    ("q", lambda a: (a["q"], None), TypeError, "q: got"),
    ("q", lambda a: a["q"][0], ValueError, "q: got a 2-D"),
    ("kv", lambda a: (a["kv"], torch.ones(6)), TypeError, "kv: got"),
    ("kv", lambda a: a["kv"][:, :16], ValueError, "kv: got shape"),
    ("kv", lambda a: a["kv"].half(), TypeError, "kv: got dtype"),
    ("weights", lambda a: a["weights"].bfloat16(), TypeError, "weights: got dtype"),
    ("weights", lambda a: a["weights"][:, :3], ValueError, "weights: got shape"),
    ("cu_seq_len_k_start", lambda a: a["cu_seq_len_k_start"].long(), TypeError, "cu_seq_len_k_start: got dtype"),
    ("cu_seq_len_k_end", lambda a: a["cu_seq_len_k_end"][:2], ValueError, "cu_seq_len_k_end: got shape"),
    ("cu_seq_len_k_end", lambda a: a["cu_seq_len_k_end"] + 1, ValueError, "window"),
    ("cu_seq_len_k_start", lambda a: a["cu_seq_len_k_start"] + 7, ValueError, "window"),
]


@pytest.mark.parametrize("name,make,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bf16_mqa_logits_bad_input(name, make, error, message):
    args = _good()
    args[name] = make(args)
    with pytest.raises(error, match=message.replace("(", r"\(").replace("[", r"\[")):
        tg.bf16_mqa_logits(**args)


@pytest.mark.parametrize(
    "kwargs,error", [({"logits_dtype": torch.float16}, TypeError), ({"max_seqlen_k": -1}, ValueError)]
)
def test_bf16_mqa_logits_bad_options(kwargs, error):
    with pytest.raises(error):
        tg.bf16_mqa_logits(**_good(), **kwargs)
