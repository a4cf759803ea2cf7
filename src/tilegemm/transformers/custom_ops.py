"""The model integration's tilegemm calls as ``torch.library`` custom ops, so patched models compile whole.

``torch.compile`` traces a patched model's Python. The dispatcher (backend choice through ``use_backend``'s
``ContextVar``, the hot lane, fallback warnings, value checks) is not traceable, so every call from a patched
module into tilegemm goes through one custom op here: ``torch.compile(model, fullgraph=True)`` sees one opaque
node per call, with shapes from the op's fake implementation, and the dispatcher runs inside the op at run time
(a ``use_backend`` scope around a compiled call still applies).

Ops (each takes the patched module's ``backend``, ``None`` for the current choice at run time):

* ``tilegemm::experts_moe(hidden [T, H], topk_ids [T, k], topk_weights [T, k], w13 [E, 2I, H], w2 [E, H, I],
  activation, backend) -> [T, H]``: :func:`tilegemm.moe_experts` (the fused bf16 experts).
* ``tilegemm::experts_fp8_moe(...)``, same arguments and result: :func:`tilegemm.fp8_moe_experts` on the 128x128
  block FP8 copies of ``w13`` / ``w2`` (:func:`tilegemm.fp8_weights.weight_fp8_blocks`, cached on the weight
  tensors).
* ``tilegemm::experts_grouped_linear(x [S, K], weight, offs [E], transposed, backend) -> [S, N]`` and
  ``tilegemm::experts_grouped_linear_fp8`` (same, FP8 weight blocks): the unfused path's grouped GEMMs
  (:func:`tilegemm.ops.op_call.grouped_linear`, ``grouped_linear_fp8``).
* ``tilegemm::linear(x [M, K], weight [N, K], fp8, backend) -> [M, N]``: the ``nn.Linear`` swap's GEMM.
* ``tilegemm::rms_norm(x, weight, eps, backend)`` (in :mod:`tilegemm.autograd`, differentiable): the RMSNorm swap.

Adding a model-level op (an attention indexer, a fused router) is :func:`model_op`::

    def _fake(q, k, weights, backend):           # shapes, dtypes and devices from the inputs' metadata only
        return q.new_empty(q.shape[0], k.shape[0], dtype=torch.float32)

    @model_op("tilegemm::indexer_logits", fake=_fake)
    def indexer_logits(q: Tensor, k: Tensor, weights: Tensor, backend: str | None) -> Tensor:
        return tilegemm.fp8_mqa_logits(..., backend=backend)

The rules: a functional op (new outputs, no input written, none aliased), torch.library's type annotations, a
``backend: str | None`` argument passed on as ``backend=`` to the tilegemm ops it calls, and a fake. The patched
module calls the op, not the tilegemm function. :data:`MODEL_OPS` lists every op; ``tests/transformers/
test_compile.py`` runs ``torch.library.opcheck`` on each (it needs one sample call per op, and fails for an op
without one) and counts the graph breaks of every patched family under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from tilegemm.fp8_weights import weight_fp8_blocks
from tilegemm.ops import api
from tilegemm.ops.checks import skip_value_checks
from tilegemm.ops.op_call import grouped_linear, grouped_linear_fp8, out_dtype, run_op

Tensor = torch.Tensor
F = TypeVar("F", bound=Callable[..., object])

MODEL_OPS: dict[str, object] = {}
"""``"tilegemm::name"`` -> the custom op, for every op made by :func:`model_op` (and the RMSNorm op)."""


def model_op(name: str, *, fake: Callable[..., object]) -> Callable[[F], F]:
    """Register ``fn`` as the functional custom op ``name`` (``"tilegemm::..."``) with fake implementation ``fake``.

    ``fn`` needs torch.library type annotations and returns new tensors; ``fake`` takes the same arguments and
    returns empty tensors of the outputs' shapes, dtypes and devices. The op is added to :data:`MODEL_OPS`.
    Returns the custom op (callable as ``fn`` was).
    """
    if not name.startswith("tilegemm::"):
        raise ValueError(f"name: got {name!r}, expected 'tilegemm::<op>'")

    def decorator(fn: F) -> F:
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        MODEL_OPS[name] = op
        return op  # type: ignore[return-value]

    return decorator


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
        from tilegemm.quant import per_token_cast_to_fp8

        run_op("fp8_gemm_nt", backend, a=per_token_cast_to_fp8(x.contiguous()), b=weight_fp8_blocks(weight), **common)
    else:
        run_op("bf16_gemm_nt", backend, a=x, b=weight, **common)
    return d.to(x.dtype) if d.dtype != x.dtype else d


def _register_rms_norm() -> None:
    from tilegemm.autograd import rms_norm_forward

    MODEL_OPS["tilegemm::rms_norm"] = rms_norm_forward


_register_rms_norm()
