"""Progress on stderr: a tqdm bar when tqdm is installed and stderr is a terminal, else one line per row."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """``update(label)`` after each row; ``write(text)`` prints a line without breaking the bar; ``close()``."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.time()
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, file=sys.stderr, unit="row", dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def update(self, label: str) -> None:
        """One more row done; ``label`` names it."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(label[:60], refresh=False)
            self._bar.update(1)
        else:
            print(f"[{self.done}/{self.total} {time.time() - self.t0:6.0f}s] {label}", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        """Print ``text`` on its own line (stderr)."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.close()
