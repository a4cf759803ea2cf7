"""CPU compile gate for the fused MoE experts kernels (``ops/cutile/moe.py``), sm_90 and sm_100.

Variants: the gate/up GEMM for every config of ``heuristics.all_moe_configs``, both activations; the down GEMM
for every config; the combine for top-k 1, 2, 8 and the widest and narrowest column tiles; the per-slot kernels
(``ops/cutile/moe_slots.py``) with int64 and int32 ids, even and ragged K; the block kernels
(``ops/cutile/moe_blocks.py``) for every row tile; the FP8 kernels (``ops/cutile/moe_fp8.py``): the
gather-quantize, the block form for every row tile and the row form. Checked: tensor-core MMAs, TMA loads of the
weights and, in the sorted and block GEMMs, of the gathered rows (UTMALDG, no ``cp.async`` register gather), the
per-slot kernels' rows as 16-byte ``cp.async`` copies (``LDGSTS.E.BYPASS.128``) when K allows it, no register
spills, no TMA descriptor built on the device.
"""

from __future__ import annotations

import re

import pytest

ct = pytest.importorskip("cuda.tile")

from compile_gate.sass import compile_all, dump_sass, opcode_counts, sass_summary  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.ops.cutile import aot, moe, moe_blocks, moe_fp8, moe_slots  # noqa: E402

ARCHS = aot.ARCHS
_A = aot.array


def _index(ndim: int = 1):
    return aot.array(ct.int32, ndim, align_bytes=4)


def _up_params(cfg: heuristics.TileConfig, act: int) -> list:
    """xs (gathered rows), w13 as [E, 2, I, H], h, m_indices, E, then the constants."""
    bf = [_A(ct.bfloat16, 2), _A(ct.bfloat16, 4), _A(ct.bfloat16, 2)]
    return [*bf, _index(), aot.scalar(ct.int32), act, cfg.bm, cfg.bn, cfg.bk, cfg.gm]


def _down_params(cfg: heuristics.TileConfig) -> list:
    bf = [_A(ct.bfloat16, 2), _A(ct.bfloat16, 3), _A(ct.bfloat16, 2)]
    return [
        *bf,
        _index(),
        aot.array(ct.float32, 1, align_bytes=4),
        aot.scalar(ct.int32),
        cfg.bm,
        cfg.bn,
        cfg.bk,
        cfg.gm,
    ]


def _combine_params(top_k: int, bt: int, bn: int) -> list:
    return [_A(ct.bfloat16, 2), _index(2), _A(ct.bfloat16, 2), top_k, bt, bn]


def _variants():
    """(id, kernel name, compiler hints (warps, occupancy), params) of every variant a call can launch."""
    out = []
    for cfg in heuristics.all_moe_configs():
        up, down = cfg.up, cfg.down
        hints = (up.num_worker_warps, up.occupancy)
        for act_name, act in moe.ACTIVATIONS.items():
            out.append((f"up-{up.name}-{act_name}", "gate_up", hints, _up_params(up, act)))
        out.append((f"down-{down.name}", "down", (down.num_worker_warps, down.occupancy), _down_params(down)))
    for top_k in (1, 2, 8):
        for bn in (heuristics.MOE_COMBINE_MAX_BN, 8):
            bt = heuristics.MOE_COMBINE_BT
            out.append((f"combine-k{top_k}-{bt}x{bn}", "combine", (None, None), _combine_params(top_k, bt, bn)))
    return out


