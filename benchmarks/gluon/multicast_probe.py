"""Design (e) of issue 51, run: the 2-CTA multicast FP8 kernel (``multicast_kernel.py``) with its per-stage remote
slot release, checked against float64 and timed beside the plain ws kernel and DeepGEMM (triton >= 3.7.1, sm_90a).

On the GPU machine (``.devtriton`` and ``.devbundle/deepgemm`` carried; DeepGEMM built first with
``DG_PREBUILT=1 DG_SKIP_SMOKE=1 bash .devbundle/deepgemm/build.sh``):

    source .devtriton/setup.sh && PYTHONPATH=src:benchmarks/gluon:$PYTHONPATH \\
        python3 benchmarks/gluon/multicast_probe.py OUT.json

(``setup.sh`` puts triton 3.7.1 on ``PYTHONPATH``: keep it there.)

Without a GPU, ``--compile-only`` compiles the kernel for sm_90a and prints its barrier offset and SASS facts
(registers after ``setmaxnreg``, local memory, QGMMA and multicast TMA counts, the remote arrive).

Every variant's output is compared with the float64 formula (``calc_diff``) and rerun for bitwise equality before it
is timed; timing is kernel-only (CUDA-graph replay over input sets rotated past L2, median per call). Each check
runs first on small awkward shapes in a child process with a time limit, so that a hang (a barrier never completed)
is reported and does not stop the run.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import time

import multicast_kernel as mk
import triton
from design_check import check_in_child, check_shapes, passed
from fp8_ws_sweep import DESIGN_ROWS as ROWS
from sass_facts import sass_facts
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

#: Registers a loader thread keeps (4 warps): 128 x 24 + 256 x 240 for the MMA warps fit the 64K register file.
LOADER_REGS = 24
A_LAYOUT = gl.NVMMASharedLayout(128, 8, rank=2, cga_layout=[[1, 0]])
B_LAYOUT = gl.NVMMASharedLayout(128, 8, rank=2, cga_layout=[[0, 0]])
SA_LAYOUT = gl.NVMMASharedLayout(0, 32, rank=2, cga_layout=[[0, 1]])
D_LAYOUT = gl.NVMMASharedLayout(128, 16, rank=2, cga_layout=[[1, 0]])


def _signature(waves, stages, group_m, loader_regs, empty_off, debug=False, overlap=0):
    """Signature and constexprs of the kernel for a bf16 D."""
    desc = "tensordesc<{}[{}, {}],{!r}>"
    sig = {
        "a_desc": desc.format("fp8e4nv", mk.CLUSTER_M.value, mk.BLOCK_K.value, A_LAYOUT),
        "b_desc": desc.format("fp8e4nv", mk.BLOCK_N.value, mk.BLOCK_K.value, B_LAYOUT),
        "sa_desc": desc.format("fp32", 1, mk.CLUSTER_M.value, SA_LAYOUT),
        "d_desc": desc.format("bf16", mk.CLUSTER_M.value, mk.BLOCK_N.value, D_LAYOUT),
        "sb_ptr": "*fp32",
        "sb_stride": "i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "trace": "i64",
    }
    consts = {"EMPTY_OFF": empty_off, "WAVES": waves, "STAGES": stages, "GROUP_M": group_m, "LOADER_REGS": loader_regs}
    consts["DEBUG"] = debug
    consts["OVERLAP"] = overlap
    for name in consts:
        sig[name] = "constexpr"
    return sig, consts


@functools.cache
def compiled(waves, stages, overlap, group_m, loader_regs, empty_off, debug=False):
    """The kernel compiled for sm_90a (2-CTA clusters, 8 MMA warps)."""
    sig, consts = _signature(waves, stages, group_m, loader_regs, empty_off, debug, overlap)
    src = GluonASTSource(mk.multicast_fp8_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_ctas": 2})


@functools.cache
def empty_offset(waves, stages, overlap, group_m, loader_regs, debug=False) -> int:
    """The shared-memory offset of the first ``empty`` barrier (the barriers initialized with count 2), read from
    the PTX of a compile with offset 0: ``mov.b32 %rB, global_smem`` then ``add.s32 %rX, %rB, OFF`` and
    ``mbarrier.init.shared::cta.b64 [%rX], 2``. The ``STAGES`` barriers must lie 8 bytes apart."""
    return _empty_offset_of(compiled(waves, stages, overlap, group_m, loader_regs, 0, debug).asm["ptx"], stages)


def _empty_offset_of(ptx: str, stages: int) -> int:
    """:func:`empty_offset` read from ``ptx``."""
    base = set(re.findall(r"mov\.b32\s+(%r\d+),\s*global_smem;", ptx))
    offsets = {}
    for reg, b, off in re.findall(r"add\.s32\s+(%r\d+),\s*(%r\d+),\s*(\d+);", ptx):
        if b in base:
            offsets[reg] = int(off)
    found = []
    for reg in re.findall(r"mbarrier\.init\.shared::cta\.b64\s+\[(%r\d+)\],\s*2;", ptx):
        found.append(0 if reg in base else offsets[reg])
    found = sorted(set(found))
    assert found == [found[0] + 8 * i for i in range(stages)], f"empty barriers at {found}"
    return found[0]


def run_kernel(a, b, d, waves: int, stages: int, overlap: int = 0, group_m: int = 8, loader_regs: int = LOADER_REGS,
               clusters: int | None = None, trace=None):  # fmt: skip
    """``d = dequant(a) @ dequant(b).T`` by the multicast kernel (a = (fp8 [M, K], sa MN-major TMA-aligned
    [M, ceil(K/128)]), b = (fp8 [N, K], sb [ceil(N/128), ceil(K/128)]), d bf16 [M, N]). ``trace``: a host-pinned
    int32 tensor of 2 x 16 slots: the kernel is compiled with ``DEBUG`` and stores its progress there."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (qa, sa), (qb, sb) = a, b
    m, k = qa.shape
    n = qb.shape[0]
    sa_t = sa.t()
    tiles = triton.cdiv(m, waves * mk.CLUSTER_M.value) * triton.cdiv(n, mk.BLOCK_N.value)
    if clusters is None:
        clusters = torch.cuda.get_device_properties(qa.device).multi_processor_count // 2
    grid = (min(tiles, clusters),)
    descs = [
        TensorDescriptor(qa, [m, k], [qa.stride(0), 1], [mk.CLUSTER_M.value, mk.BLOCK_K.value], A_LAYOUT),
        TensorDescriptor(qb, [n, k], [qb.stride(0), 1], [mk.BLOCK_N.value, mk.BLOCK_K.value], B_LAYOUT),
        TensorDescriptor(sa_t, list(sa_t.shape), [sa_t.stride(0), 1], [1, mk.CLUSTER_M.value], SA_LAYOUT),
        TensorDescriptor(d, [m, n], [d.stride(0), 1], [mk.CLUSTER_M.value, mk.BLOCK_N.value], D_LAYOUT),
    ]
    args = (*descs, sb, sb.stride(0), m, n, k, 0 if trace is None else trace.data_ptr())
    consts = dict(WAVES=waves, STAGES=stages, GROUP_M=group_m, LOADER_REGS=loader_regs, OVERLAP=overlap)
    consts["DEBUG"] = trace is not None
    # the barrier offset of the JIT's own compile of these arguments (its specialization), checked on the compile
    # that runs
    off = _jit_empty_offset(args, grid, consts, 0)
    assert _jit_empty_offset(args, grid, consts, off) == off, "EMPTY_OFF moved the empty barriers"
    mk.multicast_fp8_kernel[grid](*args, EMPTY_OFF=off, **consts, num_warps=8, num_ctas=2)
    return d


