"""CPU compile gate for the kernels that make the MQA ops' FP8 operands (``ops/cutile/mqa_prep.py``), sm_90 and sm_100.

Every row kernel the indexer launches (``fp8_quantize_rows``, ``fp8_paged_append`` and ``fp8_indexer_prepare`` on
128-wide bf16 rows, rotated or not), the other float dtypes (their bf16 parts: 2 and 3 MMAs), the narrowest rotated
rows (16 columns), the longest plain rows, the decode-prepare kernel (no mask, a boolean one at one row, an
additive one at three), and the schedule kernel at one and two query rows. Each is compiled with
``export_kernel`` (no GPU) and its SASS checked: no LDL/STL spills; the rotation on the tensor cores (sm_90: ``HMMA``
m16n8k16, one per 16 of K and 8 columns over four warps and per bf16 part; the prepare kernel's two branches each),
none without it.
"""

from __future__ import annotations

import pytest

ct = pytest.importorskip("cuda.tile")
torch = pytest.importorskip("torch")

from compile_gate.sass import compile_all, dump_sass, opcode_counts, sass_summary  # noqa: E402
from tilegemm.heuristics import cutile as heuristics  # noqa: E402
from tilegemm.ops.cutile import aot, mqa_prep  # noqa: E402

ARCHS = aot.ARCHS
_F32 = aot.scalar(ct.float32)
_CT_DTYPES = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16, torch.float32: ct.float32}


def _rows_params(dim: int, dtype: torch.dtype, hadamard: bool) -> tuple[heuristics.Fp8RowsConfig, list]:
    cfg = heuristics.fp8_rows_config(dim, dtype)
    arrays = [aot.array(_CT_DTYPES[dtype], 2), aot.array(ct.bfloat16, 2)]
    arrays += [aot.array(ct.float8_e4m3fn, 2), aot.array(ct.float32, 1)]
    return cfg, [*arrays, _F32, *mqa_prep.rows_constants(cfg, hadamard)]


def _append_params(dim: int, dtype: torch.dtype, hadamard: bool, lens: ct.DType, per_sequence: bool):
    cfg = heuristics.fp8_rows_config(dim, dtype)
    arrays = [aot.array(_CT_DTYPES[dtype], 3), aot.array(ct.bfloat16, 2), aot.array(lens, 1)]
    arrays += [aot.array(ct.int32, 2), aot.array(ct.float8_e4m3fn, 3), aot.array(ct.float32, 2)]
    return cfg, [*arrays, _F32, *mqa_prep.rows_constants(cfg, hadamard, per_sequence, 64)]


#: The prepare kernel's mask arrays by ``MASK``: none (a placeholder), boolean (read as uint8), additive (bf16).
_MASK_DTYPES = {mqa_prep.MASK_NONE: ct.uint8, mqa_prep.MASK_BOOL: ct.uint8, mqa_prep.MASK_ADDITIVE: ct.bfloat16}
_MASK_NAMES = {mqa_prep.MASK_NONE: "none", mqa_prep.MASK_BOOL: "bool", mqa_prep.MASK_ADDITIVE: "additive"}


def _prepare_params(
    dim: int, dtype: torch.dtype, hadamard: bool, per_sequence: bool, mask: int = 0, rows: int = 1, keys: int = 4097
):
    """The indexer-prepare kernel's parameters: query rows ``[B, S * H, D]`` and weights, then the append's, then the
    outputs (queries and weights of one dtype, int32 lengths), the mask and its ends (a decode step's mask of
    ``keys`` keys; 4097: rows not 16-byte aligned)."""
    cfg = heuristics.fp8_rows_config(dim, dtype)
    elem = _CT_DTYPES[dtype]
    arrays = [aot.array(elem, 3), aot.array(ct.float32, 2, align_bytes=4), aot.array(elem, 3)]
    arrays += [aot.array(ct.bfloat16, 2), aot.array(ct.int32, 1), aot.array(ct.int32, 2)]
    arrays += [aot.array(ct.float8_e4m3fn, 3), aot.array(ct.float32, 2)]
    arrays += [aot.array(ct.float8_e4m3fn, 3), aot.array(ct.float32, 2, align_bytes=4)]
    arrays += [aot.array(_MASK_DTYPES[mask], 3, align_bytes=1), aot.array(ct.int32, 2, align_bytes=4)]
    consts = mqa_prep.prepare_constants(cfg, cfg, hadamard, per_sequence, 64, mask, rows, keys)
    return cfg, [*arrays, _F32, _F32, _F32, *consts]


