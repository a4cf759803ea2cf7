"""DeepGEMM's mega-MoE entry points (SM100 only, with symmetric-memory buffers): present, and refusing clearly."""

from __future__ import annotations

from typing import Any

_WHY = "DeepGEMM's mega-MoE kernels (SM100 only) are not part of tilegemm"


def _unsupported(name: str) -> NotImplementedError:
    return NotImplementedError(f"tilegemm.{name}: {_WHY}; use the m-grouped GEMMs or tilegemm.transformers' experts")


def get_symm_buffer_for_mega_moe(*args: Any, **kwargs: Any) -> Any:
    """DeepGEMM's mega-MoE buffer allocator: raises ``NotImplementedError``."""
    raise _unsupported("get_symm_buffer_for_mega_moe")


def transform_weights_for_mega_moe(*args: Any, **kwargs: Any) -> Any:
    """DeepGEMM's mega-MoE weight transform: raises ``NotImplementedError``."""
    raise _unsupported("transform_weights_for_mega_moe")


def fp8_fp4_mega_moe(*args: Any, **kwargs: Any) -> Any:
    """DeepGEMM's FP8/FP4 mega-MoE kernel: raises ``NotImplementedError``."""
    raise _unsupported("fp8_fp4_mega_moe")


def bf16_mega_moe(*args: Any, **kwargs: Any) -> Any:
    """DeepGEMM's BF16 mega-MoE kernel: raises ``NotImplementedError``."""
    raise _unsupported("bf16_mega_moe")
