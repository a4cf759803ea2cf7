"""Calling public ops on any float dtype: bf16 on the chosen backend, fp16/fp32 exactly; no host syncs."""

from __future__ import annotations

import torch

from tilegemm.ops import api
from tilegemm.ops.checks import allow_float_operands, skip_value_checks


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """GEMM output dtype: the ops write bf16 or fp32; fp16 models get fp32 rounded once to fp16 after."""
    return dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32


def run_op(name: str, backend: str | None, **arguments) -> torch.Tensor:
    """Call public op ``name`` with indices we built ourselves (value checks skipped: no host sync).

    Operands that are not bf16/fp8 (fp32 and fp16 models) go through the same op and its checks with
    fp16/fp32 operands allowed, on the ``pytorch`` backend, which computes in fp32 from any float input
    (exact for fp32 and fp16), so those models stay exact.
    """
    first = arguments["a"][0] if isinstance(arguments["a"], tuple) else arguments["a"]
    with skip_value_checks():
        if first.dtype in (torch.bfloat16, torch.float8_e4m3fn):
            return getattr(api, name)(**arguments, backend=backend)
        with allow_float_operands():
            return getattr(api, name)(**arguments, backend="pytorch")


def grouped_linear(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, transposed: bool, backend: str | None
) -> torch.Tensor:
    """``y[r] = x[r] @ W[g(r)].T`` (or ``@ W[g(r)]`` when ``transposed``) for rows grouped by ``offs``.

    x: [S, K] sorted by group; weight: [E, N, K] (``[E, K, N]`` when ``transposed``); offs: int32 [E]
    cumulative ends in ``torch._grouped_mm``'s unaligned meaning (``alignment=1``). Rows past ``offs[-1]``
    come out 0. Returns [S, N] in ``x.dtype``.
    """
    n = weight.shape[-1] if transposed else weight.shape[-2]
    d = torch.empty(x.shape[0], n, dtype=out_dtype(x.dtype), device=x.device)
    name = "m_grouped_bf16_gemm_nn_contiguous" if transposed else "m_grouped_bf16_gemm_nt_contiguous"
    run_op(name, backend, a=x, b=weight, d=d, grouped_layout=offs, use_psum_layout=True, alignment=1)
    return d if d.dtype == x.dtype else d.to(x.dtype)


def grouped_linear_fp8(
    x: torch.Tensor, weight_fp8: tuple[torch.Tensor, torch.Tensor], offs: torch.Tensor, backend: str | None
) -> torch.Tensor:
    """FP8 ``y[r] = x[r] @ W[g(r)].T``: x cast per token (1x128 scales), W pre-quantized ``(fp8 [E,N,K], sb)``.

    x: [S, K] bf16/fp16/fp32 sorted by group; offs: int32 [E] cumulative ends (``alignment=1``; rows past
    ``offs[-1]`` come out 0). Returns [S, N] in ``x.dtype`` (the op writes bf16, or fp32 for fp32/fp16 inputs).
    """
    from tilegemm.quant import per_token_cast_to_fp8

    x_fp8 = per_token_cast_to_fp8(x.contiguous())
    d = torch.empty(x.shape[0], weight_fp8[0].shape[-2], dtype=out_dtype(x.dtype), device=x.device)
    run_op(
        "m_grouped_fp8_gemm_nt_contiguous",
        backend,
        a=x_fp8,
        b=weight_fp8,
        d=d,
        grouped_layout=offs,
        use_psum_layout=True,
        alignment=1,
    )
    return d if d.dtype == x.dtype else d.to(x.dtype)
