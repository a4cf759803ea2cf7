"""Dense BF16/FP8 GEMMs (nt/nn/tn/tt) against an independent float64 formula.

Each case: fresh random inputs, ``d`` poisoned with NaN, the op's result compared with the
float64 math (``calc_diff``), ``d`` fully written, and a rerun bitwise identical.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilegemm as tg
from tilegemm import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.testing import backend_device_params, calc_diff, poisoned

LAYOUTS = ["nt", "nn", "tn", "tt"]
OUT_DTYPES = [torch.float32, torch.bfloat16]
# (M, N, K): M=1, N=2112 (DeepSeek), N and K not multiples of 128, K=0.
SHAPES = [(1, 2112, 256), (64, 96, 200), (130, 257, 384), (16, 64, 0)]
BAR_EXACT = {torch.float32: 1e-6, torch.bfloat16: 1e-5}
BAR_FP8_VS_UNQUANTIZED = 1e-3
BACKENDS = backend_device_params()


def _shape_id(shape):
    return "x".join(map(str, shape))


def _store(x: torch.Tensor, layout_char_is_t: bool) -> torch.Tensor:
    """Lay a logical [R, K] operand out as the layout says: [R, K] or a contiguous [K, R]."""
    return x.t().contiguous() if layout_char_is_t else x.contiguous()


def _operands(layout: str, a_log: torch.Tensor, b_log: torch.Tensor):
    """a_log [M, K], b_log [N, K] -> (a, b) in the layout's shapes (nt a[M,K] b[N,K], ... tt a[K,M] b[N,K])."""
    return _store(a_log, layout[0] == "t"), _store(b_log, layout[1] == "n")


def _fp8_operands(layout: str, aq, sa, bq, sb):
    """Logical FP8 operands -> the layout's ``(data, scales)``: a transposed operand's scales are transposed
    too (DeepGEMM's orientation: nn sb [K/128, N/128], tn/tt sa [K/128, M])."""
    ta, tb = layout[0] == "t", layout[1] == "n"
    return (_store(aq, ta), sa.t() if ta else sa), (_store(bq, tb), sb.t() if tb else sb)


def _check_written_and_rerun(fn, d: torch.Tensor) -> None:
    assert not torch.isnan(d).any(), "d has unwritten (NaN) elements"
    first = d.clone()
    fn()
    assert torch.equal(first.view(torch.uint8), d.view(torch.uint8)), "rerun is not bitwise identical"


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_gemm(backend, device, layout, out_dtype, shape):
    m, n, k = shape
    torch.manual_seed(1)
    a_log = torch.randn(m, k, device=device).bfloat16()
    b_log = torch.randn(n, k, device=device).bfloat16()
    a, b = _operands(layout, a_log, b_log)
    d = poisoned((m, n), out_dtype, device)
    op = getattr(tg, f"bf16_gemm_{layout}")
    out = op(a, b, d, backend=backend)
    assert out is d
    ref = a_log.double() @ b_log.double().T
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]
    _check_written_and_rerun(lambda: op(a, b, d, backend=backend), d)


EPILOGUES = ["c", "c_is_d", "beta0_c_nan", "alpha_no_c"]


def _epilogue_case(mode: str, m: int, n: int, out_dtype, device):
    """(c, alpha, beta, c64 contribution, d) for an epilogue mode; d is poisoned unless it is c."""
    if mode == "c":
        c = torch.randn(m, n, device=device).to(torch.bfloat16)
        return c, 0.75, -1.5, -1.5 * c.double(), poisoned((m, n), out_dtype, device)
    if mode == "c_is_d":
        d = torch.randn(m, n, device=device).to(out_dtype)
        return d, 1.25, 0.5, 0.5 * d.double(), d
    if mode == "beta0_c_nan":
        c = poisoned((m, n), torch.float32, device)
        return c, 2.0, 0.0, torch.zeros(m, n, dtype=torch.float64, device=device), poisoned((m, n), out_dtype, device)
    return None, -0.5, 1.0, torch.zeros(m, n, dtype=torch.float64, device=device), poisoned((m, n), out_dtype, device)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("shape", [(64, 160, 192), (8, 48, 0)], ids=_shape_id)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("mode", EPILOGUES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_gemm_epilogue(backend, device, layout, mode, out_dtype, shape):
    m, n, k = shape
    torch.manual_seed(2)
    a_log = torch.randn(m, k, device=device).bfloat16()
    b_log = torch.randn(n, k, device=device).bfloat16()
    a, b = _operands(layout, a_log, b_log)
    c, alpha, beta, c_term, d = _epilogue_case(mode, m, n, out_dtype, device)
    ref = alpha * (a_log.double() @ b_log.double().T) + c_term
    getattr(tg, f"bf16_gemm_{layout}")(a, b, d, c=c, alpha=alpha, beta=beta, backend=backend)
    assert not torch.isnan(d).any()
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]


# ------------------------------------------------------------------------------------------ FP8