_OFFSETS: dict[int, tuple] = {}


def _jit_empty_offset(args: tuple, grid: tuple, consts: dict, empty_off: int) -> int:
    """:func:`empty_offset` of the JIT's compile of the kernel for ``args`` with ``EMPTY_OFF`` = ``empty_off``
    (``warmup``: compiled, not launched)."""
    kernel = mk.multicast_fp8_kernel.warmup(*args, EMPTY_OFF=empty_off, **consts, grid=grid, num_warps=8, num_ctas=2)
    if id(kernel) not in _OFFSETS:
        _OFFSETS[id(kernel)] = (kernel, _empty_offset_of(kernel.asm["ptx"], consts["STAGES"]))
    return _OFFSETS[id(kernel)][1]


#: name: (waves, stages, overlap); the deepest rings that fit 227 KB of shared memory a CTA.
VARIANTS = {"mc_w2_s3": (2, 3, 0), "mc_w1_s5": (1, 5, 0), "mc_w1_s5_ov4": (1, 5, 4), "mc_w1_s5_ov8": (1, 5, 8)}
#: The plain ws kernel's designs timed beside them (``fp8_gemm_ws.VARIANTS``): the same tile without multicast, with
#: and without the overlap, and the default config.
PLAIN = ("a_128x128_p", "d_128x128_ov4", "d_128x128_ov8", "b_256x128")


def _check_variant(name: str) -> None:
    """Child process body: :func:`design_check.check_shapes` of variant ``name`` (the rerun on two clusters)."""
    waves, stages, overlap = VARIANTS[name]
    check_shapes(lambda a, b, d, small: run_kernel(a, b, d, waves, stages, overlap, clusters=2 if small else None))


#: The trace slots (``multicast_kernel``'s ``_trace`` calls).
TRACE_SLOTS = {
    0: "loader start", 1: "loader past init sync", 2: "loader it past empty wait", 3: "loader it issued",
    4: "loader loop done", 5: "loader past end sync", 8: "mma start", 9: "mma past init sync",
    10: "mma it past ready wait", 11: "mma it released", 12: "mma stores done", 13: "mma past end sync",
    15: "inits done (before warp_specialize)",
}  # fmt: skip


