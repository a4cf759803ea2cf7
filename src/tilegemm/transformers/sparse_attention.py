"""Sparse attention for the DSA models (DeepSeek-V3.2, GLM-MoE-DSA): a decode step attends to its top-k keys only.

Under eager and SDPA attention, transformers' DSA attention scatters the indexer's top-k into a ``[B, 1, S, T]``
mask and runs dense attention over every key of the cache: a decode step reads all ``T`` cached keys and values
(and, from transformers 5.24, expands all ``T`` cached latents) to keep ``k`` of them (2048 for DeepSeek-V3.2).
Under any other attention implementation the stock forward hands the raw indices to the attention function instead
(``indices=``, for FlashMLA). :data:`SPARSE_ATTENTION` is such an implementation, registered with transformers'
``AttentionInterface`` (and SDPA's mask function with ``AttentionMaskInterface``):

* a query row alone (a decode step, ``S == 1``) on a GPU where the ``gluon`` backend runs:
  :func:`tilegemm.sparse_decode_attention`, whose kernel reads the ``k`` selected keys and values in place (and the
  mask at them). The same softmax: every key the stock mask hides gets weight exactly 0 there (``exp(-inf)``), and
  the visible ones are the same; only the order of the sums differs;
* a query row alone elsewhere, over at least :data:`GATHER_MIN_KEYS_PER_INDEX` keys per selected one: the keys and
  values at its ``k`` indices are gathered (:func:`~tilegemm.ops.reference.attention.gather_rows`), with its mask
  at those keys, and SDPA runs over the ``k`` of them;
* otherwise (prefill, each row with its own keys; or few keys per selected one, where copying the selected keys and
  values costs more than reading all of them): the stock computation itself, the index mask folded into the
  attention mask as the stock forward folds it, then SDPA over all keys.

:func:`use_sparse_attention` switches a model from ``"sdpa"`` to it (only a DSA model whose stock attention forward
hands ``indices=`` on, checked in its source: :func:`hands_indices_on`); :func:`restore_attention` switches back.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from tilegemm import custom_ops
from tilegemm.backend import choice, selector
from tilegemm.ops.reference.attention import gather_rows
from tilegemm.transformers.compat import lines_in_order, squashed_source

__all__ = [
    "DSA_ATTENTION_CLASSES",
    "GATHER_MIN_KEYS_PER_INDEX",
    "SPARSE_ATTENTION",
    "hands_indices_on",
    "restore_attention",
    "sparse_attention_forward",
    "use_sparse_attention",
]

#: The name of the attention implementation in transformers' ``AttentionInterface``.
SPARSE_ATTENTION = "tilegemm_sparse"
#: Without the kernel, a decode step gathers its selected keys from this many keys per selected one (the attention's
#: key count, a static cache's whole length included, over ``k``). The copy of the ``k`` selected keys and values costs
#: about as much as reading them, so the gather pays where the dense attention reads several times more: one layer of
#: DeepSeek-V3.2 on an H200 (``benchmarks/results/indexer/sparse_kernel_h200.md``) took 183 us against the fold's 154
#: with 2 keys per selected one (4097 keys, k = 2048), 185 against 544 with 8.
GATHER_MIN_KEYS_PER_INDEX = 4
#: The DSA attention class of each model type (in ``transformers.models.<type>.modeling_<type>``).
DSA_ATTENTION_CLASSES = {"deepseek_v32": "DeepseekV32Attention", "glm_moe_dsa": "GlmMoeDsaAttention"}
#: The stock lines (whitespace-insensitive, in order) by which a DSA attention forward hands the indexer's raw top-k
#: to the attention function under an implementation other than eager and SDPA.
_HANDS_INDICES_ON = (
    'if self.config._attn_implementation in ("eager", "sdpa"):',
    "else:",
    "sparse_indices = topk_indices",
    "attention_interface(",
    "indices=sparse_indices,",
)


@functools.cache
def hands_indices_on(attention: type) -> bool:
    """Whether ``attention.forward`` (a stock DSA attention class) passes the indexer's top-k to the attention
    function as ``indices=`` outside eager and SDPA (the lines of :data:`_HANDS_INDICES_ON`, in order)."""
    source = squashed_source(attention.forward)
    return source is not None and lines_in_order(source, _HANDS_INDICES_ON)


def _index_mask(attention_mask: torch.Tensor | None, indices: torch.Tensor, keys: int, dtype: torch.dtype):
    """The stock forward's fold: ``attention_mask`` ``[B, 1, S, T]`` (bool, additive or ``None``) with every key
    outside ``indices`` ``[B, S, k]`` hidden."""
    batch, rows, _ = indices.shape
    hidden = indices.new_ones((batch, rows, keys), dtype=torch.bool).scatter(-1, indices.long(), False).unsqueeze(1)
    if attention_mask is None:
        return ~hidden
    if attention_mask.dtype == torch.bool:
        return attention_mask & ~hidden
    return attention_mask.masked_fill(hidden, torch.finfo(dtype).min)


def sparse_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    indices: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention over the keys ``indices`` selects (module docstring).

    Args:
        query: ``[B, H, S, D]``; key, value: ``[B, H, T, D]`` / ``[B, H, T, Dv]``.
        attention_mask: ``[B, 1, S, T]`` boolean (``True``: visible) or additive, or ``None``.
        indices: int ``[B, S, k]``, each row's selected keys (distinct, ``< T``), or ``None`` (every key, as SDPA).

    Returns:
        ``([B, S, H, Dv], None)``, as transformers' SDPA attention returns.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if indices is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    kwargs.pop("is_causal", None)
    rows, keys = query.shape[2], key.shape[2]
    if rows == 1:
        mask_row = _decode_mask_row(attention_mask, keys)
        if mask_row is not False and not dropout and kwargs.get("softcap") is None and _kernel_runs(query):
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            out = custom_ops.sparse_decode_attention(query[:, :, 0], key, value, indices[:, 0], scale, mask_row, None)
            return out.unsqueeze(1), None
    if rows != 1 or keys < GATHER_MIN_KEYS_PER_INDEX * indices.shape[-1]:
        mask = _index_mask(attention_mask, indices, keys, query.dtype)
        return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, is_causal=False, **kwargs)
    chosen = indices[:, 0]  # [B, k]
    key, value = gather_rows(key, chosen), gather_rows(value, chosen)
    mask = attention_mask
    if mask is not None:
        mask = mask.gather(-1, chosen.long()[:, None, None, :].expand(-1, mask.shape[1], 1, -1))  # [B, 1 or H, 1, k]
    return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, is_causal=False, **kwargs)


def _kernel_runs(query: torch.Tensor) -> bool:
    """Whether :func:`tilegemm.sparse_decode_attention` runs its kernel on ``query``'s device: the ``gluon`` backend
    can run here and no other backend is chosen."""
    return query.is_cuda and _gluon_chosen_or_automatic()


@torch.compiler.assume_constant_result
def _gluon_chosen_or_automatic() -> bool:
    """The ``gluon`` backend can run here and the backend choice leaves it to the op (read once when traced)."""
    return choice.chosen() in (choice.AUTO, "gluon") and selector.is_backend_available("gluon")


def _decode_mask_row(attention_mask: torch.Tensor | None, keys: int) -> torch.Tensor | None | bool:
    """A decode step's mask ``[B, 1, 1, >= T]`` as the op's ``[B, T]`` row (``None`` stays ``None``); ``False`` for a
    mask with a row per head, which the op does not take."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[3] < keys:
        return False
    return attention_mask[:, 0, 0, :keys]