def fp8_formula(aq, sa, bq, sb, gran_n: int) -> torch.Tensor:
    """float64 ``D[m,n] = sum_kb sa[m,kb] * sb[n // gran_n, kb] * sum_(k in kb) A[m,k] B[n,k]``; A [M,K], B [N,K]."""
    m, k = aq.shape
    n = bq.shape[0]
    kb = -(-k // 128)
    a_blk = F.pad(aq.double(), (0, kb * 128 - k)).view(m, kb, 128)
    b_blk = F.pad(bq.double(), (0, kb * 128 - k)).view(n, kb, 128)
    partial = torch.einsum("mbk,nbk->mnb", a_blk, b_blk)
    sb_rows = sb.double()[torch.arange(n, device=sb.device) // gran_n]
    return torch.einsum("mnb,mb,nb->mn", partial, sa.double(), sb_rows)


def quantize_rhs(b_log: torch.Tensor, recipe):
    """RHS [N, K] -> (fp8 [N, K], scales) for recipe (1,128,128) (128x128 blocks) or (1,1,128) (1x128 rows)."""
    return per_block_cast_to_fp8(b_log) if recipe[1] == 128 else per_token_cast_to_fp8(b_log)


RECIPES = [(1, 128, 128), (1, 1, 128)]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("pass_recipe", [True, False], ids=["recipe", "inferred"])
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: "x".join(map(str, r)))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_gemm(backend, device, layout, recipe, pass_recipe, out_dtype, shape):
    m, n, k = shape
    torch.manual_seed(3)
    a_log = torch.randn(m, k, device=device).bfloat16()
    b_log = torch.randn(n, k, device=device).bfloat16()
    aq, sa = per_token_cast_to_fp8(a_log)
    bq, sb = quantize_rhs(b_log, recipe)
    a, b = _fp8_operands(layout, aq, sa, bq, sb)
    d = poisoned((m, n), out_dtype, device)
    op = getattr(tg, f"fp8_gemm_{layout}")
    kwargs = {"recipe": recipe} if pass_recipe else {}
    op(a, b, d, backend=backend, **kwargs)
    ref = fp8_formula(aq, sa, bq, sb, recipe[1])
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]
    if k > 0:
        assert calc_diff(d, a_log.double() @ b_log.double().T) < BAR_FP8_VS_UNQUANTIZED
    _check_written_and_rerun(lambda: op(a, b, d, backend=backend, **kwargs), d)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("mode", EPILOGUES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_gemm_epilogue(backend, device, layout, mode, out_dtype):
    m, n, k = 48, 200, 320
    torch.manual_seed(4)
    aq, sa = per_token_cast_to_fp8(torch.randn(m, k, device=device))
    bq, sb = per_block_cast_to_fp8(torch.randn(n, k, device=device))
    a, b = _fp8_operands(layout, aq, sa, bq, sb)
    c, alpha, beta, c_term, d = _epilogue_case(mode, m, n, out_dtype, device)
    ref = alpha * fp8_formula(aq, sa, bq, sb, 128) + c_term
    getattr(tg, f"fp8_gemm_{layout}")(a, b, d, c=c, alpha=alpha, beta=beta, backend=backend)
    assert not torch.isnan(d).any()
    assert calc_diff(d, ref) < BAR_EXACT[out_dtype]


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_strided_inputs(backend, device):
    """Operands given as non-contiguous views (a sliced, b transposed view) still compute the same math."""
    torch.manual_seed(5)
    big_a = torch.randn(40, 300, device=device).bfloat16()
    a = big_a[:, 10:266]  # [40, 256], row stride 300
    b = torch.randn(256, 72, device=device).bfloat16().t()  # [72, 256] view with strides (1, 72)
    d = poisoned((40, 72), torch.float32, device)
    tg.bf16_gemm_nt(a, b, d, backend=backend)
    assert calc_diff(d, a.double() @ b.double().T) < 1e-6


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_fp8_transposed_scales_square(backend, device, layout):
    """N == K (and M == K): a transposed operand's scales are read in the data's orientation.

    With square scale grids both orientations have the same shape, so reading them the other way
    round passes every shape check; the blocks get distinct scales so that mistake changes the result.
    """
    m = n = k = 384
    torch.manual_seed(6)
    a_log = torch.randn(m, k, device=device) * torch.logspace(-2, 2, m, device=device)[:, None]
    b_log = torch.randn(n, k, device=device) * torch.logspace(-2, 2, k, device=device)[None, :]
    aq, sa = per_token_cast_to_fp8(a_log)
    bq, sb = per_block_cast_to_fp8(b_log)
    assert not torch.allclose(sb, sb.t())
    a, b = _fp8_operands(layout, aq, sa, bq, sb)
    d = poisoned((m, n), torch.float32, device)
    getattr(tg, f"fp8_gemm_{layout}")(a, b, d, backend=backend)
    assert calc_diff(d, fp8_formula(aq, sa, bq, sb, 128)) < BAR_EXACT[torch.float32]


def test_fp8_gemm_deepgemm_positional_order():
    """DeepGEMM's positional order: (a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)."""
    torch.manual_seed(7)
    m, n, k = 32, 256, 256
    aq, sa = per_token_cast_to_fp8(torch.randn(m, k))
    bq, sb = per_token_cast_to_fp8(torch.randn(n, k))
    c = torch.randn(m, n)
    d = poisoned((m, n), torch.float32, "cpu")
    tg.fp8_gemm_nt((aq, sa), (bq, sb), d, c, (1, 1, 128), None, None, "nk", True, backend="pytorch")
    assert calc_diff(d, fp8_formula(aq, sa, bq, sb, 1) + c.double()) < BAR_EXACT[torch.float32]
    d2 = poisoned((m, n), torch.float32, "cpu")
    tg.fp8_fp4_gemm_nt((aq, sa), (bq, sb), d2, c=c, recipe_a=(1, 128), recipe_b=(1, 128), backend="pytorch")
    assert torch.equal(d, d2)
    with pytest.raises(TypeError):  # alpha and beta are keyword-only extensions
        tg.bf16_gemm_nt(torch.zeros(2, 2).bfloat16(), torch.zeros(2, 2).bfloat16(), torch.zeros(2, 2), None, "nk", 1.0)
