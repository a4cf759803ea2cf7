"""Differentiable functional ops on top of the public GEMMs.

Each function checks its arguments and calls a custom op of :mod:`tilegemm.custom_ops` (``tilegemm::...``) with a
fake (meta) implementation and an autograd formula, so it trains, traces under ``torch.compile(fullgraph=True)`` as
one opaque node and can be captured in a CUDA graph when its backend can. The ops run on the current tilegemm
backend (``set_backend`` / ``use_backend``; :func:`moe_experts` also takes ``backend=``).

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

from tilegemm import custom_ops
from tilegemm.ops.checks import (
    fp8_linear_check,
    fp8_weight_check,
    grouped_matmul_check,
    matmul_check,
    moe_experts_check,
    rms_norm_check,
)
from tilegemm.quant import per_block_cast_to_fp8

Tensor = torch.Tensor


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Differentiable ``a @ b`` for bf16 ``a [M, K]`` and ``b [K, N]``; returns bf16 [M, N] (fp32 accumulate).

    Raises:
        TypeError, ValueError: ``a`` or ``b`` is not a bf16 matrix, K differs, or they are on two devices.
    """
    matmul_check(a, b)
    return custom_ops.gemm(a, b, "nn")


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
    return custom_ops.grouped_gemm(x, w, offs, "nn" if transposed else "nt")


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
    return custom_ops.fp8_grouped_gemm(x, w, w_fp8[0], w_fp8[1], offs)


def moe_experts(
    hidden: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    w13: Tensor,
    w2: Tensor,
    activation: str = "silu",
    *,
    backend: str | None = None,
) -> Tensor:
    """Differentiable fused MoE experts: :func:`tilegemm.moe_experts` with gradients (training).

    Args:
        hidden: [T, H] bf16 (fp16 / fp32 run on the ``pytorch`` backend); gets a gradient.
        topk_ids: int32/int64 [T, k]; ids outside ``[0, E)`` drop the slot (zero gradients for it).
        topk_weights: float [T, k] routing weights; gets a gradient.
        w13: [E, 2I, H] gate rows then up rows, ``hidden``'s dtype; gets a gradient.
        w2: [E, H, I], ``hidden``'s dtype; gets a gradient.
        activation: ``"silu"``, ``"gelu"`` (erf; ``pytorch`` backend only) or ``"gelu_tanh"``.
        backend: the tilegemm backend of the forward and the backward (``None``: the choice current at the forward,
            ``use_backend`` / ``set_backend`` / ``TILEGEMM_BACKEND``; under the automatic choice each op chooses).

    Returns:
        [T, H] in ``hidden.dtype``: ``out[t] = round(sum_j w[t, j] * round(h_j @ w2[e].T))`` with
        ``h_j = round(act(x @ w13[e, :I].T) * (x @ w13[e, I:].T))`` (fp32 sums; ``moe_experts_forward``).
        The backward is ``moe_experts_backward`` (its docstring has the formulas and roundings). Both run on
        ``backend`` (or the choice current at the forward), with no host sync, so a training step can be captured
        in a CUDA graph; reruns are bitwise identical.

    Raises:
        TypeError, ValueError: as :func:`tilegemm.moe_experts`.
    """
    moe_experts_check(hidden, topk_ids, topk_weights, w13, w2, activation)  # once: moe_experts_train trusts it
    return custom_ops.moe_experts_train(hidden, topk_ids, topk_weights, w13, w2, activation, backend)[0]


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
    return custom_ops.rms_norm_forward(x, weight, eps)


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` with an FP8 forward: ``x [..., K] @ weight [N, K].T (+ bias)``, bf16 in and out.

    The forward casts ``x`` per token (1x128 scales) and ``weight`` per 128x128 block, then runs
    ``fp8_gemm_nt`` (fp32 accumulation); the backward is straight-through in BF16.

    Raises:
        TypeError, ValueError: ``x`` or ``weight`` not bf16, K differs, ``bias`` not bf16 ``[N]``, or tensors
            on two devices; checked before any GEMM runs.
    """
    fp8_linear_check(x, weight, bias)
    out = custom_ops.fp8_linear_forward(x.reshape(-1, x.shape[-1]), weight).reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias
