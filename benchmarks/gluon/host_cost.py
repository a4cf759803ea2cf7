"""Host time of one dense FP8 call, back to back, per backend, beside DeepGEMM: what an eager call costs the CPU.

For each shape: ``(host_us, wall_us)`` per call of 400 back-to-back calls of ``tilegemm.fp8_gemm_nt`` with
``backend="gluon"``, ``"cutile"`` and the automatic choice, and of DeepGEMM's ``fp8_gemm_nt`` (``--dg``), on the
same operands (``eager_rule.inputs``: tilegemm's casts, A's scales MN-major and TMA-aligned); a backend that cannot
run here gets its error in the row (no fallback). ``host_us``: the loop's CPU time per call before the final
synchronize (the host cost when the kernel is shorter); ``wall_us``: until the GPU is done
(``eager_rule.back_to_back_us``, 30 calls of warm-up). Then a cProfile of 2000 gluon calls at 4096x1536x2048 (per-call
microseconds under the profiler, which inflates small functions). Run on the GPU machine from the repository root:

    source .devbundle/setup.sh && DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh >/dev/null
    PYTHONPATH=src python3 benchmarks/gluon/host_cost.py LABEL $OUT/host_cost.json [--dg]

To compare two trees, run it once per tree (``PYTHONPATH=<other>/src``) in the same device call; under another
triton, through ``other_triton.py`` beside its bundle (``results/dense-fp8-h200/host_cost_tritons_h200.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

SHAPES = [(4096, 1536, 2048), (512, 24576, 1536), (2048, 2112, 7168), (512, 2112, 7168), (2048, 7168, 2048),
          (256, 7168, 2048), (2048, 1536, 2048), (4096, 7168, 2048)]  # fmt: skip


def host_us(fn, n: int = 400) -> tuple[float, float]:
    """(CPU microseconds per call before the synchronize, wall microseconds per call until the GPU is done), rounded."""
    from eager_rule import back_to_back_us  # this folder's (it imports tilegemm: after DeepGEMM's setup)

    return tuple(round(us, 2) for us in back_to_back_us(fn, n, warmup=30))


def calls(a, b, d, dg) -> dict:
    """The calls timed on one shape's operands, by name."""
    import tilegemm

    named = {
        "gluon": lambda: tilegemm.fp8_gemm_nt(a, b, d, backend="gluon"),
        "cutile": lambda: tilegemm.fp8_gemm_nt(a, b, d, backend="cutile"),
        "auto": lambda: tilegemm.fp8_gemm_nt(a, b, d),
    }
    if dg is not None:
        named["deepgemm"] = lambda: dg.fp8_gemm_nt(a, b, d)
    return named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("label")
    parser.add_argument("out")
    parser.add_argument("--dg", action="store_true", help="DeepGEMM beside (from .devbundle/deepgemm)")
    args = parser.parse_args()
    # A forced backend that cannot run here (cutile without cuTile) is reported with its reason in the row, not timed
    # on the pytorch fallback under its name.
    os.environ["TILEGEMM_DISABLE_FALLBACK"] = "1"
    dg = None
    if args.dg:
        sys.path.insert(0, ".devbundle/deepgemm")
        import peer

        dg = peer.setup()
    from eager_rule import inputs, profile_top  # this folder's

    import tilegemm

    rows = []
    for m, n, k in SHAPES:
        a, b, d = inputs(m, n, k)
        row = {"shape": [m, n, k]}
        for name, fn in calls(a, b, d, dg).items():
            try:
                row[name] = host_us(fn)
            except Exception as e:  # noqa: BLE001  (a backend that cannot run here: its reason in the row)
                row[name] = repr(e)[:200]
        rows.append(row)
        print(row, flush=True)
    a, b, d = inputs(4096, 1536, 2048)
    fn = lambda: tilegemm.fp8_gemm_nt(a, b, d, backend="gluon")  # noqa: E731
    host_us(fn, 50)
    top = profile_top(fn, 2000, 30)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tilegemm": tilegemm.__file__}
    with open(args.out, "w") as f:
        json.dump({"label": args.label, "meta": meta, "rows": rows, "profile": top}, f, indent=1)
    print("\n".join(top["own"][:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
