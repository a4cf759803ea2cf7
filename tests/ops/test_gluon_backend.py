"""The gluon backend on a machine without a GPU: availability, the tested triton range, fallback, and the
chooser's rule for dense FP8 GEMMs (kernel numerics are in test_dense_gluon_gpu.py, machine code in
tests/compile_gate/test_compile_gluon.py)."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import tilegemm
from tilegemm.backend import choice, registry, selector
from tilegemm.backend.registry import FallbackWarning
from tilegemm.heuristics import gluon, tiling


@pytest.fixture(autouse=True)
def _triton_3_6(monkeypatch):
    """The rules' verdicts as under triton 3.6 (CI's), whatever triton this machine has: the dense BF16 choice with
    fp32 output reads the installed triton (:func:`gluon.spill_free_here`); the tests of that pin another."""
    monkeypatch.setattr(selector, "triton_version", lambda: (3, 6))


@pytest.mark.parametrize(
    "version, ok",
    [
        ("3.6.0", True), ("3.6.1+git", True), ("3.7.1", True), ("3.8.0", True), ("3.9.0", True), ("3.5.1", False),
        ("3.10.0", False), ("4.0", False), ("nightly", False),
    ],
)  # fmt: skip
def test_triton_version_range(version, ok):
    reason = selector.triton_version_reason(version)
    assert (reason is None) == ok
    if not ok:
        assert version in reason


def test_gluon_is_a_backend_name(monkeypatch):
    """Chosen even where it cannot run (with a FallbackWarning naming the reason there)."""
    assert "gluon" in selector.BACKENDS
    monkeypatch.delenv("TILEGEMM_DISABLE_FALLBACK", raising=False)
    reason = selector.gluon_unavailable_reason()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        with tilegemm.use_backend("gluon"):
            assert tilegemm.get_current_backend() == "gluon"
    assert [str(w.message) for w in caught] == (
        []
        if reason is None
        else [f"tilegemm.use_backend('gluon'): falling back to pytorch: gluon unavailable: {reason}"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without a GPU")
def test_unavailable_without_gpu():
    assert selector.gluon_unavailable_reason() == "no CUDA GPU"
    assert "gluon" not in tilegemm.get_available_backends()


def test_dense_fp8_registered_on_gluon():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    for layout in ("nt", "nn", "tn", "tt"):
        assert "gluon" in registry.get_registered_backends_for_op(f"fp8_fp4_gemm_{layout}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback path of a machine without a GPU")
def test_forced_gluon_falls_back_with_reason(monkeypatch):
    monkeypatch.delenv("TILEGEMM_DISABLE_FALLBACK", raising=False)
    a, b = torch.randn(200, 256), torch.randn(136, 256)
    qa, qb = tilegemm.per_token_cast_to_fp8(a), tilegemm.per_block_cast_to_fp8(b)
    d = torch.empty(200, 136, dtype=torch.bfloat16)
    with pytest.warns(FallbackWarning, match="gluon"):
        tilegemm.fp8_gemm_nt(qa, qb, d, backend="gluon")
    ref = torch.empty_like(d)
    tilegemm.fp8_gemm_nt(qa, qb, ref, backend="pytorch")
    assert torch.equal(d, ref)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback path of a machine without a GPU")
def test_forced_gluon_without_fallback_raises(monkeypatch):
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    qa = tilegemm.per_token_cast_to_fp8(torch.randn(8, 128))
    qb = tilegemm.per_block_cast_to_fp8(torch.randn(8, 128))
    with pytest.raises(RuntimeError, match="gluon"):
        tilegemm.fp8_gemm_nt(qa, qb, torch.empty(8, 8, dtype=torch.bfloat16), backend="gluon")


# The warp-specialized kernel (DeepGEMM's recipe, no addend, alpha 1): (M, N, K, gluon the automatic choice?) on 132
# SMs, with what it measured beside cutile (eager / kernel-only, H200, benchmarks/results/dense-fp8-h200/
# gluon_forced.json for 128x128 tiles; kernel-only, few_tiles_h200.json for 64x128 tiles; eager / kernel-only,
# few_tiles_threshold_h200.json for the rows of 72-96 64x128 tiles). "off-set": a shape outside the benchmark set.
WS_RULE_CASES = [
    (256, 2048, 768, True),  # 32 tiles: 0.89x / 0.74x; 64 64-row tiles, under the bar; 128 64x64 tiles: 1.00x
    (256, 4096, 7168, True),  # 64 tiles: 0.94x / 0.98x; 128 64-row tiles: 1.19x
    (256, 2112, 7168, True),  # 34 tiles: 0.78x / 0.75x; 68 64-row tiles: 0.98x; 132 64x64 tiles: 1.13x
    (256, 7168, 2048, True),  # 112 tiles: 1.23x / 1.21x
    (256, 32768, 512, True),  # 1.34x / 1.44x
    (256, 7168, 16384, True),  # 1.38x / 1.39x
    (512, 2048, 768, True),  # 64 tiles, 2.9 tile-steps per SM: 1.10x / 1.16x; 64-row tiles: 1.26x
    (512, 1536, 2048, True),  # 48 tiles: 1.34x / 1.52x; 64-row tiles: 1.69x
    (512, 2112, 7168, True),  # 68 tiles: 1.56x / 1.55x
    (2048, 2048, 768, True),  # 1.32x / 1.44x
    (4096, 1536, 2048, True),  # 1.77x / 1.84x
    (8192, 8192, 8192, True),  # 1.47x / 1.52x
    (128, 7168, 16384, False),  # a decode size
    (128, 4096, 7168, True),  # off-set: 64 64-row tiles, 0.99x; 128 64x64 tiles, 1.11x
    (127, 4096, 7168, False),  # off-set: under DENSE_FP8_WS_64X64_MIN_M
    (256, 2048, 4096, True),  # off-set: 128 64x64 tiles, 1.08x
    (192, 2816, 5120, True),  # off-set: 132 64x64 tiles, 1.11x
    (384, 1408, 4096, True),  # off-set: 132 64x64 tiles, 1.15x
    (200, 4096, 8192, True),  # off-set: 128 64-row tiles, 1.55x
    (320, 6144, 4096, True),  # off-set: 240 64-row tiles, 1.32x
    (384, 3072, 8192, True),  # off-set: 72 tiles, 1.56x
    (255, 7168, 2048, True),  # off-set: 112 tiles
    (384, 7168, 2048, True),  # off-set: 168 tiles
    (384, 2112, 7168, True),  # off-set: 102 64-row tiles
    (264, 2112, 7168, True),  # off-set: 85 64-row tiles, 1.19x / 1.20x
    (230, 2304, 7168, True),  # off-set: 72 64-row tiles, 1.22x / 1.32x
    (192, 4096, 4096, True),  # off-set: 96 64-row tiles, 1.09x / 1.16x
    (1024, 256, 7168, True),  # off-set: 64 64x64 tiles split 2 ways, 1.35x
    (128, 1024, 7168, False),  # off-set: 32 64x64 tiles, 64 runs split: fewer than measured
    (1024, 512, 512, False),  # off-set: 32 tiles x 4 K blocks, under the fewest measured
    (320, 1536, 2048, True),  # off-set: 120 64x64 tiles, 2.08x (cutile's plans at 320 rows: 129 TFLOP/s)
    (256, 1536, 2048, True),  # 96 64x64 tiles, 1.09x
    (256, 2048, 512, False),  # off-set: K 512, under DENSE_FP8_WS_64X64_MIN_K (0.97x)
    (191, 7168, 7168, False),  # off-set: under DENSE_FP8_WS_MIN_M
]


@pytest.mark.parametrize(
    "m, n, design",
    [
        (200, 4096, "i_64x128_ov4"),  # one round of 64 tiles -> one of 128 (128x64 ties: 64-row tiles first)
        (320, 6144, "i_64x128_ov4"),  # two rounds (144 tiles) -> two (240); 128x64: three (288)
        (384, 3072, "d_128x128_ov8"),  # one round (72) -> two (144) either way
        (512, 4096, "d_128x128_ov8"),  # one round (128) -> two (256)
        (512, 2112, "g_128x64_ov2"),  # one round (68) -> one of 132 128x64 tiles; 64x128: two (136)
        (2048, 4096, "d_128x128_ov8"),  # 512 tiles: under four rounds
        (4096, 7168, "g_128x128_ov4"),  # 1792 tiles: 14 rounds, each MMA warpgroup a partition
        (4224, 2112, "g_128x128_ov4"),  # 561 tiles: four rounds and 33 (a tail too long to split)
        (256, 2112, "i_64x64_ov2"),  # one round of 68 64x128 tiles (0.8) -> one of 132 64x64 tiles (0.7)
        (128, 4096, "i_64x64_ov2"),  # one round of 64 64x128 tiles -> one of 128 64x64 tiles
        (256, 4096, "i_64x128_ov4"),  # one round of 128 64x128 tiles; 64x64: two (256)
        (2048, 1536, "g_128x192"),  # two rounds of 128x128 tiles (192) -> one of 128 128x192 tiles
        (768, 4096, "g_128x192"),  # 192 -> 132 128x192 tiles
        (4096, 1536, "d_128x128_ov8"),  # three rounds (384) -> two of 128x192 (256): 3 < 2 x 1.7
    ],
)
def test_dense_fp8_ws_design(m, n, design):
    """64x128 or 128x64 tiles where their rounds over the SMs cost less than the 128x128 tiles' (a round of smaller
    tiles: 0.8), 64x128 first where the two tie; 64x64 tiles (0.7) where those still leave SMs idle, at K 4096+;
    128x192 tiles (1.7) where they cut the rounds enough; from four rounds of 128x128 tiles, the design with each
    MMA warpgroup a partition."""
    assert gluon.dense_fp8_ws_design(m, n, 7168, 132) == design


@pytest.mark.parametrize("k", [128, 512, 767])
def test_dense_fp8_ws_64x64_tiles_need_deep_k(k):
    """Under :data:`DENSE_FP8_WS_64X64_MIN_K` the 64x64 tiles are not a choice (256x2048x512 ran 0.97x cutile);
    from it they are where their round costs least (256x2048x768: 1.00x, 256x1536x2048: 1.09x)."""
    assert gluon.dense_fp8_ws_design(256, 2112, k, 132) != gluon.DENSE_FP8_WS_64X64_DESIGN
    for deep in (768, 2048, 4096):
        assert gluon.dense_fp8_ws_design(256, 2112, deep, 132) == gluon.DENSE_FP8_WS_64X64_DESIGN


def test_dense_fp8_ws_designs_are_ws_variants():
    """Every design the dense rule may pick names a ``VARIANTS`` entry of the tile it is costed as."""
    ws = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")
    for design, rows, cols, _ in gluon.DENSE_FP8_WS_TILES:
        cfg = ws.VARIANTS[design]
        assert (cfg.block_m, cfg.block_n) == (rows, cols)
    long, short = ws.VARIANTS[gluon.DENSE_FP8_WS_LONG_DESIGN], ws.VARIANTS[gluon.DENSE_FP8_WS_DESIGN]
    assert (long.block_m, long.block_n, long.wg_parts) == (short.block_m, short.block_n, 2)


FP8_GRID = [(m, n, k) for m in (128, 256, 512, 2048, 2056, 4096, 8192) for n in (1536, 2112, 4096, 7168, 24576)
              for k in (768, 2048, 7168)]  # fmt: skip


def test_fp8_choices_are_the_same_under_every_triton_of_the_range(monkeypatch):
    """The dense and m-grouped FP8 designs do not depend on the installed triton: every design compiles without
    spills under each triton of the tested range (the compile gate checks it under each), so 3.8 and 3.9 run the
    128x128 designs 3.6 runs (``d_128x128_ov8``, its split tail, ``g_128x128_ov4``, ``g_128x128_ov8``)."""
    low, high = selector.TRITON_TESTED
    versions = [(low[0], minor) for minor in range(low[1], high[1])]
    assert versions[0] == (3, 6) and (3, 9) in versions

    def choices(version):
        monkeypatch.setattr(selector, "triton_version", lambda: version)
        dense = {shape: gluon.dense_fp8_ws_tiling(*shape, 132) for shape in FP8_GRID}
        grouped = {(m, k): gluon.m_grouped_fp8_ws_design(m, 8, k) for m in (512, 4096, 65536) for k in (768, 7168)}
        return dense, grouped

    under_36 = choices((3, 6))
    picked = {d for d, _ in under_36[0].values()} | set(under_36[1].values())
    assert {"d_128x128_ov8", "d_128x128_ov8_sk", "g_128x128_ov4", "g_128x128_ov8"} <= picked
    for version in versions[1:]:
        assert choices(version) == under_36, version


@pytest.mark.parametrize("m, n, k, automatic", WS_RULE_CASES)
def test_dense_fp8_ws_rule(m, n, k, automatic):
    assert gluon.ws_kernel_faster(m, n, k, 132) == automatic
    assert gluon.prefers_dense_fp8(m, n, k, 132) == automatic


# fp8_gemm_kernel (an addend, alpha != 1, or the (1, 1, 128) recipe): (M, N, K, gluon kernel faster?, gluon the
# automatic choice?) on 132 SMs, with what it measured beside cutile (kernel-only / eager, H100,
# benchmarks/results/gluon/eager_rule_h100.json). "off-set": a shape outside the benchmark set.
RULE_CASES = [
    (512, 2048, 768, False, False),  # 64 tiles: 0.85x kernel-only
    (512, 1536, 2048, False, False),  # 48 tiles: 1.12x kernel-only, 0.52x eager (the tile rule's one miss)
    (2048, 2048, 768, True, False),  # 1.18x kernel-only, 0.18x eager: under the FLOP bar
    (4096, 7168, 2048, True, True),  # 1.53x / 1.53x
    (4096, 32768, 512, True, True),  # 1.30x / 1.35x
    (2048, 24576, 1536, True, True),  # 1.45x / 1.46x
    (4096, 4096, 7168, True, True),  # 1.39x / 1.40x
    (4096, 7168, 16384, True, True),  # 1.26x / 1.33x
    (8192, 8192, 8192, True, True),  # 1.31x / 1.37x
    (128, 7168, 16384, False, False),  # a decode size
    (255, 7168, 2048, False, False),
    (256, 7168, 2048, True, False),  # 112 tiles: 1.23x kernel-only, 1.01x eager: under the FLOP bar
    (256, 2112, 7168, False, False),  # 34 tiles: 0.59x
    (256, 4096, 7168, False, False),  # 64 tiles: 0.85x
    (384, 2112, 7168, False, False),  # off-set, 51 tiles: 0.91x
    (1024, 576, 7168, False, False),  # off-set, 40 tiles: 0.80x
    (300, 4096, 8192, True, True),  # off-set: 1.27x / 1.29x
    (1024, 512, 512, False, False),  # 8 x 4 tiles x 4 K blocks: under 4 steps per SM
    (16384, 4096, 2048, True, True),
]


@pytest.mark.parametrize("m, n, k, kernel_faster, automatic", RULE_CASES)
def test_dense_fp8_rules(m, n, k, kernel_faster, automatic):
    assert gluon.kernel_faster_dense_fp8(m, n, k, 132) == kernel_faster
    assert gluon.prefers_dense_fp8(m, n, k, 132, ws=False) == automatic


def test_gluon_rule_is_registered_for_the_dense_fp8_gemms():
    """The gluon backend's modules register its automatic-choice rule as they load; the registry imports none."""
    tilegemm.list_ops()  # loads the backends
    for layout in ("nt", "nn", "tn", "tt"):
        assert gluon.dense_fp8_rule in choice._RULES[f"fp8_fp4_gemm_{layout}"]
        assert gluon.dense_bf16_rule in choice._RULES[f"bf16_gemm_{layout}"]


