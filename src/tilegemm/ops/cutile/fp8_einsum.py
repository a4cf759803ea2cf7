"""cuTile ``fp8_einsum``: DeepGEMM's FP8 expressions composed from the grouped FP8 GEMMs (``ops/cutile/grouped.py``).

Each expression is a batch of per-head block-scaled GEMMs, so it maps onto one launch of a grouped kernel
(promotion of every 128-wide K block into the fp32 sum, as in every FP8 kernel of the backend):

* ``bhr,hdr->bhd`` (K = r): the masked m-grouped FP8 GEMM, one group per head with all ``B`` rows valid:
  ``x [B, H, R]`` and its per-token scales ``[B, H, R/128]`` go in as ``[H, B, *]`` views, ``y [H, D, R]``
  with its ``[H, D/128, R/128]`` blocks as they are, ``d`` as its ``[H, B, D]`` view. No copies.
* ``bhd,hdr->bhr`` (K = d; DeepGEMM runs it on SM100 only): the same kernel on ``y`` copied K-major to
  ``[H, R, D]`` (Hopper FP8 MMAs read K-major operands only, the dense FP8 ``nn`` path copies likewise)
  with its scales transposed to ``[H, R/128, D/128]``.
* ``bhd,bhr->hdr`` (K = b, recipe ``(1, 1, 128)``; DeepGEMM: SM100 only): the k-grouped FP8 GEMM with one
  group of ``B`` K rows per head; ``x``/``y`` are copied once to the K-major ``[D, H * B]`` / ``[R, H * B]``
  layout the kernel reads, their ``[B/128, H, *]`` scales to ``[H * B/128, *]``. ``B`` must be a multiple
  of 128 (a head's K range of whole scale blocks); ``c`` is the k-grouped op's own ``c`` for an fp32 ``d``.

``c`` is otherwise added in fp32 through a temporary before the one rounding (the reference's epilogue).
"""

from __future__ import annotations

from typing import Any

import torch

from tilegemm.backend.registry import Unsupported, get_impl, register_impl
from tilegemm.ops.cutile.einsum import masked_hint, rows_tensor, separate_addend, with_addend

_MASKED = "m_grouped_fp8_fp4_gemm_nt_masked"
_K_GROUPED = "k_grouped_fp8_gemm_tn_contiguous"


def _masked_heads(a: tuple, b: tuple, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[x, h] = A_h[x] . B_h`` for a = ``(x [B, H, K], sx [B, H, K/128])``, b = ``(y [H, N, K], sy [H, N/128,
    K/128])``, d ``[B, H, N]``: the masked FP8 GEMM over ``[H, B, *]`` views."""
    (x, sx), (y, sy) = a, b
    batch, heads = x.shape[0], x.shape[1]
    masked = get_impl(_MASKED, "cutile")
    masked_m = rows_tensor(heads, batch, d.device)
    lhs = (x.transpose(0, 1), sx.transpose(0, 1))

    def run(out: torch.Tensor) -> None:
        hint = masked_hint(batch, out.dtype)
        masked(a=lhs, b=(y, sy), d=out.transpose(0, 1), masked_m=masked_m, expected_m=hint, stream=stream)

    return with_addend(d, c, run)


def bhr_hdr_bhd(a: tuple, b: tuple, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[x, h] = y[h] @ x[x, h]``: the weights ``y [H, D, R]`` are already K-major."""
    return _masked_heads(a, b, d, c, stream)


def bhd_hdr_bhr(a: tuple, b: tuple, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[x, h] = x[x, h] @ y[h]``: ``y [H, D, R]`` copied K-major to ``[H, R, D]``, scales transposed with it."""
    y, sy = b
    y_t = y.view(torch.uint8).transpose(1, 2).contiguous().view(y.dtype)  # byte copy: no float8 kernel needed
    return _masked_heads(a, (y_t, sy.transpose(1, 2).contiguous()), d, c, stream)


def _k_major_heads(x: torch.Tensor) -> torch.Tensor:
    """``x [B, H, M]`` as the ``[H * B, M]`` view of a K-major ``[M, H * B]`` copy (each head's B rows in turn)."""
    batch, heads, cols = x.shape
    k_major = x.view(torch.uint8).permute(2, 1, 0).contiguous().view(x.dtype)
    return k_major.view(cols, heads * batch).t()


def bhd_bhr_hdr(a: tuple, b: tuple, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[h] = x[:, h].T @ y[:, h] (+ c)``: the k-grouped FP8 GEMM with one K range of ``B`` rows per head."""
    (x, sx), (y, sy) = a, b
    batch, heads = x.shape[0], x.shape[1]
    if batch % 128:
        raise Unsupported("fp8_einsum bhd,bhr->hdr: B must be a multiple of 128 (whole scale blocks per head)")
    if heads == 0 or d.numel() == 0:
        return d
    ks = [batch] * heads
    ks_tensor = rows_tensor(heads, batch, d.device)
    lhs = (_k_major_heads(x), sx.permute(1, 0, 2).reshape(-1, sx.shape[2]))
    rhs = (_k_major_heads(y), sy.permute(1, 0, 2).reshape(-1, sy.shape[2]))
    k_grouped = get_impl(_K_GROUPED, "cutile")

    if d.dtype == torch.float32:  # the k-grouped op writes fp32 and adds c itself
        out, addend = d, separate_addend(d, c)
    else:
        out, addend = torch.empty(d.shape, dtype=torch.float32, device=d.device), None
    k_grouped(a=lhs, b=rhs, d=out, ks_cpu=ks, grouped_layout=ks_tensor, c=addend, stream=stream)
    if out is not d:
        d.copy_(out if c is None else out.add_(c.to(torch.float32)))
    return d


EXPRESSIONS = {"bhr,hdr->bhd": bhr_hdr_bhd, "bhd,hdr->bhr": bhd_hdr_bhr, "bhd,bhr->hdr": bhd_bhr_hdr}


@register_impl("fp8_einsum", "cutile")
def fp8_einsum(expr, a, b, d, c, recipe, stream):
    """cuTile FP8 einsum (see the module docstring for how each expression maps onto the grouped kernels)."""
    path = EXPRESSIONS.get(expr)
    if path is None:
        raise Unsupported(f"fp8_einsum expression {expr!r}")
    return path(a, b, d, c, stream)
