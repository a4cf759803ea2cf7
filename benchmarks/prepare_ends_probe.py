"""The FP8 key cache's decode step with its key window ends from torch or from the prepare kernel, on one GPU.

``PYTHONPATH=src python3 benchmarks/prepare_ends_probe.py OUT.json`` on a Hopper GPU. For 1 / 8 / 32 sequences of
4k / 16k / 64k keys (DeepSeek-V3.2's indexer: 64 heads of 128, an identity-table paged cache, block_kv 64), one
query row and one new key each, a decode step's causal mask over a static cache one block longer than the keys
(``[B, 1, T]`` boolean, ``T`` = keys + 65: rows not 16-byte aligned; ``--additive`` also an additive bf16 one):

* ``torch``: ``fp8_indexer_prepare`` without the mask, the window ends by ``indexer_mask.key_window_ends`` (a select
  and a max), then ``fp8_paged_mqa_logits`` without a schedule: the step of ``fp8_key_cache.score_fp8_key_cache``
  before the prepare kernel took the mask;
* ``fused``: ``fp8_indexer_prepare(..., attention_mask=mask)`` and the same paged call on its ends.

Both steps' logits and ends are compared bit for bit (the cache is rewritten by each step's append: the same key at
the same position). Times: the median of CUDA-graph replays of 20 steps back to back, divided by 20 (kernel-only),
and of one step a replay (its launch included), the two variants alternating over two rounds. Prints a table, writes
the JSON and its table beside it (``OUT.md``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch
from batched_decode_probe import graph_us  # the sibling probe's graph timer (this script's folder is on sys.path)

import tilegemm as tg
from tilegemm.fp8_key_cache import BLOCK_KV, Fp8KeyCache
from tilegemm.indexer_mask import key_window_ends

HEADS, DIM = 64, 128
#: Timed replays of each graph (the median is kept).
REPS = 30


def steps(batch: int, keys: int, additive: bool) -> tuple[Callable[[], tuple], Callable[[], tuple]]:
    """The two variants of one decode step at ``batch`` sequences of ``keys`` keys (the last one appended by it)."""
    g = torch.Generator(device="cuda").manual_seed(batch * 100003 + keys)
    width = keys + BLOCK_KV + 1  # a static cache's mask: room past the keys, rows of an odd length
    cache = Fp8KeyCache(batch, width, DIM, "cuda")
    cache.append(torch.randn(batch, keys - 1, DIM, device="cuda", generator=g).bfloat16(), keys - 1)
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda", generator=g).bfloat16()
    k = torch.randn(batch, 1, DIM, device="cuda", generator=g).bfloat16()
    w = torch.randn(batch, 1, HEADS, device="cuda", generator=g)
    seen = (torch.arange(width, device="cuda") < keys).expand(batch, 1, width).contiguous()
    mask = torch.zeros(seen.shape, dtype=torch.bfloat16, device="cuda").masked_fill(~seen, float("-inf"))
    mask = mask if additive else seen
    end = torch.tensor(keys, device="cuda")
    kv, table = cache.kv_cache, cache.block_table
    kw = dict(hadamard=True, weight_scale=0.1)

    def torch_ends() -> tuple:
        q8, w8, _ = tg.fp8_indexer_prepare(q, k, w, kv, table, end, **kw)
        ke = key_window_ends(mask, batch, 1, width, q.device)
        return ke, tg.fp8_paged_mqa_logits(q8, kv, w8.view(batch, HEADS), ke, table, None, width, False)

    def fused() -> tuple:
        q8, w8, ke = tg.fp8_indexer_prepare(q, k, w, kv, table, end, attention_mask=mask, **kw)
        return ke, tg.fp8_paged_mqa_logits(q8, kv, w8.view(batch, HEADS), ke, table, None, width, False)

    return torch_ends, fused


def row(batch: int, keys: int, additive: bool) -> dict:
    """One case: the bitwise check of ends and logits inside the windows, then the alternating timings."""
    old, new = steps(batch, keys, additive)
    (ke_old, lo_old), (ke_new, lo_new) = old(), new()
    inside = torch.arange(lo_old.shape[-1], device="cuda") < ke_old.view(-1, 1)
    same = torch.equal(ke_old, ke_new) and torch.equal(lo_old[inside], lo_new[inside])
    times: dict[str, list[float]] = {}
    for _ in range(2):
        for name, fn in (("torch", old), ("fused", new)):
            for kind, calls in (("b2b", 20), ("one", 1)):
                times.setdefault(f"{name}_{kind}_us", []).append(graph_us(fn, REPS, calls))
    out = {k: min(v) for k, v in times.items()}
    mask = "additive bf16" if additive else "bool"
    return dict(batch=batch, keys=keys, mask=mask, bitwise_equal=same, **out,
                speedup_b2b=out["torch_b2b_us"] / out["fused_b2b_us"])  # fmt: skip


def markdown(result: dict) -> str:
    lines = [f"# The FP8 step's window ends: torch's two kernels or the prepare kernel ({result['device']}, "]
    lines[0] += f"{result['when']})"
    lines += ["", f"`benchmarks/prepare_ends_probe.py` (module docstring), torch {result['torch']}. us per step.", ""]
    head = "| sequences | keys | mask | torch ends, 20 a graph | fused | x | one a graph: torch | fused | same bits |"
    lines += [head]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['keys']} | {r['mask']} | {r['torch_b2b_us']:.1f} | {r['fused_b2b_us']:.1f} | "
            f"{r['speedup_b2b']:.2f} | {r['torch_one_us']:.1f} | {r['fused_one_us']:.1f} | {r['bitwise_equal']} |"
        )
    return "\n".join(lines) + "\n"


def main(out: str, additive: bool) -> int:
    cases = [(b, t, False) for b in (1, 8, 32) for t in (4096, 16384, 65536)]
    cases += [(1, 4096, True), (1, 65536, True)] if additive else []
    rows = []
    for b, t, a in cases:
        rows.append(row(b, t, a))
        r = rows[-1]
        print(f"{b} x {t} ({r['mask']}): torch {r['torch_b2b_us']:.1f} fused {r['fused_b2b_us']:.1f} us "
              f"({r['speedup_b2b']:.2f}x), one a graph {r['torch_one_us']:.1f} / {r['fused_one_us']:.1f}, "
              f"same bits {r['bitwise_equal']}", flush=True)  # fmt: skip
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d")}
    result["rows"] = rows
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    with open(out[: -len(".json")] + ".md" if out.endswith(".json") else out + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--additive" in sys.argv[2:]))