def test_gluon_rules_are_the_rule_functions():
    """Every rule the gluon heuristics register is one of their ``*_rule`` functions (a helper defined between a
    ``register_rule`` decorator and its rule would be registered in its place), each for the ops it names."""
    tilegemm.list_ops()
    want = {
        "fp8_fp4_gemm_nt": gluon.dense_fp8_rule,
        "bf16_gemm_nt": gluon.dense_bf16_rule,
        "m_grouped_fp8_fp4_gemm_nt_contiguous": gluon.m_grouped_fp8_rule,
        "k_grouped_fp8_gemm_tn_contiguous": gluon.k_grouped_fp8_rule,
        "k_grouped_bf16_gemm_tn_contiguous": gluon.k_grouped_bf16_rule,
        "fp8_moe_experts": gluon.fp8_moe_experts_rule,
    }
    for op, rule in want.items():
        assert rule in choice._RULES[op], op
    registered = {r for rules in choice._RULES.values() for r in rules if r.__module__ == gluon.__name__}
    assert all(r.__name__.endswith("_rule") for r in registered), sorted(r.__name__ for r in registered)


def test_chooser_keeps_default_without_gluon(monkeypatch):
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: "no CUDA GPU")
    qa = tilegemm.per_token_cast_to_fp8(torch.randn(4096, 256))
    qb = tilegemm.per_block_cast_to_fp8(torch.randn(4096, 256))
    d = torch.empty(4096, 4096, dtype=torch.bfloat16)
    derived = {"a": qa, "b": qb, "d": d}
    assert choice.automatic("fp8_fp4_gemm_nt", derived) == selector.default_backend()
    a, b = torch.empty(512, 7168, dtype=torch.bfloat16), torch.empty(2112, 7168, dtype=torch.bfloat16)
    derived = {"a": a, "b": b, "d": torch.empty(512, 2112, dtype=torch.bfloat16), "c": None, "alpha": 1.0, "beta": 1.0}
    assert choice.automatic("bf16_gemm_nt", derived) == selector.default_backend()


