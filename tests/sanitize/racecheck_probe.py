"""Minimal cuTile kernels that isolate the FP8 dense GEMM's promotion, for compute-sanitizer racecheck.

The FP8 kernels of ``ops/cutile/gemm_kernels.py`` compute, per 128-wide K block, ``p = mma(a, b, 0)`` and then
``acc += p * (sa * sb)`` with the scales loaded as small tiles; racecheck reports shared-memory write-write
hazards there, and none in the BF16 kernels (``acc = mma(a, b, acc)``). Each probe kernel below keeps one
piece of that pattern; every variant runs once on M=128, N=256, K=512 (64x128 tiles, 4 warps, occupancy 2,
as the shipped 64x128 FP8 configs) and checks its result against torch float64 (``calc_diff``):

========================  ======================================================================
``bf16_chain``            bf16, ``acc = mma(a, b, acc)`` over the K blocks (the BF16 main loop)
``fp8_chain``             the same with fp8 operands: FP8 MMAs, no promotion
``bf16_fresh``            bf16, ``acc += mma(a, b, 0)``: the promotion's fresh zero tile, 16-bit MMAs
``fp8_fresh``             fp8, ``acc += mma(a, b, 0)``: the promotion without the scale multiply
``fp8_scalar``            fp8, ``acc += mma(a, b, 0) * s``, ``s`` a kernel argument (no scale loads)
``fp8_tiles``             fp8, gemm_kernels.py's promotion: ``sa`` a (64, 1) and ``sb`` a (1, 1) ``ct.load``
                          tile, TMA allowed (the ``scale_tma`` configs)
``fp8_tiles_ldg``         the same with ``allow_tma=False`` scale loads (the default K <= 4096 config)
``fp8_tiles_sb_ldg``      ``fp8_tiles`` with only the (1, 1) ``sb`` load at ``allow_tma=False``
``fp8_single``            ``fp8_tiles`` with one K block: no loop, ``d = mma(a, b, 0) * (sa * sb)``
========================  ======================================================================

and the real kernels through the library, for comparison (bf16 ``d``, 128x128-block RHS scales):

========================  ======================================================================
``real_fp8_dense``        ``tilegemm.fp8_gemm_nt`` 512x256x512: gemm.py's FP8 kernel (default config)
``real_bf16_dense``       ``tilegemm.bf16_gemm_nt`` 512x256x512: gemm.py's BF16 kernel
``real_fp8_decode``       ``tilegemm.fp8_gemm_nt`` 128x256x512 (M <= 256 takes the decode kernels)
``real_bf16_decode``      ``tilegemm.bf16_gemm_nt`` 128x256x512
``real_fp8_small_m``      gemm_kernels.py's FP8 kernel forced to the 128x256 two-chain config (128x256x512)
``real_fp8_large_k``      gemm_kernels.py's FP8 kernel forced to the TMA-scale 64x128 config (512x256x512)
========================  ======================================================================

Usage (``PYTHONPATH=src``)::

    python tests/sanitize/racecheck_probe.py VARIANT|all        # run (GPU); exit 1 if a result is wrong
    compute-sanitizer --tool racecheck --racecheck-report hazard python tests/sanitize/racecheck_probe.py VARIANT
    python tests/sanitize/racecheck_probe.py --list             # variant names, one a line
    python tests/sanitize/racecheck_probe.py --sass VARIANT [--symbol NAME]   # sm_90 SASS (CPU)

``--sass`` exports the variant's kernel for sm_90 (``cuda.tile.compilation.export_kernel``, no GPU) and prints
the shared-memory stores (STS, STSM and the LDGSTS async copies) with ``--context`` instructions around each,
and every barrier, fence, mbarrier, TMA and warpgroup-MMA instruction, with their offsets (``/*0600*/``): the
offsets racecheck's hazard reports give (``kernel+0x600``). A probe is exported with the signature the JIT
compiles its launch with (the same mangled kernel name, so the same machine code); ``--symbol NAME`` exports
the signature of a mangled name instead, e.g. one copied from a hazard report. The ``real_*`` dense variants
are exported with :func:`aot.array` constraints for the plan on ``--sms`` SMs (split-K or not), which can
differ from the JIT's in shape facts and so in offsets (the hazard reports' source lines still apply); the
decode kernels are not exported here (``tests/compile_gate/test_compile_dense.py`` compiles them).
``tests/sanitize/racecheck.sh`` runs every variant under racecheck, one sanitizer process each.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cuda.tile as ct
import torch
from cuda.tile import compilation as cc

import tilegemm as tg
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.cutile import aot, gemm, gemm_kernels
from tilegemm.testing import calc_diff, dequantize

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO
FP8 = torch.float8_e4m3fn
M, N, K = 128, 256, 512
TM, TN = 64, 128
HINTS = {"num_worker_warps": 4, "occupancy": 2}
SCALE = 0.75
BAR = 1e-6


# ------------------------------------------------------------------------------------- kernels
# A [M, K] and B [N, K] (K-major), D [M, N] fp32; one CTA per (TM, TN) tile of D, K step 128.
# SA is [K / 128, M] (the MN-major LHS scales gemm_kernels.py reads), SB [N / 128, K / 128].


def chain(A, B, D, K: int, TM: ConstInt, TN: ConstInt):
    """``acc = mma(a, b, acc)`` over the K blocks."""
    pm, pn = ct.bid(0), ct.bid(1)
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for kb in range(ct.cdiv(K, 128)):
        a = ct.load(A, (pm, kb), (TM, 128), padding_mode=ZERO)
        b = ct.load(B, (kb, pn), (128, TN), order=(1, 0), padding_mode=ZERO)
        acc = ct.mma(a, b, acc)
    ct.store(D, (pm, pn), acc)


def fresh(A, B, D, K: int, TM: ConstInt, TN: ConstInt, FAST: ConstBool):
    """``acc += mma(a, b, 0)`` per K block (the promotion without scales); FAST: fp8's ``use_fast_acc``."""
    pm, pn = ct.bid(0), ct.bid(1)
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for kb in range(ct.cdiv(K, 128)):
        a = ct.load(A, (pm, kb), (TM, 128), padding_mode=ZERO)
        b = ct.load(B, (kb, pn), (128, TN), order=(1, 0), padding_mode=ZERO)
        acc = acc + ct.mma(a, b, ct.zeros((TM, TN), dtype=ct.float32), use_fast_acc=FAST)
    ct.store(D, (pm, pn), acc)


