"""Where a decode step's one-key append spends its time, on one GPU (DeepSeek-V3.2's indexer keys: 128 bf16).

``PYTHONPATH=src python3 benchmarks/append_probe.py OUT.json`` on a Hopper GPU. One sequence, one new key, an
identity-table paged cache of 4k keys (block_kv 64); each call alone, microseconds per call (a CUDA graph of 20
calls back to back, and of one call a replay):

* ``append``: ``fp8_paged_append(hadamard=True)``, the library's append (the prepare kernel's slowest CTA);
* ``append_plain``: the same without the rotation (no +-1 matrix load, no MMA);
* ``append_identity``: a copy of the append's kernel that computes the block as the identity table holds it
  instead of gathering it from the table (one dependent global load less; same bytes written: checked);
* ``append_identity_ldg``: that copy with its key rows loaded without TMA (``allow_tma=False``);
* ``cast_only``: ``fp8_quantize_rows`` of the same key (the same tile code, stored by TMA: no gathers, no scatter);
* ``cast_plain``: that cast without the rotation;
* ``q_cast``: ``fp8_quantize_rows`` of a decode step's 64 query rows (rotated);
* ``cast_generated``, ``q_cast_generated``: those two casts with the rotation's +-1 matrix computed in the kernel
  (``H[i, j] = (-1) ** popcount(i & j)``) instead of loaded (32 KB by TMA); the same bits (checked);
* ``cast_rows_N``: ``fp8_quantize_rows`` of N rotated rows (N = 2, 15, 16, 17, 32): the cast's time against the
  tile's 16 rows (a partial tile or a whole one, one CTA or two);
* ``prepare``: ``fp8_indexer_prepare`` of one step (64 query rows, one key, no mask): the query cast and the
  append in one launch;
* ``prepare_mask``: the same with a boolean mask of 4,096 keys (its ends zeroed, then reduced by one CTA);
* ``zeros_int``: the zeroing of those ends alone (``torch.zeros`` of one int32);
* ``trivial``: a one-element torch multiply (a launch's floor in a graph).

Prints one line per variant as it finishes, then writes the JSON.
"""

from __future__ import annotations

import functools
import json
import sys
import time

import cuda.tile as ct
import torch
from batched_decode_probe import graph_us  # the sibling probe's graph timer (this script's folder is on sys.path)

import tilegemm as tg
from tilegemm.fp8_key_cache import BLOCK_KV, Fp8KeyCache
from tilegemm.heuristics import cutile as heur
from tilegemm.ops.common import hadamard_matrix, paged_views
from tilegemm.ops.cutile import launch, tile_lib
from tilegemm.ops.cutile.mqa_prep import _rows_fp8

_ZERO = ct.PaddingMode.ZERO
DIM = 128
REPS = 30


def _append_identity(x, signs, context_lens, kv_keys, kv_scales, blocks, inv_sqrt: float,
                     ROWS: ct.Constant[int], COLS: ct.Constant[int], SPLITS: ct.Constant[int],
                     HADAMARD: ct.Constant[bool], BLOCK_KV: ct.Constant[int], TMA: ct.Constant[bool]):  # fmt: skip
    """``mqa_prep._append_rows`` for an identity block table of ``blocks`` blocks a sequence: the block is
    ``b * blocks + p // BLOCK_KV``, not a gather from the table; the key rows loaded by TMA or not (``TMA``)."""
    r, b = ct.bid(0), ct.bid(1)
    count = x.shape[1]
    tile = ct.load(x, (b, r, 0), (1, ROWS, COLS), padding_mode=_ZERO, allow_tma=TMA)
    rows = ct.reshape(tile, (ROWS, COLS))
    data, scale = _rows_fp8(rows, signs, inv_sqrt, ROWS, COLS, SPLITS, HADAMARD)
    end = ct.astype(ct.gather(context_lens, b), ct.int32)
    token = r * ROWS + ct.arange(ROWS, dtype=ct.int32)
    pos = end - count + token
    live = (token < count) & (pos >= 0) & (pos < blocks * BLOCK_KV)
    pos = ct.where(live, pos, 0)
    blk = b * blocks + pos // BLOCK_KV
    live = live & (blk < kv_keys.shape[0])
    slot = pos % BLOCK_KV
    cols = ct.reshape(ct.arange(COLS, dtype=ct.int32), (1, COLS))
    blk2, slot2, live2 = ct.reshape(blk, (ROWS, 1)), ct.reshape(slot, (ROWS, 1)), ct.reshape(live, (ROWS, 1))
    ct.scatter(kv_keys, (blk2, slot2, cols), data, mask=live2 & (cols < kv_keys.shape[2]), check_bounds=False)
    ct.scatter(kv_scales, (blk, slot), ct.reshape(scale, (ROWS,)), mask=live, check_bounds=False)


def _signs_tile(COLS: int):
    """The +-1 Sylvester matrix ``[COLS, COLS]`` as bf16, computed: ``H[i, j] = (-1) ** popcount(i & j)`` (the
    parity of ``i & j`` folded down to its low bit; ``COLS`` up to 128)."""
    i = ct.reshape(ct.arange(COLS, dtype=ct.int32), (COLS, 1))
    j = ct.reshape(ct.arange(COLS, dtype=ct.int32), (1, COLS))
    p = i & j
    p = p ^ (p >> 4)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return ct.astype(1 - 2 * (p & 1), ct.bfloat16)


