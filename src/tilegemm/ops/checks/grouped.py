"""Checks of the grouped GEMMs: m-grouped contiguous (ids or psum ends), m-grouped masked, k-grouped."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from tilegemm import config
from tilegemm.ops.checks import hot
from tilegemm.ops.checks.base import (
    BLOCK,
    FP8,
    M_ALIGNMENT,
    OUT_DTYPES,
    _addend,
    _bool,
    _describe,
    _gemm_placement,
    _gran_k,
    _int,
    _int_tuple,
    _logical_shape,
    _operands,
    _output,
    _pack,
    _shape,
    _string,
    _t,
    _tensor,
    resolve_recipe,
    value_checks_enabled,
)
from tilegemm.ops.common import cdiv

#: The RHS scales the m-grouped and masked FP8 GEMMs take: 128x128 blocks only (DeepGEMM's SM90 kernels).
BLOCK_RECIPES = ((1, 128, 128),)

# ---------------------------------------------------------------------- m-grouped contiguous


def _check_m_indices(m_indices: torch.Tensor, m_sum: int, groups: int) -> None:
    _shape("grouped_layout", m_indices, [m_sum], "[M_sum], one group id per row")
    if not value_checks_enabled(m_indices.device) or m_sum == 0:
        return
    bad = (m_indices < -1) | (m_indices >= groups)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"grouped_layout: row {row} has group {int(m_indices[row])}, expected -1 or 0..{groups - 1}")
    blocks = cdiv(m_sum, M_ALIGNMENT)
    padded = torch.full((blocks * M_ALIGNMENT,), -1, dtype=m_indices.dtype, device=m_indices.device)
    padded[:m_sum] = m_indices
    padded = padded.view(blocks, M_ALIGNMENT)
    owner = padded.amax(dim=1, keepdim=True)  # the block's group, or -1 for an all-padding block
    mixed = ((padded != owner) & (padded != -1)).any(dim=1)
    if bool(mixed.any()):
        blk = int(mixed.nonzero()[0, 0])
        raise ValueError(
            f"grouped_layout: rows {blk * M_ALIGNMENT}..{min(m_sum, (blk + 1) * M_ALIGNMENT) - 1} mix groups; every "
            f"{M_ALIGNMENT}-row block must hold one group's rows, padded with -1"
        )


def check_group_offsets(offs: torch.Tensor, m_sum: int, groups: int, name: str = "grouped_layout") -> None:
    """psum-layout ends ``name``: int32 [G], non-decreasing, within ``0..m_sum`` (the values only when enabled)."""
    _shape(name, offs, [groups], "[G] cumulative group end rows")
    if not value_checks_enabled(offs.device) or groups == 0:
        return
    prev = torch.cat([offs.new_zeros(1), offs[:-1]])
    if bool((offs < prev).any()) or bool((offs > m_sum).any()):
        raise ValueError(f"{name} (psum ends): got {offs.tolist()[:16]}, expected non-decreasing values in 0..{m_sum}")


def resolve_alignment(alignment: Any) -> int:
    """The psum group-start alignment: ``alignment``, or ``get_mk_alignment_for_contiguous_layout()`` for None."""
    if alignment is None:
        return config.get_mk_alignment_for_contiguous_layout()
    _int("alignment", alignment, 1)
    return int(alignment)


def m_grouped_contiguous_check(layout: str, fp8: bool) -> Callable[..., dict[str, Any]]:
    """The check of ``m_grouped_{bf16,fp8_fp4}_gemm_<layout>_contiguous``; returns the logical ``nt`` form.

    Derived: ``a`` [M_sum, K] (FP8: ``(data, sa [M_sum, K/128])``), ``b`` [G, N, K] (FP8: ``(data,
    sb [G, N/128, K/128])``), ``d``, ``grouped_layout``, ``use_psum_layout``, ``alignment`` (resolved),
    ``stream``.
    """
    flip_b = layout == "nn"
    op = f"m_grouped_fp8_fp4_gemm_{layout}_contiguous"
    b_meaning = "[G, K, N]" if flip_b else "[G, N, K]"

    def check(
        a,
        b,
        d,
        grouped_layout,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        use_psum_layout=False,
        ensure_zero_padding=True,
        expected_m_for_psum_layout=None,
        *,
        alignment=None,
        stream=None,
    ) -> dict[str, Any]:
        a_data, sa, b_data, sb = _operands(fp8, a, b, 2, 3)
        lb = _t(b_data, flip_b)
        (m_sum, k), (groups, n, kb) = a_data.shape, lb.shape
        if k != kb:
            raise ValueError(
                f"a and b disagree on K: a [M_sum, K] has shape {list(a_data.shape)}, "
                f"b {b_meaning} has shape {list(b_data.shape)}"
            )
        if fp8:
            _shape("a[1] (scales)", sa, [m_sum, cdiv(k, BLOCK)], "[M_sum, ceil(K/128)]")
            sb = _t(sb, flip_b)
            resolve_recipe(
                sb, n, k, recipe, recipe_a, recipe_b, [groups], flip_b, takes=BLOCK_RECIPES, op=op, lead_names=("G",)
            )
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _string("compiled_dims", compiled_dims)
        _output("d", d, OUT_DTYPES, [m_sum, n], "[M_sum, N]")
        _bool("use_psum_layout", use_psum_layout)
        _bool("ensure_zero_padding", ensure_zero_padding)
        if expected_m_for_psum_layout is not None:
            if not use_psum_layout:
                raise ValueError("expected_m_for_psum_layout: only taken with use_psum_layout=True")
            _int("expected_m_for_psum_layout", expected_m_for_psum_layout, 0)
        align = resolve_alignment(alignment)
        _tensor("grouped_layout", grouped_layout, (torch.int32,), 1)
        _gemm_placement(stream, a_data, sa, b_data, sb, d=d, grouped_layout=grouped_layout)
        if use_psum_layout:
            check_group_offsets(grouped_layout, m_sum, groups)
        else:
            _check_m_indices(grouped_layout, m_sum, groups)
        return dict(
            a=_pack(a_data, sa),
            b=_pack(lb, sb),
            d=d,
            grouped_layout=grouped_layout,
            use_psum_layout=use_psum_layout,
            alignment=align,
            stream=stream,
        )

    return check


def _m_grouped_settings() -> tuple[int, int]:
    """The global settings an m-grouped contiguous call reads: ``set_num_sms`` (the chooser, the plan) and the
    default psum alignment (the check resolves ``alignment=None`` to it)."""
    return config._num_sms, config._mk_alignment


def m_grouped_contiguous_signature(layout: str) -> hot.HotLane:
    """The hot-lane key of ``m_grouped_fp8_fp4_gemm_<layout>_contiguous``: the replay takes ``(a, b, d,
    grouped_layout)`` with ``b`` in the logical ``nt`` form :func:`m_grouped_contiguous_check` derives.

    The key holds the shape, strides, dtype and device of every tensor (FP8 data with fp32 scales, a bf16/fp32
    ``d``, an int32 ``grouped_layout``), every scalar argument, the ``set_num_sms`` setting and the default
    alignment; not ``grouped_layout``'s values, which the kernel reads as it runs (the check reads them only with
    ``TILEGEMM_CHECK_VALUES`` on: no key then). Calls with a ``stream``, an output that requires grad, a tensor not
    16-byte aligned or other scale dtypes take the full path.
    """
    operand = hot.pair(FP8, torch.float32)
    kinds = dict(
        a=operand,
        b=operand,
        d=hot.output(*OUT_DTYPES),
        grouped_layout=hot.tensor(torch.int32),
        **hot.RECIPE_KINDS,
        use_psum_layout=hot.exact(bool),
        ensure_zero_padding=hot.exact(bool),
        expected_m_for_psum_layout=hot.optional(hot.exact(int)),
        alignment=hot.optional(hot.exact(int)),
        stream=hot.none,
    )
    flip_b = hot.transpose_pair if layout == "nn" else None
    operands = dict(a=None, b=flip_b, d=None, grouped_layout=None)
    return hot.HotLane(kinds, operands, setting=_m_grouped_settings, value_checks=True)


# -------------------------------------------------------------------------- m-grouped masked


def m_grouped_masked_check(fp8: bool) -> Callable[..., dict[str, Any]]:
    """The check of ``m_grouped_{bf16,fp8_fp4}_gemm_nt_masked``.

    Derived: ``a``, ``b``, ``d``, ``masked_m``, ``expected_m``, ``stream``.
    """
    op = "m_grouped_fp8_fp4_gemm_nt_masked"

    def check(
        a,
        b,
        d,
        masked_m,
        expected_m,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        *,
        stream=None,
    ) -> dict[str, Any]:
        a_data, sa, b_data, sb = _operands(fp8, a, b, 3, 3)
        groups, m_max, k = a_data.shape
        if b_data.shape[0] != groups or b_data.shape[2] != k:
            raise ValueError(
                f"b: got shape {list(b_data.shape)}, expected [G={groups}, N, K={k}] to match a [G, Mmax, K] "
                f"of shape {list(a_data.shape)}"
            )
        n = b_data.shape[1]
        if fp8:
            _shape("a[1] (scales)", sa, [groups, m_max, cdiv(k, BLOCK)], "[G, Mmax, ceil(K/128)]")
            resolve_recipe(
                sb, n, k, recipe, recipe_a, recipe_b, [groups], takes=BLOCK_RECIPES, op=op, lead_names=("G",)
            )
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _string("compiled_dims", compiled_dims)
        _output("d", d, OUT_DTYPES, [groups, m_max, n], "[G, Mmax, N]")
        _tensor("masked_m", masked_m, (torch.int32,), 1)
        _shape("masked_m", masked_m, [groups], "[G], valid rows per group")
        _int("expected_m", expected_m, 0)
        _gemm_placement(stream, a_data, sa, b_data, sb, d=d, masked_m=masked_m)
        if value_checks_enabled(masked_m.device) and groups:
            bad = (masked_m < 0) | (masked_m > m_max)
            if bool(bad.any()):
                g = int(bad.nonzero()[0, 0])
                raise ValueError(f"masked_m: group {g} has {int(masked_m[g])} rows, expected 0..Mmax={m_max}")
        return dict(a=a, b=b, d=d, masked_m=masked_m, expected_m=expected_m, stream=stream)

    return check


# ------------------------------------------------------------------------------- k-grouped


def _ks(ks_cpu: Any) -> list[int]:
    if not isinstance(ks_cpu, (list, tuple)) or any(
        isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in ks_cpu
    ):
        raise TypeError(f"ks_cpu: got {_describe(ks_cpu)}, expected a list of ints (per-group K)")
    if any(x < 0 for x in ks_cpu):
        raise ValueError(f"ks_cpu: got {list(ks_cpu)}, expected every per-group K >= 0")
    return [int(x) for x in ks_cpu]


def _k_major_groups(name: str, data: torch.Tensor, ks: list[int], mn: int) -> torch.Tensor:
    """DeepGEMM's per-group K-major buffer (group g: ``[MN, K_g]`` row-major, groups back to back), checked: its
    memory as a [K_sum, MN] view, for the checks of shapes and placement (not the matrix: the backends read the
    blocks, or gather them with :func:`operands.k_grouped_nt_as_tn`)."""
    if data.numel() != sum(ks) * mn:
        raise ValueError(
            f"{name}: holds {data.numel()} elements, expected sum(ks_cpu) * {mn} = {sum(ks) * mn} "
            "(each group's [MN, K_g] block, K-major, back to back)"
        )
    if not data.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (each group's [MN, K_g] block, K-major, back to back)")
    return data.reshape(-1).view(mn, sum(ks)).t()


def k_grouped_check(fp8: bool, layout: str = "tn") -> Callable[..., dict[str, Any]]:
    """The check of ``k_grouped_{bf16,fp8}_gemm_<layout>_contiguous``; returns the ``tn`` form.

    ``tn``: a [K_sum, M], b [K_sum, N] (FP8 scales [K_sum/128, M] / [K_sum/128, N]). ``nt`` (FP8,
    DeepGEMM's SM90 op): a and b hold each group's K-major ``[M, K_g]`` / ``[N, K_g]`` block back to
    back, scales [M, K_sum/128] / [N, K_sum/128]; they are passed on as given (the gluon kernel reads the
    blocks in place, the other backends gather them: :func:`operands.k_grouped_nt_as_tn`).
    Derived: ``a``, ``b``, ``d``, ``ks_cpu`` (a list), ``grouped_layout``, ``c``, ``stream``.
    """

    def check(
        a,
        b,
        d,
        ks_cpu,
        grouped_layout,
        c=None,
        recipe=(1, 1, 128),
        compiled_dims="mn",
        use_psum_layout=False,
        *,
        stream=None,
    ) -> dict[str, Any]:
        _bool("use_psum_layout", use_psum_layout)
        if use_psum_layout:
            raise NotImplementedError("k-grouped use_psum_layout=True is DeepGEMM's SM100 path; pass ks_cpu instead")
        ks = _ks(ks_cpu)
        _tensor("d", d, (torch.float32,), 3)
        groups, m, n = d.shape
        if len(ks) != groups:
            raise ValueError(f"ks_cpu: got {len(ks)} groups, expected G={groups} (d is [G, M, N])")
        k_sum = sum(ks)
        ndim = 2 if layout == "tn" else None
        a_data, sa, b_data, sb = _operands(fp8, a, b, ndim, ndim)
        if fp8:
            rec = _int_tuple("recipe", recipe, 3)
            _gran_k("recipe", rec[2])
            if rec != (1, 1, 128):
                raise ValueError(f"recipe: k-grouped FP8 takes 1x128 scales on both sides (1, 1, 128), got {rec}")
            if any(x % BLOCK for x in ks):
                raise ValueError(f"ks_cpu: got {ks}, expected multiples of {BLOCK} for the FP8 op")
        given = (a_data, sa), (b_data, sb)
        if layout == "nt":  # checked through [K_sum, MN] views of the blocks' memory and of the scales
            a_data = _k_major_groups("a[0] (data)", a_data, ks, m)
            b_data = _k_major_groups("b[0] (data)", b_data, ks, n)
            sa, sb = _t(sa, True), _t(sb, True)
        elif a_data.shape[0] != k_sum or b_data.shape[0] != k_sum:
            raise ValueError(
                f"a [K_sum, M] has shape {list(a_data.shape)} and b [K_sum, N] has {list(b_data.shape)}, "
                f"expected K_sum = sum(ks_cpu) = {k_sum}"
            )
        if list(a_data.shape) != [k_sum, m] or list(b_data.shape) != [k_sum, n]:
            raise ValueError(
                f"a and b: got shapes {list(a_data.shape)}, {list(b_data.shape)} for d [G, M, N] {[groups, m, n]}"
            )
        if fp8:
            flip = layout == "nt"
            _logical_shape("a[1] (scales)", sa, [k_sum // BLOCK, m], "1x128 along K", flip)
            _logical_shape("b[1] (scales)", sb, [k_sum // BLOCK, n], "1x128 along K", flip)
        _string("compiled_dims", compiled_dims)
        _output("d", d, (torch.float32,), [groups, m, n], "[G, M, N]")
        _addend(c, (torch.float32,), [groups, m, n], "[G, M, N]")
        _tensor("grouped_layout", grouped_layout, (torch.int32,), 1)
        _shape("grouped_layout", grouped_layout, [groups], "[G], the device mirror of ks_cpu")
        _gemm_placement(stream, a_data, sa, b_data, sb, d=d, c=c, grouped_layout=grouped_layout)
        if value_checks_enabled(grouped_layout.device) and groups and grouped_layout.cpu().tolist() != ks:
            raise ValueError(f"grouped_layout: holds {grouped_layout.cpu().tolist()}, expected ks_cpu={ks}")
        if layout == "nt":
            (a_data, sa), (b_data, sb) = given
        return dict(
            a=_pack(a_data, sa), b=_pack(b_data, sb), d=d, ks_cpu=ks, grouped_layout=grouped_layout, c=c, stream=stream
        )

    return check