@pytest.mark.parametrize("out_bytes, stages", [(2, 5), (4, 4)])
def test_ring_depth_fits_shared_memory(out_bytes, stages):
    cfg = gluon.dense_fp8_config(4096, 4096, 4096, 132, out_bytes)
    assert cfg.stages == stages
    assert gluon.max_stages(cfg.block_n, out_bytes) == stages


class _CudaLike:
    """Stands in for a CUDA tensor where only ``is_cuda`` is read."""

    is_cuda = True


def test_reference_on_gpu_warns_once(monkeypatch):
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "cuda.tile not importable (ImportError)")
    monkeypatch.setattr(choice, "_warned_reference_on_gpu", False)
    monkeypatch.setattr(choice, "_on_cuda", lambda value: isinstance(value, _CudaLike))
    with pytest.warns(choice.ReferenceOnGpuWarning, match=r"cuda\.tile not importable.*tilegemm\[cutile\]"):
        assert choice.automatic("m_grouped_bf16_gemm_nt_masked", {"a": _CudaLike()}) == "pytorch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choice.automatic("m_grouped_bf16_gemm_nt_masked", {"a": _CudaLike()}) == "pytorch"  # once a process


def test_reference_on_cpu_does_not_warn(monkeypatch):
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no CUDA GPU")
    monkeypatch.setattr(choice, "_warned_reference_on_gpu", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choice.automatic("m_grouped_bf16_gemm_nt_masked", {"a": torch.ones(2)}) == "pytorch"


def test_reference_on_gpu_warning_names_the_callers_line(monkeypatch):
    """The automatic choice's warning points at the line that called the op, not into tilegemm."""
    monkeypatch.setattr(selector, "cutile_unavailable_reason", lambda: "no CUDA GPU")
    monkeypatch.setattr(choice, "_warned_reference_on_gpu", False)
    monkeypatch.setattr(choice, "_on_cuda", lambda value: isinstance(value, torch.Tensor))
    monkeypatch.delenv("TILEGEMM_BACKEND", raising=False)
    a, b = torch.randn(4, 128).bfloat16(), torch.randn(8, 128).bfloat16()
    with pytest.warns(choice.ReferenceOnGpuWarning) as caught:
        tilegemm.bf16_gemm_nt(a, b, torch.empty(4, 8))
    assert caught[0].filename == __file__


@pytest.mark.parametrize(
    "c, alpha, recipe, chosen",
    [(None, 1.0, (1, 128, 128), "gluon"), ("c", 1.0, (1, 128, 128), None), (None, 0.5, (1, 128, 128), None),
     (None, 1.0, (1, 1, 128), None)],
)  # fmt: skip
def test_rule_judges_the_kernel_the_call_runs(monkeypatch, c, alpha, recipe, chosen):
    """256x7168x2048 (15 GFLOP, 112 tiles): the ws kernel's rule takes it; a call that runs ``fp8_gemm_kernel`` (an
    addend, alpha != 1, per-row B scales) is under that kernel's FLOP bar and stays on cutile."""
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: None)
    monkeypatch.setattr(gluon.operands, "tma_ready", lambda x: True)
    monkeypatch.setattr(gluon.config, "get_num_sms", lambda: 132)
    d = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    a, b = (torch.empty(256, 2048), None), (torch.empty(7168, 2048), None)
    arguments = dict(a=a, b=b, d=d, c=None if c is None else d, alpha=alpha, beta=1.0, recipe=recipe)
    assert gluon.dense_fp8_rule(arguments) == chosen


