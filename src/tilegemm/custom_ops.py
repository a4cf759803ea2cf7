"""Every ``torch.library`` custom op of tilegemm (``tilegemm::...``), with its fake and its autograd formula.

``torch.compile`` traces Python. The dispatcher (backend choice through ``use_backend``'s ``ContextVar``, the hot
lane, fallback warnings, value checks) is not traceable, so the differentiable functions of
:mod:`tilegemm.autograd` and every call from a patched transformers module into tilegemm go through one custom op
here: ``torch.compile(..., fullgraph=True)`` sees one opaque node per call, with shapes from the op's fake
implementation, and the dispatcher runs inside the op at run time (a ``use_backend`` scope around a compiled call
still applies). Eagerly, where autograd records nothing, a patched module's call skips the op's own dispatch and
runs its function (:func:`model_op`). The op names are part of compiled graphs and pickles: they do not change.

Every op is functional (new outputs, no input written, none aliased) and takes ``backend: str | None``, passed on
as ``backend=`` to the tilegemm ops it calls (``None``: the current choice when the op runs). A differentiable op's
backward runs its GEMMs on the same ``backend`` argument (``None``: the backend current at the backward; on CUDA
autograd calls it from its own thread, which does not see the forward's ``use_backend`` scope, so the MoE
experts' backward keeps the forward's choice: its ``backend``, else
:func:`~tilegemm.backend.selector.selected_backend` at the forward, ``None`` under the automatic choice).

Differentiable, for :mod:`tilegemm.autograd`:

* ``tilegemm::gemm(a, b, layout, backend=None)``: out-of-place ``bf16_gemm_<layout>``; backward ``nt`` / ``tn``.
* ``tilegemm::grouped_gemm(a, b, offs, layout, backend=None)``: the m-grouped GEMM with torch-style psum ends;
  ``tilegemm::grouped_weight_grad(grad, x, offs, backend=None)``: its weight gradient (k-grouped TN).
* ``tilegemm::fp8_grouped_gemm(x, w, w_data, w_scale, offs, backend=None)``: the FP8 forward of
  ``fp8_grouped_matmul`` with :func:`grouped_gemm`'s backward (straight-through).
* ``tilegemm::fp8_linear_forward(x, weight, backend=None)``: ``fp8_gemm_nt`` of both cast to FP8; BF16 backward.
* ``tilegemm::moe_experts_train(hidden, topk_ids, topk_weights, w13, w2, activation, backend=None)``:
  ``moe_experts_forward`` (the output, then its ``MoETrainState``); backward ``tilegemm::moe_experts_grad``.
* ``tilegemm::rms_norm(x, weight, eps, backend=None)``: :func:`tilegemm.rms_norm`; the backward is the fp32
  formula in torch ops. Also the RMSNorm swap's op (below).

Called by the patched transformers modules (:data:`MODEL_OPS`; each takes the module's ``backend``):

* ``tilegemm::experts_moe(hidden [T, H], topk_ids [T, k], topk_weights [T, k], w13 [E, 2I, H], w2 [E, H, I],
  activation, backend) -> [T, H]``: :func:`tilegemm.moe_experts` (the fused bf16 experts).
* ``tilegemm::experts_fp8_moe(...)``, same arguments and result: :func:`tilegemm.fp8_moe_experts` on the 128x128
  block FP8 copies of ``w13`` / ``w2`` (:func:`tilegemm.fp8_weights.weight_fp8_blocks`, cached on the weight
  tensors).
* ``tilegemm::experts_grouped_linear(x [S, K], weight, offs [E], transposed, backend) -> [S, N]`` and
  ``tilegemm::experts_grouped_linear_fp8`` (same, FP8 weight blocks): the unfused path's grouped GEMMs
  (:func:`tilegemm.ops.op_call.grouped_linear`, ``grouped_linear_fp8``).
* ``tilegemm::linear(x [M, K], weight [N, K], fp8, backend) -> [M, N]``: the ``nn.Linear`` swap's GEMM.
* ``tilegemm::rms_norm`` (above): the RMSNorm swap.
* ``tilegemm::indexer_scores(q, k, weights, attention_mask, softmax_scale, fp8, hadamard, backend) -> [B, S, T]``:
  :func:`tilegemm.indexer.index_scores`, the sparse-attention indexer swap's scoring.
* ``tilegemm::sparse_decode_attention(q, k, v, indices, scale, mask, backend) -> [B, H, Dv]``:
  :func:`tilegemm.sparse_decode_attention`, the sparse DSA attention's decode step.

Adding a model-level op (an attention indexer, a fused router) is :func:`model_op`::

    def _fake(q, k, weights, backend):           # shapes, dtypes and devices from the inputs' metadata only
        return q.new_empty(q.shape[0], k.shape[0], dtype=torch.float32)

    @model_op("tilegemm::indexer_logits", fake=_fake)
    def indexer_logits(q: Tensor, k: Tensor, weights: Tensor, backend: str | None) -> Tensor:
        return tilegemm.fp8_mqa_logits(..., backend=backend)

The rules: a functional op, torch.library's type annotations, a ``backend: str | None`` argument and a fake. The
patched module calls the op, not the tilegemm function. :data:`MODEL_OPS` lists those ops; ``tests/hf/
test_compile.py`` runs ``torch.library.opcheck`` on each (it needs one sample call per op, and fails for an op
without one) and counts the graph breaks of every patched family under ``torch.compile``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

from tilegemm import indexer
from tilegemm.backend import registry
from tilegemm.backend.selector import selected_backend
from tilegemm.fp8_weights import weight_fp8_blocks
from tilegemm.ops import api
from tilegemm.ops.checks import LAYOUTS, skip_value_checks
from tilegemm.ops.common import MoETrainState
from tilegemm.ops.op_call import grouped_linear, grouped_linear_fp8, out_dtype, run_op
from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from tilegemm.routing import ALIGNED_ROWS, max_padded_rows

Tensor = torch.Tensor
F = TypeVar("F", bound=Callable[..., object])

OPS: dict[str, object] = {}
"""``"tilegemm::name"`` -> the custom op, for every op of this module."""

MODEL_OPS: dict[str, object] = {}
"""``"tilegemm::name"`` -> the custom op, for the ops patched transformers modules call (made by :func:`model_op`)."""


def _define(name: str, fake: Callable[..., object], *tables: dict[str, object]) -> Callable[[F], F]:
    if not name.startswith("tilegemm::"):
        raise ValueError(f"name: got {name!r}, expected 'tilegemm::<op>'")

    def decorator(fn: F) -> F:
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        for table in (OPS, *tables):
            table[name] = op
        return op  # type: ignore[return-value]

    return decorator


def _records_grad(args: tuple, kwargs: dict) -> bool:
    """Whether autograd would record a call with these arguments (grad mode on, a tensor that requires grad)."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, Tensor) and a.requires_grad for a in (*args, *kwargs.values()))


