"""CPU checks of tests/sanitize/racecheck_probe.py: its command line and its sm_90 SASS export (no GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.tile")

_spec = importlib.util.spec_from_file_location("racecheck_probe", Path(__file__).with_name("racecheck_probe.py"))
probe = sys.modules["racecheck_probe"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def test_list_names_every_variant(capsys):
    assert probe.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == [*probe.PROBES, *probe.REAL]


@pytest.mark.parametrize("argv", [[], ["nope"], ["--sass", "nope"]], ids=["none", "unknown", "sass-unknown"])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        probe.main(argv)
    assert info.value.code == 2


def test_sass_listing_keeps_stores_with_context():
    sass = "\n".join(
        [
            "\t\tFunction : k",
            "        /*0000*/                   MOV R1, R2 ;                 /* 0x0001 */",
            "        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;      /* 0x0002 */",
            "        /*0020*/                   STS.64 [R26], R128 ;         /* 0x0003 */",
            "        /*0030*/                   FADD R3, R3, R4 ;            /* 0x0004 */",
            "        /*0040*/                   FMUL R3, R3, R4 ;            /* 0x0005 */",
            "        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ; /* 0x0006 */",
        ]
    )
    out = probe.sass_listing(sass, context=1)
    assert [line.split()[1] if "/*" in line else line.strip() for line in out] == [
        "Function : k",
        "IADD3",
        "STS.64",
        "FADD",
        "...",
        "BAR.SYNC.DEFER_BLOCKING",
    ]


def test_sass_export_of_the_single_block_probe(capsys):
    """The export path works without a GPU: fp8_single compiles for sm_90 with FP8 wgmma and TMA loads."""
    assert probe.main(["--sass", "fp8_single"]) == 0
    out = capsys.readouterr().out
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in out and "UTMALDG" in out and "WARPGROUP.ARRIVE" in out


def test_sass_export_of_a_real_dense_call(capsys):
    """A ``real_*`` variant exports the gemm.py kernel the library launches for that call (BF16, 512 rows)."""
    assert probe.main(["--sass", "real_bf16_dense"]) == 0
    out = capsys.readouterr().out
    assert "real_bf16_dense: sm_90 SASS of config" in out and "HGMMA" in out
