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
from tilegemm.ops.gluon import bf16_gemm_ws, fp8_gemm_kernel, fp8_gemm_ws, gemm, sparse_attention, transpose
from tilegemm.ops.gluon.options import COMPILE_OPTIONS
from tilegemm.ops.gluon.tma import SCALE_LAYOUT, operand_layout

_TY = {torch.float8_e4m3fn: "fp8e4nv", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _compile(source: GluonASTSource, num_warps: int) -> Any:
    """``source`` compiled for sm_90a over ``num_warps`` warps with the backend's :data:`COMPILE_OPTIONS`."""
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, **COMPILE_OPTIONS})


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
    return _compile(source, 4)


def compile_dense_fp8_ws(
    cfg: fp8_gemm_ws.WsConfig,
    out_dtype: torch.dtype = torch.bfloat16,
    grouping: int = fp8_gemm_ws.DENSE,
    accumulate: bool = False,
    row_scale: bool = False,
    gated: int = 0,
    in_place: bool = False,
) -> Any:
    """``fp8_gemm_ws_kernel`` compiled for sm_90a as :func:`fp8_gemm_ws.ws_plan` launches ``cfg`` (its ring depth set
    for a 4096-cubed problem with ``out_dtype`` output; ``grouping``: dense, m-grouped or k-grouped, 8 groups;
    ``accumulate``: k-grouped into D; ``row_scale``: m-grouped with scaled rows; ``gated``: m-grouped with the
    gated activation quantized into an FP8 D; ``in_place``: k-grouped, A and B read as per-group blocks): a triton
    ``CompiledKernel``."""
    ws = fp8_gemm_ws
    groups = 8 if grouping != ws.DENSE else 0
    cfg = ws.ws_config(ws.Problem(4096, 4096, 4096, out_dtype, groups, grouping, gated), cfg)
    cfg = ws.in_place_config(cfg) if in_place else cfg
    box = ws.block_shapes(cfg)
    f8 = torch.float8_e4m3fn
    sb_box = box["sb"] if grouping == ws.K_GROUPED else box["sa"]
    signature = {
        "a_desc": _desc(f8, box["a"]),
        "b0_desc": _desc(f8, box["b0"]),
        "b1_desc": _desc(f8, box["b1"]),
        "sa_desc": _desc(torch.float32, box["sa"], SCALE_LAYOUT),
        "sb_desc": _desc(torch.float32, sb_box, SCALE_LAYOUT),
        "d0_desc": _desc(out_dtype, box["d0"]),
        "d1_desc": _desc(out_dtype, box["d1"]),
        "sb_ptr": "*fp32",
        "group_ptr": "*fp32" if grouping == ws.DENSE else "*i32",
        "row_scale_ptr": "*fp32" if row_scale else "*" + _TY[out_dtype],
        "d_scale_ptr": "*fp32" if gated else "*" + _TY[out_dtype],
        "a_blocks": "*fp8e4nv" if in_place else "*" + _TY[out_dtype],
        "b_blocks": "*fp8e4nv" if in_place else "*" + _TY[out_dtype],
        "sb_stride": "i32",
        "sb_group_stride": "i32",
        "num_groups": "i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "work_ptr": "*fp32",
        "counter_ptr": "*i32",
    }
    consts = ws.constants(cfg, grouping, accumulate, row_scale, gated, in_place)
    attrs = _split_tail_attrs(list(signature), cfg.splits)
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(ws.fp8_gemm_ws_kernel, signature, constexprs=consts, attrs=attrs)
    return _compile(source, cfg.num_warps)


#: The split tail's runs a tile in the split designs the gate compiles (their ``SPLITS``).
COMPILED_SPLITS = 4


def _split_tail_attrs(names: list[str], splits: int) -> dict:
    """The JIT's specialization of the split tail's parameters for the usual operands (none without a split): its
    workspace and counters 16-byte aligned, as torch allocates them."""
    if splits <= 1:
        return {}
    return {(names.index(n),): [["tt.divisibility", 16]] for n in ("work_ptr", "counter_ptr")}


