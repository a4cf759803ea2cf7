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
from batched_decode_probe import graph_us  # the sibling probe's graph timer (this script's folder is on sys.path)

import tilegemm as tg
from tilegemm.fp8_key_cache import BLOCK_KV, Fp8KeyCache
from tilegemm.heuristics import cutile as heur
from tilegemm.ops.common import hadamard_matrix, paged_views
from tilegemm.ops.cutile import launch, mqa_prep
from tilegemm.ops.cutile.mqa_prep import _rows_fp8

_ZERO = ct.PaddingMode.ZERO
HEADS, DIM = 64, 128


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
    """One batch: the bitwise check and the times."""
    g = torch.Generator(device="cuda").manual_seed(batch)
    cache = Fp8KeyCache(batch, 4096, DIM, "cuda")
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda", generator=g).bfloat16()
    k = torch.randn(batch, 1, DIM, device="cuda", generator=g).bfloat16()
    w = torch.randn(batch, 1, HEADS, device="cuda", generator=g)
    end = torch.tensor(100, device="cuda")
    kv, table = cache.kv_cache, cache.block_table
    want = tg.fp8_indexer_prepare(q, k, w, kv, table, end, hadamard=True, weight_scale=0.1)
    kv_want = kv.clone()
    kv.zero_()
    kernel = ct.kernel(_prepare_early)
    q8, w8 = torch.empty_like(want[0]), torch.empty_like(want[1])
    cfg = heur.fp8_rows_config(DIM, torch.bfloat16)
    kv_keys, kv_scales = paged_views(kv, DIM)
    signs = hadamard_matrix(cfg.cols, q.device, torch.bfloat16, signs=True)
    args = (q.view(batch, HEADS, DIM), w.view(batch, HEADS), k, signs, end.reshape(-1), table, kv_keys, kv_scales)
    args += (q8.view(batch, HEADS, DIM), w8.view(batch, HEADS), DIM**-0.5, 0.1)
    args += tuple(mqa_prep.prepare_constants(cfg, cfg, True, False, BLOCK_KV))
    grid = (HEADS // cfg.rows + 1, batch, 1)

    def early() -> None:
        launch.launch(kernel, grid, args)

    early()
    torch.cuda.synchronize()
    same = (
        torch.equal(q8.view(torch.uint8), want[0].view(torch.uint8))
        and torch.equal(w8, want[1])
        and torch.equal(kv.view(torch.uint8), kv_want.view(torch.uint8))
    )
    calls = {
        "prepare": lambda: tg.fp8_indexer_prepare(q, k, w, kv, table, end, hadamard=True, weight_scale=0.1),
        "prepare_early": early,
        "quantize_q": lambda: tg.fp8_quantize_rows(q, hadamard=True),
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
