"""CPU compile gate for the dense GEMM kernels: every config the heuristics can pick, sm_90 and sm_100.

Each variant is compiled once per arch with ``cuda.tile.compilation.export_kernel`` (no GPU),
its SASS dumped with cuobjdump, and the machine code checked: tensor-core MMAs (Hopper HGMMA /
QGMMA, Blackwell UTCHMMA / UTCQMMA), TMA loads for the operands (UTMALDG), no local-memory
spills (LDL/STL), no byte-wide LDG.E.U8 loads of FP8 operands.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

ct = pytest.importorskip("cuda.tile")

from compile_gate.sass import sass_summary  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.ops import plans  # noqa: E402
from tilegemm.ops.cutile import aot, decode, gemm, gemm_kernels, launch  # noqa: E402

ARCHS = aot.ARCHS
_A = aot.array


def _head(out_dtype, w_dtype):
    """D, C, W (split-K workspace), alpha, beta, K, splits."""
    return [
        _A(out_dtype, 2),
        _A(out_dtype, 2),
        _A(w_dtype, 4),
        aot.scalar(ct.float32),
        aot.scalar(ct.float32),
        aot.scalar(ct.int32),
        aot.scalar(ct.int32),
    ]


def _bf16_params(cfg, a_kmajor, b_kmajor, has_c, out_dtype, splitk=False):
    consts = gemm_kernels.kernel_constants(cfg, a_kmajor=a_kmajor, b_kmajor=b_kmajor, has_c=has_c, splitk=splitk)
    w = ct.float32 if splitk else out_dtype
    return [_A(ct.bfloat16, 2), _A(ct.bfloat16, 2), *_head(out_dtype, w), *consts]


def _fp8_params(cfg, sb_rows, out_dtype, splitk=False):
    consts = gemm_kernels.kernel_constants(cfg, sb_rows=sb_rows, splitk=splitk)
    w = ct.float32 if splitk else out_dtype
    operands = [_A(ct.float8_e4m3fn, 2), _A(ct.float8_e4m3fn, 2), _A(ct.float32, 2), _A(ct.float32, 2)]
    return [*operands, *_head(out_dtype, w), *consts]


def _reduce_params(cfg, has_c, out_dtype):
    scalars = [aot.scalar(ct.float32), aot.scalar(ct.float32), aot.scalar(ct.int32)]  # alpha, beta, splits
    consts = gemm_kernels.reduce_constants(cfg, has_c=has_c)
    return [_A(ct.float32, 4), _A(out_dtype, 2), _A(out_dtype, 2), *scalars, *consts]


def _decode_head(out_dtype, splitk):
    """D, C, W (split-K partials), CNT (tile counters), alpha, beta, K, splits, per."""
    w = _A(ct.float32, 3)
    scalars = [aot.scalar(ct.float32), aot.scalar(ct.float32)] + [aot.scalar(ct.int32)] * 3
    return [_A(out_dtype, 2), _A(out_dtype, 2), w, _A(ct.int32, 1), *scalars]


def _plan(cfg, bm, latency=0):
    """A decode plan with activation tile ``bm`` and load latency hint ``latency`` (what the constants read)."""
    return heuristics.DecodePlan(cfg, bm, 1, 1, 1, 1, 1, latency)


def _decode_bf16_params(cfg, bm, splitk, *, a_kmajor=True, b_kmajor=True, has_c=False, out_dtype=ct.bfloat16):
    consts = decode.bf16_constants(_plan(cfg, bm), a_kmajor=a_kmajor, b_kmajor=b_kmajor, has_c=has_c, splitk=splitk)
    return [_A(ct.bfloat16, 2), _A(ct.bfloat16, 2), *_decode_head(out_dtype, splitk), *consts]


def _decode_fp8_params(cfg, bm, splitk, *, sb_rows=False, has_c=False, out_dtype=ct.bfloat16, inside=False):
    """Scales with generic strides (the kernel reads row-major and MN-major scales in place)."""
    consts = decode.fp8_constants(_plan(cfg, bm), sb_rows=sb_rows, has_c=has_c, splitk=splitk, inside=inside)
    scales = [_A(ct.float32, 2, contiguous_last=False), _A(ct.float32, 2, contiguous_last=False)]
    return [_A(ct.float8_e4m3fn, 2), _A(ct.float8_e4m3fn, 2), *scales, *_decode_head(out_dtype, splitk), *consts]


def _decode_lean_params(dt, cfg, bm, *, a_kmajor=True, b_kmajor=True, sb_rows=False, latency=0, inside=False):
    """The lean entry point's parameters: no C, W, CNT, beta, splits or per, nor the HAS_C/SPLITK constants."""
    scalars = [aot.scalar(ct.float32), aot.scalar(ct.int32)]
    plan = _plan(cfg, bm, latency)
    if dt == "bf16":
        consts = decode.bf16_constants(plan, a_kmajor=a_kmajor, b_kmajor=b_kmajor, has_c=False, splitk=False)
        return [_A(ct.bfloat16, 2), _A(ct.bfloat16, 2), _A(ct.bfloat16, 2), *scalars, *consts[:-2]]
    consts = decode.fp8_constants(plan, sb_rows=sb_rows, has_c=False, splitk=False, inside=inside)
    scales = [_A(ct.float32, 2, contiguous_last=False), _A(ct.float32, 2, contiguous_last=False)]
    return [_A(ct.float8_e4m3fn, 2), _A(ct.float8_e4m3fn, 2), *scales, _A(ct.bfloat16, 2), *scalars, *consts[:-2]]