# The BF16 ws kernel: (M, N, K, the design picked on 132 SMs, gluon the automatic choice?), with what that design
# measured against the cutile kernels, kernel-only (H200, benchmarks/results/gluon/bf16_ws_h200.json).
BF16_RULE_CASES = [
    (256, 4096, 7168, "bf16_64x128_w4", True),  # 128 tiles in one round: 1.18x
    (512, 2112, 7168, "bf16_128x64", True),  # 132 tiles in one round: 1.44x
    (384, 1536, 2048, "bf16_64x128_w4", True),  # 72 tiles: 1.33x
    (512, 4096, 7168, "bf16_128x128", True),  # 128 tiles: 1.02x
    (1024, 4096, 7168, "bf16_128x256_wg2", True),  # 128 tiles in one round: 1.03x (128x128, two rounds: 1.02x)
    (512, 7168, 16384, "bf16_128x256_wg2", True),  # 112 tiles in one round: 1.08x (128x128, two rounds: 1.02x)
    (160, 7168, 2048, "bf16_128x128", True),  # 0.92x: the rule's one miss at K >= 1024 (64x128: 1.02x)
    (2048, 1536, 2048, "bf16_64x128_w4", True),  # K 2048: three rounds of 64x128 tiles 20.8 us, one of 128x256 23.7
    (256, 2048, 768, "bf16_64x128_w4", False),  # K 768: 0.91x; on one warpgroup 0.94x (bf16_short_k_h200.json)
    (1024, 2048, 768, "bf16_128x128", False),  # 0.97x
    (512, 2048, 768, "bf16_64x128_w4", True),  # K 768, 64x128 tiles from 320 rows: 1.19x
    (320, 1536, 768, "bf16_64x128_w4", True),  # 1.26x
    (448, 7168, 512, "bf16_64x128_w4", True),  # 1.12x
    (640, 4096, 768, "bf16_64x128_w4", True),  # 1.11x
    (512, 4096, 768, "bf16_128x128", False),  # K 768, 128-row tiles: 0.98x
    (320, 2048, 384, "bf16_64x128_w4", False),  # under DENSE_BF16_WS_SHALLOW_K_LEAST_K: not measured
    (128, 4096, 7168, "bf16_64x128_w4_sk2", True),  # 128 runs: 1.11x (bf16_few_rows_h200.json)
    (128, 7168, 16384, "bf16_64x128_w4", True),  # 112 tiles: 1.34x
    (128, 2560, 7168, "bf16_64x128_w4_sk2", True),  # 80 runs: 1.26x
    (96, 4096, 7168, "bf16_64x128_w4_sk2", True),  # 1.17x
    (128, 2112, 7168, "bf16_64x128_w4_sk2", False),  # 68 runs: 0.96x
    (128, 3072, 4096, "bf16_64x128_w4", False),  # 48 tiles: 0.98x
    (128, 1024, 16384, "bf16_64x128_w4_sk2", False),  # 32 runs: 1.14x, below the runs the rule asks for
    (64, 7168, 16384, "bf16_64x128_w4_sk2", False),  # under DENSE_BF16_WS_FEW_ROWS_MIN_M: 1.00x
    (128, 2048, 768, "bf16_64x128_w4", False),  # K 768 under 129 rows: not measured
    (2048, 4096, 7168, "bf16_128x256_wg2", True),
    (8192, 8192, 8192, "bf16_128x256_wg2", True),
    (8193, 4096, 7168, "bf16_128x256_wg2", False),  # past the set's rows
    (4096, 2048, 768, "bf16_128x256_wg2", False),  # K 768
]


