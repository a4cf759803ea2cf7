"""Probe: which TMA loads of fp32 scale rows into shared memory work in Gluon 3.6 on this GPU.

``python3 probe_tma_scale_boxes.py`` runs every case in its own process (an illegal instruction poisons the context).
"""

import subprocess
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilegemm.ops.gluon.tiles import tma_load


@gluon.jit
def copy2d(desc, out_ptr, r, c, BOX: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.float32, [2, 1, BOX], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma_load(desc, [r, c], bar, buf.index(1))
    mbarrier.wait(bar, 0)
    lay: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
    v = buf.index(1).load(lay)
    gl.store(out_ptr + gl.arange(0, BOX, layout=gl.SliceLayout(0, lay))[None, :], v)


CASES = {"2d-128": (128, 0), "2d-32": (32, 0), "2d-128-off": (128, 70), "2d-32-off": (32, 9)}

if __name__ == "__main__":
    if len(sys.argv) == 1:
        for name in CASES:
            r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True)
            print(name, r.stdout.strip() or r.stderr.strip().splitlines()[-1], flush=True)
        sys.exit()
    box, col = CASES[sys.argv[1]]
    x = torch.arange(5 * 300, device="cuda", dtype=torch.float32).view(5, 300)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    desc = TensorDescriptor(x, [5, 300], [300, 1], [1, box], layout)
    out = torch.full((box,), -1.0, device="cuda")
    copy2d[(1,)](desc, out, 3, col, box, num_warps=4)
    torch.cuda.synchronize()
    print("ok" if torch.equal(out, x[3, col : col + box]) else f"WRONG {out[:6].tolist()}")
