"""The FP8 kernel with each MMA warpgroup a partition of its own (``wg_split_kernel.py``), checked against float64
and timed beside the library's ws kernel (the same tiles with both warpgroups in one partition), the public API and
DeepGEMM (triton 3.6, sm_90a).

On the GPU machine (``.devbundle/deepgemm`` carried; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``), from the project root:

    TILEGEMM_BENCH_DEEPGEMM=$PWD/.devbundle/deepgemm PYTHONPATH=src:benchmarks/gluon \\
        python3 benchmarks/gluon/wg_split_probe.py OUT.json

Without a GPU, ``--compile-only`` prints each variant's SASS facts (registers after ``setmaxnreg``, local memory,
QGMMA count). Checks and timing as ``multicast_probe.py`` (``design_check``; kernel-only CUDA-graph replay over input
sets rotated past L2).
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import triton
import wg_split_kernel as wk
from design_check import check_in_child, check_shapes, passed
from fp8_ws_sweep import DESIGN_ROWS
from sass_facts import sass_facts
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

#: name: (halves a warpgroup, ring stages, overlap): 256x128 tiles (3 stages fit) and 128x128 (5), the latter also
#: with each warpgroup's next wgmma in flight during its promotion (runs of 4 or 8 K blocks).
VARIANTS = {"wg_256x128": (2, 3, 0), "wg_128x128": (1, 5, 0), "wg_128x128_ov4": (1, 5, 4), "wg_128x128_ov8": (1, 5, 8)}
#: The library's ws kernel designs beside them (``fp8_gemm_ws.VARIANTS``): the same tiles with the warpgroups in one
#: partition, and its pipelined 128x128 design.
PLAIN = ("b_256x128", "a_128x128_p", "d_128x128_ov8")
MMA_REGS = 232  # warpgroup 1's registers; the default partition (warpgroup 0) gets what is left
LOADER_REGS = 24
OPERAND = gl.NVMMASharedLayout(128, 8, rank=2)
SCALES = gl.NVMMASharedLayout(0, 32, rank=2)
OUT = gl.NVMMASharedLayout(128, 16, rank=2)


@functools.cache
def compiled(halves: int, stages: int, overlap: int = 0):
    """The kernel compiled for sm_90a (CPU: SASS facts)."""
    bm = 2 * halves * 64
    desc = "tensordesc<{}[{}, {}],{!r}>"
    sig = {
        "a_desc": desc.format("fp8e4nv", bm, 128, OPERAND),
        "b_desc": desc.format("fp8e4nv", 128, 128, OPERAND),
        "sa_desc": desc.format("fp32", 1, bm, SCALES),
        "d_desc": desc.format("bf16", 64, 128, OUT),
        "sb_ptr": "*fp32",
        "sb_stride": "i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
    }
    consts = dict(HALVES=halves, STAGES=stages, GROUP_M=8, MMA_REGS=MMA_REGS, LOADER_REGS=LOADER_REGS, OVERLAP=overlap)
    sig.update({name: "constexpr" for name in consts})
    src = GluonASTSource(wk.wg_split_fp8_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def run_kernel(a, b, d, halves: int, stages: int, overlap: int = 0, ctas: int | None = None):
    """``d = dequant(a) @ dequant(b).T`` (a = (fp8 [M, K], sa MN-major TMA-aligned), b = (fp8 [N, K], sb 128x128
    blocks), d bf16 [M, N]) on ``ctas`` CTAs (default: one a SM)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (qa, sa), (qb, sb) = a, b
    m, k = qa.shape
    n = qb.shape[0]
    sa_t = sa.t()
    bm = 2 * halves * 64
    if ctas is None:
        ctas = torch.cuda.get_device_properties(qa.device).multi_processor_count
    grid = (min(triton.cdiv(m, bm) * triton.cdiv(n, 128), ctas),)
    descs = [
        TensorDescriptor(qa, [m, k], [qa.stride(0), 1], [bm, 128], OPERAND),
        TensorDescriptor(qb, [n, k], [qb.stride(0), 1], [128, 128], OPERAND),
        TensorDescriptor(sa_t, list(sa_t.shape), [sa_t.stride(0), 1], [1, bm], SCALES),
        TensorDescriptor(d, [m, n], [d.stride(0), 1], [64, 128], OUT),
    ]
    wk.wg_split_fp8_kernel[grid](
        *descs, sb, sb.stride(0), m, n, k,
        HALVES=halves, STAGES=stages, GROUP_M=8, MMA_REGS=MMA_REGS, LOADER_REGS=LOADER_REGS, OVERLAP=overlap,
        num_warps=4,
    )  # fmt: skip
    return d


def _check_variant(name: str) -> None:
    """Child process body: :func:`design_check.check_shapes` of variant ``name`` (the rerun on 2 CTAs)."""
    halves, stages, overlap = VARIANTS[name]
    check_shapes(lambda a, b, d, small: run_kernel(a, b, d, halves, stages, overlap, ctas=2 if small else None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", help="JSON file to write")
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile for sm_90a, print SASS facts")
    parser.add_argument("--rep-ms", type=float, default=20.0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    parser.add_argument("--no-plain", dest="plain", action="store_false", help="leave out the ws designs (PLAIN)")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    facts = {name: sass_facts(compiled(*VARIANTS[name])) for name in names}
    for name, f in facts.items():
        print(f"{name}: {f}", flush=True)
    if args.compile_only:
        return
    import torch
    from fp8_ws_sweep import row_inputs, ws_design
    from sweep_table import print_table, progress, timed

    import tilegemm
    from tilegemm.bench import device, peers
    from tilegemm.ops.gluon import fp8_gemm_ws as ws

    t0 = time.time()
    code = "import wg_split_probe as p; p._check_variant({!r})"
    checks = {name: check_in_child(code.format(name), name) for name in names}
    good = [name for name in names if passed(checks[name])]
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, "| timed:", good, flush=True)
    rows = []
    for m, n, k in DESIGN_ROWS:
        sets, d, ref, row = row_inputs(m, n, k)
        for name in good:
            halves, stages, overlap = VARIANTS[name]
            call = functools.partial(run_kernel, d=d, halves=halves, stages=stages, overlap=overlap)
            timed(row, name, call, sets, d, ref, args.rep_ms)
        for name in PLAIN if args.plain else ():
            call = functools.partial(ws_design, d=d, cfg=ws.VARIANTS[name])
            timed(row, name, call, sets, d, ref, args.rep_ms)
        timed(row, "tilegemm", lambda a, b, d=d: tilegemm.fp8_gemm_nt(a, b, d), sets, d, ref, args.rep_ms)
        if dg is not None:
            timed(row, "deepgemm", functools.partial(dg.fp8_gemm_nt, d=d), sets, d, ref, args.rep_ms)
        rows.append(row)
        progress(row, t0, 1e-3)
        del sets, ref
        torch.cuda.empty_cache()
    meta = {**device.describe(), "triton": triton.__version__, "deepgemm": why, "sass": facts, "checks": checks}
    meta["timing"] = "CUDA-graph replay median per call, input sets rotated past L2, kernel-only"
    meta["columns"] = "wg_*: this kernel; ws designs by name (a plan a call); tilegemm: fp8_gemm_nt, default settings"
    meta["seconds"] = round(time.time() - t0, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, good + list(PLAIN if args.plain else ()) + ["tilegemm", "deepgemm"], "deepgemm", "DeepGEMM")


if __name__ == "__main__":
    main()
