"""Helpers shared by tests, benchmarks and the demo: ``calc_diff``, FP8 dequantization, timing, poison.

Also DeepGEMM 2.6's ``deep_gemm.testing`` names, so that DeepGEMM's test files run through
``import tilegemm as deep_gemm``: ``calc_diff``, ``count_bytes``, ``assert_bitwise_equal``, ``get_arch_major``,
``test_filter``, ``ignore_env``, and the timers ``bench`` / ``bench_kineto`` (``tilegemm.kernel_timing``).
Kept free of pytest (``backend_device_params`` imports it lazily).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from tilegemm.kernel_timing import bench, bench_kineto, empty_suppress, suppress_stdout_stderr  # noqa: F401
from tilegemm.ops.checks import calc_diff_check
from tilegemm.ops.common import hadamard_matrix

#: (backend, device) pairs the per-op tests run: the pytorch reference on the CPU and on CUDA,
#: and the cutile backend on CUDA.
BACKEND_DEVICES = (("pytorch", "cpu"), ("pytorch", "cuda"), ("cutile", "cuda"))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity error ``1 - 2 * sum(x * y) / sum(x * x + y * y)``, in float64.

    0 for identical tensors (also for two all-zero tensors, where the formula is 0/0), about
    ``|x - y|^2 / (2 |x|^2)`` for close ones; NaN or inf anywhere gives NaN, so a NaN never passes a
    ``calc_diff(...) < bar`` check.
    """
    calc_diff_check(x, y)
    x64, y64 = x.double(), y.double()
    denom = (x64 * x64 + y64 * y64).sum().item()
    num = (x64 * y64).sum().item()
    if not (math.isfinite(denom) and math.isfinite(num)):
        return float("nan")
    if denom == 0.0:
        return 0.0
    return 1.0 - 2.0 * num / denom


def count_bytes(*tensors: Any) -> int:
    """Bytes held by ``tensors``: each tensor's ``numel * element_size``, tuples and lists (FP8 operands)
    counted element by element, ``None`` skipped."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """Raise AssertionError unless ``x`` and ``y`` have one shape and dtype and the same bytes; the message names
    the first differing element (its coordinates and both values)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise AssertionError(
            f"bitwise mismatch{f' ({label})' if label else ''}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        )
    xb, yb = x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)
    if torch.equal(xb, yb):
        return
    diff = (xb != yb).flatten()
    first = int(diff.nonzero()[0].item())
    elem = first // x.element_size()
    coord = tuple(int(v) for v in torch.unravel_index(torch.tensor(elem), tuple(x.shape)))
    raise AssertionError(
        f"bitwise mismatch{f' ({label})' if label else ''}: {int(diff.sum())} of {diff.numel()} bytes differ, "
        f"first at element {coord}: x={x.flatten()[elem].item()}, y={y.flatten()[elem].item()}"
    )


def get_arch_major() -> int:
    """The compute-capability major of the current CUDA device (9 on Hopper)."""
    return torch.cuda.get_device_capability()[0]


