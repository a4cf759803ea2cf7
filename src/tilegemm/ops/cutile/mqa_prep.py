"""cuTile kernels that make the MQA-logits ops' operands on the GPU, one launch each (DeepSeek's indexer recipe).

* ``fp8_quantize_rows``: a CTA casts ``ROWS`` rows ``[ROWS, COLS]`` (``COLS``: the row length as a power of two,
  zero-padded) to FP8 with one scale per row (``tile_lib.fp8_quantize_padded``), after the Hadamard rotation when
  asked: ``y = (x @ S) * D**-0.5`` with ``S`` the +-1 Sylvester matrix on the tensor cores. The MMA takes bf16
  operands, so an fp16 or fp32 row is split into bf16 parts (``x = x1 + x2 (+ x3)``, each part exact) that the MMA
  sums in fp32: every product is exact, as in the fp32 reference.
* ``fp8_paged_append``: the same cast of the new keys ``x [B, S, D]`` (grid: row blocks x sequences), scattered into
  DeepGEMM's paged cache: token s of sequence b at position ``p = context_lens[b] - S + s``, block
  ``block_table[b, p // block_kv]``, slot ``p % block_kv``; a position outside the table or a block outside the
  cache is not written (every index checked before the scatters; ``block_kv`` a compile-time constant, so the
  block and slot are shifts).
* ``fp8_indexer_prepare``: a decode step's operands of the paged op in one launch, grid (mask tiles + query row
  blocks + key row blocks, B): with an attention mask, the first CTAs of each sequence reduce one ``[rows, keys]``
  tile of its mask each (``heuristics.prepare_mask_tile``) to its rows' last visible key + 1, the window ends (the
  paged op's context lengths): stored where one tile spans the mask's keys, else combined by ``atomic_max`` into
  ends zeroed before the launch; the next cast its query rows
  ``[S * H, D]`` as ``fp8_quantize_rows`` does and write their weights times ``weight_scale`` times their scales;
  the last append its keys as ``fp8_paged_append`` does. The same tile code on the same tiles as those two ops, so
  the same bits. A repeated call replays its plan (the registry's hot lane: ``checks.fp8_indexer_prepare_signature``,
  :func:`prepare_plan`).
* ``indexer_decode_prepare``: the head weights times ``weight_scale`` and the mask rows' window ends of a decode
  step scored by ``mqa_logits_batched`` (the BF16 indexer), grid (B, query row blocks): one CTA per block of up to
  4 rows, its mask's key tiles reduced in turn (a decode step's one row: one tile of 8,192 keys an iteration).
* ``get_paged_mqa_logits_metadata``: the schedule of ``ops.common.paged_mqa_schedule`` in one CTA: split counts,
  their total, and for every SM its first split as (batch, split within the batch), the batches walked in chunks
  of ``CHUNK``. The torch formula (``cumsum``, ``searchsorted``, ...) is about 15 kernels.

Nothing here synchronises the host, so a decode step of the FP8 key cache captures in a CUDA graph. The configs:
:func:`tilegemm.heuristics.cutile.fp8_rows_config`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import cuda.tile as ct
import torch

from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics import cutile as heuristics
from tilegemm.ops.common import hadamard_matrix, last_visible_ends, paged_mqa_split_kv, paged_views
from tilegemm.ops.cutile import launch, tile_lib

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO

#: The prepare kernel's ``MASK``: no mask, a boolean one (read as uint8), an additive float one.
MASK_NONE, MASK_BOOL, MASK_ADDITIVE = 0, 1, 2


def _rows_fp8(x, signs, inv_sqrt: float, ROWS: int, COLS: int, SPLITS: int, HADAMARD: bool):
    """Tile code: rows ``x [ROWS, COLS]`` (any float dtype; ``SPLITS``: its bf16 parts, 1 for bf16) rotated
    (``HADAMARD``) and cast: fp8 ``[ROWS, COLS]`` and fp32 scales ``[ROWS, 1]``."""
    y = ct.astype(x, ct.float32)
    if HADAMARD:
        h = ct.load(signs, (0, 0), (COLS, COLS))
        acc = ct.zeros((ROWS, COLS), dtype=ct.float32)
        if SPLITS == 1:  # a bf16 tile is its own one part: to the MMA as loaded, not through fp32 and back
            acc = ct.mma(x, h, acc)
        else:
            for _ in ct.static_iter(range(SPLITS)):
                part = ct.astype(y, ct.bfloat16)
                acc = ct.mma(part, h, acc)
                y = y - ct.astype(part, ct.float32)
        y = acc * inv_sqrt
    return tile_lib.fp8_quantize_padded(y, 1)  # a decode step's one key: 15 padding rows of 16


def _quantize_rows(
    x, signs, q, scales, inv_sqrt: float, ROWS: ConstInt, COLS: ConstInt, SPLITS: ConstInt, HADAMARD: ConstBool
):
    """``x [N, D]`` -> ``q`` fp8 ``[N, D]``, ``scales`` fp32 ``[N]``: rows ``[bid(0) * ROWS, +ROWS)``."""
    r = ct.bid(0)
    rows = ct.load(x, (r, 0), (ROWS, COLS), padding_mode=_ZERO)
    data, scale = _rows_fp8(rows, signs, inv_sqrt, ROWS, COLS, SPLITS, HADAMARD)
    ct.store(q, (r, 0), data)
    ct.store(scales, (r,), ct.reshape(scale, (ROWS,)))


def _paged_append(
    x, signs, context_lens, block_table, kv_keys, kv_scales, inv_sqrt: float,
    ROWS: ConstInt, COLS: ConstInt, SPLITS: ConstInt, HADAMARD: ConstBool, PER_SEQUENCE: ConstBool, BLOCK_KV: ConstInt,
):  # fmt: skip
    """``x [B, S, D]``: tokens ``[bid(0) * ROWS, +ROWS)`` of sequence ``bid(1)`` into ``kv_keys`` fp8
    ``[blocks, BLOCK_KV, D]`` and ``kv_scales`` fp32 ``[blocks, BLOCK_KV]`` (views of one paged cache);
    ``context_lens``: int ``[B]`` (``PER_SEQUENCE``) or ``[1]``, each sequence's length after the append."""
    _append_rows(
        x, signs, context_lens, block_table, kv_keys, kv_scales, inv_sqrt, ct.bid(0), ct.bid(1),
        ROWS, COLS, SPLITS, HADAMARD, PER_SEQUENCE, BLOCK_KV,
    )  # fmt: skip