def compile_bf16_ws(
    cfg: bf16_gemm_ws.Bf16WsConfig,
    out_dtype: torch.dtype = torch.bfloat16,
    k_grouped: bool = False,
    accumulate: bool = False,
) -> Any:
    """``bf16_gemm_ws_kernel`` compiled for sm_90a as :func:`bf16_gemm_ws.bf16_ws_plan` launches ``cfg`` (its ring
    depth set for ``out_dtype``; ``k_grouped``: the k-grouped form, MN-major boxes and fp32 output, ``accumulate``
    into D): a triton ``CompiledKernel``."""
    out_dtype = torch.float32 if k_grouped else out_dtype
    cfg = bf16_gemm_ws.bf16_ws_config(cfg, out_dtype)
    bf16, bm, bn, bk = torch.bfloat16, cfg.block_m, cfg.block_n, bf16_gemm_ws.BLOCK_K
    boxes = ([bk, bm], [bk, bn]) if k_grouped else ([bm, bk], [bn, bk])
    signature = {
        "a_desc": _desc(bf16, boxes[0]),
        "b_desc": _desc(bf16, boxes[1]),
        "d_desc": _desc(out_dtype, [bm // cfg.wg_parts, min(bn, 128)]),
        "group_ptr": "*i32",
        "num_groups": "i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "work_ptr": "*fp32",
        "counter_ptr": "*i32",
    }
    consts = {
        "STAGES": cfg.stages, "GROUP_M": cfg.group_m, "LOADER_REGS": cfg.loader_regs, "K_GROUPED": k_grouped,
        "ACCUMULATE": accumulate, "SPLITS": cfg.splits, "WG_PARTS": cfg.wg_parts,
    }  # fmt: skip
    attrs = _split_tail_attrs(list(signature), cfg.splits)
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(bf16_gemm_ws.bf16_gemm_ws_kernel, signature, constexprs=consts, attrs=attrs)
    return _compile(source, cfg.num_warps)


def compile_transpose() -> Any:
    """``transpose_kernel`` compiled for sm_90a as :func:`transpose.transposed` launches it on the usual operands:
    the pointers 16-byte aligned (as torch allocates them) and both sizes multiples of 16 (the JIT specializes
    on that)."""
    signature = {"src": "*u8", "dst": "*u8", "rows": "i32", "cols": "i32", "TILE": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    source = GluonASTSource(transpose.transpose_kernel, signature, constexprs={"TILE": transpose.TILE}, attrs=attrs)
    return _compile(source, transpose.WARPS)


def compile_sparse_decode(
    dk: int = 192,
    dv: int = 128,
    splits: int = 2,
    mask: int = 1,
    groups: int = 1,
    dtype: torch.dtype = torch.bfloat16,
) -> Any:
    """``sparse_decode_kernel`` compiled for sm_90a as :func:`sparse_attention.sparse_decode_plan` launches it
    (``mask``: 0 none, 1 boolean, 2 additive of ``dtype``; the pointers and row strides 16-byte aligned, as the JIT
    specializes them for DeepSeek's cache)."""
    sa = sparse_attention
    ty = "*" + _TY[dtype]
    part = "*fp32" if splits > 1 else ty
    signature = {
        "q_ptr": ty,
        "k_ptr": ty,
        "v_ptr": ty,
        "idx_ptr": "*i32",
        "mask_ptr": {0: ty, 1: "*u8", 2: ty}[mask],
        "o_ptr": ty,
        "part_ptr": part,
        "stat_ptr": part,
    }
    ints = ["heads", "num_keys", "count", "per_split", "q_sb", "q_sh", "k_sb", "k_sh", "k_st", "v_sb", "v_sh", "v_st"]
    signature.update({name: "i32" for name in [*ints, "idx_sb", "mask_sb", "o_sb", "o_sh"]})
    signature["scale_log2"] = "fp32"
    consts = dict(
        GROUPS=groups,
        DK=dk,
        DV=dv,
        DK_PAD=sa._pad(dk),
        DV_PAD=sa._pad(dv),
        BLOCK=sa.BLOCK_N,
        ROW_LANES=sa.ROW_LANES,
        SPLITS=splits,
        MASK=mask,
        WARPS=sa.NUM_WARPS,
    )
    names = list(signature)
    aligned = [n for n in names if n.endswith("_ptr")] + [n for n in ints[4:] if dk % 8 == 0 and dv % 8 == 0]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(sa.sparse_decode_kernel, signature, constexprs=consts, attrs=attrs)
    return _compile(source, sa.NUM_WARPS)


def compile_sparse_combine(dv: int = 128, splits: int = 2) -> Any:
    """``sparse_decode_combine_kernel`` compiled for sm_90a as the host launches it after ``splits`` splits (the
    output's pointer and strides 16-byte aligned)."""
    sa = sparse_attention
    signature = {"o_ptr": "*bf16", "part_ptr": "*fp32", "stat_ptr": "*fp32", "heads": "i32", "o_sb": "i32"}
    signature["o_sh"] = "i32"
    consts = dict(DV=dv, DV_PAD=sa._pad(dv), SPLITS=splits, SPLITS_PAD=sa._pad_splits(splits), WARPS=sa.COMBINE_WARPS)
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("o_ptr", "part_ptr", "stat_ptr", "o_sb", "o_sh")}
    signature.update({name: "constexpr" for name in consts})
    source = GluonASTSource(sa.sparse_decode_combine_kernel, signature, constexprs=consts, attrs=attrs)
    return _compile(source, sa.COMBINE_WARPS)