def test_short_k_bf16_tiles_are_the_dense_tiles():
    """The short-K costs weigh the same designs, tiles and preference order; only the half tiles cost less."""
    short, full = gluon.DENSE_BF16_WS_SHORT_K_TILES, gluon.DENSE_BF16_WS_TILES
    assert [t[:3] for t in short] == [t[:3] for t in full]
    assert all(s[3] == f[3] or (s[3] < f[3] and f[1] * f[2] == 128 * 64) for s, f in zip(short, full))


@pytest.mark.parametrize("m, n, k, design, automatic", BF16_RULE_CASES)
def test_dense_bf16_rule(m, n, k, design, automatic):
    assert gluon.dense_bf16_ws_design(m, n, k, 132) == design
    assert gluon.prefers_dense_bf16(m, n, k, 132) == automatic


# The split tail (ops/gluon/split_tail.py) on 132 SMs: (kernel, M, N, K, the design picked), with what was measured on
# an H200 where it was.
SPLIT_TAIL_CASES = [
    ("bf16", 2048, 2112, 7168, "bf16_128x128_sk"),  # 272 tiles: two rounds and 8; 115.6 -> 89.9 us
    ("fp8", 2048, 2112, 7168, "d_128x128_ov8_sk"),  # 66.5 -> 55.8 us
    ("fp8", 4096, 2112, 7168, "d_128x128_ov8_sk"),  # 544 tiles: four rounds and 16; 1.11x
    ("fp8", 8192, 8192, 8192, "d_128x128_ov8_sk"),  # 4096 tiles: 31 rounds and 4; 1.01-1.04x
    ("bf16", 256, 4096, 7168, "bf16_64x128_w4"),  # 128 tiles: one short round, no whole one before it
    ("bf16", 8192, 8192, 8192, "bf16_128x256_wg2"),  # 128x256 tiles are not split
    ("fp8", 4096, 7168, 7168, "g_128x128_ov4"),  # 1792 tiles: a tail of 76, over 132 // 5
    ("fp8", 2048, 2112, 1024, "d_128x128_ov8"),  # 8 K blocks: a run's fixed cost exceeds what the split saves
    ("bf16", 2048, 2112, 1024, "bf16_128x64"),  # 16 K blocks of 64: four whole rounds of 128x64 tiles at short K
    ("fp8", 4224, 4096, 7168, "g_128x128_ov4"),  # 33 x 32 = 1056 tiles: eight full rounds, no tail
    ("bf16", 2056, 2112, 7168, "bf16_128x128_sk"),  # 289 tiles: two rounds and 25; 1.08x
    ("fp8", 2056, 2112, 7168, "d_128x128_ov8_sk"),  # 1.05x
    ("fp8", 4104, 2112, 7168, "g_128x128_ov4"),  # 561 tiles: four rounds and 33, over 132 // 5; split 0.95x
]


@pytest.mark.parametrize("kind, m, n, k, design", SPLIT_TAIL_CASES)
def test_split_tail_refines_the_tiling(kind, m, n, k, design):
    """The split design where a short last round (at most SMs / 5 tiles, after a whole round) costs more than its
    split (a run: 1/4 of a tile plus its fixed K blocks); the tile and the tile count are the unsplit tiling's. An
    unsplit FP8 tiling of four rounds or more runs its 128x128 tiles in the long design (each MMA warpgroup a
    partition)."""
    if kind == "fp8":
        got, count = gluon.dense_fp8_ws_tiling(m, n, k, 132)
        tiles = tuple(t for t in gluon.DENSE_FP8_WS_TILES if t[0] != gluon.DENSE_FP8_WS_64X64_DESIGN or k >= 4096)
        split = gluon.DENSE_FP8_WS_TAIL_SPLIT
    else:
        got, count = gluon.dense_bf16_ws_design(m, n, k, 132), None
        tiles, split = gluon.dense_bf16_ws_tiles(k), gluon.DENSE_BF16_WS_TAIL_SPLIT
    assert got == design
    if got == gluon.DENSE_FP8_WS_LONG_DESIGN:
        assert count >= gluon.DENSE_FP8_WS_WG_PARTS_MIN_ROUNDS * 132
        got = gluon.DENSE_FP8_WS_DESIGN  # the unsplit tiling it runs
    unsplit, unsplit_count = tiling.cheapest_tiling(m, n, 132, tiles)
    assert got in (unsplit, split.designs.get(unsplit))
    assert count in (None, unsplit_count)
    assert tiling.cheapest_tiling(m, n, 132, tiles, k, split) == (got, unsplit_count)


ROUND_SPLIT_CASES = [
    (256, 2112, 7168, "bf16_128x64_sk2", 66),  # 66 128x64 tiles 2 ways over 132 SMs; 20.9 -> 16.9 us
    (512, 1024, 7168, "bf16_64x128_w4_sk2", 64),  # 64 tiles: one short round
    (256, 4096, 7168, "bf16_64x128_w4", 128),  # 128 tiles, nearly a whole round: nothing to split
    (256, 1536, 2048, "bf16_64x128_w4", 48),  # 32 K blocks of 64: a run's fixed cost exceeds what the split saves
    (2048, 2112, 7168, "bf16_128x128_sk", 272),  # whole rounds before the tail: the tail split
    (200, 2112, 7168, "bf16_128x64_sk2", 66),  # a partial row tile, moved up to end at M: 17.7 us against 21.1
]


def test_bf16_fp32_output_is_not_split_into_a_design_that_spills_there(monkeypatch):
    """Under a triton from :data:`gluon.TRITON_SPILLS_BF16_FP32_FROM` a dense BF16 call with fp32 output never runs
    a design of :data:`gluon.BF16_FP32_SPILLING_DESIGNS` (its tail stays unsplit: the same 128x128 tile); with bf16
    output, and under earlier tritons with either, the same calls split their tail into it."""
    shapes = [(2048, 2112, 7168), (2056, 2112, 7168)]  # two whole rounds of 128x128 tiles and a short tail
    for version, fp32_splits in (((3, 6), True), ((3, 8), True), ((3, 9), False), ((3, 10), False)):
        monkeypatch.setattr(selector, "triton_version", lambda version=version: version)
        for shape in shapes:
            assert gluon.dense_bf16_ws_design(*shape, 132) == "bf16_128x128_sk", (version, shape)
            want = "bf16_128x128_sk" if fp32_splits else "bf16_128x128"
            assert gluon.dense_bf16_ws_design(*shape, 132, out_bytes=4) == want, (version, shape)
    assert gluon.BF16_FP32_SPILLING_DESIGNS <= set(gluon.DENSE_BF16_WS_TAIL_SPLIT.designs.values())


