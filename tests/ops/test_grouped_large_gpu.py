"""M-grouped GEMMs whose expert weight has more than 2**31 elements (DeepSeek-V3: 256 x 4096 x 7168).

The weight is read only through TMA, so the cutile kernels serve it (fallback disabled here). Groups at
the start, middle and end of the weight are populated, so the last expert's rows (byte offsets past
2**32) are checked against float64 math on the same operands.
"""

import pytest
import torch

import tilegemm
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.xdist_group("gpu_serial"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

EXPERTS, N, K, ROWS = 256, 4096, 7168, 128
POPULATED = (0, 100, EXPERTS - 1)


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _offsets() -> torch.Tensor:
    sizes = torch.zeros(EXPERTS, dtype=torch.int64)
    sizes[list(POPULATED)] = ROWS
    return sizes.cumsum(0).int().cuda()


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_weight_past_int32_elements(fp8):
    assert EXPERTS * N * K >= 2**31
    x = torch.randn(ROWS * len(POPULATED), K, device="cuda").bfloat16()
    d = torch.full((x.shape[0], N), float("nan"), device="cuda", dtype=torch.bfloat16)
    if fp8:  # quantize expert by expert: a float copy of the whole weight would not fit
        data = torch.zeros(EXPERTS, N, K, device="cuda", dtype=torch.float8_e4m3fn)
        scales = torch.ones(EXPERTS, N // 128, K // 128, device="cuda")
        for e in POPULATED:
            data[e], scales[e] = tilegemm.per_block_cast_to_fp8(torch.randn(N, K, device="cuda").bfloat16())
        a = tilegemm.per_token_cast_to_fp8(x)
        tilegemm.m_grouped_fp8_gemm_nt_contiguous(
            a, (data, scales), d, _offsets(), use_psum_layout=True, alignment=1, backend="cutile"
        )
        xs = dequant_per_token(*a).double()
        ws = [dequant_per_block(data[e], scales[e]).double() for e in POPULATED]
    else:
        w = torch.zeros(EXPERTS, N, K, device="cuda", dtype=torch.bfloat16)
        for e in POPULATED:
            w[e].normal_()
        tilegemm.m_grouped_bf16_gemm_nt_contiguous(
            x, w, d, _offsets(), use_psum_layout=True, alignment=1, backend="cutile"
        )
        xs, ws = x.double(), [w[e].double() for e in POPULATED]
    assert not d.isnan().any()
    ref = torch.cat([xs[i * ROWS : (i + 1) * ROWS] @ ws[i].T for i in range(len(POPULATED))])
    assert calc_diff(d, ref) < 1e-5
