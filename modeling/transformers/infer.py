"""Patched DeepSeek / Qwen / Mixtral inference: speed and agreement vs stock transformers.

Thin wrapper of ``python -m tilegemm.infer`` (same options; see ``--help``), e.g.::

    python modeling/transformers/infer.py --model tiny --compare
    python modeling/transformers/infer.py --model qwen3-30b-a3b --layers 4 --compare --cuda-graphs
    python modeling/transformers/infer.py --model /path/to/local/checkpoint --compare --fp8
"""

import os
import sys

if __name__ == "__main__":
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
    if os.path.isdir(src):  # run from a checkout without installing
        sys.path.insert(0, os.path.normpath(src))
    from tilegemm.infer import main

    sys.exit(main())
