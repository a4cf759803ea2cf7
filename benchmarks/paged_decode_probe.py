"""The FP8 key cache's decode step, old ops against new, on one GPU (DeepSeek-V3.2's indexer: 64 heads of 128).

``PYTHONPATH=src python3 benchmarks/paged_decode_probe.py OUT.json`` on a Hopper GPU. For 1 / 8 / 32 / 128 sequences
of 4k / 16k / 64k keys (an identity-table paged cache, block_kv 64), one query row and one new key each:

* ``paged``: ``fp8_paged_mqa_logits`` with its schedule (``get_paged_mqa_logits_metadata`` then the scheduled
  kernel) against ``schedule_meta=None`` (the paged decode kernel, no schedule): logits bit for bit, microseconds;
* ``step``: the step's own kernels, before (``fp8_paged_append`` of the key, ``fp8_quantize_rows`` of the queries,
  the weights multiply, the schedule, the scheduled kernel) against now (``fp8_indexer_prepare``, then the paged
  decode kernel): logits bit for bit, microseconds.

Times: the median of CUDA-graph replays of 20 calls back to back, divided by 20 (kernel-only), and of one call a
replay (its launch included). Prints a table, writes the JSON and its tables beside it (``OUT.md``;
``paged_decode_probe.py OUT.json --render`` writes them again from a finished run's JSON).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import cuda.tile as ct
import torch
from batched_decode_probe import graph_us  # the sibling probe's graph timer (this script's folder is on sys.path)

import tilegemm as tg
from tilegemm.fp8_key_cache import BLOCK_KV, Fp8KeyCache
from tilegemm.heuristics import cutile as heur
from tilegemm.ops.common import hadamard_matrix, paged_views
from tilegemm.ops.cutile.tile_lib import fp8_quantize

_ZERO = ct.PaddingMode.ZERO

HEADS, DIM = 64, 128
#: Timed replays of each graph (the median is kept).
REPS = 30


def case(batch: int, keys: int, num_sms: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(batch * 100003 + keys)
    cache = Fp8KeyCache(batch, keys, DIM, "cuda")
    cache.append(torch.randn(batch, keys, DIM, device="cuda", generator=g).bfloat16(), keys)
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda", generator=g).bfloat16()
    k = torch.randn(batch, 1, DIM, device="cuda", generator=g).bfloat16()
    w = torch.randn(batch, 1, HEADS, device="cuda", generator=g)
    lens = torch.full((batch, 1), keys, dtype=torch.int32, device="cuda")
    end = torch.tensor(keys, device="cuda")
    kv, table = cache.kv_cache, cache.block_table
    q8, w8, _ = tg.fp8_indexer_prepare(q, k, w, kv, table, end, hadamard=True, weight_scale=0.1)
    w8 = w8.view(batch, HEADS)

    def scheduled() -> torch.Tensor:
        meta = tg.get_paged_mqa_logits_metadata(lens, BLOCK_KV, num_sms)
        return tg.fp8_paged_mqa_logits(q8, kv, w8, lens, table, meta, keys)

    def unscheduled() -> torch.Tensor:
        return tg.fp8_paged_mqa_logits(q8, kv, w8, lens, table, None, keys)

    def step_before() -> torch.Tensor:
        tg.fp8_paged_append(k, kv, table, end, hadamard=True)
        q8b, scale = tg.fp8_quantize_rows(q, hadamard=True)
        wb = (w * 0.1 * scale).view(batch, HEADS)
        meta = tg.get_paged_mqa_logits_metadata(lens, BLOCK_KV, num_sms)
        return tg.fp8_paged_mqa_logits(q8b, kv, wb, lens, table, meta, keys)

    def step_now() -> torch.Tensor:
        q8n, wn, _ = tg.fp8_indexer_prepare(q, k, w, kv, table, end, hadamard=True, weight_scale=0.1)
        return tg.fp8_paged_mqa_logits(q8n, kv, wn.view(batch, HEADS), lens, table, None, keys)

    row = {"batch": batch, "keys": keys}
    for name, old, new in (("paged", scheduled, unscheduled), ("step", step_before, step_now)):
        same = torch.equal(old(), new())
        times = {f"{v}_{kind}_us": graph_us(fn, REPS, calls) for v, fn in (("old", old), ("new", new))
                 for kind, calls in (("b2b", 20), ("one", 1))}  # fmt: skip
        row[name] = dict(bitwise_equal=same, **times, speedup_b2b=times["old_b2b_us"] / times["new_b2b_us"])
    return row


def _prepare_ldg(q, w, x, signs, context_lens, block_table, kv_keys, kv_scales, q8, w8, inv_sqrt: float,
                 weight_scale: float, ROWS: ct.Constant[int], COLS: ct.Constant[int], Q_SPLITS: ct.Constant[int],
                 K_SPLITS: ct.Constant[int], HADAMARD: ct.Constant[bool], PER_SEQUENCE: ct.Constant[bool],
                 BLOCK_KV: ct.Constant[int]):  # fmt: skip
    """``mqa_prep._indexer_prepare`` with plain loads (no TMA, hence no barrier waits) of the rows, the weights and
    the rotation's signs: the experiment of the ``ops`` part."""
    r, b = ct.bid(0), ct.bid(1)
    q_blocks = ct.cdiv(q.shape[1], ROWS)
    if r < q_blocks:
        rows = ct.reshape(ct.load(q, (b, r, 0), (1, ROWS, COLS), padding_mode=_ZERO, allow_tma=False), (ROWS, COLS))
        data, scale = _rows_fp8_ldg(rows, signs, inv_sqrt, ROWS, COLS, Q_SPLITS, HADAMARD)
        ct.store(q8, (b, r, 0), ct.reshape(data, (1, ROWS, COLS)))
        weights = ct.astype(ct.load(w, (b, r), (1, ROWS), padding_mode=_ZERO, allow_tma=False), ct.float32)
        ct.store(w8, (b, r), weights * weight_scale * ct.reshape(scale, (1, ROWS)))
    else:
        count = x.shape[1]
        rk = r - q_blocks
        rows = ct.reshape(ct.load(x, (b, rk, 0), (1, ROWS, COLS), padding_mode=_ZERO, allow_tma=False), (ROWS, COLS))
        data, scale = _rows_fp8_ldg(rows, signs, inv_sqrt, ROWS, COLS, K_SPLITS, HADAMARD)
        if PER_SEQUENCE:
            end = ct.astype(ct.gather(context_lens, b), ct.int32)
        else:
            end = ct.astype(ct.gather(context_lens, 0), ct.int32)
        token = rk * ROWS + ct.arange(ROWS, dtype=ct.int32)
        pos = end - count + token
        block_kv = BLOCK_KV
        live = (token < count) & (pos >= 0) & (pos < block_table.shape[1] * block_kv)
        pos = ct.where(live, pos, 0)
        blk = ct.gather(block_table, (b, pos // block_kv), mask=live, padding_value=-1)
        live = live & (blk >= 0)
        slot = pos % block_kv
        cols = ct.reshape(ct.arange(COLS, dtype=ct.int32), (1, COLS))
        blk2, slot2, live2 = ct.reshape(blk, (ROWS, 1)), ct.reshape(slot, (ROWS, 1)), ct.reshape(live, (ROWS, 1))
        ct.scatter(kv_keys, (blk2, slot2, cols), data, mask=live2 & (cols < kv_keys.shape[2]))
        ct.scatter(kv_scales, (blk, slot), ct.reshape(scale, (ROWS,)), mask=live)


def _rows_fp8_ldg(x, signs, inv_sqrt: float, ROWS: int, COLS: int, SPLITS: int, HADAMARD: bool):
    y = ct.astype(x, ct.float32)
    if HADAMARD:
        h = ct.load(signs, (0, 0), (COLS, COLS), allow_tma=False)
        acc = ct.zeros((ROWS, COLS), dtype=ct.float32)
        for _ in ct.static_iter(range(SPLITS)):
            part = ct.astype(y, ct.bfloat16)
            acc = ct.mma(part, h, acc)
            y = y - ct.astype(part, ct.float32)
        y = acc * inv_sqrt
    return fp8_quantize(y, 1)


class PrepareCase(NamedTuple):
    """One decode step's operands of ``fp8_indexer_prepare`` at ``batch`` sequences of one token (64 query rows and
    one key each, a 4k paged cache, the key at position 99), the library's outputs on them, and a launch of an
    experiment copy of its kernel into ``q8`` / ``w8`` (and the cache) with the library's arguments and grid."""

    q: torch.Tensor
    k: torch.Tensor
    w: torch.Tensor
    kv: torch.Tensor
    table: torch.Tensor
    end: torch.Tensor
    want: tuple[torch.Tensor, torch.Tensor]
    q8: torch.Tensor
    w8: torch.Tensor
    launch: Callable[[], None]


def prepare_case(batch: int, kernel_fn: Callable) -> PrepareCase:
    """The :class:`PrepareCase` of ``batch`` sequences, ``kernel_fn`` (a copy of ``mqa_prep._indexer_prepare`` from
    before its mask reduction: the same parameters without the mask's) compiled by ``ct.kernel``; the library's call
    (no mask) runs once first (its outputs: ``want``)."""
    from tilegemm.ops.cutile import launch

    g = torch.Generator(device="cuda").manual_seed(batch)
    cache = Fp8KeyCache(batch, 4096, DIM, "cuda")
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda", generator=g).bfloat16()
    k = torch.randn(batch, 1, DIM, device="cuda", generator=g).bfloat16()
    w = torch.randn(batch, 1, HEADS, device="cuda", generator=g)
    end = torch.tensor(100, device="cuda")
    kv, table = cache.kv_cache, cache.block_table
    want = tg.fp8_indexer_prepare(q, k, w, kv, table, end, hadamard=True, weight_scale=0.1)
    kernel = ct.kernel(kernel_fn)
    q8, w8 = torch.empty_like(want[0]), torch.empty_like(want[1])
    cfg = heur.fp8_rows_config(DIM, torch.bfloat16)
    kv_keys, kv_scales = paged_views(kv, DIM)
    signs = hadamard_matrix(cfg.cols, q.device, torch.bfloat16, signs=True)
    args = (q.view(batch, HEADS, DIM), w.view(batch, HEADS), k, signs, end.reshape(-1), table, kv_keys, kv_scales)
    args += (q8.view(batch, HEADS, DIM), w8.view(batch, HEADS), DIM**-0.5, 0.1)
    consts = dict(ROWS=cfg.rows, COLS=cfg.cols, Q_SPLITS=cfg.splits, K_SPLITS=cfg.splits, HADAMARD=True)
    args += tuple(launch.trailing(kernel_fn, **consts, PER_SEQUENCE=False, BLOCK_KV=BLOCK_KV))  # the copy's constants
    grid = (HEADS // cfg.rows + 1, batch, 1)
    return PrepareCase(q, k, w, kv, table, end, want, q8, w8, lambda: launch.launch(kernel, grid, args))


def ops(batch: int) -> dict:
    """The step's row kernels alone at ``batch`` sequences of one token (64 query rows each): microseconds of
    ``fp8_quantize_rows`` of the queries, ``fp8_paged_append`` of the keys, ``fp8_indexer_prepare``, and the
    prepare kernel with plain loads (bitwise the library's?)."""
    c = prepare_case(batch, _prepare_ldg)
    c.launch()
    same = torch.equal(c.q8.view(torch.uint8), c.want[0].view(torch.uint8)) and torch.equal(c.w8, c.want[1])
    calls = {
        "quantize_q": lambda: tg.fp8_quantize_rows(c.q, hadamard=True),
        "append_k": lambda: tg.fp8_paged_append(c.k, c.kv, c.table, c.end, hadamard=True),
        "prepare": lambda: tg.fp8_indexer_prepare(c.q, c.k, c.w, c.kv, c.table, c.end, hadamard=True, weight_scale=0.1),
        "prepare_ldg": c.launch,
        "weights_mul": lambda: c.w * 0.1,
    }
    row = {"batch": batch, "ldg_bitwise_equal": same}
    for name, fn in calls.items():
        row[name] = {"b2b_us": graph_us(fn, REPS, 20), "one_us": graph_us(fn, REPS, 1)}
    return row


def markdown(result: dict) -> str:
    """The JSON's tables (microseconds per call, kernel-only: 20 calls a graph replay)."""
    when = f", {result['when']}" if "when" in result else ""
    lines = [f"# The FP8 key cache's decode step, old ops against new ({result['device']}{when})", ""]
    lines += [f"`benchmarks/paged_decode_probe.py` (module docstring), torch {result['torch']}. us per call, a CUDA"]
    lines += ["graph of 20 calls back to back.", ""]
    lines += ["## The step's row kernels alone (64 query rows and one key a sequence)", ""]
    names = ["quantize_q", "append_k", "prepare", "prepare_ldg", "weights_mul"]
    lines += ["| sequences | " + " | ".join(names) + " | plain loads bit for bit |", "|---" * (len(names) + 2) + "|"]
    for r in result["ops"]:
        cells = " | ".join(f"{r[n]['b2b_us']:.1f}" for n in names)
        lines.append(f"| {r['batch']} | {cells} | {r['ldg_bitwise_equal']} |")
    lines += ["", "## The paged op and the step: before (schedule, separate casts) and now", ""]
    head = "| sequences | keys | paged with schedule | without | x | same bits | step before | now | x | same bits |"
    lines += [head]
    lines += ["|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        p, t = r["paged"], r["step"]
        lines.append(
            f"| {r['batch']} | {r['keys']} | {p['old_b2b_us']:.1f} | {p['new_b2b_us']:.1f} | {p['speedup_b2b']:.2f} | "
            f"{p['bitwise_equal']} | {t['old_b2b_us']:.1f} | {t['new_b2b_us']:.1f} | {t['speedup_b2b']:.2f} | "
            f"{t['bitwise_equal']} |"
        )
    return "\n".join(lines) + "\n"


def main(out: str) -> int:
    if out.endswith(".json") and len(sys.argv) > 2 and sys.argv[2] == "--render":  # tables of a finished run
        with open(out) as f:
            result = json.load(f)
        with open(out[: -len(".json")] + ".md", "w") as f:
            f.write(markdown(result))
        return 0
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    op_rows = [ops(b) for b in (1, 8, 32)]
    for r in op_rows:
        cells = "  ".join(f"{k} {v['b2b_us']:.1f}/{v['one_us']:.1f}" for k, v in r.items() if isinstance(v, dict))
        print(f"ops batch {r['batch']}: {cells}  (ldg bitwise {r['ldg_bitwise_equal']})")
    rows = [case(b, t, num_sms) for b in (1, 8, 32, 128) for t in (4096, 16384, 65536)]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d")}
    result.update(ops=op_rows, rows=rows)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    if out.endswith(".json"):
        with open(out[: -len(".json")] + ".md", "w") as f:
            f.write(markdown(result))
    print("batch keys | paged: old / new us (b2b) x, equal | step: old / new us (b2b) x, equal | one-call new step us")
    for r in rows:
        p, s = r["paged"], r["step"]
        print(
            f"{r['batch']:5d} {r['keys']:6d} | {p['old_b2b_us']:6.1f} / {p['new_b2b_us']:6.1f} "
            f"{p['speedup_b2b']:.2f}x {p['bitwise_equal']} | {s['old_b2b_us']:6.1f} / {s['new_b2b_us']:6.1f} "
            f"{s['speedup_b2b']:.2f}x {s['bitwise_equal']} | {s['new_one_us']:6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "paged_decode_probe.json"))
