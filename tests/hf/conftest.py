"""Fixtures of tests/hf (helpers live in hf_models.py)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("transformers") is None:  # the [hf] extra is not installed: nothing to test here
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def restore_patches():
    """Undo before-creation patches after the test."""
    from tilegemm.transformers import revert_tilegemm_kernel_patches

    yield
    revert_tilegemm_kernel_patches()