def _slot_variants():
    """The per-slot kernels (``moe_slots.py``) with the default tiles: int64 and int32 ids, K even and ragged."""
    cfg = heuristics.moe_slots_config(2048)
    bf, out = ct.bfloat16, []
    for id_dtype in (ct.int64, ct.int32):
        ids = aot.array(id_dtype, 1, align_bytes=4)
        for even_k in (True, False):
            tag = f"{id_dtype}-{'evenk' if even_k else 'raggedk'}"
            for act_name, act in moe.ACTIVATIONS.items():
                up = [_A(bf, 2), _A(bf, 3), _A(bf, 3), _A(bf, 2), ids, aot.scalar(ct.int32), aot.scalar(ct.int32)]
                out.append((f"slots-up-{act_name}-{tag}", "gate_up", [*up, act, cfg.bw, cfg.bk, cfg.bt, even_k]))
            for w_dtype in (ct.float32, bf):
                down = [
                    _A(bf, 2),
                    _A(bf, 3),
                    _A(bf, 2),
                    ids,
                    aot.array(w_dtype, 1, align_bytes=2),
                    aot.scalar(ct.int32),
                ]
                out.append((f"slots-down-{w_dtype}-{tag}", "down", [*down, cfg.bw, cfg.bk, cfg.bt, even_k]))
    for top_k in (1, 8):
        for bn in (heuristics.MOE_COMBINE_MAX_BN, 8):
            params = [_A(bf, 3), _A(bf, 2), top_k, cfg.combine_bt, bn]
            out.append((f"slots-combine-k{top_k}-{bn}", "combine", params))
    return out


def _block_variants():
    """The block kernels (``moe_blocks.py``): every row tile ``moe_blocks_config`` can pick, both activations."""
    bf, out = ct.bfloat16, []
    bt = heuristics.MOE_BLOCKS_MIN_BT
    while bt <= heuristics.MOE_BLOCKS_MAX_BT:
        cfg = heuristics.MoEBlocksConfig(bt=bt)
        tiles = [cfg.bw, cfg.bk, cfg.bt]
        for act_name, act in moe.ACTIVATIONS.items():
            up = [_A(bf, 2), _A(bf, 3), _A(bf, 3), _A(bf, 2), _index(), aot.scalar(ct.int32), act]
            out.append((f"blocks-up-{act_name}-t{bt}", "gate_up", [*up, *tiles]))
        weight = aot.array(ct.float32, 1, align_bytes=4)
        down = [_A(bf, 2), _A(bf, 3), _A(bf, 2), _index(), weight, aot.scalar(ct.int32)]
        out.append((f"blocks-down-t{bt}", "down", [*down, *tiles]))
        bt *= 2
    tiles = moe_blocks.ROUTE_SC, moe_blocks.ROUTE_EC
    for id_dtype in (ct.int64, ct.int32):
        ids, n = aot.array(id_dtype, 1, align_bytes=4), aot.scalar(ct.int32)
        # counts, row_token, row_weight, row_group
        rows = [_index(2), _index(), aot.array(ct.float32, 1, align_bytes=4), _index()]
        out.append((f"blocks-route-count-{id_dtype}", "count", [ids, *rows, n, n, *tiles, moe_blocks.ROUTE_RC]))
        for w_dtype in (ct.float32, bf):
            w = aot.array(w_dtype, 1, align_bytes=2)
            place = [ids, w, *rows[:1], _index(), *rows[1:], _index(), n, n, n]
            for lanes in (8, 256):
                vid = f"blocks-route-place-{id_dtype}-{w_dtype}-e{lanes}"
                out.append((vid, "place", [*place, 16, lanes, *tiles, moe_blocks.ROUTE_BC]))
    return out


