"""``rms_norm`` and its differentiable form against float64 formulas, on the pytorch reference and on cutile.

The float64 reference repeats the op's two roundings (the normalized row to ``x.dtype``, the weight product to
the output dtype), so the bar is the design's exact-formula bar (1e-6) whatever the dtype. Also: the pytorch
backend is transformers' RMSNorm module bit for bit, cutile is within one step of the output dtype of it (only
the order of the squares' sum differs; in fp32, where no rounding to a coarser dtype absorbs that, within the
error of an fp32 sum of H squares), reruns are bitwise identical, rows longer than the kernel's fall back,
and bad input is rejected naming the argument.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilegemm as tg
from tilegemm.autograd import rms_norm as rms_norm_fn
from tilegemm.bench.norm import stock_rms_norm as stock_module
from tilegemm.heuristics.cutile import NORM_MAX_COLS
from tilegemm.testing import backend_device_params, calc_diff
from tilegemm.testing import rms_norm_float64 as reference

BACKENDS = backend_device_params()
BAR = 1e-6
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (leading dims, H): decode rows, per-head rows (128), DeepSeek-V3's 7168 and 1536, lengths off every power of
# two, one-element rows, more rows than a tile holds, no rows, and the longest row the kernel holds.
SHAPES = [
    ((1,), 2048),
    ((3, 5), 128),
    ((2, 33, 4), 128),
    ((130,), 1000),
    ((7,), 7168),
    ((4,), 1536),
    ((9,), 1),
    ((5,), 97),
    ((0,), 64),
    ((3,), 0),
    ((2,), NORM_MAX_COLS),
]


@pytest.fixture
def strict(monkeypatch, backend):
    """On cutile a fallback would test the reference twice: make it an error."""
    if backend == "cutile":
        monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _sid(shape) -> str:
    lead, h = shape
    return "x".join(map(str, (*lead, h)))


def _inputs(lead, h, dtype, device, w_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(*lead, h, generator=g)).to(dtype).to(device)
    w = (1 + 0.5 * torch.randn(h, generator=g)).to(w_dtype or dtype).to(device)
    return x, w


def _close_to_stock(test: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 / fp16: every element of ``test`` is ``ref`` or a neighbour of it (a last-bit change of the fp32 scale
    moves a 16-bit rounding by at most one step). fp32: no rounding absorbs it; another order of the H squares'
    fp32 sum moves the scale (and every output) by a few fp32 steps: calc_diff < 1e-12."""
    if test.dtype == torch.float32:
        assert test.numel() == 0 or calc_diff(test, ref) < 1e-12
        return
    eps = torch.finfo(test.dtype).eps
    mag = torch.maximum(test.float().abs(), ref.float().abs()).clamp(min=torch.finfo(test.dtype).tiny)
    step = torch.exp2(torch.floor(torch.log2(mag))) * eps
    worst = ((test.float() - ref.float()).abs() / step).max().item() if test.numel() else 0.0
    assert worst <= 1.0, f"max |test - ref| is {worst:.2f} steps of {test.dtype}"


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=_sid)
def test_rms_norm(backend, device, strict, shape, dtype):
    lead, h = shape
    x, w = _inputs(lead, h, dtype, device)
    eps = 1e-6
    y = tg.rms_norm(x, w, eps, backend=backend)
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    want = reference(x, w, eps)
    assert torch.isfinite(y).all()
    if y.numel():
        assert calc_diff(y, want) < BAR
    _close_to_stock(y, stock_module(x, w, eps))
    if backend == "pytorch":
        assert torch.equal(y, stock_module(x, w, eps))
    assert torch.equal(tg.rms_norm(x, w, eps, backend=backend), y)


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_rms_norm_strided_mixed_dtypes_and_eps(backend, device, strict):
    """A transposed view (non-unit column stride: the cutile host copies it), a column slice, an fp32 weight on
    bf16 rows (fp32 output), a large eps."""
    x, w = _inputs((64,), 96, torch.bfloat16, device)
    for view in (x.t().contiguous().t(), torch.cat([x, x], 1)[:, 5:101]):
        y = tg.rms_norm(view, w, 1e-5, backend=backend)
        assert calc_diff(y, reference(view, w, 1e-5)) < BAR
    w32 = w.float()
    y = tg.rms_norm(x, w32, 0.25, backend=backend)
    assert y.dtype == torch.float32
    assert calc_diff(y, reference(x, w32, 0.25)) < BAR