@pytest.mark.parametrize("m, n, k, design, tiles", ROUND_SPLIT_CASES)
def test_round_split_takes_the_tiling_whose_single_round_splits(m, n, k, design, tiles):
    """A single short round (no whole one) of a half tile's tiling is split 2 ways where a run (half a tile plus
    its fixed K blocks) costs less than the cheapest unsplit round: the tile may change to the one whose tiles fill
    the SMs when split (66 128x64 tiles rather than 68 64x128 ones)."""
    assert gluon.dense_bf16_ws_design(m, n, k, 132) == design
    got = tiling.cheapest_tiling(m, n, 132, gluon.dense_bf16_ws_tiles(k), k, gluon.DENSE_BF16_WS_SPLITS)
    assert got == (design, tiles)


def test_split_tail_rounds():
    """Two rounds and 8 tiles of 56 K blocks of 128 (FP8) split 4 ways: 2 + 1/4 + 24/56 rounds, against 3."""
    split = gluon.DENSE_FP8_WS_TAIL_SPLIT
    assert tiling.split_tail_rounds(272, 7168, 132, split) == pytest.approx(2 + 0.25 + 24 / 56)
    assert tiling.split_tail_rounds(264, 7168, 132, split) is None  # no tail
    assert tiling.split_tail_rounds(132 + 27, 7168, 132, split) is None  # 27 > 132 // 5
    assert tiling.split_tail_rounds(132 + 26, 7168, 132, split) is not None
    assert tiling.split_tail_rounds(16, 7168, 132, split) is None  # no whole round
    single = gluon.DENSE_BF16_WS_ROUND_SPLIT
    assert tiling.split_tail_rounds(66, 7168, 132, single) == pytest.approx(0.5 + 40 / 112)
    assert tiling.split_tail_rounds(67, 7168, 132, single) is None  # 134 runs: more than one round
    assert tiling.split_tail_rounds(132 + 8, 7168, 132, single) is None  # a whole round: the tail split's case


#: (M, N, K, design, output tiles, the ws kernel's call): FP8 one-warpgroup tilings whose single short round is
#: split (H200, kernel-only, against cutile's split-K plans: benchmarks/results/dense-fp8-h200/one_wg_split_h200.json)
FP8_ROUND_SPLIT_CASES = [
    (256, 1024, 16384, "i_64x128_ov4_sk4", 32, True),  # 32 64x128 tiles 4 ways: 1.99x
    (128, 2048, 7168, "i_64x64_ov2_sk2", 64, True),  # 64 64x64 tiles 2 ways: 1.37x; 4 ways of 64x128: 266 against 271
    (128, 2112, 7168, "i_64x64_ov2_sk2", 66, True),  # 34 64x128 tiles: 136 runs, more than a round
    (128, 2048, 16384, "i_64x128_ov4_sk4", 32, True),  # K 16384: the 4-way split of 64x128 (438) over 64x64's 2 (408)
    (128, 4096, 7168, "i_64x64_ov2", 128, True),  # 128 64x64 tiles, nearly a round: nothing to split
    (128, 2048, 4096, "i_64x64_ov2", 64, False),  # 32 K blocks: a run's fixed cost exceeds what the split saves; cutile
]


@pytest.mark.parametrize("m, n, k, design, tiles, ws", FP8_ROUND_SPLIT_CASES)
def test_fp8_round_split_takes_the_one_warpgroup_tiling_whose_single_round_splits(m, n, k, design, tiles, ws):
    """A single short round of 64x128 tiles splits 4 ways, of 64x64 tiles 2 ways, where a run (a quarter or half
    a tile plus its fixed K blocks) costs less than the cheapest unsplit round; the ws kernel then takes the call
    from 128 rows (its runs fill the SMs as 128 64x64 tiles do); an unsplit round of 64 tiles stays on cutile."""
    assert gluon.dense_fp8_ws_tiling(m, n, k, 132) == (design, tiles)
    assert gluon.ws_kernel_faster(m, n, k, 132) == ws


@pytest.mark.parametrize("kind", ["fp8", "fp8 round 4", "fp8 round 2", "bf16", "bf16 round"])
def test_split_designs_are_variants_of_the_same_tile(kind):
    """Each split design is its unsplit design's config with the rule's split count, for a kernel that the split
    tail's rule (:func:`split_tail.tail_splits`) gives that many runs."""
    if kind.startswith("fp8"):
        module = pytest.importorskip("tilegemm.ops.gluon.fp8_gemm_ws")
        round_4, round_2 = gluon.DENSE_FP8_WS_ROUND_SPLITS
        split = {"fp8": gluon.DENSE_FP8_WS_TAIL_SPLIT, "fp8 round 4": round_4, "fp8 round 2": round_2}[kind]
    else:
        module = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
        split = gluon.DENSE_BF16_WS_ROUND_SPLIT if kind == "bf16 round" else gluon.DENSE_BF16_WS_TAIL_SPLIT
    block_k = module.BLOCK_K
    assert split.block_k == block_k
    for unsplit, design in split.designs.items():
        cfg = module.VARIANTS[design]
        assert cfg.splits == split.splits and cfg._replace(splits=1) == module.VARIANTS[unsplit]
    tail = 132 // tiling.SPLIT_TAIL_MAX_TAIL_SHARE
    split_tail = pytest.importorskip("tilegemm.ops.gluon.split_tail")
    assert split_tail.tail_tiles(2 * 132 + tail, 132, split.splits) == tail


def test_dense_bf16_designs_are_bf16_variants():
    """Every design the BF16 rule may pick names a ``bf16_gemm_ws.VARIANTS`` entry of the tile it is costed as."""
    bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
    for design, rows, cols, _ in gluon.DENSE_BF16_WS_TILES:
        cfg = bw.VARIANTS[design]
        assert (cfg.block_m, cfg.block_n) == (rows, cols)


