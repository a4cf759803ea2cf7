"""Sparse-attention indexers (DSA) of transformers models scored by tilegemm's MQA-logits ops.

The lightning indexer of DeepSeek-V3.2 and GLM-MoE-DSA picks each query's top-k keys by
``score[b, s, t] = sum_h w[b, s, h] * relu(q[b, s, h] . k[b, t]) * softmax_scale`` with
``w = weights_proj(x) * H**-0.5``. transformers computes it by materializing ``[B, S, H, T]`` fp32 scores (64 heads
at 4k context: 4.3 GB per layer). The swap replaces that with one MQA-logits call per sequence (the ``[S, T]``
logits only), with the same projections, rotary embedding, key cache, mask and ``torch.topk``:

* BF16 (default): :func:`tilegemm.bf16_mqa_logits` on the bf16 queries and keys (fp32 products and sums), the
  softmax scale folded into the weights (``relu(x * c) == c * relu(x)`` for ``c > 0``). The same scores as stock up
  to fp32 summation order, so the same top-k up to near-ties.
* FP8 (``fp8=True``, DeepSeek's recipe): queries and keys optionally rotated by the orthonormal Hadamard transform
  (``hadamard``, as the reference implementation's ``rotate_activation``; dot products unchanged), queries cast to
  FP8 per (token, head) with the scale folded into the weights, keys per token, then :func:`tilegemm.fp8_mqa_logits`.
  The keys of the cache are quantized on every call (transformers' cache holds bf16 keys).
* FP8 key cache (``fp8=True, fp8_cache=True``): the same recipe, the keys quantized once as they are appended into an
  FP8 cache beside transformers' (:class:`tilegemm.fp8_key_cache.Fp8KeyCache`, DeepGEMM's paged layout, kept on the
  cache object per layer: :func:`fp8_keys_for`); decode scored over it in place by
  :func:`tilegemm.fp8_paged_mqa_logits` without a schedule, the step's key appended in the kernel that casts its
  queries (:func:`tilegemm.fp8_indexer_prepare`), prefill by :func:`tilegemm.fp8_mqa_logits` on its keys
  (:func:`tilegemm.fp8_key_cache.score_fp8_key_cache`). A static cache's writes follow its device counter, so
  :func:`tilegemm.transformers.compat.rewind_static_cache` rewinds both caches and the step is graph-capturable.
  This path calls the ops directly, not as one custom op (``torch.compile`` breaks the graph there).

Each query's key window ``[ks, ke)`` ends at its mask row's last visible key and starts at its first (prefill) or
at key 0 (decode steps: :func:`~tilegemm.indexer_mask.key_windows`), so the kernel skips the causal future and the
unfilled slots of a static cache; the mask itself is then applied as stock applies it (``-inf`` for a boolean mask,
addition for an additive one), which also covers the hidden keys (padding) inside a window. The softmax scale and
stock's ``n_heads**-0.5`` are folded into one factor of the head weights. Nothing synchronises the host, so a
static-cache decode step can be captured in a CUDA graph.
That scoring is :func:`tilegemm.indexer.index_scores` (with :func:`~tilegemm.indexer_mask.mask_windows`,
:func:`~tilegemm.indexer.hadamard_rotate`, :func:`~tilegemm.indexer.quantize_rows`; imported here too); this module
is the swap. The swapped forward calls the scoring as the custom op ``tilegemm::indexer_scores``
(:func:`tilegemm.custom_ops.indexer_scores`), so patched models compile whole with ``torch.compile(fullgraph=True)``;
swapped indexers pickle as their stock class.

Only classes whose stock ``forward`` holds the formula are swapped: :data:`INDEXERS` names them and
:func:`stock_formula_matches` checks the stock source for the scoring lines the swap replaces (a transformers
release that changes them is left stock, with a warning). :func:`restore_indexers` swaps back.

The top-k is stock's ``torch.topk`` over the scores, the same indices. Where the attention beside the indexer reads
them only by scattering them into a mask (eager and SDPA attention; :func:`topk_order_unread` checks its source), it
skips ``torch.topk``'s final sort (``sorted=False``): the same set of indices in another order, the same mask. So it
does under :data:`~tilegemm.transformers.sparse_attention.SPARSE_ATTENTION`, which gathers the keys it selects.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from tilegemm.custom_ops import indexer_scores
from tilegemm.fp8_key_cache import Fp8KeyCache, score_fp8_key_cache
from tilegemm.indexer import hadamard_rotate, index_scores, quantize_rows
from tilegemm.indexer_mask import mask_windows
from tilegemm.transformers.compat import lines_in_order, squash, squashed_source
from tilegemm.transformers.sparse_attention import SPARSE_ATTENTION
from tilegemm.transformers.swap import ClassSwap


@dataclass(frozen=True)
class IndexerSpec:
    """A transformers indexer class whose stock scoring is the MQA-logits formula.

    Attributes:
        model_type: ``config.model_type`` of the models that hold it.
        module: the modeling module inside ``transformers.models.<model_type>``.
        indexer_class: the indexer's class name in that module.
        rope: the module-level rotary function the indexer applies (``apply_rotary_pos_emb``: half-split,
            ``apply_rotary_pos_emb_interleave``: interleaved pairs).
    """

    model_type: str
    module: str
    indexer_class: str
    rope: str

    def load_class(self) -> type | None:
        """The stock indexer class, or ``None`` where this transformers has no such model."""
        try:
            module = importlib.import_module(f"transformers.models.{self.model_type}.{self.module}")
        except ImportError:
            return None
        return getattr(module, self.indexer_class, None)


INDEXERS: tuple[IndexerSpec, ...] = (
    IndexerSpec("deepseek_v32", "modeling_deepseek_v32", "DeepseekV32Indexer", "apply_rotary_pos_emb"),
    IndexerSpec("glm_moe_dsa", "modeling_glm_moe_dsa", "GlmMoeDsaIndexer", "apply_rotary_pos_emb_interleave"),
)
"""Every swapped indexer, one per model type."""

INDEXER_BY_MODEL_TYPE: dict[str, IndexerSpec] = {spec.model_type: spec for spec in INDEXERS}

#: The stock lines the swap replaces (whitespace-insensitive), in order, each step as the alternatives transformers
#: releases have written it (``{cache}``: the forward's cache parameter): key cache, scores, weights, head sum,
#: mask, top-k.
STOCK_SCORING: tuple[tuple[str, ...], ...] = (
    ("k = {cache}.update_indexer(k, self.layer_idx)",),
    (
        "scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale",
        "scores = torch.matmul(q.flatten(1, 2).float(), k.transpose(-1, -2).float()) * self.softmax_scale",
    ),
    ("scores = F.relu(scores)",),
    ("weights = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float() * (self.n_heads**-0.5)",),
    ("index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)",),
    ('index_scores = index_scores.masked_fill(~attention_mask, float("-inf"))',),
    ("index_scores = index_scores + attention_mask",),
    ("topk = min(self.index_topk, index_scores.shape[-1])",),
    ("return index_scores.topk(topk, dim=-1).indices.to(torch.int32)",),
)
#: The stock forward's parameters, with its cache parameter last (``cache`` from transformers 5.24 on).
_STOCK_PARAMETERS = ("self", "hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids")
_CACHE_PARAMETERS = ("cache", "past_key_values")


@functools.cache
def stock_formula_matches(stock: type, rope: str) -> bool:
    """Whether ``stock.forward`` computes what the swap computes: its parameters, its rotary function and one
    alternative of every step of :data:`STOCK_SCORING`, in order."""
    forward = inspect.unwrap(stock.forward)
    source = squashed_source(forward)
    if source is None:
        return False
    params = tuple(inspect.signature(forward).parameters)
    if params[:-1] != _STOCK_PARAMETERS or params[-1] not in _CACHE_PARAMETERS:
        return False
    if squash(f"= {rope}(q_rot, k_rot, cos, sin, unsqueeze_dim=2)") not in source:
        return False
    steps = [tuple(line.format(cache=params[-1]) for line in alternatives) for alternatives in STOCK_SCORING]
    return lines_in_order(source, steps)


#: The attention implementations under which transformers' DSA attention reads the indexer's top-k only by scattering
#: it into a mask (its source, checked by :func:`topk_order_unread`: the lines of :data:`_MASK_ONLY_SOURCE`).
MASK_ATTENTION = ("eager", "sdpa")
_MASK_ONLY_SOURCE = (
    'if self.config._attn_implementation in ("eager", "sdpa"):',
    ".scatter(-1, topk_indices.long(), False)",
    "else:",
    "sparse_indices = topk_indices",
)


@functools.cache
def topk_order_unread(stock: type) -> bool:
    """Whether every module of ``stock``'s modeling module that calls ``self.indexer`` reads its top-k, under
    :data:`MASK_ATTENTION`, only by scattering it into a mask (the lines of :data:`_MASK_ONLY_SOURCE`, in order):
    then the order of the indices is never read there, and the swapped forward skips ``torch.topk``'s sort."""
    module = sys.modules.get(stock.__module__)
    callers = []
    for cls in vars(module).values() if module is not None else ():
        if isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__ == stock.__module__:
            source = squashed_source(cls.forward)
            if source is None:
                return False
            if squash("self.indexer(") in source:
                callers.append(source)
    return bool(callers) and all(lines_in_order(source, _MASK_ONLY_SOURCE) for source in callers)


