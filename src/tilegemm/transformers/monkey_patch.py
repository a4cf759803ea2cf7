"""Patchers that put tilegemm into HuggingFace MoE models (TileGym / Liger style).

* :func:`apply_tilegemm_to_model` patches a built model: it registers the ``"tilegemm"`` /
  ``"tilegemm_fp8"`` experts functions and selects one with ``model.set_experts_implementation``, swaps the
  family's RMSNorm modules to tilegemm's RMSNorm kernel (:mod:`~tilegemm.transformers.norm`), and
  optionally swaps dense ``nn.Linear`` layers to :class:`~tilegemm.transformers.linear.TileGemmLinear`.
* ``apply_tilegemm_kernel_to_<family>(...)`` patches a model family before creation: every model of that
  family built afterwards (``from_config``, ``from_pretrained``) is patched at the end of its ``post_init``.
  :func:`revert_tilegemm_kernel_patches` undoes it.
* :data:`MODEL_TYPE_TO_PATCHER` maps ``config.model_type`` to the family patcher.

Supported: :func:`apply_tilegemm_to_model` takes any model with transformers' fused experts; the before-creation
patchers and the RMSNorm swap cover the families of :data:`tilegemm.transformers.families.FAMILIES`. Anything
else raises ``ValueError``; an old transformers raises ``UnsupportedTransformersError``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from tilegemm.transformers.compat import transformers_version
from tilegemm.transformers.experts import EXPERTS_NAME, FP8_EXPERTS_NAME, mark_patched, register_experts_functions
from tilegemm.transformers.families import FAMILIES, FAMILY_BY_MODEL_TYPE, SUPPORTED_MODEL_TYPES, ModelFamily
from tilegemm.transformers.indexer import restore_indexers, swap_indexers
from tilegemm.transformers.linear import restore_linear_layers, swap_linear_layers
from tilegemm.transformers.norm import restore_rms_norms, swap_rms_norms
from tilegemm.transformers.sparse_attention import restore_attention, use_sparse_attention

_PATCHED_METHODS = ("post_init", "get_correct_experts_implementation")
"""The methods a family patcher replaces on the family's ``PreTrainedModel`` base class."""

_ORIGINALS: dict[type, dict[str, tuple[bool, Callable]]] = {}
"""Family class -> method name -> (whether the class defined it itself, the method before patching)."""