def model_op(name: str, *, fake: Callable[..., object]) -> Callable[[F], F]:
    """Register ``fn`` as the functional custom op ``name`` (``"tilegemm::..."``) with fake implementation ``fake``.

    ``fn`` needs torch.library type annotations and returns new tensors; ``fake`` takes the same arguments and
    returns empty tensors of the outputs' shapes, dtypes and devices. The op is added to :data:`MODEL_OPS`.

    Returns what the patched modules call: the custom op while ``torch.compile`` or ``torch.export`` traces
    (:func:`torch.compiler.is_compiling`) or while autograd records a tensor argument that requires grad (the op's
    autograd formula, where it has one, applies); ``fn`` itself otherwise. The two compute the same; eagerly the
    op's dispatch would only add host time, which a decode step pays once per layer and call.
    """

    define = _define(name, fake, MODEL_OPS)

    def decorator(fn: F) -> F:
        op = define(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if torch.compiler.is_compiling() or _records_grad(args, kwargs):
                return op(*args, **kwargs)
            return fn(*args, **kwargs)

        call.op = op  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorator


# ------------------------------------------------------------------------- the differentiable ops' forwards


def _gemm_out_shape(a: Tensor, b: Tensor, layout: str) -> tuple[int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: got {layout!r}, expected one of {sorted(LAYOUTS)}")
    flip_a, flip_b = LAYOUTS[layout]  # stored transposed relative to a [M, K], b [N, K]
    return a.shape[int(flip_a)], b.shape[int(flip_b)]


def _fake_gemm(a, b, layout, backend=None):
    return a.new_empty(_gemm_out_shape(a, b, layout))


@_define("tilegemm::gemm", _fake_gemm)
def gemm(a: Tensor, b: Tensor, layout: str, backend: str | None = None) -> Tensor:
    """Out-of-place ``bf16_gemm_<layout>(a, b)``: bf16 [M, N]."""
    d = a.new_empty(_gemm_out_shape(a, b, layout))
    getattr(api, f"bf16_gemm_{layout}")(a, b, d, backend=backend)
    return d


def _fake_grouped_gemm(a, b, offs, layout, backend=None):
    return a.new_empty(a.shape[0], b.shape[1] if layout == "nt" else b.shape[2])


@_define("tilegemm::grouped_gemm", _fake_grouped_gemm)
def grouped_gemm(a: Tensor, b: Tensor, offs: Tensor, layout: str, backend: str | None = None) -> Tensor:
    """Out-of-place ``m_grouped_bf16_gemm_<layout>_contiguous`` with torch-style (unaligned) psum ends: [M, N] in
    ``a.dtype`` (bf16, fp16 or fp32; see :func:`tilegemm.ops.op_call.run_op`)."""
    # offs was validated once by grouped_matmul; run_op skips the value checks and the backward reuses it
    return grouped_linear(a, b, offs, layout == "nn", backend)


def _fake_weight_grad(grad, x, offs, backend=None):
    return grad.new_empty(offs.shape[0], grad.shape[1], x.shape[1], dtype=torch.float32)


@_define("tilegemm::grouped_weight_grad", _fake_weight_grad)
def grouped_weight_grad(grad: Tensor, x: Tensor, offs: Tensor, backend: str | None = None) -> Tensor:
    """``dw[g] = grad_g.T @ x_g`` over the psum groups of ``offs``: fp32 [G, N, K] (``k_grouped`` TN)."""
    ends = offs.tolist()
    ks = [end - start for start, end in zip([0, *ends[:-1]], ends)]
    ks_device = torch.diff(offs, prepend=offs.new_zeros(1)).to(torch.int32)
    dw = grad.new_empty(len(ks), grad.shape[1], x.shape[1], dtype=torch.float32)
    # ks_device is ks by construction (run_op skips the value checks)
    run_op("k_grouped_bf16_gemm_tn_contiguous", backend, a=grad[: sum(ks)], b=x[: sum(ks)], d=dw, ks_cpu=ks,
           grouped_layout=ks_device)  # fmt: skip
    return dw


def _fake_fp8_grouped(x, w, w_data, w_scale, offs, backend=None):
    return x.new_empty(x.shape[0], w.shape[1])


@_define("tilegemm::fp8_grouped_gemm", _fake_fp8_grouped)
def fp8_grouped_gemm(
    x: Tensor, w: Tensor, w_data: Tensor, w_scale: Tensor, offs: Tensor, backend: str | None = None
) -> Tensor:
    """``m_grouped_fp8_gemm_nt_contiguous`` of ``x`` (cast per token) and ``(w_data, w_scale)`` (the FP8 blocks
    of ``w [G, N, K]``, which only the backward reads): [M, N] in ``x.dtype``."""
    return grouped_linear_fp8(x, (w_data, w_scale), offs, backend)


def _fake_fp8_linear(x, weight, backend=None):
    return x.new_empty(x.shape[0], weight.shape[0])


@_define("tilegemm::fp8_linear_forward", _fake_fp8_linear)
def fp8_linear_forward(x: Tensor, weight: Tensor, backend: str | None = None) -> Tensor:
    """``x [M, K] @ weight [N, K].T`` with both cast to FP8 (1x128 / 128x128 blocks): bf16 [M, N]."""
    d = x.new_empty(x.shape[0], weight.shape[0])
    api.fp8_gemm_nt(per_token_cast_to_fp8(x), per_block_cast_to_fp8(weight), d, backend=backend)
    return d


def _fake_moe_train(hidden, topk_ids, topk_weights, w13, w2, activation, backend=None):
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


@_define("tilegemm::moe_experts_train", _fake_moe_train)
def moe_experts_train(
    hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor, activation: str,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``moe_experts_forward`` on ``backend``, on arguments :func:`tilegemm.autograd.moe_experts` has checked: the
    output, then the fields of its ``MoETrainState``."""
    arguments = dict(hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w2=w2)
    arguments.update(activation=activation, stream=None)
    out, state = registry.call_checked("moe_experts_forward", arguments, backend)
    return (out, *state)


def _fake_moe_grad(grad_out, hidden, topk_weights, w13, w2, *state_activation_needs_backend):
    needs = state_activation_needs_backend[-2]
    inputs = (hidden, topk_weights, w13, w2)
    return tuple(t.new_empty(t.shape) if need else hidden.new_empty(0) for t, need in zip(inputs, needs, strict=True))


@_define("tilegemm::moe_experts_grad", _fake_moe_grad)
def moe_experts_grad(
    grad_out: Tensor, hidden: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor,
    row_token: Tensor, row_weight: Tensor, dest: Tensor, ends: Tensor, gate_up: Tensor, h: Tensor, y: Tensor,
    activation: str, needs: list[bool], backend: str | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``moe_experts_backward`` on ``backend`` (``None``: the automatic choice); a gradient not in ``needs`` comes back
    as an empty tensor."""
    state = MoETrainState(row_token, row_weight, dest, ends, gate_up, h, y)
    needs = tuple(needs)
    grads = api.moe_experts_backward(grad_out, hidden, topk_weights, w13, w2, state, activation, needs, backend=backend)
    return tuple(hidden.new_empty(0) if g is None else g for g in grads)


def _fake_rms_norm(x, weight, eps, backend=None):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


@model_op("tilegemm::rms_norm", fake=_fake_rms_norm)
def rms_norm_forward(x: Tensor, weight: Tensor, eps: float, backend: str | None = None) -> Tensor:
    """``tilegemm.rms_norm(x, weight, eps, backend=backend)``: [..., H] in ``promote_types(x.dtype, weight.dtype)``
    (``backend=None``: the current backend when the op runs)."""
    return api.rms_norm(x, weight, eps, backend=backend)


# --------------------------------------------------------------------------------- their autograd formulas


def _save_inputs(ctx, inputs, output) -> None:
    """gemm, grouped_gemm, fp8_linear_forward: tensors, the layout (when there is one), the backend."""
    *arguments, ctx.backend = inputs
    ctx.save_for_backward(*(t for t in arguments if isinstance(t, Tensor)))
    ctx.layout = arguments[-1] if isinstance(arguments[-1], str) else None


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    if ctx.layout != "nn":
        raise NotImplementedError("tilegemm::gemm is differentiable in the 'nn' layout (what matmul uses)")
    grad = grad.contiguous()
    grad_a = gemm(grad, b, "nt", ctx.backend) if ctx.needs_input_grad[0] else None  # [M,N] @ [K,N].T
    grad_b = gemm(a, grad, "tn", ctx.backend) if ctx.needs_input_grad[1] else None  # [M,K].T @ [M,N]
    return grad_a, grad_b, None, None


def _grouped_backward(ctx, grad):
    """``nt`` (``y = x @ w[g].T``, w [G, N, K]): dx = grad @ w[g] (``nn``), dw[g] = grad_g.T @ x_g.
    ``nn`` (``y = x @ w[g]``, w [G, K, N]): dx = grad @ w[g].T (``nt``), dw[g] = x_g.T @ grad_g."""
    x, w, offs = ctx.saved_tensors
    grad = grad.contiguous()
    other = "nn" if ctx.layout == "nt" else "nt"
    grad_x = grouped_gemm(grad, w, offs, other, ctx.backend) if ctx.needs_input_grad[0] else None
    grad_w = None
    if ctx.needs_input_grad[1]:
        pair = (grad, x) if ctx.layout == "nt" else (x, grad)
        grad_w = grouped_weight_grad(*pair, offs, ctx.backend).to(w.dtype)
    return grad_x, grad_w, None, None, None


def _save_fp8_grouped(ctx, inputs, output) -> None:
    x, w, _, _, offs, ctx.backend = inputs
    ctx.save_for_backward(x, w, offs)
    ctx.layout = "nt"


def _fp8_grouped_backward(ctx, grad):
    grad_x, grad_w, *_ = _grouped_backward(ctx, grad)
    return grad_x, grad_w, None, None, None, None


def _fp8_linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    grad = grad.contiguous()
    grad_x = gemm(grad, weight, "nn", ctx.backend) if ctx.needs_input_grad[0] else None  # [M,N] @ [N,K]
    grad_w = gemm(grad, x, "tn", ctx.backend) if ctx.needs_input_grad[1] else None  # [M,N].T @ [M,K]
    return grad_x, grad_w, None


def _save_moe(ctx, inputs, output) -> None:
    hidden, _, topk_weights, w13, w2, activation, backend = inputs
    ctx.save_for_backward(hidden, topk_weights, w13, w2, *output[1:])
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # no zero gradients for the saved rows (three [M, *] fills per backward)
    ctx.activation = activation
    # The backward follows the forward's choice: on CUDA autograd calls it from its own thread, which does not see the
    # forward's use_backend scope. None (the automatic choice) stays None: the backward's op chooses by the same rule.
    ctx.backend = backend if backend is not None else selected_backend()


def _moe_backward(ctx, grad_out, *_):
    hidden, topk_weights, w13, w2, *state = ctx.saved_tensors
    needs = [ctx.needs_input_grad[i] for i in (0, 2, 3, 4)]
    if grad_out is None or not any(needs):
        return None, None, None, None, None, None, None
    grads = moe_experts_grad(
        grad_out.contiguous(), hidden, topk_weights, w13, w2, *state, ctx.activation, needs, ctx.backend
    )
    d_hidden, d_weights, d_w13, d_w2 = (g if need else None for g, need in zip(grads, needs, strict=True))
    return d_hidden, None, d_weights, d_w13, d_w2, None, None


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
rms_norm_forward.op.register_autograd(_rms_norm_backward, setup_context=_save_rms_norm)


# ----------------------------------------------------------------------- the patched transformers modules' ops


def _fake_experts(hidden, topk_ids, topk_weights, w13, w2, activation, backend):
    return hidden.new_empty(hidden.shape)


@model_op("tilegemm::experts_moe", fake=_fake_experts)
def experts_moe(
    hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor, activation: str,
    backend: str | None,
) -> Tensor:  # fmt: skip
    """:func:`tilegemm.moe_experts` on ``backend`` with the value checks skipped (the ids come from the model's
    router): ``[T, H]`` in ``hidden.dtype``."""
    with skip_value_checks():
        return api.moe_experts(hidden, topk_ids, topk_weights, w13, w2, activation, backend=backend)


@model_op("tilegemm::experts_fp8_moe", fake=_fake_experts)
def experts_fp8_moe(
    hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor, activation: str,
    backend: str | None,
) -> Tensor:  # fmt: skip
    """:func:`tilegemm.fp8_moe_experts` on the cached FP8 blocks of ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``
    (H and I multiples of 128), value checks skipped: ``[T, H]`` in ``hidden.dtype``."""
    w_up, w_down = weight_fp8_blocks(w13), weight_fp8_blocks(w2)
    with skip_value_checks():
        return api.fp8_moe_experts(hidden, topk_ids, topk_weights, w_up, w_down, activation, backend=backend)


def _fake_grouped(x, weight, offs, transposed, backend):
    return x.new_empty(x.shape[0], weight.shape[-1] if transposed else weight.shape[-2])


@model_op("tilegemm::experts_grouped_linear", fake=_fake_grouped)
def experts_grouped_linear(x: Tensor, weight: Tensor, offs: Tensor, transposed: bool, backend: str | None) -> Tensor:
    """:func:`tilegemm.ops.op_call.grouped_linear`: ``x [S, K]`` rows grouped by the psum ends ``offs`` times
    ``weight [E, N, K]`` (``[E, K, N]`` when ``transposed``): ``[S, N]`` in ``x.dtype``."""
    return grouped_linear(x, weight, offs, transposed, backend)


@model_op("tilegemm::experts_grouped_linear_fp8", fake=_fake_grouped)
def experts_grouped_linear_fp8(
    x: Tensor, weight: Tensor, offs: Tensor, transposed: bool, backend: str | None
) -> Tensor:
    """:func:`tilegemm.ops.op_call.grouped_linear_fp8` on the cached FP8 blocks of ``weight`` (``[E, N, K]``, or
    ``[E, K, N]`` when ``transposed``): ``[S, N]`` in ``x.dtype``."""
    return grouped_linear_fp8(x, weight_fp8_blocks(weight, transpose=transposed), offs, backend)


def _fake_linear(x, weight, fp8, backend):
    return x.new_empty(x.shape[0], weight.shape[0])


@model_op("tilegemm::linear", fake=_fake_linear)
def linear(x: Tensor, weight: Tensor, fp8: bool, backend: str | None) -> Tensor:
    """``x [M, K] @ weight [N, K].T`` (no bias): ``bf16_gemm_nt``, or ``fp8_gemm_nt`` of ``x`` cast per token and the
    cached FP8 blocks of ``weight`` (``fp8``); fp16/fp32 on the exact ``pytorch`` backend. ``[M, N]`` in ``x.dtype``
    (``x`` in ``weight``'s dtype)."""
    d = torch.empty(x.shape[0], weight.shape[0], dtype=out_dtype(x.dtype), device=x.device)
    common = dict(d=d, c=None, alpha=1.0, beta=0.0)
    if fp8:
        run_op("fp8_gemm_nt", backend, a=per_token_cast_to_fp8(x.contiguous()), b=weight_fp8_blocks(weight), **common)
    else:
        run_op("bf16_gemm_nt", backend, a=x, b=weight, **common)
    return d.to(x.dtype) if d.dtype != x.dtype else d


def _fake_scores(q, k, weights, attention_mask, softmax_scale, fp8, hadamard, backend):
    return q.new_empty(q.shape[0], q.shape[1], k.shape[1], dtype=torch.float32)


@model_op("tilegemm::indexer_scores", fake=_fake_scores)
def indexer_scores(
    q: Tensor,
    k: Tensor,
    weights: Tensor,
    attention_mask: Tensor | None,
    softmax_scale: float,
    fp8: bool,
    hadamard: bool,
    backend: str | None,
) -> Tensor:
    """:func:`tilegemm.indexer.index_scores` as the custom op the swapped indexers call (so patched models compile
    whole). Returns a new fp32 ``[B, S, T]``."""
    return indexer.index_scores(q, k, weights, attention_mask, softmax_scale, fp8, hadamard, backend).contiguous()


def _fake_sparse_decode(q, k, v, indices, scale, mask, backend):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[3])


@model_op("tilegemm::sparse_decode_attention", fake=_fake_sparse_decode)
def sparse_decode_attention(
    q: Tensor, k: Tensor, v: Tensor, indices: Tensor, scale: float, mask: Tensor | None, backend: str | None
) -> Tensor:
    """:func:`tilegemm.sparse_decode_attention` as the custom op the sparse DSA attention calls (so its decode step
    compiles whole). Returns a new ``[B, H, Dv]``."""
    return api.sparse_decode_attention(q, k, v, indices, scale, mask, backend=backend)
