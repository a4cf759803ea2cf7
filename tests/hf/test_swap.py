"""The class-swap helper behind the RMSNorm, indexer and Linear swaps, on a toy module (CPU, no model)."""

from __future__ import annotations

import copy
import functools
import pickle

import pytest
import torch
from torch import nn

from tilegemm.transformers.swap import ClassSwap

SWAP = ClassSwap(backend=None, scale=1.0)


class Stock(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.arange(4.0))

    def forward(self, x):
        return x * self.weight


def _forward(self, x):
    return x * self.weight * self._tilegemm_scale


def _rebuild(stock: type, tag: str, state: dict) -> nn.Module:
    return SWAP.rebuild(stock, state, swapped_class(stock, tag))


@functools.cache
def swapped_class(stock: type, tag: str) -> type:
    return SWAP.subclass(stock, {"forward": _forward}, _rebuild, tag)


def test_swap_settings_restore():
    model = nn.Sequential(Stock(), Stock(), nn.Linear(4, 4))
    weight = model[0].weight
    patched = swapped_class(Stock, "a")
    assert patched.__name__ == "TileGemmStock" and patched._tilegemm_scale == 1.0
    assert SWAP.swap(model, patched, lambda m: m is model[0], scale=2.0) == ["0"]
    assert type(model[0]) is patched and type(model[1]) is Stock and model[0].weight is weight
    assert torch.equal(model[0](torch.ones(4)), 2 * weight.detach())
    assert SWAP.swap(model, patched, lambda m: False, backend="pytorch") == ["0"], "swapped before: new settings"
    assert model[0]._tilegemm_backend == "pytorch" and model[0]._tilegemm_scale == 2.0
    assert SWAP.swapped(model) == [model[0]] and ClassSwap().swapped(model) == []
    with pytest.raises(TypeError, match="fp8"):
        SWAP.swap(model, patched, fp8=True)
    assert SWAP.restore(model) == 1
    assert type(model[0]) is Stock and "_tilegemm_scale" not in model[0].__dict__ and SWAP.swapped(model) == []


def test_run_time_subclass_pickles_as_stock_plus_swap():
    model = nn.Sequential(Stock())
    SWAP.swap(model, swapped_class(Stock, "b"), scale=3.0)
    rebuild, (stock, tag, state) = model[0].__reduce_ex__(2)
    assert (rebuild, stock, tag) == (_rebuild, Stock, "b")
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(clone[0]) is swapped_class(Stock, "b") and clone[0]._tilegemm_scale == 3.0
        assert torch.equal(clone(torch.ones(4)), model(torch.ones(4)))


def test_written_subclass_pickles_by_name():
    from tilegemm.transformers.linear import LINEAR, TileGemmLinear

    assert TileGemmLinear.__dict__["_tilegemm_swap"] is LINEAR and TileGemmLinear._tilegemm_stock is nn.Linear
    model = nn.Sequential(nn.Linear(4, 8))
    LINEAR.swap(model, TileGemmLinear, fp8=True)
    assert b"TileGemmLinear" in pickle.dumps(model)
    assert type(pickle.loads(pickle.dumps(model))[0]) is TileGemmLinear
