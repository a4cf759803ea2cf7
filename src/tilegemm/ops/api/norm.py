"""The RMSNorm stub (see the package docstring)."""

from __future__ import annotations

import torch

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks

Tensor = torch.Tensor
FP8Operand = tuple[torch.Tensor, torch.Tensor]
Recipe = tuple[int, int, int]

# ------------------------------------------------------------------------------------ RMSNorm


@dispatch("rms_norm", check=checks.rms_norm_check)
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, *, stream=None) -> Tensor:
    """RMSNorm over the last dimension (tilegemm's extension; no DeepGEMM counterpart): the norm of the MoE
    models tilegemm patches, in one kernel.

    Args:
        x: [..., H] bf16, fp16 or fp32, any strides.
        weight: [H] bf16, fp16 or fp32.
        eps: a finite float >= 0 added to the mean square.
        stream: CUDA stream (``None``: current).

    Returns:
        A new tensor of ``x``'s shape in ``torch.promote_types(x.dtype, weight.dtype)``:
        ``y = weight * round(x32 * rsqrt(mean(x32 ** 2, -1) + eps))`` with ``x32 = x.float()``, the mean and the
        scaling in fp32 and ``round`` to ``x.dtype``: the steps and roundings of transformers' ``LlamaRMSNorm``
        and its copies (``Qwen3MoeRMSNorm``, ``DeepseekV3RMSNorm``, ...). The ``pytorch`` backend runs those very
        torch ops (the stock module's result, bit for bit); the ``cutile`` kernel differs only in the order of the
        squares' sum. Rows longer than 8192 run the ``pytorch`` backend. Not differentiable: training uses
        :func:`tilegemm.autograd.rms_norm`.
    """