def _indexer_prepare(
    q, w, x, signs, context_lens, block_table, kv_keys, kv_scales, q8, w8, mask, ends,
    inv_sqrt: float, weight_scale: float, mask_min: float,
    ROWS: ConstInt, COLS: ConstInt, Q_SPLITS: ConstInt, K_SPLITS: ConstInt, HADAMARD: ConstBool,
    PER_SEQUENCE: ConstBool, BLOCK_KV: ConstInt, MASK: ConstInt, MASK_ROWS: ConstInt, MASK_COLS: ConstInt,
    MASK_STORE: ConstBool,
):  # fmt: skip
    """``q [B, S * H, D]``, ``w [B, S * H]``, ``x [B, S, D]``: CTA ``(r, b)`` casts query rows ``[r * ROWS, +ROWS)``
    of sequence ``b`` into ``q8`` fp8 ``[B, S * H, D]`` and their weights times ``weight_scale`` times their scales
    into ``w8`` fp32 ``[B, S * H]``; past the query row blocks, it appends key rows as :func:`_paged_append`. With a
    ``MASK`` (``MASK_BOOL``: ``mask`` uint8 ``[B, S, T]``, nonzero where visible; ``MASK_ADDITIVE``: float, visible
    above ``mask_min``), the first CTAs of each sequence reduce its mask instead (:func:`_window_ends`) into
    ``ends`` int32 ``[B, S]`` (``MASK_STORE``: one tile spans the keys, so each end is stored; else the tiles' ends
    are combined by atomics into ends zeroed before the launch)."""
    r, b = ct.bid(0), ct.bid(1)
    if MASK != MASK_NONE:
        chunks = ct.cdiv(mask.shape[2], MASK_COLS)
        mask_blocks = ct.cdiv(mask.shape[1], MASK_ROWS) * chunks
        if r < mask_blocks:
            _window_ends(
                mask, ends, mask_min, b, r // chunks, r % chunks, MASK_ROWS, MASK_COLS, MASK == MASK_ADDITIVE,
                MASK_STORE,
            )  # fmt: skip
        else:
            _prepare_rows(
                q, w, x, signs, context_lens, block_table, kv_keys, kv_scales, q8, w8, inv_sqrt, weight_scale,
                r - mask_blocks, b, ROWS, COLS, Q_SPLITS, K_SPLITS, HADAMARD, PER_SEQUENCE, BLOCK_KV,
            )  # fmt: skip
    else:
        _prepare_rows(
            q, w, x, signs, context_lens, block_table, kv_keys, kv_scales, q8, w8, inv_sqrt, weight_scale,
            r, b, ROWS, COLS, Q_SPLITS, K_SPLITS, HADAMARD, PER_SEQUENCE, BLOCK_KV,
        )  # fmt: skip


