"""Swap dense ``nn.Linear`` layers to tilegemm's dense GEMMs, keeping parameters, state_dict and tying.

The swap changes only the layer's class (``nn.Linear`` -> :class:`TileGemmLinear`, a subclass with another
``forward``; :class:`~tilegemm.transformers.swap.ClassSwap`, as the RMSNorm and indexer swaps): the
``weight``/``bias`` Parameters stay the same objects, so ``state_dict`` keys, tied weights (``lm_head.weight is
embed_tokens.weight``), devices and dtypes are untouched, and :func:`restore_linear_layers` swaps back.

Forward: ``y = x @ W.T (+ b)`` with ``bf16_gemm_nt`` (bf16 models on the current backend; fp16/fp32 models on
the exact ``pytorch`` backend), or with ``fp8_gemm_nt`` when ``fp8`` (weight quantized once to 128x128 blocks
and cached on the weight tensor, activations cast per token), through the ``tilegemm::linear`` custom op
(:mod:`~tilegemm.custom_ops`: one node under ``torch.compile``). Inference only: when gradients are
needed it runs ``F.linear``.
"""

from __future__ import annotations

import torch
from torch import nn

from tilegemm import custom_ops
from tilegemm.transformers.swap import ClassSwap

MIN_OUT_FEATURES = 8
"""Layers with fewer outputs (router-style gates such as Qwen's ``shared_expert_gate``, N=1) stay stock."""


LINEAR = ClassSwap(fp8=False, backend=None)
"""The ``nn.Linear`` swap; its settings: FP8 GEMMs, the module's tilegemm backend (``None``: the current one)."""


@LINEAR.written(nn.Linear)
class TileGemmLinear(nn.Linear):
    """``nn.Linear`` whose forward runs ``tilegemm.bf16_gemm_nt`` (or ``fp8_gemm_nt``); same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return nn.functional.linear(x, self.weight, self.bias)
        x2 = x.reshape(-1, self.in_features).to(self.weight.dtype)
        y = custom_ops.linear(x2, self.weight, self._tilegemm_fp8, self._tilegemm_backend)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)


def swap_linear_layers(
    model: nn.Module, fp8: bool = False, backend: str | None = None, min_out_features: int = MIN_OUT_FEATURES
) -> list[str]:
    """Make every plain ``nn.Linear`` under ``model`` (out_features >= ``min_out_features``) a TileGemmLinear.

    Returns the swapped layers' names. Subclasses of ``nn.Linear`` other than TileGemmLinear are left alone;
    already swapped layers get the new ``fp8``/``backend`` settings.
    """
    return LINEAR.swap(
        model, TileGemmLinear, lambda module: module.out_features >= min_out_features, fp8=fp8, backend=backend
    )


def restore_linear_layers(model: nn.Module) -> int:
    """Turn every TileGemmLinear under ``model`` back into ``nn.Linear``; returns how many."""
    return LINEAR.restore(model)
