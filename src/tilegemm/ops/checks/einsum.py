"""Checks of DeepGEMM's einsum ops (BF16 and FP8) and ``tf32_hc_prenorm_gemm``."""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.ops.checks.base import (
    BLOCK,
    OUT_DTYPES,
    _addend,
    _bool,
    _gemm_placement,
    _gran_k,
    _int,
    _int_tuple,
    _operands,
    _output,
    _shape,
    _tensor,
)
from tilegemm.ops.common import cdiv

#: DeepGEMM's einsum expressions: expr -> (a dims, b dims, d dims), each a string of dim letters.
EINSUM_EXPRS = {
    "bmk,bnk->mn": ("bmk", "bnk", "mn"),
    "bhr,hdr->bhd": ("bhr", "hdr", "bhd"),
    "bhd,hdr->bhr": ("bhd", "hdr", "bhr"),
}
#: DeepGEMM's FP8 einsum expressions: expr -> (a dims, b dims, d dims, K letter).
FP8_EINSUM_EXPRS = {
    "bhr,hdr->bhd": ("bhr", "hdr", "bhd", "r"),
    "bhd,hdr->bhr": ("bhd", "hdr", "bhr", "d"),
    "bhd,bhr->hdr": ("bhd", "bhr", "hdr", "b"),
}


def _einsum_sizes(expr: str, a_dims: str, b_dims: str, a: torch.Tensor, b: torch.Tensor) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, dims, x in (("a", a_dims, a), ("b", b_dims, b)):
        for letter, size in zip(dims, x.shape):
            if sizes.setdefault(letter, size) != size:
                raise ValueError(
                    f"{name}: dim {letter!r} has size {size}, but another operand has {sizes[letter]} ({expr})"
                )
    return sizes


def _einsum_expr(expr: Any, table: dict[str, tuple]) -> tuple:
    if not isinstance(expr, str):
        raise TypeError(f"expr: got {type(expr).__name__} {expr!r}, expected a str, one of {sorted(table)}")
    if expr not in table:
        raise ValueError(f"expr: got {expr!r}, expected one of {sorted(table)} (DeepGEMM's einsum expressions)")
    return table[expr]


def einsum_check(expr, a, b, d, c=None, use_cublaslt=False, *, stream=None) -> dict[str, Any]:
    """The check of ``einsum`` (BF16); derived: ``expr``, ``a``, ``b``, ``d``, ``c``, ``stream``."""
    a_dims, b_dims, d_dims = _einsum_expr(expr, EINSUM_EXPRS)
    _tensor("a", a, (torch.bfloat16,), 3)
    _tensor("b", b, (torch.bfloat16,), 3)
    sizes = _einsum_sizes(expr, a_dims, b_dims, a, b)
    out_shape = [sizes[x] for x in d_dims]
    _output("d", d, OUT_DTYPES, out_shape, f"[{', '.join(d_dims.upper())}]")
    if c is not None:
        _tensor("c", c, (d.dtype,), len(out_shape))
        _shape("c", c, out_shape, "d's shape")
    _bool("use_cublaslt", use_cublaslt)
    _gemm_placement(stream, a, None, b, None, d=d, c=c)
    return dict(expr=expr, a=a, b=b, d=d, c=c, stream=stream)


def fp8_einsum_check(expr, a, b, d, c=None, recipe=(1, 128, 128), *, stream=None) -> dict[str, Any]:
    """The check of ``fp8_einsum``: scales in the data's orientation, ``/128`` along K (and along N for 128x128).

    ``bhr,hdr->bhd`` / ``bhd,hdr->bhr``: sa ``[B, H, K/128]``; sb ``[H, D/128, R/128]`` (recipe
    ``(1, 128, 128)``). ``bhd,bhr->hdr`` (recipe ``(1, 1, 128)``): sa ``[B/128, H, D]``, sb ``[B/128, H, R]``.
    Derived: ``expr``, ``a``, ``b``, ``d``, ``c``, ``recipe``, ``stream``.
    """
    a_dims, b_dims, d_dims, k_dim = _einsum_expr(expr, FP8_EINSUM_EXPRS)
    a_data, sa, b_data, sb = _operands(True, a, b, 3, 3)
    sizes = _einsum_sizes(expr, a_dims, b_dims, a_data, b_data)
    rec = _int_tuple("recipe", recipe, 3)
    _gran_k("recipe", rec[2])
    want = (1, 1, 128) if k_dim == "b" else (1, 128, 128)
    if rec != want:
        raise ValueError(f"recipe: {expr} takes recipe {want}, got {rec}")

    def scale_shape(dims: str, per_block: str) -> list[int]:
        return [cdiv(sizes[x], BLOCK) if x in per_block else sizes[x] for x in dims]

    if k_dim == "b":
        sa_shape, sb_shape = scale_shape(a_dims, "b"), scale_shape(b_dims, "b")
    else:
        sa_shape, sb_shape = scale_shape(a_dims, k_dim), scale_shape(b_dims, "dr")
    _shape("a[1] (scales)", sa, sa_shape, "in the data's orientation")
    _shape("b[1] (scales)", sb, sb_shape, "in the data's orientation")
    out_shape = [sizes[x] for x in d_dims]
    _output("d", d, OUT_DTYPES, out_shape, f"[{', '.join(d_dims.upper())}]")
    _addend(c, OUT_DTYPES, out_shape, "d's shape")
    _gemm_placement(stream, a_data, sa, b_data, sb, d=d, c=c)
    return dict(expr=expr, a=(a_data, sa), b=(b_data, sb), d=d, c=c, recipe=rec, stream=stream)


def tf32_hc_prenorm_gemm_check(a, b, d, sqr_sum, num_splits=None, *, stream=None) -> dict[str, Any]:
    """The check of ``tf32_hc_prenorm_gemm``; derived: ``a``, ``b``, ``d``, ``sqr_sum``, ``num_splits``, ``stream``."""
    _tensor("a", a, (torch.bfloat16,), 2)
    _tensor("b", b, (torch.float32,), 2)
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"a [M, K] has shape {list(a.shape)} but b [N, K] has {list(b.shape)}")
    if num_splits is None:
        _output("d", d, (torch.float32,), [m, n], "[M, N]")
        _output("sqr_sum", sqr_sum, (torch.float32,), [m], "[M]")
    else:
        _int("num_splits", num_splits, 1)
        _output("d", d, (torch.float32,), [num_splits, m, n], "[num_splits, M, N]")
        _output("sqr_sum", sqr_sum, (torch.float32,), [num_splits, m], "[num_splits, M]")
    _gemm_placement(stream, a, None, b, None, d=d, sqr_sum=sqr_sum)
    return dict(a=a, b=b, d=d, sqr_sum=sqr_sum, num_splits=num_splits, stream=stream)
