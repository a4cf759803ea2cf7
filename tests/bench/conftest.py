"""Fixtures of the harness tests: a synthetic saved run."""

from __future__ import annotations

from typing import Any

import pytest
from synthetic_run import make_doc


@pytest.fixture
def doc() -> dict[str, Any]:
    """A fresh synthetic results document."""
    return make_doc()
