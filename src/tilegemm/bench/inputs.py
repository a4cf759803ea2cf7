"""Input helpers shared by the family modules: seeded random tensors, FP8 casts, the same-inputs check."""

from __future__ import annotations

import random
from typing import Any

import torch

from tilegemm.bench import timing


def seed_of(*parts: Any) -> int:
    """A deterministic 31-bit seed from a row's identity (so reruns draw the same inputs)."""
    return _stable(parts)


def _stable(parts: tuple) -> int:
    text = "|".join(str(p) for p in parts)
    h = 2166136261
    for ch in text.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


def randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Standard-normal CUDA tensor of ``shape`` drawn from a generator seeded with ``seed``."""
    g = torch.Generator(device=timing.DEVICE).manual_seed(seed)
    return torch.randn(shape, device=timing.DEVICE, generator=g, dtype=torch.float32).to(dtype)


def group_sizes(groups: int, mean: int, seed: int, lo: float = 0.75, hi: float = 1.25, align: int = 1) -> list[int]:
    """``groups`` sizes drawn uniformly from ``[lo*mean, hi*mean]``, rounded to ``align`` (>= ``align`` if > 1)."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        x = rng.uniform(lo * mean, hi * mean)
        out.append(max(align, round(x / align) * align) if align > 1 else int(x))
    return out


def cast_b_grouped(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tilegemm's 128x128 cast of ``x [G, N, K]`` one expert at a time (bounded fp32 scratch)."""
    from tilegemm import per_block_cast_to_fp8

    pairs = [per_block_cast_to_fp8(x[g]) for g in range(x.shape[0])]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def same_inputs(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> bool:
    """True when a peer's own casts gave bitwise the same FP8 data and scales as tilegemm's."""
    return all(a.shape == b.shape and torch.equal(a.contiguous(), b.contiguous()) for a, b in zip(ours, theirs))


def gemm_bytes(dtype: str, rows: int, weights: int, n: int, k: int) -> float:
    """Bytes an (m-grouped) GEMM moves at least once: ``rows`` activation rows of K, ``weights`` weight matrices of
    [N, K] (bf16 or fp8 with fp32 1x128 / 128x128 scales), and the bf16 output ``[rows, N]``."""
    elt = 2 if dtype == "bf16" else 1
    nbytes = elt * (rows * k + weights * n * k) + 2.0 * rows * n
    if dtype == "fp8":
        nbytes += 4.0 * (rows * -(-k // 128) + weights * -(-n // 128) * -(-k // 128))
    return nbytes
