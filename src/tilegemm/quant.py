"""FP8 casts and scale-factor layouts with DeepGEMM's names and semantics.

* :func:`per_token_cast_to_fp8`: 1x128 blocks along the last dim (LHS operands, 1x128 RHS rows).
* :func:`per_block_cast_to_fp8`: 128x128 blocks on the last two dims (RHS weights, 2-D or 3-D).
* :func:`get_tma_aligned_size`, :func:`get_mk_alignment_for_contiguous_layout`,
  :func:`get_mn_major_tma_aligned_tensor`, :func:`transform_sf_into_required_layout`: the scale
  layouts TMA-based kernels want (MN-major, MN padded to a 16-byte multiple).

Scales are fp32 with ``scale = amax / 448`` (448 = largest ``float8_e4m3fn``), ``amax`` clamped at
``1e-4`` so all-zero blocks get a finite scale; ``x ~= fp8 * scale``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
#: Largest finite ``float8_e4m3fn`` value.
FP8_MAX = 448.0
#: Lower clamp of a block's absolute maximum before it becomes a scale.
AMAX_EPS = 1e-4
#: Elements per scale along K (and along M/N for 128x128 blocks).
BLOCK = 128
#: TMA needs 16-byte aligned strides.
TMA_ALIGNMENT_BYTES = 16


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def per_token_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` to FP8 with one scale per row per 128 elements of K.

    Args:
        x: floating tensor ``[..., K]`` (any K; it is zero-padded to a multiple of 128 internally).

    Returns:
        ``(q, s)``: ``q`` float8_e4m3fn ``[..., K]`` and ``s`` fp32 ``[..., ceil(K/128)]`` with
        ``x[..., k] ~= q[..., k] * s[..., k // 128]``.
    """
    k = x.shape[-1]
    kb = _ceil_div(k, BLOCK)
    xf = F.pad(x.float(), (0, kb * BLOCK - k)).view(*x.shape[:-1], kb, BLOCK)
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_EPS)
    scale = amax / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(*x.shape[:-1], kb * BLOCK)[..., :k].contiguous(), scale.squeeze(-1)


def per_block_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., N, K]`` (2-D or 3-D, e.g. ``[G, N, K]``) to FP8 with one scale per 128x128 block.

    Args:
        x: floating tensor ``[..., N, K]``; N and K are zero-padded to multiples of 128 internally.

    Returns:
        ``(q, s)``: ``q`` float8_e4m3fn ``[..., N, K]`` and ``s`` fp32 ``[..., ceil(N/128), ceil(K/128)]``
        with ``x[..., n, k] ~= q[..., n, k] * s[..., n // 128, k // 128]``.
    """
    if x.dim() < 2:
        raise ValueError(f"per_block_cast_to_fp8: x must have at least 2 dims [..., N, K], got shape {tuple(x.shape)}")
    n, k = x.shape[-2], x.shape[-1]
    nb, kb = _ceil_div(n, BLOCK), _ceil_div(k, BLOCK)
    lead = x.shape[:-2]
    xf = F.pad(x.float(), (0, kb * BLOCK - k, 0, nb * BLOCK - n)).view(*lead, nb, BLOCK, kb, BLOCK)
    amax = xf.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=AMAX_EPS)
    scale = amax / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(*lead, nb * BLOCK, kb * BLOCK)
    return q[..., :n, :k].contiguous(), scale.view(*lead, nb, kb)


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` rounded up so that ``x * element_size`` bytes is a multiple of 16 (TMA stride alignment).

    ``element_size`` must divide 16 (1, 2, 4, 8 or 16 bytes).
    """
    if element_size <= 0 or TMA_ALIGNMENT_BYTES % element_size != 0:
        raise ValueError(f"get_tma_aligned_size: element_size must divide 16, got {element_size}")
    step = TMA_ALIGNMENT_BYTES // element_size
    return _ceil_div(x, step) * step


def get_mk_alignment_for_contiguous_layout() -> int:
    """Row alignment (128) of each group's segment in the m-grouped contiguous layout (and K in k-grouped)."""
    return BLOCK


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
    if sf.dim() not in (2, 3):
        raise ValueError(f"get_mn_major_tma_aligned_tensor: sf must be 2-D or 3-D, got shape {tuple(sf.shape)}")
    batched = sf.unsqueeze(0) if sf.dim() == 2 else sf
    groups, mn, sf_k = batched.shape
    aligned = get_tma_aligned_size(mn, sf.element_size())
    ok_group_stride = sf.dim() == 2 or groups <= 1 or batched.stride(0) == aligned * sf_k
    ok_mn = mn <= 1 or batched.stride(1) == 1
    ok_k = sf_k <= 1 or batched.stride(2) == aligned
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
    recipe: tuple[int, int, int],
    num_groups: int | None = None,
    is_sfa: bool = False,
) -> torch.Tensor:
    """Check fp32 scale factors against a recipe and return them in the layout the kernels read.

    Args:
        sf: fp32 ``[ceil(MN/gran_mn), ceil(K/gran_k)]``, or ``[num_groups, ...]`` of that when
            ``num_groups`` is given.
        mn, k: the operand's logical MN (M for LHS, N for RHS) and K sizes.
        recipe: ``(gran_m, gran_n, gran_k)``, e.g. ``(1, 128, 128)`` or ``(1, 1, 128)``.
        num_groups: number of groups for grouped operands (``sf`` is then 3-D).
        is_sfa: ``sf`` belongs to the LHS (granularity ``gran_m``), else to the RHS (``gran_n``).

    Returns:
        For per-row scales (``gran_mn == 1``, ``gran_k == 128``): the MN-major TMA-aligned tensor of
        :func:`get_mn_major_tma_aligned_tensor`. For 128x128 blocks (``gran_mn == 128``): ``sf``
        as a contiguous (K-major) tensor, as DeepGEMM keeps it on Hopper.

    Raises:
        TypeError: ``sf`` is not fp32 (packed UE8M0 int scales are not supported).
        ValueError: a shape that does not match the recipe, or an unsupported recipe.
    """
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32:
        got = sf.dtype if isinstance(sf, torch.Tensor) else type(sf).__name__
        raise TypeError(f"transform_sf_into_required_layout: sf must be a float32 tensor, got {got}")
    if len(recipe) != 3:
        raise ValueError(f"transform_sf_into_required_layout: recipe must be (gran_m, gran_n, gran_k), got {recipe}")
    gran_mn = int(recipe[0] if is_sfa else recipe[1])
    gran_k = int(recipe[2])
    if (gran_mn, gran_k) not in ((1, BLOCK), (BLOCK, BLOCK)):
        raise ValueError(
            f"transform_sf_into_required_layout: unsupported granularity (mn={gran_mn}, k={gran_k}) from recipe "
            f"{tuple(recipe)} (is_sfa={is_sfa}); need (1, 128) or (128, 128)"
        )
    expected = (_ceil_div(mn, gran_mn), _ceil_div(k, gran_k))
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
