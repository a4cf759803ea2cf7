"""Fused FP8 MoE experts (``tilegemm.fp8_moe_experts``) on the gluon m-grouped GEMM, for prefill sizes.

The cutile backend's form (``ops/cutile/moe_fp8.py``) runs its GEMMs at cuTile's grouped FP8 speed. Here both are
the warp-specialized gluon kernel's m-grouped form (``fp8_gemm_ws_kernel``, ``M_GROUPED``), and the steps around
them are the cutile backend's small kernels (so this form needs cuTile installed beside triton):

1. **routing** (``moe_blocks.routing`` with 128-row blocks): the slots sorted by expert, each expert's rows starting
   on a 128-row block; per row its token, routing weight and expert, per block its expert (-1: none), per slot its
   row.
2. **quantize, then gather** (the ``quant`` and ``gather_rows`` kernels of ``moe_fp8``): each token quantized
   once, ``xt, st = q(x)`` (1x128), then ``xq[r], sx[r] = xt[tok(r)], st[tok(r)]``, the scales MN-major as the GEMM
   reads them. The gather copies FP8 bytes of rows that stay in L2, instead of reading and quantizing each token's
   bf16 row once per slot.
3. **gate/up** (the kernel's ``GATED`` form): a tile reads the expert's gate rows and up rows of ``W13`` for the same
   128 columns of ``h``; ``g`` and ``u`` stay fp32 (each 128-deep block's product promoted with both scales), and the
   epilogue writes ``hq, sh = q(act(g) * u)``: ``h`` is never rounded before its quantization, as in the formula.
   The designs of both GEMMs: ``moe_fp8_ws_designs``. The kernel also runs 64-row tiles here (the tile of a block's
   padding rows skipped), measured slower at 16-32 routed rows per expert.
4. **down**: ``y[r] = bf16(w(r) * (hq[r] @ W2[e].T))``: the kernel with its rows scaled by the routing weight before
   the rounding (``ROW_SCALE``).
5. **combine** (the ``combine`` kernel of ``moe``): ``out[t] = bf16(sum_j y[dest[t, j]])`` in fp32, slots in order.

The GEMMs read each row's expert from ``m_index`` [M] (the routing's ``row_group``): a row without a slot has the id
E, so a tile that starts on one (a block without an expert; with 64-row tiles, the second half of a block of at most
64 rows) is neither computed nor stored, and such rows of a computed tile are stored as 0; nothing reads them. It
rounds where the cutile form does (the formula of ``tilegemm.ops.api.fp8_moe_experts``); only the fp32 association
of a block's scales differs (``P * (sa * sw)`` here). No host synchronisation: CUDA-graph capturable; reruns are
bitwise identical. The automatic choice takes this form from
:data:`tilegemm.heuristics.gluon.MOE_FP8_MIN_ROWS_PER_EXPERT` routed rows per expert.
"""

from __future__ import annotations

import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics.gluon import BLOCK_M, moe_fp8_buffers_fit, moe_fp8_ws_designs
from tilegemm.heuristics.report import print_once
from tilegemm.ops.gluon import fp8_gemm_ws, grouped
from tilegemm.routing import max_padded_rows

#: Rows of a routing block: one 128-row output tile of the m-grouped kernel, one expert.
BLOCK_ROWS = BLOCK_M


def _cutile():
    """The cutile modules whose kernels run the steps around the GEMMs (imported here: the gluon backend loads
    without cuTile), or :class:`Unsupported` without cuTile."""
    try:
        from tilegemm.heuristics import cutile as cutile_heuristics
        from tilegemm.ops.cutile import launch, moe, moe_blocks, moe_fp8
    except ImportError as exc:
        raise Unsupported(f"the routing, quantization and combine kernels need cuda.tile ({exc})") from exc
    return cutile_heuristics, launch, moe, moe_blocks, moe_fp8


