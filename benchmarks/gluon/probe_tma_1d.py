"""Probe: a 1-D TMA load of fp32 into shared memory (box 128 / 32) in Gluon on this GPU, small and odd lengths."""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilegemm.ops.gluon.tiles import tma_load


@gluon.jit
def copy1d(desc, out_ptr, start, BOX: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.float32, [2, BOX], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma_load(desc, [start], bar, buf.index(1))
    mbarrier.wait(bar, 0)
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    v = buf.index(1).load(lay)
    gl.store(out_ptr + gl.arange(0, BOX, layout=lay), v)


for n, box, start in [(300, 128, 0), (300, 128, 250), (2700, 128, 1024), (1, 32, 0), (21, 32, 9), (4, 128, 0)]:
    x = torch.arange(n, device="cuda", dtype=torch.float32) + 1
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    desc = TensorDescriptor(x, [n], [1], [box], layout)
    out = torch.full((box,), -1.0, device="cuda")
    copy1d[(1,)](desc, out, start, box, num_warps=4)
    torch.cuda.synchronize()
    want = torch.zeros(box, device="cuda")
    m = max(0, min(box, n - start))
    want[:m] = x[start : start + m]
    print("tma1d", n, box, start, "ok" if torch.equal(out, want) else f"WRONG {out[:8].tolist()}", flush=True)
