"""CPU tests of the cutile host layer: the config path (``heuristics``) and the launch layer (``launch``)."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

ct = pytest.importorskip("cuda.tile")

from tilegemm.backend import hot_lane, registry  # noqa: E402
from tilegemm.backend.registry import Unsupported  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.heuristics import report  # noqa: E402
from tilegemm.heuristics.cutile import Kind, Problem  # noqa: E402
from tilegemm.ops import plans  # noqa: E402
from tilegemm.ops.cutile import launch  # noqa: E402


def test_choose_routes_each_family():
    dense = Problem("dense", "fp8", 4096, 4096, 7168, 132)
    assert heuristics.choose(dense) == heuristics.FP8_LARGE_K
    assert isinstance(heuristics.choose(Problem("dense", "bf16", 16, 4096, 7168, 132)), heuristics.DecodeConfig)
    # BF16 above 128 rows with a short K: the tile kernel (the narrow 128x128 tiles where they fill the SMs in one
    # wave); with a long K, and FP8, the decode kernel.
    assert heuristics.choose(Problem("dense", "bf16", 256, 24576, 1536, 132)) == heuristics.BF16_CONFIGS[0]
    assert heuristics.choose(Problem("dense", "bf16", 256, 7168, 2048, 132)) == heuristics.NARROW_BF16_M128_W128
    assert isinstance(heuristics.choose(Problem("dense", "bf16", 256, 2112, 7168, 132)), heuristics.DecodeConfig)
    assert isinstance(heuristics.choose(Problem("dense", "fp8", 32, 7168, 2048, 132)), heuristics.DecodeConfig)
    assert heuristics.choose(Problem("dense", "fp8", 256, 7168, 2048, 132)) == heuristics.NARROW_FP8_W128
    # ... unless N is small: the weight rows alone do not fill the SMs, the tile kernel measured 5x slower there.
    assert isinstance(heuristics.choose(Problem("dense", "bf16", 256, 2048, 768, 132)), heuristics.DecodeConfig)
    masked = Problem("grouped", "bf16", 8 * 256, 4096, 7168, 132, groups=8, kind=Kind.MASKED, expected_m=32)
    assert heuristics.choose(masked) == heuristics.GROUPED_BF16_SMALL_M
    k_grouped = Problem("grouped", "bf16", 4096, 4096, 8192, 132, groups=4, kind=Kind.K, has_c=True)
    assert heuristics.choose(k_grouped) == heuristics.GROUPED_BF16_K_WITH_C

    def moe(tokens: int, top_k: int = 8, experts: int = 256) -> object:
        return heuristics.choose(Problem("moe", "bf16", tokens * top_k, 7168, 2048, 132, groups=experts))

    # DeepSeek-V3: per slot up to 8 tokens (64 slots), expert blocks from 16 tokens up to 16 rows per expert on
    # average, then the sorted path: 64-row tiles up to 64 rows per expert, 128-row tiles above.
    assert isinstance(moe(8), heuristics.MoESlotsConfig) and moe(8).combine_bn == 256
    assert isinstance(moe(16), heuristics.MoEBlocksConfig) and moe(16).bt == 8 and moe(16).combine_bn == 256
    assert moe(256).bt == 16 and moe(512).bt == 32
    assert moe(513).bm == 64 and moe(2048).bm == 64
    assert moe(2049).bm == 128 and moe(8192).bm == 128
    # Mixtral (8 experts, top-2): one slot per expert takes the per-slot path, two the block path.
    assert isinstance(moe(4, 2, 8), heuristics.MoESlotsConfig) and isinstance(moe(8, 2, 8), heuristics.MoEBlocksConfig)
    assert isinstance(moe(64, 2, 8), heuristics.MoEBlocksConfig)  # 16 rows per expert
    assert isinstance(moe(65, 2, 8), heuristics.MoEConfig)  # above 16 rows per expert: the sorted path
    with pytest.raises(ValueError, match="family"):
        heuristics.choose(Problem("conv", "bf16", 1, 1, 1, 1))


def test_narrow_config_rule():
    """Narrow tiles from 17 rows. FP8: 64x64 tiles two K blocks at a time while SMs / 3 <= tiles <= 2 SMs (above 32
    rows), else 128 weight rows where those fill 3/4 of the SMs, else 16 rows up to K = 2048, and at 17-32 rows only
    up to K = 2048 and not where 32-row weight tiles would fill the SMs. BF16: 32 rows up to 128 rows, at one CTA
    per SM while they fit one wave (at 17-32 rows with K > 2048 only if they fill 3/4 of the SMs), else at two up to
    1.5 waves (K <= 2048 at 17-32 rows); 128x128 tiles above 128 rows while they fill 3/4 of the SMs in one wave.
    Never with ``c`` or a forced swap-AB variant."""

    def pick(dtype, m, n, k, **kw):
        return heuristics.narrow_config(Problem("dense", dtype, m, n, k, 132, **kw))

    assert pick("fp8", 16, 1536, 2048) is None and pick("fp8", 257, 4096, 7168) is None
    assert pick("fp8", 32, 4096, 7168) is None  # 32 rows, K > 2048
    assert pick("fp8", 32, 7168, 2048) is None  # 224 tiles of 32 weight rows, at 32 rows: swap-AB
    assert pick("fp8", 17, 1536, 2048) == heuristics.NARROW_FP8_W16
    assert pick("fp8", 32, 32768, 512) == heuristics.NARROW_FP8_W128
    deep = heuristics.NARROW_BF16_W32_DEEP
    assert pick("bf16", 17, 1536, 2048) == deep and pick("bf16", 16, 1536, 2048) is None
    assert pick("bf16", 32, 4096, 7168) == deep  # 128 tiles of 64x32: one wave that fills 3/4 of the SMs
    assert pick("bf16", 32, 2112, 7168) is None  # 66 tiles, 32 rows, K > 2048: swap-AB
    assert pick("bf16", 33, 2112, 7168) == deep
    assert pick("bf16", 128, 2112, 7168) == deep and pick("bf16", 129, 2112, 7168) is None  # 132 tiles; 129 rows
    assert pick("bf16", 128, 4096, 7168) is None  # 256 tiles: more than one wave
    assert pick("bf16", 32, 2048, 768) == deep and pick("bf16", 64, 2048, 2048) == deep
    pair = heuristics.NARROW_FP8_W64_PAIR
    assert pick("fp8", 33, 4096, 7168) == pair  # 64 tiles of 64x64: within [SMs / 3, 2 SMs]
    assert pick("fp8", 128, 7168, 16384) == pair and pick("fp8", 256, 4096, 7168) == pair  # 224, 256 tiles
    assert pick("fp8", 64, 2112, 7168) is None  # 33 pair tiles: too few; 16 rows only up to K = 2048
    assert pick("fp8", 64, 2112, 2048) == heuristics.NARROW_FP8_W16
    assert pick("fp8", 256, 7168, 16384) == heuristics.NARROW_FP8_W128  # 448 pair tiles; 224 of 64x128
    assert pick("fp8", 64, 24576, 1536) == heuristics.NARROW_FP8_W128  # 384 pair tiles
    assert pick("fp8", 64, 1536, 2048) == heuristics.NARROW_FP8_W16
    assert pick("bf16", 64, 2112, 7168) == deep  # 66 tiles
    assert pick("bf16", 64, 4800, 2048) == heuristics.NARROW_BF16_W32  # 150 tiles: above one wave, within 1.5
    assert pick("bf16", 64, 7168, 2048) is None  # 224 tiles: more than 1.5 waves
    assert pick("bf16", 129, 1536, 2048) is None
    assert pick("bf16", 256, 7168, 16384) == heuristics.NARROW_BF16_M128_W128  # 112 tiles of 128x128
    assert pick("bf16", 129, 7168, 2048) == heuristics.NARROW_BF16_M128_W128
    assert pick("bf16", 256, 4096, 7168) is None  # 64 tiles: too few
    assert pick("bf16", 256, 24576, 1536) is None  # 384 tiles: more than one wave
    assert pick("fp8", 64, 4096, 7168, has_c=True) is None


def test_narrow_config_yields_to_a_forced_swap_variant(monkeypatch):
    monkeypatch.setenv(heuristics.DECODE_VARIANT_ENV, "w64k128")
    p = heuristics.problem("dense", "fp8", 64, 4096, 7168, 132)  # the variant read once, into the problem
    assert p.variant == "w64k128"
    assert heuristics.narrow_config(p) is None and heuristics.choose(p) == heuristics.DECODE_W64_K128
    monkeypatch.setenv(heuristics.DECODE_VARIANT_ENV, "w64k999")
    with pytest.raises(ValueError, match="TILEGEMM_DECODE_VARIANT"):
        heuristics.choose(heuristics.problem("dense", "fp8", 8, 4096, 7168, 132))
    monkeypatch.delenv(heuristics.DECODE_VARIANT_ENV)
    assert heuristics.choose(p) == heuristics.DECODE_W64_K128  # a problem keeps the variant it was made with


def test_every_config_names_its_path():
    """Host code dispatches on ``cfg.path``, never on a config's type: each family's configs name theirs."""
    paths = {
        "narrow": heuristics.narrow_config(Problem("dense", "fp8", 256, 7168, 2048, 132)),
        "decode": heuristics.choose(Problem("dense", "bf16", 16, 4096, 7168, 132)),
        "tile": heuristics.choose(Problem("dense", "fp8", 4096, 4096, 7168, 132)),
        "slots": heuristics.choose(Problem("moe", "bf16", 8, 7168, 2048, 132, groups=256)),
        "blocks": heuristics.choose(Problem("moe", "bf16", 128, 7168, 2048, 132, groups=256)),
        "sorted": heuristics.choose(Problem("moe", "bf16", 65536, 7168, 2048, 132, groups=256)),
    }
    assert {path: cfg.path for path, cfg in paths.items()} == {path: path for path in paths}
    for rules in (heuristics.dense.TILE_RULES, heuristics.grouped.RULES):
        assert rules[-1].applies(Problem("dense", "bf16", 1, 1, 1, 1)) and all(rule.why for rule in rules)


def test_decode_activation_tile():
    """Powers of two from 16 to 128 covering M; FP8 below K = 4096 skips 32 (its 32-row kernels measured slower
    than 64 there, faster at K = 7168)."""
    cfg = heuristics.decode_config()
    ms = (1, 16, 17, 32, 33, 64, 65, 256)
    assert [cfg.tile_m(m) for m in ms] == [16, 16, 32, 32, 64, 64, 128, 128]
    assert [cfg.tile_m(m, "fp8") for m in ms] == [16, 16, 64, 64, 64, 64, 128, 128]
    assert [cfg.tile_m(m, "fp8", 7168) for m in ms] == [16, 16, 32, 32, 64, 64, 128, 128]
    plan = heuristics.decode_plan(Problem("dense", "fp8", 32, 7168, 2048, 132), cfg)
    assert plan.bm == 64 and plan.num_m == 1
    assert heuristics.decode_plan(Problem("dense", "fp8", 32, 2112, 7168, 132), cfg).bm == 32


def test_decode_plan_occupancy():
    """The CTAs-per-SM hint: 4 up to 16 activation rows, 3 at 32, 2 above; an unsplit BF16 plan of at most 16 rows
    whose tiles fit one wave at 2 per SM takes 2 (more load stages), split or wider plans keep 4."""
    cfg = heuristics.decode_config()

    def plan(dtype, m, n, k):
        return heuristics.decode_plan(Problem("dense", dtype, m, n, k, 132), cfg)

    assert [cfg.occupancy_for(bm) for bm in (16, 32, 64, 128)] == [4, 3, 2, 2]
    one_wave = plan("bf16", 8, 7168, 16384)  # 112 tiles, unsplit
    assert (one_wave.splits, one_wave.occupancy) == (1, heuristics.DECODE_BF16_UNSPLIT_OCCUPANCY)
    assert "occupancy=2" in one_wave.summary
    assert plan("bf16", 1, 24576, 1536).occupancy == 4  # 384 tiles: more than one wave at 2 per SM
    split = plan("bf16", 1, 4096, 7168)
    assert split.splits > 1 and split.occupancy == 4
    assert plan("fp8", 8, 7168, 2048).occupancy == 4
    assert plan("bf16", 32, 7168, 2048).occupancy == 3 and plan("fp8", 32, 2112, 7168).occupancy == 3


def test_decode_plan_narrows_few_tiles_and_keeps_wide_bf16_tiles_whole():
    """64-row activation tiles while the tiles stay within two per SM; BF16 tiles of 64+ rows are not split."""
    cfg = heuristics.decode_config()
    for dtype in ("bf16", "fp8"):
        plan = heuristics.decode_plan(Problem("dense", dtype, 128, 4096, 7168, 132), cfg)
        assert (plan.bm, plan.num_m) == (64, 2)
    assert heuristics.decode_plan(Problem("dense", "fp8", 256, 24576, 1536, 132), cfg).bm == 128
    assert heuristics.decode_plan(Problem("dense", "bf16", 64, 2112, 7168, 132), cfg).splits == 1
    assert heuristics.decode_plan(Problem("dense", "fp8", 64, 2112, 7168, 132), cfg).splits > 1
    assert heuristics.decode_plan(Problem("dense", "bf16", 16, 2112, 7168, 132), cfg).splits > 1


def test_decode_plan_long_k_split_and_deep_pipeline():
    """FP8 16-row tiles at long K are split even when they fill the SMs; unsplit FP8 64-row tiles from K = 2048 get
    the deep-pipeline latency hint, and nothing else does (split kernels, BF16, short K)."""
    cfg = heuristics.decode_config()
    plan = lambda dtype, m, n, k: heuristics.decode_plan(Problem("dense", dtype, m, n, k, 132), cfg)  # noqa: E731
    assert (plan("fp8", 8, 7168, 16384).tiles, plan("fp8", 8, 7168, 16384).splits) == (112, 4)
    assert plan("fp8", 8, 7168, 2048).splits == 1  # 8 steps: too short to split
    assert plan("bf16", 8, 7168, 16384).splits == 1
    assert plan("fp8", 64, 7168, 16384).splits == 1  # 64-row tiles: splitting lost
    deep = heuristics.DECODE_DEEP_LATENCY
    for m, n, k in ((64, 7168, 16384), (128, 4096, 7168), (256, 2112, 7168), (32, 7168, 2048)):
        assert (plan("fp8", m, n, k).bm, plan("fp8", m, n, k).splits, plan("fp8", m, n, k).latency) == (64, 1, deep)
    for dtype, m, n, k in (("fp8", 64, 2112, 7168), ("fp8", 64, 24576, 1536), ("bf16", 64, 7168, 16384)):
        assert plan(dtype, m, n, k).latency == 0
    forced = heuristics.decode_plan(Problem("dense", "fp8", 64, 7168, 16384, 132), replace(cfg, latency=5))
    assert forced.latency == 5


def test_decode_plan_never_splits_small_tiles_or_in_two():
    """A tile with under 128 KB of weight is not split; a split in two becomes none (both lost on the H100)."""
    cfg = heuristics.decode_config()
    small = Problem("dense", "bf16", 16, 2048, 768, 132)  # 64 x 768 bf16: 96 KB per tile
    assert cfg.bw * small.k * 2 < heuristics.DECODE_SPLIT_MIN_TILE_BYTES
    assert heuristics.decode_plan(small, cfg).splits == 1
    assert heuristics.decode_plan(Problem("dense", "fp8", 256, 1536, 2048, 132), cfg).splits == 1  # was 2
    assert heuristics.decode_plan(Problem("dense", "fp8", 1, 1536, 2048, 132), cfg).splits == 4
    for dtype in ("bf16", "fp8"):
        for m in (1, 16, 64, 256):
            for n, k in ((2112, 7168), (1536, 2048), (2048, 768), (4096, 7168)):
                assert heuristics.decode_plan(Problem("dense", dtype, m, n, k, 132), cfg).splits != 2


def test_fp8_scale_tiles_inside_only_where_they_are():
    """The FP8 decode kernels load their scales unchecked (``INSIDE``) only where every scale tile lies inside the
    scales: the activation tile divides M, the K step divides K's 128-wide blocks, the weight tile divides N with
    per-row weight scales; narrow tiles only on configs with ``unchecked_scales`` (the 64x64 pairs)."""
    from tilegemm.ops.cutile import decode

    cfg = heuristics.decode_config()

    def swap(m, n, k, rows=False):
        return decode.swap_scales_inside(
            heuristics.decode_plan(Problem("dense", "fp8", m, n, k, 132), cfg), m, n, k, rows
        )

    assert swap(16, 7168, 2048) and swap(32, 2112, 7168) and swap(64, 2112, 7168)
    assert not swap(8, 7168, 2048)  # 8 rows of a 16-row tile
    assert not swap(16, 7168, 1920)  # 15 K blocks in steps of two
    assert swap(16, 1024, 2048, rows=True) and not swap(16, 1000, 2048, rows=True)
    pair, w16 = heuristics.NARROW_FP8_W64_PAIR, heuristics.NARROW_FP8_W16
    assert decode.narrow_scales_inside(pair, 128, 2112, False) and not decode.narrow_scales_inside(
        pair, 100, 2112, False
    )
    assert decode.narrow_scales_inside(pair, 128, 1024, True) and not decode.narrow_scales_inside(pair, 128, 1000, True)
    assert not decode.narrow_scales_inside(w16, 128, 2112, False)
    assert not any(decode.narrow_scales_inside(c, 256, 4096, False) for c in heuristics.NARROW_CONFIGS["bf16"])


def test_mqa_tiles_inside_only_where_they_divide():
    """The plain MQA kernel stores its output (and with one chain loads its key scales) unchecked only where its
    ``[bq, 128]`` tiles divide the ``[S, S_kv]`` output: S a multiple of ``bq`` (2 query rows at H = 64, 4 at 32),
    S_kv of 128."""
    from tilegemm.ops.cutile import mqa

    h64, h32 = heuristics.mqa_logits_config(64, 128), heuristics.mqa_logits_config(32, 128)
    assert mqa.tiles_inside(h64, 2048, 8192) and mqa.tiles_inside(h64, 130, 384)
    assert not mqa.tiles_inside(h64, 129, 384)  # the last query tile half outside
    assert not mqa.tiles_inside(h64, 130, 333)  # the last key tile partial
    assert mqa.tiles_inside(h32, 128, 640) and not mqa.tiles_inside(h32, 130, 640)


def test_decode_plan_split_override():
    """``DecodeConfig.splits`` fixes the K split (benchmark sweeps); 0 sizes it; never more splits than K steps."""
    import dataclasses

    p = Problem("dense", "fp8", 128, 2112, 7168, 132)
    auto = heuristics.decode_plan(p, heuristics.decode_config())
    assert auto.splits > 1
    cfg = dataclasses.replace(heuristics.decode_config(), bm_max=64, splits=2)
    plan = heuristics.decode_plan(p, cfg)
    assert (plan.bm, plan.num_m, plan.splits, plan.per) == (64, 2, 2, 14)
    assert plan.splits * plan.per >= plan.steps
    assert heuristics.decode_plan(p, dataclasses.replace(cfg, splits=1000)).splits == plan.steps
    assert heuristics.decode_plan(p, dataclasses.replace(cfg, splitk=False, splits=4)).splits == 1


def test_config_names_are_stable():
    """Names show up in printed choices and compile-gate ids: the shared tile fields keep them."""
    assert heuristics.FP8_SMALL_K.name == "fp8_64x128x128_g8_w4_o2_fa_ldgscale"
    assert heuristics.FP8_SMALL_M.name == "fp8_128x256x128_g8_w8_fa_nh2"
    assert heuristics.GROUPED_FP8_SMALL_M.name == "64x128x128_g8_w4_o2_fa"
    assert [int(k) for k in Kind] == [0, 1, 2, 3]


@pytest.mark.parametrize("h", [1, 8, 20, 32, 64, 96, 128])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_mqa_head_chain_only_where_gated(h, d):
    """The FFMA-chain head sum is chosen on sm_90 up to an MMA N side of 128 (sm_100 and N = 256 spill with it); the
    plain kernel's two MMA chains per key tile only on sm_90 with two query rows of 33-64 heads (four rows of 32
    heads spill at D = 128), three CTAs per SM only with them at D = 32 (D = 64 spills at 80 registers), and two key
    tiles per loop iteration only with them at D = 64 and 128 (one chain lost with it, D = 32 keeps three CTAs; at
    D = 128 with a latency hint on the key load); the key scales by plain loads only with one chain (two lost with
    them)."""
    plain90, plain100 = heuristics.mqa_logits_config(h, d, sm=90), heuristics.mqa_logits_config(h, d, sm=100)
    assert plain90.bq * plain90.hp == 128 and plain90.head_chain and not plain100.head_chain
    assert plain90.two_chains == (33 <= h <= 64) and not plain100.two_chains
    assert plain90.occupancy == (3 if plain90.two_chains and d == 32 else 2) and plain100.occupancy == 2
    assert plain90.unroll == (2 if plain90.two_chains and d >= 64 else 1) and plain100.unroll == 1
    assert plain90.key_latency == (6 if plain90.two_chains and d == 128 else 0) and plain100.key_latency == 0
    assert plain90.scales_ldg == (not plain90.two_chains) and not plain100.scales_ldg
    assert (plain90.bq, plain90.hp, plain90.bk) == (plain100.bq, plain100.hp, plain100.bk)
    if d == 32:
        assert heuristics.paged_mqa_config(h, d, 1, 64) is None
        return
    for next_n in (1, 2, 3, 4):
        paged = heuristics.paged_mqa_config(h, d, next_n, 64, sm=90)
        assert paged.head_chain == (paged.rg * paged.hp <= 128)
        assert not heuristics.paged_mqa_config(h, d, next_n, 64, sm=100).head_chain


def test_print_once(monkeypatch, capsys):
    monkeypatch.setattr(report, "_printed", set())  # cutile's heuristics print through tilegemm.heuristics.report
    monkeypatch.setenv("TILEGEMM_PRINT_CONFIGS", "0")
    heuristics.print_once("op", (1, 2, 3), "cfg")
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("TILEGEMM_PRINT_CONFIGS", "1")
    for _ in range(3):
        heuristics.print_once("op", (1, 2, 3), "cfg")
    heuristics.print_once("op", (1, 2, 4), "cfg")
    assert capsys.readouterr().out.splitlines() == [
        "[tilegemm] op shape=(1, 2, 3) config=cfg",
        "[tilegemm] op shape=(1, 2, 4) config=cfg",
    ]


def test_persistent_grid(monkeypatch):
    monkeypatch.setattr("tilegemm.config._num_sms", 132)
    assert launch.persistent_grid(1000) == (132, 1, 1)
    assert launch.persistent_grid(1000, ctas_per_sm=2) == (264, 1, 1)
    assert launch.persistent_grid(100, ctas_per_sm=2) == (100, 1, 1)
    assert launch.persistent_grid(0, sms=8) == (1, 1, 1)


def test_tma_ready_contract():
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert launch.tma_ready(x) and launch.tma_ready(x[:, :8])
    assert not launch.tma_ready(x[:, :4].t())  # unit stride on the first dimension
    assert not launch.tma_ready(torch.zeros(64, 12, dtype=torch.bfloat16))  # 24-byte rows
    assert launch.tma_ready(torch.zeros(64, 12, dtype=torch.bfloat16)[:1])  # one row: its stride is never used
    assert not launch.tma_ready(x.view(-1)[1:].view(63, 65)[:, :8])  # 2-byte aligned base
    assert launch.tma_ready(torch.zeros(4, 16, 8, dtype=torch.bfloat16)[:, :, :4].transpose(0, 1)[:, :1])
    odd = torch.zeros(64, 12, dtype=torch.bfloat16)
    assert launch.as_row_major(x) is x
    assert launch.tma_ready(launch.as_row_major(odd)) and launch.as_row_major(odd).shape == odd.shape
    assert launch.as_row_major(odd.t(), pad_rows=False).is_contiguous()


def test_launch_turns_compile_errors_into_unsupported(monkeypatch):
    def rejected(stream, grid, kernel, args):
        raise ct.TileCompilerExecutionError(1, "tileiras: no\ndetails", None, "", None)

    monkeypatch.setattr(ct, "launch", rejected)
    with pytest.raises(Unsupported, match="tileiras could not compile"):
        launch.launch(object(), (1, 1, 1), (), stream=object())


def test_one_plan_cache_for_every_backend(monkeypatch):
    """Plans of every backend are kept in ``tilegemm.ops.plans``; ``clear_plans`` (also ``launch.clear_plans``) forgets
    them all with the hot-lane replays."""
    monkeypatch.setattr(plans, "_PLANS", {})
    monkeypatch.setattr(hot_lane, "_HOT", {("cutile", "k"): print})
    assert plans.find(("cutile", 1)) is None
    run = plans.keep(("cutile", 1), lambda: 7)
    plans.keep(("gluon", 1), lambda: 8)
    assert plans.find(("cutile", 1)) is run and run() == 7
    assert launch.clear_plans is plans.clear_plans
    launch.clear_plans()
    assert plans.find(("cutile", 1)) is None and plans.find(("gluon", 1)) is None and not hot_lane._HOT


class _Stream:
    """Stands for a ``torch.cuda.Stream`` on the CPU."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


