"""Differentiable functional ops on top of the public GEMMs, as ``torch.library`` custom ops.

Each op is a custom op (``tilegemm::...``) with a fake (meta) implementation and an autograd
formula, so it trains, traces under ``torch.compile(fullgraph=True)`` as one opaque node and
can be captured in a CUDA graph when its backend can. The ops run on the current tilegemm
backend (``set_backend`` / ``use_backend``).

* :func:`matmul` ``(a [M, K], b [K, N]) -> [M, N]``, bf16: ``bf16_gemm_nn`` forward,
  ``bf16_gemm_nt`` / ``bf16_gemm_tn`` backward.
* :func:`grouped_matmul` ``(x [M, K], w [G, N, K], offs [G]) -> [M, N]``: row r of group g
  (rows ``offs[g-1] <= r < offs[g]``, ``torch._grouped_mm``'s meaning) gets ``x[r] @ w[g].T``
  (``x[r] @ w[g]`` for ``transposed`` ``w [G, K, N]``); rows past ``offs[-1]`` get 0. Forward
  ``m_grouped_bf16_gemm_nt_contiguous`` (``_nn_`` when transposed; psum layout, ``alignment=1``),
  input gradient the other of the two, weight gradient ``k_grouped_bf16_gemm_tn_contiguous``. The
  weight gradient needs the group sizes on the host (one device-to-host copy of ``offs`` per
  backward). bf16 runs on the current backend; fp16 and fp32 run the same ops on the ``pytorch``
  backend (:func:`tilegemm.ops.op_call.run_op`: fp32 products and sums, rounded once), so fp16/fp32
  models train through the same formulas.
* :func:`fp8_grouped_matmul` ``(x, w, offs, w_fp8=None)``: :func:`grouped_matmul` with the FP8 forward
  ``m_grouped_fp8_gemm_nt_contiguous`` (``x`` cast per token, ``w`` per 128x128 block or a cached copy)
  and :func:`grouped_matmul`'s backward on the unquantized tensors (straight-through).
* :func:`moe_experts` ``(hidden [T, H], topk_ids [T, k], topk_weights [T, k], w13 [E, 2I, H], w2 [E, H, I])
  -> [T, H]``: :func:`tilegemm.moe_experts` (routing, gated MLPs, weighted combine) with gradients to ``hidden``,
  ``topk_weights``, ``w13`` and ``w2``: ``moe_experts_forward`` keeps the routed rows, ``moe_experts_backward``
  is the fused backward (``ops/cutile/moe_train.py``: the activation's backward in the ``dh`` GEMM's epilogue,
  weight gradients by the k-grouped kernel on the aligned layout, no host sync, bitwise-identical reruns).
* :func:`rms_norm` ``(x [..., H], weight [H], eps) -> [..., H]``: :func:`tilegemm.rms_norm` forward (one kernel on
  the current backend); the backward is the fp32 formula in torch ops (below the forward kernel in cost: it runs in
  training only).
* :func:`fp8_linear` ``(x [..., K], weight [N, K], bias=None) -> [..., N]``, bf16 in and out:
  ``x`` is cast per token (1x128) and ``weight`` per 128x128 block to FP8, then
  ``fp8_gemm_nt``. The backward is straight-through: gradients are the BF16 GEMMs of the
  unquantized tensors (the usual FP8-training recipe for activations' gradients in bf16).
"""

from __future__ import annotations

import torch

from tilegemm.backend import registry
from tilegemm.backend.selector import get_current_backend
from tilegemm.ops import api
from tilegemm.ops.checks import (
    LAYOUTS,
    fp8_linear_check,
    fp8_weight_check,
    grouped_matmul_check,
    matmul_check,
    moe_experts_check,
    rms_norm_check,
)
from tilegemm.ops.common import MoETrainState
from tilegemm.ops.op_call import grouped_linear, grouped_linear_fp8, run_op
from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.routing import ALIGNED_ROWS, max_padded_rows

