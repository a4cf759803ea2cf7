"""cutile ``einsum``, ``fp8_einsum`` and ``tf32_hc_prenorm_gemm`` on the GPU, on DeepGEMM's test shapes.

Each case (``tests/test_einsum.py`` and ``tests/test_hyperconnection.py`` of DeepGEMM: every shape and output
they run, the SM100-only FP8 expressions included): inputs built the way DeepGEMM builds them, ``d`` poisoned
with NaN (except where ``c`` is ``d``), the cutile result (fallback disabled) compared in float64 with
``calc_diff`` against the exact formula, then against DeepGEMM's own reference and bar, then a rerun that
must be bitwise identical. ``TILEGEMM_GPU_TEST_SHAPES=quick`` keeps the smallest batch of each family.
"""

from __future__ import annotations

import os

import pytest
import torch

import tilegemm as tg
from tilegemm.ops.reference.gemm import round_to_tf32
from tilegemm.testing import assert_rerun_identical, calc_diff, dequantize, poisoned

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("gpu_memory")]  # 8-22 GiB each at the larger shapes

_QUICK = os.environ.get("TILEGEMM_GPU_TEST_SHAPES", "full") == "quick"
BMK_S = (129,) if _QUICK else (129, 4096, 8192)
BMK_MNK = [(128, 384, 128), (256, 256, 256), (384, 128, 384)]
HEADS_HRD = [(128, 512, 128), (8, 4096, 1024)]
HEADS_B = (4, 4096) if _QUICK else (4, 32, 128, 4096, 8192)
FP8_HRD = [(8, 4096, 1024)]
HDR_B = (4096,) if _QUICK else (4096, 8192)
PRENORM_M = (13, 4096) if _QUICK else (13, 137, 4096, 8192)
PRENORM_NK = [(24, 28672), (24, 7680), (24, 7168)]
BAR_EXACT = {torch.float32: 1e-6, torch.bfloat16: 1e-5}


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """A fallback to the pytorch backend would make these tests meaningless: make it an error."""
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _bmk_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 ``sum_s a[s] @ b[s].T``, in chunks of S (the float64 operands of S = 8192 are ~20 GB)."""
    out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64, device=a.device)
    for s0 in range(0, a.shape[0], 512):
        out += torch.einsum("smk,snk->mn", a[s0 : s0 + 512].double(), b[s0 : s0 + 512].double())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32-c-is-d", "bf16"])
@pytest.mark.parametrize("mnk", BMK_MNK, ids=lambda x: "x".join(map(str, x)))
@pytest.mark.parametrize("s", BMK_S)
def test_bmk_bnk_mn(s, mnk, dtype):
    m, n, k = mnk
    torch.manual_seed(0)
    a = torch.randn((s, m, k), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((s, n, k), dtype=torch.bfloat16, device="cuda")
    d = torch.randn((m, n), dtype=dtype, device="cuda")
    c = d if dtype == torch.float else None
    c0 = d.double().clone() if c is not None else 0
    dg_ref = (d.clone() if c is not None else 0) + torch.bmm(a.float(), b.float().mT).sum(0)
    tg.einsum("bmk,bnk->mn", a, b, d, c=c)
    assert calc_diff(d, _bmk_ref(a, b) + c0) < BAR_EXACT[dtype]
    assert calc_diff(d, dg_ref) < 1e-5  # DeepGEMM's check
    if c is None:
        assert_rerun_identical(lambda: tg.einsum("bmk,bnk->mn", a, b, d), d)


def _heads_case(expr: str, b: int, h: int, r: int, dd: int):
    x = torch.randn((b, h, r if expr.startswith("bhr") else dd), device="cuda", dtype=torch.bfloat16)
    fy = torch.randn((h, dd, r + 128), device="cuda", dtype=torch.bfloat16)
    y = fy[:, :, :r]
    z = poisoned((b, h, dd if expr.endswith("bhd") else r), torch.bfloat16, "cuda")
    return x, y, z


@pytest.mark.parametrize("b", HEADS_B)
@pytest.mark.parametrize("hrd", HEADS_HRD, ids=lambda x: "x".join(map(str, x)))
@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_heads(expr, hrd, b):
    h, r, dd = hrd
    torch.manual_seed(1)
    x, y, z = _heads_case(expr, b, h, r, dd)
    tg.einsum(expr, x, y, z)
    assert calc_diff(z, torch.einsum(expr, x.double(), y.double())) < BAR_EXACT[torch.bfloat16]
    assert_rerun_identical(lambda: tg.einsum(expr, x, y, z), z)


@pytest.mark.parametrize("b", HEADS_B)
@pytest.mark.parametrize("hrd", HEADS_HRD, ids=lambda x: "x".join(map(str, x)))
@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_heads_deepgemm_bar(expr, hrd, b):
    """DeepGEMM's own check: against torch.einsum in bf16 (cuBLAS), ``calc_diff < 1e-10`` (the same roundings)."""
    h, r, dd = hrd
    torch.manual_seed(1)
    x, y, z = _heads_case(expr, b, h, r, dd)
    tg.einsum(expr, x, y, z)
    assert calc_diff(z, torch.einsum(expr, x, y)) < 1e-10