# (dtype, M, N, K): the decode kernel's lean entry point, the narrow-tile kernel, the tile kernel with split-K
# and its reduce kernel, the decode kernel with a c.
STREAM_CASES = [("bf16", 8, 256, 256), ("bf16", 64, 2112, 1024), ("bf16", 96, 136, 2048), ("fp8", 8, 256, 256)]
STREAM_CASES += [("fp8", 64, 4096, 1024), ("fp8", 300, 512, 512)]


@pytest.mark.parametrize("dtype,m,n,k", STREAM_CASES, ids=["-".join(map(str, c)) for c in STREAM_CASES])
@pytest.mark.parametrize("with_c", [False, True])
def test_dense_calls_launch_on_the_given_stream(monkeypatch, dtype, m, n, k, with_c):
    """A dense call's ``stream=`` reaches every launch it makes (the registry making it current is not relied on);
    without one, a call launches on the current stream: also when its plan was built by a call with a stream."""
    import tilegemm
    from tilegemm import config

    launched = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launched.append(stream))
    current, given = _Stream(1), _Stream(2)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)  # what the checks accept as a stream
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())  # the registry's context
    monkeypatch.setattr(launch, "current_stream", lambda: current)
    monkeypatch.setattr(registry, "_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(config, "_num_sms", 132)
    monkeypatch.setattr(plans, "_PLANS", {})
    monkeypatch.setattr(hot_lane, "_HOT", {})
    a, b = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    c = torch.randn(m, n).bfloat16() if with_c else None
    d = torch.zeros(m, n, dtype=torch.bfloat16)
    if dtype == "fp8":
        a, b = tilegemm.per_token_cast_to_fp8(a.float()), tilegemm.per_block_cast_to_fp8(b.float())
    op = tilegemm.fp8_gemm_nt if dtype == "fp8" else tilegemm.bf16_gemm_nt
    for _ in range(2):
        op(a, b, d, c, stream=given, backend="cutile")
        assert launched and all(s is given for s in launched), launched
        launched.clear()
    for _ in range(2):  # the full path, then the hot lane
        op(a, b, d, c, backend="cutile")
        assert launched and all(s is current for s in launched), launched
        launched.clear()


def _assert_launch_streams(name, call, launched, given, current) -> None:
    """``call(given)`` launches every kernel on ``given``, ``call(None)`` on ``current`` (``launched``: the streams
    the recorded launches got, cleared after each)."""
    for stream, expected in ((given, given), (None, current)):
        call(stream)
        assert launched and all(s is expected for s in launched), (name, launched)
        launched.clear()


def _grouped_calls():
    """(name, call(stream)) of an m-grouped (m_indices and psum layouts), a masked and a k-grouped call."""
    import tilegemm

    groups, n, k = 3, 256, 384
    m_indices = torch.tensor([0] * 128 + [-1] * 128 + [2] * 256 + [1] * 128, dtype=torch.int32)
    a, b = torch.randn(640, k).bfloat16(), torch.randn(groups, n, k).bfloat16()
    d = torch.zeros(640, n, dtype=torch.bfloat16)
    offs = torch.tensor([128, 384, 640], dtype=torch.int32)
    am, dm = torch.randn(groups, 64, k).bfloat16(), torch.zeros(groups, 64, n, dtype=torch.bfloat16)
    masked_m = torch.tensor([10, 64, 0], dtype=torch.int32)
    ks = [128, 0, 200]
    ak, bk = torch.randn(sum(ks), 128).bfloat16(), torch.randn(sum(ks), n).bfloat16()
    dk = torch.zeros(groups, 128, n, dtype=torch.float32)
    tg, cu, ks_t = tilegemm, {"backend": "cutile"}, torch.tensor(ks, dtype=torch.int32)
    return [
        ("m_indices", lambda s: tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, stream=s, **cu)),
        ("psum", lambda s: tg.m_grouped_bf16_gemm_nt_contiguous(a, b, d, offs, use_psum_layout=True, stream=s, **cu)),
        ("masked", lambda s: tg.m_grouped_bf16_gemm_nt_masked(am, b, dm, masked_m, 32, stream=s, **cu)),
        ("k_grouped", lambda s: tg.k_grouped_bf16_gemm_tn_contiguous(ak, bk, dk, ks, ks_t, stream=s, **cu)),
    ]


