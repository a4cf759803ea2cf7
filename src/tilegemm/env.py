"""tilegemm's environment variables, read at the point of use, parsed in one place.

Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case (surrounding spaces ignored);
unset or empty means the default; anything else is a ``ValueError`` naming the variable.

* ``TILEGEMM_BACKEND``: default backend (``cutile`` or ``pytorch``); see :mod:`tilegemm.backend.selector`.
* ``TILEGEMM_DISABLE_FALLBACK``: a fallback to ``pytorch`` raises instead of warning (default off).
* ``TILEGEMM_CHECK_VALUES``: value checks of CUDA tensors (host-syncing) on (default off; CPU always on).
* ``TILEGEMM_DEBUG``: log dispatch decisions at DEBUG level to ``tilegemm.dispatch`` (default off).
* ``TILEGEMM_PRINT_CONFIGS``: print the kernel config chosen per new shape (default off).
* ``TILEGEMM_DECODE_VARIANT``, ``TILEGEMM_MOE_VARIANT``, ``TILEGEMM_MQA_VARIANT``: force a kernel variant
  (benchmarks, tests); read once per call into the cutile chooser's problem
  (:func:`tilegemm.heuristics.cutile.variant`), so a launch plan and a hot-lane key follow them.
"""

from __future__ import annotations

import os

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

DISABLE_FALLBACK = "TILEGEMM_DISABLE_FALLBACK"
CHECK_VALUES = "TILEGEMM_CHECK_VALUES"
DEBUG = "TILEGEMM_DEBUG"
PRINT_CONFIGS = "TILEGEMM_PRINT_CONFIGS"
BACKEND = "TILEGEMM_BACKEND"
DECODE_VARIANT = "TILEGEMM_DECODE_VARIANT"
MOE_VARIANT = "TILEGEMM_MOE_VARIANT"
MQA_VARIANT = "TILEGEMM_MQA_VARIANT"


def parse_bool(name: str, text: str | None, default: bool = False) -> bool:
    """The boolean value ``text`` of environment variable ``name`` (``None`` or blank: ``default``).

    Raises:
        ValueError: ``text`` is not one of 1/0/true/false/yes/no/on/off (any case); the message names ``name``.
    """
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}: got {text!r}, expected one of 1/0, true/false, yes/no, on/off (any case)")


def env_flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable ``name`` now (see :func:`parse_bool`)."""
    return parse_bool(name, os.environ.get(name), default)


def env_choice(name: str, choices: tuple[str, ...]) -> str | None:
    """The environment variable ``name`` if set (non-blank), checked against ``choices``; ``None`` if unset.

    Raises:
        ValueError: the value is not in ``choices``; the message names ``name`` and lists the valid values.
    """
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None
    value = text.strip()
    if value not in choices:
        raise ValueError(f"{name}: got {text!r}, expected one of {list(choices)}")
    return value
