"""The discrete choices a forward makes per token, per layer, and how logit differences follow their flips.

:class:`RouteRecorder` hooks every *router* of a transformers MoE model (the ``gate`` beside each experts module:
the top-k expert ids of a token) and every sparse-attention *indexer* (DeepSeek-V3.2 / GLM-MoE-DSA: the top-k key
positions a query attends to), in module order, and keeps each call's choices as sorted sets per token.
:func:`flip_report` compares the routes and logits of a test run (sharded, patched, another dtype) with a reference
run of the same sequence:

* a token *flips* at layer ``l`` when its set there (experts, or keys) differs from the reference's;
* a flip at position ``t`` of a sequence reaches every later position through attention, so a logit position is
  *downstream of a flip* when any position ``<= t`` of its sequence flipped at any layer; its *first-flip layer* is
  the shallowest such layer;
* the logits are compared (``calc_diff``, max |dlogit|, top-1 agreement) separately over the positions downstream of
  no flip and of a flip, and per first-flip layer.

If the logit difference between two runs is rounding amplified by routing, the positions downstream of no flip
differ by the rounding alone (``calc_diff`` near the batch-1 value) and the large differences sit downstream of
flips.
"""

from __future__ import annotations

from typing import Any

import torch

from modeling.transformers.measure import compare_logits
from tilegemm.transformers.indexer import INDEXER_BY_MODEL_TYPE
from tilegemm.transformers.monkey_patch import experts_modules


def _indices(output: Any) -> torch.Tensor | None:
    """The top-k expert ids in a router's output (its last integer tensor)."""
    items = output if isinstance(output, (tuple, list)) else (output,)
    ints = [t for t in items if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() == 2]
    return ints[-1] if ints else None


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router of every MoE layer, in layer order: the ``gate`` module beside each experts module."""
    parents = {id(child): module for module in model.modules() for child in module.children()}
    found = []
    for experts in experts_modules(model):
        gate = getattr(parents.get(id(experts)), "gate", None)
        if isinstance(gate, torch.nn.Module):
            found.append(gate)
    return found


def indexers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every sparse-attention indexer of ``model`` (stock or swapped by tilegemm), in module order; ``[]`` for a
    model type without one (:data:`tilegemm.transformers.indexer.INDEXERS`)."""
    spec = INDEXER_BY_MODEL_TYPE.get(getattr(getattr(model, "config", None), "model_type", None))
    stock = spec.load_class() if spec is not None else None
    return [m for m in model.modules() if isinstance(m, stock)] if stock is not None else []


