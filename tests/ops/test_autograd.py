"""Differentiable ops: forward and gradients vs float64 autograd, custom-op registration, torch.compile."""

import pytest
import torch

import tilegemm
from tilegemm import autograd, custom_ops
from tilegemm.testing import calc_diff

BACKENDS = ["pytorch", pytest.param("cutile", marks=pytest.mark.gpu)]


def _device(backend: str) -> str:
    return "cuda" if backend == "cutile" else "cpu"


def _leaf(*shape: int, device: str) -> torch.Tensor:
    return torch.randn(*shape, device=device).bfloat16().requires_grad_()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (77, 200, 130), (256, 128, 64)])
def test_matmul_forward_and_grads(backend, m, k, n):
    dev = _device(backend)
    a, b = _leaf(m, k, device=dev), _leaf(k, n, device=dev)
    with tilegemm.use_backend(backend):
        out = autograd.matmul(a, b)
        grad = torch.randn(m, n, device=dev).bfloat16()
        out.backward(grad)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref = a64 @ b64
    ref.backward(grad.double())
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert calc_diff(out, ref) < 1e-5
    assert calc_diff(a.grad, a64.grad) < 1e-5
    assert calc_diff(b.grad, b64.grad) < 1e-5


def _grouped_float64(x, w, sizes, tail, transposed, grad):
    """Float64 autograd of the grouped product: (out, dx, dw)."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    parts, start = [], 0
    for g, size in enumerate(sizes):
        parts.append(x64[start : start + size] @ (w64[g] if transposed else w64[g].T))
        start += size
    parts.append(x64.new_zeros(tail, parts[0].shape[1]))  # rows past offs[-1]: zero output, zero gradient
    ref = torch.cat(parts)
    ref.backward(grad.double())
    return ref, x64.grad, w64.grad


# fp32 is exact to float64 up to fp32 sums; fp16 and bf16 round the output and the gradients once.
GROUPED_DTYPES = [
    pytest.param(torch.bfloat16, 1e-5, id="bf16"),
    pytest.param(torch.float16, 1e-6, id="fp16"),
    pytest.param(torch.float32, 1e-10, id="fp32"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,bar", GROUPED_DTYPES)
@pytest.mark.parametrize("transposed", [False, True], ids=["nk", "kn"])
@pytest.mark.parametrize("sizes", [[5, 0, 130, 1], [64], [0, 0, 3]])
def test_grouped_matmul_forward_and_grads(backend, dtype, bar, transposed, sizes):
    dev = _device(backend)
    groups, k, n, tail = len(sizes), 96, 48, 7  # `tail` rows past offs[-1] get 0 and no gradient
    x = torch.randn(sum(sizes) + tail, k, device=dev).to(dtype).requires_grad_()
    w = torch.randn(groups, *((k, n) if transposed else (n, k)), device=dev).to(dtype).requires_grad_()
    offs = torch.tensor(sizes, device=dev).cumsum(0).int()
    grad = torch.randn(x.shape[0], n, device=dev).to(dtype)
    with tilegemm.use_backend(backend):
        out = autograd.grouped_matmul(x, w, offs, transposed)
        out.backward(grad)
    ref, dx, dw = _grouped_float64(x, w, sizes, tail, transposed, grad)
    assert out.dtype == x.grad.dtype == w.grad.dtype == dtype
    assert torch.equal(out[sum(sizes) :].float(), torch.zeros(tail, n, device=dev))
    assert calc_diff(out, ref) < bar
    assert calc_diff(x.grad, dx) < bar
    assert calc_diff(w.grad, dw) < bar


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cached", [False, True], ids=["quantize", "cached"])
def test_fp8_grouped_matmul_forward_and_straight_through_grads(backend, cached):
    dev = _device(backend)
    sizes, k, n, tail = [5, 0, 130, 1], 256, 192, 7
    x, w = _leaf(sum(sizes) + tail, k, device=dev), _leaf(len(sizes), n, k, device=dev)
    offs = torch.tensor(sizes, device=dev).cumsum(0).int()
    grad = torch.randn(x.shape[0], n, device=dev).bfloat16()
    w_fp8 = tilegemm.per_block_cast_to_fp8(w.detach()) if cached else None
    with tilegemm.use_backend(backend):
        out = autograd.fp8_grouped_matmul(x, w, offs, w_fp8)
        out.backward(grad)
        with torch.no_grad():  # the forward is the FP8 grouped GEMM itself
            d = torch.empty(x.shape[0], n, device=dev, dtype=torch.bfloat16)
            tilegemm.m_grouped_fp8_gemm_nt_contiguous(
                tilegemm.per_token_cast_to_fp8(x.detach()), tilegemm.per_block_cast_to_fp8(w.detach()), d, offs,
                use_psum_layout=True, alignment=1,
            )  # fmt: skip
    ref, dx, dw = _grouped_float64(x, w, sizes, tail, False, grad)
    assert torch.equal(out.detach(), d)
    assert calc_diff(out, ref) < 1e-3  # FP8 quantization of both operands
    assert calc_diff(x.grad, dx) < 1e-5  # straight-through: exact BF16 GEMMs
    assert calc_diff(w.grad, dw) < 1e-5


def test_fp8_grouped_matmul_rejects_a_foreign_fp8_copy():
    x, w = torch.randn(8, 256).bfloat16(), torch.randn(2, 128, 256).bfloat16()
    offs = torch.tensor([3, 8]).int()
    wrong = tilegemm.per_block_cast_to_fp8(torch.randn(2, 256, 256))
    with pytest.raises(ValueError, match=r"w_fp8\[0\]: got shape \[2, 256, 256\]"):
        autograd.fp8_grouped_matmul(x, w, offs, wrong)
    with pytest.raises(TypeError, match="w_fp8"):
        autograd.fp8_grouped_matmul(x, w, offs, w.float())


def test_grouped_matmul_rejects_mixed_dtypes():
    x, w = torch.randn(8, 64), torch.randn(2, 32, 64).bfloat16()
    with pytest.raises(TypeError, match="w: got dtype torch.bfloat16, expected x.s dtype torch.float32"):
        autograd.grouped_matmul(x, w, torch.tensor([3, 8]).int())
    with pytest.raises(ValueError, match=r"w \[G, K, N\] has \[2, 32, 64\]: K differs"):
        autograd.grouped_matmul(x.bfloat16(), w, torch.tensor([3, 8]).int(), transposed=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_linear_forward_and_straight_through_grads(backend):
    dev = _device(backend)
    x, w = _leaf(3, 5, 256, device=dev), _leaf(192, 256, device=dev)
    bias = torch.randn(192, device=dev).bfloat16().requires_grad_()
    grad = torch.randn(3, 5, 192, device=dev).bfloat16()
    with tilegemm.use_backend(backend):
        out = autograd.fp8_linear(x, w, bias)
        out.backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    ref = torch.nn.functional.linear(x64, w64, b64)
    ref.backward(grad.double())
    assert out.shape == (3, 5, 192)
    assert calc_diff(out, ref) < 1e-3  # FP8 quantization of both operands
    assert calc_diff(x.grad, x64.grad) < 1e-5  # straight-through: exact BF16 GEMMs
    assert calc_diff(w.grad, w64.grad) < 1e-5
    assert calc_diff(bias.grad, b64.grad) < 1e-5


def test_grouped_matmul_validates_offsets_once():
    x, w = torch.randn(40, 64).bfloat16(), torch.randn(3, 32, 64).bfloat16()
    with pytest.raises(ValueError, match="non-decreasing"):
        autograd.grouped_matmul(x, w, torch.tensor([10, 5, 33]).int())
    with pytest.raises(ValueError, match="non-decreasing"):
        autograd.grouped_matmul(x, w, torch.tensor([10, 20, 41]).int())  # past the 40 rows


def test_custom_ops_pass_opcheck():
    a, b = torch.randn(16, 64).bfloat16(), torch.randn(64, 32).bfloat16()
    torch.library.opcheck(custom_ops.gemm, (a.requires_grad_(), b.requires_grad_(), "nn"))
    x, w = torch.randn(40, 64).bfloat16().requires_grad_(), torch.randn(3, 32, 64).bfloat16().requires_grad_()
    offs = torch.tensor([10, 10, 33]).int()
    torch.library.opcheck(custom_ops.grouped_gemm, (x, w, offs, "nt"))
    torch.library.opcheck(custom_ops.grouped_gemm, (x, w.detach().transpose(1, 2).contiguous(), offs, "nn"))
    w_fp8 = tilegemm.per_block_cast_to_fp8(w.detach())
    # test_schema compares inputs before and after with arithmetic torch lacks for float8 on the CPU
    not_schema = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(custom_ops.fp8_grouped_gemm, (x, w, *w_fp8, offs), test_utils=not_schema)
    torch.library.opcheck(custom_ops.fp8_linear_forward, (x.detach().requires_grad_(), torch.randn(32, 64).bfloat16()))


def test_traces_under_torch_compile_fullgraph():
    x, w = torch.randn(40, 64).bfloat16(), torch.randn(3, 32, 64).bfloat16()
    offs = torch.tensor([10, 10, 33]).int()

    def step(x, w):
        return torch.nn.functional.silu(autograd.grouped_matmul(x, w, offs)).sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, w), step(x, w))


@pytest.mark.parametrize("scope", [None, "pytorch"], ids=["automatic", "use_backend"])
def test_moe_experts_backward_follows_the_forward_choice(monkeypatch, scope):
    """The backward of ``autograd.moe_experts`` passes on the forward's choice: ``None`` under the automatic choice
    (its op then chooses by the same rule), the scope's backend under ``use_backend``."""
    from tilegemm.backend import selector

    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    monkeypatch.setattr(selector, "_global_backend", None)
    seen, backward = [], custom_ops.moe_experts_grad
    monkeypatch.setattr(custom_ops, "moe_experts_grad", lambda *a: seen.append(a[-1]) or backward(*a))
    t, k, e, h, i = 5, 2, 4, 64, 32
    x = torch.randn(t, h).bfloat16().requires_grad_()
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
    weights = torch.softmax(torch.randn(t, k), -1).bfloat16()
    w13, w2 = torch.randn(e, 2 * i, h).bfloat16() / 8, torch.randn(e, h, i).bfloat16() / 8
    if scope is None:
        autograd.moe_experts(x, ids, weights, w13, w2).sum().backward()
    else:
        with tilegemm.use_backend(scope):
            out = autograd.moe_experts(x, ids, weights, w13, w2)
        out.sum().backward()  # outside the scope, as autograd's own thread runs it on CUDA
    assert seen == [scope]
    assert x.grad is not None
