"""Tile loads shared by the kernels (tile code): how a tile of a logical BF16 operand is read from either storage
order (TMA reads 16-bit data K-major or MN-major alike), a load with a latency hint, and the index clamp that an
unchecked load in a loop needs."""

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


def load_hinted(X, index, shape, LAT: int, order=(0, 1)):
    """A zero-padded tile load; ``LAT > 0`` passes it as the load's latency hint (0: the compiler's choice).

    tileiras sizes a loop's load pipeline (stages, shared-memory slots) from the hint: the decode kernels'
    ``DecodePlan.latency`` / ``NarrowConfig.latency``, the plain MQA kernel's ``MqaConfig.key_latency``.
    """
    if LAT > 0:
        return ct.load(X, index, shape, order=order, padding_mode=_ZERO, latency=LAT)
    return ct.load(X, index, shape, order=order, padding_mode=_ZERO)


def clamp_index(k, count, CLAMP: bool):
    """Tile index ``k`` of a loop, clamped into ``[0, count)`` when ``CLAMP`` (else ``k`` itself).

    A load without bounds checks needs it: tileiras issues a loop's loads a few iterations ahead, also for the
    iterations after the last (their values unused), and unchecked those read past the array (sm_90 SASS of the FP8
    decode kernels' scale loads: three 128-wide K blocks past the end). Every iteration that runs keeps its index.
    """
    return ct.minimum(k, count - 1) if CLAMP else k
