"""Patchers that put tilegemm into HuggingFace MoE models (TileGym / Liger style).

* :func:`apply_tilegemm_to_model` patches a built model: it registers the ``"tilegemm"`` /
  ``"tilegemm_fp8"`` experts functions and selects one with ``model.set_experts_implementation``, and
  optionally swaps dense ``nn.Linear`` layers to :class:`~tilegemm.transformers.linear.TileGemmLinear`.
* ``apply_tilegemm_kernel_to_<family>(...)`` patches a model family before creation: every model of that
  family built afterwards (``from_config``, ``from_pretrained``) is patched at the end of its ``post_init``.
  :func:`revert_tilegemm_kernel_patches` undoes it.
* :data:`MODEL_TYPE_TO_PATCHER` maps ``config.model_type`` to the family patcher.

Supported: the families of :data:`tilegemm.transformers.families.FAMILIES` on transformers >= 5.7. Anything
else raises ``ValueError``; an old transformers raises ``UnsupportedTransformersError``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

from tilegemm.transformers.compat import transformers_version
from tilegemm.transformers.experts import EXPERTS_NAME, FP8_EXPERTS_NAME, register_experts_functions
from tilegemm.transformers.families import FAMILIES, FAMILY_BY_MODEL_TYPE, SUPPORTED_MODEL_TYPES, ModelFamily
from tilegemm.transformers.linear import restore_linear_layers, swap_linear_layers

_ORIGINAL_POST_INIT: dict[type, tuple[bool, Callable]] = {}
"""Family class -> (whether it defined its own ``post_init``, the ``post_init`` before patching)."""


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
    model: nn.Module, experts: bool = True, linear: bool = False, fp8: bool = False, backend: str | None = None
) -> nn.Module:
    """Patch a built DeepSeek-V2/V3, Qwen2-MoE, Qwen3-MoE or Mixtral model in place; returns it.

    Args:
        model: a transformers ``PreTrainedModel`` of a supported ``config.model_type``.
        experts: route the MoE experts through ``"tilegemm"`` (or ``"tilegemm_fp8"`` with ``fp8``).
        linear: swap dense ``nn.Linear`` layers (attention, shared experts, dense MLPs, lm_head) to tilegemm's
            dense GEMM, keeping parameters, state_dict and weight tying.
        fp8: FP8 GEMMs (weights quantized once to 128x128 blocks and cached, activations per token).
        backend: tilegemm backend for these layers (``None``: the current backend at call time).

    Raises:
        ValueError: unsupported model type, or ``experts=True`` on a model without fused experts.
        UnsupportedTransformersError: transformers < 5.7.
    """
    transformers_version()
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILY_BY_MODEL_TYPE:
        raise _unsupported(model_type)
    if backend is not None:
        from tilegemm.backend.selector import validate_backend_name

        validate_backend_name(backend)
    if experts:
        found = experts_modules(model)
        if not found:
            raise ValueError(f"tilegemm: {type(model).__name__} has no fused experts module (gate_up_proj/down_proj)")
        register_experts_functions()
        model.set_experts_implementation(FP8_EXPERTS_NAME if fp8 else EXPERTS_NAME)
        for module in found:
            module._tilegemm_backend = backend
    if linear:
        swap_linear_layers(model, fp8=fp8, backend=backend)
    return model


def revert_tilegemm_model(model: nn.Module, experts_implementation: str = "grouped_mm") -> nn.Module:
    """Undo :func:`apply_tilegemm_to_model`: stock experts implementation, plain ``nn.Linear`` layers."""
    if getattr(model.config, "_experts_implementation", None) in (EXPERTS_NAME, FP8_EXPERTS_NAME):
        model.set_experts_implementation(experts_implementation)
    restore_linear_layers(model)
    return model


def _patch_family(family: ModelFamily, experts: bool, linear: bool, fp8: bool, backend: str | None) -> None:
    transformers_version()
    if experts:
        register_experts_functions()
    cls = family.load_class()
    if cls not in _ORIGINAL_POST_INIT:
        _ORIGINAL_POST_INIT[cls] = ("post_init" in cls.__dict__, cls.post_init)
    original = _ORIGINAL_POST_INIT[cls][1]

    @functools.wraps(original)
    def post_init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        has_experts = bool(experts_modules(self))
        apply_tilegemm_to_model(self, experts=experts and has_experts, linear=linear, fp8=fp8, backend=backend)
        return result

    post_init._tilegemm_patched = True  # type: ignore[attr-defined]
    cls.post_init = post_init


def _make_family_patcher(family: ModelFamily) -> Callable[..., None]:
    def patcher(experts: bool = True, linear: bool = False, fp8: bool = False, backend: str | None = None) -> None:
        _patch_family(family, experts, linear, fp8, backend)

    patcher.__name__ = family.patcher_name
    patcher.__qualname__ = patcher.__name__
    patcher.__doc__ = f"""Patch every {family.model_type} model created afterwards (at the end of its ``post_init``).

    Same switches as :func:`apply_tilegemm_to_model`; a model without MoE layers gets only the linear swap.
    Calling it again replaces the settings; :func:`revert_tilegemm_kernel_patches` undoes it.
    """
    return patcher


MODEL_TYPE_TO_PATCHER: dict[str, Callable[..., None]] = {f.model_type: _make_family_patcher(f) for f in FAMILIES}
"""``config.model_type`` -> the family's before-creation patcher, one per row of :data:`FAMILIES`."""

# The public names of the patchers (tests/transformers/test_families.py checks one per family).
apply_tilegemm_kernel_to_deepseek_v2 = MODEL_TYPE_TO_PATCHER["deepseek_v2"]
apply_tilegemm_kernel_to_deepseek_v3 = MODEL_TYPE_TO_PATCHER["deepseek_v3"]
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
    for cls, (had_own, original) in list(_ORIGINAL_POST_INIT.items()):
        if had_own:
            cls.post_init = original
        else:
            del cls.post_init
        del _ORIGINAL_POST_INIT[cls]
        count += 1
    return count
