"""Which transformers versions tilegemm's MoE integration supports, and a clear error for the rest.

The integration needs transformers' experts registry (``transformers.integrations.moe.ExpertsInterface``)
and MoE models whose experts are fused 3-D parameters dispatched through ``@use_experts_implementation``
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``): transformers >= 5.7.
"""

from __future__ import annotations

import functools
import re

MIN_TRANSFORMERS = (5, 7)


class UnsupportedTransformersError(ImportError):
    """transformers is missing or too old for the tilegemm MoE integration."""


def _parse(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return (0, 0)
    return int(match.group(1)), int(match.group(2))


@functools.cache
def transformers_version() -> tuple[int, int]:
    """The installed transformers ``(major, minor)``; raises :class:`UnsupportedTransformersError` if too old."""
    try:
        import transformers
    except ImportError as exc:
        raise UnsupportedTransformersError(
            "tilegemm.transformers needs transformers >= {}.{} (pip install 'tilegemm[hf]'); "
            "it is not installed ({})".format(*MIN_TRANSFORMERS, exc)
        ) from None
    version = _parse(transformers.__version__)
    if version < MIN_TRANSFORMERS:
        raise UnsupportedTransformersError(
            f"tilegemm.transformers needs transformers >= {MIN_TRANSFORMERS[0]}.{MIN_TRANSFORMERS[1]} "
            f"(fused 3-D experts and ExpertsInterface); found {transformers.__version__}"
        )
    try:
        from transformers.integrations.moe import ExpertsInterface  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a broken install
        raise UnsupportedTransformersError(
            f"transformers {transformers.__version__} has no transformers.integrations.moe.ExpertsInterface ({exc})"
        ) from None
    return version