def scalar(A, B, D, s: float, K: int, TM: ConstInt, TN: ConstInt):
    """``acc += mma(a, b, 0) * s`` per K block, ``s`` a kernel argument."""
    pm, pn = ct.bid(0), ct.bid(1)
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for kb in range(ct.cdiv(K, 128)):
        a = ct.load(A, (pm, kb), (TM, 128), padding_mode=ZERO)
        b = ct.load(B, (kb, pn), (128, TN), order=(1, 0), padding_mode=ZERO)
        acc = acc + ct.mma(a, b, ct.zeros((TM, TN), dtype=ct.float32), use_fast_acc=True) * s
    ct.store(D, (pm, pn), acc)


def tiles(A, B, SA, SB, D, K: int, TM: ConstInt, TN: ConstInt, TMA: ConstBool, SB_TMA: ConstBool):
    """gemm_kernels.py's promotion: ``acc += mma(a, b, 0) * (sa * sb)``, sa (TM, 1) and sb (1, 1) ``ct.load`` tiles."""
    pm, pn = ct.bid(0), ct.bid(1)
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for kb in range(ct.cdiv(K, 128)):
        a = ct.load(A, (pm, kb), (TM, 128), padding_mode=ZERO)
        sa = ct.load(SA, (pm, kb), (TM, 1), order=(1, 0), padding_mode=ZERO, allow_tma=TMA)
        b = ct.load(B, (kb, pn), (128, TN), order=(1, 0), padding_mode=ZERO)
        sb = ct.load(SB, (pn, kb), (1, 1), padding_mode=ZERO, allow_tma=SB_TMA)
        acc = acc + ct.mma(a, b, ct.zeros((TM, TN), dtype=ct.float32), use_fast_acc=True) * (sa * sb)
    ct.store(D, (pm, pn), acc)


