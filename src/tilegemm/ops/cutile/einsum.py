"""cuTile BF16 ``einsum``: DeepGEMM's three expressions, accumulated in fp32 and rounded once into ``d``.

* ``bmk,bnk->mn`` (``d = sum_s a[s] @ b[s].T (+ c)``): its own persistent kernel over the ``[M, N]`` output
  tiles whose K loop runs over the flattened (s, 64-wide K block) steps, reading the 3-D operands in place.
  An output of few tiles (DeepGEMM's shapes: 3 to 9 tiles of 128x128, S in the thousands) is split along
  those steps: each split writes its fp32 partial to a workspace ``[splits, M, N]`` and a reduce kernel sums
  the partials in split order (deterministic), adds ``c`` and rounds once.
* ``bhr,hdr->bhd`` (``d[b, h] = y[h] @ x[b, h]``): per head an NT GEMM ``[B, R] x [D, R]``, i.e. the masked
  m-grouped GEMM (``ops/cutile/grouped.py``) with one group per head and every row valid: ``x`` and ``d`` go
  in as their ``[H, B, *]`` permuted views, ``y`` as it is (column-sliced views included), no copies.
* ``bhd,hdr->bhr`` (``d[b, h] = x[b, h] @ y[h]``): per head an NN GEMM whose RHS ``y[h]`` is ``[D, R]``
  (MN-major); its own persistent kernel over (head, row block, column block) tiles loads the 3-D ``[B, H, D]``
  and ``[H, D, R]`` tiles in place (TMA reads both orientations of 16-bit data).

``c`` (any expression; DeepGEMM takes it for ``bmk,bnk->mn`` with ``c`` = ``d``) is added in fp32 before the
one rounding: in the kernels' epilogue, or for the masked-GEMM path through an fp32 temporary.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import cuda.tile as ct
import torch

from tilegemm.backend.registry import Unsupported, get_impl, register_impl
from tilegemm.heuristics.cutile.einsum import (
    BMK_CONFIG,
    REDUCE_TILE,
    bmk_config,
    heads_config,
    split_steps,
)
from tilegemm.heuristics.cutile.problem import TileConfig
from tilegemm.heuristics.report import print_once
from tilegemm.ops.cutile import launch, tile_lib

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO

# ---------------------------------------------------------------------------------------- kernels


def _add_c(acc, D, C, index, HAS_C: ConstBool, C_IS_D: ConstBool):
    """``acc`` plus the same-shaped tile of ``C`` at ``index``, in fp32 (read from ``D`` itself when ``C_IS_D``)."""
    if HAS_C:
        src = D if C_IS_D else C
        c = ct.load(src, index, acc.shape, padding_mode=_ZERO)
        acc = acc + ct.astype(c, ct.float32)
    return acc


def _finish_2d(D, C, acc, pm, pn, HAS_C: ConstBool, C_IS_D: ConstBool):
    """``D`` tile (pm, pn) = ``acc (+ C tile)``, rounded once to ``D``'s dtype."""
    ct.store(D, (pm, pn), ct.astype(_add_c(acc, D, C, (pm, pn), HAS_C, C_IS_D), D.dtype))


def _finish_3d(D, C, acc, pm, h, pn, HAS_C: ConstBool, C_IS_D: ConstBool):
    """:func:`_finish_2d` for head ``h`` of ``D [B, H, N]``: the tile is ``(rows, 1, cols)`` at ``(pm, h, pn)``."""
    tile = ct.reshape(acc, (acc.shape[0], 1, acc.shape[1]))
    ct.store(D, (pm, h, pn), ct.astype(_add_c(tile, D, C, (pm, h, pn), HAS_C, C_IS_D), D.dtype))