@functools.cache
def _register() -> None:
    """Register :data:`SPARSE_ATTENTION` with transformers' attention and mask interfaces (once)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SPARSE_ATTENTION, sparse_attention_forward)
    AttentionMaskInterface.register(SPARSE_ATTENTION, sdpa_mask)


def _attention_class(model: nn.Module) -> type | None:
    """The stock DSA attention class of ``model``'s type, where its modeling module is loaded."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    name = DSA_ATTENTION_CLASSES.get(model_type)
    module = sys.modules.get(f"transformers.models.{model_type}.modeling_{model_type}") if name else None
    return getattr(module, name, None) if module is not None else None


def use_sparse_attention(model: nn.Module) -> bool:
    """Switch a DSA model that runs SDPA attention to :data:`SPARSE_ATTENTION`; returns whether it did. A model of
    another type or attention implementation, or whose attention forward does not hand ``indices=`` on
    (:func:`hands_indices_on`), is left alone."""
    attention = _attention_class(model)
    if attention is None or not hands_indices_on(attention) or model.config._attn_implementation != "sdpa":
        return False
    _register()
    model.set_attn_implementation(SPARSE_ATTENTION)
    return True


def restore_attention(model: nn.Module) -> bool:
    """Switch a model on :data:`SPARSE_ATTENTION` back to SDPA; returns whether it did."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != SPARSE_ATTENTION:
        return False
    model.set_attn_implementation("sdpa")
    return True