def single(A, B, SA, SB, D, TM: ConstInt, TN: ConstInt, TMA: ConstBool):
    """One K block, no loop: ``d = mma(a, b, 0) * (sa * sb)``."""
    pm, pn = ct.bid(0), ct.bid(1)
    a = ct.load(A, (pm, 0), (TM, 128), padding_mode=ZERO)
    sa = ct.load(SA, (pm, 0), (TM, 1), order=(1, 0), padding_mode=ZERO, allow_tma=TMA)
    b = ct.load(B, (0, pn), (128, TN), order=(1, 0), padding_mode=ZERO)
    sb = ct.load(SB, (pn, 0), (1, 1), padding_mode=ZERO, allow_tma=TMA)
    ct.store(D, (pm, pn), ct.mma(a, b, ct.zeros((TM, TN), dtype=ct.float32), use_fast_acc=True) * (sa * sb))


# ------------------------------------------------------------------------------------ variants


@dataclass(frozen=True)
class Probe:
    """A probe kernel body, its operand type and K, and the ``allow_tma`` of its sa and sb scale loads."""

    body: Callable[..., None]
    fp8: bool
    k: int = K
    tma: bool = True
    sb_tma: bool = True

    def kernel(self) -> Any:
        return _KERNELS[self.body.__name__]

    def params(self) -> list[str]:
        return list(inspect.signature(self.body).parameters)


_KERNELS = {fn.__name__: ct.kernel(fn, **HINTS) for fn in (chain, fresh, scalar, tiles, single)}

PROBES: dict[str, Probe] = {
    "bf16_chain": Probe(chain, fp8=False),
    "fp8_chain": Probe(chain, fp8=True),
    "bf16_fresh": Probe(fresh, fp8=False),
    "fp8_fresh": Probe(fresh, fp8=True),
    "fp8_scalar": Probe(scalar, fp8=True),
    "fp8_tiles": Probe(tiles, fp8=True),
    "fp8_tiles_ldg": Probe(tiles, fp8=True, tma=False, sb_tma=False),
    "fp8_tiles_sb_ldg": Probe(tiles, fp8=True, sb_tma=False),
    "fp8_single": Probe(single, fp8=True, k=128),
}

#: Real calls: (kind, M, forced dense config or None for the library's own choice).
REAL: dict[str, tuple[str, int, heuristics.DenseConfig | None]] = {
    "real_fp8_dense": ("fp8", 512, None),
    "real_bf16_dense": ("bf16", 512, None),
    "real_fp8_decode": ("fp8", 128, None),
    "real_bf16_decode": ("bf16", 128, None),
    "real_fp8_small_m": ("fp8", 128, heuristics.FP8_SMALL_M),
    "real_fp8_large_k": ("fp8", 512, heuristics.FP8_LARGE_K),
}
VARIANTS = [*PROBES, *REAL]


def _operand(rows: int, cols: int, fp8: bool) -> torch.Tensor:
    x = torch.randn(rows, cols, device="cuda")
    return (x * 64).clamp(-448, 448).to(FP8) if fp8 else x.bfloat16()


