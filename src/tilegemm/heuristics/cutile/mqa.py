"""MQA logits (not GEMMs): the plain and paged kernels' tiles from heads, head size and compute capability
(``ops/cutile/mqa.py``; the CPU gate ``tests/compile_gate/test_compile_mqa.py`` holds the spill claims). Measurements:
``docs/notes/heuristics.md``, "MQA logits"."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilegemm.env import MQA_VARIANT
from tilegemm.heuristics.cutile.problem import forced


@dataclass(frozen=True)
class MqaConfig:
    """Tile sizes of the plain MQA kernel (``mqa.make_mqa_logits_kernel``): ``bq`` query rows x ``hp`` (padded)
    heads, ``bk`` keys.

    ``head_chain``: sum the weighted heads as a chain of FFMAs over groups of 8 (``mqa.weighted_head_sum``);
    otherwise one ``ct.sum`` (an FMUL and an FADD per score). ``two_chains``: the query rows in two halves with an
    MMA each per key tile (``mqa.key_tile_logits``). ``occupancy``: the sm_90 CTAs-per-SM hint
    (``mqa.plain_kernel_for``). ``unroll``: key tiles per loop iteration, each its own load and shared-memory slot.
    ``scales_ldg``: where the tiles divide the keys (``mqa.tiles_inside``), the key scales are plain unchecked loads
    rather than TMA loads. ``key_latency``: the key load's latency hint (0: none), from which tileiras sizes its
    pipeline. ``path``: the kernel that runs it, ``plain`` (one CTA per ``bq`` query rows) or ``decode``
    (:func:`mqa_decode_config`: ``parts`` CTAs per ``bq`` query rows, each a slice of the keys).
    """

    bq: int
    hp: int
    bk: int
    head_chain: bool = False
    two_chains: bool = False
    occupancy: int = 2
    unroll: int = 1
    scales_ldg: bool = False
    key_latency: int = 0
    path: str = "plain"
    parts: int = 1


@dataclass(frozen=True)
class PagedMqaConfig:
    """Tile sizes and launch shape of :func:`paged_mqa_logits_kernel`.

    ``nnp``: next_n rounded up to a power of two; ``rg``: query rows per MMA (``rg * hp <= 256``);
    ``ck``: keys per chunk (one indexed load of ``ck / block_kv`` cache blocks); ``split``: keys per
    schedule split; ``parts``: CTAs sharing each schedule row (round-robin over its splits), so
    several gathers are in flight per SM; ``occupancy``: the compiler's CTAs-per-SM hint; ``head_chain``: as
    :class:`MqaConfig`'s; ``batch_major``: the kernel walks its splits one batch row at a time with a branch-free
    chunk loop (sm_90; on sm_100 tileiras 13.4 spills with it, so it walks one split per iteration);
    ``rows_outer``: with ``batch_major``, one row group (``nnp == rg``) whose rows are loaded once per batch row
    rather than once per chunk.
    """

    nnp: int
    rg: int
    hp: int
    ck: int
    split: int
    parts: int
    occupancy: int
    head_chain: bool = False
    batch_major: bool = False
    rows_outer: bool = False


def _mqa_pow2_ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _head_chain(sm: int, n_side: int) -> bool:
    """The FFMA-chain head sum: on sm_90 up to an MMA N side of 128.

    Measured on an H100 (``docs/kernels.md``), plain kernel at two CTAs per SM: 1.07-1.23x over ``ct.sum``.
    tileiras 13.4 spills with it on sm_100 (up to thousands of words) and on sm_90 at N = 256, so those keep
    ``ct.sum``.
    """
    return sm == 90 and n_side <= 128


def mqa_logits_config(h: int, d: int, sm: int = 90) -> MqaConfig | None:
    """Tiles for ``fp8_mqa_logits``: ``h`` heads of size ``d``, compute capability ``sm``; ``None`` if unsupported.

    The N side of the MMA is ``bq * hp = 128`` (query rows x padded heads); 128 keys per tile. The rules, each
    measured on an H100 with bitwise-equal outputs (``docs/notes/heuristics.md``, "MQA logits"):

    * two rows of 64 (padded) heads: two MMA chains of one row each on sm_90 (1.01-1.08x; with four rows of 32
      heads tileiras spills at D = 128, so H <= 32 keeps one chain);
    * two CTAs per SM on sm_90, three with two chains at D = 32 (1.1-1.26x; at D = 64 it spills);
    * two key tiles per loop iteration with two chains at D >= 64 (``unroll``: each its own shared-memory slot;
      1.03-1.13x at D = 64);
    * at D = 128 with two chains, a latency hint of 6 on the key load (12 MMA waits for 96 QGMMAs instead of one
      each; 1.01-1.12x);
    * key scales by plain loads with one chain on sm_90 (``scales_ldg``; 1.03-1.11x, two chains lost).
    """
    if d not in (32, 64, 128) or not 1 <= h <= 128:
        return None
    hp = _mqa_pow2_ceil(h)
    bq = max(1, 128 // hp)
    chain = _head_chain(sm, bq * hp)
    two = chain and bq == 2
    occupancy = 3 if two and d <= 32 else 2
    unroll = 2 if two and d >= 64 else 1
    return MqaConfig(
        bq=bq,
        hp=hp,
        bk=128,
        head_chain=chain,
        two_chains=two,
        occupancy=occupancy,
        unroll=unroll,
        scales_ldg=sm == 90 and not two,
        key_latency=6 if two and d == 128 else 0,
    )


def bf16_mqa_logits_config(h: int, d: int, sm: int = 90) -> MqaConfig | None:
    """Tiles of the plain MQA kernel with bf16 ``q`` and keys (``bf16_mqa_logits``); ``None`` if unsupported.

    :func:`mqa_logits_config`'s tiles with one key tile per iteration and no latency hint, and two MMA chains only at
    D = 128: a bf16 key tile is twice an FP8 one, and with FP8's D = 128 choice (two tiles, hint 6) tileiras 13.4
    spills 17 + 12 words on sm_90, with two chains at D = 64 82 + 32, at D = 32 33 + 34; these settings compile
    spill-free at every head class (``tests/compile_gate/test_compile_mqa.py``), two CTAs per SM at about 100 KB of
    shared memory each.
    """
    base = mqa_logits_config(h, d, sm)
    if base is None:
        return None
    two = base.two_chains and d == 128
    return MqaConfig(
        bq=base.bq,
        hp=base.hp,
        bk=base.bk,
        head_chain=base.head_chain,
        two_chains=two,
        occupancy=2,
        unroll=1,
        scales_ldg=sm == 90 and not two,
        key_latency=0,
    )


def paged_mqa_config(
    h: int, d: int, next_n: int, block_kv: int, split: int = 256, sm: int = 90
) -> PagedMqaConfig | None:
    """Tiles and launch shape for ``fp8_paged_mqa_logits`` on compute capability ``sm``; ``None`` if unsupported.

    Decode is bound by the latency of dependent loads (schedule -> block table -> cache blocks) more than by the
    MMA, so several CTAs share each schedule row and the kernel streams each batch row's chunks without a branch.
    With an MMA N side (``rg * hp``) of at most 128: 128-key chunks, 2 CTAs per row, occupancy 3 up to N = 32 else 2
    (the hints that compile spill-free on sm_90; 0.94-0.98x DeepGEMM, ``docs/notes/heuristics.md``, "Paged MQA
    logits"). N = 256 keeps the config the GPU tests ran (64-key chunks, 4 CTAs, occupancy 4). sm_100 takes the
    same tiles (spill-free with its walk, never measured).
    """
    if d not in (64, 128) or not 1 <= h <= 128 or not 1 <= next_n <= 4 or block_kv not in (16, 32, 64):
        return None
    if split % 128:
        return None
    hp = _mqa_pow2_ceil(h)
    nnp = _mqa_pow2_ceil(next_n)
    rg = min(nnp, max(1, 256 // hp))
    n_side = rg * hp
    if n_side <= 128:
        ck, parts, occupancy = 128, 2, 3 if n_side <= 32 else 2
    else:
        ck, parts, occupancy = 64, 4, 4
    return PagedMqaConfig(
        nnp=nnp,
        rg=rg,
        hp=hp,
        ck=ck,
        split=split,
        parts=parts,
        occupancy=occupancy,
        head_chain=_head_chain(sm, n_side),
        batch_major=sm == 90,
        rows_outer=sm == 90 and nnp == rg,
    )


def paged_decode_config(base: PagedMqaConfig, batch: int, width: int, sms: int, sm: int = 90) -> PagedMqaConfig | None:
    """The paged op's config without a schedule (``schedule_meta=None``: ``mqa_decode_kernels.paged_decode_kernel``)
    from its scheduled config ``base``: the same tiles, and ``parts`` CTAs per (sequence, row group), each taking
    every ``parts``-th chunk of ``base.ck`` keys: as many as :data:`MQA_DECODE_CTAS_PER_SM` CTAs per SM hold over the
    ``batch`` sequences' row groups (rounded down: one wave; rounded up, 32 sequences of 64k keys ran 288 CTAs in
    264 slots, 0.78x the scheduled kernel), at most one per chunk of ``width`` (``max_context_len``) keys.

    ``None`` (the op then makes its schedule itself) off sm_90 and at an MMA N side (``rg * hp``) above 128: there
    tileiras 13.4 spills the kernel's loop (sm_90 N = 256: 1,200 local loads and stores; sm_100 spills or fails at
    2-D lengths, ``tests/compile_gate/test_compile_mqa.py``)."""
    if sm != 90 or base.rg * base.hp > 128:
        return None
    blocks = max(1, batch) * (base.nnp // base.rg)
    chunks = max(1, -(-width // base.ck))
    parts = max(1, min(chunks, MQA_DECODE_CTAS_PER_SM * sms // blocks))
    return replace(base, parts=parts)


#: Names the MQA-logits kernel of every ``fp8_mqa_logits`` / ``bf16_mqa_logits`` call (benchmarks, tests): ``plain``
#: (one CTA per block of query rows) or ``decode`` (the keys of each block of query rows split over the SMs,
#: :func:`mqa_decode_config`); unset, :func:`takes_mqa_decode` chooses.
MQA_VARIANT_ENV = MQA_VARIANT
MQA_VARIANTS = ("plain", "decode")
#: Keys per tile of the decode kernel, and the CTAs per SM its split aims at (the plain kernel's two).
MQA_DECODE_BK = 128
MQA_DECODE_CTAS_PER_SM = 2
#: The decode kernel's least MMA N side (query rows x padded heads).
MQA_DECODE_MIN_N = 64
#: The calls the decode kernel takes unforced on Hopper: decode steps (up to DeepGEMM's ``next_n`` of 4 query rows)
#: over at least this many keys, where it was measured faster than the plain kernel and than torch's matmul
#: (benchmarks/results/indexer/decode_h200.md).
MQA_DECODE_MAX_ROWS = 4
MQA_DECODE_MIN_KEYS = 4096


def decode_sized(rows: int, keys: int, sm: int = 90) -> bool:
    """Whether a call of ``rows`` query rows over ``keys`` keys on an sm_``sm`` GPU is a decode step the decode kernel
    takes unforced (measured on Hopper only)."""
    return sm == 90 and rows <= MQA_DECODE_MAX_ROWS and keys >= MQA_DECODE_MIN_KEYS


def takes_mqa_decode(rows: int, keys: int, base: MqaConfig, sms: int, variant: str | None, sm: int = 90) -> bool:
    """Whether a plain MQA-logits call of ``rows`` query rows over ``keys`` keys runs the decode kernel: never where
    the plain kernel's grid (``ceil(rows / bq)`` CTAs) already fills the ``sms`` SMs; else where ``variant``
    (``$TILEGEMM_MQA_VARIANT`` or a caller's explicit choice) is ``decode``, and unforced for :func:`decode_sized`
    calls."""
    choice = forced(variant, MQA_VARIANTS, MQA_VARIANT_ENV)
    if choice == "plain" or -(-rows // base.bq) >= sms:
        return False
    return choice == "decode" or decode_sized(rows, keys, sm)


def mqa_decode_config(base: MqaConfig, rows: int, keys: int, sms: int, sm: int = 90, sequences: int = 1) -> MqaConfig:
    """The decode kernel's config (``path="decode"``) from the plain config ``base`` of the same heads and dtype.

    ``bq``: the query rows rounded up to a power of two, at most ``base.bq`` (one row at H = 64: an MMA N side of
    64, not 128 half empty), and at least an N side of :data:`MQA_DECODE_MIN_N` (few heads: zero rows pad it; at
    an N side of 4 tileiras 13.4 emits no tensor-core MMA). ``parts``: CTAs per block of rows, each taking every
    ``parts``-th key tile of the rows' window (the paged kernel's round-robin split), enough for
    :data:`MQA_DECODE_CTAS_PER_SM` CTAs per SM over the row blocks of all ``sequences`` (the batched kernel's) and at
    most one per key tile. One key tile per iteration, no latency hint, checked stores.
    """
    bq = min(base.bq, max(_mqa_pow2_ceil(max(1, rows)), MQA_DECODE_MIN_N // base.hp))
    blocks = max(1, sequences) * -(-max(1, rows) // bq)
    tiles = max(1, -(-keys // MQA_DECODE_BK))
    parts = max(1, min(tiles, -(-MQA_DECODE_CTAS_PER_SM * sms // blocks)))
    return MqaConfig(
        bq=bq,
        hp=base.hp,
        bk=MQA_DECODE_BK,
        head_chain=_head_chain(sm, bq * base.hp),
        occupancy=MQA_DECODE_CTAS_PER_SM,
        path="decode",
        parts=parts,
    )


def plain_mqa_config(
    h: int,
    d: int,
    rows: int,
    keys: int,
    sms: int,
    sm: int = 90,
    bf16: bool = False,
    variant: str | None = None,
    sequences: int = 1,
) -> MqaConfig | None:
    """The config of one ``fp8_mqa_logits`` (``bf16``: ``bf16_mqa_logits``) call of ``rows`` query rows and ``keys``
    keys on ``sms`` SMs: :func:`mqa_decode_config` where :func:`takes_mqa_decode`, else
    :func:`mqa_logits_config` / :func:`bf16_mqa_logits_config`; ``None`` if unsupported. ``sequences``: a batched
    call's (``mqa_logits_batched``), each of ``rows`` rows over its own ``keys`` keys; the decode kernel's ``parts``
    then spread all of them over the SMs."""
    base = bf16_mqa_logits_config(h, d, sm) if bf16 else mqa_logits_config(h, d, sm)
    if base is None or not takes_mqa_decode(rows, keys, base, sms, variant, sm):
        return base
    return mqa_decode_config(base, rows, keys, sms, sm, sequences)


# ---------------------------------------------------------------- operands of the MQA ops (``ops/cutile/mqa_prep.py``)

#: The longest row ``fp8_quantize_rows`` / ``fp8_paged_append`` cast on the GPU (padded to a power of two).
FP8_ROWS_MAX_COLS = 1024
#: The longest row they rotate first (the ``[D, D]`` +-1 matrix is one shared-memory tile): DeepSeek's head size.
FP8_ROWS_MAX_HADAMARD = 128
#: fp32 elements of a row tile at most (16 a thread of the kernels' four warps).
FP8_ROWS_TILE_ELEMS = 2048
#: Rows a CTA of the row kernels: each CTA's rows cost it their scatter (the append writes element by element,
#: bounds-checked) and their casts, while a decode step brings 64 query rows and one key a sequence. sm_90 SASS of
#: the 128-wide bf16 rotated append: 2136 instructions at 16 rows (mma.sync), 5928 at 64 (wgmma), and one append
#: took 12.3 us at 64 rows on an H200 (``benchmarks/results/indexer/``).
FP8_ROWS = 16
#: Batches per step of the schedule kernel's walk: with 256 SM lanes a ``[256, 16]`` int32 comparison tile (at 32
#: the sm_90 kernel spills 9 words; the compile gate ``test_compile_mqa_prep.py`` holds it).
SCHEDULE_CHUNK = 16

#: Mask elements a CTA of the prepare kernel's mask reduction reads (one load; 64 a thread of its four warps).
PREPARE_MASK_TILE_ELEMS = 8192
#: Query rows of a sequence such a CTA reads at most (a decode step's rows: ``indexer_mask.DECODE_WINDOW_ROWS``).
PREPARE_MASK_MAX_ROWS = 4

_BF16_PARTS = {"torch.bfloat16": 1, "torch.float16": 2, "torch.float32": 3}


def prepare_mask_tile(rows: int) -> tuple[int, int]:
    """The ``[rows, keys]`` mask tile of one CTA of ``fp8_indexer_prepare``'s mask reduction, for calls of ``rows``
    query rows a sequence: the rows as a power of two up to :data:`PREPARE_MASK_MAX_ROWS`, and the keys that fill
    :data:`PREPARE_MASK_TILE_ELEMS`. ``fp8_indexer_prepare`` spreads a sequence's mask over its tiles' CTAs (one
    load each; the row maxima stored where one tile spans the keys, else combined by atomics), so a mask of 64k keys
    takes no longer to reduce than a 4k one; ``indexer_decode_prepare`` reads a row block's tiles in turn in one CTA
    (no atomics), so its time grows with the keys."""
    tile_rows = min(PREPARE_MASK_MAX_ROWS, 1 << max(0, rows - 1).bit_length())
    return tile_rows, PREPARE_MASK_TILE_ELEMS // tile_rows


@dataclass(frozen=True)
class Fp8RowsConfig:
    """The row tile of the FP8 row kernels: ``rows`` x ``cols`` (the row length padded to a power of two, at least
    16: the rotation MMA's K), and ``splits``, the bf16 parts a row is split into for the rotation's MMA
    (1 for bf16 rows, 2 for fp16, 3 for fp32: each part exact)."""

    rows: int
    cols: int
    splits: int


def fp8_rows_config(dim: int, dtype) -> Fp8RowsConfig | None:
    """The tile for rows of ``dim`` elements of ``dtype`` (a torch float dtype); ``None`` past the kernels' rows:
    :data:`FP8_ROWS` rows a CTA, the row padded to a power of two (at least 16, the MMA's K), up to
    :data:`FP8_ROWS_MAX_COLS`. Whether a row can be rotated (a power of two up to :data:`FP8_ROWS_MAX_HADAMARD`) is
    the host's check. Measured on the indexer's rows only (128 bf16 elements; ``benchmarks/results/indexer/``)."""
    splits = _BF16_PARTS.get(str(dtype))
    if splits is None or not 1 <= dim <= FP8_ROWS_MAX_COLS:
        return None
    cols = max(16, 1 << (dim - 1).bit_length())
    return Fp8RowsConfig(rows=max(1, min(FP8_ROWS, FP8_ROWS_TILE_ELEMS // cols)), cols=cols, splits=splits)
