"""Seconds of torch's ``scaled_dot_product_attention`` on its first call at a new sequence length, after a warm-up
at another length: the attention a patched model's first request still pays after ``tilegemm.precompile`` (which
warms tilegemm's kernels, not torch's).

Each setting runs in a fresh process: a call at ``--warm`` tokens (as precompile's short ``generate``), then two
calls at ``--length`` tokens (as a request's prefill), then decode steps (one query token, no mask) over
``--length`` + 1 to + 4 keys, each the first at its key count, and the first again; each synchronized and timed,
with Qwen3-30B-A3B's attention shape (32 query heads of 128, keys repeated from 4 KV heads) and, for the prefill, a
boolean causal mask, as transformers' SDPA integration passes it. Settings: torch's default SDPA backends, and the
same with cuDNN attention disabled.
Prints one JSON line per setting; ``--out`` writes them all.

    python benchmarks/warmup/sdpa_first_call.py --out sdpa_first_call.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def child(length: int, warm: int, cudnn: bool) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.enable_cudnn_sdp(cudnn)

    def call(s: int) -> float:
        q = torch.randn(1, 32, s, 128, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        mask = torch.ones(s, s, dtype=torch.bool, device="cuda").tril()[None, None]
        torch.cuda.synchronize()
        start = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def decode(kv: int) -> float:
        """One decode step's attention: one query token over ``kv`` keys, no mask (as transformers passes it)."""
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 32, kv, 128, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        start = time.perf_counter()
        F.scaled_dot_product_attention(q, k, k)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    first_warm = call(warm)
    row = {
        "cudnn_sdp": cudnn,
        "warm_length": warm,
        "length": length,
        "warm_call_s": first_warm,
        "first_call_s": call(length),
        "second_call_s": call(length),
    }
    # decode steps: the first at each new key count, then the first key count again
    row["decode_first_call_s"] = {kv: decode(kv) for kv in range(length + 1, length + 5)}
    row["decode_again_s"] = decode(length + 1)
    return {**row, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--warm", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.length, args.warm, args.child == "on")), flush=True)
        return 0
    rows = []
    for setting in ("on", "off"):
        cmd = [sys.executable, __file__, "--length", str(args.length), "--warm", str(args.warm), "--child", setting]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        lines = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        row = json.loads(lines[-1]) if lines else {"cudnn_sdp": setting == "on", "error": done.stderr[-2000:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