def _bmn_bnk_mn_gemm_impl(
    A, B, D, C, W, per: int,
    TM: ConstInt, TN: ConstInt, TK: ConstInt, GM: ConstInt, SPLIT: ConstBool, HAS_C: ConstBool, C_IS_D: ConstBool,
):  # fmt: skip
    """``D[M, N] = sum_s A[s] @ B[s].T (+ C)``: A ``[S, M, K]``, B ``[S, N, K]`` (K-major), fp32 accumulation.

    Each output tile's K loop runs over ``S * cdiv(K, TK)`` steps (step ``j``: batch ``j // kblocks``, K block
    ``j % kblocks``). Without ``SPLIT`` a unit is a whole tile, finished here; with it, unit ``u`` is steps
    ``[sp * per, (sp + 1) * per)`` of tile ``u % tiles`` (``sp = u // tiles``), its fp32 sum stored to
    ``W[sp]`` (``[splits, M, N]``) for the reduce kernel.
    """
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[1], TN)
    tiles = num_m * num_n
    kblocks = ct.cdiv(A.shape[2], TK)
    steps = A.shape[0] * kblocks
    units = tiles
    if SPLIT:
        units = tiles * ct.cdiv(steps, per)
    for u in range(ct.bid(0), units, ct.num_blocks(0)):
        sp = u // tiles
        pm, pn = tile_lib.tile_coords(u - sp * tiles, num_m, num_n, GM)
        j0 = 0
        j1 = steps
        if SPLIT:
            j0 = sp * per
            j1 = ct.minimum(steps, j0 + per)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for j in range(j0, j1):
            s = j // kblocks
            kb = j - s * kblocks
            a = ct.load(A, (s, pm, kb), (1, TM, TK), padding_mode=_ZERO)
            b = ct.load(B, (s, kb, pn), (1, TK, TN), order=(0, 2, 1), padding_mode=_ZERO)
            acc = ct.mma(ct.reshape(a, (TM, TK)), ct.reshape(b, (TK, TN)), acc)
        if SPLIT:
            ct.store(W, (sp, pm, pn), ct.reshape(acc, (1, TM, TN)))
        else:
            _finish_2d(D, C, acc, pm, pn, HAS_C, C_IS_D)


def _reduce_body(W, D, C, splits: int, RM: ConstInt, RN: ConstInt, HAS_C: ConstBool, C_IS_D: ConstBool):
    """``D`` tile (bid 0, bid 1) = the sum of the ``W[s]`` tiles for ``s`` in order (+ C), rounded once."""
    pm = ct.bid(0)
    pn = ct.bid(1)
    acc = ct.zeros((RM, RN), dtype=ct.float32)
    for s in range(splits):
        acc = acc + ct.reshape(ct.load(W, (s, pm, pn), (1, RM, RN), padding_mode=_ZERO), (RM, RN))
    _finish_2d(D, C, acc, pm, pn, HAS_C, C_IS_D)


def _heads_gemm_body(
    A, Y, D, C, TM: ConstInt, TN: ConstInt, TK: ConstInt, GM: ConstInt, HAS_C: ConstBool, C_IS_D: ConstBool
):
    """``D[b, h] = A[b, h] @ Y[h] (+ C[b, h])``: A ``[B, H, K]``, Y ``[H, K, N]`` (N contiguous), D/C ``[B, H, N]``.

    Persistent over (head, row block, column block) tiles, heads outermost, swizzled inside a head so that
    concurrent CTAs share ``Y[h]`` in L2. Every tile is loaded as a 3-D box of the arrays (no slicing).
    """
    heads = D.shape[1]
    num_m = ct.cdiv(D.shape[0], TM)
    num_n = ct.cdiv(D.shape[2], TN)
    per_head = num_m * num_n
    kblocks = ct.cdiv(A.shape[2], TK)
    for u in range(ct.bid(0), heads * per_head, ct.num_blocks(0)):
        h = u // per_head
        pm, pn = tile_lib.tile_coords(u - h * per_head, num_m, num_n, GM)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for kb in range(kblocks):
            a = ct.load(A, (pm, h, kb), (TM, 1, TK), padding_mode=_ZERO)
            y = ct.load(Y, (h, kb, pn), (1, TK, TN), padding_mode=_ZERO)
            acc = ct.mma(ct.reshape(a, (TM, TK)), ct.reshape(y, (TK, TN)), acc)
        _finish_3d(D, C, acc, pm, h, pn, HAS_C, C_IS_D)


@functools.cache
def get_kernel(name: str, cfg: TileConfig | None = None) -> Any:
    """The ``@ct.kernel`` of ``name`` (``"bmk"``, ``"heads"``, ``"reduce"``) with ``cfg``'s compiler hints."""
    body = {"bmk": _bmn_bnk_mn_gemm_impl, "heads": _heads_gemm_body, "reduce": _reduce_body}[name]
    return ct.kernel(body, **(cfg.compiler_options() if cfg is not None else {}))


def bmk_constants(cfg: TileConfig, *, split: bool, has_c: bool, c_is_d: bool) -> list[Any]:
    """The ``ct.Constant`` arguments of the ``bmk`` kernel, in parameter order."""
    return launch.trailing(
        _bmn_bnk_mn_gemm_impl, TM=cfg.bm, TN=cfg.bn, TK=cfg.bk, GM=cfg.gm, SPLIT=split, HAS_C=has_c, C_IS_D=c_is_d
    )