#: The prepare kernel's masks compiled here, ``(MASK, rows, keys)``: its ends stored (one tile spans the keys) or
#: combined by atomics (``mqa_prep.ends_stored``).
_PREPARE_MASKS = [
    (mqa_prep.MASK_BOOL, 1, 4097),
    (mqa_prep.MASK_ADDITIVE, 1, 4097),
    (mqa_prep.MASK_BOOL, 1, 70000),
    (mqa_prep.MASK_ADDITIVE, 3, 4097),
    (mqa_prep.MASK_BOOL, 3, 2048),
]


def _decode_prepare_params(mask: int, rows: int, heads: int = 64) -> list:
    """The decode-prepare kernel's parameters: fp32 weights ``[B, S, H]``, the mask (rows of 4097: not 16-byte
    aligned), the fp32 weights out, the int32 ends, the scale and the mask's lowest value."""
    arrays = [aot.array(ct.float32, 3, align_bytes=4), aot.array(_MASK_DTYPES[mask], 3, align_bytes=1)]
    arrays += [aot.array(ct.float32, 3, align_bytes=4), aot.array(ct.int32, 2, align_bytes=4)]
    return [*arrays, _F32, _F32, *mqa_prep.decode_prepare_constants(heads, rows, mask)]


def _schedule_params(next_n: int, num_sms: int) -> list:
    return [aot.array(ct.int32, 2), aot.array(ct.int32, 2), *mqa_prep.schedule_constants(64, next_n, num_sms)]


def _variants():
    """(id, kernel name, config or None, hadamard, params) of every variant compiled here."""
    out = []
    for dim, dtype, hadamard in [
        (128, torch.bfloat16, True),
        (128, torch.bfloat16, False),
        (128, torch.float16, True),
        (128, torch.float32, True),
        (16, torch.bfloat16, True),
        (heuristics.FP8_ROWS_MAX_COLS, torch.float32, False),
    ]:
        cfg, params = _rows_params(dim, dtype, hadamard)
        out.append(
            (f"rows-{str(dtype)[6:]}-d{dim}-{'h' if hadamard else 'plain'}", "quantize_rows", cfg, hadamard, params)
        )
    for lens, per_sequence in [(ct.int64, False), (ct.int32, True)]:
        cfg, params = _append_params(128, torch.bfloat16, True, lens, per_sequence)
        vid = f"append-bf16-d128-h-{'per-seq' if per_sequence else 'one-length'}"
        out.append((vid, "paged_append", cfg, True, params))
    cfg, params = _append_params(128, torch.bfloat16, False, ct.int32, True)
    out.append(("append-bf16-d128-plain", "paged_append", cfg, False, params))
    for hadamard, per_sequence in [(True, True), (True, False), (False, True)]:
        cfg, params = _prepare_params(128, torch.bfloat16, hadamard, per_sequence)
        vid = f"prepare-bf16-d128-{'h' if hadamard else 'plain'}-{'per-seq' if per_sequence else 'one-length'}"
        out.append((vid, "indexer_prepare", cfg, hadamard, params))
    for mask, rows, keys in _PREPARE_MASKS:
        cfg, params = _prepare_params(128, torch.bfloat16, True, True, mask, rows, keys)
        vid = f"prepare-bf16-d128-h-mask-{_MASK_NAMES[mask]}-s{rows}-t{keys}"
        out.append((vid, "indexer_prepare", cfg, True, params))
    for mask, rows in [(mqa_prep.MASK_BOOL, 1), (mqa_prep.MASK_ADDITIVE, 3), (mqa_prep.MASK_NONE, 1)]:
        params = _decode_prepare_params(mask, rows)
        out.append((f"decode-prepare-{_MASK_NAMES[mask]}-s{rows}", "decode_prepare", None, False, params))
    for next_n, sms in [(1, 132), (2, 78)]:
        out.append((f"schedule-n{next_n}-sms{sms}", "paged_schedule", None, False, _schedule_params(next_n, sms)))
    return out


