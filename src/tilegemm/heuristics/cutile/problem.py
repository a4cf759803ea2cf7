"""What every cutile family's rules read: the problem description, the layout kinds, the shared tile config and
the ``TILEGEMM_*_VARIANT`` overrides (read once per call, into the problem, so they are part of its plan key)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from tilegemm.env import DECODE_VARIANT, MOE_VARIANT, MQA_VARIANT

#: Names the swap-AB decode variant every decode-size dense call takes (benchmarks, tests); set, the narrow-tile
#: kernel is never chosen.
DECODE_VARIANT_ENV = DECODE_VARIANT
#: Names the fused-experts path every call takes (benchmarks, tests): ``slots`` (one weight stream per routed
#: slot, ``ops/cutile/moe_slots.py``), ``blocks`` (device-side sort into few-row blocks, one swap-AB weight stream
#: per block, ``ops/cutile/moe_blocks.py``) or ``sorted`` (device-side sort, persistent tiles, ``ops/cutile/moe.py``).
MOE_VARIANT_ENV = MOE_VARIANT
MOE_VARIANTS = ("slots", "blocks", "sorted")
_VARIANT_ENVS = {"dense": DECODE_VARIANT_ENV, "moe": MOE_VARIANT_ENV, "moe_fp8": MOE_VARIANT_ENV, "mqa": MQA_VARIANT}


def forced(text: str | None, choices: tuple[str, ...], env: str) -> str | None:
    """The variant a problem's ``variant`` text forces: ``None`` when unset or blank, else one of ``choices``.

    Raises:
        ValueError: another value; the message names ``env`` and lists ``choices``.
    """
    if text is None or not text.strip():
        return None
    if text.strip() not in choices:
        raise ValueError(f"{env}: got {text!r}, expected one of {list(choices)}")
    return text.strip()


@dataclass(frozen=True)
class Rule:
    """One rule of a family's list: where ``applies(problem)``, ``config``; ``why`` says why in one line and names
    the measurement (a section of ``docs/notes/heuristics.md`` or a results file)."""

    applies: Callable[[Problem], bool]
    config: Any
    why: str


def first(rules: tuple[Rule, ...], p: Problem) -> Any:
    """The config of the first rule of ``rules`` that applies to ``p`` (the last rule of a list applies to all)."""
    for rule in rules:
        if rule.applies(p):
            return rule.config
    raise ValueError(f"no rule applies to {p}")


def variant(family: str) -> str | None:
    """The variant ``$TILEGEMM_*_VARIANT`` forces on ``family`` now (``None``: the rules choose), as given: the
    family's rules validate it. Host paths read it once per call into :attr:`Problem.variant`."""
    env = _VARIANT_ENVS.get(family)
    return (os.environ.get(env) or None) if env is not None else None


class Kind(IntEnum):
    """Layout of a grouped GEMM: the ``KIND`` constant of the grouped kernels (``ops/cutile/grouped.py``).

    Kernel code compares ``KIND`` with the members; a launch passes ``int(kind)`` (a cuTile constant
    argument must be a plain int: an enum member fails the JIT's name mangling).
    """

    INDICES = 0  # m-grouped, ``m_indices[M]``: every row block names its expert
    PSUM = 1  # m-grouped, ``offs[G]`` cumulative group ends
    MASKED = 2  # m-grouped, ``[G, Mmax, *]`` with ``masked_m[G]`` valid rows
    K = 3  # k-grouped, one output per group


@dataclass(frozen=True)
class Problem:
    """A GEMM as the config choice sees it: host sizes only.

    ``family``: ``"dense"``, ``"grouped"``, ``"moe"`` or ``"moe_train"`` (only ``n = H`` is read);
    ``dtype``: ``"bf16"`` or ``"fp8"``; ``sms``: SMs
    persistent kernels may use. ``m, n, k``: dense, ``D [M, N]`` over ``K``; grouped, ``m`` the rows of the
    row space (``M_sum``, ``G * Mmax``, or each k-grouped output's M) and ``k`` the inner size (``K_sum``
    k-grouped); moe, ``m = T * top_k`` routed rows, ``n = H``, ``k = I`` (the down GEMM). ``groups``: G
    (moe: experts). ``kind``: the grouped layout; ``expected_m``: the masked op's rows-per-group hint;
    ``has_c``: a k-grouped or dense addend. ``variant``: what ``$TILEGEMM_*_VARIANT`` forced when the call
    began (:func:`variant`); a plan keyed by the problem follows it.
    """

    family: str
    dtype: str
    m: int
    n: int
    k: int
    sms: int
    groups: int = 1
    kind: Kind | None = None
    expected_m: int = 0
    has_c: bool = False
    variant: str | None = None


@dataclass(frozen=True)
class TileConfig:
    """Tile config of a persistent GEMM kernel (dense, grouped, fused MoE).

    ``bm x bn`` output tile, ``bk`` K step (128 for FP8: one scale block), ``gm`` row blocks per
    swizzle band, ``fast_acc`` FP8 MMA mode (promoted every 128 of K), ``num_worker_warps``/
    ``occupancy``/``num_ctas`` the cuTile compiler hints (``None``: auto). ``path``: the kernel family a host
    path launches for it (every config class names its own, so host code never asks a config's type).
    """

    path: ClassVar[str] = "tile"
    bm: int
    bn: int
    bk: int
    gm: int = 8
    fast_acc: bool = False
    num_worker_warps: int | None = None
    occupancy: int | None = None
    num_ctas: int | None = None

    @property
    def ctas_per_sm(self) -> int:
        return self.occupancy or 1

    @property
    def name(self) -> str:
        parts = [f"{self.bm}x{self.bn}x{self.bk}", f"g{self.gm}"]
        if self.num_worker_warps:
            parts.append(f"w{self.num_worker_warps}")
        if self.occupancy:
            parts.append(f"o{self.occupancy}")
        if self.num_ctas:
            parts.append(f"c{self.num_ctas}")
        if self.fast_acc:
            parts.append("fa")
        return "_".join(parts)

    def compiler_options(self) -> dict[str, int]:
        """Keyword arguments for ``ct.kernel`` (only the hints that are set)."""
        opts = {"num_worker_warps": self.num_worker_warps, "occupancy": self.occupancy, "num_ctas": self.num_ctas}
        return {k: v for k, v in opts.items() if v is not None}
