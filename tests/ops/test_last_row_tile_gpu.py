"""The BF16 ws kernel's last row tile moved up to end at M (``tiles.tile_row``) on a Hopper GPU.

Where M is not a multiple of a design's tile rows, the kernel moves the last row tile up so that its boxes
hold no rows past M, wherever the walk's tiles run alike (``split_tail.runs_alike``); the rows it shares with the
tile before it are then computed and stored twice. Each case checks that this changes no bit: the result at M rows
is bitwise the first M rows of the same design's result on A padded to whole row tiles (as many tiles, none
moved), it is within the bar of the float64 product, and reruns are bitwise identical. Grids: every SM (unsplit
designs, and the split designs whose tiles then all split) and 7 or 8 CTAs (split designs that run whole rounds and
a split tail: their tiles do not all run alike, so nothing moves).
"""

from __future__ import annotations

import pytest
import torch

from tilegemm.backend.selector import gluon_unavailable_reason
from tilegemm.testing import assert_rerun_identical, calc_diff, poisoned

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and gluon_unavailable_reason() is not None, reason="needs gluon"),
]

bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")

#: M with 8 rows in the last row tile of 64 and of 128, with 72 (past half a 128-row tile), and M below one tile.
ROWS = [136, 200, 40]
N, K = 520, 1024
#: (design, SMs of the grid): every SM, and for the split designs also 7 and 8 CTAs, where at M 136 and 200 64- and
#: 128-row tiles run whole rounds and a split tail
CASES = [(name, sms) for name, cfg in bw.VARIANTS.items() for sms in ((None, 7, 8) if cfg.splits > 1 else (None,))]


def _operands(m: int, padded: int, seed: int):
    """(A of ``m`` rows, A of ``padded`` rows whose first ``m`` are A's, B, the float64 product of the ``m`` rows)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(padded, K, device="cuda", generator=g).bfloat16()
    b = torch.randn(N, K, device="cuda", generator=g).bfloat16()
    return a[:m].contiguous(), a, b, a[:m].double() @ b.double().t()


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("name, sms", CASES, ids=lambda x: f"sms{x}" if isinstance(x, int) or x is None else x)
def test_last_row_tile_moved_changes_no_bit(name, sms, m):
    cfg = bw.VARIANTS[name]
    padded = -(-m // cfg.block_m) * cfg.block_m  # whole row tiles: as many as at m rows
    a, a_pad, b, ref = _operands(m, padded, seed=m + (sms or 0))
    d = poisoned((m, N), torch.bfloat16, "cuda")
    d_pad = poisoned((padded, N), torch.bfloat16, "cuda")
    run = lambda: bw.bf16_ws_plan(a, b, d, cfg, num_sms=sms)(a, b, d)  # noqa: E731
    run()
    bw.bf16_ws_plan(a_pad, b, d_pad, cfg, num_sms=sms)(a_pad, b, d_pad)
    torch.cuda.synchronize()
    assert calc_diff(d, ref) < 1e-5
    assert torch.equal(d, d_pad[:m]), "the moved tile's rows differ from the same rows computed in place"
    assert_rerun_identical(run, d)
