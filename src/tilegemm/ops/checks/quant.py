"""Checks of the quantization and scale-layout helpers (``tilegemm.quant``)."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from tilegemm.ops.checks.base import _bool, _describe, _int


def _real_tensor(fn: str, name: str, x: Any, min_dim: int, max_dim: int | None = None) -> torch.Tensor:
    """``x`` as a floating tensor with ``min_dim..max_dim`` dims and values (not on the meta device)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name}: got {_describe(x)}, expected a floating torch.Tensor")
    if not x.is_floating_point():
        raise TypeError(f"{fn}: {name}: got dtype {x.dtype}, expected a floating dtype")
    if x.dim() < min_dim or (max_dim is not None and x.dim() > max_dim):
        dims = (
            f"{min_dim}"
            if max_dim == min_dim
            else f"at least {min_dim}"
            if max_dim is None
            else f"{min_dim} to {max_dim}"
        )
        raise ValueError(f"{fn}: {name}: got shape {list(x.shape)}, expected {dims} dims")
    return x


def quant_input_check(fn: str, x: Any, min_dim: int, max_dim: int | None, gran_k: Any, use_ue8m0: Any) -> None:
    """The check of the FP8 casts: a floating ``x`` of ``min_dim..max_dim`` dims, ``gran_k >= 1``, a bool flag."""
    _real_tensor(fn, "x", x, min_dim, max_dim)
    _int(f"{fn}: gran_k", gran_k, 1)
    _bool(f"{fn}: use_ue8m0", use_ue8m0)


def scale_tensor_check(fn: str, sf: Any, min_dim: int, max_dim: int | None) -> None:
    """The check of the scale-layout helpers' ``sf``: a floating tensor of ``min_dim..max_dim`` dims."""
    _real_tensor(fn, "sf", sf, min_dim, max_dim)


def ceil_to_ue8m0_check(x: Any) -> None:
    """The check of ``ceil_to_ue8m0``: a real (not bool, not complex) tensor of any shape, 0-d included."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"ceil_to_ue8m0: x: got {_describe(x)}, expected a torch.Tensor")
    if x.dtype == torch.bool or x.dtype.is_complex:
        raise TypeError(f"ceil_to_ue8m0: x: got dtype {x.dtype}, expected a real dtype (float32 in practice)")


def pack_ue8m0_check(x: Any) -> None:
    """The check of ``pack_ue8m0_to_int``: a float32 tensor ``[..., K]`` with K a multiple of 4."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"pack_ue8m0_to_int: x: got {_describe(x)}, expected a float32 torch.Tensor")
    if x.dtype != torch.float32:
        raise TypeError(f"pack_ue8m0_to_int: x: got dtype {x.dtype}, expected torch.float32 powers of two")
    if x.dim() == 0 or x.shape[-1] % 4:
        raise ValueError(f"pack_ue8m0_to_int: x: got shape {list(x.shape)}, expected [..., K] with K % 4 == 0")


def tma_aligned_size_check(x: Any, element_size: Any) -> None:
    """The check of ``get_tma_aligned_size``: ``x >= 0`` and ``element_size >= 1`` ints."""
    _int("get_tma_aligned_size: x", x, 0)
    _int("get_tma_aligned_size: element_size", element_size, 1)


def transform_sf_check(
    mn: Any, k: Any, recipe: Any, num_groups: Any, is_sfa: Any, disable_ue8m0_cast: Any
) -> tuple[int, ...]:
    """The non-tensor arguments of ``transform_sf_into_required_layout``; returns ``recipe`` as ints."""
    fn = "transform_sf_into_required_layout"
    _int(f"{fn}: mn", mn, 0)
    _int(f"{fn}: k", k, 0)
    if num_groups is not None:
        _int(f"{fn}: num_groups", num_groups, 0)
    if is_sfa is not None:
        _bool(f"{fn}: is_sfa", is_sfa)
    _bool(f"{fn}: disable_ue8m0_cast", disable_ue8m0_cast)
    if not isinstance(recipe, (tuple, list)):
        raise TypeError(f"{fn}: recipe: got {_describe(recipe)}, expected a tuple of 2 or 3 ints")
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in recipe):
        raise TypeError(f"{fn}: recipe: got {recipe!r}, expected a tuple of 2 or 3 ints")
    return tuple(int(v) for v in recipe)


def k_grouped_ue8m0_check(
    sf: Any, grouped_layout: Any, ks_cpu: Any, gran_k: Any, k_alignment: Any, use_psum_layout: Any
) -> None:
    """The check of ``get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor``'s arguments.

    ``sf`` a floating 2-D tensor; ``ks_cpu`` None or a list/tuple of ints >= 0; ``grouped_layout`` an
    integer 1-D tensor wherever it is read (``use_psum_layout``, or no ``ks_cpu``).
    """
    fn = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
    _real_tensor(fn, "sf", sf, 2, 2)
    _int(f"{fn}: gran_k", gran_k, 1)
    _int(f"{fn}: k_alignment", k_alignment, 1)
    _bool(f"{fn}: use_psum_layout", use_psum_layout)
    if ks_cpu is not None:
        if not isinstance(ks_cpu, (tuple, list)):
            raise TypeError(f"{fn}: ks_cpu: got {_describe(ks_cpu)}, expected None or a list of ints")
        for v in ks_cpu:
            _int(f"{fn}: ks_cpu", v, 0)
    if use_psum_layout or not ks_cpu:
        if not isinstance(grouped_layout, torch.Tensor):
            raise TypeError(f"{fn}: grouped_layout: got {_describe(grouped_layout)}, expected an int torch.Tensor")
        if grouped_layout.is_floating_point() or grouped_layout.is_complex() or grouped_layout.dtype == torch.bool:
            raise TypeError(f"{fn}: grouped_layout: got dtype {grouped_layout.dtype}, expected an integer dtype")
        if grouped_layout.dim() != 1:
            raise ValueError(f"{fn}: grouped_layout: got shape {list(grouped_layout.shape)}, expected 1-D")
