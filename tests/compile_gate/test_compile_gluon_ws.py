"""CPU compile gate for the prototype gluon FP8 kernel ``fp8_gemm_ws`` (Hopper): every design, compiled for sm_90a.

``triton.compile`` with an explicit target runs without a GPU (ptxas ships with triton); the SASS is read with
cuobjdump. What each design needs: ``setmaxnreg`` in the SASS (``USETMAXREG``: the MMA warps in the default
partition take the registers the loader warp gives up), no local-memory spills, the FP8 wgmma (QGMMA) count of
one K block in the main loop (four m64n128k32 per 128-row wave, four m64n64k32 more for a 192-wide tile; four
m64n64k32 a warpgroup for a 64-row wave, each warpgroup 64 of the tile's columns) issued
in groups of four (not serialized), registers within the default partition's ``setmaxnreg`` budget, shared memory
within a CTA's, and a proxy fence before every stage release (``tiles.release_stage``). The designs with the next
step's wgmma before the promotion (``OVERLAP``, runs of N K blocks software-pipelined inside the loop body) must also
show the promotion under an MMA: FFMAs after a
``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (one group still in flight) in the K loop. At 128x128 they pass; at 256x128 and
128x192 two product tiles beside the accumulators exceed the budget and spill: strict xfails. The split designs
(``_sk``: the split tail, ``ops/gluon/split_tail.py``) keep their unsplit design's SASS facts, with bf16 and fp32
output, and show the split tail's synchronization (:func:`tail_sync_ops`); no other design has any of it.

Run as a script (``python tests/compile_gate/test_compile_gluon_ws.py``) to print the facts table.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from compile_gate.sass import (  # noqa: E402
    cuobjdump_path,
    dump_sass,
    loop_bodies,
    opcode_counts,
    sass_summary,
    stage_releases,
)
from tilegemm.heuristics import gluon as gluon_rules  # noqa: E402
from tilegemm.ops.gluon import aot, fp8_gemm_ws_kernel, grouped, split_tail, tiles, transpose  # noqa: E402
from tilegemm.ops.gluon import fp8_gemm_ws as ws  # noqa: E402

GOOD = ["a_128x128", "a_128x128_p", "d_128x128_ov", "d_128x128_ov4", "d_128x128_ov8", "b_256x128", "b_256x128_np"]
GOOD += ["c_128x192"]
GOOD += ["e_64x128_p", "e_64x128_ov2", "e_64x128_ov4", "f_128x64_p", "f_128x64_ov2", "f_128x64_ov4"]
GOOD += ["h_64x64_ov2", "h_64x64_ov4"]
#: one MMA warpgroup on a 64-row tile (``mma_warps`` 4), unsplit (a split one is in ``SPLIT``)
ONE_WARPGROUP = [name for name, cfg in ws.VARIANTS.items() if cfg.mma_warps == 4 and cfg.splits == 1]
GOOD += ONE_WARPGROUP
#: each MMA warpgroup a partition of its own (``wg_parts`` 2)
WG_PARTS = [name for name, cfg in ws.VARIANTS.items() if cfg.wg_parts == 2]
GOOD += WG_PARTS
#: the split-tail designs (dense only), each compiled with its own split count (4, or 2 for ``_sk2``)
SPLIT = [name for name, cfg in ws.VARIANTS.items() if cfg.splits > 1]
GOOD += SPLIT
SPILLING_OVERLAP = ["bd_256x128_ov", "cd_128x192_ov"]
#: the one-wave designs an m-grouped call may run (the shipped ones first: short groups, long groups)
GROUPED = ["d_128x128_ov4", "d_128x128_ov8", "a_128x128_p", "c_128x192", "g_128x128_ov4", "g_128x128_ov8"]
#: the designs a k-grouped call may run (the shipped one first): with B's column scales read at the promotion, the
#: runs of 2 keep within the registers
K_GROUPED = ["g_128x128_ov2", "d_128x128_ov", "a_128x128_p"]
#: the fused FP8 experts' gate/up designs (the gated form) and down designs (rows scaled): 128-row and 64-row tiles
GATED = [gluon_rules.MOE_FP8_GATE_UP_WS_DESIGN, "e_64x128_p"]
ROW_SCALED = [gluon_rules.M_GROUPED_FP8_WS_DESIGN, "e_64x128_ov2"]


def ffma_under_mma(loop: list[str]) -> int:
    """FFMAs of a loop body issued while a warpgroup MMA group is still in flight: between a
    ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (all groups but the newest complete) and the next ``WARPGROUP.DEPBAR``."""
    count, under = 0, False
    for text in loop:
        if "WARPGROUP.DEPBAR" in text:
            left = re.search(r"gsb0, 0x([0-9a-f]+)", text)
            under = left is not None and int(left.group(1), 16) > 0
        elif under and re.match(r"(@!?U?P\w+\s+)?FFMA\b", text):
            count += 1
    return count


def tail_sync_ops(sass: str) -> dict[str, int]:
    """The split tail's synchronization in a SASS listing (:func:`split_tail.split_fixup`): the GPU-scope fence before
    the acq_rel arrival (``MEMBAR.ALL.GPU``), the arrival's add (``REDG``/``ATOMG ADD``, strong, GPU scope), any
    acquire load (``LDG.E.STRONG.GPU``: a wait, which the fixup has not), the L1 invalidation after the acquire
    (``CCTL.IVALL``) and the reset of the counter (``ATOMG EXCH``)."""
    ops = opcode_counts(sass)
    count = lambda pred: sum(n for op, n in ops.items() if pred(op))  # noqa: E731
    return {
        "membar_gpu": count(lambda op: op == "MEMBAR.ALL.GPU"),
        "add": count(lambda op: op.startswith(("REDG.E.ADD.STRONG.GPU", "ATOMG.E.ADD.STRONG.GPU"))),
        "acquire_load": count(lambda op: op.startswith("LDG.E.STRONG.GPU")),
        "invalidate_l1": count(lambda op: op == "CCTL.IVALL"),
        "exch": count(lambda op: op.startswith("ATOMG.E.EXCH.STRONG.GPU")),
    }


def check_tail_sync(sync: dict[str, int], splits: int) -> None:
    """A split design's SASS has the split tail's synchronization (:func:`tail_sync_ops`); an unsplit one none."""
    if splits == 1:
        assert not any(sync.values()), sync
        return
    assert sync["add"] == 1 and sync["exch"] == 1, sync  # the arrival; the last run's reset
    assert sync["membar_gpu"] >= 1 and sync["invalidate_l1"] >= 1, sync  # the arrival's release and acquire halves
    assert sync["acquire_load"] == 0, sync  # no run waits for another


def _tools_reason() -> str | None:
    """Why the gate cannot run here (no ptxas or cuobjdump), or ``None``."""
    from triton import knobs

    try:
        ptxas = knobs.nvidia.ptxas.path
    except Exception as exc:  # triton raises when its bundled ptxas is missing
        return f"no ptxas: {exc}"
    exe = cuobjdump_path()
    if shutil.which(exe) is None:
        return f"no cuobjdump ({exe})"
    for tool in (ptxas, exe):
        if subprocess.run([tool, "--version"], capture_output=True).returncode != 0:
            return f"{tool} does not run"
    return None


def sass_facts(kernel) -> dict:
    """What the gate checks of a compiled ``fp8_gemm_ws_kernel``, read from its SASS and PTX."""
    cubin = kernel.asm["cubin"]
    sass = dump_sass(cubin)
    ops = opcode_counts(sass)
    summary = sass_summary(cubin)
    # the innermost loop with MMAs: the K loop
    loop = min((b for b in loop_bodies(sass) if any("QGMMA" in t for t in b)), key=len, default=[])
    budgets = [int(x) for x in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"])]
    return {
        "usetmaxreg": sum(n for op, n in ops.items() if op.startswith("USETMAXREG")),
        "stl": summary["stl"],
        "ldl": summary["ldl"],
        "qgmma_k_loop": sum(1 for t in loop if "QGMMA" in t),
        "ffma_under_mma": ffma_under_mma(loop),
        "qgmma_shapes": sorted({m.group(0) for t in loop for m in [re.search(r"QGMMA\.\w+", t)] if m}),
        "gmma_group_min": summary["gmma_group_min"],
        "max_register": max(int(x) for x in re.findall(r"\bR(\d+)\b", sass)),
        "mma_budget": max(budgets, default=0),  # the default partition's setmaxnreg (the largest decrease)
        "setmaxnreg_inc": sorted(
            {int(x) for x in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"])}
        ),
        "shared_bytes": kernel.metadata.shared,
        "utmaldg": summary["utmaldg"],
        "utmastg": summary["utmastg"],
        "utmaredg": summary["utmaredg"],
        "tensormap_writes": summary["tensormap_writes"],
        "global_scratch": kernel.metadata.global_scratch_size,
        "tail_sync": tail_sync_ops(sass),
        "releases": stage_releases(sass),
    }


@pytest.fixture(scope="module")
def facts():
    """The SASS facts of every design (by name) and of the m-grouped form of :data:`GROUPED` (``name+grouped``)."""
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    facts_of = {}
    bf16, f32 = torch.bfloat16, torch.float32
    builds = [(name, "", ws.DENSE, bf16, False) for name in ws.VARIANTS]
    builds += [(name, "+grouped", ws.M_GROUPED, bf16, False) for name in GROUPED]
    builds += [
        (name, f"+k{'acc' if acc else ''}", ws.K_GROUPED, f32, acc) for name in K_GROUPED for acc in (False, True)
    ]
    builds += [(name, "+kin", ws.K_GROUPED, f32, True) for name in K_GROUPED]  # the nt blocks read in place
    # the fused FP8 experts' GEMMs (ops/gluon/moe_fp8.py): gate/up with the activation, down with the routing weights
    f8 = torch.float8_e4m3fn
    for up in GATED:
        builds += [(up, f"+gated_{act}", ws.M_GROUPED, f8, False) for act in ws.GATED_ACTIVATIONS]
    builds += [(down, "+row_scale", ws.M_GROUPED, bf16, False) for down in ROW_SCALED]
    builds += [(name, "+fp32", ws.DENSE, f32, False) for name in SPLIT]
    for name, suffix, grouping, out, accumulate in builds:
        key = name + suffix
        try:
            row_scale = suffix == "+row_scale"
            gated = ws.GATED_ACTIVATIONS.get(suffix.removeprefix("+gated_"), 0)
            in_place = suffix == "+kin"
            kernel = aot.compile_dense_fp8_ws(ws.VARIANTS[name], out, grouping, accumulate, row_scale, gated, in_place)
            assert kernel.name == fp8_gemm_ws_kernel.fp8_gemm_ws_kernel.__name__
            facts_of[key] = sass_facts(kernel)
        except Exception as exc:
            facts_of[key] = exc
    return facts_of


def _get(facts, name):
    got = facts[name]
    if isinstance(got, Exception):
        raise got
    return got


def test_ws_kernel_walks_and_stores_with_tiles_helpers():
    """The ws kernel compiles tiles.py's tile walk, tile order, ring barriers, stage release, B block scale, store and
    reduce-add (the helpers the gluon GEMM kernels share), not copies of its own."""
    helpers = (
        "tile_range",
        "tile_coords",
        "block_scale",
        "store_tile",
        "add_tile",
        "wgmma_layout",
        "ring_barriers",
        "release_stage",
    )
    for helper in helpers:
        assert getattr(fp8_gemm_ws_kernel, helper) is getattr(tiles, helper), helper


@pytest.mark.parametrize("name", GOOD)
def test_ws_sass(facts, name):
    _check_good(ws.VARIANTS[name], _get(facts, name))


def test_ws_kernel_splits_with_split_tail_helpers():
    """The ws kernel walks its jobs and sums a split run's tile with split_tail.py's helpers (the BF16 ws kernel
    compiles the same ones), not copies of its own."""
    for helper in ("job_walk", "split_job", "split_fixup"):
        assert getattr(fp8_gemm_ws_kernel, helper) is getattr(split_tail, helper), helper


@pytest.mark.parametrize("suffix", ["", "+fp32"])
@pytest.mark.parametrize("name", SPLIT)
def test_ws_split_tail_sass(facts, name, suffix):
    """A split design: its unsplit design's SASS facts (QGMMA per K block, the promotion under the next wgmma, TMA),
    no spills in bf16 or fp32 output, and the split tail's synchronization. The unsplit designs have none of it
    (``SPLITS`` = 1 compiles the kernel as before)."""
    cfg = ws.VARIANTS[name]
    assert cfg.splits in (2, aot.COMPILED_SPLITS) and split_tail.tail_splits(8, 132, cfg.splits) == cfg.splits
    f = _get(facts, name + suffix)
    _check_good(cfg, f)
    check_tail_sync(f["tail_sync"], cfg.splits)
    unsplit = next(n for n, c in ws.VARIANTS.items() if c == cfg._replace(splits=1))
    check_tail_sync(_get(facts, unsplit)["tail_sync"], 1)
    assert _get(facts, unsplit)["qgmma_k_loop"] == f["qgmma_k_loop"]


@pytest.mark.parametrize("name", GROUPED)
def test_ws_grouped_sass(facts, name):
    """The m-grouped form (the tile's group read per tile, its rows masked at the store) keeps the design's SASS."""
    _check_good(ws.VARIANTS[name], _get(facts, f"{name}+grouped"))


@pytest.mark.parametrize("name", ROW_SCALED)
def test_ws_row_scale_sass(facts, name):
    """The fused FP8 experts' down GEMM (each row scaled by its routing weight) keeps the m-grouped design's SASS."""
    _check_good(ws.VARIANTS[name], _get(facts, name + "+row_scale"))


@pytest.mark.parametrize("activation", list(ws.GATED_ACTIVATIONS))
@pytest.mark.parametrize("name", GATED)
def test_ws_gated_sass(facts, name, activation):
    """The fused FP8 experts' gate/up GEMM (the gated form): per K block four QGMMA for the gate tile and four for the
    up tile, each four in one group (a 64-row tile: each warpgroup 64 of the columns); two accumulators and one
    product tile within the budget, no spills; A, the two B sub-tiles and A's scales by TMA, h stored by one TMA
    store. Under every triton of the tested range (gelu_tanh in its logistic form: written as ``2 - 2 / (1 + exp(2t))``
    the 128-row form spilled 144 / 105 STL / LDL words under triton 3.8)."""
    f = _get(facts, f"{name}+gated_{activation}")
    shape = "QGMMA.64x128x32" if ws.VARIANTS[name].wave_m == 128 else "QGMMA.64x64x32"
    assert f["usetmaxreg"] >= 1 and f["stl"] == f["ldl"] == 0, "setmaxnreg, no spills"
    assert f["qgmma_k_loop"] == 8 and f["qgmma_shapes"] == [shape] and f["gmma_group_min"] == 4
    assert 0 < f["max_register"] < f["mma_budget"] <= 240
    assert f["shared_bytes"] <= ws.SMEM_BYTES and f["ffma_under_mma"] == 0
    assert f["utmaldg"] == 4 and f["utmastg"] == 1
    _check_releases(f)


@pytest.mark.parametrize("suffix", ["+k", "+kacc", "+kin"])
@pytest.mark.parametrize("name", K_GROUPED)
def test_ws_k_grouped_sass(facts, name, suffix):
    """The k-grouped form (per-group K ranges, B's column scales by TMA in the stage); accumulating, each warpgroup's
    tile leaves by a TMA reduce-add into D (D never read into registers), else by a TMA store. Reading the ``nt``
    blocks in place (``+kin``, accumulating), the loader writes A's and B's descriptors to global memory at its two
    call sites (the first tile, a group's entry: 4 ``UTMACCTL.IV``, 128 bytes of scratch each), with
    :data:`fp8_gemm_ws.IN_PLACE_LOADER_REGS` registers (at 24 triton 3.8 spills); no other form writes one."""
    f = _get(facts, name + suffix)
    cfg = ws.VARIANTS[name]
    _check_partitions(cfg, f)
    assert f["usetmaxreg"] >= 1 and f["stl"] == f["ldl"] == 0, "setmaxnreg, no spills"
    blocks = max(cfg.overlap, 1)  # K blocks per iteration of the K loop
    assert f["qgmma_k_loop"] == 4 * blocks and f["qgmma_shapes"] == ["QGMMA.64x128x32"] and f["gmma_group_min"] == 4
    if cfg.overlap:  # the first step's promotion of each run runs under the next step's wgmma
        assert f["ffma_under_mma"] > 0, "promotion under the next wgmma"
    assert 0 < f["max_register"] < f["mma_budget"] <= _budget_cap(cfg)
    assert f["shared_bytes"] <= ws.SMEM_BYTES and cfg.block_n == 128
    assert f["utmaldg"] == 4, "A, B and both sides' scales by TMA"
    leaves = (f["utmaredg"], f["utmastg"]) if suffix != "+k" else (f["utmastg"], f["utmaredg"])
    assert leaves == (cfg.wg_parts, 0), "one TMA reduce-add (accumulating) or store per MMA partition"
    writes = 4 if suffix == "+kin" else 0
    assert f["tensormap_writes"] == writes and f["global_scratch"] == 128 * writes


def test_transpose_moves_16_bytes_a_thread():
    """The FP8 transposing copy (``ops/gluon/transpose.py``) loads and stores 16 bytes a thread (128-bit global
    accesses, no byte-wide ones) and keeps its tile in 16 KB of shared memory."""
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    kernel = aot.compile_transpose()
    ops = opcode_counts(dump_sass(kernel.asm["cubin"]))
    assert ops.get("LDG.E.128", 0) == ops.get("STG.E.128", 0) == 8, ops
    assert not any(op.startswith(("LDG.E.U8", "STG.E.U8", "STL", "LDL")) for op in ops), ops
    assert kernel.metadata.shared == transpose.TILE * transpose.TILE


def test_the_grouped_ops_run_gated_designs():
    """``ops/gluon/grouped.py`` launches the ws kernel's grouped forms with designs this gate compiles."""
    assert grouped.M_GROUPED_FP8_WS_DESIGN in GROUPED
    assert gluon_rules.M_GROUPED_FP8_WS_LONG_DESIGN in GROUPED
    assert gluon_rules.M_GROUPED_FP8_WS_SHORT_K_DESIGN in GROUPED
    assert grouped.K_GROUPED_FP8_WS_DESIGN in K_GROUPED
    assert grouped.MOE_FP8_GATE_UP_WS_DESIGN in GOOD
    assert set(GATED + ROW_SCALED) <= set(GOOD)


def _budget_cap(cfg: ws.WsConfig) -> int:
    """The most registers the default partition may take: 240 beside a loader warpgroup (two MMA warpgroups in it),
    248 when the second MMA warpgroup is a worker of its own (``wg_parts`` 2: 248 + 232 + 24 of 3 x 168), 256 for
    one MMA warpgroup (``mma_warps`` 4)."""
    if cfg.mma_warps == 4:
        return 256
    return 248 if cfg.wg_parts == 2 else 240


def _mma_budget(cfg: ws.WsConfig, f: dict) -> int:
    """The default partition's registers: its ``setmaxnreg`` decrease from the launch's share; one MMA warpgroup
    (``mma_warps`` 4) raises its share instead (the loader's decrease leaves room), so its increase."""
    return max(f["setmaxnreg_inc"], default=0) if cfg.mma_warps == 4 else f["mma_budget"]


def _check_releases(f: dict) -> None:
    """Every one-thread arrival (a stage release) follows a proxy fence (:func:`stage_releases`)."""
    releases, fenced = f["releases"]
    assert releases > 0 and fenced == releases, (
        f"{fenced} of {releases} one-thread arrivals (stage releases) after a proxy fence"
    )


def _check_partitions(cfg: ws.WsConfig, f: dict) -> None:
    """A design with each MMA warpgroup a partition (``wg_parts`` 2) raises the worker warpgroup to
    ``WG1_REGS`` and stores through staging tiles of its own (one TMA store, or reduce-add, a sub-tile and warpgroup:
    two at 128x128, four at 128x192); the others have one MMA partition. Every stage release is fenced
    (:func:`_check_releases`)."""
    _check_releases(f)
    stores = f["utmastg"] + f["utmaredg"]
    if cfg.wg_parts == 2:
        assert fp8_gemm_ws_kernel.WG1_REGS in f["setmaxnreg_inc"] and stores == 2 * (1 + (cfg.block_n == 192)), f
    else:
        assert fp8_gemm_ws_kernel.WG1_REGS not in f["setmaxnreg_inc"] and stores <= 2, f


def _check_good(cfg: ws.WsConfig, f: dict) -> None:
    """What every shipped design's SASS must show (see the module docstring)."""
    _check_partitions(cfg, f)
    assert f["usetmaxreg"] >= 1, "setmaxnreg: the MMA warps take the loader warp's registers"
    assert f["stl"] == f["ldl"] == 0, "register spills"
    per_wave = 4 + (4 if cfg.block_n == 192 else 0)
    blocks = max(cfg.overlap, 1)  # K blocks per iteration of the K loop
    assert f["qgmma_k_loop"] == blocks * cfg.waves * per_wave, "QGMMA m64nNk32 per K block: 4 per 128-wide sub-tile"
    # a 64-row wave: each warpgroup half the columns (64 of 128, 32 of 64); a 128x64 tile: 64 rows of 64 columns;
    # a 128x192 tile: its 128- and 64-wide sub-tiles
    # (one MMA warpgroup: the whole tile's columns)
    cols = min(cfg.block_n, 128) // (2 if cfg.wave_m == 64 and cfg.mma_warps == 8 else 1)
    wide = f"QGMMA.64x{cols}x32"
    want = {wide} | ({"QGMMA.64x64x32"} if cfg.block_n == 192 else set())
    assert set(f["qgmma_shapes"]) == want
    assert f["gmma_group_min"] == 4, "each sub-tile's four wgmma in one group (ptxas did not serialize them)"
    assert 0 < f["max_register"] < _mma_budget(cfg, f) <= _budget_cap(cfg), (
        "registers within the default partition's budget"
    )
    assert f["shared_bytes"] <= ws.SMEM_BYTES
    assert f["utmaldg"] == 3 + (cfg.block_n == 192), "A, B (one or two sub-tiles) and A's scales by TMA"
    if cfg.overlap and wide == "QGMMA.64x128x32":
        # every promotion of a run but the last runs while the next step's group is in flight (64 FFMA a step)
        assert f["ffma_under_mma"] == 64 * (blocks * cfg.waves - 1), "promotion under the next wgmma"
    elif cfg.overlap:
        # 32 FFMA a step at 64x128 and 128x64, 16 at 64x64 (32 on one MMA warpgroup); ptxas sinks some of a run's
        # first promotion below the last wait (at 64x64 over two warpgroups more than half of it: 7 of 16 in runs of
        # 2, 40 of 48 in runs of 4)
        step = cfg.wave_m * cfg.block_n // (32 * cfg.mma_warps)
        least = 0.6 if step == 32 else 0.4
        assert least * step * (blocks - 1) <= f["ffma_under_mma"] <= step * (blocks - 1), "promotion under the wgmma"
    else:
        assert f["ffma_under_mma"] == 0


@pytest.mark.parametrize("name", SPILLING_OVERLAP)
@pytest.mark.xfail(strict=True, reason="two product tiles beside the accumulators exceed the 224-register budget")
def test_ws_overlap_sass(facts, name):
    f = _get(facts, name)
    assert f["stl"] == f["ldl"] == 0 and f["gmma_group_min"] >= 4


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_ws_ring_fits(out_dtype):
    """The ring depth :func:`ws_config` picks fits beside the output staging tiles; one stage more would not."""
    reason = _tools_reason()
    if reason:
        pytest.skip(reason)
    cfg = ws.ws_config(ws.Problem(4096, 4096, 4096, out_dtype), ws.VARIANTS["c_128x192"])
    assert aot.compile_dense_fp8_ws(cfg, out_dtype).metadata.shared <= ws.SMEM_BYTES
    if cfg.stages < 8:
        assert ws.stage_bytes(cfg) * (cfg.stages + 1) + ws.staging_bytes(cfg, out_dtype.itemsize) > ws.SMEM_BYTES


if __name__ == "__main__":
    cols = [
        "usetmaxreg",
        "stl",
        "ldl",
        "qgmma_k_loop",
        "ffma_under_mma",
        "gmma_group_min",
        "max_register",
        "mma_budget",
    ]
    print("| variant | config | " + " | ".join(cols) + " | shared | QGMMA shapes |")
    print("|---" * (len(cols) + 4) + "|")
    for name, cfg in ws.VARIANTS.items():
        try:
            f = sass_facts(aot.compile_dense_fp8_ws(cfg))
        except Exception as exc:
            print(f"| {name} | FAILED: {type(exc).__name__}: {str(exc)[:200]} |")
            continue
        stages = ws.ws_config(ws.Problem(4096, 4096, 4096, torch.bfloat16), cfg).stages
        ov = f" OV{cfg.overlap}" if cfg.overlap else ""
        shape = f"{cfg.block_m}x{cfg.block_n} s{stages}{' P' if cfg.persistent else ''}{ov}"
        row = " | ".join(str(f[c]) for c in cols)
        print(f"| {name} | {shape} | {row} | {f['shared_bytes']} | {' '.join(f['qgmma_shapes'])} |")