def _unsupported(model_type: object) -> ValueError:
    return ValueError(
        f"tilegemm: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def is_fused_experts(module: nn.Module) -> bool:
    """True for a transformers experts module with fused 3-D expert weights (``gate_up_proj``/``down_proj``)."""
    w_up = getattr(module, "gate_up_proj", None)
    if w_up is None:
        w_up = getattr(module, "up_proj", None)
    w_down = getattr(module, "down_proj", None)
    return (
        isinstance(w_up, nn.Parameter)
        and isinstance(w_down, nn.Parameter)
        and w_up.dim() == 3
        and w_down.dim() == 3
        and hasattr(module, "num_experts")
    )


def experts_modules(model: nn.Module) -> list[nn.Module]:
    """Every fused experts module under ``model``."""
    return [m for m in model.modules() if is_fused_experts(m)]


def apply_tilegemm_to_model(
    model: nn.Module,
    experts: bool = True,
    linear: bool = False,
    fp8: bool = False,
    backend: str | None = None,
    norm: bool = True,
    indexer: bool = True,
    sparse_attention: bool = True,
) -> nn.Module:
    """Patch a built transformers model in place; returns it.

    Any model whose experts are transformers' fused experts modules (``@use_experts_implementation``: 3-D
    ``gate_up_proj`` / ``down_proj``, ``set_experts_implementation`` on the model) takes the experts patch:
    the families of :data:`~tilegemm.transformers.families.FAMILIES`, and OLMoE, gpt-oss and the other fused
    families, whose biases, activations and interleaved gates run on the unfused path. The RMSNorm swap applies
    to the families of that table (their norm class is known and tested); other models keep their norms. The
    sparse-attention indexers of DeepSeek-V3.2 and GLM-MoE-DSA score through the MQA-logits ops
    (:mod:`~tilegemm.transformers.indexer`).

    Args:
        model: a transformers ``PreTrainedModel``.
        experts: route the MoE experts through ``"tilegemm"`` (or ``"tilegemm_fp8"`` with ``fp8``).
        norm: run the family's RMSNorm modules as one tilegemm kernel each (:func:`tilegemm.autograd.rms_norm`,
            the stock math; differentiable); skipped for a model type outside the families table.
        linear: swap dense ``nn.Linear`` layers (attention, shared experts, dense MLPs, lm_head) to tilegemm's
            dense GEMM, keeping parameters, state_dict and weight tying.
        indexer: score the sparse-attention indexers (DeepSeek-V3.2, GLM-MoE-DSA) through the MQA-logits ops
            (:mod:`~tilegemm.transformers.indexer`), never materializing ``[B, S, H, T]``.
        sparse_attention: DSA models on SDPA attention: a decode step attends to the indexer's top-k keys only
            instead of every cached key under a mask (:mod:`~tilegemm.transformers.sparse_attention`).
        fp8: FP8 GEMMs (weights quantized once to 128x128 blocks and cached, activations per token), and DeepSeek's
            FP8 recipe for the indexers.
        backend: tilegemm backend for these layers (``None``: the current backend at call time).

    Returns:
        ``model``.

    Raises:
        ValueError: ``experts=True`` on a model without fused experts modules, or a model outside the families
            table with nothing else to patch (``experts=False``, ``linear=False``).
        UnsupportedTransformersError: transformers older than ``compat.MIN_TRANSFORMERS`` (5.17).
    """
    transformers_version()
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    known = model_type in FAMILY_BY_MODEL_TYPE
    if backend is not None:
        from tilegemm.backend.selector import validate_backend_name

        validate_backend_name(backend)
    if not (experts or linear or known):
        raise _unsupported(model_type)
    if experts:
        found = experts_modules(model)
        if not found or not hasattr(model, "set_experts_implementation"):
            raise ValueError(
                f"tilegemm: {type(model).__name__} (model_type {model_type!r}) has no fused experts module "
                "(transformers' 3-D gate_up_proj/down_proj under @use_experts_implementation)"
            )
        register_experts_functions()
        model.set_experts_implementation(FP8_EXPERTS_NAME if fp8 else EXPERTS_NAME)
        for module in found:
            mark_patched(module, backend)
    layers = dict(norm=norm and known, linear=linear, indexer=indexer, sparse_attention=sparse_attention)
    _swap_layers(model, fp8=fp8, backend=backend, **layers)
    return model


def _swap_layers(
    model: nn.Module, *, norm: bool, linear: bool, indexer: bool, sparse_attention: bool, fp8: bool, backend: str | None
) -> None:
    """The layer swaps of :func:`apply_tilegemm_to_model` and of a family patcher's ``post_init``: the RMSNorm
    modules (``norm``), the ``nn.Linear`` layers (``linear``), the sparse-attention indexers (``indexer``), the DSA
    attention (``sparse_attention``)."""
    if norm:
        swap_rms_norms(model, backend=backend)
    if linear:
        swap_linear_layers(model, fp8=fp8, backend=backend)
    if indexer:
        swap_indexers(model, fp8=fp8, backend=backend)
    if sparse_attention:
        use_sparse_attention(model)


def revert_tilegemm_model(model: nn.Module, experts_implementation: str = "grouped_mm") -> nn.Module:
    """Undo :func:`apply_tilegemm_to_model`: stock experts implementation, RMSNorm modules, ``nn.Linear`` layers,
    indexers and attention implementation."""
    if getattr(model.config, "_experts_implementation", None) in (EXPERTS_NAME, FP8_EXPERTS_NAME):
        model.set_experts_implementation(experts_implementation)
    for module in experts_modules(model):
        module.__dict__.pop("_tilegemm_registration", None)
    restore_rms_norms(model)
    restore_linear_layers(model)
    restore_indexers(model)
    restore_attention(model)
    return model


def _patch_family(
    family: ModelFamily,
    experts: bool,
    linear: bool,
    fp8: bool,
    backend: str | None,
    norm: bool = True,
    indexer: bool = True,
    sparse_attention: bool = True,
) -> None:
    """Make tilegemm's experts function the family's default experts implementation and patch its ``post_init``.

    The default is what transformers resolves an experts implementation nobody asked for to
    (``get_correct_experts_implementation(None)``, stock ``"grouped_mm"``): an ``experts_implementation=``
    passed to ``from_pretrained`` / ``from_config``, or set on the config, is kept, and the experts modules of
    such a model are left alone. ``post_init`` then gives the modules of a model that runs tilegemm's experts
    their ``backend`` and swaps the RMSNorm modules (``norm``) and the linear layers (``linear``).
    """
    transformers_version()
    if experts:
        register_experts_functions()
    cls = family.load_class()
    if cls not in _ORIGINALS:
        _ORIGINALS[cls] = {name: (name in cls.__dict__, getattr(cls, name)) for name in _PATCHED_METHODS}
    original_post_init = _ORIGINALS[cls]["post_init"][1]
    layers = dict(norm=norm, linear=linear, indexer=indexer, sparse_attention=sparse_attention)
    original_resolve = _ORIGINALS[cls]["get_correct_experts_implementation"][1]
    default = FP8_EXPERTS_NAME if fp8 else EXPERTS_NAME

    @functools.wraps(original_resolve)
    def get_correct_experts_implementation(self, requested_experts, *args, **kwargs):
        if requested_experts is None and experts:
            requested_experts = default
        return original_resolve(self, requested_experts, *args, **kwargs)

    @functools.wraps(original_post_init)
    def post_init(self, *args, **kwargs):
        result = original_post_init(self, *args, **kwargs)
        chosen = getattr(self.config, "_experts_implementation", None)
        if experts and chosen in (EXPERTS_NAME, FP8_EXPERTS_NAME):
            for module in experts_modules(self):
                mark_patched(module, backend)
        _swap_layers(self, fp8=fp8, backend=backend, **layers)
        return result

    for method in (post_init, get_correct_experts_implementation):
        method._tilegemm_patched = True  # type: ignore[attr-defined]
    cls.post_init = post_init
    cls.get_correct_experts_implementation = get_correct_experts_implementation


def _switches() -> inspect.Signature:
    """The switches of :func:`apply_tilegemm_to_model` (its parameters after ``model``, with their defaults): the
    signature of every family patcher."""
    signature = inspect.signature(apply_tilegemm_to_model)
    return signature.replace(parameters=list(signature.parameters.values())[1:], return_annotation=None)


def _make_family_patcher(family: ModelFamily) -> Callable[..., None]:
    switches = _switches()

    def patcher(*args: Any, **kwargs: Any) -> None:
        bound = switches.bind(*args, **kwargs)
        bound.apply_defaults()
        _patch_family(family, **bound.arguments)

    patcher.__signature__ = switches  # type: ignore[attr-defined]
    patcher.__name__ = family.patcher_name
    patcher.__qualname__ = patcher.__name__
    patcher.__doc__ = f"""Patch every {family.model_type} model created afterwards (at the end of its ``post_init``).

    Same switches as :func:`apply_tilegemm_to_model`; a model without MoE layers gets only the norm and linear
    swaps.
    ``experts=True`` makes ``"tilegemm"`` (``"tilegemm_fp8"`` with ``fp8``) the family's default experts
    implementation: an explicit ``experts_implementation=`` given to ``from_pretrained`` / ``from_config`` wins.
    Calling it again replaces the settings; :func:`revert_tilegemm_kernel_patches` undoes it.
    """
    return patcher


MODEL_TYPE_TO_PATCHER: dict[str, Callable[..., None]] = {f.model_type: _make_family_patcher(f) for f in FAMILIES}
"""``config.model_type`` -> the family's before-creation patcher, one per row of :data:`FAMILIES`."""

# The public names of the patchers (tests/hf/test_families.py checks one per family).
apply_tilegemm_kernel_to_deepseek_v2 = MODEL_TYPE_TO_PATCHER["deepseek_v2"]
apply_tilegemm_kernel_to_deepseek_v3 = MODEL_TYPE_TO_PATCHER["deepseek_v3"]
apply_tilegemm_kernel_to_deepseek_v32 = MODEL_TYPE_TO_PATCHER["deepseek_v32"]
apply_tilegemm_kernel_to_glm_moe_dsa = MODEL_TYPE_TO_PATCHER["glm_moe_dsa"]
apply_tilegemm_kernel_to_qwen2_moe = MODEL_TYPE_TO_PATCHER["qwen2_moe"]
apply_tilegemm_kernel_to_qwen3_moe = MODEL_TYPE_TO_PATCHER["qwen3_moe"]
apply_tilegemm_kernel_to_mixtral = MODEL_TYPE_TO_PATCHER["mixtral"]


def apply_tilegemm_kernel_to_model_type(model_type: str, **kwargs) -> None:
    """``MODEL_TYPE_TO_PATCHER[model_type](**kwargs)`` with a clear error for an unsupported type."""
    if model_type not in MODEL_TYPE_TO_PATCHER:
        raise _unsupported(model_type)
    MODEL_TYPE_TO_PATCHER[model_type](**kwargs)


def revert_tilegemm_kernel_patches() -> int:
    """Undo every ``apply_tilegemm_kernel_to_*`` (models already built stay patched); returns how many."""
    count = 0
    for cls, methods in list(_ORIGINALS.items()):
        for name, (had_own, original) in methods.items():
            if had_own:
                setattr(cls, name, original)
            else:
                delattr(cls, name)
        del _ORIGINALS[cls]
        count += 1
    return count
