"""Command-line pieces the harness scripts share: argparse types and a progress line on stderr."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """argparse type: comma-separated ints >= 1, at least one (``"1,32"`` -> ``[1, 32]``)."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def progress_log(name: str) -> Callable[[str], None]:
    """A ``log(message)`` that prints ``[name HH:MM:SS] message`` on stderr, on rank 0 only under torchrun."""

    def log(message: str) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return log
