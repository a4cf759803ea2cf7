"""GPU tests of the plain MQA-logits ops' decode kernel (``ops/cutile/mqa_decode_kernels.py``), FP8 and BF16.

Bars (docs/design.md): calc_diff < 1e-6 against float64 on the operands' values (fp32 output); ``-inf`` exactly outside
the windows; every output element written (outputs start :func:`tilegemm.testing.poisoned`); bitwise identical
reruns, through the op and from a CUDA graph; equal to the plain kernel inside the windows up to fp32 order.
"""

from __future__ import annotations

import pytest
import torch

from tilegemm import indexer
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops import api
from tilegemm.testing import assert_rerun_identical, calc_diff, poisoned

pytestmark = pytest.mark.gpu

DEV = "cuda"


@pytest.fixture(autouse=True)
def _decode_forced(monkeypatch):
    """The decode kernel is forced (the chooser keeps the plain kernel until measured); no silent fallback."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")


def _logits64(q, keys, scale, w) -> torch.Tensor:
    scores = torch.einsum("shd,kd->shk", q.double(), keys.double()).relu_()
    return torch.einsum("sh,shk->sk", w.double(), scores) * scale.double()[None, :]


def _case(rows: int, keys: int, h: int, d: int, kind: str, bf16: bool, seed: int):
    """Operands on the GPU and the float64 logits of their values (``-inf`` outside the windows)."""
    g = torch.Generator().manual_seed(seed)
    q_f, k_f = torch.randn(rows, h, d, generator=g), torch.randn(keys, d, generator=g)
    w = torch.randn(rows, h, generator=g)
    if kind == "causal":
        ks, ke = indexer.causal_windows(rows, keys)
    elif kind == "sliding":
        ks, ke = indexer.causal_windows(rows, keys, window=keys // 3)
    else:  # ragged, one empty window
        ks = torch.randint(0, keys // 2, (rows,), generator=g, dtype=torch.int32)
        ke = (ks + torch.randint(0, keys // 2 + 1, (rows,), generator=g, dtype=torch.int32)).clamp_max(keys)
        ke[0] = ks[0]
    if bf16:
        q, kv = q_f.bfloat16(), k_f.bfloat16()
        exact = _logits64(q.float(), kv.float(), torch.ones(keys), w)
        kv_dev = kv.to(DEV)
    else:
        q, kv = q_f.to(torch.float8_e4m3fn), indexer.quantize_keys(k_f)
        exact = _logits64(q.float(), kv[0].float(), kv[1], w)
        kv_dev = (kv[0].to(DEV), kv[1].to(DEV))
    cols = torch.arange(keys)
    valid = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    exact = exact.masked_fill(~valid, float("-inf"))
    return (q.to(DEV), kv_dev, w.to(DEV), ks.to(DEV), ke.to(DEV)), exact.to(DEV), valid.to(DEV)


CASES = [
    # rows, keys, H, D, windows
    (1, 4096, 64, 128, "causal"),
    (1, 65536, 64, 128, "causal"),
    (2, 16384, 64, 128, "causal"),
    (3, 1000, 64, 128, "sliding"),  # a partial last key tile, two row blocks
    (4, 777, 32, 128, "ragged"),
    (1, 300, 64, 64, "causal"),
    (2, 129, 16, 32, "ragged"),
    (1, 5000, 4, 32, "causal"),  # the tiny presets' indexer: rows padded to an MMA N side of 64
]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
@pytest.mark.parametrize("rows,keys,h,d,kind", CASES)
def test_decode_kernel_matches_float64(rows, keys, h, d, kind, bf16, monkeypatch):
    """Through the op (the chooser takes the decode kernel): float64 bar, ``-inf`` exactly outside the windows,
    bitwise reruns; the plain kernel's logits inside the windows within fp32 order."""
    args, exact, valid = _case(rows, keys, h, d, kind, bf16, seed=rows * 1000 + keys + h)
    op = api.bf16_mqa_logits if bf16 else api.fp8_mqa_logits
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    conf = heuristics.plain_mqa_config(h, d, rows, keys, sms, sm=90, bf16=bf16, variant="decode")
    assert conf is not None and conf.path == "decode"
    out = op(*args, backend="cutile")
    torch.cuda.synchronize()
    assert out.shape == (rows, keys) and out.dtype == torch.float32
    assert torch.equal(torch.isneginf(out), ~valid)
    assert calc_diff(out[valid], exact[valid]) < 1e-6
    assert torch.equal(op(*args, backend="cutile"), out)
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "plain")
    plain = op(*args, backend="cutile")
    assert calc_diff(out[valid], plain[valid]) < 1e-9


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
def test_decode_kernel_writes_every_element_and_reruns_bitwise(bf16):
    """The host launch into a poisoned (NaN) output with ``clean``: the decode kernel and the ``-inf`` fill write
    every element; a second launch leaves the bytes unchanged. Without ``clean`` the tiles outside the windows stay
    as they were (NaN)."""
    from tilegemm.ops.cutile import mqa

    rows, keys, h, d = 2, 3000, 64, 128
    (q, kv, w, ks, ke), exact, valid = _case(rows, keys, h, d, "sliding", bf16, seed=7)
    kv_data, kv_scale = (kv, torch.ones(keys, device=DEV)) if bf16 else kv
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    conf = heuristics.plain_mqa_config(h, d, rows, keys, sms, sm=90, bf16=bf16, variant="decode")
    out = poisoned((rows, keys), torch.float32, DEV)

    def run():
        mqa.launch_mqa_logits(q, kv_data, kv_scale, w, ks, ke, out, conf, clean=True)
        torch.cuda.synchronize()

    run()
    assert_rerun_identical(run, out)
    assert calc_diff(out[valid], exact[valid]) < 1e-6 and torch.equal(torch.isneginf(out), ~valid)
    raw = poisoned((rows, keys), torch.float32, DEV)
    mqa.launch_mqa_logits(q, kv_data, kv_scale, w, ks, ke, raw, conf)
    torch.cuda.synchronize()
    assert torch.equal(raw[valid], out[valid])


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
def test_decode_kernel_replays_from_a_cuda_graph(bf16):
    """A decode call captured in a CUDA graph: the replay equals the eager call bitwise, and follows new key values
    written into the same cache (read in place)."""
    rows, keys, h, d = 1, 8192, 64, 128
    args, _, valid = _case(rows, keys, h, d, "causal", bf16, seed=11)
    op = api.bf16_mqa_logits if bf16 else api.fp8_mqa_logits
    eager = op(*args, backend="cutile")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(*args, backend="cutile")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*args, backend="cutile")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    keys_t = args[1] if bf16 else args[1][0]
    keys_t.copy_(torch.randn(keys_t.shape, device=DEV).to(keys_t.dtype))
    graph.replay()
    fresh = op(*args, backend="cutile")
    torch.cuda.synchronize()
    assert torch.equal(out, fresh) and not torch.equal(out[valid], eager[valid])


def test_decode_kernel_out_of_range_windows_do_not_fault():
    """Windows past the keys (ks < 0, ke > S_kv) are clamped: nothing outside the arrays is read or written."""
    rows, keys, h, d = 2, 1000, 64, 128
    (q, kv, w, _, _), _, _ = _case(rows, keys, h, d, "causal", False, seed=3)
    ks = torch.tensor([-50, 10], dtype=torch.int32, device=DEV)
    ke = torch.tensor([keys + 500, 2 * keys], dtype=torch.int32, device=DEV)
    out = api.fp8_mqa_logits(q, kv, w, ks, ke, backend="cutile")
    torch.cuda.synchronize()
    assert torch.isfinite(out[0]).all() and torch.isneginf(out[1, :10]).all() and torch.isfinite(out[1, 10:]).all()
