"""The plain MQA-logits ops' decode kernel, host side on the CPU (``cuda.tile.launch`` recorded, not run): which
kernel a call launches, with which grid and arguments. Its numbers are checked on the GPU (``test_mqa_decode_gpu.py``)
and its machine code by the compile gate (``tests/compile_gate/test_compile_mqa.py``)."""

from __future__ import annotations

import pytest
import torch

from tilegemm.ops import api

ct = pytest.importorskip("cuda.tile")


def _operands(rows: int, keys: int, heads: int = 64, dim: int = 128, bf16: bool = False):
    g = torch.Generator().manual_seed(rows * 31 + keys)
    q = torch.randn(rows, heads, dim, generator=g)
    k = torch.randn(keys, dim, generator=g)
    w = torch.randn(rows, heads, generator=g)
    ks = torch.zeros(rows, dtype=torch.int32)
    ke = torch.arange(keys - rows + 1, keys + 1, dtype=torch.int32)
    if bf16:
        return q.bfloat16(), k.bfloat16(), w, ks, ke
    return q.to(torch.float8_e4m3fn), (k.to(torch.float8_e4m3fn), torch.rand(keys, generator=g) + 0.5), w, ks, ke


def _call(bf16: bool, rows: int, keys: int, **kw):
    q, kv, w, ks, ke = _operands(rows, keys, bf16=bf16, **kw)
    op = api.bf16_mqa_logits if bf16 else api.fp8_mqa_logits
    op(q, kv, w, ks, ke, backend="cutile")
    return q, kv


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
@pytest.mark.parametrize(
    "rows,keys,forced,decode",
    [(1, 4096, None, True), (4, 65536, None, True), (5, 65536, None, False), (1, 4095, None, False),
     (1, 4096, "plain", False)],
)  # fmt: skip
def test_decode_steps_take_the_decode_kernel_by_default(launches, monkeypatch, bf16, rows, keys, forced, decode):
    """Without ``TILEGEMM_MQA_VARIANT`` a decode step (at most 4 query rows over at least 4096 keys) launches the
    decode kernel, other calls the plain kernel on their row blocks; ``plain`` forces the plain kernel."""
    from tilegemm.ops.cutile import mqa_decode_kernels, mqa_kernels

    if forced:
        monkeypatch.setenv("TILEGEMM_MQA_VARIANT", forced)
    _call(bf16, rows, keys)
    (grid, kernel, _), (clean, clean_kernel, _) = launches
    if decode:
        assert kernel is mqa_decode_kernels.decode_kernel_for(2) and grid[1] > 1
    else:
        assert kernel is mqa_kernels.plain_kernel_for(2) and grid[1:] == (1, 1)
    assert clean_kernel is mqa_kernels.mqa_clean_logits_kernel and clean[0] == grid[0]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp8", "bf16"])
@pytest.mark.parametrize("rows,keys,parts", [(1, 4096, 32), (1, 65536, 264), (2, 16384, 128), (3, 300, 3)])
def test_forced_decode_splits_the_keys_over_the_sms(launches, monkeypatch, bf16, rows, keys, parts):
    """``TILEGEMM_MQA_VARIANT=decode``: a decode-sized call launches the decode kernel on ``(row blocks, parts)``
    CTAs, ``parts`` enough for two CTAs per SM and at most one per 128-key tile, on the caller's key tensor itself
    (no copy), then the ``-inf`` fill over the same row blocks."""
    from tilegemm.ops.cutile import mqa_decode_kernels, mqa_kernels

    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")
    q, kv = _call(bf16, rows, keys)
    (grid, kernel, args), (clean_grid, clean, clean_args) = launches
    bq = 1 if rows == 1 else 2
    assert kernel is mqa_decode_kernels.decode_kernel_for(2)
    assert grid == (-(-rows // bq), parts, 1)
    keys_arg = kv if bf16 else kv[0]
    assert args[1].data_ptr() == keys_arg.data_ptr() and args[0].data_ptr() == q.data_ptr()
    assert args[7:] == (bq, 64, 128, 128, True)  # BQ, HP, D, BK, HEAD_CHAIN
    assert clean is mqa_kernels.mqa_clean_logits_kernel and clean_grid == (grid[0], 1, 1)
    assert clean_args[3:] == (bq, 128, 1)  # the fill's tiles are the decode kernel's


def test_forced_decode_leaves_prefill_and_few_heads_padded(launches, monkeypatch):
    """Forced, a prefill-sized call (as many row blocks as SMs or more) keeps the plain kernel; four heads take 16
    rows per block (an MMA N side of 64)."""
    from tilegemm.ops.cutile import mqa_decode_kernels, mqa_kernels

    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "decode")
    _call(False, 264, 512)
    assert launches[0][1] is mqa_kernels.plain_kernel_for(2)
    launches.clear()
    _call(True, 1, 256, heads=4, dim=32)
    (grid, kernel, args), _ = launches
    assert kernel is mqa_decode_kernels.decode_kernel_for(2) and grid == (1, 2, 1) and args[7:9] == (16, 4)


def test_bad_variant_names_the_variable(launches, monkeypatch):
    monkeypatch.setenv("TILEGEMM_MQA_VARIANT", "split")
    with pytest.raises(ValueError, match="TILEGEMM_MQA_VARIANT"):
        _call(False, 1, 256)
