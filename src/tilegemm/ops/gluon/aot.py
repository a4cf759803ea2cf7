"""Ahead-of-time compilation of the gluon kernels for a GPU target without a GPU (the CPU compile gate).

``triton.compile`` with an explicit ``GPUTarget`` runs the whole pipeline, ptxas included, on any machine
with triton installed; the signature is built from the same boxes and shared layouts the host code passes.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from tilegemm.heuristics.gluon import GluonDenseConfig
from tilegemm.ops.gluon import fp8_gemm_kernel, fp8_gemm_ws, gemm
from tilegemm.ops.gluon.tma import SCALE_LAYOUT, operand_layout

_TY = {torch.float8_e4m3fn: "fp8e4nv", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _desc(dtype: torch.dtype, block: list[int], layout: Any = None) -> str:
    """The signature type of a TMA descriptor of ``dtype`` whose box is ``block`` (layout: :func:`operand_layout`'s
    when ``None``)."""
    layout = layout if layout is not None else operand_layout(block, dtype)
    return f"tensordesc<{_TY[dtype]}[{','.join(map(str, block))}],{layout!r}>"


def compile_dense_fp8(
    cfg: GluonDenseConfig, *, sb_rows: bool = False, has_c: bool = False, out_dtype: torch.dtype = torch.bfloat16
) -> Any:
    """``fp8_gemm_kernel`` compiled for sm_90a as the host code would launch it with ``cfg``: a triton
    ``CompiledKernel`` (``.asm["cubin"]``, ``.asm["ptx"]``, ``.metadata.shared``)."""
    box = gemm.block_shapes(cfg, sb_rows)
    f8 = torch.float8_e4m3fn
    signature = {
        "a_desc": _desc(f8, box["a"], operand_layout(box["a"], f8)),
        "b_desc": _desc(f8, box["b"], operand_layout(box["b"], f8)),
        "sa_desc": _desc(torch.float32, box["sa"], SCALE_LAYOUT),
        "sb_desc": _desc(torch.float32, box["sb"], SCALE_LAYOUT),
        "d_desc": _desc(out_dtype, box["d"], operand_layout(box["d"], out_dtype)),
        "c_ptr": "*" + _TY[out_dtype],
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "c_stride": "i32",
        "alpha": "fp32",
        "beta": "fp32",
    }
    consts = gemm.constants(cfg, sb_rows, has_c)
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(fp8_gemm_kernel.fp8_gemm_kernel, signature, constexprs=consts)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def compile_dense_fp8_ws(cfg: fp8_gemm_ws.WsConfig, out_dtype: torch.dtype = torch.bfloat16) -> Any:
    """``fp8_gemm_ws_kernel`` compiled for sm_90a as :func:`fp8_gemm_ws.ws_plan` launches ``cfg`` (its ring depth set
    for a 4096-cubed problem with ``out_dtype`` output): a triton ``CompiledKernel``."""
    ws = fp8_gemm_ws
    cfg = ws.ws_config(ws.Problem(4096, 4096, 4096, out_dtype), cfg)
    box = ws.block_shapes(cfg)
    f8 = torch.float8_e4m3fn
    signature = {
        "a_desc": _desc(f8, box["a"]),
        "b0_desc": _desc(f8, box["b0"]),
        "b1_desc": _desc(f8, box["b1"]),
        "sa_desc": _desc(torch.float32, box["sa"], SCALE_LAYOUT),
        "d0_desc": _desc(out_dtype, box["d0"]),
        "d1_desc": _desc(out_dtype, box["d1"]),
        "sb_ptr": "*fp32",
        "sb_stride": "i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
    }
    consts = ws.constants(cfg)
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(ws.fp8_gemm_ws_kernel, signature, constexprs=consts)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": ws.MMA_WARPS})
