"""MoE experts forward on tilegemm's m-grouped GEMMs, registered in transformers' ``ExpertsInterface``.

``tilegemm_experts_forward(self, hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``
follows transformers' experts contract (``self`` is a ``@use_experts_implementation`` experts module with
``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``).

Inference on a bf16 model whose experts are the plain gated form (:func:`fused_activation`: no biases, no
post-expert norm, transformers' default gate, silu or tanh-GELU) runs one op, :func:`tilegemm.moe_experts`: both
GEMMs, the activation and the weighted combine (its per-slot, block or sorted path by size). It rounds the
intermediate once and each weighted slot once, where transformers' path rounds gate, up, the activation and the
weighted product: closer to the float64 formula, and bf16 steps away from stock. Every other case (fp16/fp32;
biases; other activations; training of those) runs the unfused path, per call:

1. sort the ``T*k`` (token, expert) pairs by expert on the device (``tilegemm.routing``, psum layout);
2. ``m_grouped_bf16_gemm_nt_contiguous`` on the gathered rows with ``gate_up_proj`` (psum layout);
3. the module's gated activation (``self._apply_gate``: ``act_fn(gate) * up``);
4. ``m_grouped_bf16_gemm_nt_contiguous`` with ``down_proj``;
5. weighted sum of each token's ``k`` outputs in token order (``tilegemm.routing.unpermute_tokens``).

No step reads device memory on the host, so with the cutile backend the call is CUDA-graph capturable. Every
inference call into tilegemm (the fused ops, the unfused path's grouped GEMMs) is a ``torch.library`` custom op of
:mod:`~tilegemm.custom_ops` taking the module's backend as an argument, so ``torch.compile(model,
fullgraph=True)`` traces a patched model as one graph. Calls whose
routed rows times the widest operand row pass ``2**30`` elements (the grouped kernels index with int32) run in
token chunks below that (``MAX_ROUTED_ELEMENTS``).

Dtypes: a bf16 model runs on the current tilegemm backend (or the module's ``_tilegemm_backend``). The
GEMM ops take bf16 operands, so fp16 and fp32 models run their GEMMs on the ``pytorch`` backend's
implementation (exact: fp32 products and accumulation, one rounding; see :func:`tilegemm.ops.op_call.run_op`);
on a GPU that path is correct but not fast, and it is not CUDA-graph capturable if that implementation syncs.
Routing weights may be fp32 while hidden states are bf16 (DeepSeek, Mixtral routers) or bf16 (Qwen): the
weighted product follows torch's promotion as in transformers' own paths, the sum over k runs in fp32 and
is rounded once to the hidden dtype (see ``_finish``).

Expert-parallel sentinel ids (``-1`` or ``>= num_experts``) contribute nothing: their pairs are sorted
past the last group, which the grouped GEMM zero-fills, and their weights are zeroed.

``tilegemm_fp8_experts_forward`` is the same with FP8 GEMMs: expert weights quantized once to 128x128
blocks (:func:`tilegemm.fp8_weights.weight_fp8_blocks`, cached on the weight tensors), activations cast per token
(1x128 scales) on every call. Inference on the plain gated form with H and I multiples of 128 runs the fused
:func:`tilegemm.fp8_moe_experts` (the intermediate quantized from fp32, not rounded to bf16 first); the rest the
unfused FP8 path below.

Training: a bf16 model of the plain gated form trains through :func:`tilegemm.autograd.moe_experts`, the fused
op with a fused backward (gradients to the tokens, both weights and the routing weights; no host sync). It
applies the routing weight in the fp32 combine, after ``y`` is rounded (inference applies it before). Every
other module, when autograd needs gradients, runs both GEMMs through :func:`tilegemm.grouped_matmul` (a custom
op whose backward is the other m-grouped GEMM for the input and the k-grouped TN GEMM for the weights; the
latter reads the group sizes on the host, one sync per backward) for bf16, fp16 and fp32 weights, ``[E, N, K]``
or transposed; permutation, activation and combine are differentiable torch ops, so gradients reach the
tokens, both weights and the routing weights. The FP8 variant trains through
:func:`tilegemm.fp8_grouped_matmul` (its FP8 forward, straight-through gradients). transformers' ``grouped_mm``
path, with a warning, is left only for weights of two dtypes and FP8 training of transposed weights.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from tilegemm import custom_ops
from tilegemm.fp8_weights import weight_fp8_blocks
from tilegemm.ops.checks import GROUPED_MATMUL_DTYPES, skip_value_checks
from tilegemm.routing import MoERouting, moe_route, permute_tokens, unpermute_tokens

#: ``transformers.integrations.moe`` once it is imported (:func:`bind_transformers_moe`), else ``None``. A module
#: global, not an import on the traced path: torch 2.11's dynamo refuses a lazy package as an import result.
_hf_moe = None

EXPERTS_NAME = "tilegemm"
FP8_EXPERTS_NAME = "tilegemm_fp8"


def _needs_grad(module: torch.nn.Module, hidden_states: torch.Tensor) -> bool:
    if not torch.is_grad_enabled():
        return False
    return hidden_states.requires_grad or any(p.requires_grad for p in module.parameters(recurse=False))


_warned_grad = False


def _stock_forward(module, hidden_states, top_k_index, top_k_weights):
    """transformers' ``grouped_mm`` forward, with a warning (once): training a module tilegemm cannot
    differentiate (weights of two dtypes, or FP8 training of transposed weights)."""
    global _warned_grad
    from transformers.integrations.moe import grouped_mm_experts_forward

    if not _warned_grad:
        _warned_grad = True
        dtypes = sorted(str(getattr(module, name).dtype) for name in _weight_names(module))
        warnings.warn(
            f"tilegemm experts: autograd needs gradients through {type(module).__name__} (weights {dtypes}, "
            f"transposed={bool(getattr(module, 'is_transposed', False))}), which tilegemm's differentiable ops "
            "do not cover; running transformers' grouped_mm path instead",
            stacklevel=3,
        )
    return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)


#: transformers activation classes whose gated form ``act(gate) * up`` :func:`tilegemm.moe_experts` computes.
FUSED_ACTIVATIONS = {"SiLUActivation": "silu", "SiLU": "silu", "GELUTanh": "gelu_tanh"}


def fused_activation(module: torch.nn.Module, hidden_states: torch.Tensor) -> str | None:
    """The :func:`tilegemm.moe_experts` activation that computes this experts module exactly, or ``None``.

    ``None`` unless the module is the plain gated form: bf16 ``gate_up_proj [E, 2I, H]`` (gate rows first)
    and ``down_proj [E, H, I]``, bf16 hidden states, no biases, no post-expert norm, transformers' default
    ``_apply_gate`` and an activation in :data:`FUSED_ACTIVATIONS`.
    """
    plain = not (
        getattr(module, "is_transposed", False)
        or getattr(module, "has_bias", False)
        or getattr(module, "has_post_expert_norm", False)
        or not getattr(module, "has_gate", True)
    )
    default_gate = getattr(_hf_moe, "_default_apply_gate", None)
    if not plain or default_gate is None or getattr(type(module), "_apply_gate", None) is not default_gate:
        return None
    if hidden_states.dtype != torch.bfloat16 or module.gate_up_proj.dtype != torch.bfloat16:
        return None
    if module.down_proj.dtype != torch.bfloat16:
        return None
    return FUSED_ACTIVATIONS.get(type(getattr(module, "act_fn", None)).__name__)


def _backend_for(module: torch.nn.Module) -> str | None:
    return getattr(module, "_tilegemm_backend", None)


def _differentiable(module: torch.nn.Module) -> bool:
    """True when :func:`tilegemm.grouped_matmul` can carry this module's gradients: both weights of one dtype
    among bf16, fp16 and fp32 (``[E, N, K]``, or ``[E, K, N]`` for a transposed module)."""
    dtypes = {getattr(module, name).dtype for name in _weight_names(module)}
    return len(dtypes) == 1 and dtypes <= set(GROUPED_MATMUL_DTYPES)


def grouped_linear_differentiable(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, transposed: bool, backend: str | None
) -> torch.Tensor:
    """:func:`grouped_linear` with autograd (training): ``x [S, K]`` and ``weight`` of one dtype (bf16, fp16, fp32).

    The forward runs on ``backend`` (or the current one); the backward runs on the backend current when
    ``backward()`` is called. fp16/fp32 run on the ``pytorch`` backend (:func:`tilegemm.grouped_matmul`).
    """
    from tilegemm.autograd import grouped_matmul
    from tilegemm.backend.selector import BackendScope

    with BackendScope(backend) if backend else contextlib.nullcontext(), skip_value_checks():  # offs is ours
        return grouped_matmul(x, weight, offs, transposed)


def _fp8_grouped_differentiable(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_fp8: tuple[torch.Tensor, torch.Tensor],
    offs: torch.Tensor,
    backend: str | None,
) -> torch.Tensor:
    """:func:`grouped_linear_fp8` with straight-through gradients to ``x`` and ``weight [E, N, K]``
    (:func:`tilegemm.fp8_grouped_matmul`; ``weight_fp8`` is its cached FP8 copy)."""
    from tilegemm.autograd import fp8_grouped_matmul
    from tilegemm.backend.selector import BackendScope

    with BackendScope(backend) if backend else contextlib.nullcontext(), skip_value_checks():  # offs is ours
        return fp8_grouped_matmul(x, weight, offs, weight_fp8)


def _weight_names(module: torch.nn.Module) -> tuple[str, str]:
    return ("gate_up_proj" if getattr(module, "has_gate", True) else "up_proj"), "down_proj"


def _row_experts(routing: MoERouting) -> torch.Tensor:
    """The expert of each compact (psum) row, clamped to ``[0, E-1]`` (dropped rows: any in-range id)."""
    rows = torch.arange(routing.num_tokens * routing.top_k, device=routing.psum_offsets.device)
    experts = torch.searchsorted(routing.psum_offsets, rows.to(routing.psum_offsets.dtype), right=True)
    return experts.clamp(max=routing.num_experts - 1)


def _add_bias(y: torch.Tensor, module: torch.nn.Module, name: str, routing: MoERouting) -> torch.Tensor:
    if not getattr(module, "has_bias", False):
        return y
    return y + getattr(module, f"{name}_bias")[_row_experts(routing)].to(y.dtype)


def _activate(module: torch.nn.Module, y: torch.Tensor) -> torch.Tensor:
    if getattr(module, "has_gate", True):
        return module._apply_gate(y)
    return module.act_fn(y)


def _finish(module, y, routing, top_k_weights, hidden_states):
    """Weighted combine. The product ``y * w`` follows torch's promotion (bf16 for Qwen's bf16 weights, fp32
    for DeepSeek / Mixtral's fp32 weights) and the k-sum runs in fp32, rounded once: the rounding sequence
    of transformers' own experts paths, so a bf16 model matches stock to the bit where the GEMMs do."""
    if getattr(module, "has_post_expert_norm", False):
        y = module.post_expert_norm(y)
    valid = routing.dest_row[routing.sorted_slot] >= 0
    w = top_k_weights.reshape(-1)[routing.sorted_slot]
    w = torch.where(valid, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return unpermute_tokens(y * w.unsqueeze(-1), routing, None, layout="psum", out_dtype=hidden_states.dtype)


#: Routed rows times the widest operand row (H or 2I) at most per call: the cutile grouped kernels index with int32
#: and refuse buffers of ``2**31`` elements (the op would fall back to the exact, much slower pytorch implementation),
#: so larger calls (DeepSeek-V3 or Qwen3 prefills of some 100k tokens) run in token chunks. Half the int32 range:
#: the grouped GEMMs' host paths add padding rows to the routed ones.
MAX_ROUTED_ELEMENTS = 2**30


def _token_chunk(module: torch.nn.Module, top_k: int) -> int:
    """Tokens per call such that ``tokens * top_k`` rows of every operand width stay within MAX_ROUTED_ELEMENTS."""
    up_name, down_name = _weight_names(module)
    width = max(*getattr(module, up_name).shape[1:], *getattr(module, down_name).shape[1:])
    return max(1, MAX_ROUTED_ELEMENTS // (max(1, top_k) * width))


def _in_token_chunks(forward):
    """Run an experts forward on token chunks of :func:`_token_chunk` tokens (concatenated) when one call is larger."""

    @functools.wraps(forward)
    def chunked(self, hidden_states, top_k_index, top_k_weights):
        chunk = _token_chunk(self, top_k_index.shape[1])
        if hidden_states.shape[0] <= chunk:
            return forward(self, hidden_states, top_k_index, top_k_weights)
        parts = zip(hidden_states.split(chunk), top_k_index.split(chunk), top_k_weights.split(chunk), strict=True)
        return torch.cat([forward(self, *part) for part in parts])

    return chunked


@_in_token_chunks
def tilegemm_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Experts forward on tilegemm's m-grouped BF16 GEMM (see module docstring).

    Args:
        self: transformers experts module (fused ``gate_up_proj``/``down_proj``, ``num_experts``, ``act_fn``).
        hidden_states: [T, H] bf16/fp16/fp32.
        top_k_index: [T, k] integer expert ids; ids outside ``[0, num_experts)`` are dropped.
        top_k_weights: [T, k] routing weights (fp32 or the hidden dtype).

    Returns:
        [T, H] in ``hidden_states.dtype``: ``sum_j w[t,j] * down[e] @ act(gate_up[e] @ x[t])``, ``e = idx[t,j]``.
    """
    training = _needs_grad(self, hidden_states)
    if training and not _differentiable(self):
        return _stock_forward(self, hidden_states, top_k_index, top_k_weights)
    activation = fused_activation(self, hidden_states)
    if activation is None:
        return unfused_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    weights = (self.gate_up_proj, self.down_proj)
    backend = _backend_for(self)
    if training:
        from tilegemm.autograd import moe_experts

        with skip_value_checks():
            return moe_experts(hidden_states, top_k_index, top_k_weights, *weights, activation, backend=backend)
    return custom_ops.experts_moe(hidden_states, top_k_index, top_k_weights, *weights, activation, backend)


def unfused_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The unfused path of :func:`tilegemm_experts_forward` (same arguments and result): routing, a permuted copy,
    two m-grouped GEMMs, the module's activation and the weighted combine as separate steps (module docstring);
    differentiable through :func:`tilegemm.grouped_matmul` when autograd needs gradients."""
    training = _needs_grad(self, hidden_states)
    up_name, down_name = _weight_names(self)
    w_up, w_down = getattr(self, up_name), getattr(self, down_name)
    x = hidden_states.to(w_up.dtype)
    backend = _backend_for(self)
    transposed = bool(getattr(self, "is_transposed", False))
    routing = moe_route(top_k_index, self.num_experts)
    offs = routing.psum_offsets
    linear = grouped_linear_differentiable if training else custom_ops.experts_grouped_linear
    linear = functools.partial(linear, offs=offs, transposed=transposed, backend=backend)

    y = linear(permute_tokens(x, routing, layout="psum"), w_up)
    y = _activate(self, _add_bias(y, self, up_name, routing))
    y = linear(y.to(w_down.dtype), w_down)
    y = _add_bias(y, self, down_name, routing)
    return _finish(self, y, routing, top_k_weights, hidden_states)


@_in_token_chunks
def tilegemm_fp8_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Experts forward in FP8: 128x128-block weights (cached), per-token 1x128 activations (module docstring).

    Same arguments and result as :func:`tilegemm_experts_forward`: the fused :func:`tilegemm.fp8_moe_experts` in
    inference on the plain gated form with H and I multiples of 128, else :func:`unfused_fp8_experts_forward`;
    results differ from the bf16 model by FP8 quantization error.
    """
    activation = None if _needs_grad(self, hidden_states) else fused_activation(self, hidden_states)
    if activation is not None:
        hidden_dim, inter = self.down_proj.shape[1:]
        if hidden_dim % 128 == 0 and inter % 128 == 0:
            return custom_ops.experts_fp8_moe(
                hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj, activation,
                _backend_for(self),
            )  # fmt: skip
    return unfused_fp8_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def unfused_fp8_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The unfused FP8 path (same arguments and result as :func:`tilegemm_experts_forward`): the steps of
    :func:`unfused_experts_forward` on ``m_grouped_fp8_gemm_nt_contiguous``'s math, the intermediate rounded to the
    model's dtype before it is quantized; trains with straight-through gradients (module docstring)."""
    up_name, down_name = _weight_names(self)
    transposed = bool(getattr(self, "is_transposed", False))
    training = _needs_grad(self, hidden_states)
    if training and (transposed or not _differentiable(self)):
        return _stock_forward(self, hidden_states, top_k_index, top_k_weights)
    backend = _backend_for(self)
    routing = moe_route(top_k_index, self.num_experts)
    offs = routing.psum_offsets
    weights = getattr(self, up_name), getattr(self, down_name)
    if training:  # FP8 forward, straight-through gradients to the unquantized weights
        w_up, w_down = weight_fp8_blocks(weights[0]), weight_fp8_blocks(weights[1])  # not transposed (above)
        linear = functools.partial(_fp8_grouped_differentiable, offs=offs, backend=backend)
        y = linear(permute_tokens(hidden_states.to(weights[0].dtype), routing, layout="psum"), weights[0], w_up)
        y = _activate(self, _add_bias(y, self, up_name, routing))
        y = linear(y.to(weights[1].dtype), weights[1], w_down)
    else:  # the FP8 blocks cached on the weights (weight_fp8_blocks, inside the op)
        linear = functools.partial(custom_ops.experts_grouped_linear_fp8, offs=offs, transposed=transposed,
                                   backend=backend)  # fmt: skip
        y = linear(permute_tokens(hidden_states, routing, layout="psum"), weights[0])
        y = _activate(self, _add_bias(y, self, up_name, routing))
        y = linear(y, weights[1])
    y = _add_bias(y, self, down_name, routing)
    return _finish(self, y, routing, top_k_weights, hidden_states)


def bind_transformers_moe(module) -> None:
    """transformers' MoE integration (``module``, ``transformers.integrations.moe``) has been imported: keep it for
    :func:`fused_activation` and register the experts functions in it (nothing when transformers is too old: the
    patchers raise then). ``import tilegemm.transformers`` has this run when that module is first imported."""
    global _hf_moe
    _hf_moe = module
    from tilegemm.transformers.compat import UnsupportedTransformersError

    try:
        register_experts_functions()
    except UnsupportedTransformersError:
        pass


def register_experts_functions() -> None:
    """Register ``"tilegemm"`` and ``"tilegemm_fp8"`` in transformers' ``ExpertsInterface`` (idempotent).

    Afterwards ``model.set_experts_implementation("tilegemm")`` or
    ``from_pretrained(..., experts_implementation="tilegemm")`` selects them. transformers' generation swaps
    only ``"grouped_mm"`` for ``"batched_mm"`` while decoding, so these names stay in place.
    """
    from tilegemm.transformers.compat import transformers_version

    transformers_version()
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(EXPERTS_NAME, tilegemm_experts_forward)
    ExpertsInterface.register(FP8_EXPERTS_NAME, tilegemm_fp8_experts_forward)


class ExpertsRegistration:
    """Held by patched experts modules as ``_tilegemm_registration``: unpickling it (``torch.load`` of a pickled
    patched model) imports this package, which registers the experts functions, so the loaded model runs in a
    fresh process without an ``import tilegemm.transformers`` first."""

    def __reduce__(self):
        return _registration, ()


def _registration() -> ExpertsRegistration:
    register_experts_functions()
    return ExpertsRegistration()


def mark_patched(module: torch.nn.Module, backend: str | None) -> None:
    """Give an experts module running tilegemm's experts function its ``backend`` and the registration marker."""
    module._tilegemm_backend = backend
    module._tilegemm_registration = ExpertsRegistration()
