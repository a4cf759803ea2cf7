"""Calling tilegemm's public ops from the model integration, for any model dtype, without host syncs."""

from __future__ import annotations

import torch

from tilegemm.ops import api
from tilegemm.ops.checks import allow_float_operands, skip_value_checks


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """GEMM output dtype: the ops write bf16 or fp32; fp16 models get fp32 rounded once to fp16 after."""
    return dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32


def run_op(name: str, backend: str | None, **arguments) -> torch.Tensor:
    """Call public op ``name`` with indices we built ourselves (value checks skipped: no host sync).

    Operands that are not bf16/fp8 (fp32 and fp16 models) go through the same op and its checks with
    fp16/fp32 operands allowed, on the ``pytorch`` backend, which computes in fp32 from any float input
    (exact for fp32 and fp16), so those models stay exact.
    """
    first = arguments["a"][0] if isinstance(arguments["a"], tuple) else arguments["a"]
    with skip_value_checks():
        if first.dtype in (torch.bfloat16, torch.float8_e4m3fn):
            return getattr(api, name)(**arguments, backend=backend)
        with allow_float_operands():
            return getattr(api, name)(**arguments, backend="pytorch")
