"""Grouped GEMMs of the ``pytorch`` backend: m-grouped contiguous (incl. psum), masked, k-grouped.

All of it runs on the inputs' device in fp32 without host synchronisation (no ``.item()``,
no boolean indexing), chunked so temporaries stay near ``CHUNK_BYTES``:

* m-grouped contiguous (B in the logical [G, N, K] form for both layouts): the rows are cut into
  128-row blocks; a work item is a (block, group) pair, computed as ``a_block @ b[group].T`` and
  kept only on the rows of that group. With the row-index layout there is one item per block
  (its group is the largest id in the block, the aligned-segment contract); with
  ``use_psum_layout`` a block may span several groups and there are at most ``num_blocks + G``
  items. Group g of the psum layout is rows ``[align(ends[g-1], alignment), ends[g])``. Rows of
  no group (``-1`` rows, psum gaps before an aligned start, rows past the last group) are
  written as 0. A row whose id breaks the contract (out of range, or a different group than its
  block, only possible with value checks off) is written as NaN: never a silent wrong answer.
* masked: one batched product per chunk of groups; rows ``>= masked_m[g]`` keep ``d``'s bits.
* k-grouped (the ``tn`` form): one product per group over its K slice (``ks_cpu`` is a host list).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tilegemm.backend.registry import register_impl
from tilegemm.ops.operands import k_grouped_nt_as_tn
from tilegemm.ops.reference._common import SCALE_K, SCALE_MN, chunk_count, dequant, exact_matmul

#: Rows per block of the m-grouped contiguous layout (``get_mk_alignment_for_contiguous_layout()``).
BLOCK_M = 128

LoadB = Callable[[torch.Tensor], torch.Tensor]


def _row_groups_and_items(
    grouped_layout: torch.Tensor, m_sum: int, num_groups: int, use_psum_layout: bool, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group ids and the (block, group) work items of an m-grouped contiguous call.

    Returns ``row_group`` int64 [num_blocks * 128] (-1 for rows of no group: padding, psum gaps, rows
    past the end) and the items ``item_block``, ``item_group`` (int64) and ``item_valid`` (bool).
    """
    device = grouped_layout.device
    num_blocks = -(-m_sum // BLOCK_M)
    rows_padded = num_blocks * BLOCK_M
    if use_psum_layout:
        ends = grouped_layout.long().contiguous()
        rows = torch.arange(rows_padded, device=device, dtype=torch.int64)
        seg = torch.searchsorted(ends, rows, right=True)  # g with ends[g-1] <= r < ends[g] (non-decreasing)
        seg[m_sum:] = num_groups
        prev = torch.cat([ends.new_zeros(1), ends[:-1]])
        starts = (prev + alignment - 1) // alignment * alignment
        gap = rows < starts[seg.clamp(max=num_groups - 1)]
        row_group = torch.where((seg >= num_groups) | gap, -1, seg)
        blocks = torch.arange(num_blocks, device=device, dtype=torch.int64) * BLOCK_M
        g_lo = seg[blocks]
        g_hi = seg[(blocks + BLOCK_M - 1).clamp(max=m_sum - 1)].clamp(max=num_groups - 1)
        count = (g_hi - g_lo + 1).clamp(min=0)
        cum = count.cumsum(0)
        t = torch.arange(num_blocks + num_groups, device=device, dtype=torch.int64)
        item_block = torch.searchsorted(cum, t, right=True)
        item_valid = item_block < num_blocks
        item_block = item_block.clamp(max=num_blocks - 1)
        item_group = g_lo[item_block] + t - (cum - count)[item_block]
    else:
        row_group = F.pad(grouped_layout.long(), (0, rows_padded - m_sum), value=-1)
        item_block = torch.arange(num_blocks, device=device, dtype=torch.int64)
        item_group = row_group.view(num_blocks, BLOCK_M).amax(dim=1)
        item_valid = item_group >= 0
    item_valid = item_valid & (item_group < num_groups)
    return row_group, item_block, item_group, item_valid


def m_grouped_contiguous(
    a32: torch.Tensor,
    load_b: LoadB,
    num_groups: int,
    d: torch.Tensor,
    grouped_layout: torch.Tensor,
    use_psum_layout: bool,
    alignment: int,
) -> torch.Tensor:
    """Write ``d[r] = a32[r] @ load_b(group(r)).T`` (0 for rows of no group); see the module doc.

    ``a32``: fp32 [M_sum, K]. ``load_b(idx)``: fp32 [len(idx), N, K] for an int64 group-index tensor.
    """
    m_sum, k = a32.shape
    n = d.shape[1]
    if m_sum == 0 or n == 0:  # nothing to write
        return d
    if num_groups == 0:  # every row is padding (or, unchecked, an out-of-range id)
        return d.zero_()
    row_group, item_block, item_group, item_valid = _row_groups_and_items(
        grouped_layout, m_sum, num_groups, use_psum_layout, alignment
    )
    zero_rows = row_group == -1
    num_blocks = row_group.numel() // BLOCK_M
    a_blocks = F.pad(a32, (0, 0, 0, num_blocks * BLOCK_M - m_sum)).view(num_blocks, BLOCK_M, k)
    group_blocks = row_group.view(num_blocks, BLOCK_M)
    out = torch.zeros(num_blocks, BLOCK_M, n, dtype=torch.float32, device=a32.device)
    covered = torch.zeros(num_blocks, BLOCK_M, dtype=torch.int32, device=a32.device)

    num_items = item_block.numel()
    step = chunk_count(num_items, 4 * (2 * n * k + BLOCK_M * k + 2 * BLOCK_M * n))
    for s in range(0, num_items, step):
        blk, grp, valid = item_block[s : s + step], item_group[s : s + step], item_valid[s : s + step]
        b32 = load_b(grp.clamp(0, num_groups - 1))
        part = exact_matmul(a_blocks.index_select(0, blk), b32.transpose(1, 2))
        mine = (group_blocks.index_select(0, blk) == grp[:, None]) & valid[:, None]
        out.index_add_(0, blk, torch.where(mine[..., None], part, 0.0))
        covered.index_add_(0, blk, mine.int())

    written = covered.view(-1)[:m_sum] > 0
    result = out.view(-1, n)[:m_sum]
    result = torch.where((written | zero_rows[:m_sum])[:, None], result, float("nan"))
    d.copy_(result)
    return d


def m_grouped_bf16(a, b, d, grouped_layout, use_psum_layout, alignment, stream):
    """Reference m-grouped BF16 (nt and nn): b in the logical [G, N, K] form."""

    def load_b(idx: torch.Tensor) -> torch.Tensor:
        return b.index_select(0, idx).float()

    return m_grouped_contiguous(a.float(), load_b, b.shape[0], d, grouped_layout, use_psum_layout, alignment)


def m_grouped_fp8(a, b, d, grouped_layout, use_psum_layout, alignment, stream):
    """Reference m-grouped FP8 (nt and nn): 1x128 LHS scales, 128x128 RHS scales [G, N/128, K/128] (logical)."""
    (a_data, sa), (b_data, sb) = a, b

    def load_b(idx: torch.Tensor) -> torch.Tensor:
        return dequant(b_data.index_select(0, idx), sb.index_select(0, idx), SCALE_MN, SCALE_K)

    a32 = dequant(a_data, sa, 1, SCALE_K)
    return m_grouped_contiguous(a32, load_b, b_data.shape[0], d, grouped_layout, use_psum_layout, alignment)


register_impl("m_grouped_bf16_gemm_nt_contiguous", "pytorch")(m_grouped_bf16)
register_impl("m_grouped_bf16_gemm_nn_contiguous", "pytorch")(m_grouped_bf16)
register_impl("m_grouped_fp8_fp4_gemm_nt_contiguous", "pytorch")(m_grouped_fp8)
register_impl("m_grouped_fp8_fp4_gemm_nn_contiguous", "pytorch")(m_grouped_fp8)


# ------------------------------------------------------------------------------------ masked


def m_grouped_masked(
    load_a: Callable[[int, int], torch.Tensor],
    load_b: Callable[[int, int], torch.Tensor],
    d: torch.Tensor,
    masked_m: torch.Tensor,
    k: int,
) -> torch.Tensor:
    """Write ``d[g, :masked_m[g]] = load_a(g)[:masked_m[g]] @ load_b(g).T``; other rows keep their bits.

    ``load_a(g0, g1)``: fp32 [g1-g0, Mmax, K]; ``load_b(g0, g1)``: fp32 [g1-g0, N, K].
    """
    num_groups, m_max, n = d.shape
    rows = torch.arange(m_max, device=d.device)
    step = chunk_count(num_groups, 4 * (m_max * k + n * k + 2 * m_max * n))
    for g0 in range(0, num_groups, step):
        g1 = min(num_groups, g0 + step)
        part = exact_matmul(load_a(g0, g1), load_b(g0, g1).transpose(1, 2)).to(d.dtype)
        keep = rows[None, :] < masked_m[g0:g1, None].to(rows.dtype)
        d[g0:g1].copy_(torch.where(keep[..., None], part, d[g0:g1]))
    return d


@register_impl("m_grouped_bf16_gemm_nt_masked", "pytorch")
def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, stream):
    """Reference masked BF16 NT: a [G, Mmax, K], b [G, N, K]."""
    return m_grouped_masked(lambda g0, g1: a[g0:g1].float(), lambda g0, g1: b[g0:g1].float(), d, masked_m, a.shape[2])


