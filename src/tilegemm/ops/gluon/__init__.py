"""The ``gluon`` backend: Triton Gluon kernels for Hopper schedules cuTile cannot express.

Importing it registers its implementations; it fails (and the registry records why) when triton or its
Gluon Hopper module is missing.
"""

import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401  (fail early: no Gluon, no backend)

from tilegemm.ops.gluon import cublaslt, gemm  # noqa: E402, F401