def _fp8_heads(expr: str, b: int, h: int, r: int, dd: int):
    """DeepGEMM's FP8 operands (UE8M0 scales, y quantized per head) and the float64 dequantized values."""
    x = torch.randn((b, h, r if expr.startswith("bhr") else dd), device="cuda", dtype=torch.bfloat16)
    y = torch.randn((h, dd, r), device="cuda", dtype=torch.bfloat16)
    k = x.shape[-1]
    xq, sx = tg.per_token_cast_to_fp8(x.view(-1, k), use_ue8m0=True)
    x_fp8 = xq.view(b, h, k), sx.view(b, h, -(-k // 128))
    y_fp8 = (torch.empty_like(y, dtype=torch.float8_e4m3fn),
             torch.empty((h, -(-dd // 128), -(-r // 128)), device="cuda", dtype=torch.float))  # fmt: skip
    for i in range(h):
        y_fp8[0][i], y_fp8[1][i] = tg.per_block_cast_to_fp8(y[i], use_ue8m0=True)
    return x, y, x_fp8, y_fp8, dequantize(*x_fp8, 1), dequantize(*y_fp8, 128)


@pytest.mark.parametrize("b", HEADS_B)
@pytest.mark.parametrize("hrd", FP8_HRD, ids=lambda x: "x".join(map(str, x)))
@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_fp8_heads(expr, hrd, b):
    h, r, dd = hrd
    torch.manual_seed(2)
    x, y, x_fp8, y_fp8, x64, y64 = _fp8_heads(expr, b, h, r, dd)
    z = poisoned((b, h, dd if expr.endswith("bhd") else r), torch.bfloat16, "cuda")
    tg.fp8_einsum(expr, x_fp8, y_fp8, z)
    assert calc_diff(z, torch.einsum(expr, x64, y64)) < BAR_EXACT[torch.bfloat16]
    assert calc_diff(z, torch.einsum(expr, x, y)) < 1e-3  # DeepGEMM's check
    assert_rerun_identical(lambda: tg.fp8_einsum(expr, x_fp8, y_fp8, z), z)


@pytest.mark.parametrize("b", HDR_B)
def test_fp8_bhd_bhr_hdr(b):
    h, r, dd = 8, 4096, 1024
    torch.manual_seed(3)
    x = torch.randn((b, h, dd), device="cuda", dtype=torch.bfloat16)
    y = torch.randn((b, h, r), device="cuda", dtype=torch.bfloat16)
    z_0 = torch.randn((h, dd, r), device="cuda", dtype=torch.float32) * 10
    xq, sx = tg.per_channel_cast_to_fp8(x.view(b, -1), use_ue8m0=True)
    yq, sy = tg.per_channel_cast_to_fp8(y.view(b, -1), use_ue8m0=True)
    x64 = (xq.double() * sx.double().repeat_interleave(128, 0)[:b]).view(b, h, dd)
    y64 = (yq.double() * sy.double().repeat_interleave(128, 0)[:b]).view(b, h, r)
    x_fp8 = (xq.view(b, h, dd), sx.view(-(-b // 128), h, dd))
    y_fp8 = (yq.view(b, h, r), sy.view(-(-b // 128), h, r))
    z = z_0.clone()
    tg.fp8_einsum("bhd,bhr->hdr", x_fp8, y_fp8, z, z, recipe=(1, 1, 128))
    assert calc_diff(z, z_0.double() + torch.einsum("bhd,bhr->hdr", x64, y64)) < BAR_EXACT[torch.float32]
    assert calc_diff(z, z_0 + torch.einsum("bhd,bhr->hdr", x.float(), y.float())) < 1e-3  # DeepGEMM's check


@pytest.mark.parametrize("num_splits", [None, 16])
@pytest.mark.parametrize("nk", PRENORM_NK, ids=lambda x: "x".join(map(str, x)))
@pytest.mark.parametrize("m", PRENORM_M)
def test_prenorm(m, nk, num_splits):
    n, k = nk
    torch.manual_seed(4)
    a = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((n, k), dtype=torch.float, device="cuda")
    lead = () if num_splits is None else (num_splits,)
    d = poisoned((*lead, m, n), torch.float32, "cuda")
    s = poisoned((*lead, m), torch.float32, "cuda")
    tg.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=num_splits)
    final_d = d if num_splits is None else d.double().sum(0)
    final_s = s if num_splits is None else s.double().sum(0)
    ref_d = a.double() @ round_to_tf32(b).double().T
    ref_s = a.double().square().sum(-1)
    assert max(calc_diff(final_d, ref_d), calc_diff(final_s, ref_s)) < 1e-8  # DeepGEMM's bar, here vs float64
    assert_rerun_identical(lambda: tg.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=num_splits), d)


def test_bmk_split_graph_capture():
    """The split ``bmk`` path (kernel + reduce, cached workspace) replays in a CUDA graph with new inputs."""
    torch.manual_seed(5)
    a = torch.randn((512, 128, 128), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((512, 384, 128), dtype=torch.bfloat16, device="cuda")
    d = torch.empty((128, 384), dtype=torch.bfloat16, device="cuda")
    tg.einsum("bmk,bnk->mn", a, b, d)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tg.einsum("bmk,bnk->mn", a, b, d)
    a.copy_(torch.randn_like(a, dtype=torch.float32))
    graph.replay()
    torch.cuda.synchronize()
    assert calc_diff(d, _bmk_ref(a, b)) < BAR_EXACT[torch.bfloat16]