def _fp8_variants():
    """The FP8 kernels (``moe_fp8.py``): the gather-quantize; block-form gate/up (both activations) and down for
    every row tile ``moe_fp8_config`` can pick, and the row-form ones with ``MOE_FP8_TILE_CONFIG``'s hints.
    Entries: (id, kernel name, compiler hints (warps, occupancy), params)."""
    f8, f32, bf, out = ct.float8_e4m3fn, ct.float32, ct.bfloat16, []
    quant = [_A(bf, 2), _index(), _A(f8, 2), _A(f32, 2), _index(), aot.scalar(ct.int32), moe_fp8.QUANT_BR, 64]
    out.append(("fp8-gather-quant", "gather_quant", (None, moe_fp8.QUANT_OCCUPANCY), quant))
    # the gluon form's: each token quantized once, then its rows gathered (bytes), the scales MN-major
    tokens = [_A(bf, 2), _A(f8, 2), _A(f32, 2), moe_fp8.QUANT_BR]
    out.append(("fp8-token-quant", "quant", (None, moe_fp8.QUANT_OCCUPANCY), tokens))
    u8, block = _A(ct.uint8, 2), [_index(), aot.scalar(ct.int32), moe_fp8.QUANT_BR, 128]
    rows = [u8, _A(f32, 2), _index(), u8, _A(f32, 2), *block]
    out.append(("fp8-gather-rows", "gather_rows", (None, moe_fp8.QUANT_OCCUPANCY), rows))
    rows = [_A(f8, 2), _A(f32, 2)]  # fp8 rows and their 1x128 scales
    up = [*rows, _A(f8, 3), _A(f8, 3), _A(f32, 3), _A(f32, 3), *rows, _index(), aot.scalar(ct.int32)]
    weight = aot.array(ct.float32, 1, align_bytes=4)
    down = [*rows, _A(f8, 3), _A(f32, 3), _A(bf, 2), _index(), weight, aot.scalar(ct.int32)]
    bt = heuristics.MOE_BLOCKS_MIN_BT
    while bt <= heuristics.MOE_BLOCKS_MAX_BT:
        for act_name, act in moe.ACTIVATIONS.items():
            out.append((f"fp8-up-{act_name}-t{bt}", "block_gate_up", (None, None), [*up, act, bt]))
        out.append((f"fp8-down-t{bt}", "block_down", (None, None), [*down, bt]))
        bt *= 2
    cfg = heuristics.MOE_FP8_TILE_CONFIG
    for act_name, act in moe.ACTIVATIONS.items():
        out.append((f"fp8-up-{act_name}-rows", "tile_gate_up", (cfg.up.num_worker_warps, cfg.up.occupancy), [*up, act]))
    out.append(("fp8-down-rows", "tile_down", (cfg.down.num_worker_warps, cfg.down.occupancy), down))
    return out


VARIANTS = _variants()
SLOT_VARIANTS = _slot_variants()
BLOCK_VARIANTS = _block_variants()
FP8_VARIANTS = _fp8_variants()


@pytest.fixture(scope="module")
def compiled():
    """(SASS summary, opcode counts) of every (variant, arch), compiled in parallel threads."""
    jobs = [
        (vid, moe.get_kernel(name, *hints), params, arch) for vid, name, hints, params in VARIANTS for arch in ARCHS
    ]
    jobs += [(vid, moe_slots.get_kernel(name), params, arch) for vid, name, params in SLOT_VARIANTS for arch in ARCHS]
    jobs += [(vid, moe_blocks.get_kernel(name), params, arch) for vid, name, params in BLOCK_VARIANTS for arch in ARCHS]
    jobs += [
        (vid, moe_fp8.get_kernel(name, *hints), params, arch)
        for vid, name, hints, params in FP8_VARIANTS
        for arch in ARCHS
    ]

    return compile_all(jobs, aot.compile_cubin, lambda cubin: (sass_summary(cubin), opcode_counts(dump_sass(cubin))))