def _window_ends(mask, ends, mask_min: float, b, rb, c, ROWS: int, COLS: int, ADDITIVE: bool, STORE: bool):
    """Tile code: :func:`_tile_ends` of one tile into ``ends[b, row]``: stored (``STORE``: the tile spans the keys),
    else max-combined (rows past the mask's: no update)."""
    last = _tile_ends(mask, mask_min, b, rb, c, ROWS, COLS, ADDITIVE)
    if STORE:
        ct.store(ends, (b, rb), last)
    else:
        rows = ct.reshape(rb * ROWS + ct.arange(ROWS, dtype=ct.int32), (1, ROWS))
        ct.atomic_max(ends, (b, rows), last, memory_order=ct.MemoryOrder.RELAXED)


def _tile_ends(mask, mask_min: float, b, rb, c, ROWS: int, COLS: int, ADDITIVE: bool):
    """Tile code: mask rows ``[rb * ROWS, +ROWS)`` of sequence ``b``, keys ``[c * COLS, +COLS)``: int32 ``[1, ROWS]``,
    each row's last visible key + 1 in that tile (0: none; ``ADDITIVE``: visible above ``mask_min``)."""
    keys = mask.shape[2]
    seen = ct.load(mask, (b, rb, c), (1, ROWS, COLS), padding_mode=_ZERO)
    if ADDITIVE:
        visible = ct.astype(seen, ct.float32) > mask_min
    else:
        visible = seen != 0
    cols = ct.reshape(c * COLS + ct.arange(COLS, dtype=ct.int32) + 1, (1, 1, COLS))
    return ct.max(ct.where(visible & (cols <= keys), cols, 0), axis=2)


def _decode_prepare(
    w, mask, w_out, ends, weight_scale: float, mask_min: float,
    ROWS: ConstInt, HEADS: ConstInt, MASK: ConstInt, MASK_COLS: ConstInt,
):  # fmt: skip
    """``w [B, S, H]``: CTA ``(b, r)`` writes rows ``[r * ROWS, +ROWS)`` of sequence ``b`` times ``weight_scale``
    into ``w_out`` fp32 ``[B, S, H]`` (``HEADS``: H as a power of two), and with a ``MASK`` their last visible key
    + 1 into ``ends`` int32 ``[B, S]``, over the mask's key tiles in turn (no atomics: no zeroed ends)."""
    b, r = ct.bid(0), ct.bid(1)
    weights = ct.astype(ct.load(w, (b, r, 0), (1, ROWS, HEADS), padding_mode=_ZERO), ct.float32)
    ct.store(w_out, (b, r, 0), weights * weight_scale)
    if MASK != MASK_NONE:
        last = ct.zeros((1, ROWS), dtype=ct.int32)
        for c in range(ct.cdiv(mask.shape[2], MASK_COLS)):
            last = ct.maximum(last, _tile_ends(mask, mask_min, b, r, c, ROWS, MASK_COLS, MASK == MASK_ADDITIVE))
        ct.store(ends, (b, r), last)


def _prepare_rows(
    q, w, x, signs, context_lens, block_table, kv_keys, kv_scales, q8, w8, inv_sqrt: float, weight_scale: float,
    r, b, ROWS: int, COLS: int, Q_SPLITS: int, K_SPLITS: int, HADAMARD: bool, PER_SEQUENCE: bool, BLOCK_KV: int,
):  # fmt: skip
    """Tile code of :func:`_indexer_prepare`'s query and key CTAs: row block ``r`` of sequence ``b``."""
    q_blocks = ct.cdiv(q.shape[1], ROWS)
    if r < q_blocks:
        rows = ct.reshape(ct.load(q, (b, r, 0), (1, ROWS, COLS), padding_mode=_ZERO), (ROWS, COLS))
        data, scale = _rows_fp8(rows, signs, inv_sqrt, ROWS, COLS, Q_SPLITS, HADAMARD)
        ct.store(q8, (b, r, 0), ct.reshape(data, (1, ROWS, COLS)))
        weights = ct.astype(ct.load(w, (b, r), (1, ROWS), padding_mode=_ZERO), ct.float32)
        ct.store(w8, (b, r), weights * weight_scale * ct.reshape(scale, (1, ROWS)))
    else:
        _append_rows(
            x, signs, context_lens, block_table, kv_keys, kv_scales, inv_sqrt, r - q_blocks, b,
            ROWS, COLS, K_SPLITS, HADAMARD, PER_SEQUENCE, BLOCK_KV,
        )  # fmt: skip


