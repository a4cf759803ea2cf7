"""CPU compile gate for the grouped GEMM kernels: every variant the heuristics can pick, sm_90 and sm_100.

Variants: m-grouped BF16 (m_indices / psum / masked layouts, NT and NN weights), m-grouped FP8
(NT storage: the host copies NN weights to NT because Hopper FP8 MMAs take K-major operands),
k-grouped BF16/FP8 with and without ``c``, each with every config of
``heuristics.all_grouped_configs``. Each is compiled once per arch with ``export_kernel`` (no
GPU) and its SASS checked: tensor-core MMAs, TMA operand loads (UTMALDG), no LDL/STL spills,
no byte-wide LDG.E.U8 loads of FP8 operands.
"""

from __future__ import annotations

import pytest

ct = pytest.importorskip("cuda.tile")

from compile_gate.sass import compile_all  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.ops.cutile import aot, grouped_kernels  # noqa: E402

ARCHS = aot.ARCHS
_A = aot.array
Kind = heuristics.Kind
KINDS = {"indices": Kind.INDICES, "psum": Kind.PSUM, "masked": Kind.MASKED}


def _index():
    return aot.array(ct.int32, 1, align_bytes=4)


def _m_params(fp8: bool, kind: Kind, trans_b: bool, cfg: heuristics.TileConfig) -> list:
    consts = [int(kind), trans_b, cfg.bm, cfg.bn, cfg.bk, cfg.gm]
    rank = 3 if kind == Kind.MASKED else 2  # masked a, sa and d are [G, Mmax, *] ([G, K/128, Mmax])
    tail = [_index(), *(aot.scalar(ct.int32) for _ in range(4))]  # index, mmax, groups, align, zero_tail
    if fp8:
        return [
            _A(ct.float8_e4m3fn, rank),
            _A(ct.float32, rank),
            _A(ct.float8_e4m3fn, 3),
            _A(ct.float32, 3, align_bytes=4),  # [G, N/128, K/128] block scales: no alignment promised
            _A(ct.bfloat16, rank),
            *tail,
            *consts,
            cfg.fast_acc,
        ]
    return [_A(ct.bfloat16, rank), _A(ct.bfloat16, 3), _A(ct.bfloat16, rank), *tail, *consts]


def _k_params(fp8: bool, has_c: bool, c_is_d: bool, cfg: heuristics.TileConfig) -> list:
    consts = [has_c, c_is_d, cfg.bm, cfg.bn, cfg.bk, cfg.gm]
    out = [_A(ct.float32, 3, alias_groups=("cd",)), _A(ct.float32, 3, alias_groups=("cd",)), _index()]
    if fp8:
        ops = [_A(ct.float8_e4m3fn, 2), _A(ct.float32, 2), _A(ct.float8_e4m3fn, 2), _A(ct.float32, 2)]
        return [*ops, *out, *consts, cfg.fast_acc]
    return [_A(ct.bfloat16, 2), _A(ct.bfloat16, 2), *out, *consts]


def _problem(dtype: str, kind: Kind, rows: int, n: int, groups: int, expected_m: int, has_c: bool):
    """A grouped problem (K does not steer the choice) on 132 SMs."""
    return heuristics.Problem("grouped", dtype, rows, n, 8192, 132, groups, kind, expected_m, has_c)


def _variants():
    """(id, kernel family, config, params, fp8) for every grouped kernel variant a call can launch."""
    out = []
    for fp8 in (False, True):
        dt = "fp8" if fp8 else "bf16"
        for kname, kind in KINDS.items():
            layouts = ("nt",) if (fp8 or kind == Kind.MASKED) else ("nt", "nn")
            for cfg in heuristics.all_grouped_configs(dt, kind):
                for lay in layouts:
                    vid = f"m-{dt}-{kname}-{lay}-{cfg.name}"
                    out.append((vid, f"m_{dt}", cfg, _m_params(fp8, kind, lay == "nt", cfg), fp8))
        k_cfgs = heuristics.all_grouped_configs(dt, Kind.K)
        for c_mode in ("noc", "c", "c_is_d"):
            has_c = c_mode != "noc"
            cfg = heuristics.choose(_problem(dt, Kind.K, 4096, 4096, 4, 4096, has_c))
            assert cfg in k_cfgs
            vid = f"k-{dt}-{c_mode}-{cfg.name}"
            out.append((vid, f"k_{dt}", cfg, _k_params(fp8, has_c, c_mode == "c_is_d", cfg), fp8))
    return out


VARIANTS = _variants()


@pytest.fixture(scope="module")
def compiled():
    """SASS summaries of every (variant, arch), compiled in parallel threads (tileiras runs out of process)."""
    jobs = [
        (vid, grouped_kernels.get_kernel(fam, cfg.num_worker_warps, cfg.occupancy), params, arch)
        for vid, fam, cfg, params, _ in VARIANTS
        for arch in ARCHS
    ]
    return compile_all(jobs, aot.compile_cubin)


def test_heuristics_only_pick_gated_configs():
    """Every config choose returns for a grouped problem over a sweep of shapes is one the gate compiles."""
    for dtype in ("bf16", "fp8"):
        for kind in Kind:
            allowed = set(heuristics.all_grouped_configs(dtype, kind))
            for rows, groups, em in ((8192 * 4, 4, 8192), (256 * 128, 128, 256), (128 * 256, 256, 128), (20, 32, 20)):
                for n in (512, 2048, 4096, 7168):
                    for has_c in (False, True):
                        cfg = heuristics.choose(_problem(dtype, kind, rows, n, groups, em, has_c))
                        assert cfg in allowed, (dtype, kind, rows, n, cfg)


_BK = {v[0]: v[2].bk for v in VARIANTS}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid,fp8", [(v[0], v[4]) for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_grouped_kernel_sass(compiled, vid, fp8, arch):
    s = compiled[(vid, arch)]
    if isinstance(s, Exception):
        raise s
    if arch == "sm_90":
        # A K block's warpgroup MMAs go out in one group: with a `while True` + `break` walk tileiras waited for
        # each HGMMA before the next (groups of one; grouped_kernels.py's docstring).
        per_block = _BK[vid] // (32 if fp8 else 16)
        assert s["gmma_group_min"] >= per_block, f"{vid}: MMAs per wait group {s['gmma_group_min']} < {per_block}"
    if arch == "sm_90":
        mma, name = (s["qgmma"], "QGMMA") if fp8 else (s["hgmma"], "HGMMA")
    else:
        mma, name = (s["utcqmma"], "UTCQMMA") if fp8 else (s["utchmma"], "UTCHMMA")
    assert mma > 0, f"{vid} {arch}: no {name}: {s}"
    assert s["hmma"] == 0, f"{vid} {arch}: legacy mma.sync (HMMA): {s}"
    assert s["utmaldg"] >= 2, f"{vid} {arch}: operands not loaded with TMA: {s}"
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: register spills to local memory: {s}"
    assert s["ldg_u8"] == 0, f"{vid} {arch}: byte-wide LDG.E.U8 loads (TMA lost on FP8 operands): {s}"
    if vid.startswith("m-"):
        # No TMA descriptor built on the device (a dynamic Array.slice does that, into a runtime workspace that
        # compute-sanitizer caught being written out of bounds): m-grouped tiles use row-addressed views instead.
        assert s["tensormap_writes"] == 0, f"{vid} {arch}: TMA descriptors built on the device: {s}"
