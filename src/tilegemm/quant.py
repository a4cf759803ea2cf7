"""FP8 casts and scale-factor layouts with DeepGEMM's names and semantics.

* :func:`per_token_cast_to_fp8`: 1 x ``gran_k`` blocks along the last dim (LHS operands, 1x128 RHS rows).
* :func:`per_channel_cast_to_fp8`: ``gran_k`` x 1 blocks along the first dim (k-grouped operands).
* :func:`per_block_cast_to_fp8`: ``gran_k`` x ``gran_k`` blocks on the last two dims (RHS weights, 2-D or 3-D).
* :func:`get_tma_aligned_size`, :func:`get_mn_major_tma_aligned_tensor`,
  :func:`transform_sf_into_required_layout`: the scale layouts TMA-based kernels want (MN-major,
  MN padded to a 16-byte multiple).
* :func:`ceil_to_ue8m0`, :func:`pack_ue8m0_to_int`, :func:`get_mn_major_tma_aligned_packed_ue8m0_tensor`,
  :func:`get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor`: DeepGEMM's power-of-two (UE8M0)
  scales and their packed int32 layout (four exponent bytes per int, MN-major).

Scales are fp32 with ``scale = amax / 448`` (448 = largest ``float8_e4m3fn``), ``amax`` clamped at
``1e-4`` so all-zero blocks get a finite scale, rounded up to a power of two when ``use_ue8m0``;
``x ~= fp8 * scale``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tilegemm.ops.checks import quant as checks
from tilegemm.ops.common import AMAX_EPS, FP8_MAX, cdiv  # noqa: F401  (FP8_MAX, AMAX_EPS: public here too)

FP8_DTYPE = torch.float8_e4m3fn
#: Elements per scale along K (and along M/N for 128x128 blocks).
BLOCK = 128
#: TMA needs 16-byte aligned strides.
TMA_ALIGNMENT_BYTES = 16


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``|x|`` up to a power of two (an UE8M0 value); exponents clamped to ``2**-126 .. 2**127``.

    ``x`` is any real tensor (0-d included; computed in fp32); the result is fp32 of ``x``'s shape.
    """
    checks.ceil_to_ue8m0_check(x)
    bits = x.abs().float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """Pack fp32 powers of 2 ``[..., K]`` (K a multiple of 4) into int32 ``[..., K / 4]``, four exponent bytes each."""
    checks.pack_ue8m0_check(x)
    bits = x.contiguous().view(torch.int32)
    return (bits >> 23).to(torch.uint8).view(torch.int32)


