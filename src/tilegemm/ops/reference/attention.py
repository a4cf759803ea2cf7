"""Sparse decode attention of the ``pytorch`` backend: the selected keys and values gathered, the softmax in fp32.

It also holds the op's automatic choice: the ``gluon`` kernel where that backend runs, else this reference (the op
has no ``cutile`` kernel, so the default backend would only fall back here with a warning).
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.backend import selector
from tilegemm.backend.choice import register_rule
from tilegemm.backend.registry import register_impl


@register_rule("sparse_decode_attention")
def _kernel_where_it_runs(arguments: dict[str, Any]) -> str:
    """``gluon`` for CUDA tensors where that backend can run, else ``pytorch``."""
    return "gluon" if arguments["q"].is_cuda and selector.is_backend_available("gluon") else "pytorch"


def gather_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x[b, :, indices[b]]`` for ``x [B, H, T, D]`` and ``indices [B, K]``: ``[B, H, K, D]``, bit for bit.

    The rows are copied as 8-byte words where the row's bytes allow (4 bf16 elements a word: a quarter of the
    elements of an element-wise gather)."""
    batch, heads, _, dim = x.shape
    size = x.element_size()
    wide = x
    # a traced call (torch.compile) gathers elements: Dynamo cannot trace the alignment checks (data_ptr)
    if not torch.compiler.is_compiling() and dim * size % 8 == 0 and x.stride(-1) == 1 and x.data_ptr() % 8 == 0:
        if all(s * size % 8 == 0 for s in x.stride()[:-1]):
            wide = x.view(torch.int64)
    rows = indices.long()[:, None, :, None].expand(batch, heads, indices.shape[1], wide.shape[-1])
    return wide.gather(2, rows).view(x.dtype)


@register_impl("sparse_decode_attention", "pytorch")
def sparse_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    stream,
) -> torch.Tensor:
    """The selected keys and values gathered (:func:`gather_rows`), then the softmax of the fp32 logits; an index
    outside ``[0, T)`` selects no key."""
    groups = q.shape[1] // k.shape[1]
    if k.shape[2] == 0:  # no keys to select: every row hidden
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[3])
    selects = (indices >= 0) & (indices < k.shape[2])
    indices = torch.where(selects, indices, 0)
    keys = gather_rows(k, indices).float().repeat_interleave(groups, dim=1)  # [B, H, K, Dk]
    values = gather_rows(v, indices).float().repeat_interleave(groups, dim=1)  # [B, H, K, Dv]
    logits = torch.einsum("bhd,bhkd->bhk", q.float(), keys) * scale
    if mask is not None:
        at_keys = mask.gather(1, indices.long())[:, None, :]
        logits = logits.masked_fill(~at_keys, float("-inf")) if mask.dtype == torch.bool else logits + at_keys.float()
    logits = logits.masked_fill(~selects[:, None, :], float("-inf"))
    top = logits.amax(dim=-1, keepdim=True)
    weights = torch.exp(logits - torch.where(torch.isfinite(top), top, 0.0))
    total = weights.sum(dim=-1, keepdim=True)
    out = torch.einsum("bhk,bhkd->bhd", weights, values) / torch.where(total > 0, total, 1.0)
    return out.to(q.dtype)
