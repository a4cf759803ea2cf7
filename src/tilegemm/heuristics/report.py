"""``TILEGEMM_PRINT_CONFIGS``: every backend's config choices, printed once per new line."""

from __future__ import annotations

from tilegemm.env import PRINT_CONFIGS, env_flag

_printed: set[str] = set()


def print_once(op: str, shape: object, config: object) -> None:
    """Print ``[tilegemm] {op} shape={shape} config={config}`` when ``TILEGEMM_PRINT_CONFIGS=1``, once per line."""
    if not env_flag(PRINT_CONFIGS):
        return
    line = f"[tilegemm] {op} shape={shape} config={config}"
    if line not in _printed:
        _printed.add(line)
        print(line, flush=True)
