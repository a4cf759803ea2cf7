"""CPU checks of tests/sanitize/cases.py's selection: the shards of the memcheck test run every case exactly once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("sanitize_cases", Path(__file__).with_name("cases.py"))
cases = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cases)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("only", ["", "gluon", "m-grouped", "no case has this in its name"])
def test_shards_partition_the_selected_cases(count: int, only: str):
    names = [name for name, _ in cases.selected(only)]
    shards = [[name for name, _ in cases.selected(only, (i, count))] for i in range(count)]
    assert sorted(sum(shards, [])) == sorted(names)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert all(only in name for name in names)


def test_every_family_has_cases_and_names_are_unique():
    names = [name for name, _ in cases.selected()]
    assert len(names) == len(set(names))
    for family in ("m-grouped", "k-grouped", "dense", "gluon ws", "moe_experts", "mqa logits", "rms norm"):
        assert any(family in name for name in names), family


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_outside_its_count_is_an_error(shard: tuple[int, int]):
    with pytest.raises(ValueError, match="shard"):
        cases.selected("", shard)


def test_shard_text_parses():
    assert cases._parse_shard("1/2") == (1, 2)