def _append_rows(
    x, signs, context_lens, block_table, kv_keys, kv_scales, inv_sqrt: float, r, b,
    ROWS: int, COLS: int, SPLITS: int, HADAMARD: bool, PER_SEQUENCE: bool, BLOCK_KV: int,
):  # fmt: skip
    """Tile code of the appends: tokens ``[r * ROWS, +ROWS)`` of sequence ``b`` of ``x [B, S, D]`` cast and
    scattered into the cache (:func:`_paged_append`'s arguments). ``BLOCK_KV`` (the cache's ``block_kv``) is a
    constant so that a position's block and slot are shifts, not integer divisions (sm_90 SASS of the 128-wide
    rotated append: 2072 instructions with it read from the cache's shape, 1656 as a constant)."""
    count = x.shape[1]
    rows = ct.reshape(ct.load(x, (b, r, 0), (1, ROWS, COLS), padding_mode=_ZERO), (ROWS, COLS))
    data, scale = _rows_fp8(rows, signs, inv_sqrt, ROWS, COLS, SPLITS, HADAMARD)
    if PER_SEQUENCE:
        end = ct.astype(ct.gather(context_lens, b), ct.int32)
    else:
        end = ct.astype(ct.gather(context_lens, 0), ct.int32)
    token = r * ROWS + ct.arange(ROWS, dtype=ct.int32)
    pos = end - count + token
    block_kv = BLOCK_KV
    live = (token < count) & (pos >= 0) & (pos < block_table.shape[1] * block_kv)
    pos = ct.where(live, pos, 0)
    blk = ct.gather(block_table, (b, pos // block_kv), mask=live, padding_value=-1, check_bounds=False)
    live = live & (blk >= 0) & (blk < kv_keys.shape[0])  # every index below checked here
    slot = pos % block_kv
    cols = ct.reshape(ct.arange(COLS, dtype=ct.int32), (1, COLS))
    blk2, slot2, live2 = ct.reshape(blk, (ROWS, 1)), ct.reshape(slot, (ROWS, 1)), ct.reshape(live, (ROWS, 1))
    keys_mask = live2 & (cols < kv_keys.shape[2])
    ct.scatter(kv_keys, (blk2, slot2, cols), data, mask=keys_mask, check_bounds=False)
    ct.scatter(kv_scales, (blk, slot), ct.reshape(scale, (ROWS,)), mask=live, check_bounds=False)


def _paged_schedule(context_lens, meta, SPLIT: ConstInt, NN: ConstInt, CHUNK: ConstInt, SMS: ConstInt):
    """``meta`` int32 ``[num_sms + 1, 2]`` from ``context_lens`` int32 ``[B, NN]`` (``SMS``: a power of two
    > ``num_sms``): ``ops.common.paged_mqa_schedule``'s rows, one CTA."""
    batch = context_lens.shape[0]
    num_sms = meta.shape[0] - 1
    total = ct.zeros((1,), dtype=ct.int32)
    for c in range(ct.cdiv(batch, CHUNK)):
        lens = ct.max(ct.load(context_lens, (c, 0), (CHUNK, NN), padding_mode=_ZERO), axis=1)
        total = total + ct.sum((ct.maximum(lens, 0) + (SPLIT - 1)) // SPLIT, axis=0, keepdims=True)
    base = total // num_sms
    sm = ct.arange(SMS, dtype=ct.int32)
    start = ct.reshape(sm * base + ct.minimum(sm, total - base * num_sms), (SMS, 1))
    before = ct.zeros((SMS, 1), dtype=ct.int32)  # batches whose splits all start before an SM's first split
    first = ct.zeros((SMS, 1), dtype=ct.int32)  # the splits of those batches
    seen = ct.zeros((1, 1), dtype=ct.int32)
    for c in range(ct.cdiv(batch, CHUNK)):
        lens = ct.max(ct.load(context_lens, (c, 0), (CHUNK, NN), padding_mode=_ZERO), axis=1)
        counts = ct.reshape((ct.maximum(lens, 0) + (SPLIT - 1)) // SPLIT, (1, CHUNK))
        ends = seen + ct.cumsum(counts, axis=1)
        inside = ct.reshape(c * CHUNK + ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK)) < batch
        done = inside & (ends <= start)
        before = before + ct.sum(ct.astype(done, ct.int32), axis=1, keepdims=True)
        first = first + ct.sum(ct.where(done, counts, 0), axis=1, keepdims=True)
        seen = seen + ct.sum(counts, axis=1, keepdims=True)
    row = ct.reshape(sm, (SMS, 1))
    live = row <= num_sms
    ct.scatter(meta, (row, 0), before, mask=live)
    ct.scatter(meta, (row, 1), start - first, mask=live)


#: ``get_kernel(name)``: the cached ``@ct.kernel`` of ``quantize_rows``, ``paged_append``, ``indexer_prepare``,
#: ``decode_prepare``, ``paged_schedule``.
get_kernel = launch.kernel_factory(
    {
        "quantize_rows": _quantize_rows,
        "paged_append": _paged_append,
        "indexer_prepare": _indexer_prepare,
        "decode_prepare": _decode_prepare,
        "paged_schedule": _paged_schedule,
    },
    hints=False,
)


def rows_constants(
    cfg: heuristics.Fp8RowsConfig, hadamard: bool, per_sequence: bool | None = None, block_kv: int = 0
) -> list[Any]:
    """The ``ct.Constant`` arguments of the row kernels for ``cfg`` (``per_sequence`` and ``block_kv``: the append
    kernel's)."""
    named = dict(ROWS=cfg.rows, COLS=cfg.cols, SPLITS=cfg.splits, HADAMARD=hadamard)
    if per_sequence is None:
        return launch.trailing(_quantize_rows, **named)
    return launch.trailing(_paged_append, **named, PER_SEQUENCE=per_sequence, BLOCK_KV=block_kv)


def prepare_constants(
    q_cfg: heuristics.Fp8RowsConfig,
    k_cfg: heuristics.Fp8RowsConfig,
    hadamard: bool,
    per_sequence: bool,
    block_kv: int,
    mask: int = MASK_NONE,
    mask_rows: int = 1,
    mask_keys: int = 0,
) -> list[Any]:
    """The ``ct.Constant`` arguments of the indexer-prepare kernel (the query rows' and the keys' tiles differ only
    in their bf16 parts; ``mask``: ``MASK_NONE``, ``MASK_BOOL`` or ``MASK_ADDITIVE``, over ``mask_rows`` query rows
    a sequence and ``mask_keys`` keys)."""
    tile_rows, tile_cols = heuristics.prepare_mask_tile(mask_rows)
    return launch.trailing(
        _indexer_prepare,
        ROWS=q_cfg.rows,
        COLS=q_cfg.cols,
        Q_SPLITS=q_cfg.splits,
        K_SPLITS=k_cfg.splits,
        HADAMARD=hadamard,
        PER_SEQUENCE=per_sequence,
        BLOCK_KV=block_kv,
        MASK=mask,
        MASK_ROWS=tile_rows,
        MASK_COLS=tile_cols,
        MASK_STORE=ends_stored(mask, mask_rows, mask_keys),
    )


def ends_stored(mask: int, mask_rows: int, mask_keys: int) -> bool:
    """Whether the indexer-prepare kernel stores each window end (``MASK_STORE``): one mask tile spans the keys, so
    one CTA reduces each row; otherwise the tiles' ends combine by atomics into zeroed ends."""
    return mask != MASK_NONE and mask_keys <= heuristics.prepare_mask_tile(mask_rows)[1]


def mask_kind(attention_mask: torch.Tensor | None) -> int:
    """The prepare kernel's ``MASK`` for an attention mask (``None``, boolean, additive float)."""
    if attention_mask is None:
        return MASK_NONE
    return MASK_BOOL if attention_mask.dtype == torch.bool else MASK_ADDITIVE


class MaskInputs(NamedTuple):
    """What a prepare kernel is given of a call's attention mask: its ``kind`` (``MASK_NONE`` where no launch
    reduces it), the additive mask's ``mask_min`` (a key is visible above it), and the placeholders passed for
    ``MASK_NONE`` (never read)."""

    kind: int
    mask_min: float
    no_mask: torch.Tensor
    no_ends: torch.Tensor

    def operands(self, attention_mask: torch.Tensor | None, ends: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """The kernel's (mask, ends) arguments: the placeholders for ``MASK_NONE``, else the mask made contiguous
        (a boolean one viewed as uint8) and ``ends``."""
        if self.kind == MASK_NONE:
            return self.no_mask, self.no_ends
        mask = attention_mask if attention_mask.is_contiguous() else attention_mask.contiguous()
        return (mask.view(torch.uint8) if self.kind == MASK_BOOL else mask), ends


def mask_inputs(attention_mask: torch.Tensor | None, runs: bool, device: torch.device) -> MaskInputs:
    """The :class:`MaskInputs` of a prepare call: ``MASK_NONE`` also where no launch runs (``runs`` false) or the
    mask has no keys (every window end 0, nothing to reduce)."""
    kind = mask_kind(attention_mask)
    if not runs or (kind != MASK_NONE and attention_mask.shape[2] == 0):
        kind = MASK_NONE
    mask_min = float(torch.finfo(attention_mask.dtype).min) if kind == MASK_ADDITIVE else 0.0
    no_mask = torch.empty(1, 1, 1, dtype=torch.uint8, device=device)
    no_ends = torch.empty(1, 1, dtype=torch.int32, device=device)
    return MaskInputs(kind, mask_min, no_mask, no_ends)


def schedule_constants(block_kv: int, next_n: int, num_sms: int) -> list[Any]:
    """The ``ct.Constant`` arguments of the schedule kernel."""
    sms = 1 << num_sms.bit_length()  # a power of two > num_sms
    nn = 1 << max(0, next_n - 1).bit_length()
    return launch.trailing(
        _paged_schedule, SPLIT=paged_mqa_split_kv(block_kv), NN=nn, CHUNK=heuristics.SCHEDULE_CHUNK, SMS=sms
    )


def _rows_config(x: torch.Tensor, hadamard: bool) -> heuristics.Fp8RowsConfig:
    cfg = heuristics.fp8_rows_config(x.shape[-1], x.dtype)
    if cfg is None or (hadamard and x.shape[-1] > heuristics.FP8_ROWS_MAX_HADAMARD):
        raise Unsupported(
            f"FP8 rows of {x.shape[-1]} elements{' with the Hadamard rotation' if hadamard else ''} (the kernel takes "
            f"rows of up to {heuristics.FP8_ROWS_MAX_COLS}, rotated rows of a power of two up to "
            f"{heuristics.FP8_ROWS_MAX_HADAMARD})"
        )
    return cfg


def _signs(cfg: heuristics.Fp8RowsConfig, hadamard: bool, device: torch.device) -> torch.Tensor:
    """The kernel's +-1 Sylvester matrix ``[COLS, COLS]`` (its first ``D`` columns of a zero-padded row are the
    rotation of the row's ``D``), or a ``[1, 1]`` placeholder the kernel does not read."""
    return hadamard_matrix(cfg.cols if hadamard else 1, device, torch.bfloat16, signs=True)


@register_impl("fp8_quantize_rows", "cutile")
def fp8_quantize_rows(x: torch.Tensor, hadamard: bool, stream) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 rows of ``x [..., D]`` (see the module docstring): problem -> config -> operands -> launch."""
    dim = x.shape[-1]
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    cfg = _rows_config(x, hadamard)
    if q.numel() == 0:
        return q, scales
    rows = x.reshape(-1, dim)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    args = (rows, _signs(cfg, hadamard, x.device), q.view(-1, dim), scales.view(-1), dim**-0.5)
    grid = (launch.cdiv(rows.shape[0], cfg.rows), 1, 1)
    launch.launch(get_kernel("quantize_rows"), grid, (*args, *rows_constants(cfg, hadamard)), stream)
    return q, scales


@register_impl("fp8_paged_append", "cutile")
def fp8_paged_append(
    x: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    hadamard: bool,
    stream,
) -> torch.Tensor:
    """Append ``x [B, S, D]`` to the paged cache (see the module docstring): problem -> config -> operands ->
    launch."""
    batch, count, dim = x.shape
    cfg = _rows_config(x, hadamard)
    if batch == 0 or count == 0:
        return kv_cache
    if x.stride(-1) != 1:
        x = x.contiguous()
    kv_keys, kv_scales = paged_views(kv_cache, dim)
    lens = context_lens.reshape(-1)
    args = (x, _signs(cfg, hadamard, x.device), lens, block_table, kv_keys, kv_scales, dim**-0.5)
    grid = (launch.cdiv(count, cfg.rows), batch, 1)
    per_sequence = lens.shape[0] > 1 or batch == 1
    consts = rows_constants(cfg, hadamard, per_sequence, kv_cache.shape[1])
    launch.launch(get_kernel("paged_append"), grid, (*args, *consts), stream)
    return kv_cache


@register_impl("fp8_indexer_prepare", "cutile")
def fp8_indexer_prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    hadamard: bool,
    weight_scale: float,
    attention_mask: torch.Tensor | None,
    stream,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Cast the queries, scale the weights, append the keys and reduce the mask in one launch (see the module
    docstring): :func:`prepare_plan`, run."""
    run = prepare_plan(q, k, kv_cache, context_lens, hadamard, weight_scale, attention_mask)
    return run(q, k, weights, kv_cache, block_table, context_lens, attention_mask, stream)


def prepare_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    hadamard: bool,
    weight_scale: float,
    attention_mask: torch.Tensor | None = None,
) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """The launch plan of an indexer-prepare call shaped as this one, ``run(q, k, weights, kv_cache, block_table,
    context_lens, attention_mask, stream=None) -> (q_fp8, w, ends)``: problem -> config -> constants and grid (mask
    chunks + query row blocks + key row blocks, B) fixed; a run makes its outputs (``ends`` zeroed unless the kernel
    stores each), views its operands and launches once."""
    batch, count, heads, dim = q.shape
    q_cfg, k_cfg = _rows_config(q, hadamard), _rows_config(k, hadamard)
    kernel, runs = get_kernel("indexer_prepare"), batch * count * heads > 0
    masking = mask_inputs(attention_mask, runs, q.device)
    kind = masking.kind
    tile_rows, tile_cols = heuristics.prepare_mask_tile(count)
    mask_blocks = 0
    if kind != MASK_NONE:
        mask_blocks = launch.cdiv(count, tile_rows) * launch.cdiv(attention_mask.shape[2], tile_cols)
    q_blocks = launch.cdiv(count * heads, q_cfg.rows)
    grid = (mask_blocks + q_blocks + launch.cdiv(k.shape[1], q_cfg.rows), batch, 1)
    per_sequence = context_lens.numel() > 1 or batch == 1
    mask_keys = attention_mask.shape[2] if kind != MASK_NONE else 0
    consts = prepare_constants(q_cfg, k_cfg, hadamard, per_sequence, kv_cache.shape[1], kind, count, mask_keys)
    stored = ends_stored(kind, count, mask_keys)  # else the ends start at 0 (the tiles' atomics, or no reduction)
    signs = _signs(q_cfg, hadamard, q.device)
    ends_given = attention_mask is not None
    scalars = (dim**-0.5, float(weight_scale), masking.mask_min)

    def run(
        q, k, weights, kv_cache, block_table, context_lens, attention_mask, stream=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        q8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
        w8 = torch.empty(batch, count, heads, dtype=torch.float32, device=q.device)
        ends = None
        if not runs:  # no query rows (no heads or no tokens): the keys by the append kernel, the ends by torch
            fp8_paged_append(k, kv_cache, block_table, context_lens, hadamard, stream)
            if ends_given:
                ends = last_visible_ends(attention_mask)
        else:
            if ends_given:
                ends = (torch.empty if stored else torch.zeros)(batch, count, dtype=torch.int32, device=q.device)
            rows = q.reshape(batch, count * heads, dim)
            rows = rows if rows.stride(-1) == 1 else rows.contiguous()
            keys = k if k.stride(-1) == 1 else k.contiguous()
            keys = keys if keys.numel() else rows  # no keys: no key row block reads the array; no empty array passed
            kv_keys, kv_scales = paged_views(kv_cache, dim)
            mask, mask_ends = masking.operands(attention_mask, ends)
            args = (rows, weights.reshape(batch, count * heads), keys, signs, context_lens.reshape(-1), block_table)
            args += (kv_keys, kv_scales, q8.view(batch, count * heads, dim), w8.view(batch, count * heads))
            launch.launch(kernel, grid, (*args, mask, mask_ends, *scalars, *consts), stream)
        return q8, w8, ends

    return run


@register_replay("fp8_indexer_prepare", "cutile")
def _prepare_replay(
    derived: dict[str, Any],
) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] | None:
    """The hot-lane replay of a prepare call (``checks.fp8_indexer_prepare_signature``): its plan."""
    try:
        run = prepare_plan(
            derived["q"], derived["k"], derived["kv_cache"], derived["context_lens"], derived["hadamard"],
            derived["weight_scale"], derived["attention_mask"],
        )  # fmt: skip
    except Unsupported:
        return None
    return run


def decode_prepare_constants(heads: int, rows: int, mask: int) -> list[Any]:
    """The ``ct.Constant`` arguments of the decode-prepare kernel for ``heads`` heads, ``rows`` query rows a
    sequence and a ``mask`` kind."""
    tile_rows, tile_cols = heuristics.prepare_mask_tile(rows)
    return launch.trailing(
        _decode_prepare, ROWS=tile_rows, HEADS=1 << max(0, heads - 1).bit_length(), MASK=mask, MASK_COLS=tile_cols
    )


@register_impl("indexer_decode_prepare", "cutile")
def indexer_decode_prepare(
    weights: torch.Tensor, attention_mask: torch.Tensor | None, weight_scale: float, stream
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scaled weights and the mask's window ends in one launch: :func:`decode_prepare_plan`, run."""
    return decode_prepare_plan(weights, attention_mask, weight_scale)(weights, attention_mask, stream)


def decode_prepare_plan(
    weights: torch.Tensor, attention_mask: torch.Tensor | None, weight_scale: float
) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The launch plan of an ``indexer_decode_prepare`` call shaped as this one, ``run(weights, attention_mask,
    stream=None) -> (w, ends)``: grid (B, query row blocks), one CTA per block of up to
    ``heuristics.PREPARE_MASK_MAX_ROWS`` rows (its weights, then its mask rows' key tiles in turn)."""
    batch, count, heads = weights.shape
    if heads > heuristics.PREPARE_MASK_TILE_ELEMS // heuristics.PREPARE_MASK_MAX_ROWS:
        raise Unsupported(f"{heads} heads (the decode-prepare kernel holds a row block's weights in one tile)")
    runs, ends_given = batch * count * heads > 0, attention_mask is not None
    masking = mask_inputs(attention_mask, runs, weights.device)
    consts = decode_prepare_constants(heads, count, masking.kind)
    grid = (batch, launch.cdiv(count, consts[0]), 1)
    scalars = (float(weight_scale), masking.mask_min)

    def run(weights, attention_mask, stream=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = torch.empty(batch, count, heads, dtype=torch.float32, device=weights.device)
        ends = None
        if ends_given and masking.kind == MASK_NONE:  # no keys (0 each), or no heads: no launch reduces the mask
            ends = last_visible_ends(attention_mask)
        elif ends_given:
            ends = torch.empty(batch, count, dtype=torch.int32, device=weights.device)
        if runs:
            mask, mask_ends = masking.operands(attention_mask, ends)
            args = (weights if weights.is_contiguous() else weights.contiguous(), mask, w, mask_ends, *scalars)
            launch.launch(get_kernel("decode_prepare"), grid, (*args, *consts), stream)
        return w, ends

    return run


@register_replay("indexer_decode_prepare", "cutile")
def _decode_prepare_replay(
    derived: dict[str, Any],
) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None:
    """The hot-lane replay of a decode-prepare call (``checks.indexer_decode_prepare_signature``): its plan."""
    try:
        return decode_prepare_plan(derived["weights"], derived["attention_mask"], derived["weight_scale"])
    except Unsupported:
        return None


def paged_schedule(context_lens: torch.Tensor, block_kv: int, num_sms: int, stream=None) -> torch.Tensor:
    """The paged-MQA schedule int32 ``[num_sms + 1, 2]`` of ``context_lens`` int32 ``[B]`` or ``[B, next_n]``, in one
    launch: ``ops.common.paged_mqa_schedule``'s values."""
    meta = torch.empty(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)
    lens = context_lens if context_lens.dim() == 2 else context_lens.view(-1, 1)
    if lens.dtype != torch.int32 or lens.stride(-1) != 1:
        lens = lens.to(torch.int32).contiguous()
    args = (lens, meta, *schedule_constants(block_kv, lens.shape[1], num_sms))
    launch.launch(get_kernel("paged_schedule"), (1, 1, 1), args, stream)
    return meta
