"""The README's first screen: the two commands first, install, the three snippets (each run on the CPU), support,
and speedups that are the committed results' numbers; its results section is what ``tilegemm-bench render`` makes
of ``h100.json``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tilegemm.bench import readme, report, schema

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text()
FRONT = TEXT[: TEXT.index("## What is in it")]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_the_two_commands_come_first():
    """CI reads the test command from the README: the first code block is `make demo` then `make test`."""
    first = _blocks(TEXT, "bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["make demo", "make test"]
    assert TEXT.index("```bash") < TEXT.index("## ")


def test_install_line_and_cpu_torch_note():
    assert 'pip install "tilegemm[cutile,hf]"' in FRONT
    assert "--index-url https://download.pytorch.org/whl/cpu" in FRONT


#: What picks each Python snippet of the first screen; every one is run on the CPU by a test below.
SNIPPETS = {"offline": "from_config(", "hub": "from_pretrained(", "deepgemm": "tilegemm as deep_gemm"}


def _snippet(kind: str) -> str:
    (code,) = [b for b in _blocks(FRONT, "python") if SNIPPETS[kind] in b]
    assert len([line for line in code.splitlines() if line.strip()]) <= 10, kind
    return code


def test_every_first_screen_snippet_is_run():
    assert sorted(_blocks(FRONT, "python")) == sorted(_snippet(kind) for kind in SNIPPETS)


def test_offline_transformers_snippet_runs_as_written():
    """In a fresh process, as a newcomer runs it, with the Hub offline: the model runs with the tilegemm experts."""
    script = _snippet("offline") + (
        "\nassert model.config._experts_implementation == 'tilegemm'"
        "\nassert logits.shape == (1, 8, 1000) and torch.isfinite(logits).all()\n"
    )
    offline = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=offline)
    assert result.returncode == 0, result.stderr[-3000:]


def test_hub_snippet_asks_for_the_tilegemm_experts(monkeypatch):
    """The Hub snippet as written, its ``from_pretrained`` given a tiny local model of the same arguments (no
    download, no GPU): the keyword reaches transformers, which takes the name after ``import tilegemm.transformers``."""
    import torch
    from transformers import AutoModelForCausalLM

    from tilegemm.transformers.presets import PRESETS

    asked = []

    def from_pretrained(path, **kwargs):
        asked.append((path, kwargs))
        return AutoModelForCausalLM.from_config(
            PRESETS["tiny-qwen3-moe"].config(),
            dtype=kwargs["dtype"],
            experts_implementation=kwargs["experts_implementation"],
        )

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    scope: dict = {}
    exec(compile(_snippet("hub"), "README", "exec"), scope)
    assert asked == [
        ("Qwen/Qwen3-30B-A3B", {"dtype": torch.bfloat16, "device_map": "cuda", "experts_implementation": "tilegemm"})
    ]
    assert scope["model"].config._experts_implementation == "tilegemm"


def test_deepgemm_snippet_runs_as_written():
    """The DeepGEMM snippet as written (on the CPU here): ``d`` is the float64 product of the FP8 operands
    (``a @ b.T`` up to the FP8 casts)."""
    import torch

    scope: dict = {}
    exec(compile(_snippet("deepgemm"), "README", "exec"), scope)
    a, b, d = scope["a"], scope["b"], scope["d"]
    from tilegemm import per_block_cast_to_fp8, per_token_cast_to_fp8
    from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token

    ref = dequant_per_token(*per_token_cast_to_fp8(a)) @ dequant_per_block(*per_block_cast_to_fp8(b)).T
    assert isinstance(d, torch.Tensor) and d.shape == (a.shape[0], b.shape[0]) and calc_diff(d, ref) < 1e-5


def test_support_matrix_names_archs_backends_and_versions():
    for needle in ("Hopper", "Blackwell", "Ampere", "`cutile` backend", "`gluon` backend", "`pytorch` reference"):
        assert needle in FRONT
    for needle in ("torch", "transformers", "cuda.tile", "triton", "CUDA, driver", "580.159.04"):
        assert needle in FRONT


#: Rows of the first screen's speedup table: (text that leads the row, [(family, dtype, peer), ...]).
FRONT_ROWS = [
    ("| MoE experts layer (`moe`, 18 shapes) | bf16 |", [("moe", "bf16", "transformers_grouped_mm")]),
    ("| MoE experts layer (`moe`, 18 shapes) | fp8 |", [("moe", "fp8", "transformers_grouped_mm")]),
    ("| 4-layer Qwen3-30B-A3B", [("models", "bf16", "transformers")]),
    ("| RMSNorm (`norm`", [("norm", "bf16", "transformers")]),
    ("| dense GEMM (`dense`, 97 shapes) | bf16 |", [("dense", "bf16", "cublas"), ("dense", "bf16", "deepgemm")]),
    ("| dense GEMM (`dense`, 97 shapes; cuBLAS ran 81) | fp8 |", [("dense", "fp8", p) for p in ("cublas", "deepgemm")]),
    ("| masked grouped GEMM", [("masked", "fp8", "deepgemm")]),
    ("| contiguous grouped GEMM", [("m_grouped", "fp8", "deepgemm")]),
]  # fmt: skip


def test_first_screen_speedups_are_the_committed_results():
    doc = schema.load(ROOT / "benchmarks/results/h100.json")
    summary = {(s["family"], s["dtype"], s["peer"]): s for s in report.summary(doc["rows"])}
    for lead, keys in FRONT_ROWS:
        (line,) = [line for line in FRONT.splitlines() if line.startswith(lead)]
        quoted = line.rstrip(" |").split("|")[-1].strip()
        expect = " / ".join(f"{summary[k]['geomean']:.2f}x" for k in keys)
        assert quoted == expect, (lead, quoted, expect)


def test_results_section_is_rendered_from_h100_json(tmp_path):
    """``tilegemm-bench render`` of the committed JSON reproduces the README's results section byte for byte."""
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    body = readme.section(
        schema.load(ROOT / "benchmarks/results/h100.json"),
        str(ROOT / "benchmarks/results/h100.json"),
        ROOT,
    )
    assert readme.replace_section(TEXT, body) == TEXT


@pytest.mark.parametrize("name", ["moe-h200", "dense-fp8-h200"])
def test_the_named_sections_are_rendered_from_their_json(name):
    """The named results sections (``render --section NAME``) are their committed JSON's, byte for byte."""
    source = ROOT / f"benchmarks/results/{name}/h200.json"
    body = readme.section(schema.load(source), str(source), ROOT)
    assert readme.markers(name)[0] in TEXT
    assert readme.replace_section(TEXT, body, name) == TEXT


def test_named_sections_have_markers_of_their_own():
    assert readme.markers() == (readme.BEGIN, readme.END)
    begin, end = readme.markers("x")
    assert begin != readme.BEGIN and end != readme.END
    assert readme.replace_section(f"a\n{begin}\nold\n{end}\nb", "new", "x") == f"a\n{begin}\nnew\n{end}\nb"
    with pytest.raises(ValueError, match="results y"):
        readme.replace_section("no markers", "new", "y")


@pytest.mark.parametrize("path", re.findall(r"\]\(((?:benchmarks|docs)/[^)#]+)", FRONT))
def test_first_screen_links_exist(path):
    assert (ROOT / path).exists(), path


def _expand(pattern: str) -> list[str]:
    """``bf16_gemm_{nt,nn}`` -> ``bf16_gemm_nt``, ``bf16_gemm_nn`` (brace groups expanded left to right)."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [n for alt in match[1].split(",") for n in _expand(pattern[: match.start()] + alt + pattern[match.end() :])]


def readme_op_names() -> list[str]:
    """Every op name the README's API table gives: each row's function and its aliases (``fp8_gemm_*``: every
    public name of that form)."""
    import fnmatch

    import tilegemm

    api = TEXT[TEXT.index("## API") :]
    names = []
    for row in (line for line in api[: api.index("\n\n", api.index("| op |"))].splitlines() if line.startswith("| `")):
        head = row.split("|")[1]
        for code in re.findall(r"`([a-z0-9_{},*]+)(?:\(|`)", head):
            for name in _expand(code):
                found = fnmatch.filter(tilegemm.__all__, name) if "*" in name else [name]
                assert found, name
                names += found
    return names


def test_every_op_name_of_the_api_table_is_accepted_by_name():
    """``get_available_backends_for_op`` takes each name the table documents (``fp8_gemm_nt`` included)."""
    import tilegemm

    names = readme_op_names()
    assert {"fp8_gemm_nt", "fp8_gemm_nn", "fp8_fp4_gemm_tt", "m_grouped_fp8_fp4_gemm_nt_masked"} <= set(names)
    for name in names:
        assert "pytorch" in tilegemm.get_available_backends_for_op(name), name
