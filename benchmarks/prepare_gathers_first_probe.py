"""``fp8_indexer_prepare`` against a copy whose append CTA issues its index gathers (the sequence's end, its block
in the table) before the key's cast: does the order of the append's loads set its time?

``PYTHONPATH=src:$PYTHONPATH python3 benchmarks/prepare_gathers_first_probe.py OUT.json`` on a Hopper GPU (after
``source .devbundle/setup.sh``). For 1 / 8 / 32 sequences of one token (64 query rows and one key each, a 4k paged
cache): the copy's outputs (FP8 queries, weights, the whole cache) bit for bit against the library's, then
microseconds per call of both and of ``fp8_quantize_rows`` of the queries alone (CUDA-graph replays of 20 calls,
the median of 30, twice, alternating).
"""

from __future__ import annotations

import json
import sys

import cuda.tile as ct
import torch
from batched_decode_probe import graph_us  # sibling probes (this script's folder is on sys.path)
from paged_decode_probe import prepare_case

import tilegemm as tg
from tilegemm.ops.cutile.mqa_prep import _rows_fp8

_ZERO = ct.PaddingMode.ZERO


def _prepare_early(q, w, x, signs, context_lens, block_table, kv_keys, kv_scales, q8, w8, inv_sqrt: float,
                   weight_scale: float, ROWS: ct.Constant[int], COLS: ct.Constant[int], Q_SPLITS: ct.Constant[int],
                   K_SPLITS: ct.Constant[int], HADAMARD: ct.Constant[bool], PER_SEQUENCE: ct.Constant[bool],
                   BLOCK_KV: ct.Constant[int]):  # fmt: skip
    """``mqa_prep._indexer_prepare`` with the append's gathers first (``_append_rows`` reordered)."""
    r, b = ct.bid(0), ct.bid(1)
    q_blocks = ct.cdiv(q.shape[1], ROWS)
    if r < q_blocks:
        rows = ct.reshape(ct.load(q, (b, r, 0), (1, ROWS, COLS), padding_mode=_ZERO), (ROWS, COLS))
        data, scale = _rows_fp8(rows, signs, inv_sqrt, ROWS, COLS, Q_SPLITS, HADAMARD)
        ct.store(q8, (b, r, 0), ct.reshape(data, (1, ROWS, COLS)))
        weights = ct.astype(ct.load(w, (b, r), (1, ROWS), padding_mode=_ZERO), ct.float32)
        ct.store(w8, (b, r), weights * weight_scale * ct.reshape(scale, (1, ROWS)))
    else:
        rk = r - q_blocks
        count = x.shape[1]
        if PER_SEQUENCE:
            end = ct.astype(ct.gather(context_lens, b), ct.int32)
        else:
            end = ct.astype(ct.gather(context_lens, 0), ct.int32)
        token = rk * ROWS + ct.arange(ROWS, dtype=ct.int32)
        pos = end - count + token
        block_kv = BLOCK_KV
        live = (token < count) & (pos >= 0) & (pos < block_table.shape[1] * block_kv)
        pos = ct.where(live, pos, 0)
        blk = ct.gather(block_table, (b, pos // block_kv), mask=live, padding_value=-1, check_bounds=False)
        live = live & (blk >= 0) & (blk < kv_keys.shape[0])
        slot = pos % block_kv
        rows = ct.reshape(ct.load(x, (b, rk, 0), (1, ROWS, COLS), padding_mode=_ZERO), (ROWS, COLS))
        data, scale = _rows_fp8(rows, signs, inv_sqrt, ROWS, COLS, K_SPLITS, HADAMARD)
        cols = ct.reshape(ct.arange(COLS, dtype=ct.int32), (1, COLS))
        blk2, slot2, live2 = ct.reshape(blk, (ROWS, 1)), ct.reshape(slot, (ROWS, 1)), ct.reshape(live, (ROWS, 1))
        ct.scatter(kv_keys, (blk2, slot2, cols), data, mask=live2 & (cols < kv_keys.shape[2]), check_bounds=False)
        ct.scatter(kv_scales, (blk, slot), ct.reshape(scale, (ROWS,)), mask=live, check_bounds=False)


def row(batch: int) -> dict:
    """One batch: the bitwise check (queries, weights and the whole cache) and the times."""
    c = prepare_case(batch, _prepare_early)
    kv_want = c.kv.clone()
    c.kv.zero_()
    c.launch()
    torch.cuda.synchronize()
    same = (
        torch.equal(c.q8.view(torch.uint8), c.want[0].view(torch.uint8))
        and torch.equal(c.w8, c.want[1])
        and torch.equal(c.kv.view(torch.uint8), kv_want.view(torch.uint8))
    )
    calls = {
        "prepare": lambda: tg.fp8_indexer_prepare(c.q, c.k, c.w, c.kv, c.table, c.end, hadamard=True, weight_scale=0.1),
        "prepare_early": c.launch,
        "quantize_q": lambda: tg.fp8_quantize_rows(c.q, hadamard=True),
    }
    result: dict = {"batch": batch, "bitwise_equal": same}
    for _ in range(2):
        for name, fn in calls.items():
            result.setdefault(name, []).append(round(graph_us(fn, 30, 20), 2))
    return result


def main() -> None:
    rows = []
    for batch in (1, 8, 32):
        rows.append(row(batch))
        print(rows[-1], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
