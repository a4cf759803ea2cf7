"""Run one of these sweep scripts with the gluon backend allowed on any triton from 3.6 to 3.10, to time the kernels
under a triton outside the backend's tested range (``selector.TRITON_TESTED``, [3.6, 3.10)) as well as in it. A
measurement aid only: the library keeps its range. On the H200 machine, with a triton bundle built by
``../shared/device/build-triton.sh <version>`` (e.g. ``DEST=.devtriton38`` for 3.8.0) and carried:

    (source .devtriton38/setup.sh && PYTHONPATH=src:tests:.:$PYTHONPATH \\
        python3 benchmarks/gluon/other_triton.py benchmarks/gluon/fp8_ws_sweep.py OUT.json --no-gluon --no-cutile ...)

Every argument after the script's path is the script's own.
"""

from __future__ import annotations

import os
import runpy
import sys

import tilegemm.backend.selector as selector


def main() -> None:
    """Widen the tested range, then run ``sys.argv[1]`` as ``__main__`` with the remaining arguments."""
    selector.TRITON_TESTED = ((3, 6), (3, 11))
    selector.gluon_unavailable_reason.cache_clear()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
