"""Where a decode step's one-key append spends its time, on one GPU (DeepSeek-V3.2's indexer keys: 128 bf16).

``PYTHONPATH=src python3 benchmarks/append_probe.py OUT.json`` on a Hopper GPU. One sequence, one new key, an
identity-table paged cache of 4k keys (block_kv 64); each call alone, microseconds per call (a CUDA graph of 20
calls back to back, and of one call a replay):

* ``append``: ``fp8_paged_append(hadamard=True)``, the library's append (the prepare kernel's slowest CTA);
* ``append_plain``: the same without the rotation (no +-1 matrix load, no MMA);
* ``append_identity``: a copy of the append's kernel that computes the block as the identity table holds it
  instead of gathering it from the table (one dependent global load less; same bytes written: checked);
* ``cast_only``: ``fp8_quantize_rows`` of the same key (the same tile code, stored by TMA: no gathers, no scatter);
* ``trivial``: a one-element torch multiply (a launch's floor in a graph).

Prints one line per variant as it finishes, then writes the JSON.
"""

from __future__ import annotations

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
from tilegemm.ops.cutile import launch
from tilegemm.ops.cutile.mqa_prep import _rows_fp8

_ZERO = ct.PaddingMode.ZERO
DIM = 128
REPS = 30


def _append_identity(x, signs, context_lens, kv_keys, kv_scales, blocks, inv_sqrt: float,
                     ROWS: ct.Constant[int], COLS: ct.Constant[int], SPLITS: ct.Constant[int],
                     HADAMARD: ct.Constant[bool], BLOCK_KV: ct.Constant[int]):  # fmt: skip
    """``mqa_prep._append_rows`` for an identity block table of ``blocks`` blocks a sequence: the block is
    ``b * blocks + p // BLOCK_KV``, not a gather from the table."""
    r, b = ct.bid(0), ct.bid(1)
    count = x.shape[1]
    rows = ct.reshape(ct.load(x, (b, r, 0), (1, ROWS, COLS), padding_mode=_ZERO), (ROWS, COLS))
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
    consts = launch.trailing(
        _append_identity, ROWS=cfg.rows, COLS=cfg.cols, SPLITS=cfg.splits, HADAMARD=True, BLOCK_KV=BLOCK_KV
    )
    args = (k, signs, end, kv_keys, kv_scales, cache.blocks, DIM**-0.5, *consts)

    def identity() -> None:
        launch.launch(kernel, (1, 1, 1), args)

    tg.fp8_paged_append(k, kv, table, end, hadamard=True)
    want = kv.clone()
    kv.zero_()
    identity()
    torch.cuda.synchronize()
    same = torch.equal(kv, want)
    one = torch.ones(1, device="cuda")
    variants = {
        "append": lambda: tg.fp8_paged_append(k, kv, table, end, hadamard=True),
        "append_plain": lambda: tg.fp8_paged_append(k, kv, table, end, hadamard=False),
        "append_identity": identity,
        "cast_only": lambda: tg.fp8_quantize_rows(k, hadamard=True),
        "trivial": lambda: one * 0.1,
    }
    rows: dict = {"identity_bitwise_equal": same}
    for _ in range(2):
        for name, fn in variants.items():
            b2b, single = graph_us(fn, REPS, 20), graph_us(fn, REPS, 1)
            rows.setdefault(name, []).append({"b2b_us": b2b, "one_us": single})
            print(f"{name}: {b2b:.2f} us (20 a graph), {single:.2f} (one a graph)", flush=True)
    print(f"identity append bitwise the library's: {same}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d")}
    result["rows"] = rows
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
