"""CPU compile gate of the cutile MQA-logits kernels (no GPU needed).

Each shipped kernel variant is compiled ahead of time for sm_90 and sm_100 with the signature the
JIT would infer from real contiguous tensors (output rows 16-byte aligned or not), and its SASS is checked: FP8
tensor-core MMAs (``QGMMA`` on Hopper, ``UTCQMMA`` on Blackwell), TMA loads of the FP8 operands
(``UTMALDG``; the paged kernel's gathered cache blocks included), no byte-wide FP8 loads, and no
register spills on sm_90; on sm_90 the plain kernel and the benchmark's paged shapes also fit two CTAs per SM (256
threads, registers and shared memory for two). The plain op's ``-inf`` fill kernel is compiled for every query-block
size: plain stores, no spills, at most 64 registers. The plain ops' decode kernel (``mqa_decode_kernels``, FP8 and
BF16, the decode configs ``heuristics.cutile.mqa_decode_config`` gives the indexers' shapes) the same way, at two CTAs
per SM on sm_90.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest

ct = pytest.importorskip("cuda.tile")

from cuda.tile import compilation as cc  # noqa: E402

from compile_gate.sass import compile_each, launch_resources, sass_summary  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.ops.cutile import aot, mqa, mqa_decode_kernels, mqa_kernels  # noqa: E402

# (H, D): every padded-head class of the plain kernel (HP = 8 .. 128), every head dim.
PLAIN_VARIANTS = [(8, 64), (16, 128), (32, 128), (64, 128), (64, 64), (64, 32), (96, 128), (128, 128)]
# (H, D, next_n, block_kv, 2-D context_lens): every chunk shape class (ck x rg*hp), each block_kv.
PAGED_VARIANTS = [
    (64, 128, 1, 64, False),
    (32, 128, 2, 16, True),
    (64, 128, 2, 16, True),
    (32, 128, 2, 32, False),
    (128, 128, 4, 64, True),
    (8, 64, 3, 16, True),
    (64, 64, 4, 32, False),
]

#: The paged variants the paged decode kernel takes (``heuristics.cutile.paged_decode_config``: sm_90, N <= 128).
PAGED_DECODE_VARIANTS = [
    v for v in PAGED_VARIANTS if heuristics.paged_decode_config(heuristics.paged_mqa_config(*v[:4]), 1, 4096, 132)
]


def _cache_view(dtype: ct.DType, ndim: int, block_stride_elems: int) -> cc.ArrayConstraint:
    """A view into the paged cache: unit last stride, block stride a multiple of 16 bytes."""
    return cc.ArrayConstraint(
        dtype,
        ndim,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=("cache",),
        may_alias_internally=False,
        stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[block_stride_elems] * (ndim - 1) + [1],
        base_addr_divisible_by=16,
    )


def _sm(arch: str) -> int:
    return int(arch.removeprefix("sm_"))


def plain_params(h: int, d: int, out_align: int = 16, inside: bool = False, arch: str = "sm_90") -> list:
    conf = mqa.mqa_logits_config(h, d, sm=_sm(arch))
    return [
        aot.array(ct.float8_e4m3fn, 3),  # q [S, H, D]
        aot.array(ct.float8_e4m3fn, 2),  # kv [S_kv, D]
        aot.array(ct.float32, 1),  # kv scale
        aot.array(ct.float32, 2),  # weights [S, H] (H a multiple of 4: 16-byte rows)
        aot.array(ct.int32, 1),
        aot.array(ct.int32, 1),
        aot.array(ct.float32, 2, align_bytes=out_align),  # out [S, S_kv]
        *mqa.plain_constants(conf, d, inside),
    ]


def paged_params(
    h: int,
    d: int,
    next_n: int,
    block_kv: int,
    two_d: bool,
    out_align: int = 16,
    arch: str = "sm_90",
    w_align: int = 4,
    scheduled: bool = True,
) -> list:
    """The paged kernel's parameters (``scheduled=False``: the paged decode kernel's, which takes no schedule)."""
    conf = mqa.paged_mqa_config(h, d, next_n, block_kv, sm=_sm(arch))
    schedule = [aot.array(ct.int32, 2, align_bytes=8)] if scheduled else []
    constants = mqa.paged_constants if scheduled else mqa.paged_decode_constants
    return [
        aot.array(ct.float8_e4m3fn, 4),  # q [B, next_n, H, D]
        _cache_view(ct.float8_e4m3fn, 3, 16),  # keys [num_blocks, block_kv, D]
        _cache_view(ct.float32, 2, 4),  # scales [num_blocks, block_kv]
        aot.array(ct.float32, 3, align_bytes=w_align),  # weights [B, next_n, H] (16 bytes: H a multiple of 4)
        aot.array(ct.int32, 2 if two_d else 1, align_bytes=4),  # context_lens
        aot.array(ct.int32, 2, align_bytes=4),  # block_table
        *schedule,
        aot.array(ct.float32, 3, align_bytes=out_align),  # out [B, next_n, W]
        *constants(conf, next_n, d, block_kv, two_d),
    ]


#: sm_100 variants whose tileiras 13.4 SASS spills (local loads + stores), kept as exact caps so
#: that any growth fails; sm_90 (the measured target) must be spill-free.
SM100_KNOWN_SPILLS = {  # (kernel, variant + output alignment): local loads + stores
    ("plain", (64, 128, 16)): 22,
    ("plain", (64, 128, 4)): 22,
    ("plain", (64, 128, 16, True)): 11,
    ("plain", (64, 64, 16)): 21,
    ("plain", (64, 64, 4)): 21,
    ("plain", (64, 32, 16)): 20,
    ("plain", (64, 32, 4)): 20,
    ("paged", (128, 128, 4, 64, True, 16)): 27,
    ("paged", (128, 128, 4, 64, True, 4)): 27,
}

# Each variant with output rows 16-byte aligned (TMA stores possible) and 4-byte aligned: the JIT
# specializes on the real strides, and tileiras 13.4 once failed on one of the two (docs/kernels.md). The plain
# kernel also with its tiles inside (``mqa.tiles_inside``: stores unchecked, 16-byte rows, S_kv % 128 == 0).
JOBS = (
    [("plain", v + (al,), arch) for v in PLAIN_VARIANTS for al in (16, 4) for arch in aot.ARCHS]
    + [("plain", v + (16, True), arch) for v in PLAIN_VARIANTS for arch in aot.ARCHS]
    + [("paged", v + (al,), arch) for v in PAGED_VARIANTS for al in (16, 4) for arch in aot.ARCHS]
    + [("paged_decode", v + (al,), "sm_90") for v in PAGED_DECODE_VARIANTS for al in (16, 4)]
)


def _compile(job):
    try:
        return _compile_one(job)
    except Exception as exc:  # reported by the job's own test
        return exc


def _compile_one(job):
    kind, variant, arch = job
    if kind == "plain":
        conf = mqa.mqa_logits_config(*variant[:2], sm=_sm(arch))
        cubin = aot.compile_cubin(mqa_kernels.plain_kernel_for(conf.occupancy), plain_params(*variant, arch=arch), arch)
    else:
        scheduled = kind == "paged"
        conf = mqa.paged_mqa_config(*variant[:4], sm=_sm(arch))
        made = mqa_kernels.paged_kernel_for if scheduled else mqa_decode_kernels.paged_decode_kernel_for
        params = paged_params(*variant, arch=arch, scheduled=scheduled)
        cubin = aot.compile_cubin(made(conf.occupancy), params, arch)
    return sass_summary(cubin)


@pytest.fixture(scope="module")
def summaries() -> Mapping:
    """Every (kernel, variant, arch) compiled once (:func:`sass.compile_each`)."""
    return compile_each(JOBS, _compile)


def _ids(job) -> str:
    kind, variant, arch = job
    return f"{kind}-{'-'.join(map(str, variant))}-{arch}"


@pytest.mark.parametrize("job", JOBS, ids=[_ids(j) for j in JOBS])
def test_mqa_kernel_sass(summaries, job):
    kind, _, arch = job
    s = summaries[job]
    if isinstance(s, Exception):
        pytest.fail(f"does not compile: {type(s).__name__}: {str(s)[:500]}")
    if arch == "sm_90":
        assert s["qgmma"] > 0, f"no FP8 warpgroup MMA (QGMMA): {s}"
        assert s["ldl"] == 0 and s["stl"] == 0, f"register spills: {s}"
    else:
        assert s["utcqmma"] > 0, f"no FP8 tcgen05 MMA (UTCQMMA): {s}"
        spill_cap = SM100_KNOWN_SPILLS.get(job[:2], 0)
        assert s["ldl"] + s["stl"] <= spill_cap, f"register spills (known cap {spill_cap}): {s}"
    assert s["utmaldg"] > 0, f"no TMA loads: {s}"
    assert s["ldg_u8"] == 0, f"byte-wide FP8 loads (TMA lost): {s}"


def clean_params(h: int, d: int, out_align: int, arch: str) -> list:
    conf = mqa.mqa_logits_config(h, d, sm=_sm(arch))
    return [
        aot.array(ct.int32, 1),
        aot.array(ct.int32, 1),
        aot.array(ct.float32, 2, align_bytes=out_align),
        conf.bq,
        conf.bk,
        conf.unroll,
    ]


@pytest.mark.parametrize("arch", aot.ARCHS)
def test_clean_kernel_stores_without_spills(arch):
    """The ``-inf`` fill of the tiles outside the windows (``mqa_clean_logits_kernel``): every query-row block size of
    the plain kernel, either output alignment; plain stores (no TMA: a store warpgroup would cost one CTA per SM),
    no spills, at most 64 registers (four CTAs per SM or more)."""
    jobs = [(h, d, al) for h, d in PLAIN_VARIANTS for al in (16, 4)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        cubins = list(
            pool.map(
                lambda j: aot.compile_cubin(mqa_kernels.mqa_clean_logits_kernel, clean_params(*j, arch), arch), jobs
            )
        )
    for job, cubin in zip(jobs, cubins):
        s, res = sass_summary(cubin), launch_resources(cubin)
        assert s["ldl"] + s["stl"] == 0 and s["utmastg"] == 0, (job, s)
        assert res["registers"] <= 64, (job, res)


#: An H100 SM: 64K 32-bit registers, 228 KB of shared memory (227 KB for one CTA).
SM90_REGISTERS, SM90_SHARED = 65536, 228 * 1024


@pytest.mark.parametrize("h,d", PLAIN_VARIANTS)
def test_plain_kernel_fits_two_ctas_per_sm90(h, d):
    """Two CTAs of the plain kernel share an SM on sm_90 (three where its config asks for them: two MMA chains at
    D = 32), so one's MMA overlaps another's head sum (docs/kernels.md, "Two CTAs per SM"). A TMA output store would
    add a store warpgroup (384 threads at 168 registers: one CTA)."""
    conf = mqa.mqa_logits_config(h, d)
    res = launch_resources(aot.compile_cubin(mqa_kernels.plain_kernel_for(conf.occupancy), plain_params(h, d), "sm_90"))
    assert res["threads"] == 256, res
    fit = conf.occupancy
    assert fit * res["threads"] * res["registers"] <= SM90_REGISTERS and fit * res["shared"] <= SM90_SHARED, res


def test_unrolled_plain_kernel_holds_a_slot_per_key_tile_sm90():
    """Two key tiles per loop iteration (``MqaConfig.unroll``, H = 64 at D = 64) are two loads, and tileiras gives
    each its own shared-memory slot: at least one key tile (``bk * d`` bytes) more shared memory than the same
    kernel with one tile per iteration, which has a single slot, so the next tile's load waits for the MMA on the
    current one (docs/notes/kernels.md, "Two key tiles per iteration")."""
    d = 64
    conf = mqa.mqa_logits_config(64, d)
    assert conf.unroll == 2
    kernel = mqa_kernels.plain_kernel_for(conf.occupancy)
    one = plain_params(64, d)
    one[-4] = 1  # UNROLL
    with ThreadPoolExecutor(max_workers=2) as pool:
        cubins = list(pool.map(lambda p: aot.compile_cubin(kernel, p, "sm_90"), (plain_params(64, d), one)))
    two_res, one_res = (launch_resources(c) for c in cubins)
    assert two_res["shared"] - one_res["shared"] >= conf.bk * d, (two_res, one_res)
    assert conf.occupancy * two_res["shared"] <= SM90_SHARED, two_res


def test_d128_plain_kernel_does_not_serialize_its_mma_sm90():
    """With two chains at D = 128 tileiras 13.4 waits after every QGMMA (a ``WARPGROUP.DEPBAR`` each) unless the
    kernel takes two key tiles per iteration with a latency hint of 6 on the key load (``MqaConfig.key_latency``):
    then at most one wait per four QGMMAs, spill-free (docs/notes/kernels.md, "D = 128: two key tiles per iteration
    and a latency hint")."""
    import re

    from compile_gate.sass import dump_sass

    conf = mqa.mqa_logits_config(64, 128)
    assert (conf.unroll, conf.key_latency) == (2, 6)
    sass = dump_sass(aot.compile_cubin(mqa_kernels.plain_kernel_for(conf.occupancy), plain_params(64, 128), "sm_90"))
    qgmma, waits = len(re.findall(r"QGMMA", sass)), len(re.findall(r"WARPGROUP\.DEPBAR", sass))
    assert qgmma > 0 and 4 * waits <= qgmma, (qgmma, waits)


@pytest.mark.parametrize("h,d", [(64, 64), (32, 128)])
def test_unchecked_output_stores_shorten_the_plain_loop_sm90(h, d):
    """Where the output tiles divide the output (``mqa.tiles_inside``), the plain kernel stores them without
    bounds checks, and its key loop is shorter (sm_90, instructions per iteration: H = 64 D = 64 with two tiles per
    iteration 928 -> 840, H = 32 D = 128 589 -> 484, its key scales then plain loads: ``MqaConfig.scales_ldg``)."""
    from compile_gate.sass import dump_sass, loop_bodies

    conf = mqa.mqa_logits_config(h, d)
    kernel = mqa_kernels.plain_kernel_for(conf.occupancy)

    def loop_length(inside: bool) -> int:
        bodies = loop_bodies(dump_sass(aot.compile_cubin(kernel, plain_params(h, d, inside=inside), "sm_90")))
        return min(len(b) for b in bodies if any("QGMMA" in i for i in b))

    assert loop_length(True) + 40 * conf.unroll < loop_length(False)


@pytest.mark.parametrize("h,next_n", [(64, 1), (32, 2), (64, 2)])
def test_paged_kernel_fits_two_ctas_per_sm90(h, next_n):
    """The paged shapes of the benchmark (block_kv 64, N = 64 and 128: 128-key chunks with the rows once per batch
    row; H a multiple of 4, so 16-byte weight rows as the JIT sees them) keep two CTAs per SM on sm_90: one CTA per
    row of the schedule ran 0.78-0.86x DeepGEMM, two 0.94-0.98x (docs/notes/kernels.md, "The paged kernel's batch-major
    walk"). With 4-byte weight rows tileiras takes 117 KB of shared memory at N = 64: one CTA."""
    conf = mqa.paged_mqa_config(h, 128, next_n, 64, sm=90)
    assert conf.batch_major and conf.rows_outer and conf.ck == 128
    kernel = mqa_kernels.paged_kernel_for(conf.occupancy)
    res = launch_resources(aot.compile_cubin(kernel, paged_params(h, 128, next_n, 64, True, w_align=16), "sm_90"))
    assert res["threads"] == 256, res
    assert 2 * res["threads"] * res["registers"] <= SM90_REGISTERS and 2 * res["shared"] <= SM90_SHARED, res


# (H, D) of the BF16 plain kernel (``bf16_mqa_logits``): the indexers' heads at D = 128, every head-dim class, and the
# tiny DSA presets' indexer (4 heads of 32).
BF16_VARIANTS = [(64, 128), (32, 128), (128, 128), (16, 128), (64, 64), (64, 32), (8, 64), (4, 32)]


def bf16_plain_params(h: int, d: int, out_align: int = 16, arch: str = "sm_90") -> list:
    """The plain kernel's signature with bf16 ``q`` and keys and ``bf16_mqa_logits_config``'s tiles."""
    conf = mqa.bf16_mqa_logits_config(h, d, sm=_sm(arch))
    params = plain_params(h, d, out_align=out_align, arch=arch)
    params[0], params[1] = aot.array(ct.bfloat16, 3), aot.array(ct.bfloat16, 2)
    params[7:] = [conf.bq, conf.hp, d, conf.bk, conf.head_chain, conf.two_chains, conf.unroll, False, False, 0]
    return params


def test_bf16_plain_kernel_sm90():
    """The BF16 plain kernel on sm_90, every variant at either output alignment: BF16 warpgroup MMAs (``HGMMA``), TMA
    loads of q and the keys, no spills, and two CTAs per SM (256 threads; registers and shared memory for two)."""
    jobs = [(h, d, al) for h, d in BF16_VARIANTS for al in (16, 4)]

    def build(job):
        h, d, al = job
        conf = mqa.bf16_mqa_logits_config(h, d)
        return aot.compile_cubin(mqa_kernels.plain_kernel_for(conf.occupancy), bf16_plain_params(h, d, al), "sm_90")

    with ThreadPoolExecutor(max_workers=2) as pool:
        cubins = list(pool.map(build, jobs))
    for job, cubin in zip(jobs, cubins):
        s, res = sass_summary(cubin), launch_resources(cubin)
        assert s["hgmma"] > 0 and s["qgmma"] == 0, (job, s)
        assert s["ldl"] == 0 and s["stl"] == 0, (job, s)
        assert s["utmaldg"] > 0, (job, s)
        assert res["threads"] == 256, (job, res)
        assert 2 * res["threads"] * res["registers"] <= SM90_REGISTERS and 2 * res["shared"] <= SM90_SHARED, (job, res)


def test_bf16_plain_kernel_compiles_sm100():
    """The BF16 plain kernel also compiles for sm_100 (tcgen05 BF16 MMAs) at the indexers' sizes."""
    for h, d in ((64, 128), (32, 128)):
        conf = mqa.bf16_mqa_logits_config(h, d, sm=100)
        s = sass_summary(
            aot.compile_cubin(
                mqa_kernels.plain_kernel_for(conf.occupancy), bf16_plain_params(h, d, arch="sm_100"), "sm_100"
            )
        )
        assert s["utchmma"] > 0 or s["utc_mma"] > 0, ((h, d), s)


# (dtype, H, D, query rows) of the decode kernel: DeepSeek-V3.2's indexer (64 heads of 128) at one and two query rows
# (MMA N sides 64 and 128), FP8 and BF16, and the tiny DSA presets' indexer (4 heads of 32, BF16).
DECODE_VARIANTS = [
    ("fp8", 64, 128, 1),
    ("fp8", 64, 128, 2),
    ("bf16", 64, 128, 1),
    ("bf16", 64, 128, 2),
    ("bf16", 4, 32, 1),
]
#: sm_100 decode variants whose tileiras 13.4 SASS spills (local loads + stores): two query rows of 64 heads, an MMA N
#: side of 128 summed by ``ct.sum`` (the plain kernel's sm_100 variants of that class spill 20-22). Exact caps.
DECODE_SM100_KNOWN_SPILLS = {("fp8", 64, 128, 2): 11, ("bf16", 64, 128, 2): 3}
#: The batched kernel's sm_100 caps (its batch index and 3-D tiles hold more registers there); sm_90 is spill-free.
DECODE_BATCHED_SM100_KNOWN_SPILLS = {("fp8", 64, 128, 2): 11, ("bf16", 64, 128, 2): 82}
#: Each decode variant as the single-sequence kernel and as the batched one (``mqa_logits_batched``: a batch
#: dimension on every array, the same tile math).
DECODE_JOBS = [(v, arch, batched) for v in DECODE_VARIANTS for arch in aot.ARCHS for batched in (False, True)]


def decode_config(dtype: str, h: int, d: int, rows: int, arch: str = "sm_90"):
    """The decode config of ``rows`` query rows over 64k keys on 132 SMs (``parts`` is a launch size, not a
    constant: the signature does not depend on it)."""
    return heuristics.plain_mqa_config(h, d, rows, 65536, 132, sm=_sm(arch), bf16=dtype == "bf16", variant="decode")


def decode_params(dtype: str, h: int, d: int, rows: int, arch: str = "sm_90", batched: bool = False) -> list:
    """The decode kernel's parameters (``batched``: the batched kernel's, one more leading dim on every array)."""
    conf = decode_config(dtype, h, d, rows, arch)
    elem = ct.bfloat16 if dtype == "bf16" else ct.float8_e4m3fn
    extra = int(batched)
    return [
        aot.array(elem, 3 + extra),  # q [S, H, D]
        aot.array(elem, 2 + extra),  # kv [S_kv, D]
        aot.array(ct.float32, 1 + extra),  # kv scale
        aot.array(ct.float32, 2 + extra, align_bytes=4),  # weights [S, H] (H = 4: 16-byte rows; not assumed)
        aot.array(ct.int32, 1 + extra),
        aot.array(ct.int32, 1 + extra),
        aot.array(ct.float32, 2 + extra, align_bytes=4),  # out [S, S_kv]: rows of any length
        *mqa_decode_kernels.decode_constants(conf, d),
    ]


def _compile_decode(job):
    (dtype, h, d, rows), arch, batched = job
    conf = decode_config(dtype, h, d, rows, arch)
    try:
        made = mqa_decode_kernels.decode_batched_kernel_for if batched else mqa_decode_kernels.decode_kernel_for
        return aot.compile_cubin(made(conf.occupancy), decode_params(dtype, h, d, rows, arch, batched), arch)
    except Exception as exc:  # reported by the job's own test
        return exc


@pytest.fixture(scope="module")
def decode_cubins() -> Mapping:
    return compile_each(DECODE_JOBS, _compile_decode)


def test_paged_decode_configs():
    """The paged op without a schedule: the scheduled config's tiles, ``parts`` CTAs per (sequence, row group) as many
    as two CTAs per SM hold over all of them (rounded down: one wave), at most one per 128-key chunk and at least one;
    none off sm_90 or at an MMA N side above 128 (the op then schedules itself)."""
    base = heuristics.paged_mqa_config(64, 128, 1, 64)
    for batch, width, parts in [(1, 4096, 32), (1, 65536, 264), (8, 65536, 33), (32, 65536, 8), (128, 4096, 2)]:
        conf = heuristics.paged_decode_config(base, batch, width, 132)
        assert conf == dataclasses.replace(base, parts=parts), (batch, width, conf)
        assert batch * conf.parts <= 2 * 132
    assert heuristics.paged_decode_config(base, 300, 65536, 132).parts == 1  # more sequences than slots
    assert heuristics.paged_decode_config(base, 1, 100, 132).parts == 1  # one chunk
    assert heuristics.paged_decode_config(base, 1, 4096, 132, sm=100) is None
    wide = heuristics.paged_mqa_config(128, 128, 4, 64)  # N = 256
    assert wide.rg * wide.hp == 256 and heuristics.paged_decode_config(wide, 1, 4096, 132) is None
    confs = {v: heuristics.paged_mqa_config(*v[:4]) for v in PAGED_VARIANTS}
    assert set(PAGED_DECODE_VARIANTS) == {v for v, c in confs.items() if c.rg * c.hp <= 128}


def test_decode_configs_take_decode_steps():
    """The decode kernel is the chooser's for decode steps on Hopper (at most MQA_DECODE_MAX_ROWS query rows over at
    least MQA_DECODE_MIN_KEYS keys, where it was measured); forced ``plain`` keeps the plain kernel there, forced
    ``decode`` extends it to any call of fewer row blocks than SMs; on sm_100 (not measured) only forced; a call whose
    plain grid fills the SMs never takes it."""
    rows_max, keys_min = heuristics.MQA_DECODE_MAX_ROWS, heuristics.MQA_DECODE_MIN_KEYS
    for dtype, h, d, rows in DECODE_VARIANTS:
        bf16 = dtype == "bf16"
        base = heuristics.bf16_mqa_logits_config(h, d) if bf16 else heuristics.mqa_logits_config(h, d)
        assert heuristics.plain_mqa_config(h, d, rows, 65536, 132, bf16=bf16) == decode_config(dtype, h, d, rows)
        assert heuristics.plain_mqa_config(h, d, rows, 65536, 132, bf16=bf16, variant="plain") == base
        assert heuristics.plain_mqa_config(h, d, rows, keys_min - 1, 132, bf16=bf16).path == "plain"
        assert heuristics.plain_mqa_config(h, d, rows, keys_min - 1, 132, bf16=bf16, variant="decode").path == "decode"
        assert heuristics.plain_mqa_config(h, d, rows, 65536, 148, sm=100, bf16=bf16).path == "plain"
        conf = decode_config(dtype, h, d, rows)
        assert conf.path == "decode" and conf.bq * conf.hp <= 128 and conf.bq >= min(rows, base.bq)
        assert conf.parts == min(512, -(-264 // -(-rows // conf.bq)))
    assert heuristics.plain_mqa_config(64, 128, rows_max + 1, 65536, 132).path == "plain"
    assert heuristics.plain_mqa_config(64, 128, rows_max, 65536, 132).path == "decode"
    assert heuristics.plain_mqa_config(64, 128, 4096, 4096, 132, variant="decode").path == "plain"
    assert heuristics.plain_mqa_config(64, 128, 1, 300, 132, variant="decode").parts == 3  # one CTA per key tile


@pytest.mark.parametrize(
    "job", DECODE_JOBS, ids=[f"{'-'.join(map(str, v))}-{a}{'-batched' if b else ''}" for v, a, b in DECODE_JOBS]
)
def test_decode_kernel_sass(decode_cubins, job):
    """The decode kernel: the dtype's tensor-core MMAs (sm_90 ``QGMMA`` / ``HGMMA``, sm_100 ``UTCQMMA`` /
    ``UTCHMMA``), TMA loads of the key tiles, no byte-wide FP8 loads, no TMA store (no store warpgroup), no spills;
    no spills on sm_90 (sm_100: the exact caps of :data:`DECODE_SM100_KNOWN_SPILLS`), 256 threads with registers
    for two CTAs per SM and the key loads pipelined (shared memory for two key tiles or more)."""
    (dtype, *_), arch, _ = job
    cubin = decode_cubins[job]
    if isinstance(cubin, Exception):
        pytest.fail(f"does not compile: {type(cubin).__name__}: {str(cubin)[:500]}")
    s, res = sass_summary(cubin), launch_resources(cubin)
    mma = {("fp8", "sm_90"): "qgmma", ("bf16", "sm_90"): "hgmma", ("fp8", "sm_100"): "utcqmma"}
    assert s[mma.get((dtype, arch), "utchmma")] > 0, s
    assert s["utmaldg"] > 0 and s["ldg_u8"] == 0 and s["utmastg"] == 0, s
    if arch == "sm_90":
        assert s["ldl"] == 0 and s["stl"] == 0, f"register spills: {s}"
        assert res["threads"] == 256 and 2 * res["threads"] * res["registers"] <= SM90_REGISTERS, res
        key_tile = 128 * job[0][2] * (2 if dtype == "bf16" else 1)
        assert 2 * key_tile <= res["shared"] <= SM90_SHARED, res  # key loads pipelined (two tiles in flight or more)
    else:
        spill_cap = (DECODE_BATCHED_SM100_KNOWN_SPILLS if job[2] else DECODE_SM100_KNOWN_SPILLS).get(job[0], 0)
        assert s["ldl"] + s["stl"] <= spill_cap, f"register spills (known cap {spill_cap}): {s}"
