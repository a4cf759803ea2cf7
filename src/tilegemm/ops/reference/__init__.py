"""The ``pytorch`` backend: exact fp32 reference implementations of every op (CPU and CUDA).

Importing this package registers every op's ``pytorch`` implementation.
"""

from tilegemm.ops.reference import (  # noqa: F401  (registration side effects)
    attention,
    cublaslt,
    einsum,
    gemm,
    grouped,
    moe,
    mqa,
    norm,
)
