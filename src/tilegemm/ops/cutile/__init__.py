"""The ``cutile`` backend: cuTile Python kernels, one module per kernel family."""

import cuda.tile  # noqa: F401  (fail early: the registry records why cutile is unavailable)

from tilegemm.ops.cutile import gemm  # noqa: F401,E402  (dense GEMMs register their cutile impls)
from tilegemm.ops.cutile import grouped  # noqa: F401,E402  (grouped GEMMs register their cutile impls)
from tilegemm.ops.cutile import mqa  # noqa: F401,E402  (MQA logits register their cutile impls)
