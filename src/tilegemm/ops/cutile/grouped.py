"""cuTile grouped GEMMs for MoE, host side: m-grouped contiguous / psum / masked and k-grouped, BF16 and FP8.

Each op's host path: problem -> config (:mod:`tilegemm.heuristics.cutile`) -> the arrays the kernel reads (TMA
ready, NN FP8 weights made K-major, ragged layouts repacked) -> one persistent launch. The kernels, their one
scheduler and the layouts it walks (``Kind``) are in :mod:`tilegemm.ops.cutile.grouped_kernels`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.heuristics.cutile import Kind
from tilegemm.ops import operands
from tilegemm.ops.cutile import launch
from tilegemm.ops.cutile.grouped_kernels import get_kernel
from tilegemm.routing import expert_ends

_FP8 = torch.float8_e4m3fn

# ------------------------------------------------------------------------------------- host side


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """``x``, or its contiguous copy when it is not TMA ready (:func:`launch.as_row_major`, rows not padded)."""
    return launch.as_row_major(x, pad_rows=False)


def _check_sizes(*tensors: torch.Tensor) -> None:
    """The kernels index with int32: refuse (fall back) for tensors of 2**31 elements or more."""
    for t in tensors:
        if t.numel() >= 2**31:
            raise Unsupported("a tensor has >= 2**31 elements (int32 indexing)")


def check_tma_weight(b: torch.Tensor) -> None:
    """The per-expert weight ``b [G, N, K]`` is only read by TMA (64-bit addresses from the tensor map), so
    its element count may pass 2**31 (DeepSeek-V3: 256 x 4096 x 7168); each of its sizes and element
    strides must still fit the int32 index type."""
    if max(*b.shape, *b.stride()) >= 2**31:
        raise Unsupported("a weight dimension or stride is >= 2**31 (int32 indexing)")


def m_grouped(
    op: str,
    a: Any,
    b: Any,
    d: torch.Tensor,
    index: torch.Tensor,
    *,
    kind: Kind,
    trans_b: bool,
    fp8: bool,
    expected_m: int = 0,
    alignment: int = 128,
    cfg: heuristics.TileConfig | None = None,
    zero_tail: bool = True,
    stream: Any = None,
) -> torch.Tensor:
    """Shared host path of the m-grouped ops (``a``/``b`` are tensors or (data, scale) tuples), linear: sizes ->
    problem -> config -> the arrays the kernel reads -> one launch on ``stream`` (``None``: the current one).

    ``alignment`` (psum layout only): group g starts at ``offs[g-1]`` rounded up to a multiple of it
    (DeepGEMM: 128). An alignment that is not a multiple of the tile's rows (``torch._grouped_mm``'s
    offsets: 1) is served by repacking the rows into an aligned layout on the device
    (:func:`_m_grouped_repacked`). ``zero_tail``: psum rows past the last group are written 0.
    ``cfg`` overrides the heuristic's choice.
    """
    if alignment < 1:
        raise ValueError(f"alignment: got {alignment}, expected a positive number of rows")
    if fp8:
        (a_data, sa), (b_data, sb) = a, b
    else:
        a_data, b_data, sa, sb = a, b, None, None
    num_groups = b_data.shape[0]
    mmax = a_data.shape[1] if kind == Kind.MASKED else 0
    rows = a_data.shape[0] * a_data.shape[1] if kind == Kind.MASKED else a_data.shape[0]
    k_dim = a_data.shape[-1]
    n_dim = d.shape[-1]
    if rows == 0 or n_dim == 0:
        return d
    if k_dim == 0 or num_groups == 0:  # every written row is an empty sum (or padding): 0, no kernel
        if kind == Kind.MASKED:
            valid = torch.arange(mmax, device=d.device)[None, :, None] < index[:, None, None]
            return d.masked_fill_(valid, 0)
        return d.zero_()
    _check_sizes(a_data, d)
    check_tma_weight(b_data)
    if fp8 and sb.shape[-2] != launch.cdiv(n_dim, 128):
        raise Unsupported("m-grouped FP8 takes 128x128 RHS scales only")
    if cfg is None:
        dtype = "fp8" if fp8 else "bf16"
        problem = heuristics.Problem(
            "grouped", dtype, rows, n_dim, k_dim, launch.num_sms(), num_groups, kind, expected_m=expected_m
        )
        cfg = heuristics.choose(problem)
    if kind == Kind.PSUM and alignment % cfg.bm:
        return _m_grouped_repacked(op, a_data, sa, b, d, index, alignment, trans_b, fp8, cfg, stream)
    heuristics.print_once(op, {"rows": rows, "n": n_dim, "k": k_dim, "groups": num_groups}, cfg.name)
    if fp8 and not trans_b:
        # Hopper FP8 MMAs take K-major operands only: NN weights are copied to [G, N, K] (as DeepGEMM requires).
        b_data = b_data.transpose(1, 2).contiguous()
        trans_b = True
    a_data = _row_major(a_data)
    b_data = _row_major(b_data)
    index = index.contiguous()
    n_tiles = launch.cdiv(n_dim, cfg.bn)
    if kind == Kind.MASKED:
        upper = num_groups * launch.cdiv(mmax, cfg.bm) * n_tiles
    elif kind == Kind.PSUM:
        upper = (launch.cdiv(rows, cfg.bm) + num_groups) * n_tiles  # each group adds at most one partial row block
    else:
        upper = launch.cdiv(rows, cfg.bm) * n_tiles
    runtime = (index, mmax, num_groups, alignment, int(zero_tail))
    consts = (int(kind), trans_b, cfg.bm, cfg.bn, cfg.bk, cfg.gm)
    if fp8:
        # MN-major LHS scales, one TMA row per 64-row part: [K/128, rows] (masked: [G, K/128, Mmax])
        sa_t = sa.transpose(-1, -2).contiguous()
        kernel = get_kernel("m_fp8", cfg.num_worker_warps, cfg.occupancy)
        args = (a_data, sa_t, b_data, sb.contiguous(), d, *runtime, *consts, cfg.fast_acc)
    else:
        kernel = get_kernel("m_bf16", cfg.num_worker_warps, cfg.occupancy)
        args = (a_data, b_data, d, *runtime, *consts)
    launch.launch(kernel, launch.persistent_grid(upper, cfg.ctas_per_sm), args, stream)
    return d


def _aligned_rows(
    offs: torch.Tensor, rows: int, align: int, src_align: int = 1
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where each row of a psum layout goes in a layout whose groups start on multiples of ``align`` rows.

    ``offs`` int32 [G] cumulative ends; group g is rows ``[align_up(offs[g-1], src_align), offs[g])`` (the
    kernel's clamps: ends into ``[0, rows]``, each group's end at least its start). ``src_align`` is the
    caller's alignment (``torch._grouped_mm``'s offsets: 1); the rows it skips belong to no group. Returns
    ``(dst, offs_aligned, rows_aligned)``: int64 ``dst[r]`` the row of ``r`` in the aligned layout (rows of no
    group: ``rows_aligned``, one spare row), int32 ``offs_aligned`` the aligned layout's psum ends (DeepGEMM's
    meaning), and the static row count ``rows + min(G, rows) * (align - 1)`` that bounds it. All on the
    device: no host sync.
    """
    num_groups = offs.shape[0]
    rows_aligned = rows + min(num_groups, rows) * (align - 1)
    ends = offs.to(torch.int64).clamp(0, rows)
    prev = torch.cat([ends.new_zeros(1), ends[:-1]])
    starts = ((prev + src_align - 1) // src_align * src_align).clamp(max=rows)
    counts = (ends - starts).clamp(min=0)
    offs_aligned = expert_ends(counts, align)
    pad_starts = offs_aligned.to(torch.int64) - counts
    r = torch.arange(rows, device=offs.device)
    group = torch.searchsorted(ends, r, right=True).clamp(max=num_groups)
    g = group.clamp(max=num_groups - 1)
    in_group = (group < num_groups) & (r >= starts[g])
    dst = torch.where(in_group, pad_starts[g] + r - starts[g], rows_aligned).clamp(0, rows_aligned)
    return dst, offs_aligned, rows_aligned


def _m_grouped_repacked(
    op: str,
    a_data: torch.Tensor,
    sa: torch.Tensor | None,
    b: Any,
    d: torch.Tensor,
    offs: torch.Tensor,
    alignment: int,
    trans_b: bool,
    fp8: bool,
    cfg: heuristics.TileConfig,
    stream: Any,
) -> torch.Tensor:
    """psum layout whose ``alignment`` is not a multiple of the tile's rows: rows are copied into a layout whose
    groups start on whole tiles (:func:`_aligned_rows`), the aligned kernel runs there, and ``d`` gathers the rows
    back; rows of no group read the spare row, which is 0."""
    rows = a_data.shape[0]
    dst, offs_aligned, rows_aligned = _aligned_rows(offs, rows, cfg.bm, alignment)
    # One spare row past the aligned layout takes the rows of no group (copied in, never computed).
    a_bytes = a_data.view(torch.uint8) if fp8 else a_data  # index_copy_ has no float8 kernel
    a_pad = a_bytes.new_empty(rows_aligned + 1, a_data.shape[1]).index_copy_(0, dst, a_bytes)[:rows_aligned]
    a_arg: Any = a_pad
    if fp8:
        sa_pad = sa.new_empty(rows_aligned + 1, sa.shape[1]).index_copy_(0, dst, sa)[:rows_aligned]
        a_arg = (a_pad.view(a_data.dtype), sa_pad)
    d_pad = d.new_empty(rows_aligned + 1, d.shape[1])
    d_pad[rows_aligned].zero_()
    # Rows of the aligned layout past its last group are read by no one: the kernel leaves them alone.
    m_grouped(
        op, a_arg, b, d_pad[:rows_aligned], offs_aligned, kind=Kind.PSUM, trans_b=trans_b, fp8=fp8, alignment=cfg.bm,
        cfg=cfg, zero_tail=False, stream=stream,
    )  # fmt: skip
    return torch.index_select(d_pad, 0, dst, out=d)


@functools.lru_cache(maxsize=256)
def _k_block_rows(ks: tuple[int, ...], block: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Rows of a ``[sum(ks), *]`` operand in a layout whose groups start on multiples of ``block`` (int64 on
    ``device``), and the per-group K of that layout (each ``ks[g]`` rounded up, the last one kept)."""
    padded = [launch.cdiv(k, block) * block for k in ks[:-1]] + list(ks[-1:])
    starts = [0]
    for k in padded[:-1]:
        starts.append(starts[-1] + k)
    rows = [start + i for start, k in zip(starts, ks) for i in range(k)]
    return torch.tensor(rows, dtype=torch.int64).to(device), padded


def _k_grouped(
    op: str,
    a: Any,
    b: Any,
    d: torch.Tensor,
    ks: list[int],
    ks_tensor: torch.Tensor | None,
    c: torch.Tensor | None,
    *,
    fp8: bool,
    cfg: heuristics.TileConfig | None = None,
    stream: Any = None,
) -> torch.Tensor:
    """Shared host path of the k-grouped ops: ``d[g] = a_g.T @ b_g (+ c[g])`` in fp32, linear: sizes -> problem ->
    config -> the arrays the kernel reads (groups repacked to whole K blocks where needed) -> one launch on
    ``stream`` (``None``: the current one)."""
    if fp8:
        (a_data, sa), (b_data, sb) = a, b
    else:
        a_data, b_data, sa, sb = a, b, None, None
    num_groups, m_dim, n_dim = d.shape
    if num_groups == 0 or m_dim == 0 or n_dim == 0:
        return d
    k_sum = a_data.shape[0]
    if k_sum == 0:  # every group's product is an empty sum: d = c (or 0), no kernel
        return d.copy_(c) if c is not None else d.zero_()
    _check_sizes(a_data, b_data, d)
    has_c = c is not None
    if cfg is None:
        dtype = "fp8" if fp8 else "bf16"
        problem = heuristics.Problem(
            "grouped", dtype, m_dim, n_dim, k_sum, launch.num_sms(), num_groups, Kind.K, has_c=has_c
        )
        cfg = heuristics.choose(problem)
    heuristics.print_once(op, {"m": m_dim, "n": n_dim, "k_sum": k_sum, "groups": num_groups}, cfg.name)
    if any(k % cfg.bk for k in ks[:-1]):
        # A group starting inside a K block: copy each group to a K range of whole blocks (zero filled), so
        # the kernel's K blocks are plain tile indices (the FP8 op takes multiples of 128 only).
        rows, ks = _k_block_rows(tuple(int(k) for k in ks), cfg.bk, d.device)
        a_data = a_data.new_zeros(ks_sum := sum(ks), a_data.shape[1]).index_copy_(0, rows, a_data)
        b_data = b_data.new_zeros(ks_sum, b_data.shape[1]).index_copy_(0, rows, b_data)
        ks_tensor = None
    koffs = operands.k_offsets(ks, ks_tensor, d.device)
    c_is_d = has_c and c.data_ptr() == d.data_ptr() and c.stride() == d.stride()
    # When c is d the kernel reads C from d itself (no aliased pair of arrays); otherwise a row-major c.
    c_arg = c.contiguous() if has_c and not c_is_d else d
    upper = num_groups * launch.cdiv(m_dim, cfg.bm) * launch.cdiv(n_dim, cfg.bn)
    consts = (has_c, c_is_d, cfg.bm, cfg.bn, cfg.bk, cfg.gm)
    if fp8:
        # Hopper FP8 MMAs take K-major operands only: copy a, b to [M, K_sum], [N, K_sum].
        a_k = _row_major(a_data.t().contiguous())
        b_k = _row_major(b_data.t().contiguous())
        kernel = get_kernel("k_fp8", cfg.num_worker_warps, cfg.occupancy)
        args = (a_k, sa.contiguous(), b_k, sb.contiguous(), c_arg, d, koffs, *consts, cfg.fast_acc)
    else:
        kernel = get_kernel("k_bf16", cfg.num_worker_warps, cfg.occupancy)
        args = (_row_major(a_data), _row_major(b_data), c_arg, d, koffs, *consts)
    launch.launch(kernel, launch.persistent_grid(upper, cfg.ctas_per_sm), args, stream)
    return d


# ------------------------------------------------------------------------------ registrations


def _contiguous_kind(use_psum_layout: bool) -> Kind:
    return Kind.PSUM if use_psum_layout else Kind.INDICES


def _stored_weights(b: Any) -> tuple[Any, bool]:
    """The logical [G, N, K] weights (or (data, scales)) as the kernel takes them: (operand, trans_b).

    A transposed view of [G, K, N] storage (the ``nn`` ops) goes in as that storage with
    ``trans_b=False``, so it is not copied; the scales stay logical.
    """
    data = b[0] if isinstance(b, tuple) else b
    if data.stride(-1) != 1 and data.stride(-2) == 1:
        stored = data.transpose(1, 2)
        return ((stored, b[1]) if isinstance(b, tuple) else stored), False
    return b, True


def _m_grouped_contiguous(op: str, fp8: bool) -> Any:
    """The registered implementation of the m-grouped contiguous ops (nt and nn) of one dtype: ``d[r] = a[r] @
    b[group(r)].T`` with logical b [G, N, K] (FP8: 1x128 LHS / 128x128 RHS scales)."""

    def m_grouped_contiguous(a, b, d, grouped_layout, use_psum_layout, alignment, stream):
        b, trans_b = _stored_weights(b)
        kind = _contiguous_kind(use_psum_layout)
        return m_grouped(
            op, a, b, d, grouped_layout, kind=kind, trans_b=trans_b, fp8=fp8, alignment=alignment, stream=stream
        )

    return m_grouped_contiguous


_m_grouped_bf16 = _m_grouped_contiguous("m_grouped_bf16_gemm_contiguous", fp8=False)
_m_grouped_fp8 = _m_grouped_contiguous("m_grouped_fp8_fp4_gemm_contiguous", fp8=True)


register_impl("m_grouped_bf16_gemm_nt_contiguous", "cutile")(_m_grouped_bf16)
register_impl("m_grouped_bf16_gemm_nn_contiguous", "cutile")(_m_grouped_bf16)
register_impl("m_grouped_fp8_fp4_gemm_nt_contiguous", "cutile")(_m_grouped_fp8)
register_impl("m_grouped_fp8_fp4_gemm_nn_contiguous", "cutile")(_m_grouped_fp8)


@register_impl("m_grouped_bf16_gemm_nt_masked", "cutile")
def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, stream):
    """Masked BF16 m-grouped NT: rows ``>= masked_m[g]`` untouched; see ``tilegemm.ops.api``."""
    op = "m_grouped_bf16_gemm_nt_masked"
    return m_grouped(
        op, a, b, d, masked_m, kind=Kind.MASKED, trans_b=True, fp8=False, expected_m=expected_m, stream=stream
    )


@register_impl("m_grouped_fp8_fp4_gemm_nt_masked", "cutile")
def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, stream):
    """Masked FP8 m-grouped NT: rows ``>= masked_m[g]`` untouched; see ``tilegemm.ops.api``."""
    op = "m_grouped_fp8_fp4_gemm_nt_masked"
    return m_grouped(
        op, a, b, d, masked_m, kind=Kind.MASKED, trans_b=True, fp8=True, expected_m=expected_m, stream=stream
    )


@register_impl("k_grouped_bf16_gemm_tn_contiguous", "cutile")
def k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c, stream):
    """``d[g] = a_g.T @ b_g (+ c[g])``, fp32 out; see ``tilegemm.ops.api``."""
    op = "k_grouped_bf16_gemm_tn_contiguous"
    return _k_grouped(op, a, b, d, ks_cpu, grouped_layout, c, fp8=False, stream=stream)


@register_impl("k_grouped_fp8_gemm_tn_contiguous", "cutile")
def _k_grouped_fp8(a, b, d, ks_cpu, grouped_layout, c, stream):
    """FP8 k-grouped in the ``tn`` form, 1x128 scales along K."""
    return _k_grouped("k_grouped_fp8_gemm_contiguous", a, b, d, ks_cpu, grouped_layout, c, fp8=True, stream=stream)


@register_impl("k_grouped_fp8_gemm_nt_contiguous", "cutile")
def _k_grouped_fp8_nt(a, b, d, ks_cpu, grouped_layout, c, stream):
    """FP8 k-grouped on the ``nt`` op's per-group K-major blocks, gathered into the ``tn`` form (one copy each)."""
    a, b = operands.k_grouped_nt_as_tn(a, b, ks_cpu, d.shape[1], d.shape[2])
    return _k_grouped_fp8(a, b, d, ks_cpu, grouped_layout, c, stream)