def test_grouped_calls_launch_on_the_given_stream(monkeypatch):
    """A grouped call's ``stream=`` reaches its launch (the k-grouped one's ragged groups repacked first); without
    one, the current stream."""
    from tilegemm import config

    launched = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launched.append(stream))
    current, given = _Stream(1), _Stream(2)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(launch, "current_stream", lambda: current)
    monkeypatch.setattr(registry, "_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(config, "_num_sms", 132)
    for name, call in _grouped_calls():
        _assert_launch_streams(name, call, launched, given, current)


def _moe_calls():
    """(name, call(stream)) of the fused experts on each path (BF16 slots, blocks, sorted; FP8 block and row forms)
    and the training forward and backward."""
    import tilegemm
    from tilegemm.ops import api

    def inputs(t, k, e, h, i):
        g = torch.Generator().manual_seed(t + k + e)
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
        x = torch.randn(t, h, generator=g).bfloat16()
        w13 = torch.randn(e, 2 * i, h, generator=g).bfloat16()
        w2 = torch.randn(e, h, i, generator=g).bfloat16()
        return {"hidden": x, "topk_ids": ids, "topk_weights": torch.rand(t, k, generator=g), "w13": w13, "w2": w2}

    def fp8(x):
        return {**x, "w13": tilegemm.per_block_cast_to_fp8(x["w13"].float()), "w2": tilegemm.per_block_cast_to_fp8(
            x["w2"].float()
        )}  # fmt: skip

    def variant(name, x):
        def call(s):
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("TILEGEMM_MOE_VARIANT", name)
                tilegemm.moe_experts(**x, stream=s, backend="cutile")

        return call

    small, rows = inputs(6, 2, 16, 256, 128), inputs(1024, 4, 8, 256, 256)
    train = inputs(40, 2, 8, 256, 128)
    _, state = api.moe_experts_forward(**train, backend="pytorch")
    grad = torch.randn(40, 256).bfloat16()
    back = {k: train[k] for k in ("hidden", "topk_weights", "w13", "w2")}
    return [
        *((name, variant(name, small)) for name in ("slots", "blocks", "sorted")),
        ("fp8_blocks", lambda s: tilegemm.fp8_moe_experts(**fp8(small), stream=s, backend="cutile")),
        ("fp8_rows", lambda s: tilegemm.fp8_moe_experts(**fp8(rows), stream=s, backend="cutile")),
        ("train_forward", lambda s: api.moe_experts_forward(**train, stream=s, backend="cutile")),
        ("train_backward", lambda s: api.moe_experts_backward(grad, **back, state=state, stream=s, backend="cutile")),
    ]


def _einsum_calls():
    """(name, call(stream)) of the einsum expressions (BF16 and FP8, the ones composed from the masked and k-grouped
    GEMMs included), the split-K BF16 one with its reduce kernel, the pre-norm GEMM, MQA logits (plain and paged)
    and RMSNorm."""
    import tilegemm as tg

    a3, b3, d2 = torch.randn(4, 2, 8192).bfloat16(), torch.randn(4, 16, 8192).bfloat16(), torch.zeros(2, 16)
    x, y = torch.randn(8, 4, 128).bfloat16(), torch.randn(4, 256, 128).bfloat16()
    dh = torch.zeros(8, 4, 256, dtype=torch.bfloat16)
    xq, yq = tg.per_token_cast_to_fp8(x.float(), use_ue8m0=True), tg.per_block_cast_to_fp8(y.float(), use_ue8m0=True)
    xc, sxc = tg.per_channel_cast_to_fp8(torch.randn(256, 4 * 128), use_ue8m0=True)
    yc, syc = tg.per_channel_cast_to_fp8(torch.randn(256, 4 * 64), use_ue8m0=True)
    ca, cb = (xc.view(256, 4, 128), sxc.view(2, 4, 128)), (yc.view(256, 4, 64), syc.view(2, 4, 64))
    dk = torch.zeros(4, 128, 64)
    pa, pb, pd, ps = torch.randn(37, 1024).bfloat16(), torch.randn(24, 1024), torch.zeros(37, 24), torch.zeros(37)
    q, kv = torch.randn(96, 8, 64).to(torch.float8_e4m3fn), torch.randn(160, 64).to(torch.float8_e4m3fn)
    kv_scale, weights = torch.rand(160) + 0.5, torch.randn(96, 8)
    ks = torch.zeros(96, dtype=torch.int32)
    ke = torch.full((96,), 160, dtype=torch.int32)
    ctx, table = torch.tensor([37, 64], dtype=torch.int32), torch.arange(8, dtype=torch.int32).view(2, 4)
    cache = torch.randint(0, 120, (8, 16, 1, 68), dtype=torch.uint8)
    qp, wp = torch.randn(2, 2, 8, 64).to(torch.float8_e4m3fn), torch.randn(4, 8)
    meta = tg.get_paged_mqa_logits_metadata(ctx, 16, 4, backend="pytorch")
    xn, wn = torch.randn(7, 256).bfloat16(), torch.randn(256).bfloat16()
    cu = {"backend": "cutile"}
    return [
        ("bmk_split", lambda s: tg.einsum("bmk,bnk->mn", a3, b3, d2, stream=s, **cu)),
        (
            "bhd_heads",
            lambda s: tg.einsum("bhd,hdr->bhr", dh, y, torch.zeros(8, 4, 128, dtype=torch.bfloat16), stream=s, **cu),
        ),
        ("bhr_masked", lambda s: tg.einsum("bhr,hdr->bhd", x, y, dh, stream=s, **cu)),
        ("fp8_bhr_masked", lambda s: tg.fp8_einsum("bhr,hdr->bhd", xq, yq, dh, stream=s, **cu)),
        ("fp8_k_grouped", lambda s: tg.fp8_einsum("bhd,bhr->hdr", ca, cb, dk, recipe=(1, 1, 128), stream=s, **cu)),
        ("prenorm", lambda s: tg.tf32_hc_prenorm_gemm(pa, pb, pd, ps, stream=s, **cu)),
        ("mqa_fp8", lambda s: tg.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke, stream=s, **cu)),
        (
            "mqa_bf16",
            lambda s: tg.bf16_mqa_logits(q.float().bfloat16(), kv.float().bfloat16(), weights, ks, ke, stream=s, **cu),
        ),
        ("mqa_paged", lambda s: tg.fp8_paged_mqa_logits(qp, cache, wp, ctx, table, meta, 69, True, stream=s, **cu)),
        ("rms_norm", lambda s: tg.rms_norm(xn, wn, stream=s, **cu)),
    ]