@pytest.mark.gpu
def test_rows_longer_than_the_kernel_fall_back(monkeypatch):
    monkeypatch.delenv("TILEGEMM_DISABLE_FALLBACK", raising=False)
    x, w = _inputs((3,), NORM_MAX_COLS + 8, torch.bfloat16, "cuda")
    with pytest.warns(UserWarning, match="rms_norm"):
        y = tg.rms_norm(x, w, backend="cutile")
    assert torch.equal(y, stock_module(x, w, 1e-6))


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_autograd_rms_norm(backend, device, strict, dtype):
    """Gradients against float64 autograd of the unrounded formula (the op's rounding passed straight through)."""
    x, w = _inputs((6, 5), 200, dtype, device)
    grad = torch.randn(6, 5, 200, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    (wd * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)).backward(grad.double())
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    with tg.use_backend(backend):
        y = rms_norm_fn(xa, wa, 1e-6)
        y.backward(grad)
    assert calc_diff(y, reference(x, w, 1e-6)) < BAR
    bar = BAR if dtype == torch.float32 else 1e-5  # one bf16 rounding of each gradient, none in the float64 side
    assert calc_diff(xa.grad, xd.grad) < bar
    assert calc_diff(wa.grad, wd.grad) < bar
    assert xa.grad.dtype == dtype and wa.grad.dtype == dtype


def test_autograd_rms_norm_is_a_custom_op():
    x, w = _inputs((4,), 64, torch.float32, "cpu")
    torch.library.opcheck(torch.ops.tilegemm.rms_norm.default, (x.requires_grad_(), w.requires_grad_(), 1e-6))


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bad_input_is_rejected_naming_the_argument(data):
    x, w = _inputs((3,), 16, torch.float32, "cpu")
    fault = data.draw(st.sampled_from(["x_dtype", "x_type", "x_0d", "w_dtype", "w_shape", "w_2d", "eps", "device"]))
    kwargs = dict(x=x, weight=w, eps=1e-6)
    name, error = {
        "x_dtype": ("x", TypeError), "x_type": ("x", TypeError), "x_0d": ("x", ValueError),
        "w_dtype": ("weight", TypeError), "w_shape": ("weight", ValueError), "w_2d": ("weight", ValueError),
        "eps": ("eps", None), "device": ("weight", ValueError),
    }[fault]  # fmt: skip
    if fault == "x_dtype":
        kwargs["x"] = x.to(data.draw(st.sampled_from([torch.int32, torch.float64, torch.bool])))
    elif fault == "x_type":
        kwargs["x"] = x.tolist()
    elif fault == "x_0d":
        kwargs["x"] = x[0, 0]
    elif fault == "w_dtype":
        kwargs["weight"] = w.to(torch.int64)
    elif fault == "w_shape":
        kwargs["weight"] = torch.ones(data.draw(st.integers(0, 40).filter(lambda n: n != 16)))
    elif fault == "w_2d":
        kwargs["weight"] = w[None]
    elif fault == "device":
        kwargs["weight"] = w.to("meta")
    else:
        value, error = data.draw(
            st.sampled_from([(-1e-6, ValueError), (math.inf, ValueError), (math.nan, ValueError), ("1", TypeError)])
        )
        kwargs["eps"] = value
    for fn in (tg.rms_norm, rms_norm_fn):
        with pytest.raises(error, match=name):
            fn(**kwargs)