Tensor = torch.Tensor


def _gemm_out_shape(a: Tensor, b: Tensor, layout: str) -> tuple[int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: got {layout!r}, expected one of {sorted(LAYOUTS)}")
    flip_a, flip_b = LAYOUTS[layout]  # stored transposed relative to a [M, K], b [N, K]
    return a.shape[int(flip_a)], b.shape[int(flip_b)]


# ------------------------------------------------------------------------------ custom ops


@torch.library.custom_op("tilegemm::gemm", mutates_args=())
def gemm(a: Tensor, b: Tensor, layout: str) -> Tensor:
    """Out-of-place ``bf16_gemm_<layout>(a, b)``: bf16 [M, N]."""
    d = a.new_empty(_gemm_out_shape(a, b, layout))
    getattr(api, f"bf16_gemm_{layout}")(a, b, d)
    return d


@gemm.register_fake
def _(a: Tensor, b: Tensor, layout: str) -> Tensor:
    return a.new_empty(_gemm_out_shape(a, b, layout))


@torch.library.custom_op("tilegemm::grouped_gemm", mutates_args=())
def grouped_gemm(a: Tensor, b: Tensor, offs: Tensor, layout: str) -> Tensor:
    """Out-of-place ``m_grouped_bf16_gemm_<layout>_contiguous`` with torch-style (unaligned) psum ends: [M, N] in
    ``a.dtype`` (bf16, fp16 or fp32; see :func:`tilegemm.ops.op_call.run_op`)."""
    # offs was validated once by grouped_matmul; run_op skips the value checks and the backward reuses it
    return grouped_linear(a, b, offs, layout == "nn", None)


@grouped_gemm.register_fake
def _(a: Tensor, b: Tensor, offs: Tensor, layout: str) -> Tensor:
    return a.new_empty(a.shape[0], b.shape[1] if layout == "nt" else b.shape[2])


@torch.library.custom_op("tilegemm::grouped_weight_grad", mutates_args=())
def grouped_weight_grad(grad: Tensor, x: Tensor, offs: Tensor) -> Tensor:
    """``dw[g] = grad_g.T @ x_g`` over the psum groups of ``offs``: fp32 [G, N, K] (``k_grouped`` TN)."""
    ends = offs.tolist()
    ks = [end - start for start, end in zip([0, *ends[:-1]], ends)]
    ks_device = torch.diff(offs, prepend=offs.new_zeros(1)).to(torch.int32)
    dw = grad.new_empty(len(ks), grad.shape[1], x.shape[1], dtype=torch.float32)
    # ks_device is ks by construction (run_op skips the value checks)
    run_op("k_grouped_bf16_gemm_tn_contiguous", None, a=grad[: sum(ks)], b=x[: sum(ks)], d=dw, ks_cpu=ks,
           grouped_layout=ks_device)  # fmt: skip
    return dw


@grouped_weight_grad.register_fake
def _(grad: Tensor, x: Tensor, offs: Tensor) -> Tensor:
    return grad.new_empty(offs.shape[0], grad.shape[1], x.shape[1], dtype=torch.float32)


@torch.library.custom_op("tilegemm::fp8_grouped_gemm", mutates_args=())
def fp8_grouped_gemm(x: Tensor, w: Tensor, w_data: Tensor, w_scale: Tensor, offs: Tensor) -> Tensor:
    """``m_grouped_fp8_gemm_nt_contiguous`` of ``x`` (cast per token) and ``(w_data, w_scale)`` (the FP8 blocks
    of ``w [G, N, K]``, which only the backward reads): [M, N] in ``x.dtype``."""
    return grouped_linear_fp8(x, (w_data, w_scale), offs, None)


@fp8_grouped_gemm.register_fake
def _(x: Tensor, w: Tensor, w_data: Tensor, w_scale: Tensor, offs: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("tilegemm::fp8_linear_forward", mutates_args=())
def fp8_linear_forward(x: Tensor, weight: Tensor) -> Tensor:
    """``x [M, K] @ weight [N, K].T`` with both cast to FP8 (1x128 / 128x128 blocks): bf16 [M, N]."""
    d = x.new_empty(x.shape[0], weight.shape[0])
    api.fp8_gemm_nt(per_token_cast_to_fp8(x), per_block_cast_to_fp8(weight), d)
    return d


@fp8_linear_forward.register_fake
def _(x: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("tilegemm::moe_experts_train", mutates_args=())
def moe_experts_train(
    hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor, activation: str
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``moe_experts_forward`` on arguments :func:`moe_experts` has checked: the output, then the fields of its
    ``MoETrainState``."""
    arguments = dict(hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w2=w2)
    out, state = registry.call_checked("moe_experts_forward", dict(arguments, activation=activation, stream=None))
    return (out, *state)


@moe_experts_train.register_fake
def _(hidden, topk_ids, topk_weights, w13, w2, activation):
    (tokens, hidden_dim), top_k = hidden.shape, topk_ids.shape[1]
    experts, inter = w13.shape[0], w2.shape[2]
    rows = max_padded_rows(tokens, top_k, experts, ALIGNED_ROWS)
    int32 = dict(dtype=torch.int32)
    return (
        hidden.new_empty(tokens, hidden_dim), hidden.new_empty(rows, **int32),
        hidden.new_empty(rows, dtype=torch.float32), hidden.new_empty(tokens, top_k, **int32),
        hidden.new_empty(experts, **int32), hidden.new_empty(rows, 2 * inter), hidden.new_empty(rows, inter),
        hidden.new_empty(rows, hidden_dim),
    )  # fmt: skip


@torch.library.custom_op("tilegemm::moe_experts_grad", mutates_args=())
def moe_experts_grad(
    grad_out: Tensor, hidden: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor,
    row_token: Tensor, row_weight: Tensor, dest: Tensor, ends: Tensor, gate_up: Tensor, h: Tensor, y: Tensor,
    activation: str, needs: list[bool], backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``moe_experts_backward`` on ``backend``; a gradient not in ``needs`` comes back as an empty tensor."""
    state = MoETrainState(row_token, row_weight, dest, ends, gate_up, h, y)
    needs = tuple(needs)
    grads = api.moe_experts_backward(grad_out, hidden, topk_weights, w13, w2, state, activation, needs, backend=backend)
    return tuple(hidden.new_empty(0) if g is None else g for g in grads)


@moe_experts_grad.register_fake
def _(grad_out, hidden, topk_weights, w13, w2, *state_activation_needs_backend):
    needs = state_activation_needs_backend[-2]
    inputs = (hidden, topk_weights, w13, w2)
    return tuple(t.new_empty(t.shape) if need else hidden.new_empty(0) for t, need in zip(inputs, needs, strict=True))


@torch.library.custom_op("tilegemm::rms_norm", mutates_args=())
def rms_norm_forward(x: Tensor, weight: Tensor, eps: float, backend: str | None = None) -> Tensor:
    """``tilegemm.rms_norm(x, weight, eps, backend=backend)``: [..., H] in ``promote_types(x.dtype, weight.dtype)``
    (``backend=None``: the current backend when the op runs)."""
    return api.rms_norm(x, weight, eps, backend=backend)


@rms_norm_forward.register_fake
def _(x: Tensor, weight: Tensor, eps: float, backend: str | None = None) -> Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


# ------------------------------------------------------------------------------- autograd


def _save_inputs(ctx, inputs, output) -> None:
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, Tensor)))
    ctx.layout = inputs[-1] if isinstance(inputs[-1], str) else None


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    if ctx.layout != "nn":
        raise NotImplementedError("tilegemm::gemm is differentiable in the 'nn' layout (what matmul uses)")
    grad = grad.contiguous()
    grad_a = gemm(grad, b, "nt") if ctx.needs_input_grad[0] else None  # [M,N] @ [K,N].T
    grad_b = gemm(a, grad, "tn") if ctx.needs_input_grad[1] else None  # [M,K].T @ [M,N]
    return grad_a, grad_b, None


def _grouped_backward(ctx, grad):
    """``nt`` (``y = x @ w[g].T``, w [G, N, K]): dx = grad @ w[g] (``nn``), dw[g] = grad_g.T @ x_g.
    ``nn`` (``y = x @ w[g]``, w [G, K, N]): dx = grad @ w[g].T (``nt``), dw[g] = x_g.T @ grad_g."""
    x, w, offs = ctx.saved_tensors
    grad = grad.contiguous()
    other = "nn" if ctx.layout == "nt" else "nt"
    grad_x = grouped_gemm(grad, w, offs, other) if ctx.needs_input_grad[0] else None
    grad_w = None
    if ctx.needs_input_grad[1]:
        grad_w = grouped_weight_grad(grad, x, offs) if ctx.layout == "nt" else grouped_weight_grad(x, grad, offs)
        grad_w = grad_w.to(w.dtype)
    return grad_x, grad_w, None, None


def _save_fp8_grouped(ctx, inputs, output) -> None:
    x, w, _, _, offs = inputs
    ctx.save_for_backward(x, w, offs)
    ctx.layout = "nt"


def _fp8_grouped_backward(ctx, grad):
    grad_x, grad_w, _, _ = _grouped_backward(ctx, grad)
    return grad_x, grad_w, None, None, None


def _fp8_linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    grad = grad.contiguous()
    grad_x = gemm(grad, weight, "nn") if ctx.needs_input_grad[0] else None  # [M,N] @ [N,K]
    grad_w = gemm(grad, x, "tn") if ctx.needs_input_grad[1] else None  # [M,N].T @ [M,K]
    return grad_x, grad_w


def _save_moe(ctx, inputs, output) -> None:
    hidden, _, topk_weights, w13, w2, activation = inputs
    ctx.save_for_backward(hidden, topk_weights, w13, w2, *output[1:])
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zero gradients for the saved rows (three [M, *] fills per backward)
    ctx.activation = activation
    # The backward runs where the forward ran: on CUDA autograd calls it from its own thread, which does not see
    # the forward's use_backend scope.
    ctx.backend = get_current_backend()


def _moe_backward(ctx, grad_out, *_):
    hidden, topk_weights, w13, w2, *state = ctx.saved_tensors
    needs = [ctx.needs_input_grad[i] for i in (0, 2, 3, 4)]
    if grad_out is None or not any(needs):
        return None, None, None, None, None, None
    grads = moe_experts_grad(
        grad_out.contiguous(), hidden, topk_weights, w13, w2, *state, ctx.activation, needs, ctx.backend
    )
    d_hidden, d_weights, d_w13, d_w2 = (g if need else None for g, need in zip(grads, needs, strict=True))
    return d_hidden, None, d_weights, d_w13, d_w2, None


def _save_rms_norm(ctx, inputs, output) -> None:
    x, weight, eps, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward(ctx, grad):
    """With ``r = rsqrt(mean(x^2) + eps)``, ``xh = x * r`` and ``n = round(xh)`` (fp32 throughout, the rounding
    passed straight through): ``dw = sum_rows(grad * n)``, ``g = grad * w``, ``dx = r * (g - xh * mean(g * xh))``."""
    x, weight = ctx.saved_tensors
    x32 = x.float()
    r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + ctx.eps)
    xh = x32 * r
    grad32 = grad.float()
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        g = grad32 * weight.float()
        grad_x = (r * (g - xh * (g * xh).mean(-1, keepdim=True))).to(x.dtype)
    if ctx.needs_input_grad[1]:
        n = xh.to(x.dtype).float()
        grad_w = (grad32 * n).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return grad_x, grad_w, None, None


