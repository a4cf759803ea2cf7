"""The batched decode kernel under memcheck: windows past both ends, odd key counts, several rows per sequence.

``PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python3
benchmarks/batched_decode_memcheck.py`` (``PYTHONPATH=src``) on a Hopper GPU; prints ``ran``.
"""

from __future__ import annotations

import torch

from tilegemm.heuristics import cutile as heur
from tilegemm.ops.cutile import mqa as cutile_mqa

#: (dtype, sequences, query rows, keys, heads, head dim)
CASES = (("bf16", 3, 2, 333, 64, 128), ("fp8", 5, 1, 777, 64, 128), ("bf16", 2, 3, 129, 16, 32))


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(5)
    for dtype, batch, rows, keys, heads, dim in CASES:
        q = torch.randn(batch, rows, heads, dim, device=dev, generator=g)
        kv = torch.randn(batch, keys, dim, device=dev, generator=g)
        if dtype == "bf16":
            q, kv, base = q.bfloat16(), kv.bfloat16(), heur.bf16_mqa_logits_config(heads, dim)
        else:
            q, kv = q.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn)
            base = heur.mqa_logits_config(heads, dim)
        scale = torch.rand(batch, keys, device=dev, generator=g)
        w = torch.randn(batch, rows, heads, device=dev, generator=g)
        ks = torch.randint(-1000, 100, (batch, rows), device=dev, generator=g, dtype=torch.int32)
        ke = torch.randint(0, 3 * keys, (batch, rows), device=dev, generator=g, dtype=torch.int32)
        out = torch.empty(batch, rows, keys, device=dev)
        conf = heur.mqa_decode_config(base, rows, keys, 132, 90, batch)
        cutile_mqa.launch_mqa_logits_batched(q, kv, scale, w, ks, ke, out, conf)
    torch.cuda.synchronize()
    print("ran")


if __name__ == "__main__":
    main()
