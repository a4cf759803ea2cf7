"""Swap a model's RMSNorm modules to tilegemm's RMSNorm kernel, keeping parameters, state_dict and settings.

transformers' RMSNorm (``Qwen3MoeRMSNorm`` and its copies in every patched family) runs as eight small kernels
(cast, square, mean, add, rsqrt, multiply, cast, weight product); a decode step of a 4-layer Qwen3-MoE spends
more of its graph replay on them than on the experts. The swap changes only the module's class (the family's
RMSNorm class -> a subclass whose ``forward`` is :func:`tilegemm.autograd.rms_norm`, one kernel forward and a
differentiable backward) through :class:`~tilegemm.transformers.swap.ClassSwap`, as the indexer and linear swaps do:
the ``weight`` Parameter, ``variance_epsilon``, state_dict keys, devices and dtypes stay, and
:func:`restore_rms_norms` swaps back.

Only modules whose class is exactly the family's RMSNorm class (``ModelFamily.rms_norm_class``) are swapped, and
``tests/hf/test_norm.py`` holds each of those classes' ``forward`` to the stock formula that
``tilegemm.rms_norm`` computes, so a transformers release that changes it fails a test instead of being swapped.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from tilegemm.custom_ops import rms_norm_forward
from tilegemm.ops.checks import rms_norm_check
from tilegemm.transformers.families import FAMILY_BY_MODEL_TYPE
from tilegemm.transformers.swap import ClassSwap


def _forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """:func:`tilegemm.autograd.rms_norm` on the module's backend: the ``tilegemm::rms_norm`` custom op, one opaque
    node under ``torch.compile`` (the backend is an argument of the op, not a ``use_backend`` scope)."""
    eps = rms_norm_check(hidden_states, self.weight, self.variance_epsilon)["eps"]
    return rms_norm_forward(hidden_states, self.weight, eps, self._tilegemm_backend)


NORM = ClassSwap(backend=None)
"""The RMSNorm swap; its setting: the module's tilegemm backend (``None``: the current one)."""


def _rebuild_swapped(stock: type, state: dict) -> nn.Module:
    """Unpickle a swapped RMSNorm module (pickles name this function): a ``stock`` with ``state``, swapped again."""
    return NORM.rebuild(stock, state, tilegemm_rms_norm_class(stock))


@functools.cache
def tilegemm_rms_norm_class(stock: type) -> type:
    """The subclass of the stock RMSNorm class ``stock`` whose forward runs :func:`tilegemm.autograd.rms_norm`.

    Its instances pickle (``torch.save(model)``, ``copy.deepcopy``) as the stock class and the swap, rebuilt by
    :func:`_rebuild_swapped`, which importing this module provides.
    """
    doc = f"``{stock.__name__}`` whose forward is one tilegemm RMSNorm kernel (same parameters and math)."
    return NORM.subclass(stock, {"forward": _forward, "__doc__": doc}, _rebuild_swapped)


def swap_rms_norms(model: nn.Module, backend: str | None = None) -> list[str]:
    """Make every RMSNorm module of ``model``'s family (``config.model_type``) run tilegemm's kernel.

    Returns the swapped modules' names. Modules already swapped get the new ``backend``. A model of a type
    outside :data:`tilegemm.transformers.families.FAMILIES` raises ``ValueError``.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILY_BY_MODEL_TYPE:
        raise ValueError(f"tilegemm: model_type {model_type!r} has no RMSNorm class in the families table")
    stock = FAMILY_BY_MODEL_TYPE[model_type].load_rms_norm_class()
    return NORM.swap(model, tilegemm_rms_norm_class(stock), backend=backend)


def swapped_rms_norms(model: nn.Module) -> list[nn.Module]:
    """Every RMSNorm module under ``model`` that runs tilegemm's kernel (swapped by :func:`swap_rms_norms`)."""
    return NORM.swapped(model)


def restore_rms_norms(model: nn.Module) -> int:
    """Turn every swapped RMSNorm module under ``model`` back into its stock class; returns how many."""
    return NORM.restore(model)
