"""Helpers to feed the MQA-logits ops of DeepSeek's sparse-attention indexer.

Everything here is plain torch (and the MQA-logits ops) and runs on the CPU or on CUDA; nothing synchronises
beyond what the arguments require (Python lists of lengths are host data by nature).

* :func:`quantize_keys`: keys ``[S_kv, D]`` -> ``(fp8 [S_kv, D], fp32 [S_kv])`` with one scale per
  token, the ``kv`` operand of ``fp8_mqa_logits``.
* :func:`build_paged_kv_cache`: per-sequence keys -> a paged ``kv_cache`` (uint8
  ``[num_blocks, block_kv, 1, D + 4]`` in DeepGEMM's byte layout), its ``block_table`` and
  ``context_lens`` for ``fp8_paged_mqa_logits``; :func:`read_paged_kv_cache` reads it back.
* ``ks``/``ke`` windows for ``fp8_mqa_logits``: :func:`causal_windows` (one sequence, optional
  sliding window), :func:`packed_causal_windows` (several sequences packed along both axes:
  batched or chunked prefill), :func:`context_parallel_windows` (the zig-zag split of one
  sequence over context-parallel ranks).
* :func:`index_scores`: a transformers sparse-attention indexer's masked scores ``[B, S, T]`` through
  :func:`tilegemm.bf16_mqa_logits` or (DeepSeek's FP8 recipe) :func:`tilegemm.fp8_mqa_logits`, never materializing
  ``[B, S, H, T]``; the scoring of the indexer swap (:mod:`tilegemm.transformers.indexer`), with its helpers
  :func:`hadamard_rotate`, :func:`quantize_rows` and the mask's windows (:mod:`tilegemm.indexer_mask`); its float64
  formula is :func:`tilegemm.testing.dense_index_scores`.

The cache layout: block ``blk`` is ``block_kv * (D + 4)`` bytes; the first ``block_kv * D`` bytes
are the FP8 keys of its ``block_kv`` tokens, token-major; the last ``4 * block_kv`` bytes are their
fp32 scales. The ``[num_blocks, block_kv, 1, D + 4]`` shape only sizes the block, so
``kv_cache[blk, t, 0, :D]`` is *not* token t's key (use :func:`read_paged_kv_cache`).

Example (prefill, then decode)::

    import tilegemm.ops.api as tg
    from tilegemm import indexer

    # prefill: q [S, H, D] fp8, keys [S_kv, D], weights [S, H] fp32
    kv = indexer.quantize_keys(keys)
    ks, ke = indexer.causal_windows(q.shape[0], keys.shape[0], device=q.device)
    logits = tg.fp8_mqa_logits(q, kv, weights, ks, ke)                      # [S, S_kv]

    # decode: per-sequence keys -> paged cache; q [B, next_n, H, D], weights [B * next_n, H]
    cache, table, lens = indexer.build_paged_kv_cache(keys_per_seq, block_kv=64)
    meta = tg.get_paged_mqa_logits_metadata(lens, 64, num_sms)
    logits = tg.fp8_paged_mqa_logits(q, cache, weights, lens, table, meta, int(lens.max()))
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from tilegemm.env import MQA_VARIANT
from tilegemm.heuristics.cutile.mqa import decode_sized
from tilegemm.indexer_mask import (
    DECODE_WINDOW_ROWS,
    apply_mask,
    clean_outside_windows,
    key_windows,
    zero_window_starts,
)
from tilegemm.ops import api
from tilegemm.ops.checks import value_checks_enabled
from tilegemm.ops.checks.mqa import index_scores_check
from tilegemm.ops.common import AMAX_EPS, FP8_MAX, fp8_cast_rows, hadamard_rotate  # noqa: F401  (public here too)

__all__ = [
    "FP8_MAX",
    "quantize_keys",
    "build_paged_kv_cache",
    "read_paged_kv_cache",
    "causal_windows",
    "packed_causal_windows",
    "context_parallel_windows",
    "index_scores",
    "hadamard_rotate",
    "quantize_rows",
]


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _count(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as a Python int >= ``minimum``: ``TypeError`` for a non-integer (a float such as 2.5 or 2.0, a
    bool, a str), ``ValueError`` below ``minimum``; the message names the argument."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: got {type(value).__name__} {value!r}, expected an int")
    if isinstance(value, torch.Tensor) and (value.dim() != 0 or value.dtype not in _INT_DTYPES):
        raise TypeError(f"{name}: got a {value.dtype} tensor of shape {list(value.shape)}, expected an int")
    number = int(value.__index__())  # type: ignore[attr-defined]
    if number < minimum:
        raise ValueError(f"{name}: got {number}, expected an int >= {minimum}")
    return number


def _counts(name: str, values: object) -> list[int]:
    """A sequence (list, tuple, 1-D integer tensor) of ints >= 0, as a list; errors name ``name`` and the entry."""
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype not in _INT_DTYPES:
            raise TypeError(f"{name}: got a {values.dtype} tensor of shape {list(values.shape)}, expected 1-D integers")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}: got {type(values).__name__}, expected a sequence of ints")
    return [_count(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _tensor(name: str, value: object, dims: int, dtypes: tuple[torch.dtype, ...] | None, what: str) -> torch.Tensor:
    """``value`` if it is a ``dims``-D tensor of one of ``dtypes`` (``None``: any float), else TypeError/ValueError."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: got {type(value).__name__}, expected a tensor {what}")
    if dtypes is None and not value.is_floating_point():
        raise TypeError(f"{name}: got dtype {value.dtype}, expected a float tensor {what}")
    if dtypes is not None and value.dtype not in dtypes:
        raise TypeError(f"{name}: got dtype {value.dtype}, expected {' or '.join(map(str, dtypes))} {what}")
    if value.dim() != dims:
        raise ValueError(f"{name}: got shape {list(value.shape)}, expected {what}")
    return value


