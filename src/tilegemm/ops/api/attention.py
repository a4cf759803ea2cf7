"""The sparse decode attention stub (see the package docstring)."""

from __future__ import annotations

import torch

from tilegemm.backend.registry import dispatch
from tilegemm.ops import checks

Tensor = torch.Tensor


@dispatch(
    "sparse_decode_attention",
    check=checks.sparse_decode_attention_check,
    signature=checks.sparse_decode_attention_signature(),
)
def sparse_decode_attention(
    q: Tensor, k: Tensor, v: Tensor, indices: Tensor, scale: float, mask: Tensor | None = None, *, stream=None
) -> Tensor:
    """One query row per sequence attending to the keys ``indices`` selects (tilegemm's extension; no DeepGEMM
    counterpart): the decode step of DeepSeek's sparse attention (DSA), its keys and values read in place.

    Args:
        q: ``[B, H, Dk]`` bf16, fp16 or fp32 (last dim contiguous).
        k: ``[B, Hk, T, Dk]``, ``v``: ``[B, Hk, T, Dv]``, q's dtype (last dims contiguous); query head ``h`` reads key
            head ``h // (H // Hk)``.
        indices: int32 or int64 ``[B, K]``, the selected keys of each sequence (distinct, as a top-k gives them: a
            repeated index counts twice); an index outside ``[0, T)`` (``-1`` padding) selects no key.
        scale: the softmax scale (> 0).
        mask: ``None``, or the attention mask's row of each sequence ``[B, T]``, read at the selected keys: bool
            (``False``: the key is hidden) or float (added to the scaled logit, ``-inf`` hiding the key).
        stream: CUDA stream (``None``: current).

    Returns:
        A new ``[B, H, Dv]`` tensor of q's dtype: ``out[b, h] = sum_j p_j * v[b, h', idx_j]`` with
        ``p = softmax_j(scale * q[b, h] . k[b, h', idx_j] + mask[b, idx_j])``, ``h' = h // (H // Hk)``, ``idx_j =
        indices[b, j]``, computed in fp32 and rounded once; a row whose every selected key is hidden gets zeros. The
        ``gluon`` kernel (Hopper) reads the selected rows in place and is the automatic choice where it runs; the
        ``pytorch`` backend gathers them (the reference). Not differentiable.
    """