def unsupported_reason(
    tokens: int,
    top_k: int,
    w13: tuple[torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor],
    activation: str,
) -> str | None:
    """Why this form cannot run a call of ``tokens`` tokens routed ``top_k`` ways with these weights and activation,
    or ``None``."""
    if activation not in fp8_gemm_ws.GATED_ACTIVATIONS:
        return f"activation {activation!r} (the kernels take {sorted(fp8_gemm_ws.GATED_ACTIVATIONS)})"
    for name, (data, scales) in (("w13", w13), ("w2", w2)):
        if not (data.is_contiguous() and scales.is_contiguous()) or data.data_ptr() % 16:
            return f"{name}: FP8 data and scales must be contiguous, the data 16-byte aligned"
        if data.shape[0] * data.shape[1] >= 2**31:
            return f"{name}: E * N rows past int32 (TMA coordinates)"
    experts, two_inter, hidden_dim = w13[0].shape
    if not moe_fp8_buffers_fit(tokens, top_k, experts, hidden_dim, two_inter // 2):
        return "a buffer has >= 2**31 elements (int32 indexing)"
    return None


@register_impl("fp8_moe_experts", "gluon")
def fp8_moe_experts(hidden, topk_ids, topk_weights, w13, w2, activation, stream):
    """Fused FP8 MoE experts; see ``tilegemm.ops.api.fp8_moe_experts`` and the module docstring.

    One linear host function: problem -> operands (routing, quantized rows, buffers) -> the five steps, every one on
    ``stream`` (``None``: the current one).
    """
    cutile_heuristics, launch, moe, moe_blocks, moe_fp8 = _cutile()
    num_tokens, hidden_dim = hidden.shape
    num_experts, top_k, inter = w13[0].shape[0], topk_ids.shape[1], w2[0].shape[2]
    reason = unsupported_reason(num_tokens, top_k, w13, w2, activation)
    if reason is not None:
        raise Unsupported(reason)
    out = torch.empty(num_tokens, hidden_dim, dtype=hidden.dtype, device=hidden.device)
    if num_tokens == 0:
        return out
    if top_k == 0 or num_experts == 0:
        return out.zero_()
    rows = max_padded_rows(num_tokens, top_k, num_experts, BLOCK_ROWS)
    print_once("fp8_moe_experts[gluon]", {"t": num_tokens, "k": top_k, "e": num_experts, "h": hidden_dim, "i": inter},
               "m-grouped GEMMs")  # fmt: skip
    dev = hidden.device
    # 1. routing
    routed = moe_blocks.routing(topk_ids, topk_weights, num_experts, BLOCK_ROWS, rows)
    for kernel, grid, args in routed.launches:
        launch.launch(kernel, grid, args, stream)
    # the GEMMs' row groups: each row's expert, E (neither computed nor stored) for a row without a slot
    m_index = routed.row_group
    # 2. quantize each token, then gather the rows (scales MN-major)
    br, occupancy = moe_fp8.QUANT_BR, moe_fp8.QUANT_OCCUPANCY
    xt = torch.empty(num_tokens, hidden_dim, dtype=torch.float8_e4m3fn, device=dev)
    st = torch.empty(num_tokens, hidden_dim // 128, dtype=torch.float32, device=dev)
    x = launch.as_row_major(hidden, pad_rows=False)
    grid = (launch.cdiv(num_tokens, br), hidden_dim // 128, 1)
    launch.launch(moe_fp8.get_kernel("quant", occupancy=occupancy), grid, (x, xt, st, br), stream)
    xq = torch.empty(rows, hidden_dim, dtype=torch.float8_e4m3fn, device=dev)
    sx = torch.empty(hidden_dim // 128, rows, dtype=torch.float32, device=dev)
    args = (xt.view(torch.uint8), st, routed.row_token, xq.view(torch.uint8), sx, routed.block_expert, num_experts, br)
    grid = (rows // br, hidden_dim // 128, 1)
    launch.launch(moe_fp8.get_kernel("gather_rows", occupancy=occupancy), grid, (*args, BLOCK_ROWS), stream)
    # 3. gate/up with the activation, h quantized 1x128 (scales MN-major)
    hq = torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=dev)
    sh = torch.empty(inter // 128, rows, dtype=torch.float32, device=dev)
    gated = fp8_gemm_ws.GATED_ACTIVATIONS[activation]
    up_design, down_design = moe_fp8_ws_designs(num_tokens, top_k, num_experts)
    up = grouped.m_grouped_plan((xq, sx.t()), w13, hq, m_index, gated=gated, d_scales=sh, design=up_design)
    up((xq, sx.t()), w13, hq, stream, m_index, d_scales=sh)
    # 4. down, rows scaled by their routing weight
    y = torch.empty(rows, hidden_dim, dtype=torch.bfloat16, device=dev)
    down = grouped.m_grouped_plan((hq, sh.t()), w2, y, m_index, routed.row_weight, design=down_design)
    down((hq, sh.t()), w2, y, stream, m_index, row_scale=routed.row_weight)
    # 5. combine
    bt, bn = cutile_heuristics.MOE_COMBINE_BT, cutile_heuristics.combine_bn(hidden_dim)
    grid = (launch.cdiv(num_tokens, bt), hidden_dim // bn, 1)
    launch.launch(moe.get_kernel("combine"), grid, (y, routed.dest, out, top_k, bt, bn), stream)
    return out
