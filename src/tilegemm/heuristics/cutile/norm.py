"""RMSNorm: the row tile of ``ops/cutile/norm.py`` (the CPU gate, ``tests/compile_gate/test_compile_norm.py``, holds
the register and spill claims)."""

from __future__ import annotations

from dataclasses import dataclass

#: The longest row (padded to a power of two) the RMSNorm kernel holds in registers; longer rows run the
#: ``pytorch`` backend.
NORM_MAX_COLS = 8192
#: fp32 elements of x per CTA (rows x padded columns): 64 per thread of the kernel's four warps.
NORM_TILE_ELEMS = 8192
#: Rows per CTA at most (short rows such as 128-wide per-head norms).
NORM_MAX_ROWS = 64
#: The kernel's CTAs-per-SM hint: tileiras then keeps it at 64 registers without spills for every tile above
#: (255 registers, one CTA per SM, without a hint; at 8 it spills on 8192-column rows).
NORM_OCCUPANCY = 4


@dataclass(frozen=True)
class NormConfig:
    """Tile of the RMSNorm kernel: ``rows`` rows x ``cols`` columns (the row length padded to a power of two)."""

    rows: int
    cols: int


def rms_norm_config(h: int) -> NormConfig | None:
    """The RMSNorm tile for rows of ``h`` elements; ``None`` beyond :data:`NORM_MAX_COLS`.

    A CTA holds whole rows (one load, the sum of squares and the scaling in registers):
    ``NORM_TILE_ELEMS / cols`` of them, at most :data:`NORM_MAX_ROWS`.
    """
    if not 1 <= h <= NORM_MAX_COLS:
        return None
    cols = 1 << (h - 1).bit_length()
    return NormConfig(rows=max(1, min(NORM_MAX_ROWS, NORM_TILE_ELEMS // cols)), cols=cols)
