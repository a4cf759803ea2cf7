"""CPU compile gate for the gluon warp-specialized BF16 kernel (``bf16_gemm_ws``), sm_90a: every design with bf16
and fp32 output must show ``setmaxnreg``, no spills (a design that spills under the installed triton is skipped: the
rule does not run it there, :data:`tilegemm.heuristics.gluon.BF16_FP32_SPILLING_DESIGNS`), four BF16 wgmma
(``HGMMA.64xNx16``) per 64-deep K block issued
as one group (a 256-wide tile: two groups of four, one a 128-wide half), one wait a K block that leaves that block's
groups in flight (``WARPGROUP.DEPBAR.LE gsb0, 0x1``; ``0x2`` for the halves),
registers within the MMA warps' budget and shared memory within a CTA's. Its tile walk and store are
``ops/gluon/tiles.py``'s, which the FP8 kernels' gates compile too; the split designs (``_sk``) walk their jobs and
store a split run's tile with ``ops/gluon/split_tail.py``'s, as the FP8 ws kernel does, and show the split tail's
synchronization, which no other design has. The K loop's barriers hold the MMA partition's threads only: one
warpgroup where each is a partition of its own (``_wg2``), not both in lockstep. The k-grouped form (every design
the rule may pick, with and without accumulation) must read both MN-major operands in place (``HGMMA ...
.tnspA.tnspB``: the wgmma transposes, no copy does), under the same conditions, and add the tile to D by a TMA
reduce-add when accumulating (D never read back), store it otherwise."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from compile_gate.sass import dump_sass, loop_bodies, opcode_counts, sass_summary  # noqa: E402
from compile_gate.test_compile_gluon_ws import _tools_reason, check_tail_sync, tail_sync_ops  # noqa: E402
from tilegemm.heuristics import gluon as gluon_rules  # noqa: E402
from tilegemm.heuristics.gluon import K_GROUPED_BF16_WS_TILES  # noqa: E402
from tilegemm.ops.gluon import aot, bf16_gemm_ws_kernel, split_tail, tiles  # noqa: E402
from tilegemm.ops.gluon import bf16_gemm_ws as bw  # noqa: E402

CASES = [(name, out) for name in bw.VARIANTS for out in (torch.bfloat16, torch.float32)]


def _sass_and_k_loop(kernel, cfg: bw.Bf16WsConfig) -> tuple[str, dict, dict, list[str]]:
    """``kernel``'s SASS, opcode counts, summary and K loop (the shortest loop body holding an HGMMA), after the
    checks every design must pass: no spills, registers under the MMA warps' ``setmaxnreg`` budget (two warpgroups:
    the largest decrease, at most 240; one, ``mma_warps`` 4: the increase, at most 256; each warpgroup a partition,
    ``wg_parts`` 2: the default one's decrease, at most 248, and the worker's increase to ``WG1_REGS``), shared
    memory within a CTA's."""
    sass = dump_sass(kernel.asm["cubin"])
    ops, summary = opcode_counts(sass), sass_summary(kernel.asm["cubin"])
    loop = min((b for b in loop_bodies(sass) if any("HGMMA" in t for t in b)), key=len, default=[])
    change = "inc" if cfg.mma_warps == 4 else "dec"
    budget = max(int(x) for x in re.findall(rf"setmaxnreg\.{change}\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"]))
    if cfg.wg_parts == 2:
        raised = {int(x) for x in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"])}
        assert bf16_gemm_ws_kernel.WG1_REGS in raised, "the worker MMA warpgroup's registers"
        budget = min(budget, bf16_gemm_ws_kernel.WG1_REGS)
    assert summary["stl"] == summary["ldl"] == 0, "register spills"
    limit = 256 if cfg.mma_warps == 4 else 248 if cfg.wg_parts == 2 else 240
    assert 0 < max(int(x) for x in re.findall(r"\bR(\d+)\b", sass)) < budget <= limit
    assert kernel.metadata.shared <= bw.SMEM_BYTES
    return sass, ops, summary, loop


def check_loop_barriers(loop: list[str], cfg: bw.Bf16WsConfig) -> None:
    """The K loop's ``BAR.SYNC`` hold the MMA partition's threads: both warpgroups in lockstep, or one
    (``wg_parts`` 2, ``mma_warps`` 4)."""
    threads = 32 * cfg.num_warps
    bars = [t for t in loop if "BAR.SYNC" in t]
    assert bars and all(t.split(";")[0].rstrip().endswith(f"0x{threads:x}") for t in bars), bars


@pytest.mark.parametrize("name, out", CASES, ids=[f"{n}-{str(o).split('.')[-1]}" for n, o in CASES])
def test_bf16_ws_sass(name, out):
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    if (
        out == torch.float32
        and name in gluon_rules.BF16_FP32_SPILLING_DESIGNS
        and not gluon_rules.spill_free_here(gluon_rules.TRITON_SPILLS_BF16_FP32_FROM)
    ):
        pytest.skip(f"{name} spills with fp32 output under this triton: the rule runs the tile unsplit here")
    cfg = bw.VARIANTS[name]
    kernel = aot.compile_bf16_ws(cfg, out)
    assert kernel.name == bf16_gemm_ws_kernel.bf16_gemm_ws_kernel.__name__
    assert (
        bf16_gemm_ws_kernel.tile_range is tiles.tile_range and bf16_gemm_ws_kernel.ring_barriers is tiles.ring_barriers
    )
    sass, ops, summary, loop = _sass_and_k_loop(kernel, cfg)
    assert sum(n for op, n in ops.items() if op.startswith("USETMAXREG")) >= 1, "setmaxnreg"
    halves = 2 if cfg.block_n == 256 else 1  # a 256-wide tile: two 128-wide halves, a wgmma group each
    one_wave = cfg.block_m == 128 or cfg.mma_warps == 4  # else 64 rows on two warpgroups: half the columns each
    width = cfg.block_n // halves if one_wave else cfg.block_n // 2
    assert [t for t in loop if "HGMMA" in t] and all(f"HGMMA.64x{width}x16" in t for t in loop if "HGMMA" in t)
    assert sum(1 for t in loop if "HGMMA" in t) == halves * bw.BLOCK_K // 16 and summary["gmma_group_min"] == 4
    depbars = [t.split()[-1] for t in loop if "WARPGROUP.DEPBAR" in t]
    assert depbars == [f"0x{halves}"], "one wait a block, the block's groups left in flight"
    check_loop_barriers(loop, cfg)
    check_tail_sync(tail_sync_ops(sass), cfg.splits)


K_GROUPED_CASES = [(design, acc) for design, *_ in K_GROUPED_BF16_WS_TILES for acc in (False, True)]


@pytest.mark.parametrize("name, accumulate", K_GROUPED_CASES, ids=[f"{n}-acc{int(a)}" for n, a in K_GROUPED_CASES])
def test_bf16_ws_k_grouped_sass(name, accumulate):
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    cfg = bw.VARIANTS[name]
    kernel = aot.compile_bf16_ws(cfg, k_grouped=True, accumulate=accumulate)
    sass, _, summary, loop = _sass_and_k_loop(kernel, cfg)
    mma = [t for t in loop if "HGMMA" in t]
    width = cfg.block_n if cfg.block_m == 128 or cfg.mma_warps == 4 else cfg.block_n // 2
    assert len(mma) == bw.BLOCK_K // 16 and all(f"HGMMA.64x{width}x16" in t and ".tnspA.tnspB" in t for t in mma)
    assert [t.split()[-1] for t in loop if "WARPGROUP.DEPBAR" in t] == ["0x1"]
    check_loop_barriers(loop, cfg)
    boxes = cfg.block_m // 64 + cfg.block_n // 64
    assert summary["utmaldg"] == boxes, "A and B in 64-wide boxes (128-byte swizzle), nothing else"
    reduces, stores = summary["utmaredg"], summary["utmastg"]
    leaves = (reduces, stores) if accumulate else (stores, reduces)
    assert leaves == (cfg.wg_parts, 0), "the tile leaves by one TMA reduce-add (accumulating) or store a partition"
    check_tail_sync(tail_sync_ops(sass), 1)


def test_bf16_ws_kernel_splits_with_split_tail_helpers():
    """The split designs' job walk and fixup are split_tail.py's (the FP8 ws kernel compiles the same ones);
    128x256 tiles are not split."""
    for helper in ("job_walk", "split_job", "split_fixup"):
        assert getattr(bf16_gemm_ws_kernel, helper) is getattr(split_tail, helper), helper
    split = {name: cfg for name, cfg in bw.VARIANTS.items() if cfg.splits > 1}
    assert split and all(cfg.block_n <= 128 for cfg in split.values())
    assert all(cfg._replace(splits=1) in bw.VARIANTS.values() for cfg in split.values())