def _debug_variant(name: str, m: int, n: int, k: int, watch_s: float = 10.0) -> None:
    """Child process body: one traced launch; prints the trace (both CTAs) when it ends or after ``watch_s``."""
    import os

    import torch
    from fp8_ws_sweep import quant

    waves, stages, overlap = VARIANTS[name]
    a, b = quant(m, n, k, 3)
    d = torch.zeros((m, n), device="cuda", dtype=torch.bfloat16)
    trace = torch.zeros(2 * 16, dtype=torch.int32).pin_memory()
    run_kernel(a, b, d, waves, stages, overlap, trace=trace)
    t0 = time.time()
    while not torch.cuda.current_stream().query() and time.time() - t0 < watch_s:
        time.sleep(0.05)
    state = "finished" if torch.cuda.current_stream().query() else f"still running after {watch_s:.0f} s"
    print(f"TRACE {name} {m}x{n}x{k}: {state}", flush=True)
    for slot, what in TRACE_SLOTS.items():
        print(f"  {what:40s} cta0={int(trace[slot])} cta1={int(trace[16 + slot])}", flush=True)
    os._exit(0)


def check(name: str) -> list[dict]:
    """:func:`_check_variant` of ``name`` in a child process."""
    return check_in_child(f"import multicast_probe as p; p._check_variant({name!r})", name)


def compile_only() -> None:
    """Compile every variant for sm_90a (no GPU) and print its barrier offset and SASS facts."""
    for name, (waves, stages, overlap) in VARIANTS.items():
        off = empty_offset(waves, stages, overlap, 8, LOADER_REGS)
        facts = sass_facts(compiled(waves, stages, overlap, 8, LOADER_REGS, off))
        print(f"{name}: empty barriers at +{off}; {facts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", help="JSON file to write")
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile for sm_90a, print SASS facts")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--shapes", default="", help="comma-separated MxNxK rows instead of ROWS")
    parser.add_argument("--rep-ms", type=float, default=25.0)
    parser.add_argument("--debug", default="", help="MxNxK: one traced launch of each variant, then stop")
    args = parser.parse_args()
    if args.compile_only:
        compile_only()
        return
    if args.debug:
        m, n, k = (int(x) for x in args.debug.split("x"))
        for name in [v for v in args.variants.split(",") if v]:
            code = f"import multicast_probe as p; p._debug_variant({name!r}, {m}, {n}, {k})"
            try:
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
                print(out.stdout, out.stderr[-1500:] if out.returncode else "", flush=True)
            except subprocess.TimeoutExpired as exc:
                print(f"{name}: debug run timed out", exc.stdout, flush=True)
        return
    import torch
    from fp8_ws_sweep import row_inputs, ws_design
    from sweep_table import parse_shapes, print_table, progress, timed

    from tilegemm.bench import device, peers
    from tilegemm.ops.gluon import fp8_gemm_ws as ws

    t0 = time.time()
    names = [v for v in args.variants.split(",") if v]
    meta = {**device.describe(), "triton": triton.__version__}
    meta["sass"] = {}
    for name in names:
        waves, stages, overlap = VARIANTS[name]
        meta["sass"][name] = sass_facts(
            compiled(waves, stages, overlap, 8, LOADER_REGS, empty_offset(waves, stages, overlap, 8, LOADER_REGS))
        )
    checks = {}
    for name in names:
        checks[name] = check(name)
        if any("timeout" in c.get("error", "") for c in checks[name]):
            break  # the other variants share the barrier protocol: do not wait for them too
    good = [n for n in names if passed(checks[n])]
    dg, why = peers.load_deepgemm("auto")
    print("deepgemm:", why, "| timed:", good, flush=True)
    shapes = parse_shapes(args.shapes) or ROWS
    rows = []
    for m, n, k in shapes:
        sets, d, ref, row = row_inputs(m, n, k)
        for name in good:
            waves, stages, overlap = VARIANTS[name]
            call = functools.partial(run_kernel, d=d, waves=waves, stages=stages, overlap=overlap)
            timed(row, name, call, sets, d, ref, args.rep_ms)
        # the plain ws kernel's designs; a plan a call, so each call launches through triton's JIT (the library's
        # relaunch path reads triton 3.6's launcher fields, and the backend is not chosen under 3.7.1)
        for name in PLAIN:
            call = functools.partial(ws_design, d=d, cfg=ws.VARIANTS[name])
            timed(row, name, call, sets, d, ref, args.rep_ms)
        if dg is not None:
            timed(row, "deepgemm", functools.partial(dg.fp8_gemm_nt, d=d), sets, d, ref, args.rep_ms)
        rows.append(row)
        progress(row, t0, 1e-3)
        del sets, ref
        torch.cuda.empty_cache()
    meta.update(deepgemm=why, checks=checks, seconds=round(time.time() - t0, 1))
    meta["timing"] = "CUDA-graph replay median per call, input sets rotated past L2, kernel-only"
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, good + list(PLAIN) + ["deepgemm"], "deepgemm", "DeepGEMM")


if __name__ == "__main__":
    main()