@pytest.mark.parametrize(
    "layout, c, alpha, chosen",
    [("nt", None, 1.0, "gluon"), ("nt", "c", 1.0, None), ("nt", None, 2.0, None), ("nn", None, 1.0, None),
     ("tn", None, 1.0, None)],
)  # fmt: skip
def test_bf16_rule_claims_only_what_the_kernel_computes_as_given(monkeypatch, layout, c, alpha, chosen):
    """512x2112x7168: gluon for K-major operands without an addend and with alpha 1; an addend, another alpha, or
    an operand in MN-major storage (the kernel makes no copies) stays on cutile."""
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: None)
    monkeypatch.setattr(gluon.operands, "tma_ready", lambda x: True)
    m, n, k = 512, 2112, 7168
    a = torch.empty(k, m).t() if layout[0] == "t" else torch.empty(m, k)
    b = torch.empty(k, n).t() if layout[1] == "n" else torch.empty(n, k)
    d = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    arguments = dict(a=a, b=b, d=d, c=None if c is None else d, alpha=alpha, beta=1.0)
    assert gluon.dense_bf16_rule(arguments) == chosen


# k-grouped BF16: (G, M, N, per-group K, the design on 132 SMs, gluon the automatic choice?)
K_GROUPED_BF16_RULE_CASES = [
    (8, 4096, 7168, [4096] * 8, "bf16_128x128_wg2", True),  # the benchmark set's shapes: 1792 tiles
    (4, 7168, 2048, [8192, 7936, 8448, 8192], "bf16_128x128_wg2", True),
    (16, 4096, 7168, [2048] * 15 + [0], "bf16_128x128_wg2", True),  # an empty group
    (8, 4096, 7168, [4096] * 7 + [4032], "bf16_128x128_wg2", True),  # K a multiple of 64, not of 128
    (8, 4096, 7168, [4096] * 7 + [4000], "bf16_128x128_wg2", False),  # a group's K off the 64-deep blocks
    (4, 4000, 7168, [4096] * 4, "bf16_128x128_wg2", False),  # M off the 128-row tiles
    (2, 128, 256, [256, 256], "bf16_64x128_w4", False),  # 4 tiles of 128x128: too few for the SMs
    (1, 1024, 1024, [4096], "bf16_64x128_w4", False),  # 64 tiles of 128x128 (as 128 64x128 ones: one round)
]


@pytest.mark.parametrize("groups, m, n, ks, design, automatic", K_GROUPED_BF16_RULE_CASES)
def test_k_grouped_bf16_rule(groups, m, n, ks, design, automatic):
    assert gluon.k_grouped_bf16_ws_design(groups, m, n, 132) == design
    assert gluon.prefers_k_grouped_bf16(groups, m, n, ks, 132) == automatic


def test_k_grouped_bf16_designs_are_at_most_128_wide_variants():
    """The k-grouped BF16 designs name ``bf16_gemm_ws.VARIANTS`` entries of their costed tiles, none wider than 128
    (the k-grouped form's limit), 128x128 first; the 128-row ones with each MMA warpgroup a partition of its own."""
    bw = pytest.importorskip("tilegemm.ops.gluon.bf16_gemm_ws")
    assert gluon.K_GROUPED_BF16_WS_TILES[0][0] == "bf16_128x128_wg2"
    for design, rows, cols, _ in gluon.K_GROUPED_BF16_WS_TILES:
        cfg = bw.VARIANTS[design]
        assert (cfg.block_m, cfg.block_n) == (rows, cols) and cols <= 128
        assert cfg.wg_parts == (2 if rows == 128 else 1) and cfg.splits == 1


@pytest.mark.parametrize(
    "a_major, contiguous_d, chosen", [("mn", True, "gluon"), ("k", True, None), ("mn", False, None)]
)
def test_k_grouped_bf16_rule_claims_what_the_kernel_reads_in_place(monkeypatch, a_major, contiguous_d, chosen):
    """8x4096x7168 over K 4096 each: gluon for the MN-major [K_sum, M] operands the op takes and a contiguous D; an
    operand stored the other way (the kernel makes no copies) or a strided D stays on cutile."""
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: None)
    monkeypatch.setattr(gluon.operands, "tma_ready", lambda x: True)
    monkeypatch.setattr(gluon.config, "get_num_sms", lambda: 132)
    g, m, n, ks = 8, 4096, 7168, [4096] * 8
    a = torch.empty(sum(ks), m) if a_major == "mn" else torch.empty(m, sum(ks)).t()
    b = torch.empty(sum(ks), n)
    d = types.SimpleNamespace(is_cuda=True, dtype=torch.float32, shape=(g, m, n), is_contiguous=lambda: contiguous_d)
    assert gluon.k_grouped_bf16_rule(dict(a=a, b=b, d=d, ks_cpu=ks)) == chosen


def test_dense_bf16_registered_on_gluon():
    """The gluon backend implements the four BF16 layouts (with their hot-lane replays)."""
    tilegemm.list_ops()
    gemm = pytest.importorskip("tilegemm.ops.gluon.gemm")
    for layout in ("nt", "nn", "tn", "tt"):
        assert registry.get_impl(f"bf16_gemm_{layout}", "gluon") is gemm.bf16_gemm
