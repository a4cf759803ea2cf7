"""Compile-only: a remote mbarrier arrive from Gluon on triton 3.7.1, through inline PTX (sm_90a, 2-CTA clusters).

The 2-CTA multicast probe (``../results/gluon/multicast_probe_h200.md``) released a ring slot for both CTAs through
the cluster barrier, because triton 3.7.1's Gluon has no arrive on another CTA's mbarrier (its
``MBarrierLayout.multicta(2, two_cta=True)`` barrier is arrived at by the owning CTA only, predicated on
``%cluster_ctarank``). This kernel arrives on the peer CTA's barrier itself: the barrier's shared-memory address is
``global_smem`` (triton's dynamic shared memory symbol) plus its offset, mapped into the peer CTA with ``mapa`` and
arrived at with ``mbarrier.arrive.release.cluster.shared::cluster``, in ``gl.inline_asm_elementwise``. No GPU:

    PYTHONPATH=<a triton 3.7.1 install> python benchmarks/gluon/remote_arrive_compile.py

prints the PTX and sm_90a SASS lines of the barrier traffic, for the arrive with PTX's default semantics (release at
CTA scope) and with ``.release.cluster`` (which adds ``MEMBAR.ALL.CTA`` and ``MEMBAR.ALL.GPU`` before it). The
kernel's only allocation (the barriers) sits at offset 0; a kernel with rings and several barrier arrays would read
its barriers' offsets from a first compile's LLVM IR (the ``getelementptr`` on ``@global_smem``) and pass them as
constexprs to a second.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere.mbarrier import MBarrierLayout
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

#: One arrive on the peer CTA's barrier at ``global_smem + $1`` (the CTAs of a pair: ranks 0 and 1); ``{sem}``: the
#: arrive's memory semantics (PTX's default, release at CTA scope: ``""``; or ``".release.cluster"``).
_REMOTE_ARRIVE = """{{ .reg .u32 a, p, rank;
    mov.u32 a, global_smem; add.u32 a, a, $1;
    mov.u32 rank, %cluster_ctarank; xor.b32 rank, rank, 1;
    mapa.shared::cluster.u32 p, a, rank;
    mbarrier.arrive{sem}.shared::cluster.b64 _, [p];
    mov.u32 $0, 0; }}"""
REMOTE_ARRIVE = gl.constexpr(_REMOTE_ARRIVE.format(sem=""))
REMOTE_ARRIVE_RELEASE_CLUSTER = gl.constexpr(_REMOTE_ARRIVE.format(sem=".release.cluster"))


@gluon.jit
def remote_arrive_kernel(out_ptr, OFFSET: gl.constexpr, RELEASE_CLUSTER: gl.constexpr):
    """Each CTA's 128 threads arrive once each on the other CTA's barrier, then each CTA waits on its own."""
    bar = gl.allocate_shared_memory(gl.int64, [2], MBarrierLayout.multicta(2))  # one barrier a CTA
    mbarrier.init(bar, count=128)
    mbarrier.sync_cluster_init()
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0]])
    offset = gl.full([128], OFFSET, gl.int32, layout)
    if RELEASE_CLUSTER:
        asm: gl.constexpr = REMOTE_ARRIVE_RELEASE_CLUSTER
    else:
        asm: gl.constexpr = REMOTE_ARRIVE
    done = gl.inline_asm_elementwise(asm=asm, constraints="=r,r", args=[offset], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.wait(bar, 0)
    gl.store(out_ptr + gl.arange(0, 128, layout=layout), done)


def main() -> None:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for release_cluster in (False, True):
        constexprs = {"OFFSET": 0, "RELEASE_CLUSTER": release_cluster}
        signature = {"out_ptr": "*i32", "OFFSET": "constexpr", "RELEASE_CLUSTER": "constexpr"}
        source = GluonASTSource(remote_arrive_kernel, signature, constexprs=constexprs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_ctas": 2})
        sem = ".release.cluster" if release_cluster else "(default: release, CTA scope)"
        print(f"== triton {triton.__version__}, sm_90a, 2 CTAs a cluster, arrive semantics {sem}")
        print("PTX:")
        for line in kernel.asm["ptx"].splitlines():
            if re.search(r"reqnctapercluster|mapa|mbarrier\.|barrier\.cluster", line):
                print("   ", line.strip())
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            sass = subprocess.run([str(cuobjdump), "--dump-sass", f.name], capture_output=True, text=True, check=True)
        print("SASS:")
        for line in sass.stdout.splitlines():
            if re.search(r"SYNCS|UCGABAR|CCTL|MEMBAR", line):
                print("   ", re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", line).strip())


if __name__ == "__main__":
    main()
