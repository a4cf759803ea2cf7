"""The ``pytorch`` backend: exact fp32 reference implementations of every op (CPU and CUDA).

Importing this package registers every op's ``pytorch`` implementation (and ``tilegemm.ops.cublaslt``, DeepGEMM's
cuBLAS baseline, which every backend runs through torch).
"""

from tilegemm.ops import cublaslt  # noqa: F401
from tilegemm.ops.reference import einsum, gemm, grouped, moe, mqa, norm  # noqa: F401  (registration side effects)