@register_impl("m_grouped_fp8_fp4_gemm_nt_masked", "pytorch")
def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, stream):
    """Reference masked FP8 NT: 1x128 LHS scales [G, Mmax, K/128], 128x128 RHS scales [G, N/128, K/128]."""
    (a_data, sa), (b_data, sb) = a, b
    return m_grouped_masked(
        lambda g0, g1: dequant(a_data[g0:g1], sa[g0:g1], 1, SCALE_K),
        lambda g0, g1: dequant(b_data[g0:g1], sb[g0:g1], SCALE_MN, SCALE_K),
        d,
        masked_m,
        a_data.shape[2],
    )


# --------------------------------------------------------------------------------- k-grouped


def k_grouped(
    load_a: Callable[[int, int], torch.Tensor],
    load_b: Callable[[int, int], torch.Tensor],
    d: torch.Tensor,
    ks: list[int],
    c: torch.Tensor | None,
) -> torch.Tensor:
    """Write ``d[g] = load_a(k0, k1).T @ load_b(k0, k1) (+ c[g])`` for each group's K slice ``[k0, k1)``.

    ``load_a``: fp32 [k1-k0, M]; ``load_b``: fp32 [k1-k0, N]. ``c`` may be ``d`` (group g's ``c`` is read
    before group g's ``d`` is written, and no other group touches it).
    """
    _, m, n = d.shape
    k0 = 0
    for g, kg in enumerate(ks):
        k1 = k0 + int(kg)
        if kg == 0:
            acc = torch.zeros(m, n, dtype=torch.float32, device=d.device)
        else:
            acc = exact_matmul(load_a(k0, k1).t(), load_b(k0, k1))
        if c is not None:
            acc.add_(c[g].float())
        d[g].copy_(acc)
        k0 = k1
    return d


