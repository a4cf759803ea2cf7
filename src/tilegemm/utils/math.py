"""DeepGEMM's ``deep_gemm.utils.math``: integer rounding, FP8 casts (``tilegemm.quant``'s) and the FP4 helpers.

FP4 is E2M1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), two codes per int8 byte, the even element in
the low nibble; a scale per row per ``gran_k`` elements, ``scale = amax / 6`` (``amax`` clamped at 1e-4), rounded up
to a power of two with ``use_ue8m0``. tilegemm's ops take no FP4 operands (Hopper has no FP4 MMA); these helpers
are here so that code preparing FP4 data (DeepGEMM's test generators) runs unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tilegemm.config import check_int
from tilegemm.quant import (  # noqa: F401  (the FP8 casts are re-exported: DeepGEMM's deep_gemm.utils.math names)
    AMAX_EPS,
    ceil_to_ue8m0,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_token_cast_to_fp8,
)

#: The largest float8_e4m3fn value and the E2M1 magnitudes by code (0-7).
FP8_MAX = 448.0
FP4_MAX = 6.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for ints ``x >= 0``, ``y >= 1``."""
    check_int("y", y, 1)
    return (check_int("x", x, 0) + y - 1) // y


def align(x: int, y: int) -> int:
    """The smallest multiple of ``y`` that is ``>= x`` (ints ``x >= 0``, ``y >= 1``)."""
    return ceil_div(x, y) * y


def per_custom_dims_cast_to_fp8(
    x: torch.Tensor, dims: tuple[int, ...], use_ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to float8_e4m3fn with one scale per index of the dims ``dims`` (amax over every other dim).

    Returns ``(q, s)``: ``q`` float8_e4m3fn of ``x``'s shape, ``s`` fp32 with the kept dims' sizes (size-1 dims
    squeezed), ``x ~= q * s`` broadcast along the reduced dims; ``scale = max(amax, 1e-4) / 448``, a power of two
    with ``use_ue8m0``.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x: got {type(x).__name__}, expected a floating torch.Tensor")
    kept = {d % x.dim() for d in dims}
    reduced = tuple(i for i in range(x.dim()) if i not in kept)
    amax = x.abs().float().amax(dim=reduced, keepdim=True) if reduced else x.abs().float()
    scale = amax.clamp(min=AMAX_EPS) / FP8_MAX
    scale = ceil_to_ue8m0(scale) if use_ue8m0 else scale
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.squeeze()


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (int8, sign in bit 3) of fp32 ``v`` in ``[-6, 6]``, to nearest, ties toward the smaller magnitude."""
    mids = torch.tensor([(a + b) / 2 for a, b in zip(_E2M1, _E2M1[1:])], dtype=torch.float32, device=v.device)
    mag = torch.bucketize(v.abs().contiguous(), mids).to(torch.uint8)  # number of midpoints strictly below |v|
    sign = ((v < 0) & (mag != 0)).to(torch.uint8) << 3
    return (mag | sign).view(torch.int8)


def per_token_cast_to_fp4(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [M, N]`` (N even) to packed E2M1 with one scale per row per ``gran_k`` columns.

    Returns ``(packed, s)``: int8 ``[M, N / 2]`` (column ``2j`` in the low nibble of byte ``j``, ``2j + 1`` in the
    high one) and fp32 ``s [M, ceil(N / gran_k)]`` with ``x[m, n] ~= e2m1(code[m, n]) * s[m, n // gran_k]``.
    With ``use_packed_ue8m0`` (needs ``use_ue8m0``) the scales are packed four to an int32 (padded with 1.0).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor, got {getattr(x, 'shape', type(x).__name__)}")
    m, n = x.shape
    if n % 2:
        raise ValueError(f"x: got {n} columns, expected an even number (two FP4 codes per byte)")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("use_packed_ue8m0: needs use_ue8m0=True")
    kb = ceil_div(n, check_int("gran_k", gran_k, 1))
    xf = F.pad(x.float(), (0, kb * gran_k - n)).view(m, kb, gran_k)
    scale = xf.abs().amax(dim=2).clamp(min=AMAX_EPS) / FP4_MAX
    scale = ceil_to_ue8m0(scale) if use_ue8m0 else scale
    codes = _e2m1_codes(xf / scale.unsqueeze(2)).view(m, kb * gran_k)[:, :n]
    packed = (codes[:, 0::2] & 0x0F) | ((codes[:, 1::2] & 0x0F) << 4)
    if use_packed_ue8m0:
        pad = -scale.shape[-1] % 4
        return packed.contiguous(), pack_ue8m0_to_int(F.pad(scale, (0, pad), value=1.0))
    return packed.contiguous(), scale


def _unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """int8 ``[R, C / 2]`` of packed E2M1 pairs -> int8 codes ``[R, C]`` (0-15)."""
    lo, hi = packed & 0x0F, (packed >> 4) & 0x0F
    return torch.stack((lo, hi), dim=-1).view(packed.shape[0], -1)


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """The packed E2M1 matrix of the transpose: int8 ``a [M, N / 2]`` (M even) -> int8 ``[N, M / 2]``."""
    if not isinstance(a, torch.Tensor) or a.dtype != torch.int8 or a.dim() != 2:
        raise TypeError(f"a: expected a 2-D int8 tensor of packed FP4, got {getattr(a, 'dtype', type(a).__name__)}")
    if a.shape[0] % 2:
        raise ValueError(f"a: got {a.shape[0]} rows, expected an even number (they become packed pairs)")
    codes = _unpack_codes(a).t().contiguous()
    return ((codes[:, 0::2] & 0x0F) | ((codes[:, 1::2] & 0x0F) << 4)).contiguous()


def unpack_ue8m0_from_int(packed_sf: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., K / 4]`` of packed UE8M0 exponent bytes -> fp32 powers of two ``[..., K]``."""
    return (packed_sf.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)


def cast_back_from_fp4(
    packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> torch.Tensor:
    """fp32 values ``[M, N]`` of packed E2M1 ``packed [M, N / 2]`` with scales ``sf [M, ceil(N / gran_k)]``
    (int32 packed UE8M0 with ``use_packed_ue8m0``)."""
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
    codes = _unpack_codes(packed).to(torch.int64)
    table = torch.tensor(_E2M1, dtype=torch.float32, device=packed.device)
    mag = table[codes & 0x07]
    values = torch.where((codes & 0x08) != 0, -mag, mag)
    cols = torch.arange(values.shape[1], device=packed.device) // gran_k
    return values * sf.float()[:, cols]
