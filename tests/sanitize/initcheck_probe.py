"""Does compute-sanitizer's initcheck see memory written by a cuTile kernel's stores?

Run as ``compute-sanitizer --tool initcheck python tests/sanitize/initcheck_probe.py {fresh|prefilled}``
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``). Both modes run one cutile BF16 GEMM into ``d`` and then read
``d`` with a torch kernel (``d.clone()``), and check that every element of ``d`` equals the ``pytorch``
backend's result to ``calc_diff < 1e-5`` with no NaN (so ``d`` is fully written by the kernel):

* ``fresh``: ``d`` comes from ``torch.empty``: only the cuTile kernel ever wrote it;
* ``prefilled``: ``d`` is first filled by a torch kernel, then overwritten by the cuTile kernel.

If ``fresh`` reports "uninitialized __global__ memory read" at the clone while ``prefilled`` reports
nothing and both match the reference, initcheck does not track the kernel's (TMA) stores: its
reports on tensors written by cuTile kernels say nothing about the kernels.
"""

from __future__ import annotations

import sys

import torch

import tilegemm as tg


def main(mode: str) -> int:
    """Run the probe in ``mode`` (``fresh`` or ``prefilled``); exit status 1 if ``d`` is wrong."""
    torch.manual_seed(0)
    m, n, k = 256, 512, 384
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if mode == "prefilled":
        d.fill_(float("nan"))
    tg.bf16_gemm_nt(a, b, d, backend="cutile")
    copy = d.clone()
    want = tg.bf16_gemm_nt(a, b, torch.zeros_like(d), backend="pytorch")
    torch.cuda.synchronize()
    diff = tg.calc_diff(copy, want)
    ok = bool(torch.isfinite(copy).all()) and diff < 1e-5
    print(f"initcheck probe ({mode}): calc_diff vs the reference {diff:.2e}, all finite: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "fresh"))
