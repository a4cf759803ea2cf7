"""RMSNorm of the ``pytorch`` backend: transformers' RMSNorm module, step by step.

``y = w * round(x32 * rsqrt(mean(x32^2) + eps))`` with ``x32 = x.float()``, the mean and the scaling in fp32,
the rounding to ``x.dtype`` and the weight product in ``promote_types(w.dtype, x.dtype)``: the operations of
``Qwen3MoeRMSNorm.forward`` (and its copies in the other families), so the result is the stock module's bit for
bit.
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import register_impl


@register_impl("rms_norm", "pytorch")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, stream) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (see the module docstring)."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)
