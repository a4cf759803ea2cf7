"""Swap a module's class to a tilegemm subclass and back: the one mechanism of the RMSNorm, indexer and Linear swaps.

A swap changes only ``module.__class__`` (the stock class -> a subclass with another ``forward``): parameters,
buffers, hooks, ``state_dict`` keys, tied weights, devices and dtypes stay. A swap's settings (the backend, ``fp8``,
...) are instance attributes ``_tilegemm_<name>`` over class-level defaults: :meth:`ClassSwap.swap` sets them on
every swapped module (also on those swapped before), :meth:`ClassSwap.restore` drops them with the class.

Each swapped class names its :class:`ClassSwap` (``_tilegemm_swap``) and its stock class (``_tilegemm_stock``) in its
own ``__dict__``, so a subclass of it is not taken for a swapped module. A class made at run time (one per stock
class: the families' RMSNorm classes, the indexer classes; :meth:`ClassSwap.subclass`) has no importable name, so
its instances pickle (``torch.save(model)``, ``copy.deepcopy``) as the stock class plus the swap: ``(rebuild, (stock,
*args, state))`` with the swap module's own ``rebuild`` function (``norm._rebuild_swapped``,
``indexer._rebuild_swapped``: pickles name them), which makes a stock instance with that state and swaps it again
(:meth:`ClassSwap.rebuild`). A class written in a module (``linear.TileGemmLinear``, :meth:`ClassSwap.written`)
pickles by its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


class ClassSwap:
    """One kind of class swap, with its settings' names and defaults (``ClassSwap(backend=None, fp8=False)``)."""

    def __init__(self, **settings: Any):
        self.settings = settings

    def _marks(self, stock: type) -> dict[str, Any]:
        defaults = {f"_tilegemm_{key}": value for key, value in self.settings.items()}
        return {"_tilegemm_swap": self, "_tilegemm_stock": stock, **defaults}

    def subclass(self, stock: type, attrs: dict[str, Any], rebuild: Callable[..., nn.Module], *args: Any) -> type:
        """``TileGemm<stock>``: a subclass of ``stock`` with ``attrs`` (``forward``, ``__doc__``, ...) whose instances
        pickle as ``(rebuild, (stock, *args, state))``. Make it once per ``(stock, *args)`` (a cached function) and
        have ``rebuild`` return :meth:`rebuild` with that class."""

        def reduce_ex(module: nn.Module, protocol: int):
            return rebuild, (stock, *args, module.__getstate__())

        marks = {**self._marks(stock), "__reduce_ex__": reduce_ex}
        return type(f"TileGemm{stock.__name__}", (stock,), {**attrs, **marks})

    def written(self, stock: type) -> Callable[[type], type]:
        """Class decorator: mark a subclass of ``stock`` written in a module as this swap's (it pickles by name)."""

        def mark(cls: type) -> type:
            for key, value in self._marks(stock).items():
                setattr(cls, key, value)
            return cls

        return mark

    @staticmethod
    def rebuild(stock: type, state: dict, patched: type) -> nn.Module:
        """Unpickle a swapped module: an instance of ``stock`` with ``state`` (its settings included), then made a
        ``patched`` again."""
        module = stock.__new__(stock)
        module.__setstate__(state)
        module.__class__ = patched
        return module

    def swap(
        self, model: nn.Module, patched: type, where: Callable[[nn.Module], bool] | None = None, **settings: Any
    ) -> list[str]:
        """Make every module under ``model`` whose class is exactly ``patched``'s stock class (and ``where(module)``,
        when given) a ``patched``, and give every ``patched`` module ``settings``; returns their names."""
        unknown = set(settings) - set(self.settings)
        if unknown:
            raise TypeError(f"settings: got {sorted(unknown)}, expected some of {sorted(self.settings)}")
        stock = patched.__dict__["_tilegemm_stock"]
        names = []
        for name, module in model.named_modules():
            if type(module) is stock and (where is None or where(module)):
                module.__class__ = patched
            if type(module) is patched:
                for key, value in settings.items():
                    setattr(module, f"_tilegemm_{key}", value)
                names.append(name)
        return names

    def swapped(self, model: nn.Module) -> list[nn.Module]:
        """Every module under ``model`` swapped by this swap."""
        return [m for m in model.modules() if type(m).__dict__.get("_tilegemm_swap") is self]

    def restore(self, model: nn.Module) -> int:
        """Turn every module under ``model`` swapped by this swap back into its stock class, dropping its settings;
        returns how many."""
        swapped = self.swapped(model)
        for module in swapped:
            module.__class__ = type(module).__dict__["_tilegemm_stock"]
            for key in self.settings:
                module.__dict__.pop(f"_tilegemm_{key}", None)
        return len(swapped)