def test_heuristics_only_pick_gated_configs():
    allowed = set(heuristics.all_moe_configs())
    for t, k, e in ((1, 8, 128), (64, 8, 256), (4096, 8, 128), (16384, 2, 8), (3, 1, 1)):
        for h in (2048, 7168, 4096, 136):
            cfg = heuristics.choose(heuristics.Problem("moe", "bf16", t * k, h, 1024, 132, groups=e))
            fp8_problem = heuristics.Problem("moe_fp8", "fp8", t * k, h, 1024, 132, groups=e)
            fp8 = heuristics.choose(fp8_problem)  # the FP8 op: block form (128x128 weight tiles) or row form
            if isinstance(fp8, heuristics.MoEBlocksConfig):
                assert (fp8.bw, fp8.bk) == (128, 128) and f"fp8-down-t{fp8.bt}" in {v[0] for v in FP8_VARIANTS}, fp8
            else:
                tiles = heuristics.MOE_FP8_TILE_CONFIG
                assert (fp8.up, fp8.down) == (tiles.up, tiles.down), fp8
            if isinstance(cfg, heuristics.MoESlotsConfig):  # the per-slot kernels, compiled with this config
                assert cfg == heuristics.moe_slots_config(h), (t, k, e, cfg)
            elif isinstance(cfg, heuristics.MoEBlocksConfig):  # the block kernels: every row tile is compiled
                gated = {v[0] for v in BLOCK_VARIANTS}
                assert cfg.bw == heuristics.MoEBlocksConfig.bw and cfg.bk == heuristics.MoEBlocksConfig.bk, cfg
                assert f"blocks-down-t{cfg.bt}" in gated, (t, k, e, cfg)
            else:
                assert heuristics.MoEConfig(cfg.up, cfg.down) in allowed, (t, k, e, cfg)
            assert h % cfg.combine_bn == 0 and cfg.combine_bn <= heuristics.MOE_COMBINE_MAX_BN


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid", [v[0] for v in VARIANTS + SLOT_VARIANTS + BLOCK_VARIANTS + FP8_VARIANTS])
def test_moe_kernel_sass(compiled, vid, arch):
    result = compiled[(vid, arch)]
    if isinstance(result, Exception):
        raise result
    s, ops = result
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: register spills to local memory: {s}"
    assert s["tensormap_writes"] == 0, f"{vid} {arch}: TMA descriptors built on the device: {s}"
    if "combine" in vid or "route" in vid or "quant" in vid or "gather-rows" in vid:
        return
    if vid.startswith("fp8"):  # FP8 tensor-core MMAs; weight blocks and row tiles through TMA
        mma = s["qgmma"] if arch == "sm_90" else s["utcqmma"]
        assert mma > 0 and s["hmma"] == 0, f"{vid} {arch}: no FP8 warpgroup / tcgen05 MMA: {s}"
        assert s["utmaldg"] >= (3 if "-up-" in vid else 2), f"{vid} {arch}: operands not loaded with TMA: {s}"
        return
    mma = s["hgmma"] if arch == "sm_90" else s["utchmma"]
    assert mma > 0 and s["hmma"] == 0, f"{vid} {arch}: no warpgroup / tcgen05 MMA: {s}"
    assert s["utmaldg"] >= (1 if vid.startswith("slots-down") else 2), f"{vid} {arch}: weights not loaded with TMA: {s}"
    if vid.startswith(("blocks", "up-")):  # weight and row tiles both TMA: no register gather left
        loads = 3 if "blocks-up" in vid else 2  # the sorted gate/up loads gate and up weight rows as one tile
        assert s["utmaldg"] >= loads and ops["LDGSTS.E.BYPASS.128"] == 0, f"{vid} {arch}: {s}"
    if vid.startswith("slots") and vid.endswith("evenk"):
        assert ops["LDGSTS.E.BYPASS.128"] > 0, f"{vid} {arch}: gathered rows not copied 16 bytes at a time: {ops}"


@pytest.mark.parametrize("cfg", heuristics.all_moe_configs(), ids=lambda c: c.name)
def test_sorted_gate_up_is_one_mma_chain_sm90(cfg):
    """The sorted gate/up tile loads its gate and up weight rows as one [2 * BN, BK] tile, so every warpgroup MMA is
    64 x 2BN on sm_90. As two BN-wide accumulators tileiras issued each 64 x BN MMA as its own group, and the kernel
    ran 13% below the down GEMM (docs/kernels.md, "Fused MoE experts")."""
    up = cfg.up
    cubin = aot.compile_cubin(moe.get_kernel("gate_up", up.num_worker_warps, up.occupancy), _up_params(up, 0), "sm_90")
    widths = set(re.findall(r"HGMMA\.64x(\d+)x16", dump_sass(cubin)))
    assert widths == {str(2 * up.bn)}, widths