def test_filter(condition: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: run the function only when ``condition()`` is true, else print that it was filtered."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return func(*args, **kwargs)
            print(f"{func.__name__}:\n > Filtered by {condition}\n")
            return None

        return wrapper

    return decorator


test_filter.__test__ = False  # a helper, not a pytest test


def ignore_env(name: str, condition: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: while the function runs, environment variable ``name`` is unset when ``condition()`` is true
    (restored afterwards)."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not condition():
                return func(*args, **kwargs)
            saved = os.environ.pop(name, None)
            try:
                return func(*args, **kwargs)
            finally:
                if saved is not None:
                    os.environ[name] = saved

        return wrapper

    return decorator


def dequantize(data: torch.Tensor, scale: torch.Tensor, gran_rows: int, gran_cols: int = 128) -> torch.Tensor:
    """Upcast FP8 ``data [..., R, C]`` with block scales ``scale [..., ceil(R/gran_rows), ceil(C/gran_cols)]``.

    Returns float64 ``data[..., r, c] * scale[..., r // gran_rows, c // gran_cols]``.
    """
    rows, cols = data.shape[-2], data.shape[-1]
    s = scale.double().repeat_interleave(gran_rows, dim=-2).repeat_interleave(gran_cols, dim=-1)
    return data.double() * s[..., :rows, :cols]


def dequant_per_token(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float64 values of a 1x128 operand (LHS, or RHS of recipe (1, 1, 128)): scale ``[..., R, ceil(C/128)]``."""
    return dequantize(data, scale, 1, 128)


def dequant_per_block(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float64 values of a 128x128-block operand: scale ``[..., ceil(R/128), ceil(C/128)]``."""
    return dequantize(data, scale, 128, 128)


#: The experts ops' activations by name, from ``torch.nn.functional`` (independent of the backends' own formulas):
#: what the tests' float64 formulas of ``moe_experts`` / ``fp8_moe_experts`` apply to the gate columns.
MOE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
}


def moe_experts_float64(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    grad: torch.Tensor,
    activation: str = "silu",
) -> dict[str, torch.Tensor]:
    """The MoE experts formula and its gradients in float64 by autograd, on ``x``'s device, expert by expert.

    ``out[t] = sum_j w[t, j] * (act(x[t] @ w13[e, :I].T) * (x[t] @ w13[e, I:].T)) @ w2[e].T`` over the slots j
    whose expert ``e = ids[t, j]`` is in ``[0, E)``; returns ``out`` and the gradients of ``sum(out * grad)`` to
    ``x``, ``weights``, ``w13`` and ``w2`` (keys ``out``, ``x``, ``routing_weights``, ``w13``, ``w2``).
    """
    leaves = [t.detach().double().requires_grad_() for t in (x, weights, w13, w2)]
    xd, wd, w13d, w2d = leaves
    inter = w2.shape[2]
    out = torch.zeros_like(xd)
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel():
            gu = xd[tok] @ w13d[e].T
            y = (MOE_ACTIVATIONS[activation](gu[:, :inter]) * gu[:, inter:]) @ w2d[e].T
            out = out.index_add(0, tok, wd[tok, slot][:, None] * y)
    out.backward(grad.double())
    return {"out": out.detach(), "x": xd.grad, "routing_weights": wd.grad, "w13": w13d.grad, "w2": w2d.grad}


def rms_norm_float64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``tilegemm.rms_norm``'s formula in float64 with its two roundings where the op rounds: the normalized rows
    ``x * rsqrt(mean(x^2, -1) + eps)`` to ``x.dtype``, the weight product to ``promote_types(x.dtype,
    weight.dtype)``; returned as float64."""
    x64 = x.double()
    n = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).double()
    return (weight.double() * n).to(torch.promote_types(x.dtype, weight.dtype)).double()


def window_ends_float64(mask: torch.Tensor) -> torch.Tensor:
    """Each row of an attention mask ``[..., T]`` (boolean: True is visible; additive: above its dtype's lowest value
    is visible) as the MQA-logits prepare ops store it: its last visible key + 1, 0 where none. Computed as the
    largest product of the visibility with the key numbers 1..T in float64 (another formula than the ops' select);
    int32 ``[...]`` on the CPU."""
    seen = mask.cpu() if mask.dtype == torch.bool else mask.cpu().double() > torch.finfo(mask.dtype).min
    numbers = torch.arange(1, mask.shape[-1] + 1, dtype=torch.float64)
    ends = (seen.double() * numbers).amax(dim=-1) if mask.shape[-1] else torch.zeros(mask.shape[:-1])
    return ends.to(torch.int32)


def fp8_round_trip_per_token(v: torch.Tensor) -> torch.Tensor:
    """float64 ``v [..., K]`` (K a multiple of 128) quantized to e4m3 with one scale per 128 values, as
    ``per_token_cast_to_fp8`` does (``scale = max(amax, 1e-4) / 448``, held in fp32), then dequantized: the
    float64 formula of a kernel that quantizes a computed intermediate. Returns float64 of ``v``'s shape."""
    blocks = v.double().reshape(*v.shape[:-1], -1, 128)
    scale = (blocks.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-4) / 448.0).double()
    q = (blocks / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).double()
    return (q * scale).reshape(v.shape)


def fp8_rows_float64(x: torch.Tensor, hadamard: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 formula of ``fp8_quantize_rows`` before the cast: ``y = x @ H`` (the orthonormal Sylvester-Hadamard
    matrix of the last dim, with ``hadamard``) or ``x``, and its row scales ``max(amax(|y|), 1e-4) / 448``; float64
    ``[..., D]`` and ``[...]`` on the CPU."""
    y = x.detach().double().cpu()
    if hadamard:
        dim = y.shape[-1]
        y = y @ (hadamard_matrix(dim, torch.device("cpu"), torch.float64, signs=True) / math.sqrt(dim))
    return y, y.abs().amax(-1).clamp_min(1e-4) / 448


def assert_fp8_rows(q: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, hadamard: bool = False) -> None:
    """Assert that ``(q, scale)`` is the per-row FP8 cast of ``x`` (``fp8_quantize_rows``): float8_e4m3fn of ``x``'s
    shape and fp32 ``x.shape[:-1]``, the scales within fp32 rounding of :func:`fp8_rows_float64`'s, and ``q * scale``
    within half an FP8 step of ``y`` (2**-4 relative, or half the smallest subnormal step of the row)."""
    y, want = fp8_rows_float64(x, hadamard)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape, (q.dtype, q.shape)
    assert scale.dtype == torch.float32 and scale.shape == x.shape[:-1], (scale.dtype, scale.shape)
    s64 = scale.double().cpu()
    assert torch.allclose(s64, want, rtol=1e-5, atol=0)
    back = q.double().cpu() * s64.unsqueeze(-1)
    assert ((back - y).abs() <= y.abs() * 2**-4 + s64.unsqueeze(-1) * 2**-9 * 1.01).all()


def poisoned(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
    """A tensor full of NaN (so unwritten output elements show up in any check)."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def assert_rerun_identical(fn: Callable[[], Any], d: torch.Tensor) -> None:
    """Assert that ``d`` (after a first ``fn()`` into a :func:`poisoned` ``d``) holds no NaN (every element was
    written) and that calling ``fn()`` again leaves its bytes unchanged (a bitwise-identical rerun)."""
    assert not torch.isnan(d).any(), "d has unwritten (NaN) elements"
    first = d.clone()
    fn()
    assert torch.equal(first.view(torch.uint8), d.view(torch.uint8)), "rerun is not bitwise identical"


def replay_after(fn: Callable[[], Any], change: Callable[[], Any]) -> None:
    """Run ``fn()`` once (its compiles and plans made outside a capture), capture a second call in a CUDA graph,
    ``change()`` what it reads (new inputs and outputs, in place), replay the graph and synchronize: the caller then
    checks what the replay wrote."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    change()
    graph.replay()
    torch.cuda.synchronize()


def backend_device_params() -> list[Any]:
    """``pytest.param(backend, device)`` per :data:`BACKEND_DEVICES`; CUDA ones are ``gpu``-marked, skip w/o CUDA."""
    import pytest

    no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    params = []
    for backend, device in BACKEND_DEVICES:
        marks = [pytest.mark.gpu, no_cuda] if device == "cuda" else []
        params.append(pytest.param(backend, device, marks=marks, id=f"{backend}-{device}"))
    return params


def _sync(device: str | torch.device | None) -> None:
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


def bench_kernel(fn: Callable[[], Any], warmup: int = 25, rep: int = 100, device: str | None = None) -> float:
    """Median time of ``fn()`` in milliseconds.

    On CUDA uses ``triton.testing.do_bench`` (``warmup``/``rep`` in ms, median) when triton imports, else
    CUDA events over at least 3 timed calls after a warm-up; on the CPU a ``perf_counter`` loop. The
    ``device`` hint (``"cpu"``/``"cuda"``) picks the timer; ``None`` means CUDA when it is available.
    """
    use_cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    if use_cuda:
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    fn()
    _sync(device if use_cuda else "cpu")
    # Estimate one call, then time enough calls to fill about ``rep`` ms (at least 3).
    t0 = time.perf_counter()
    fn()
    _sync(device if use_cuda else "cpu")
    once_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    iters = max(3, min(1000, int(rep / once_ms)))
    times = []
    for _ in range(iters):
        if use_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def dense_index_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """The transformers DSA indexer's formula (stock's scoring) in float64 (tests and measurements): ``[B, S, T]``
    = ``sum_h w * relu(q . k * scale)``."""
    scores = torch.einsum("bshd,btd->bsht", q.double(), k.double()).mul_(softmax_scale).relu_()
    return torch.einsum("bsh,bsht->bst", weights.double(), scores)