def run_probe(name: str) -> float:
    """Launch probe ``name`` once; return ``calc_diff`` of its ``d`` against the float64 formula."""
    p = PROBES[name]
    kb = p.k // 128
    a, b = _operand(M, p.k, p.fp8), _operand(N, p.k, p.fp8)
    sa, sb = torch.rand(M, kb, device="cuda") + 0.5, torch.rand(N // 128, kb, device="cuda") + 0.5
    d = torch.full((M, N), math.nan, device="cuda")
    values = {"A": a, "B": b, "SA": sa.t().contiguous(), "SB": sb, "D": d, "s": SCALE, "K": p.k}
    values.update(TM=TM, TN=TN, TMA=p.tma, SB_TMA=p.sb_tma, FAST=p.fp8)
    grid = (M // TM, N // TN, 1)
    ct.launch(torch.cuda.current_stream(), grid, p.kernel(), tuple(values[n] for n in p.params()))
    if "SA" in p.params():
        want = dequantize(a, sa, 1, 128) @ dequantize(b, sb, 128, 128).T
    else:
        want = a.double() @ b.double().T * (SCALE if "s" in p.params() else 1.0)
    torch.cuda.synchronize()
    return calc_diff(d, want) if torch.isfinite(d).all() else math.nan


def run_real(name: str) -> float:
    """One call through the library (``tilegemm`` or gemm.py with a forced config); ``calc_diff`` vs float64."""
    kind, m, cfg = REAL[name]
    d = torch.full((m, N), math.nan, device="cuda", dtype=torch.bfloat16)
    if kind == "bf16":
        a, b = _operand(m, K, False), _operand(N, K, False)
        tg.bf16_gemm_nt(a, b, d, backend="cutile")
        want = a.double() @ b.double().T
    else:
        a = tg.per_token_cast_to_fp8(torch.randn(m, K, device="cuda"))
        b = tg.per_block_cast_to_fp8(torch.randn(N, K, device="cuda"))
        if cfg is None:
            tg.fp8_gemm_nt(a, b, d, backend="cutile")
        else:
            gemm.fp8_gemm(a, b, d, None, recipe=(1, 128, 128), alpha=1.0, beta=0.0, config=cfg)
        want = dequantize(*a, 1, 128) @ dequantize(*b, 128, 128).T
    torch.cuda.synchronize()
    return calc_diff(d, want) if torch.isfinite(d).all() else math.nan


def run(name: str) -> bool:
    """Run variant ``name``; print one line and return whether its result matches the formula."""
    diff = run_probe(name) if name in PROBES else run_real(name)
    bar = BAR if name in PROBES else 1e-5
    ok = diff < bar
    print(f"racecheck probe {name}: calc_diff vs float64 {diff:.2e} ({'ok' if ok else 'WRONG'}, bar {bar:g})")
    return ok


# ---------------------------------------------------------------------------------------- SASS

#: Opcodes shown (first mnemonic part): shared-memory stores (STS, STSM, and LDGSTS: the async copies
#: racecheck calls memcpy_async), barriers and fences, TMA loads, warpgroup MMAs.
STORES = ("STS", "STSM", "LDGSTS")
SHOWN = (
    *STORES,
    *("LDGDEPBAR", "ARRIVES", "SYNCS", "BAR", "MEMBAR", "FENCE", "DEPBAR"),
    *("WARPGROUP", "HGMMA", "QGMMA", "UTMALDG"),
)
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[^;]*;")


def _array(dtype: ct.DType, shape: tuple[int, ...]) -> cc.ArrayConstraint:
    """What the JIT infers from a contiguous, 16-byte aligned tensor of ``shape``: :func:`aot.array`'s
    stride and alignment facts, plus each dimension's divisibility by 16 where it holds."""
    div = [16 if n % 16 == 0 else 1 for n in shape]
    return dataclasses.replace(aot.array(dtype, len(shape)), shape_divisible_by=div)


def _probe_signature(p: Probe) -> cc.KernelSignature:
    """The signature the JIT compiles :func:`run_probe`'s launch with (``racecheck`` prints its mangled name)."""
    elt, kb = (ct.float8_e4m3fn if p.fp8 else ct.bfloat16), p.k // 128
    table = {"A": _array(elt, (M, p.k)), "B": _array(elt, (N, p.k)), "SA": _array(ct.float32, (kb, M))}
    table.update(SB=_array(ct.float32, (N // 128, kb)), D=_array(ct.float32, (M, N)), s=aot.scalar(ct.float32))
    table.update(K=aot.scalar(ct.int32), TM=TM, TN=TN, TMA=p.tma, SB_TMA=p.sb_tma, FAST=p.fp8)
    params = [table[n] for n in p.params()]
    return cc.KernelSignature(params, calling_convention=cc.CallingConvention.cutile_python_v1())


def _real_signature(name: str, sms: int) -> tuple[Any, cc.KernelSignature, str]:
    """(kernel, signature, description) of the gemm.py kernel a ``real_*`` dense variant launches on ``sms``
    SMs, with :func:`aot.array` constraints (the JIT's own may add shape facts, which can shift offsets)."""
    kind, m, cfg = REAL[name]
    problem = heuristics.Problem("dense", kind, m, N, K, sms)
    if cfg is None:
        cfg = heuristics.choose(problem)
        if isinstance(cfg, heuristics.DecodeConfig):
            raise SystemExit(f"--sass {name}: a decode kernel (ops/cutile/decode.py); not exported here")
    splitk = heuristics.split_plan(problem, cfg).splits > 1
    arr, f32, i32 = aot.array, aot.scalar(ct.float32), aot.scalar(ct.int32)
    head = [arr(ct.bfloat16, 2), arr(ct.bfloat16, 2), arr(ct.float32 if splitk else ct.bfloat16, 4)]
    head += [f32, f32, i32, i32, *gemm_kernels.kernel_constants(cfg, splitk=splitk)]
    if kind == "bf16":
        operands = [arr(ct.bfloat16, 2)] * 2
    else:
        operands = [arr(ct.float8_e4m3fn, 2)] * 2 + [arr(ct.float32, 2)] * 2
    desc = f"config {cfg.name}, split-K {splitk} ({sms} SMs)"
    return gemm_kernels.get_kernel(cfg), aot.signature([*operands, *head]), desc


def sass_listing(sass: str, context: int) -> list[str]:
    """The lines of ``sass`` worth matching to hazard reports: function headers, :data:`SHOWN` instructions
    and ``context`` instructions either side of each shared-memory store (``...`` marks skipped ones)."""
    lines = sass.splitlines()
    instr = [i for i, line in enumerate(lines) if _INSTR.match(line)]
    ordinal = {i: pos for pos, i in enumerate(instr)}
    keep = {i for i, line in enumerate(lines) if "Function :" in line}
    for pos, i in enumerate(instr):
        op = _INSTR.match(lines[i]).group(2)
        if op in SHOWN:
            keep.add(i)
        if op in STORES:
            keep.update(instr[max(0, pos - context) : pos + context + 1])
    out, prev = [], None
    for i in sorted(keep):
        pos = ordinal.get(i)
        if pos is not None and prev is not None and pos != prev + 1:
            out.append("        ...")
        out.append(re.sub(r"\s*/\* 0x[0-9a-f]+ \*/\s*$", "", lines[i]).rstrip())
        prev = pos
    return out


def print_sass(name: str, context: int, sms: int, symbol: str | None = None) -> None:
    """Export variant ``name`` for sm_90 and print :func:`sass_listing` of its SASS (CPU only).

    ``symbol``: a mangled kernel name as the JIT compiled it (racecheck's access lines show it for the
    probes); its signature replaces the variant's own, so that the offsets are the JIT kernel's exactly.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from compile_gate.sass import dump_sass, opcode_counts

    if name in PROBES:
        kernel, signature, what = PROBES[name].kernel(), _probe_signature(PROBES[name]), f"probe {name}"
    else:
        kernel, signature, what = _real_signature(name, sms)
    if symbol is not None:
        signature, what = cc.demangle_kernel_name(symbol)[1], f"{what}, signature of the given symbol"
    buf = io.BytesIO()
    cc.export_kernel(kernel, [signature], buf, gpu_code="sm_90", output_format="cubin")
    sass = dump_sass(buf.getvalue())
    counts = opcode_counts(sass)
    shown = {op: n for op, n in sorted(counts.items()) if op.split(".")[0] in (*SHOWN, "LDS", "LDSM")}
    print(f"# {name}: sm_90 SASS of {what}; {sum(counts.values())} instructions; {shown}")
    print("\n".join(sass_listing(sass, context)))


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", nargs="?", help=f"'all' or one of: {', '.join(VARIANTS)}")
    parser.add_argument("--list", action="store_true", help="print the variant names and exit")
    parser.add_argument("--sass", metavar="VARIANT", help="print the variant's sm_90 SASS (no GPU needed)")
    parser.add_argument("--context", type=int, default=3, help="instructions shown around each STS/STSM")
    parser.add_argument("--sms", type=int, default=132, help="SM count for a real variant's split-K plan")
    parser.add_argument("--symbol", help="with --sass: export the JIT kernel of this mangled name (from racecheck)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(VARIANTS))
        return 0
    if args.sass is not None:
        if args.sass not in VARIANTS:
            parser.error(f"--sass: unknown variant {args.sass!r}; one of {', '.join(VARIANTS)}")
        print_sass(args.sass, args.context, args.sms, args.symbol)
        return 0
    if args.variant is None:
        parser.error("give a variant name, 'all', --list or --sass VARIANT")
    if args.variant != "all" and args.variant not in VARIANTS:
        parser.error(f"unknown variant {args.variant!r}; 'all' or one of {', '.join(VARIANTS)}")
    if not torch.cuda.is_available():
        print("racecheck probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    names = VARIANTS if args.variant == "all" else [args.variant]
    return 0 if all([run(n) for n in names]) else 1


if __name__ == "__main__":
    sys.exit(main())