def _scale(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    scale = amax.clamp(min=AMAX_EPS) / FP8_MAX
    return ceil_to_ue8m0(scale) if use_ue8m0 else scale


def per_token_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = BLOCK, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` to FP8 with one scale per row per ``gran_k`` elements of K.

    Args:
        x: floating tensor ``[..., K]`` (any K; it is zero-padded to a multiple of ``gran_k`` internally).
        use_ue8m0: round each scale up to a power of two (DeepGEMM's UE8M0 scales).
        gran_k: elements of K per scale.
        use_packed_ue8m0: return the UE8M0 scales packed four to an int32 (needs ``use_ue8m0``).

    Returns:
        ``(q, s)``: ``q`` float8_e4m3fn ``[..., K]`` and ``s`` fp32 ``[..., ceil(K/gran_k)]`` with
        ``x[..., k] ~= q[..., k] * s[..., k // gran_k]`` (int32 ``[..., ceil(K/gran_k) / 4]`` when packed).
    """
    checks.quant_input_check("per_token_cast_to_fp8", x, 1, None, gran_k, use_ue8m0)
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("per_token_cast_to_fp8: use_packed_ue8m0 needs use_ue8m0=True")
    k = x.shape[-1]
    kb = cdiv(k, gran_k)
    xf = F.pad(x.float(), (0, kb * gran_k - k)).view(*x.shape[:-1], kb, gran_k)
    scale = _scale(xf.abs().amax(dim=-1, keepdim=True), use_ue8m0)
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    sf = scale.squeeze(-1)
    return q.view(*x.shape[:-1], kb * gran_k)[..., :k].contiguous(), pack_ue8m0_to_int(sf) if use_packed_ue8m0 else sf


def per_channel_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [K, N]`` to FP8 with one scale per column per ``gran_k`` rows (the k-grouped operands' form).

    Returns ``(q, s)``: ``q`` float8_e4m3fn ``[K, N]`` and ``s`` fp32 ``[ceil(K/gran_k), N]`` with
    ``x[k, n] ~= q[k, n] * s[k // gran_k, n]``.
    """
    checks.quant_input_check("per_channel_cast_to_fp8", x, 2, 2, gran_k, use_ue8m0)
    k, n = x.shape
    kb = cdiv(k, gran_k)
    xf = F.pad(x.float(), (0, 0, 0, kb * gran_k - k)).view(kb, gran_k, n)
    scale = _scale(xf.abs().amax(dim=1, keepdim=True), use_ue8m0)
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(kb * gran_k, n)
    return q[:k].contiguous(), scale.squeeze(1)


def per_block_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., N, K]`` (2-D or 3-D, e.g. ``[G, N, K]``) to FP8, one scale per ``gran_k`` x ``gran_k`` block.

    Args:
        x: floating tensor ``[..., N, K]``; N and K are zero-padded to multiples of ``gran_k`` internally.
        use_ue8m0: round each scale up to a power of two.
        gran_k: block edge.

    Returns:
        ``(q, s)``: ``q`` float8_e4m3fn ``[..., N, K]`` and ``s`` fp32 ``[..., ceil(N/gran_k), ceil(K/gran_k)]``
        with ``x[..., n, k] ~= q[..., n, k] * s[..., n // gran_k, k // gran_k]``.
    """
    checks.quant_input_check("per_block_cast_to_fp8", x, 2, None, gran_k, use_ue8m0)
    n, k = x.shape[-2], x.shape[-1]
    nb, kb = cdiv(n, gran_k), cdiv(k, gran_k)
    lead = x.shape[:-2]
    xf = F.pad(x.float(), (0, kb * gran_k - k, 0, nb * gran_k - n)).view(*lead, nb, gran_k, kb, gran_k)
    scale = _scale(xf.abs().amax(dim=(-3, -1), keepdim=True), use_ue8m0)
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(*lead, nb * gran_k, kb * gran_k)
    return q[..., :n, :k].contiguous(), scale.view(*lead, nb, kb)


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` rounded up so that ``x * element_size`` bytes is a multiple of 16 (TMA stride alignment).

    ``element_size`` must divide 16 (1, 2, 4, 8 or 16 bytes).
    """
    checks.tma_aligned_size_check(x, element_size)
    if element_size <= 0 or TMA_ALIGNMENT_BYTES % element_size != 0:
        raise ValueError(f"get_tma_aligned_size: element_size must divide 16, got {element_size}")
    step = TMA_ALIGNMENT_BYTES // element_size
    return cdiv(x, step) * step


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """The same scale values in MN-major, TMA-aligned storage.

    Args:
        sf: ``[MN, SF_K]`` or ``[G, MN, SF_K]`` (any strides; fp32 in practice).

    Returns:
        A tensor equal to ``sf`` (same shape and dtype) whose storage is MN-major: strides
        ``(1, A)`` for 2-D and ``(A * SF_K, 1, A)`` for 3-D, with ``A = get_tma_aligned_size(MN,
        element_size)``. The padding rows ``MN..A`` of the storage are unspecified. ``sf`` itself
        is returned when it already has that layout.
    """
    checks.scale_tensor_check("get_mn_major_tma_aligned_tensor", sf, 2, 3)
    batched = sf.unsqueeze(0) if sf.dim() == 2 else sf
    groups, mn, sf_k = batched.shape
    aligned = get_tma_aligned_size(mn, sf.element_size())
    ok_group_stride = sf.dim() == 2 or groups <= 1 or batched.stride(0) == aligned * sf_k
    ok_mn = mn <= 1 or batched.stride(1) == 1
    ok_k = batched.stride(2) == aligned  # also for one column: DeepGEMM's layout has strides (1, aligned)
    if ok_group_stride and ok_mn and ok_k:
        return sf
    out = torch.empty_strided((groups, aligned, sf_k), (aligned * sf_k, 1, aligned), dtype=sf.dtype, device=sf.device)
    out = out[:, :mn, :]
    out.copy_(batched)
    return out.squeeze(0) if sf.dim() == 2 else out


def transform_sf_into_required_layout(
    sf: torch.Tensor,
    mn: int,
    k: int,
    recipe: tuple[int, int, int] | tuple[int, int],
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: torch.Tensor | None = None,
) -> torch.Tensor:
    """Check fp32 scale factors against a recipe and return them in the layout the kernels read.

    Args:
        sf: fp32 ``[ceil(MN/gran_mn), ceil(K/gran_k)]``, or ``[num_groups, ...]`` of that when
            ``num_groups`` is given.
        mn, k: the operand's logical MN (M for LHS, N for RHS) and K sizes.
        recipe: ``(gran_m, gran_n, gran_k)`` with ``is_sfa`` saying which operand, or the operand's own
            ``(gran_mn, gran_k)`` with ``is_sfa=None`` (DeepGEMM's two forms).
        num_groups: number of groups for grouped operands (``sf`` is then 3-D).
        is_sfa: ``sf`` belongs to the LHS (granularity ``gran_m``) or to the RHS (``gran_n``).
        disable_ue8m0_cast: accepted for DeepGEMM compatibility; fp32 scales are never cast here.
        psum_layout: accepted for DeepGEMM compatibility (its SM100 packing skips psum gap rows); no effect.

    Returns:
        For per-row scales (``gran_mn == 1``, ``gran_k == 128``): the MN-major TMA-aligned tensor of
        :func:`get_mn_major_tma_aligned_tensor`. For 128x128 blocks (``gran_mn == 128``): ``sf``
        as a contiguous (K-major) tensor, as DeepGEMM keeps it on Hopper.

    Raises:
        NotImplementedError: packed UE8M0 (int32) scale factors (DeepGEMM's SM100 form).
        TypeError: ``sf`` is not an fp32 tensor; ``mn``, ``k``, ``num_groups`` or ``recipe`` are not ints,
            ``is_sfa`` or ``disable_ue8m0_cast`` not bools.
        ValueError: a shape that does not match the recipe, an unsupported recipe, or ``is_sfa``
            inconsistent with the recipe's form.
    """
    if isinstance(sf, torch.Tensor) and sf.dtype == torch.int32:
        raise NotImplementedError("transform_sf_into_required_layout: packed UE8M0 (int32) scales are SM100-only")
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32:
        got = sf.dtype if isinstance(sf, torch.Tensor) else type(sf).__name__
        raise TypeError(f"transform_sf_into_required_layout: sf must be a float32 tensor, got {got}")
    recipe = checks.transform_sf_check(mn, k, recipe, num_groups, is_sfa, disable_ue8m0_cast)
    if len(recipe) == 3:
        if is_sfa is None:
            raise ValueError("transform_sf_into_required_layout: a 3-element recipe needs is_sfa=True or False")
        gran_mn = int(recipe[0] if is_sfa else recipe[1])
    elif len(recipe) == 2:
        if is_sfa is not None:
            raise ValueError("transform_sf_into_required_layout: a (gran_mn, gran_k) recipe takes is_sfa=None")
        gran_mn = int(recipe[0])
    else:
        raise ValueError(f"transform_sf_into_required_layout: recipe must have 2 or 3 elements, got {recipe}")
    gran_k = int(recipe[-1])
    if (gran_mn, gran_k) not in ((1, BLOCK), (BLOCK, BLOCK)):
        raise ValueError(
            f"transform_sf_into_required_layout: unsupported granularity (mn={gran_mn}, k={gran_k}) from recipe "
            f"{tuple(recipe)} (is_sfa={is_sfa}); need (1, 128) or (128, 128)"
        )
    expected = (cdiv(mn, gran_mn), cdiv(k, gran_k))
    if num_groups is not None:
        expected = (num_groups, *expected)
    if tuple(sf.shape) != expected:
        raise ValueError(
            f"transform_sf_into_required_layout: sf has shape {tuple(sf.shape)}, need {expected} for "
            f"mn={mn}, k={k}, recipe={tuple(recipe)}, num_groups={num_groups}, is_sfa={is_sfa}"
        )
    if gran_mn == 1:
        return get_mn_major_tma_aligned_tensor(sf)
    return sf.contiguous()


def _ue8m0_bytes(sf: torch.Tensor) -> torch.Tensor:
    """The exponent byte of each fp32 power of two (uint8, same shape)."""
    if sf.dtype != torch.float32:
        raise TypeError(f"UE8M0 packing: sf must be fp32 powers of two, got {sf.dtype}")
    return (sf.contiguous().view(torch.int32) >> 23).to(torch.uint8)


def _pack_last_dim(e: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., K]`` -> int32 ``[..., ceil(K/4)]``: bytes ``4i .. 4i+3`` (zero-padded), little-endian, in int i."""
    k = e.shape[-1]
    return F.pad(e, (0, cdiv(k, 4) * 4 - k)).contiguous().view(torch.int32)


def get_mn_major_tma_aligned_packed_ue8m0_tensor(
    sf: torch.Tensor, psum_layout: torch.Tensor | None = None
) -> torch.Tensor:
    """Pack fp32 UE8M0 scales ``[MN, SF_K]`` (or ``[G, MN, SF_K]``) into DeepGEMM's SM100 layout.

    Returns int32 ``[..., MN, ceil(SF_K/4)]`` whose int ``i`` holds the exponent bytes of scales
    ``4i .. 4i+3`` (zero bytes past SF_K), stored MN-major with strides ``(A * ceil(SF_K/4), 1, A)``,
    ``A = get_tma_aligned_size(MN, 4)``. ``psum_layout`` is accepted for compatibility: gap rows are
    packed like any other row.
    """
    checks.scale_tensor_check("get_mn_major_tma_aligned_packed_ue8m0_tensor", sf, 2, 3)
    batched = sf.unsqueeze(0) if sf.dim() == 2 else sf
    groups, mn, sf_k = batched.shape
    packed = _pack_last_dim(_ue8m0_bytes(batched))  # [G, MN, ceil(SF_K/4)]
    aligned = get_tma_aligned_size(mn, 4)
    kp = packed.shape[-1]
    out = torch.zeros((groups, kp, aligned), dtype=torch.int32, device=sf.device).mT[:, :mn, :]
    out.copy_(packed)
    return out.squeeze(0) if sf.dim() == 2 else out


def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
    sf: torch.Tensor,
    grouped_layout: torch.Tensor,
    ks_cpu: list[int] | None,
    gran_k: int,
    k_alignment: int,
    use_psum_layout: bool = False,
) -> torch.Tensor:
    """Pack k-grouped fp32 UE8M0 scales ``[sum_g ceil(k_g/gran_k), MN]`` per group into int32 rows.

    Group g's ``ceil(k_g/gran_k)`` scale rows become ``ceil(k_g/(4 gran_k))`` int32 rows (four exponent
    bytes each, zero-padded within the group); the groups' rows are concatenated: int32
    ``[sum_g ceil(k_g/(4 gran_k)), MN]``. ``k_g`` is ``ks_cpu[g]``, or with ``use_psum_layout`` the group's
    size from the cumulative ends ``grouped_layout`` (group g spans ``[align(end[g-1], k_alignment), end[g])``;
    this reads ``grouped_layout`` on the host).
    """
    checks.k_grouped_ue8m0_check(sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout)
    if use_psum_layout:
        ends = [int(e) for e in grouped_layout.tolist()]
        starts = [0] + [cdiv(e, k_alignment) * k_alignment for e in ends[:-1]]
        ks = [max(0, e - s) for s, e in zip(starts, ends)]
    else:
        ks = list(ks_cpu) if ks_cpu else [int(k) for k in grouped_layout.tolist()]
    e = _ue8m0_bytes(sf)
    parts, row = [], 0
    for k in ks:
        rows = cdiv(k, gran_k)
        parts.append(_pack_last_dim(e[row : row + rows].t()).t())
        row += rows
    if not parts:
        return torch.empty((0, sf.shape[1]), dtype=torch.int32, device=sf.device)
    return torch.cat(parts)
