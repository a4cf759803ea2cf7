"""Host-side launch helpers shared by the cutile kernel families: stream, persistent grid, operand prep."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cuda.tile as ct
import torch

from tilegemm.config import get_num_sms

__all__ = [
    "current_stream",
    "num_sms",
    "persistent_grid",
    "launch",
    "launch_on",
    "tma_ready",
    "aligned_copy",
    "cdiv",
    "scratch",
]

_ALIGN_BYTES = 16


def cdiv(x: int, y: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-x // y)


def current_stream() -> torch.cuda.Stream:
    """The stream kernels run on: the current CUDA stream (the registry has already made ``stream=`` current)."""
    return torch.cuda.current_stream()


def num_sms() -> int:
    """SMs that persistent kernels may use (``tilegemm.set_num_sms`` or the device's count)."""
    return max(1, get_num_sms())


def persistent_grid(num_tiles: int, sms: int | None = None) -> tuple[int, int, int]:
    """Grid of a persistent kernel: ``min(num_tiles, SMs * ctas_per_sm)`` CTAs (at least one)."""
    sms = num_sms() if sms is None else sms
    return (max(1, min(num_tiles, sms)), 1, 1)


def launch(kernel: Any, grid: Sequence[int], args: Sequence[Any]) -> None:
    """Launch a cuTile kernel on the current stream (JIT-compiles on first use; capturable in CUDA graphs)."""
    ct.launch(current_stream(), tuple(grid), kernel, tuple(args))


def launch_on(stream: torch.cuda.Stream, kernel: Any, grid: tuple[int, int, int], args: tuple) -> None:
    """Launch a cuTile kernel on ``stream`` with a prepared grid and argument tuple (no conversions)."""
    ct.launch(stream, grid, kernel, args)


_SCRATCH: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def scratch(device: torch.device, stream: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A cached 1-D ``dtype`` buffer of at least ``numel`` elements for kernels on ``stream`` (its handle).

    Created zero-filled; kernels that use one as counters must leave it zero. One buffer per
    (device, stream, dtype), so kernels sharing it are ordered by their stream. Growing it
    allocates a larger one (at least twice the size) and keeps the old one alive: a CUDA graph
    captured with it still owns valid memory.
    """
    key = (str(device), stream, dtype)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        size = max(numel, 2 * buf.numel() if buf is not None else 0, 1024)
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(size, dtype=dtype, device=device)
        _SCRATCH[key] = buf
    return buf


def tma_ready(x: torch.Tensor) -> bool:
    """True if ``x`` (2-D) is row-major with unit last stride, 16-byte row pitch and a 16-byte aligned base.

    Those are what the JIT needs to see to use TMA for the tensor.
    """
    if x.dim() != 2:
        return False
    es = x.element_size()
    if x.shape[1] > 1 and x.stride(1) != 1:
        return False
    if x.shape[0] > 1 and (x.stride(0) * es) % _ALIGN_BYTES != 0:
        return False
    return x.data_ptr() % _ALIGN_BYTES == 0


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """Row-major copy of 2-D ``x`` whose row pitch is padded to 16 bytes (same logical shape).

    The padding columns are zero; kernels never read them (tile loads are bounded by the shape).
    """
    rows, cols = x.shape
    per = _ALIGN_BYTES // x.element_size()
    pitch = max(per, cdiv(cols, per) * per)
    buf = torch.empty((rows, pitch), dtype=x.dtype, device=x.device)
    out = buf[:, :cols]
    out.copy_(x)
    return out


def as_row_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when it is :func:`tma_ready`, else an aligned row-major copy."""
    return x if tma_ready(x) else aligned_copy(x)