def _decode_variants():
    """Every decode variant at the narrowest and widest activation tile (split-K where it splits),
    plus the default variant's other cases: every activation tile width its ``tile_m`` can pick per dtype,
    the [K, N] BF16 weight, the c epilogue with an fp32 d, the 1x128 FP8 weight scales. The lean entry
    points (calls without c or split-K) at every tile width of the default and of the no-split variants."""
    out = []
    default = heuristics.decode_config()
    for cfg in heuristics.DECODE_CONFIGS:
        for dt, params in (("bf16", _decode_bf16_params), ("fp8", _decode_fp8_params)):
            bms = {heuristics.DECODE_MIN_BM, 128}
            if cfg is default:
                ks = (0, heuristics.DECODE_FP8_BM32_MIN_K)
                bms = {cfg.tile_m(m, dt, k) for m in range(1, heuristics.DECODE_MAX_M + 1) for k in ks}
            for bm in sorted(bms):
                sk = cfg.splitk
                tag = f"decode-{cfg.name}-bm{bm}" + ("-splitk" if sk else "")
                out.append((f"{tag}-{dt}", dt, decode.get_kernel(dt, cfg, bm), params(cfg, bm, sk)))
                if cfg is default or not sk:
                    lean = decode.get_kernel(dt, cfg, bm, lean=True)
                    out.append((f"decode-{cfg.name}-bm{bm}-lean-{dt}", dt, lean, _decode_lean_params(dt, cfg, bm)))
                if dt == "fp8" and cfg is default:  # scale tiles inside the scales (no bounds check)
                    out.append(
                        (f"{tag}-fp8-inside", dt, decode.get_kernel(dt, cfg, bm), params(cfg, bm, sk, inside=True))
                    )
                    params_in = _decode_lean_params(dt, cfg, bm, inside=True)
                    out.append((f"decode-{cfg.name}-bm{bm}-lean-fp8-inside", dt, lean, params_in))
    bm = heuristics.DECODE_MIN_BM
    kb, kf = decode.get_kernel("bf16", default, bm), decode.get_kernel("fp8", default, bm)
    tag = f"decode-{default.name}-bm{bm}"
    out.append((f"{tag}-bf16-nn", "bf16", kb, _decode_bf16_params(default, bm, True, b_kmajor=False)))
    out.append((f"{tag}-bf16-tn", "bf16", kb, _decode_bf16_params(default, bm, False, a_kmajor=False)))
    c32 = {"has_c": True, "out_dtype": ct.float32}
    out.append((f"{tag}-bf16-c-f32", "bf16", kb, _decode_bf16_params(default, bm, True, **c32)))
    out.append((f"{tag}-fp8-1x128-c-f32", "fp8", kf, _decode_fp8_params(default, bm, True, sb_rows=True, **c32)))
    out.append((f"{tag}-fp8-1x128-nosplit", "fp8", kf, _decode_fp8_params(default, bm, False, sb_rows=True)))
    lean_b, lean_f = decode.get_kernel("bf16", default, bm, lean=True), decode.get_kernel("fp8", default, bm, lean=True)
    out.append((f"{tag}-lean-bf16-nn", "bf16", lean_b, _decode_lean_params("bf16", default, bm, b_kmajor=False)))
    out.append((f"{tag}-lean-fp8-1x128", "fp8", lean_f, _decode_lean_params("fp8", default, bm, sb_rows=True)))
    # The deep pipeline decode_plan picks for unsplit FP8 64-row tiles at long K, both weight-scale recipes.
    bm, lat = heuristics.DECODE_NARROW_BM, heuristics.DECODE_DEEP_LATENCY
    deep = decode.get_kernel("fp8", default, bm, lean=True)
    for rows in (False, True):
        for inside in (False, True):
            params = _decode_lean_params("fp8", default, bm, sb_rows=rows, latency=lat, inside=inside)
            vid = (
                f"decode-{default.name}-bm{bm}-lean-fp8-l{lat}"
                + ("-1x128" if rows else "")
                + ("-inside" if inside else "")
            )
            out.append((vid, "fp8", deep, params))
    # The kernels compiled for a plan's own occupancy hint (an unsplit BF16 plan of at most 16 rows).
    for dt, bm, occ, lean in _plan_occupancies():
        kernel = decode.get_kernel(dt, default, bm, lean=lean, occupancy=occ)
        tag = f"decode-{default.name}-bm{bm}-o{occ}" + ("-lean" if lean else "-splitk")
        params = (
            _decode_lean_params(dt, default, bm)
            if lean
            else (_decode_bf16_params if dt == "bf16" else _decode_fp8_params)(default, bm, True)
        )
        out.append((f"{tag}-{dt}", dt, kernel, params))
    return out