def _cast_generated(x, q, scales, inv_sqrt: float, ROWS: ct.Constant[int], COLS: ct.Constant[int]):
    """``mqa_prep._quantize_rows`` of bf16 rows with the rotation's signs computed (:func:`_signs_tile`), not loaded."""
    r = ct.bid(0)
    rows = ct.astype(ct.load(x, (r, 0), (ROWS, COLS), padding_mode=_ZERO), ct.bfloat16)
    acc = ct.mma(rows, _signs_tile(COLS), ct.zeros((ROWS, COLS), dtype=ct.float32))
    data, scale = tile_lib.fp8_quantize(acc * inv_sqrt, 1)
    ct.store(q, (r, 0), data)
    ct.store(scales, (r,), ct.reshape(scale, (ROWS,)))


def main(out: str) -> int:
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = Fp8KeyCache(1, 4096, DIM, "cuda")
    k = torch.randn(1, 1, DIM, device="cuda", generator=g).bfloat16()
    end = torch.tensor([100], device="cuda")
    kv, table = cache.kv_cache, cache.block_table
    cfg = heur.fp8_rows_config(DIM, torch.bfloat16)
    kv_keys, kv_scales = paged_views(kv, DIM)
    signs = hadamard_matrix(cfg.cols, k.device, torch.bfloat16, signs=True)
    kernel = ct.kernel(_append_identity)
    named = dict(ROWS=cfg.rows, COLS=cfg.cols, SPLITS=cfg.splits, HADAMARD=True, BLOCK_KV=BLOCK_KV)
    args = (k, signs, end, kv_keys, kv_scales, cache.blocks, DIM**-0.5)

    def identity(tma: bool = True) -> None:
        launch.launch(kernel, (1, 1, 1), (*args, *launch.trailing(_append_identity, **named, TMA=tma)))

    tg.fp8_paged_append(k, kv, table, end, hadamard=True)
    want = kv.clone()
    kv.zero_()
    identity()
    torch.cuda.synchronize()
    same = torch.equal(kv, want)
    kv.zero_()
    identity(False)
    torch.cuda.synchronize()
    same = same and torch.equal(kv, want)
    one = torch.ones(1, device="cuda")
    q = torch.randn(1, 1, 64, DIM, device="cuda", generator=g).bfloat16()
    w = torch.randn(1, 1, 64, device="cuda", generator=g)
    mask = torch.zeros(1, 1, 4096, dtype=torch.bool, device="cuda")
    mask[..., :101] = True
    sweep = (2, 15, 16, 17, 32)
    generated = ct.kernel(_cast_generated)

    def cast_generated(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = x.reshape(-1, DIM)
        q8 = torch.empty(rows.shape, dtype=torch.float8_e4m3fn, device=x.device)
        s8 = torch.empty(rows.shape[0], device=x.device)
        consts = launch.trailing(_cast_generated, ROWS=cfg.rows, COLS=cfg.cols)
        launch.launch(generated, (launch.cdiv(rows.shape[0], cfg.rows), 1, 1), (rows, q8, s8, DIM**-0.5, *consts))
        return q8, s8

    for x in (k, q):  # the computed signs give the library's bits
        got, want = cast_generated(x), tg.fp8_quantize_rows(x, hadamard=True)
        same = same and torch.equal(got[0].view(torch.uint8).view(-1), want[0].view(torch.uint8).view(-1))
        same = same and torch.equal(got[1].view(-1), want[1].view(-1))

    def prepare(attention_mask=None):
        return tg.fp8_indexer_prepare(q, k, w, kv, table, end, hadamard=True, attention_mask=attention_mask)

    variants = {
        "append": lambda: tg.fp8_paged_append(k, kv, table, end, hadamard=True),
        "append_plain": lambda: tg.fp8_paged_append(k, kv, table, end, hadamard=False),
        "append_identity": identity,
        "append_identity_ldg": lambda: identity(False),
        "cast_only": lambda: tg.fp8_quantize_rows(k, hadamard=True),
        "cast_plain": lambda: tg.fp8_quantize_rows(k, hadamard=False),
        "q_cast": lambda: tg.fp8_quantize_rows(q, hadamard=True),
        "cast_generated": lambda: cast_generated(k),
        "q_cast_generated": lambda: cast_generated(q),
        **{f"cast_rows_{n}": functools.partial(tg.fp8_quantize_rows, q[0, 0, :n], hadamard=True) for n in sweep},
        "prepare": prepare,
        "prepare_mask": lambda: prepare(mask),
        "zeros_int": lambda: torch.zeros(1, 1, dtype=torch.int32, device="cuda"),
        "trivial": lambda: one * 0.1,
    }
    rows: dict = {"bitwise_equal": same}
    for _ in range(2):
        for name, fn in variants.items():
            b2b, single = graph_us(fn, REPS, 20), graph_us(fn, REPS, 1)
            rows.setdefault(name, []).append({"b2b_us": b2b, "one_us": single})
            print(f"{name}: {b2b:.2f} us (20 a graph), {single:.2f} (one a graph)", flush=True)
    print(f"identity appends (TMA and not) and computed-sign casts bitwise the library's: {same}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d")}
    result["rows"] = rows
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
