"""``modeling/demo.py``: --help prints help instead of running; an unrunnable --backend is an error."""

from __future__ import annotations

import pytest
import torch

from modeling import demo


def test_help_does_not_run_the_demo(capsys, monkeypatch):
    monkeypatch.setattr(demo, "_run_all", lambda: pytest.fail("the demo ran"))
    with pytest.raises(SystemExit) as exc:
        demo.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "--backend" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cutile_backend_that_cannot_run_is_an_error(capsys, monkeypatch):
    monkeypatch.setattr(demo, "_run_all", lambda: pytest.fail("the demo ran"))
    with pytest.raises(SystemExit) as exc:
        demo.main(["--backend", "cutile"])
    assert exc.value.code == 2
    assert "cutile backend cannot run" in capsys.readouterr().err


def test_backend_option_scopes_the_run(monkeypatch):
    seen = []
    monkeypatch.setattr(demo, "_run_all", lambda: seen.append(demo.tg.get_current_backend()) or 0)
    assert demo.main(["--backend", "pytorch"]) == 0
    assert seen == ["pytorch"]
