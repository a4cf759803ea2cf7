"""The harness scripts' shared argparse types and progress line (modeling/transformers/cli.py)."""

from __future__ import annotations

import argparse

import pytest

from modeling.transformers import cli


def test_positive_ints():
    assert cli.positive_ints("1,32") == [1, 32]
    assert cli.positive_ints("4096,") == [4096]
    for bad in ("", "0", "1,-2", "1.5", "a"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
            cli.positive_ints(bad)


def test_positive_int():
    assert cli.positive_int("7") == 7
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integer"):
            cli.positive_int(bad)


def test_progress_log_only_on_rank_zero(monkeypatch, capsys):
    log = cli.progress_log("tool")
    monkeypatch.setenv("RANK", "1")
    log("hidden")
    monkeypatch.setenv("RANK", "0")
    log("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err and err.startswith("[tool ") and err.rstrip().endswith("] shown")
