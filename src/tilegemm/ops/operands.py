"""The ground floor both kernel backends' host paths stand on (torch only): :func:`cdiv`, how an operand reaches
a TMA-reading kernel (the one TMA contract, :func:`tma_ready`, and the copies that meet it), a k-grouped call's
K offsets (:func:`k_offsets`) and the ``nt`` k-grouped op's per-group blocks gathered (:func:`k_grouped_nt_as_tn`).

Both kernel backends read their tiles by TMA, which needs a unit last stride, every other stride a multiple
of 16 bytes and a 16-byte aligned base.
"""

from __future__ import annotations

import functools

import torch

ALIGN_BYTES = 16


def cdiv(x: int, y: int) -> int:
    """Ceiling division of non-negative ints: ``ceil(x / y)``."""
    return -(-x // y)


def tma_ready(x: torch.Tensor) -> bool:
    """True if ``x`` is what the JIT needs to see to read it with TMA.

    Unit last stride, every other stride a multiple of 16 bytes, a 16-byte aligned base (the strides of
    dimensions of size 1 are never used, so they do not count).
    """
    es = x.element_size()
    for dim, (size, stride) in enumerate(zip(x.shape, x.stride())):
        if size > 1 and (stride != 1 if dim == x.dim() - 1 else (stride * es) % ALIGN_BYTES != 0):
            return False
    return x.data_ptr() % ALIGN_BYTES == 0


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """Row-major copy of ``x`` (any rank from 1) whose last-dimension pitch is padded to 16 bytes (same logical
    shape), so it is :func:`tma_ready`.

    The padding columns are uninitialized; kernels never read them (tile loads are bounded by the shape).
    """
    cols = x.shape[-1]
    per = ALIGN_BYTES // x.element_size()
    pitch = max(per, cdiv(cols, per) * per)
    buf = torch.empty((*x.shape[:-1], pitch), dtype=x.dtype, device=x.device)
    out = buf[..., :cols]
    out.copy_(x)
    return out


def as_row_major(x: torch.Tensor, pad_rows: bool = True) -> torch.Tensor:
    """``x`` itself when it is :func:`tma_ready`, else a row-major copy.

    ``pad_rows``: the copy's rows are padded to 16 bytes (:func:`aligned_copy`), so it is TMA ready. Otherwise the
    copy is ``x.contiguous()``, TMA ready when a row is a multiple of 16 bytes.
    """
    if tma_ready(x):
        return x
    return aligned_copy(x) if pad_rows else x.contiguous()


def k_offsets(ks: list[int], ks_tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """int32 [G + 1] offsets of a k-grouped call's K ranges (0, then the prefix sums of ``ks``) on ``device``: from
    ``ks_tensor`` (the device mirror of ``ks``) when given, else kept per ``ks``."""
    if ks_tensor is not None:
        sums = torch.cumsum(ks_tensor.to(device=device, dtype=torch.int32), 0, dtype=torch.int32)
        return torch.cat([sums.new_zeros(1), sums])
    return _kept_offsets(tuple(int(k) for k in ks), device)


def gathered_k_major(data: torch.Tensor, ks: list[int], mn: int) -> torch.Tensor:
    """DeepGEMM's per-group K-major buffer (contiguous, ``sum(ks) * mn`` elements: group g's ``[mn, ks[g]]`` block
    row-major, groups back to back) as one [mn, K_sum] matrix (a copy)."""
    flat, parts, start = data.reshape(-1), [], 0
    for kg in ks:
        parts.append(flat[start * mn : (start + kg) * mn].view(mn, kg))
        start += kg
    return torch.cat(parts, dim=1) if parts else flat.new_empty(mn, 0)


def k_grouped_nt_as_tn(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], ks: list[int], m: int, n: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The ``nt`` k-grouped FP8 op's operands (data: each group's K-major [M, K_g] / [N, K_g] block back to back;
    scales [M, K_sum/128] / [N, K_sum/128]) in the ``tn`` op's form: ([K_sum, M] data, [K_sum/128, M] scales) and
    the same for B. The data is gathered (:func:`gathered_k_major`, one copy each), the scales are views."""
    (a_data, sa), (b_data, sb) = a, b
    return (gathered_k_major(a_data, ks, m).t(), sa.t()), (gathered_k_major(b_data, ks, n).t(), sb.t())


@functools.lru_cache(maxsize=256)
def _kept_offsets(ks: tuple[int, ...], device: torch.device) -> torch.Tensor:
    prefix = [0]
    for k in ks:
        prefix.append(prefix[-1] + k)
    return torch.tensor(prefix, dtype=torch.int32).to(device)