def quantize_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize keys per token: ``keys ~= fp8.float() * scale[:, None]``.

    Args:
        keys: float tensor ``[S_kv, D]`` (any float dtype, CPU or CUDA).

    Returns:
        ``(fp8 [S_kv, D] float8_e4m3fn, fp32 [S_kv])`` with ``scale = max(amax_row, 1e-4) / 448``,
        the ``kv`` operand of :func:`tilegemm.fp8_mqa_logits`.
    """
    _tensor("keys", keys, 2, None, "[S_kv, D]")
    return fp8_cast_rows(keys)


def _as_fp8_keys(
    keys: torch.Tensor | tuple[torch.Tensor, torch.Tensor], name: str = "keys"
) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(keys, tuple):
        if len(keys) != 2:
            raise ValueError(f"{name}: got a tuple of {len(keys)}, expected (fp8 [L, D], fp32 scales [L])")
        data = _tensor(f"{name}[0]", keys[0], 2, (torch.float8_e4m3fn,), "[L, D] (quantized keys)")
        scale = _tensor(f"{name}[1]", keys[1], 1, None, f"[{data.shape[0]}] (one scale per key)")
        if scale.shape != (data.shape[0],):
            raise ValueError(f"{name}[1]: got shape {list(scale.shape)}, expected [{data.shape[0]}] (one per key)")
        return data, scale.float()
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"{name}: got {type(keys).__name__}, expected a float tensor [L, D] or (fp8, scales)")
    _tensor(name, keys, 2, None, "[L, D]")
    return quantize_keys(keys)


def _per_sequence_keys(keys: object) -> Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """``keys`` of :func:`build_paged_kv_cache` as one entry per sequence: a float tensor ``[B, L, D]`` becomes its
    ``B`` rows ``[L, D]``; a sequence stays as it is (its entries are checked by the caller)."""
    if isinstance(keys, torch.Tensor):
        if not keys.is_floating_point():
            raise TypeError(f"keys: got dtype {keys.dtype}, expected a float tensor [B, L, D]")
        if keys.dim() != 3:
            hint = " (for one sequence [L, D], pass [keys])" if keys.dim() == 2 else ""
            raise ValueError(f"keys: got a {keys.dim()}-D tensor of shape {list(keys.shape)}, expected [B, L, D]{hint}")
        if keys.shape[0] == 0:
            raise ValueError(f"keys: got shape {list(keys.shape)}, expected [B, L, D] with at least one sequence")
        return list(keys.unbind(0))
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(
            f"keys: got {type(keys).__name__}, expected a float tensor [B, L, D] or a sequence of per-sequence keys"
        )
    if len(keys) == 0:
        raise ValueError("keys: got an empty sequence, expected at least one sequence")
    return keys


def build_paged_kv_cache(
    keys: torch.Tensor | Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
    block_kv: int,
    *,
    num_blocks: int | None = None,
    max_blocks: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack per-sequence keys into a paged FP8 KV cache in DeepGEMM's byte layout.

    Args:
        keys: one entry per sequence b: float keys ``[L_b, D]`` (quantized here with
            :func:`quantize_keys`) or an already quantized ``(fp8 [L_b, D], fp32 [L_b])``; or one float
            tensor ``[B, L, D]``: ``B`` sequences of ``L`` keys each.
        block_kv: tokens per cache block (16, 32 or 64 for the cutile kernels).
        num_blocks: cache size in blocks (default: exactly the blocks needed). Unused blocks
            are zero.
        max_blocks: block-table width (default: the most blocks any sequence needs). Unused
            entries are 0 (a valid block id, as serving engines pad).
        generator: when given, blocks are placed at random positions of the cache (drawn
            with this generator), which exercises the block-table indirection; otherwise
            sequence after sequence.
        device: where to build (default: the first keys' device).

    Returns:
        ``(kv_cache uint8 [num_blocks, block_kv, 1, D + 4], block_table int32 [B, max_blocks],
        context_lens int32 [B])``. Key j of sequence b lives in block ``block_table[b, j // block_kv]``
        at slot ``j % block_kv``.
    """
    block_kv = _count("block_kv", block_kv, 1)
    keys = _per_sequence_keys(keys)
    if num_blocks is not None:
        num_blocks = _count("num_blocks", num_blocks)
    if max_blocks is not None:
        max_blocks = _count("max_blocks", max_blocks)
    quant = [_as_fp8_keys(k, f"keys[{b}]") for b, k in enumerate(keys)]
    dim = quant[0][0].shape[1]
    if any(d.shape[1] != dim for d, _ in quant):
        raise ValueError(f"keys: head dims differ ({sorted({d.shape[1] for d, _ in quant})}), expected one D")
    dev = torch.device(device) if device is not None else quant[0][0].device
    lens = [d.shape[0] for d, _ in quant]
    per_seq = [-(-n // block_kv) for n in lens]
    needed = sum(per_seq)
    num_blocks = needed if num_blocks is None else int(num_blocks)
    if num_blocks < needed:
        raise ValueError(f"num_blocks={num_blocks} is smaller than the {needed} blocks the keys need")
    width = max(per_seq) if max_blocks is None else int(max_blocks)
    if width < max(per_seq):
        raise ValueError(f"max_blocks={width} is smaller than the {max(per_seq)} blocks the longest sequence needs")
    width = max(width, 1)
    if generator is not None:
        slots = torch.randperm(num_blocks, generator=generator, device=generator.device)[:needed].tolist()
    else:
        slots = list(range(needed))

    block_bytes = block_kv * (dim + 4)
    cache = torch.zeros(num_blocks, block_bytes, dtype=torch.uint8, device=dev)
    table = torch.zeros(len(keys), width, dtype=torch.int32)
    pos = 0
    for b, ((data, scale), n, nb) in enumerate(zip(quant, lens, per_seq)):
        if nb == 0:
            continue
        ids = slots[pos : pos + nb]
        pos += nb
        table[b, :nb] = torch.tensor(ids, dtype=torch.int32)
        key_bytes = torch.zeros(nb * block_kv, dim, dtype=torch.uint8, device=dev)
        key_bytes[:n] = data.to(dev).view(torch.uint8)
        scale_pad = torch.zeros(nb * block_kv, dtype=torch.float32, device=dev)
        scale_pad[:n] = scale.to(dev)
        rows = torch.cat(
            [key_bytes.view(nb, block_kv * dim), scale_pad.view(nb, block_kv).view(torch.uint8)],
            dim=1,
        )
        cache[torch.tensor(ids, device=dev)] = rows
    context_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    return cache.view(num_blocks, block_kv, 1, dim + 4), table.to(dev), context_lens


def read_paged_kv_cache(
    kv_cache: torch.Tensor, block_table: torch.Tensor, context_lens: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Read each sequence's keys back out of a paged cache (the inverse of :func:`build_paged_kv_cache`).

    Args:
        kv_cache: uint8 ``[num_blocks, block_kv, 1, D + 4]`` (DeepGEMM's byte layout).
        block_table: int ``[B, max_blocks]``: sequence b's keys are in blocks ``block_table[b, :ceil(L_b /
            block_kv)]``, each in ``[0, num_blocks)``; the entries past those are not read (any value).
        context_lens: int ``[B]`` (keys per sequence ``L_b``; syncs the host to read them).

    The block ids a sequence uses are checked with its length, in the same device-to-host read, whenever
    ``context_lens`` is on the device of ``block_table`` or the check is free (CPU); with ``block_table`` on a
    GPU and ``context_lens`` on the CPU they cost a host sync of their own, so they follow
    ``TILEGEMM_CHECK_VALUES`` as the ops' value checks do (an id out of range then fails inside torch).

    Returns:
        one ``(fp8 [L_b, D], fp32 [L_b])`` per sequence.

    Raises:
        TypeError, ValueError: an argument of the wrong type or shape, a length outside ``0..max_blocks *
            block_kv`` (``context_lens[b]``) or a used block id outside ``[0, num_blocks)``
            (``block_table[b, i]``); each message names the argument and the value.
    """
    _tensor("kv_cache", kv_cache, 4, (torch.uint8,), "[num_blocks, block_kv, 1, D + 4]")
    _tensor("block_table", block_table, 2, _INT_DTYPES, "[B, max_blocks]")
    _tensor("context_lens", context_lens, 1, _INT_DTYPES, f"[B={block_table.shape[0]}]")
    if context_lens.shape[0] != block_table.shape[0]:
        raise ValueError(f"context_lens: got shape {list(context_lens.shape)}, expected [B={block_table.shape[0]}]")
    num_blocks, block_kv, _, dp4 = kv_cache.shape
    width = block_table.shape[1]
    capacity = width * block_kv
    same_read = context_lens.device.type != "cpu" and context_lens.device == block_table.device
    if same_read or value_checks_enabled(block_table.device):
        lens, bad_col, bad_id = _lens_and_first_bad_block(block_table, context_lens, block_kv, num_blocks)
    else:
        lens, bad_col, bad_id = context_lens.tolist(), None, None
    for b, n in enumerate(lens):
        if not 0 <= n <= capacity:
            raise ValueError(
                f"context_lens[{b}]: got {n}, expected 0 <= len <= {capacity} (block_table's {width} "
                f"blocks of {block_kv})"
            )
    for b, col in enumerate(bad_col or ()):
        if col >= 0:
            raise ValueError(
                f"block_table[{b}, {col}]: got block id {bad_id[b]}, expected 0 <= id < num_blocks = {num_blocks} "
                f"(kv_cache's blocks; sequence {b} of {lens[b]} keys uses block_table[{b}, :{-(-lens[b] // block_kv)}])"
            )
    dim = dp4 - 4
    raw = kv_cache.reshape(num_blocks, block_kv * dp4)
    out = []
    for b, n in enumerate(lens):
        nb = -(-int(n) // block_kv)
        ids = block_table[b, :nb].long().to(kv_cache.device)
        rows = raw.index_select(0, ids)
        data = rows[:, : block_kv * dim].reshape(nb * block_kv, dim)[:n].view(torch.float8_e4m3fn)
        scale = rows[:, block_kv * dim :].contiguous().view(torch.float32).reshape(-1)[:n]
        out.append((data, scale))
    return out


def _lens_and_first_bad_block(
    block_table: torch.Tensor, context_lens: torch.Tensor, block_kv: int, num_blocks: int
) -> tuple[list[int], list[int], list[int]]:
    """``context_lens`` on the host, with, per sequence, the column of its first used block id outside
    ``[0, num_blocks)`` (-1: none) and that id: one device-to-host read for all three."""
    lens = context_lens.to(block_table.device).long()
    blocks = (lens.clamp(0, block_table.shape[1] * block_kv) + block_kv - 1) // block_kv
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    ids = block_table.long()
    bad = (cols[None, :] < blocks[:, None]) & ((ids < 0) | (ids >= num_blocks))
    first = bad.int().argmax(dim=1) if block_table.shape[1] else blocks.new_zeros(blocks.shape)
    found = bad.any(dim=1)
    bad_id = ids.gather(1, first[:, None])[:, 0] if block_table.shape[1] else blocks
    host = torch.stack([lens, torch.where(found, first, -1), torch.where(found, bad_id, 0)]).tolist()
    return host[0], host[1], host[2]


def causal_windows(
    s_q: int, s_kv: int, *, window: int | None = None, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ks, ke)`` for causal prefill: the ``s_q`` queries are the last ``s_q`` of ``s_kv`` tokens.

    Query i sees keys ``[ks[i], ke[i])`` with ``ke[i] = s_kv - s_q + i + 1`` and ``ks[i] = 0``, or
    ``ks[i] = max(0, ke[i] - window)`` for a sliding window of ``window`` keys.

    Returns:
        int32 ``[s_q]`` tensors ``ks``, ``ke`` on ``device``.
    """
    s_q, s_kv = _count("s_q", s_q), _count("s_kv", s_kv)
    if s_q > s_kv:
        raise ValueError(f"s_q: got {s_q}, expected 0 <= s_q <= s_kv = {s_kv}")
    if window is not None:
        window = _count("window", window, 1)
    ke = torch.arange(s_kv - s_q + 1, s_kv + 1, dtype=torch.int32, device=device)
    ks = torch.zeros_like(ke) if window is None else (ke - window).clamp_min(0)
    return ks, ke


def packed_causal_windows(
    q_lens: Sequence[int], kv_lens: Sequence[int], *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ks, ke)`` for several sequences packed along both the query and the key axis.

    Sequence b owns key rows ``[K_b, K_b + kv_lens[b])`` of the packed keys (``K_b`` = sum of the
    earlier ``kv_lens``) and query rows ``[Q_b, Q_b + q_lens[b])``; its queries are its last
    ``q_lens[b]`` tokens, each seeing its own sequence's keys causally. This covers batched
    prefill (``q_lens == kv_lens``) and chunked prefill (``kv_lens[b]`` = cached prefix +
    ``q_lens[b]``).

    Returns:
        int32 ``[sum(q_lens)]`` tensors ``ks``, ``ke`` on ``device``.
    """
    q_lens, kv_lens = _counts("q_lens", q_lens), _counts("kv_lens", kv_lens)
    if len(q_lens) != len(kv_lens):
        raise ValueError(f"kv_lens: got {len(kv_lens)} lengths, expected one per q_lens entry ({len(q_lens)})")
    ks_parts, ke_parts = [], []
    k_base = 0
    for b, (nq, nk) in enumerate(zip(q_lens, kv_lens)):
        if nq > nk:
            raise ValueError(f"q_lens[{b}]: got {nq}, expected at most kv_lens[{b}] = {nk}")
        ks_parts.append(torch.full((nq,), k_base, dtype=torch.int32))
        ke_parts.append(torch.arange(k_base + nk - nq + 1, k_base + nk + 1, dtype=torch.int32))
        k_base += nk
    ks = torch.cat(ks_parts) if ks_parts else torch.zeros(0, dtype=torch.int32)
    ke = torch.cat(ke_parts) if ke_parts else torch.zeros(0, dtype=torch.int32)
    return ks.to(device), ke.to(device)


def context_parallel_windows(
    seq_len: int, cp_size: int, cp_rank: int, *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and windows of one rank in a zig-zag context-parallel split of one causal sequence.

    The sequence is cut into ``2 * cp_size`` equal chunks; rank r holds chunks ``r`` and
    ``2 * cp_size - 1 - r`` (so every rank has the same causal work) and scores its queries
    against the whole sequence's keys: query at position p sees ``[0, p + 1)``.

    Args:
        seq_len: tokens in the sequence, a multiple of ``2 * cp_size``.
        cp_size: number of ranks; cp_rank: this rank (``0 <= cp_rank < cp_size``).

    Returns:
        ``(positions, ks, ke)``: int64 ``[seq_len / cp_size]`` positions of this rank's queries in
        the sequence (to slice ``q``/``weights``), and int32 ``ks``, ``ke`` of the same length.
    """
    seq_len, cp_size, cp_rank = _count("seq_len", seq_len), _count("cp_size", cp_size, 1), _count("cp_rank", cp_rank)
    if cp_rank >= cp_size:
        raise ValueError(f"cp_rank: got {cp_rank}, expected 0 <= cp_rank < cp_size = {cp_size}")
    if seq_len % (2 * cp_size):
        raise ValueError(f"seq_len={seq_len} must be a multiple of 2 * cp_size = {2 * cp_size}")
    chunk = seq_len // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)
    pos = torch.cat([first, second])
    ke = (pos + 1).to(torch.int32)
    ks = torch.zeros_like(ke)
    return pos.to(device), ks.to(device), ke.to(device)


# ------------------------------------------------------------------- the indexer's scores through the MQA-logits ops


def quantize_rows(x: torch.Tensor, hadamard: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row FP8 cast over the last dim (after the Hadamard rotation with ``hadamard``) in torch ops, on any device:
    ``(fp8 y / s, s)``, ``s = max(amax(|y|), 1e-4) / 448`` fp32 ``x.shape[:-1]``. :func:`tilegemm.fp8_quantize_rows`
    is the same cast as an op (one kernel on the GPU)."""
    return fp8_cast_rows(x, hadamard)


def _float_logits(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, chunk_bytes: int = 1 << 28
) -> torch.Tensor:
    """The logits of an fp16/fp32 model's indexer (the MQA ops take bf16 or FP8): fp32 ``[S, T]``, ``-inf`` outside
    the windows, over chunks of query rows whose ``[rows, H, T]`` scores stay near ``chunk_bytes``.

    ``q`` [S, H, D], ``k`` [T, D], ``w`` fp32 [S, H] (softmax scale folded in), int32 ``ks``/``ke`` [S]."""
    rows, heads, dim = q.shape
    keys = k.shape[0]
    out = torch.empty(rows, keys, dtype=torch.float32, device=q.device)
    k_t = k.float().t()
    cols = torch.arange(keys, device=q.device)
    step = max(1, chunk_bytes // max(1, 4 * heads * keys))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        scores = (q[r0:r1].float().reshape(-1, dim) @ k_t).view(r1 - r0, heads, keys).relu_()
        logits = (w[r0:r1].float().unsqueeze(1) @ scores).squeeze(1)
        inside = (cols >= ks[r0:r1, None]) & (cols < ke[r0:r1, None])
        out[r0:r1] = torch.where(inside, logits, float("-inf"))
    return out


#: Up to this size of the fp32 ``[S, H, T]`` scores the bf16 path scores with torch's matmul (the plain MQA kernel
#: runs a single query row on one CTA), except at the decode steps the op's decode kernel takes.
SMALL_SCORES_BYTES = 1 << 26


def _decode_kernel_takes(q: torch.Tensor, rows: int, keys: int, backend: str | None) -> bool:
    """Whether bf16 scoring of ``rows`` query rows over ``keys`` keys takes :func:`tilegemm.bf16_mqa_logits` for its
    decode kernel: as ``$TILEGEMM_MQA_VARIANT`` forces (read per call, as the ops read it), else on a GPU where the
    op's chooser would (:func:`tilegemm.heuristics.cutile.mqa.decode_sized`)."""
    forced = (os.environ.get(MQA_VARIANT) or "").strip()
    if forced or not q.is_cuda or backend == "pytorch":
        return forced == "decode"
    return decode_sized(rows, keys, 10 * torch.cuda.get_device_capability(q.device)[0])


def index_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    attention_mask: torch.Tensor | None,
    softmax_scale: float,
    fp8: bool = False,
    hadamard: bool = True,
    backend: str | None = None,
) -> torch.Tensor:
    """The indexer's masked scores through the MQA-logits ops, never materializing ``[B, S, H, T]``.

    Args:
        q: queries ``[B, S, H, D]``: bf16 with bf16 ``k`` runs :func:`tilegemm.bf16_mqa_logits`, except small
            scores (:data:`SMALL_SCORES_BYTES`) its decode kernel does not take; there, and for other float dtypes
            (an fp32 model), the same formula in fp32 torch ops over chunks of query rows (bounded memory).
        k: keys ``[B, T, D]`` (the key cache).
        weights: fp32 ``[B, S, H]`` head weights (``weights_proj(x) * H**-0.5``).
        attention_mask: ``[B, S, T]`` boolean or additive mask as transformers passes it, or ``None`` (every key
            visible).
        softmax_scale: the positive scale of ``q . k`` (``D**-0.5``).
        fp8: DeepSeek's FP8 recipe (module docstring) instead of BF16.
        hadamard: with ``fp8``, rotate queries and keys by the orthonormal Hadamard transform first.
        backend: the tilegemm backend of the MQA-logits calls (``None``: the current choice).

    Returns:
        fp32 ``[B, S, T]``: ``sum_h weights * relu(q . k) * softmax_scale`` inside each key window
        (:func:`key_windows`), ``-inf`` outside, the mask then applied as stock applies it (:func:`apply_mask`).
    """
    index_scores_check(q, k, weights, attention_mask, softmax_scale)
    batch, rows, _, _ = q.shape
    keys = k.shape[1]
    clean = clean_outside_windows(attention_mask)
    bf16 = q.dtype == torch.bfloat16 and k.dtype == torch.bfloat16
    decode = (fp8 or bf16) and _decode_kernel_takes(q, rows, keys, backend)
    if decode and rows <= DECODE_WINDOW_ROWS and attention_mask is not None:  # the weights and the ends: one kernel
        w, ke = api.indexer_decode_prepare(weights, attention_mask, weight_scale=softmax_scale, backend=backend)
        ks = zero_window_starts(batch, rows, q.device)
    else:
        ks, ke = key_windows(attention_mask, batch, rows, keys, q.device)
        w = weights.float() * softmax_scale
    if fp8:
        q, q_scale = api.fp8_quantize_rows(q, hadamard=hadamard, backend=backend)
        k = api.fp8_quantize_rows(k, hadamard=hadamard, backend=backend)  # (fp8 keys, per-key scales)
        w = w * q_scale
    if decode:  # one launch over every sequence
        scores = api.mqa_logits_batched(q, k, w, ks, ke, clean, backend=backend)
    elif fp8:
        parts = [
            api.fp8_mqa_logits(q[b], (k[0][b], k[1][b]), w[b].contiguous(), ks[b], ke[b], clean, backend=backend)
            for b in range(batch)
        ]
        scores = parts[0].unsqueeze(0) if batch == 1 else torch.stack(parts)
    elif bf16 and rows * q.shape[2] * keys * 4 > SMALL_SCORES_BYTES:
        parts = [
            api.bf16_mqa_logits(q[b], k[b], w[b].contiguous(), ks[b], ke[b], clean, backend=backend)
            for b in range(batch)
        ]
        scores = parts[0].unsqueeze(0) if batch == 1 else torch.stack(parts)
    else:
        parts = [_float_logits(q[b], k[b], w[b], ks[b], ke[b]) for b in range(batch)]
        scores = parts[0].unsqueeze(0) if batch == 1 else torch.stack(parts)
    return apply_mask(scores, attention_mask)