def reduce_constants(*, has_c: bool, c_is_d: bool) -> list[Any]:
    """The ``ct.Constant`` arguments of the reduce kernel, in parameter order."""
    rm, rn = REDUCE_TILE
    return launch.trailing(_reduce_body, RM=rm, RN=rn, HAS_C=has_c, C_IS_D=c_is_d)


def heads_constants(cfg: TileConfig, *, has_c: bool, c_is_d: bool) -> list[Any]:
    """The ``ct.Constant`` arguments of the ``heads`` kernel, in parameter order."""
    return launch.trailing(_heads_gemm_body, TM=cfg.bm, TN=cfg.bn, TK=cfg.bk, GM=cfg.gm, HAS_C=has_c, C_IS_D=c_is_d)


# ------------------------------------------------------------------------------- host helpers


def check_sizes(*tensors: torch.Tensor) -> None:
    """The kernels are compiled (and gated) with int32 indexing: refuse tensors of ``2**31`` elements or more."""
    for t in tensors:
        if t.numel() >= 2**31:
            raise Unsupported("a tensor has >= 2**31 elements (int32 indexing)")


def separate_addend(d: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor | None:
    """``c`` itself, unless it shares ``d``'s memory without being ``d`` (same address and strides): then a
    clone, since kernels write ``d`` tile by tile while other tiles still read ``c``."""
    if c is None or (c.data_ptr() == d.data_ptr() and c.stride() == d.stride()):
        return c
    if c.untyped_storage().data_ptr() == d.untyped_storage().data_ptr():
        return c.clone()
    return c


def addend(d: torch.Tensor, c: torch.Tensor | None) -> tuple[torch.Tensor, bool, bool]:
    """``(C array, has_c, c_is_d)`` for a kernel epilogue: ``c`` is read from ``d`` itself when it is ``d``."""
    c = separate_addend(d, c)
    if c is None:
        return d, False, False
    if c is d or (c.data_ptr() == d.data_ptr() and c.stride() == d.stride()):
        return d, True, True
    return launch.as_row_major(c), True, False


def with_addend(d: torch.Tensor, c: torch.Tensor | None, run: Callable[[torch.Tensor], Any]) -> torch.Tensor:
    """``run(out)`` computes the fp32 product into ``out``; without ``c`` into ``d`` itself (rounded there once),
    with it into an fp32 temporary, then ``d = round(tmp + c)`` (the reference's epilogue)."""
    if c is None:
        run(d)
        return d
    tmp = torch.empty(d.shape, dtype=torch.float32, device=d.device)
    run(tmp)
    return d.copy_(tmp.add_(c.to(torch.float32)))


#: The largest ``expected_m`` (the masked GEMM's config hint) given for an fp32 output: up to 64 expected rows
#: the masked kernels take 64-row tiles, whose fp32-output variants compile spill-free (the wider ones spill).
FP32_OUT_MAX_HINT = 64


def masked_hint(batch: int, out_dtype: torch.dtype) -> int:
    """The ``expected_m`` for a masked GEMM of ``batch`` valid rows per group writing ``out_dtype``."""
    return min(batch, FP32_OUT_MAX_HINT) if out_dtype == torch.float32 else batch


_ROWS: dict[tuple, torch.Tensor] = {}


def rows_tensor(groups: int, rows: int, device: torch.device) -> torch.Tensor:
    """A cached int32 ``[groups]`` tensor full of ``rows`` on ``device`` (masked_m of all-valid groups, or ks)."""
    key = (str(device), groups, rows)
    t = _ROWS.get(key)
    if t is None:
        t = _ROWS[key] = torch.full((groups,), rows, dtype=torch.int32, device=device)
    return t


# ---------------------------------------------------------------------------------- host paths


def _workspace(d: torch.Tensor, splits: int, stream: Any) -> torch.Tensor:
    """The fp32 ``[splits, M, N]`` partials of ``stream`` (``None``: the current one; rows padded to 16 bytes; a 1x1x1
    dummy for 0)."""
    stream = (launch.current_stream() if stream is None else stream).cuda_stream
    if splits == 0:
        return launch.scratch(d.device, stream, torch.float32, 4)[:4].view(1, 1, 4)[:, :, :1]
    m, n = d.shape
    pitch = launch.cdiv(n, 4) * 4
    buf = launch.scratch(d.device, stream, torch.float32, splits * m * pitch)
    return buf[: splits * m * pitch].view(splits, m, pitch)[:, :, :n]


def bmk_bnk_mn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[M, N] = sum_s a[s] @ b[s].T (+ c)`` (a ``[S, M, K]``, b ``[S, N, K]``), fp32 sum rounded once; on
    ``stream``."""
    s_dim, m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return d
    if s_dim == 0 or k == 0:  # an empty sum: d = c (or 0), no kernel
        return d.copy_(c) if c is not None else d.zero_()
    check_sizes(a, b, d)
    a, b = launch.as_row_major(a), launch.as_row_major(b)
    c_arg, has_c, c_is_d = addend(d, c)
    sms = launch.num_sms()
    tiles = launch.cdiv(m, BMK_CONFIG.bm) * launch.cdiv(n, BMK_CONFIG.bn)
    steps = s_dim * launch.cdiv(k, BMK_CONFIG.bk)
    splits, per = split_steps(tiles, steps, sms * BMK_CONFIG.ctas_per_sm)
    split = splits > 1
    cfg = bmk_config(has_c and not split)  # a split call adds c in the reduce kernel
    grid = launch.persistent_grid(tiles * splits, cfg.ctas_per_sm, sms)
    print_once("einsum bmk,bnk->mn", (s_dim, m, n, k), f"{cfg.name} grid={grid} split={splits}")
    work = _workspace(d, splits if split else 0, stream)
    consts = bmk_constants(cfg, split=split, has_c=has_c and not split, c_is_d=c_is_d and not split)
    launch.launch(get_kernel("bmk", cfg), grid, (a, b, d, c_arg, work, per, *consts), stream)
    if split:
        rm, rn = REDUCE_TILE
        rgrid = (launch.cdiv(m, rm), launch.cdiv(n, rn), 1)
        rconsts = reduce_constants(has_c=has_c, c_is_d=c_is_d)
        launch.launch(get_kernel("reduce"), rgrid, (work, d, c_arg, splits, *rconsts), stream)
    return d


def bhd_hdr_bhr(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[x, h] = a[x, h] @ b[h] (+ c)``: a ``[B, H, D]``, b ``[H, D, R]``, d ``[B, H, R]``, fp32, rounded once."""
    batch, heads, k = a.shape
    n = b.shape[2]
    if batch == 0 or heads == 0 or n == 0:
        return d
    if k == 0:
        return d.copy_(c) if c is not None else d.zero_()
    check_sizes(a, b, d)
    a, b = launch.as_row_major(a), launch.as_row_major(b)
    c_arg, has_c, c_is_d = addend(d, c)
    cfg = heads_config(batch, has_c)
    sms = launch.num_sms()
    tiles = heads * launch.cdiv(batch, cfg.bm) * launch.cdiv(n, cfg.bn)
    grid = launch.persistent_grid(tiles, cfg.ctas_per_sm, sms)
    print_once("einsum bhd,hdr->bhr", (batch, heads, k, n), f"{cfg.name} grid={grid} split=1")
    consts = heads_constants(cfg, has_c=has_c, c_is_d=c_is_d)
    launch.launch(get_kernel("heads", cfg), grid, (a, b, d, c_arg, *consts), stream)
    return d


def bhr_hdr_bhd(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None, stream: Any) -> torch.Tensor:
    """``d[x, h] = b[h] @ a[x, h] (+ c)``: the masked m-grouped BF16 GEMM, one group of ``B`` valid rows per head, on
    ``stream``."""
    batch, heads, _ = a.shape
    masked = get_impl("m_grouped_bf16_gemm_nt_masked", "cutile")
    masked_m = rows_tensor(heads, batch, d.device)

    def run(out: torch.Tensor) -> None:
        hint = masked_hint(batch, out.dtype)
        masked(a=a.transpose(0, 1), b=b, d=out.transpose(0, 1), masked_m=masked_m, expected_m=hint, stream=stream)

    return with_addend(d, c, run)


EXPRESSIONS: dict[str, Callable[..., torch.Tensor]] = {
    "bmk,bnk->mn": bmk_bnk_mn,
    "bhr,hdr->bhd": bhr_hdr_bhd,
    "bhd,hdr->bhr": bhd_hdr_bhr,
}


@register_impl("einsum", "cutile")
def einsum(expr, a, b, d, c, stream):
    """cuTile BF16 einsum (see the module docstring for how each expression maps onto kernels)."""
    path = EXPRESSIONS.get(expr)
    if path is None:
        raise Unsupported(f"einsum expression {expr!r}")
    return path(a, b, d, c, stream)
