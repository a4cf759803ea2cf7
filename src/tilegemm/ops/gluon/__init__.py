"""The ``gluon`` backend: Triton Gluon kernels for Hopper schedules cuTile cannot express.

Importing it registers its implementations; it fails (and the registry records why) when triton or its
Gluon Hopper module is missing.
"""

import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401  (fail early: no Gluon, no backend)

from tilegemm.ops.gluon import gemm, grouped, moe_fp8, sparse_attention  # noqa: E402, F401
from tilegemm.ops.reference import cublaslt  # noqa: E402  (one implementation on every backend: cuBLAS via torch)

cublaslt.register("gluon")
