"""The path from a public call to its kernel launch stays short (docs/design.md, "The path of a dense FP8 call"):
at most 5 tilegemm frames on the stack at each launch of the dense and fused-experts calls (training included), in
at most 6 files with the public stub's, recorded on the CPU with every launch intercepted (tests/launch_record.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.tile")

import launch_record  # noqa: E402

MOST_FRAMES = 5
MOST_FILES = 6


@pytest.fixture(scope="module")
def paths() -> dict:
    return launch_record.hops()


def test_dense_and_experts_calls_reach_every_launch_in_five_hops(paths):
    assert paths
    for call, found in paths.items():
        deepest = found["deepest stack at a launch"]
        assert deepest, f"{call}: no launch recorded"
        assert len(deepest) <= MOST_FRAMES, f"{call}: {' -> '.join(deepest)}"
        assert deepest[0] == "backend/registry.py:wrapper", deepest  # the stub's wrapper is the first frame
        assert len(found["stack files"]) + 1 <= MOST_FILES, f"{call}: {found['stack files']} and the stub's file"
