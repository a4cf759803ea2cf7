"""CPU compile gate for the MoE experts training kernels (``ops/cutile/moe_train.py``), sm_90 and sm_100.

Variants: the gate/up forward and the ``dh`` GEMM with the activation's backward, both activations, with the
tiles ``heuristics.moe_train_config`` picks; the weighted combine (fp32 and bf16 routing weights, top-k 1 and 8,
the widest and narrowest column tiles); the row scaling and the slot dots; the k-grouped kernel writing bf16
weight gradients (``d`` passed as ``c`` too, unread) for every k-grouped config. Checked: tensor-core MMAs, the
GEMM operands through TMA, no register spills, no TMA descriptor built on the device.
"""

from __future__ import annotations

import pytest

ct = pytest.importorskip("cuda.tile")

from compile_gate.sass import compile_all, sass_summary  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.heuristics.cutile import Kind  # noqa: E402
from tilegemm.ops.cutile import aot, grouped, moe, moe_train  # noqa: E402

ARCHS = aot.ARCHS
_A = aot.array
BF = ct.bfloat16


def _index(ndim: int = 1):
    return aot.array(ct.int32, ndim, align_bytes=4)


def _variants():
    """(id, kernel getter, params) of every variant a training call can launch."""
    cfg = heuristics.moe_train_config(2048)
    up = cfg.up
    out = []
    hints = (up.num_worker_warps, up.occupancy)
    tiles = [up.bm, up.bn, up.bk, up.gm]
    for act_name, act in moe.ACTIVATIONS.items():
        params = [_A(BF, 2), _A(BF, 4), _A(BF, 2), _A(BF, 2), _A(BF, 2), _index(), aot.scalar(ct.int32)]
        out.append((f"train-up-{act_name}", moe_train.get_kernel("gate_up", *hints), [*params, act, *tiles]))
        params = [_A(BF, 2), _A(BF, 3), _A(BF, 2), _A(BF, 2), _A(BF, 2), _A(BF, 2), _index(), aot.scalar(ct.int32)]
        out.append((f"train-dgate-up-{act_name}", moe_train.get_kernel("dgate_up", *hints), [*params, act, *tiles]))
    bt = cfg.combine_bt
    for w_dtype in (ct.float32, BF):
        weights = aot.array(w_dtype, 2, align_bytes=2)
        for top_k in (1, 8):
            for bn in (heuristics.MOE_COMBINE_MAX_BN, 8):
                params = [_A(BF, 2), _index(2), weights, _A(BF, 2), top_k, bt, bn]
                vid = f"train-combine-{w_dtype}-k{top_k}-{bn}"
                out.append((vid, moe_train.get_kernel("combine_weighted"), params))
    for bn in (heuristics.MOE_COMBINE_MAX_BN, 8):
        params = [_A(BF, 2), _index(), aot.array(ct.float32, 1, align_bytes=4), _A(BF, 2), bt, bn]
        out.append((f"train-scale-rows-{bn}", moe_train.get_kernel("scale_rows"), params))
        for top_k in (1, 8):
            params = [_A(BF, 2), _A(BF, 2), _index(2), _A(ct.float32, 2), top_k, bt, bn]
            out.append((f"train-slot-dots-k{top_k}-{bn}", moe_train.get_kernel("slot_dots"), params))
    for kcfg in heuristics.all_grouped_configs("bf16", Kind.K):
        cd = [_A(BF, 3, alias_groups=("cd",)), _A(BF, 3, alias_groups=("cd",))]
        params = [_A(BF, 2), _A(BF, 2), *cd, _index(), False, False, kcfg.bm, kcfg.bn, kcfg.bk, kcfg.gm]
        kernel = grouped.get_kernel("k_bf16", kcfg.num_worker_warps, kcfg.occupancy)
        out.append((f"train-wgrad-{kcfg.name}", kernel, params))
    return out


VARIANTS = _variants()


@pytest.fixture(scope="module")
def compiled():
    """SASS summaries of every (variant, arch), compiled in parallel threads."""
    jobs = [(vid, kernel, params, arch) for vid, kernel, params in VARIANTS for arch in ARCHS]
    return compile_all(jobs, aot.compile_cubin, sass_summary)


def test_train_config_is_the_sorted_path_tiles():
    """The training kernels run the fused op's 128-row tiles, whose row tile is the routing's alignment."""
    from tilegemm.routing import ALIGNED_ROWS

    for hidden in (2048, 7168, 4096, 136):
        cfg = heuristics.choose(heuristics.Problem("moe_train", "bf16", 0, hidden, 0, 132))
        assert cfg == heuristics.moe_train_config(hidden) and cfg.up.bm == cfg.down.bm == ALIGNED_ROWS
        assert hidden % cfg.combine_bn == 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid", [v[0] for v in VARIANTS])
def test_moe_train_kernel_sass(compiled, vid, arch):
    s = compiled[(vid, arch)]
    if isinstance(s, Exception):
        raise s
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: register spills to local memory: {s}"
    assert s["tensormap_writes"] == 0, f"{vid} {arch}: TMA descriptors built on the device: {s}"
    if "combine" in vid or "scale-rows" in vid or "slot-dots" in vid:
        return
    mma = s["hgmma"] if arch == "sm_90" else s["utchmma"]
    assert mma > 0 and s["hmma"] == 0, f"{vid} {arch}: no warpgroup / tcgen05 MMA: {s}"
    # dgate_up loads dy, w2, gate and up; gate_up the rows and one [2 * BN, BK] gate-and-up weight tile.
    assert s["utmaldg"] >= (3 if "dgate" in vid else 2), f"{vid} {arch}: operands not loaded with TMA: {s}"