VARIANTS = _variants()


def _summary(cubin: bytes) -> dict[str, int]:
    """``sass_summary`` and the global atomics (``ATOMG``, ``RED``, ``REDG``)."""
    ops = opcode_counts(dump_sass(cubin))
    atomics = sum(n for op, n in ops.items() if op.split(".")[0] in ("ATOMG", "RED", "REDG"))  # not REDUX (warp)
    return {**sass_summary(cubin), "atomics": atomics}


@pytest.fixture(scope="module")
def compiled():
    jobs = [(v[0], mqa_prep.get_kernel(v[1]), v[4], arch) for v in VARIANTS for arch in ARCHS]
    return compile_all(jobs, aot.compile_cubin, _summary)


def test_configs_cover_the_rows():
    """Rows of 1 to the limit get a tile: ``FP8_ROWS`` rows of 16 to 128 columns, the row padded to a power of two
    (at least 16), within the tile's elements; bf16 parts by dtype; nothing past the limit or for a non-float
    dtype."""
    for dim in (1, 2, 8, 16, 64, 100, 128, 1000, heuristics.FP8_ROWS_MAX_COLS):
        cfg = heuristics.fp8_rows_config(dim, torch.float32)
        assert dim <= cfg.cols < max(32, 2 * dim) and cfg.rows * cfg.cols <= heuristics.FP8_ROWS_TILE_ELEMS
        assert cfg.rows == (heuristics.FP8_ROWS if cfg.cols <= 128 else heuristics.FP8_ROWS_TILE_ELEMS // cfg.cols)
    assert heuristics.fp8_rows_config(heuristics.FP8_ROWS_MAX_COLS + 1, torch.float32) is None
    assert [heuristics.fp8_rows_config(128, d).splits for d in _CT_DTYPES] == [1, 2, 3]
    assert (
        heuristics.fp8_rows_config(128, torch.int32) is None and heuristics.fp8_rows_config(0, torch.bfloat16) is None
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vid", [v[0] for v in VARIANTS])
def test_mqa_prep_kernel_sass(compiled, vid, arch):
    s = compiled[(vid, arch)]
    if isinstance(s, Exception):
        raise s
    assert s["ldl"] == 0 and s["stl"] == 0, f"{vid} {arch}: spills {s['ldl']} LDL / {s['stl']} STL"
    _, _, cfg, hadamard, _ = next(v for v in VARIANTS if v[0] == vid)
    if arch == "sm_90" and cfg is not None and cfg.cols >= 64:
        # mma.sync m16n8k16 over the CTA's four warps: per 16 of K, 8 columns and bf16 part (16 rows: one M block)
        want = cfg.splits * (cfg.cols // 16) * (cfg.cols // 8) // 4 if hadamard else 0
        want *= 2 if vid.startswith("prepare") else 1  # its two branches: query rows, key rows
        assert s["hmma"] == want and s["hgmma"] == 0, f"{vid}: {s['hmma']} HMMA, {s['hgmma']} HGMMA, expected {want}"


@pytest.mark.parametrize("mask,rows,keys", _PREPARE_MASKS)
def test_prepare_ends_stored_or_combined(compiled, mask, rows, keys):
    """The prepare kernel stores each window end where one mask tile spans the keys (no atomics: its ends need no
    zeroing) and combines the tiles' ends by atomics otherwise (the max's ``ATOMG``/``RED``: sm_90 and sm_100)."""
    stored = mqa_prep.ends_stored(mask, rows, keys)
    assert stored == (keys <= heuristics.prepare_mask_tile(rows)[1])
    for arch in ARCHS:
        s = compiled[(f"prepare-bf16-d128-h-mask-{_MASK_NAMES[mask]}-s{rows}-t{keys}", arch)]
        assert (s["atomics"] == 0) == stored, f"{arch}: {s['atomics']} global atomics, ends stored: {stored}"