# ------------------------------------------------------------------------------------------------ the swap


def _patched_forward(rope_name: str):
    def forward(
        self,
        hidden_states: torch.Tensor,
        q_resid: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
    ) -> torch.Tensor:
        """The stock indexer's forward with its scoring through :func:`index_scores` (int32 top-k ``[B, S, k]``)."""
        if cache is None:
            cache = past_key_values
        rope = self._tilegemm_rope
        batch, seq_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        split = [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim]
        with torch.no_grad():
            q = self.wq_b(q_resid).view(batch, seq_len, self.n_heads, self.head_dim)
            q_rot, q_pass = torch.split(q, split, dim=-1)
            k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
            k_rot, k_pass = torch.split(k, split, dim=-1)
            q_rot, k_rot = rope(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
            q = torch.cat([q_rot, q_pass], dim=-1)
            k = new = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
            if cache is not None:
                k = cache.update_indexer(k, self.layer_idx)
            weights = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float()
            scale = float(self.softmax_scale) * self.n_heads**-0.5
            if self._tilegemm_fp8_cache:
                keys, pending = fp8_keys_for(
                    cache, self.layer_idx, new, k, self._tilegemm_hadamard, self._tilegemm_backend
                )
                scores = score_fp8_key_cache(
                    q, keys, weights, attention_mask, scale, k.shape[1], self._tilegemm_backend, pending
                )
            else:
                scores = indexer_scores(
                    q,
                    k,
                    weights,
                    attention_mask,
                    scale,
                    self._tilegemm_fp8,
                    self._tilegemm_hadamard,
                    self._tilegemm_backend,
                )
            topk = min(self.index_topk, scores.shape[-1])
            attention = self.config._attn_implementation
            ordered = not (
                attention == SPARSE_ATTENTION or (self._tilegemm_topk_order_unread and attention in MASK_ATTENTION)
            )
            return scores.topk(topk, dim=-1, sorted=ordered).indices.to(torch.int32)

    return forward


INDEXER = ClassSwap(backend=None, fp8=False, hadamard=True, fp8_cache=False)
"""The indexer swap; its settings: the MQA-logits calls' backend, DeepSeek's FP8 recipe, the Hadamard rotation, the
FP8 key cache."""

#: The attribute of a transformers cache object that holds its layers' FP8 key caches (``{layer_idx: Fp8KeyCache}``).
FP8_KEYS_ATTR = "_tilegemm_fp8_keys"


def fp8_keys_for(
    cache, layer_idx: int, new: torch.Tensor, keys: torch.Tensor, hadamard: bool, backend: str | None = None
) -> tuple[Fp8KeyCache, tuple[torch.Tensor, torch.Tensor | int] | None]:
    """Layer ``layer_idx``'s FP8 key cache and the append of the keys ``new`` it still owes: ``(fp8_cache, pending)``,
    ``pending`` the ``(keys, end)`` of :meth:`Fp8KeyCache.append` (``score_fp8_key_cache``'s ``append``: a decode
    step writes them in the kernel that casts its queries), or ``None`` where the cache was just built from all of
    ``keys``.

    Args:
        cache: the forward's transformers cache (``None``: no cache, a fresh FP8 cache of ``keys``).
        new: the keys this call appended, ``[B, S, D]``.
        keys: every key the layer's cache returned (``update_indexer``), ``[B, T, D]``; ``new`` among them.
        hadamard: the rotation of the swap's recipe.
        backend: the tilegemm backend of the appends (``None``: the current choice).

    Where the FP8 cache writes: a layer with a tensor ``indexer_cumulative_length`` (transformers' static layers)
    has just advanced it by S, so at ``counter - S ..``, device ops (graph-capturable; a rewind of the counter
    rewinds this cache too); otherwise (a dynamic cache, which concatenates) at ``T - S ..``. An FP8 cache is built
    (from all of ``keys``, quantized once) where there is none for the layer or it no longer matches: another batch
    size, dim, device or rotation, a static buffer it cannot hold, a dynamic cache whose length is not the one it
    last saw plus S (cropped, reset, reordered to another length).
    """
    batch, count, dim = new.shape
    total = keys.shape[1]
    if cache is None:
        fresh = Fp8KeyCache(batch, total, dim, keys.device, hadamard)
        fresh.append(keys, total, backend)
        return fresh, None
    layers = getattr(cache, "layers", None)
    layer = layers[layer_idx] if isinstance(layers, (list, tuple)) and layer_idx < len(layers) else None
    counter = getattr(layer, "indexer_cumulative_length", None)
    static = isinstance(counter, torch.Tensor)
    store = getattr(cache, FP8_KEYS_ATTR, None)
    if store is None:
        store = {}
        setattr(cache, FP8_KEYS_ATTR, store)
    fp8 = store.get(layer_idx)
    stale = (
        fp8 is None
        or (fp8.batch, fp8.dim, fp8.hadamard, fp8.kv_cache.device) != (batch, dim, hadamard, keys.device)
        or (static and fp8.capacity < total)
        or (not static and fp8.length != total - count)
    )
    if stale:
        fp8 = Fp8KeyCache(batch, total, dim, keys.device, hadamard)
        fp8.append(keys, total, backend)
        fp8.length = total
        store[layer_idx] = fp8
        return fp8, None
    if not static:
        fp8.grow(total)
    fp8.length = total
    return fp8, (new, counter if static else total)  # a static counter already holds the length after ``new``


def _rebuild_swapped(stock: type, rope_name: str, state: dict) -> nn.Module:
    """Unpickle a swapped indexer (pickles name this function): a ``stock`` with ``state``, swapped again."""
    return INDEXER.rebuild(stock, state, tilegemm_indexer_class(stock, rope_name))


@functools.cache
def tilegemm_indexer_class(stock: type, rope_name: str) -> type:
    """The subclass of the stock indexer class whose forward scores through the MQA-logits ops.

    Its instances pickle (``torch.save(model)``, ``copy.deepcopy``) as the stock class and the swap, rebuilt by
    :func:`_rebuild_swapped`, which importing this module provides.
    """
    attrs = {
        "forward": _patched_forward(rope_name),
        "__doc__": f"``{stock.__name__}`` scored by tilegemm's MQA-logits ops (same parameters, cache and top-k).",
        "_tilegemm_rope": staticmethod(inspect.unwrap(stock.forward).__globals__[rope_name]),
        "_tilegemm_topk_order_unread": topk_order_unread(stock),
    }
    return INDEXER.subclass(stock, attrs, _rebuild_swapped, rope_name)


_warned: set[type] = set()


def swap_indexers(
    model: nn.Module, fp8: bool = False, backend: str | None = None, hadamard: bool = True, fp8_cache: bool = False
) -> list[str]:
    """Make every indexer of ``model``'s type (:data:`INDEXERS`) score through the MQA-logits ops.

    Args:
        model: a transformers model; a type without an indexer row is left alone (returns ``[]``).
        fp8: DeepSeek's FP8 recipe instead of BF16 (module docstring).
        backend: tilegemm backend for the MQA-logits calls (``None``: the current one).
        hadamard: with ``fp8``, the Hadamard rotation of queries and keys.
        fp8_cache: with ``fp8``, keep the keys quantized in an FP8 key cache beside transformers' (quantized once
            on append; module docstring). Off by default: BF16 keeps stock's top-k.

    Returns:
        the swapped modules' names. Modules already swapped get the new settings. A stock class whose forward no
        longer holds the formula (:func:`stock_formula_matches`) is left stock with one warning.
    """
    if not isinstance(fp8, bool) or not isinstance(hadamard, bool) or not isinstance(fp8_cache, bool):
        raise TypeError(f"fp8, hadamard and fp8_cache must be bools, got {fp8!r}, {hadamard!r} and {fp8_cache!r}")
    if fp8_cache and not fp8:
        raise ValueError("fp8_cache=True needs fp8=True (the FP8 key cache holds DeepSeek's FP8 recipe's keys)")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    spec = INDEXER_BY_MODEL_TYPE.get(model_type)
    stock = spec.load_class() if spec is not None else None
    if stock is None:
        return []
    if not stock_formula_matches(stock, spec.rope):
        if stock not in _warned:
            _warned.add(stock)
            warnings.warn(
                f"tilegemm: {stock.__name__}.forward differs from the scoring tilegemm replaces; left stock",
                stacklevel=2,
            )
        return []
    patched = tilegemm_indexer_class(stock, spec.rope)
    return INDEXER.swap(model, patched, backend=backend, fp8=fp8, hadamard=hadamard, fp8_cache=fp8_cache)


def swapped_indexers(model: nn.Module) -> list[nn.Module]:
    """Every indexer under ``model`` that scores through tilegemm (swapped by :func:`swap_indexers`)."""
    return INDEXER.swapped(model)


def restore_indexers(model: nn.Module) -> int:
    """Turn every swapped indexer under ``model`` back into its stock class; returns how many."""
    return INDEXER.restore(model)


__all__ = [
    "FP8_KEYS_ATTR",
    "INDEXERS",
    "INDEXER_BY_MODEL_TYPE",
    "IndexerSpec",
    "MASK_ATTENTION",
    "fp8_keys_for",
    "hadamard_rotate",
    "index_scores",
    "mask_windows",
    "quantize_rows",
    "restore_indexers",
    "stock_formula_matches",
    "swap_indexers",
    "swapped_indexers",
    "tilegemm_indexer_class",
    "topk_order_unread",
]