gemm.register_autograd(_gemm_backward, setup_context=_save_inputs)
grouped_gemm.register_autograd(_grouped_backward, setup_context=_save_inputs)
fp8_linear_forward.register_autograd(_fp8_linear_backward, setup_context=_save_inputs)
fp8_grouped_gemm.register_autograd(_fp8_grouped_backward, setup_context=_save_fp8_grouped)
moe_experts_train.register_autograd(_moe_backward, setup_context=_save_moe)
rms_norm_forward.register_autograd(_rms_norm_backward, setup_context=_save_rms_norm)


# ----------------------------------------------------------------------- functional API


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Differentiable ``a @ b`` for bf16 ``a [M, K]`` and ``b [K, N]``; returns bf16 [M, N] (fp32 accumulate).

    Raises:
        TypeError, ValueError: ``a`` or ``b`` is not a bf16 matrix, K differs, or they are on two devices.
    """
    matmul_check(a, b)
    return gemm(a, b, "nn")


def grouped_matmul(x: Tensor, w: Tensor, offs: Tensor, transposed: bool = False) -> Tensor:
    """Differentiable grouped ``x @ w[g].T`` (MoE experts); returns [M, N] in ``x.dtype``.

    Args:
        x: [M, K] bf16, fp16 or fp32, rows sorted by group.
        w: [G, N, K] of ``x``'s dtype, one weight per group (``nn.Linear`` layout); ``[G, K, N]`` with
            ``transposed`` (the product is then ``x @ w[g]``).
        offs: int32 [G] cumulative group end rows (``torch._grouped_mm``'s ``offs``); rows past
            ``offs[-1]`` get 0 and no gradient.
        transposed: ``w`` is stored ``[G, K, N]``.

    bf16 runs on the current backend (the cuTile grouped kernels on a GPU); fp16 and fp32 run the same ops
    on the ``pytorch`` backend with fp32 products and sums, rounded once to ``x.dtype``.

    ``offs`` is validated here when value checks run (always on the CPU; on CUDA with
    ``TILEGEMM_CHECK_VALUES=1``, never inside ``skip_value_checks()``, CUDA-graph capture or ``torch.compile``
    tracing); the GEMMs of the forward and backward then trust it.

    Raises:
        TypeError, ValueError: a wrong type, dtype, shape or device of ``x``, ``w`` or ``offs``, or (value
            checks) ``offs`` decreasing or past M; the message names the argument.
    """
    grouped_matmul_check(x, w, offs, transposed)
    return grouped_gemm(x, w, offs, "nn" if transposed else "nt")


def fp8_grouped_matmul(x: Tensor, w: Tensor, offs: Tensor, w_fp8: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """:func:`grouped_matmul` (``x @ w[g].T``) with an FP8 forward and a straight-through backward.

    The forward casts ``x`` per token (1x128 scales) and multiplies by ``w``'s 128x128-block FP8 copy
    (``m_grouped_fp8_gemm_nt_contiguous``, fp32 accumulation); the gradients are those of
    :func:`grouped_matmul` on the unquantized ``x`` and ``w`` (the usual FP8 training recipe).

    Args:
        x: [M, K] bf16, fp16 or fp32, rows sorted by group.
        w: [G, N, K] of ``x``'s dtype; gradients flow to it.
        offs: int32 [G] cumulative group end rows (``torch._grouped_mm``'s ``offs``); rows past ``offs[-1]``
            get 0 and no gradient.
        w_fp8: ``w``'s FP8 copy ``(float8_e4m3fn [G, N, K], fp32 scales [G, ceil(N/128), ceil(K/128)])``, as
            :func:`tilegemm.per_block_cast_to_fp8` makes it; ``None`` quantizes ``w`` on this call. Pass a
            cached copy to quantize once per weight update.

    Returns:
        [M, N] in ``x.dtype``.

    Raises:
        TypeError, ValueError: as :func:`grouped_matmul`, or ``w_fp8`` not matching ``w``.
    """
    grouped_matmul_check(x, w, offs)
    if w_fp8 is None:
        w_fp8 = per_block_cast_to_fp8(w.detach())
    fp8_weight_check(w_fp8, w)
    return fp8_grouped_gemm(x, w, w_fp8[0], w_fp8[1], offs)


def moe_experts(
    hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor, activation: str = "silu"
) -> Tensor:
    """Differentiable fused MoE experts: :func:`tilegemm.moe_experts` with gradients (training).

    Args:
        hidden: [T, H] bf16 (fp16 / fp32 run on the ``pytorch`` backend); gets a gradient.
        topk_ids: int32/int64 [T, k]; ids outside ``[0, E)`` drop the slot (zero gradients for it).
        topk_weights: float [T, k] routing weights; gets a gradient.
        w13: [E, 2I, H] gate rows then up rows, ``hidden``'s dtype; gets a gradient.
        w2: [E, H, I], ``hidden``'s dtype; gets a gradient.
        activation: ``"silu"``, ``"gelu"`` (erf; ``pytorch`` backend only) or ``"gelu_tanh"``.

    Returns:
        [T, H] in ``hidden.dtype``: ``out[t] = round(sum_j w[t, j] * round(h_j @ w2[e].T))`` with
        ``h_j = round(act(x @ w13[e, :I].T) * (x @ w13[e, I:].T))`` (fp32 sums; ``moe_experts_forward``).
        The backward is ``moe_experts_backward`` (its docstring has the formulas and roundings). Both run on the
        backend current at the forward, with no host sync, so a training step can be captured in a CUDA graph;
        reruns are bitwise identical.

    Raises:
        TypeError, ValueError: as :func:`tilegemm.moe_experts`.
    """
    moe_experts_check(hidden, topk_ids, topk_weights, w13, w2, activation)  # once: moe_experts_train trusts it
    return moe_experts_train(hidden, topk_ids, topk_weights, w13, w2, activation)[0]


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Differentiable RMSNorm over the last dimension: :func:`tilegemm.rms_norm` with gradients (training).

    Args:
        x: [..., H] bf16, fp16 or fp32; gets a gradient.
        weight: [H] bf16, fp16 or fp32; gets a gradient.
        eps: a finite float >= 0.

    Returns:
        [..., H] in ``promote_types(x.dtype, weight.dtype)``: ``weight * round(x * rsqrt(mean(x^2) + eps))``
        (fp32 math, rounded to ``x.dtype`` before the weight), as transformers' RMSNorm modules compute it.
        Gradients, in fp32 and rounded once to each input's dtype: ``dweight = sum_rows(grad * n)`` with ``n`` the
        rounded normalized rows, ``dx = r * (g - xh * mean(g * xh))`` with ``g = grad * weight``,
        ``r = rsqrt(mean(x^2) + eps)`` and ``xh = x * r`` (the rounding to ``x.dtype`` passed straight through).

    Raises:
        TypeError, ValueError: as :func:`tilegemm.rms_norm`.
    """
    eps = rms_norm_check(x, weight, eps)["eps"]
    return rms_norm_forward(x, weight, eps)


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` with an FP8 forward: ``x [..., K] @ weight [N, K].T (+ bias)``, bf16 in and out.

    The forward casts ``x`` per token (1x128 scales) and ``weight`` per 128x128 block, then runs
    ``fp8_gemm_nt`` (fp32 accumulation); the backward is straight-through in BF16.

    Raises:
        TypeError, ValueError: ``x`` or ``weight`` not bf16, K differs, ``bias`` not bf16 ``[N]``, or tensors
            on two devices; checked before any GEMM runs.
    """
    fp8_linear_check(x, weight, bias)
    out = fp8_linear_forward(x.reshape(-1, x.shape[-1]), weight).reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias
