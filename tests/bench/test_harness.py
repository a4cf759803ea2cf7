"""The harness without a GPU: the clear message, lazy optional imports, well-formed shape sets."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tilegemm.bench import device, runner
from tilegemm.bench.__main__ import main


def test_no_gpu_message_and_exit_code(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_gpu", lambda: False)
    assert main(["--quick"]) == 2
    captured = capsys.readouterr()
    assert "needs a CUDA GPU" in captured.err and "--from" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_gpu_without_cutile_refuses_to_time_the_reference(monkeypatch, capsys):
    monkeypatch.setattr(device, "has_gpu", lambda: True)
    monkeypatch.setattr(device, "has_cutile", lambda: False)
    assert main(["--quick"]) == 2
    captured = capsys.readouterr()
    assert "no cutile backend" in captured.err and "PYTHONPATH" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_importing_the_harness_pulls_no_optional_package():
    # torch itself may import tqdm; what matters is that the harness adds neither package
    code = (
        "import sys, torch, tilegemm\n"
        "before = {m for m in ('matplotlib', 'tqdm') if m in sys.modules}\n"
        "import tilegemm.bench.__main__, tilegemm.bench.runner, tilegemm.bench.report, tilegemm.bench.compare\n"
        "import tilegemm.bench.readme\n"
        + "".join(f"import tilegemm.bench.{m}\n" for m in runner.FAMILIES.values())
        + "bad = {m for m in ('matplotlib', 'tqdm') if m in sys.modules} - before\nassert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_list_prints_the_plan(capsys):
    assert main(["--list", "--full", "--family", "masked"]) == 0
    out = capsys.readouterr().out
    assert "masked: 48 rows" in out


def test_where_filters_the_plan(capsys):
    where = runner.parse_where(["m=64,128", "dtype=fp8"])
    assert where == {"m": ("64", "128"), "dtype": ("fp8",)}
    rows = runner.plan(["dense"], "full", where)["dense"]
    assert rows and all(r["m"] in (64, 128) and r["dtype"] == "fp8" for r in rows)
    full = runner.plan(["dense"], "full")["dense"]
    assert len(rows) == sum(r["m"] in (64, 128) and r["dtype"] == "fp8" for r in full)
    assert runner.plan(["dense"], "full", {"no_such_key": ("1",)})["dense"] == []
    assert main(["--family", "dense", "--full", "--where", "m=256", "--list"]) == 0
    assert "m': 256" in capsys.readouterr().out


@pytest.mark.parametrize("clause", ["m", "m=", "=64", " = , "])
def test_where_rejects_malformed_clauses(clause, capsys):
    with pytest.raises(ValueError, match="--where"):
        runner.parse_where([clause])
    assert main(["--family", "dense", "--where", clause, "--list"]) == 2
    assert "--where" in capsys.readouterr().err


@pytest.mark.parametrize("family", list(runner.FAMILIES))
def test_family_specs_are_well_formed(family):
    mod = importlib.import_module(f"tilegemm.bench.{runner.FAMILIES[family]}")
    assert mod.FAMILY == family
    quick, full = mod.specs("quick"), mod.specs("full")
    assert 1 <= len(quick) <= 6
    assert full[: len(quick)] == quick  # the quick rows come first in a full run
    keys = [tuple(sorted(s.items())) for s in full]
    assert len(keys) == len(set(keys)), "duplicate rows"
    for s in full:
        assert all(isinstance(v, (int, str)) for v in s.values())
        assert all(v > 0 for v in s.values() if isinstance(v, int))


def test_full_sets_hold_the_issue_shapes():
    from tilegemm.bench import dense, masked, mqa

    full = {(s["dtype"], s["m"], s["n"], s["k"]) for s in dense.specs("full")}
    nk = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (1536, 2048),
          (2048, 768)]  # fmt: skip
    for dt in ("bf16", "fp8"):
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            for n, k in nk:
                assert (dt, m, n, k) in full
        assert (dt, 8192, 8192, 8192) in full
    grid = {(s["groups"], s["expected_m"]) for s in masked.specs("full")}
    assert grid == {(g, e) for g in (32, 128, 256) for e in (1, 4, 16, 64)}
    plain = {(s["S"], s["S_kv"], s["H"], s["D"]) for s in mqa.specs("full") if s["kind"] == "plain"}
    assert {(2048, 8192, 64, 128), (2048, 8192, 32, 128), (4096, 65536, 64, 128), (2048, 8192, 64, 64)} <= plain


def test_group_sizes_are_aligned_and_seeded():
    from tilegemm.bench import inputs, k_grouped, m_grouped, masked

    sizes = inputs.group_sizes(64, 256, 7, align=128)
    assert sizes == inputs.group_sizes(64, 256, 7, align=128)
    assert all(s % 128 == 0 and 128 <= s <= 384 for s in sizes)
    assert masked.masked_sizes(32, 4, 1) == masked.masked_sizes(32, 4, 1)
    assert all(0 <= s <= masked.MMAX for s in masked.masked_sizes(256, 64, 3))
    case = m_grouped.case({"dtype": "bf16", "groups": 8, "m_per_group": 4096, "n": 4096, "k": 7168})
    assert case.shape["m_sum"] % 128 == 0 and case.flops == 2.0 * case.shape["m_sum"] * 4096 * 7168
    kc = k_grouped.case({"dtype": "fp8", "groups": 4, "m": 4096, "n": 7168, "k_per_group": 8192})
    assert kc.shape["k_sum"] % 128 == 0 and kc.settings == {"c": "d"}


def test_usage_lists_render(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "tilegemm-bench [-h]" in usage and "tilegemm-bench render [-h] --from FILE.json --readme README.md" in usage


@pytest.mark.parametrize("render", [False, True], ids=["plot", "render-replot"])
def test_plot_without_matplotlib_fails_naming_the_extra(tmp_path, doc, capsys, monkeypatch, render):
    """A plot asked for and impossible: exit 2 before anything is read, run or written, with the install line."""
    from tilegemm.bench import schema

    schema.save(doc, tmp_path / "run.json")
    readme = tmp_path / "README.md"
    readme.write_text("unchanged")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    run = str(tmp_path / "run.json")
    argv = ["render", "--from", run, "--readme", str(readme), "--replot"] if render else ["--from", run]
    assert (
        main(argv if render else [*argv, "--plot", str(tmp_path / "plots"), "--markdown", str(tmp_path / "a.md")]) == 2
    )
    captured = capsys.readouterr()
    assert 'pip install "tilegemm[bench]"' in captured.err and "Traceback" not in captured.err + captured.out
    assert ("--replot" if render else "--plot") in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "run.json"] and readme.read_text() == "unchanged"
