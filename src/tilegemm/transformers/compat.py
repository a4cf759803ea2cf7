"""Which transformers versions tilegemm's MoE integration supports, and a clear error for the rest.

The integration needs transformers' experts registry (``transformers.integrations.moe.ExpertsInterface``)
and MoE models whose experts are fused 3-D parameters dispatched through ``@use_experts_implementation``
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``), from transformers 5.7; the supported range starts
later, at :data:`TRANSFORMERS_ENDS`' first entry (see there). :func:`rewind_static_cache` hides how a version's
``StaticCache`` keeps its write position, :func:`cache_kwargs` what a version's forward calls the cache;
:func:`squashed_source` and :func:`lines_in_order` check a stock forward for the lines a patch relies on.
:func:`after_import` runs code when a transformers module is first imported, so that importing tilegemm's
integration does not import transformers' (about a second: its MoE module imports its DeepGEMM and hub-kernels
integrations).
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

#: The two ends of the supported transformers range: the oldest release supported and the newest one tested. The one
#: place these versions are written: ``make test-transformers-ends`` reads this line and runs tests/hf at
#: each end, :data:`MIN_TRANSFORMERS` is the first, and tests/test_packaging.py holds pyproject's ``hf`` extra floor
#: and the README to it. The floor is 5.17, the first release whose DeepSeek-V3.2 and GLM-MoE-DSA indexers score as
#: the indexer swap does (a bool or additive ``attention_mask``): 5.11-5.16 build the causal mask from
#: ``position_ids`` when ``attention_mask`` is None (the swap leaves those stock, with a warning); 5.7-5.10 have no
#: DeepSeek-V3.2, and their GLM-MoE-DSA makes the first three layers dense whatever ``first_k_dense_replace`` says.
#: The fused-experts path alone runs on 5.7: there test_experts.py passes for every family but the two DSA ones.
TRANSFORMERS_ENDS = ("5.17.0", "5.24.0")


class UnsupportedTransformersError(ImportError):
    """transformers is missing or too old for the tilegemm MoE integration."""


def _parse(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return (0, 0)
    return int(match.group(1)), int(match.group(2))


#: The oldest transformers ``(major, minor)`` tilegemm.transformers accepts (the supported floor).
MIN_TRANSFORMERS = _parse(TRANSFORMERS_ENDS[0])


@functools.cache
def transformers_version() -> tuple[int, int]:
    """The installed transformers ``(major, minor)``; raises :class:`UnsupportedTransformersError` if too old."""
    try:
        import transformers
    except ImportError as exc:
        raise UnsupportedTransformersError(
            "tilegemm.transformers needs transformers >= {}.{} (pip install 'tilegemm[hf]'); "
            "it is not installed ({})".format(*MIN_TRANSFORMERS, exc)
        ) from None
    version = _parse(transformers.__version__)
    if version < MIN_TRANSFORMERS:
        raise UnsupportedTransformersError(
            f"tilegemm.transformers needs transformers >= {MIN_TRANSFORMERS[0]}.{MIN_TRANSFORMERS[1]} "
            f"(the oldest release it is tested with); found {transformers.__version__}"
        )
    try:
        from transformers.integrations.moe import ExpertsInterface  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a broken install
        raise UnsupportedTransformersError(
            f"transformers {transformers.__version__} has no transformers.integrations.moe.ExpertsInterface ({exc})"
        ) from None
    return version


class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder at the front of ``sys.meta_path`` that finds nothing itself: for module ``name`` it takes the spec
    the other finders give and runs ``callback(module)`` right after the module's code has run, then removes
    itself."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback(module)

        loader.exec_module = exec_then_call  # this spec's own loader (a fresh one per spec for source files)
        return spec


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` once module ``name`` is imported: now when it already is, else right after its code
    has run on its first import (before the importer gets it). ``callback`` must not raise."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name and f.callback == callback for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def rewind_static_cache(cache, length: int) -> None:
    """Set the write position of every layer of a transformers ``StaticCache`` back to ``length``.

    transformers' ``StaticLayer`` (5.2x) writes at its own ``cumulative_length`` counter (a device tensor) and
    advances it on every update, whatever ``cache_position`` says, so a decode step repeated at one position
    (warm-up before a CUDA-graph capture, a timed step) must rewind it first. With a tensor counter the rewind
    is a device op, so it is captured with the step. Layers that write at ``cache_position`` have no counter:
    no-op.
    """
    for layer in getattr(cache, "layers", ()):
        for name in ("cumulative_length", "indexer_cumulative_length"):  # the DSA layers' indexer keys have their own
            counter = getattr(layer, name, None)
            if isinstance(counter, torch.Tensor):
                counter.fill_(length)
            elif isinstance(counter, int):
                setattr(layer, name, length)
        if isinstance(getattr(layer, "cumulative_length_int", None), int):
            layer.cumulative_length_int = length


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``cache`` to ``model``'s forward: ``{"cache": cache}`` where the forward
    takes ``cache`` (transformers 5.24 renamed it; ``past_key_values`` warns there and goes in 5.40), else
    ``{"past_key_values": cache}``."""
    params = inspect.signature(model.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


def squash(text: str) -> str:
    """``text`` without whitespace: source lines compared whatever their formatting."""
    return "".join(text.split())


def squashed_source(function: Callable[..., Any]) -> str | None:
    """The :func:`squash`-ed source of ``function`` (its decorators unwrapped), or ``None`` where it has none."""
    try:
        return squash(inspect.getsource(inspect.unwrap(function)))
    except (OSError, TypeError):
        return None


def lines_in_order(source: str, steps: Sequence[str | tuple[str, ...]]) -> bool:
    """Whether the squashed ``source`` holds every step in order: a step is a line, or the alternatives one of which
    must be found (each after the one found for the step before)."""
    at = 0
    for step in steps:
        found = [source.find(squash(line), at) for line in ((step,) if isinstance(step, str) else step)]
        found = [f for f in found if f >= 0]
        if not found:
            return False
        at = min(found)
    return True