def _plan_occupancies():
    """``(dtype, bm, occupancy, lean)`` of every plan ``decode_plan`` makes over the harness's dense (N, K) at 1-256
    rows whose occupancy hint is not the config's default for its tile (those kernels are compiled above)."""
    from tilegemm.bench import dense as bench_dense

    cfg, seen = heuristics.decode_config(), set()
    for dt in ("bf16", "fp8"):
        for m in (1, 8, 16, 32, 64, 128, 256):
            for n, k in bench_dense.NK:
                plan = heuristics.decode_plan(heuristics.Problem("dense", dt, m, n, k, 132), cfg)
                if plan.occupancy != cfg.occupancy_for(plan.bm):
                    seen.add((dt, plan.bm, plan.occupancy, not plan.splitk))
    return sorted(seen)


def _variants():
    """(id, kind, kernel, params) for every kernel variant a call can launch.

    Per config: BF16 every operand orientation (nt/nn/tn/tt storage) with a bf16 d and no c,
    the fp32-d-with-c epilogue and the split-K variant; FP8 both RHS scale recipes, fp32 d and
    split-K (an FP8 call with c goes through split-K + reduce); plus the split-K reduce kernel
    (both epilogues).
    """
    out = []
    for cfg in heuristics.all_dense_configs():
        k = gemm_kernels.get_kernel(cfg)
        if cfg.dtype == "bf16":
            for a_k in (True, False):
                for b_k in (True, False):
                    lay = ("n" if a_k else "t") + ("t" if b_k else "n")
                    out.append((f"{cfg.name}-{lay}", "bf16", k, _bf16_params(cfg, a_k, b_k, False, ct.bfloat16)))
            out.append((f"{cfg.name}-nt-c-f32", "bf16", k, _bf16_params(cfg, True, True, True, ct.float32)))
            out.append((f"{cfg.name}-nt-splitk", "bf16", k, _bf16_params(cfg, True, True, False, ct.bfloat16, True)))
        else:
            rows_opts = [True] + ([False] if cfg.bn // cfg.nh == 128 else [])
            for rows in rows_opts:
                tag = "1x128" if rows else "128x128"
                out.append((f"{cfg.name}-{tag}", "fp8", k, _fp8_params(cfg, rows, ct.bfloat16)))
            rows = cfg.bn // cfg.nh != 128
            out.append((f"{cfg.name}-f32", "fp8", k, _fp8_params(cfg, rows, ct.float32)))
            out.append((f"{cfg.name}-splitk", "fp8", k, _fp8_params(cfg, rows, ct.bfloat16, True)))
        red = gemm_kernels.get_reduce_kernel()
        out.append((f"reduce-{cfg.name}-bf16", "reduce", red, _reduce_params(cfg, False, ct.bfloat16)))
        out.append((f"reduce-{cfg.name}-c-f32", "reduce", red, _reduce_params(cfg, True, ct.float32)))
    return out + _decode_variants() + _narrow_variants()


def _narrow_params(dtype, cfg, *, a_kmajor=True, b_kmajor=True, sb_rows=False, out_dtype=ct.bfloat16, inside=False):
    """A, B (, SA, SB with generic strides), D, alpha, K and the constants of the narrow-tile kernel."""
    consts = decode.narrow_constants(dtype, cfg, a_kmajor=a_kmajor, b_kmajor=b_kmajor, sb_rows=sb_rows, inside=inside)
    tail = [_A(out_dtype, 2), aot.scalar(ct.float32), aot.scalar(ct.int32), *consts]
    if dtype == "bf16":
        return [_A(ct.bfloat16, 2), _A(ct.bfloat16, 2), *tail]
    scales = [_A(ct.float32, 2, contiguous_last=False), _A(ct.float32, 2, contiguous_last=False)]
    return [_A(ct.float8_e4m3fn, 2), _A(ct.float8_e4m3fn, 2), *scales, *tail]


def _narrow_variants():
    """Every narrow-tile config: BF16 every operand orientation and an fp32 d; FP8 both weight-scale recipes and an
    fp32 d."""
    out = []
    for dtype, cfgs in heuristics.NARROW_CONFIGS.items():
        for cfg in cfgs:
            k = decode.get_narrow_kernel(dtype, cfg)
            if dtype == "bf16":
                for a_k in (True, False):
                    for b_k in (True, False):
                        lay = ("n" if a_k else "t") + ("t" if b_k else "n")
                        out.append(
                            (f"{cfg.name}-{lay}", dtype, k, _narrow_params(dtype, cfg, a_kmajor=a_k, b_kmajor=b_k))
                        )
                out.append((f"{cfg.name}-f32", dtype, k, _narrow_params(dtype, cfg, out_dtype=ct.float32)))
            else:
                out.append((f"{cfg.name}-128x128", dtype, k, _narrow_params(dtype, cfg)))
                out.append((f"{cfg.name}-1x128", dtype, k, _narrow_params(dtype, cfg, sb_rows=True)))
                if cfg.unchecked_scales:  # scale tiles inside the scales: loads without bounds checks
                    for rows in (False, True):
                        vid = f"{cfg.name}-{'1x128' if rows else '128x128'}-inside"
                        out.append((vid, dtype, k, _narrow_params(dtype, cfg, sb_rows=rows, inside=True)))
                out.append((f"{cfg.name}-f32", dtype, k, _narrow_params(dtype, cfg, out_dtype=ct.float32)))
    return out


VARIANTS = _variants()


_CACHE: dict[tuple[str, str], object] = {}


def _compile(job):
    vid, kernel, params, arch = job
    key = (vid, arch)
    if key not in _CACHE:
        try:
            _CACHE[key] = sass_summary(aot.compile_cubin(kernel, params, arch))
        except Exception as exc:  # re-raised by the test of that variant
            _CACHE[key] = exc
    return _CACHE[key]


@pytest.fixture(scope="module")
def compiled():
    """SASS summary per (variant, arch), each compiled once.

    Run alone, every variant is compiled up front in parallel threads (tileiras runs out of
    process); under pytest-xdist each worker compiles only the variants of its own tests.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        jobs = [(vid, kernel, params, arch) for vid, _, kernel, params in VARIANTS for arch in ARCHS]
        workers = int(os.environ.get("TILEGEMM_COMPILE_THREADS", "2"))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_compile, jobs))
    by_id = {vid: (kernel, params) for vid, _, kernel, params in VARIANTS}
    return lambda vid, arch: _compile((vid, *by_id[vid], arch))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid,kind", [(v[0], v[1]) for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_dense_kernel_sass(compiled, vid, kind, arch):
    s = compiled(vid, arch)
    if isinstance(s, Exception):
        raise s
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: register spills to local memory: {s}"
    assert s["ldg_u8"] == 0, f"{vid} {arch}: byte-wide LDG.E.U8 loads (TMA lost on FP8 operands): {s}"
    assert s["hmma"] == 0, f"{vid} {arch}: legacy mma.sync (HMMA) instead of warpgroup/tcgen05 MMAs: {s}"
    if kind == "reduce":  # the split-K reduce only streams fp32 partials: no MMA, plain loads are fine
        return
    if arch == "sm_90":
        mma, name = (s["hgmma"], "HGMMA") if kind == "bf16" else (s["qgmma"], "QGMMA")
    else:
        mma, name = (s["utchmma"], "UTCHMMA") if kind == "bf16" else (s["utcqmma"], "UTCQMMA")
    assert mma > 0, f"{vid} {arch}: no {name}: {s}"
    # The A and B tiles come through TMA (FP8 scale tiles may too).
    assert s["utmaldg"] >= 2, f"{vid} {arch}: operands not loaded with TMA: {s}"
    if arch == "sm_90" and not vid.startswith("decode-"):
        # A K block's warpgroup MMAs (64 of K: four HGMMA.x16; 128: four QGMMA.x32) go out in one group. The split-K
        # kernel with both a workspace and an output store in one kernel had them waited for one by one
        # (gemm_kernels.py).
        assert s["gmma_group_min"] >= 4, f"{vid}: MMAs per wait group {s['gmma_group_min']} < 4"


def test_deep_decode_pipeline_keeps_two_stages_sm90():
    """The latency hint decode_plan gives the unsplit FP8 kernel with 64-row tiles buys it a second 32 KiB load stage
    on sm_90 (tileiras 13.4 gives it one without the hint), and two CTAs still fit an SM (results/decode/README.md,
    "Load pipeline depth")."""
    from compile_gate.sass import launch_resources

    cfg, bm = heuristics.decode_config(), heuristics.DECODE_NARROW_BM
    stage = cfg.bw * cfg.step_k("fp8") + bm * cfg.step_k("fp8")
    kernel = decode.get_kernel("fp8", cfg, bm, lean=True)
    params = _decode_lean_params("fp8", cfg, bm, latency=heuristics.DECODE_DEEP_LATENCY)
    deep = launch_resources(aot.compile_cubin(kernel, params, "sm_90"))
    assert deep["shared"] >= 2 * stage, deep
    assert 2 * deep["shared"] <= 228 * 1024 and 2 * deep["threads"] * deep["registers"] <= 65536, deep


@pytest.mark.parametrize(
    "dtype,cfg,sb_rows",
    [("bf16", c, False) for c in heuristics.NARROW_CONFIGS["bf16"]]
    + [("fp8", c, rows) for c in heuristics.NARROW_CONFIGS["fp8"] for rows in (False, True)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_narrow_pipeline_keeps_four_stages_sm90(dtype, cfg, sb_rows):
    """The narrow-tile kernels keep at least four load stages (activation + weight tile per K step) on sm_90, and
    as many CTAs as its occupancy hint (at most two) fit an SM: the FP8 kernel with 1x128 weight scales got one
    stage without its latency hint (``NarrowConfig``)."""
    from compile_gate.sass import launch_resources

    step = 128 if dtype == "fp8" else cfg.bk_bf16
    stage = (cfg.bm + cfg.bn) * step * (1 if dtype == "fp8" else 2)
    kernel = decode.get_narrow_kernel(dtype, cfg)
    res = launch_resources(aot.compile_cubin(kernel, _narrow_params(dtype, cfg, sb_rows=sb_rows), "sm_90"))
    assert res["shared"] >= 4 * stage, res
    fit = min(2, cfg.occupancy)
    assert fit * res["shared"] <= 228 * 1024 and fit * res["threads"] * res["registers"] <= 65536, res


@pytest.mark.parametrize(
    "dtype,cfg",
    [("bf16", c) for c in heuristics.NARROW_CONFIGS["bf16"]] + [("fp8", c) for c in heuristics.NARROW_CONFIGS["fp8"]],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_narrow_k_walk_has_no_division_sm90(dtype, cfg):
    """No loop of a narrow-tile kernel (the TMA producer's, the MMA warps') divides by a runtime value: its K walk
    wraps with a compare and a select (``decode._wrap``). A ``%`` there cost an integer division per K block in
    both loops (``I2F.RP``, ``MUFU.RCP`` and ~30 integer instructions); H100: FP8 up to 1.13x faster without it
    (``benchmarks/results/decode/README.md``, "K-block wrap")."""
    from compile_gate.sass import dump_sass, loop_bodies

    sass = dump_sass(aot.compile_cubin(decode.get_narrow_kernel(dtype, cfg), _narrow_params(dtype, cfg), "sm_90"))
    loops = loop_bodies(sass)
    mma = "QGMMA" if dtype == "fp8" else "HGMMA"
    assert any(any(mma in i for i in body) for body in loops), "no MMA loop found"
    assert any(any("UTMALDG" in i for i in body) for body in loops), "no TMA producer loop found"
    for body in loops:
        assert not any("MUFU.RCP" in i for i in body), [i for i in body if "MUFU" in i or "I2F" in i]


def _mma_loop_length(kernel, params) -> int:
    """Instructions in the shortest sm_90 loop of ``kernel`` that issues a QGMMA (its MMA warps' K loop)."""
    from compile_gate.sass import dump_sass, loop_bodies

    bodies = loop_bodies(dump_sass(aot.compile_cubin(kernel, params, "sm_90")))
    return min(len(b) for b in bodies if any("QGMMA" in i for i in b))


@pytest.mark.parametrize("which", ["narrow_w64_pair", "narrow_w64_pair-1x128", "swap_bm16"])
def test_inside_scales_shorten_the_mma_loop_sm90(which):
    """With ``INSIDE`` (every scale tile inside the scales: ``decode.narrow_scales_inside`` /
    ``swap_scales_inside``) the FP8 decode kernels load their scales without bounds checks, and their MMA loop is
    shorter (sm_90, instructions per K step: narrow 64x64 pairs 301 -> 292, with 1x128 weight scales 711 -> 393,
    swap-AB with 16 activation rows 372 -> 231)."""
    if which.startswith("narrow"):
        cfg, rows = heuristics.NARROW_FP8_W64_PAIR, which.endswith("1x128")
        kernel = decode.get_narrow_kernel("fp8", cfg)
        checked, inside = (_narrow_params("fp8", cfg, sb_rows=rows, inside=i) for i in (False, True))
    else:
        cfg, bm = heuristics.decode_config(), heuristics.DECODE_MIN_BM
        kernel = decode.get_kernel("fp8", cfg, bm, lean=True)
        checked, inside = (_decode_lean_params("fp8", cfg, bm, inside=i) for i in (False, True))
    assert _mma_loop_length(kernel, inside) < _mma_loop_length(kernel, checked)


# ----------------------------------------------------- host plans: the launch arguments fit the kernels

_TORCH_TO_CT = {
    "torch.bfloat16": ct.bfloat16,
    "torch.float32": ct.float32,
    "torch.float8_e4m3fn": ct.float8_e4m3fn,
    "torch.int32": ct.int32,
}


def _constraints(kernel, args):
    """AOT constraints for the arguments a host plan passes to ``ct.launch`` (tensors, scalars, constants)."""
    import inspect

    import torch

    params = list(inspect.signature(kernel._pyfunc).parameters.values())
    assert len(params) == len(args), f"{len(args)} arguments for {len(params)} parameters"
    out = []
    for p, x in zip(params, args):
        const = "Const" in str(p.annotation)
        if isinstance(x, torch.Tensor):
            out.append(_A(_TORCH_TO_CT[str(x.dtype)], x.dim(), contiguous_last=x.stride(-1) == 1))
        elif const:
            out.append(x)
        else:
            out.append(aot.scalar(ct.float32 if isinstance(x, float) else ct.int32))
    return out


PLAN_CASES = [
    ("bf16", 1, 4096, 7168),
    ("fp8", 4, 2112, 7168),
    ("fp8", 128, 7168, 2048),
    ("bf16", 300, 512, 512),
    ("bf16", 8, 256, 256),  # decode without split-K: the lean entry point
    ("fp8", 8, 256, 256),
    ("bf16", 64, 2112, 7168),  # the narrow-tile kernels
    ("fp8", 64, 4096, 7168),
]


@pytest.mark.parametrize("kind,m,n,k", PLAN_CASES, ids=["-".join(map(str, c)) for c in PLAN_CASES])
def test_host_plan_arguments_compile(monkeypatch, kind, m, n, k):
    """A call's cached plan (CPU tensors, launch intercepted, 132 SMs) passes arguments the kernel compiles with.

    Checks the argument order and count against each kernel's parameters, and that a repeated
    call reuses the plan (one plan, the same launches).
    """
    import torch

    import tilegemm
    from tilegemm.quant import get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8

    calls = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: calls.append((grid, kernel, args)))
    monkeypatch.setattr(launch, "current_stream", lambda: type("S", (), {"cuda_stream": 1})())
    monkeypatch.setattr(plans, "_PLANS", {})
    monkeypatch.setattr(tilegemm.config, "_num_sms", 132)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    if kind == "bf16":
        a, b = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
        call = lambda: gemm.bf16_gemm(a, b, d)  # noqa: E731
    else:
        qa, qb = per_token_cast_to_fp8(torch.randn(m, k)), per_block_cast_to_fp8(torch.randn(n, k))
        qa = (qa[0], get_mn_major_tma_aligned_tensor(qa[1]))
        call = lambda: gemm.fp8_gemm(qa, qb, d, recipe=(1, 128, 128))  # noqa: E731
    call()
    first = list(calls)
    call()
    assert len(plans._PLANS) == 1 and len(calls) == 2 * len(first)
    if (m, n, k) == (8, 256, 256):
        assert [kernel._pyfunc.__name__ for _, kernel, _ in first] == [f"_decode_{kind}_gemm_lean"]
    if m == 64:
        assert [kernel._pyfunc.__name__ for _, kernel, _ in first] == [f"_narrow_{kind}_gemm_body"]
    for grid, kernel, args in first:
        assert len(grid) == 3 and grid[0] >= 1
        s = sass_summary(aot.compile_cubin(kernel, _constraints(kernel, args), "sm_90"))
        assert s["ldl"] == 0 and s["stl"] == 0, s
