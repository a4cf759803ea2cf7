"""Structural test: every row of the family table has a patcher, a tiny preset and tiny-model tests."""

from __future__ import annotations

import pytest
import test_models
from hf_models import FAMILIES as TINY_FAMILIES

import tilegemm.transformers as integration
from tilegemm.transformers import FAMILIES, MODEL_TYPE_TO_PATCHER, SUPPORTED_MODEL_TYPES, monkey_patch, presets


def test_table_has_unique_model_types():
    types = [f.model_type for f in FAMILIES]
    assert len(types) == len(set(types)) and tuple(types) == SUPPORTED_MODEL_TYPES


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.model_type)
def test_family_has_patcher(family):
    patcher = MODEL_TYPE_TO_PATCHER[family.model_type]
    assert patcher.__name__ == family.patcher_name
    assert getattr(monkey_patch, family.patcher_name) is patcher
    assert getattr(integration, family.patcher_name) is patcher and family.patcher_name in integration.__all__


def test_patcher_map_is_the_table():
    assert list(MODEL_TYPE_TO_PATCHER) == list(SUPPORTED_MODEL_TYPES)
    public = {name for name in integration.__all__ if name.startswith("apply_tilegemm_kernel_to_")}
    assert public == {f.patcher_name for f in FAMILIES} | {"apply_tilegemm_kernel_to_model_type"}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.model_type)
def test_family_class_exists(family):
    cls = family.load_class()
    assert cls.__name__ == family.pretrained_class and hasattr(cls, "post_init")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.model_type)
def test_family_has_tiny_preset(family):
    name = presets.TINY_BY_MODEL_TYPE.get(family.model_type)
    assert name is not None, f"no tiny preset for {family.model_type} in tilegemm/transformers/presets.py"
    assert presets.PRESETS[name].config().model_type == family.model_type


def test_tiny_model_tests_cover_every_family():
    """test_models parametrizes over hf_models.FAMILIES: one tiny preset per row of the table."""
    assert len(TINY_FAMILIES) == len(FAMILIES)
    assert {presets.PRESETS[name].model_type for name in TINY_FAMILIES} == set(SUPPORTED_MODEL_TYPES)
    marks = {m.args[0]: m.args[1] for m in test_models.test_patched_matches_stock.pytestmark if m.name == "parametrize"}
    assert tuple(marks["family"]) == TINY_FAMILIES
