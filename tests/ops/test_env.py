"""Environment variables: one boolean parser, and the value-check gate's defaults per device."""

from __future__ import annotations

import pytest
import torch

import tilegemm
from tilegemm import env
from tilegemm.ops import checks

TRUE = ["1", "true", "True", "TRUE", "yes", "Yes", "on", "ON", " on "]
FALSE = ["0", "false", "False", "no", "NO", "off", "Off", " 0 "]


@pytest.mark.parametrize("text", TRUE)
def test_true_values(text):
    assert env.parse_bool("TILEGEMM_X", text) is True
    assert env.parse_bool("TILEGEMM_X", text, default=True) is True


@pytest.mark.parametrize("text", FALSE)
def test_false_values(text):
    assert env.parse_bool("TILEGEMM_X", text) is False
    assert env.parse_bool("TILEGEMM_X", text, default=True) is False


@pytest.mark.parametrize("text", [None, "", "   "])
def test_unset_or_blank_is_the_default(text):
    assert env.parse_bool("TILEGEMM_X", text) is False
    assert env.parse_bool("TILEGEMM_X", text, default=True) is True


@pytest.mark.parametrize("text", ["2", "-1", "enable", "y", "t", "nope", "truee"])
def test_anything_else_names_the_variable(text):
    with pytest.raises(ValueError, match=rf"TILEGEMM_X: got '{text}', expected one of 1/0, true/false, yes/no, on/off"):
        env.parse_bool("TILEGEMM_X", text)


@pytest.mark.parametrize("name", [env.DISABLE_FALLBACK, env.CHECK_VALUES, env.DEBUG, env.PRINT_CONFIGS])
def test_env_flag_reads_the_variable(monkeypatch, name):
    monkeypatch.setenv(name, "Yes")
    assert env.env_flag(name) is True
    monkeypatch.setenv(name, "off")
    assert env.env_flag(name, default=True) is False
    monkeypatch.setenv(name, "sometimes")
    with pytest.raises(ValueError, match=name):
        env.env_flag(name)
    monkeypatch.delenv(name)
    assert env.env_flag(name) is False


def test_env_choice(monkeypatch):
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    assert env.env_choice("TILEGEMM_BACKEND", ("cutile", "pytorch")) is None
    monkeypatch.setenv("TILEGEMM_BACKEND", "pytorch")
    assert env.env_choice("TILEGEMM_BACKEND", ("cutile", "pytorch")) == "pytorch"
    monkeypatch.setenv("TILEGEMM_BACKEND", "unknown")
    with pytest.raises(ValueError, match=r"TILEGEMM_BACKEND: got 'unknown', expected one of \['cutile', 'pytorch'\]"):
        env.env_choice("TILEGEMM_BACKEND", ("cutile", "pytorch"))


CUDA = torch.device("cuda")  # a device object only: the gate does not touch the GPU unless checks are on


@pytest.mark.parametrize("text", [None, "0", "false", "1", "on"])
def test_value_checks_always_run_on_cpu(monkeypatch, text):
    if text is None:
        monkeypatch.delenv(env.CHECK_VALUES, raising=False)
    else:
        monkeypatch.setenv(env.CHECK_VALUES, text)
    assert checks.value_checks_enabled(torch.device("cpu"))
    assert checks.value_checks_enabled()
    with checks.skip_value_checks():
        assert not checks.value_checks_enabled(torch.device("cpu"))


def test_value_checks_of_cuda_tensors_off_by_default(monkeypatch):
    monkeypatch.delenv(env.CHECK_VALUES, raising=False)
    assert not checks.value_checks_enabled(CUDA)
    monkeypatch.setenv(env.CHECK_VALUES, "off")
    assert not checks.value_checks_enabled(CUDA)


def test_value_checks_of_cuda_tensors_on_request(monkeypatch):
    monkeypatch.setenv(env.CHECK_VALUES, "TRUE")
    assert checks.value_checks_enabled(CUDA)
    with checks.skip_value_checks():
        assert not checks.value_checks_enabled(CUDA)
    assert not checks.value_checks_enabled(torch.device("meta"))  # no values to read
    monkeypatch.setenv(env.CHECK_VALUES, "perhaps")
    with pytest.raises(ValueError, match="TILEGEMM_CHECK_VALUES"):
        checks.value_checks_enabled(CUDA)


def test_cpu_value_check_runs_with_check_values_off(monkeypatch):
    """A bad group id on CPU tensors is an error whatever TILEGEMM_CHECK_VALUES says."""
    monkeypatch.setenv(env.CHECK_VALUES, "0")
    a = torch.randn(128, 64).bfloat16()
    b = torch.randn(2, 32, 64).bfloat16()
    d = torch.full((128, 32), float("nan"))
    grouped_layout = torch.full((128,), 5, dtype=torch.int32)  # group 5 of 2
    with pytest.raises(ValueError, match="grouped_layout"):
        tilegemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, backend="pytorch")
    assert d.isnan().all()