@register_impl("k_grouped_bf16_gemm_tn_contiguous", "pytorch")
def k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c, stream):
    """Reference k-grouped BF16 TN: a [K_sum, M], b [K_sum, N], d fp32 [G, M, N]."""
    return k_grouped(lambda k0, k1: a[k0:k1].float(), lambda k0, k1: b[k0:k1].float(), d, ks_cpu, c)


def k_grouped_fp8(a, b, d, ks_cpu, grouped_layout, c, stream):
    """Reference k-grouped FP8 (tn form): scales sa [K_sum/128, M], sb [K_sum/128, N] (1x128 along K)."""
    (a_data, sa), (b_data, sb) = a, b

    def load(data: torch.Tensor, sf: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
        # Scales are [K/128, MN]: transpose to the [MN, K] view that ``dequant`` expects.
        return lambda k0, k1: dequant(data[k0:k1].t(), sf[k0 // SCALE_K : -(-k1 // SCALE_K)].t(), 1, SCALE_K).t()

    return k_grouped(load(a_data, sa), load(b_data, sb), d, ks_cpu, c)


@register_impl("k_grouped_fp8_gemm_nt_contiguous", "pytorch")
def k_grouped_fp8_nt(a, b, d, ks_cpu, grouped_layout, c, stream):
    """Reference k-grouped FP8 (nt form: each group's K-major block back to back): gathered into the tn form."""
    a, b = k_grouped_nt_as_tn(a, b, ks_cpu, d.shape[1], d.shape[2])
    return k_grouped_fp8(a, b, d, ks_cpu, grouped_layout, c, stream)


register_impl("k_grouped_fp8_gemm_tn_contiguous", "pytorch")(k_grouped_fp8)