def selected_keys(topk: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """An indexer's choice as sets: ``[B*S, k]`` key positions sorted per query, ``-1`` for each slot the top-k
    filled with a masked key (a query with fewer than ``k`` visible keys: which masked ones fill up is arbitrary).

    Args:
        topk: ``[B, S, k]`` integer key positions (the indexer's output).
        attention_mask: ``[B or 1, S, T]``, bool (True: visible) or additive (0: visible).
    """
    mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    visible = mask.expand(topk.shape[0], -1, -1).gather(-1, topk.long())
    return torch.where(visible, topk.long(), -1).sort(dim=-1).values.flatten(0, 1)


class RouteRecorder:
    """Forward hooks on every router and indexer of ``model`` (``modules``: :func:`routers` and :func:`indexers`, in
    module order): ``routes[l]`` lists the sorted ``[T, k]`` choices (expert ids, or key positions) of layer ``l``'s
    calls since :meth:`reset` (on the CPU)."""

    def __init__(self, model: torch.nn.Module):
        routed = {id(m) for m in routers(model)}
        indexed = {id(m) for m in indexers(model)}
        if not routed:
            raise ValueError(f"{type(model).__name__}: no router beside its experts modules")
        self.modules = [m for m in model.modules() if id(m) in routed or id(m) in indexed]
        self.routes: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self.handles = [
            m.register_forward_hook(self._indexer_hook(i), with_kwargs=True)
            if id(m) in indexed
            else m.register_forward_hook(self._hook(i))
            for i, m in enumerate(self.modules)
        ]

    def _hook(self, layer: int):
        def hook(module, args, output):
            ids = _indices(output)
            if ids is not None:
                self.routes[layer].append(ids.sort(dim=-1).values.cpu())

        return hook

    def _indexer_hook(self, layer: int):
        def hook(module, args, kwargs, output):
            mask = args[3] if len(args) > 3 else kwargs["attention_mask"]
            self.routes[layer].append(selected_keys(output, mask).cpu())

        return hook

    def reset(self) -> None:
        """Forget the recorded calls."""
        self.routes = [[] for _ in self.modules]

    def take(self) -> list[torch.Tensor]:
        """The routes of one forward since :meth:`reset` (``[T, k]`` per layer), then reset."""
        out = [torch.cat(calls) if calls else torch.empty(0, 0, dtype=torch.long) for calls in self.routes]
        self.reset()
        return out

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()


def flips(ref: list[torch.Tensor], test: list[torch.Tensor], batch: int) -> torch.Tensor:
    """``[layers, batch, L]`` bool: the token's set (experts, or keys) differs from the reference's at that layer."""
    if len(ref) != len(test):
        raise ValueError(f"routes of {len(ref)} and {len(test)} layers")
    out = []
    for r, t in zip(ref, test, strict=True):
        if r.shape != t.shape:
            raise ValueError(f"routes of shapes {tuple(r.shape)} and {tuple(t.shape)}")
        out.append((r != t).any(dim=-1).view(batch, -1))
    return torch.stack(out)


def downstream_of_flip(flipped: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` bool from :func:`flips`' ``[layers, B, L]``: some position at or before this one in its sequence
    flipped at some layer (a flip reaches every later position through attention)."""
    return flipped.any(dim=0).cummax(dim=1).values


def _group(test: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    n = int(mask.sum())
    if n == 0:
        return {"positions": 0}
    return {"positions": n, **compare_logits(test[mask], ref[mask])}


def flip_report(
    ref_routes: list[torch.Tensor],
    test_routes: list[torch.Tensor],
    ref_logits: torch.Tensor,
    test_logits: torch.Tensor,
) -> dict[str, Any]:
    """Routing flips of a test run against a reference run of the same ``[B, L]`` sequence, and its logits grouped by
    them (see the module docstring).

    Args:
        ref_routes, test_routes: per routing layer (:class:`RouteRecorder`), the sorted ``[B*L, k]`` choices of one
            forward over the sequence.
        ref_logits, test_logits: ``[B, K, V]`` logits of the last ``K`` positions of that forward.

    Returns:
        ``flipped_tokens`` (tokens with a flip at some layer), ``flips_per_layer``, ``first_flip_layer_tokens``
        (tokens whose shallowest flip is at each layer), and for the logit positions ``no_flip_upstream``,
        ``flip_upstream`` and ``by_first_flip_layer`` (each: positions, calc_diff, max_logit_diff, top1_agreement).
    """
    batch, kept = ref_logits.shape[:2]
    flipped = flips(ref_routes, test_routes, batch)  # [layers, B, L]
    layers, _, length = flipped.shape
    any_layer = flipped.any(dim=0)  # [B, L]
    layer_ids = torch.arange(layers).view(layers, 1, 1).expand_as(flipped)
    first = torch.where(flipped, layer_ids, layers).min(dim=0).values  # [B, L], `layers` = none
    first_upstream = first.cummin(dim=1).values[:, length - kept :]  # the shallowest flip at or before the position
    downstream = downstream_of_flip(flipped)[:, length - kept :]
    test, ref = test_logits.double().cpu(), ref_logits.double().cpu()
    by_layer = {}
    for layer in range(layers):
        mask = first_upstream == layer
        if mask.any():
            by_layer[layer] = _group(test, ref, mask)
    return {
        "routing_layers": layers,  # routers and indexers (RouteRecorder)
        "tokens": batch * length,
        "flipped_tokens": int(any_layer.sum()),
        "flipped_sequences": int(any_layer.any(dim=1).sum()),
        "flips_per_layer": [int(f.sum()) for f in flipped],
        "first_flip_layer_tokens": [int((first == layer).sum()) for layer in range(layers)],
        "no_flip_upstream": _group(test, ref, ~downstream),
        "flip_upstream": _group(test, ref, downstream),
        "by_first_flip_layer": by_layer,
    }
