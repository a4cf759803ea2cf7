"""Packaging facts a user relies on: the licence the metadata declares ships, the package is typed, the version
has one source, and the long description reads right where the package index shows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tilegemm

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml with the standard library")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_matches_the_metadata():
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_package_is_typed():
    assert (Path(tilegemm.__file__).parent / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["tilegemm"]


def test_version_has_one_source():
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tilegemm.__version__"}
    assert tilegemm.__version__.count(".") == 2


def test_bench_extra_holds_the_plotting_dependencies():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras["bench"]) == {"matplotlib", "tqdm"}
    assert "tilegemm[bench]" in extras["dev"]


def _long_description() -> str:
    readme = PYPROJECT["project"]["readme"]
    return (ROOT / (readme if isinstance(readme, str) else readme["file"])).read_text()


def test_long_description_has_no_relative_links():
    """The index shows it outside the repository, and the wheel ships neither docs/ nor benchmarks/: every link and
    image is absolute (README.md's links into the repository are why it is not the long description)."""
    text = _long_description()
    targets = re.findall(r"\]\(\s*<?([^)>\s]+)", text)  # [text](target), ![alt](target)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?$", text, flags=re.M)  # [label]: target
    targets += re.findall(r"\b(?:href|src)\s*=\s*[\"']([^\"']+)", text)  # HTML
    assert targets, "expected at least the DeepGEMM link"
    assert [t for t in targets if not re.match(r"https?://", t)] == []


def test_long_description_code_is_the_readmes_first_screen():
    """Its snippets are the README's first-screen ones, which tests/test_readme.py runs."""
    readme = (ROOT / "README.md").read_text()
    front = readme[: readme.index("## What is in it")]
    blocks = re.findall(r"```python\n.*?```", _long_description(), flags=re.S)
    assert len(blocks) == 3 and all(block in front for block in blocks)
    assert 'pip install "tilegemm[cutile,hf]"' in _long_description()


def test_transformers_range_has_one_source():
    """The supported transformers range is written once (``compat.TRANSFORMERS_ENDS``, read by ``make
    test-transformers-ends``); pyproject's ``hf`` floor and the README's support table say the same."""
    compat = pytest.importorskip("tilegemm.transformers.compat")
    oldest, newest = compat.TRANSFORMERS_ENDS
    floor = ".".join(oldest.split(".")[:2])
    assert compat.MIN_TRANSFORMERS == tuple(int(x) for x in floor.split("."))
    assert PYPROJECT["project"]["optional-dependencies"]["hf"] == [f"transformers>={floor}"]
    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| transformers |")]
    assert oldest in row and newest in row and f">= {floor} (`hf` extra)" in row
    # the Makefile reads the ends with sed from the line as written: one line, two double-quoted versions
    makefile = (ROOT / "Makefile").read_text()
    assert "src/tilegemm/transformers/compat.py" in makefile
    source = Path(compat.__file__).read_text()
    assert re.findall(r'^TRANSFORMERS_ENDS = \("([^"]*)", "([^"]*)"\)', source, re.MULTILINE) == [(oldest, newest)]
