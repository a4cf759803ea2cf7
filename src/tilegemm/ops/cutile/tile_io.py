"""Operand tile loads shared by the BF16 GEMM kernels (tile code): the one place that says how a tile of a logical
operand is read from either storage order (TMA reads 16-bit data K-major or MN-major alike)."""

from __future__ import annotations

import cuda.tile as ct

_ZERO = ct.PaddingMode.ZERO


def load_mk(A, pm, kb, TM: int, TK: int, KMAJOR: bool):
    """Tile ``(pm, kb)`` ``[TM, TK]`` of the logical ``[M, K]`` operand, zero past the edges.

    ``A`` is that ``[M, K]`` array (``KMAJOR``) or its ``[K, M]`` storage, read transposed (``order=(1, 0)``).
    """
    if KMAJOR:
        tile = ct.load(A, (pm, kb), (TM, TK), padding_mode=_ZERO)
    else:
        tile = ct.load(A, (pm, kb), (TM, TK), order=(1, 0), padding_mode=_ZERO)
    return tile


def load_kn(B, kb, pn, TK: int, TN: int, KMAJOR: bool):
    """Tile ``(kb, pn)`` ``[TK, TN]`` of the logical ``[K, N]`` operand ``B.T``, zero past the edges.

    ``B`` is the ``[N, K]`` weight (``KMAJOR``, read transposed with ``order=(1, 0)``) or its ``[K, N]`` storage.
    """
    if KMAJOR:
        tile = ct.load(B, (kb, pn), (TK, TN), order=(1, 0), padding_mode=_ZERO)
    else:
        tile = ct.load(B, (kb, pn), (TK, TN), padding_mode=_ZERO)
    return tile