@pytest.mark.parametrize("family", ["moe", "einsum, mqa, norm"])
def test_moe_einsum_mqa_norm_calls_launch_on_the_given_stream(monkeypatch, family):
    """The ``stream=`` of a fused-experts call (each path, FP8 and training too), an einsum (also the expressions
    composed from another op's implementation), a pre-norm GEMM, an MQA-logits or an RMSNorm call reaches every
    launch it makes, with the registry's stream context a no-op; without one, the current stream."""
    from tilegemm import config

    launched = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launched.append(stream))
    current, given = _Stream(1), _Stream(2)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(launch, "current_stream", lambda: current)
    monkeypatch.setattr(registry, "_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(config, "_num_sms", 132)
    monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")
    monkeypatch.setattr(plans, "_PLANS", {})
    monkeypatch.setattr(hot_lane, "_HOT", {})
    empty = torch.empty
    # No kernel runs: the routing's buffers come zero-filled, so the row gather after it reads rows in range.
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: empty(*args, **kwargs).zero_())
    for name, call in _moe_calls() if family == "moe" else _einsum_calls():
        _assert_launch_streams(name, call, launched, given, current)


@pytest.mark.parametrize("src_align", [1, 3, 64, 128])
@pytest.mark.parametrize("align", [64, 128])
def test_psum_repack_rows_follow_the_callers_alignment(src_align, align):
    """The repacked psum path moves group g's rows ``[align_up(offs[g-1], src_align), offs[g])`` in order to the
    start of its ``align``-aligned block and every other row (gaps before an aligned start, rows past the last
    end) to the spare row; a python loop over the groups is the reference."""
    from tilegemm.ops.cutile import grouped

    gen = torch.Generator().manual_seed(src_align * 1000 + align)
    for _ in range(50):
        sizes = torch.randint(0, 300, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen).tolist()
        ends, end = [], 0
        for size in sizes:
            end = -(-end // src_align) * src_align + size
            ends.append(end)
        rows = ends[-1] + int(torch.randint(0, 200, (1,), generator=gen))
        dst, offs_aligned, rows_aligned = grouped._aligned_rows(
            torch.tensor(ends, dtype=torch.int32), rows, align, src_align
        )
        expected = [rows_aligned] * rows
        aligned_ends, start = [], 0
        for g, size in enumerate(sizes):
            for i in range(size):
                expected[ends[g] - size + i] = start + i
            aligned_ends.append(start + size)
            start = -(-(start + size) // align) * align
        assert dst.tolist() == expected
        assert offs_aligned.tolist() == aligned_ends
        assert rows_aligned >= start


def test_split_plan_splits_every_tile_of_a_small_grid_or_none():
    """A grid under half the CTA slots has every tile cut into the same number of K ranges; a fuller one, or a short
    K, none."""
    cfg = heuristics.BF16_CONFIGS[0]
    small = heuristics.split_plan(Problem("dense", "bf16", 512, 512, 7168, 132), cfg)
    assert (small.tiles, small.splits, small.units) == (16, 8, 128)
    full = heuristics.split_plan(Problem("dense", "bf16", 4096, 4096, 7168, 132), cfg)
    assert (full.splits, full.units) == (1, full.tiles)
    short_k = heuristics.split_plan(Problem("dense", "bf16", 512, 512, heuristics.SPLIT_MIN_K - 64, 132), cfg)
    assert short_k.splits == 1  # measured slower split than whole below SPLIT_MIN_K
