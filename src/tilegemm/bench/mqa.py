"""FP8 MQA logits (DeepSeek sparse-attention indexer): ``tilegemm.fp8_mqa_logits`` and ``fp8_paged_mqa_logits``.

Plain: ``q`` fp8 ``[S, H, D]``, keys quantized per token, fp32 weights, causal windows (the S queries
are the last S of S_kv tokens: ``ks = 0``, ``ke = S_kv - S + i + 1``), defaults (``clean_logits=True``).
Paged: ``B`` sequences of ``avg * U(0.7, 1.3)`` keys in a shuffled 64-token-block cache (DeepGEMM's
byte layout, shared by both libraries), ``context_lens [B, next_n]`` (row t of batch b sees
``len_b - next_n + t + 1`` keys; DeepGEMM 2.6 takes only this 2-D form), each library's own schedule metadata
computed once outside the timing, ``clean_logits=False`` for both (DeepGEMM's default).

Indexer rows (``kind: "indexer"``): the sparse-attention indexers' real sizes (DeepSeek-V3.2: H = 64, GLM-5: H = 32;
D = 128), causal prefill over the whole context (S = S_kv = 4k, 16k, 64k) and one decode query (S = 1) over 4k-64k
keys, in ``bf16`` (``bf16_mqa_logits``, what the patched indexers run by default) and ``fp8`` (``fp8_mqa_logits``,
their ``fp8=True`` recipe). The peer ``transformers`` is the stock indexers' formula (``relu(q.float() @ k.float().T)``
materialized as ``[S, H, S_kv]`` fp32, then the weighted sum over heads): it cannot run where that tensor passes
:data:`STOCK_LIMIT_BYTES` (the row says so).

The peer is DeepGEMM (``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``). TFLOP/s count the valid
(query, key) pairs (``2 * pairs * H * D``). ``calc_diff`` is over the valid logits of a sample of
query rows (the float64 formula over all rows would take minutes at S_kv = 65536), and the plain
rows also check that the ``-inf`` masks are identical on those rows.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from tilegemm.bench import inputs, timing
from tilegemm.bench.core import Built, Case, Impl

FAMILY = "mqa"
PLAIN_QUICK = [(2048, 8192, 64, 128)]
PLAIN_FULL = list(
    dict.fromkeys(
        [(2048, 8192, 32, 128), (4096, 65536, 64, 128), (2048, 8192, 64, 64), (2048, 8192, 64, 32)]
        + [(s, skv, h, 128) for s in (2048, 8192) for skv in (8192, 65536) for h in (32, 64)]
    )
)
PAGED_QUICK = [(64, 1, 8192)]
PAGED_FULL = [(b, nn, avg) for b in (64, 256) for avg in (8192, 32768) for nn in (1, 2)]
PAGED_H, PAGED_D, BLOCK_KV = 64, 128, 64
SAMPLE_ROWS = 64
#: Indexer rows (S, S_kv, H) of a full run, each in bf16 and fp8 (D = 128); the quick run has the first in bf16.
INDEXER_FULL = [(4096, 4096, 64), (16384, 16384, 64), (65536, 65536, 64), (16384, 16384, 32)] + [
    (1, skv, 64) for skv in (4096, 16384, 65536)
]
INDEXER_D = 128
#: Largest ``[S, H, S_kv]`` fp32 score tensor the stock-formula peer materializes.
STOCK_LIMIT_BYTES = 24 << 30


def specs(size: str) -> list[dict[str, Any]]:
    """Rows of a ``quick`` or ``full`` run: plain ``{"kind": "plain", S, S_kv, H, D}`` and paged ones."""

    def plain(shapes):
        return [{"kind": "plain", "S": s, "S_kv": skv, "H": h, "D": d} for s, skv, h, d in shapes]

    def paged(shapes):
        return [
            {"kind": "paged", "B": b, "next_n": nn, "avg_ctx": avg, "H": PAGED_H, "D": PAGED_D} for b, nn, avg in shapes
        ]

    def indexer(rows):
        return [{"kind": "indexer", "dtype": dt, "S": s, "S_kv": skv, "H": h, "D": INDEXER_D} for dt, s, skv, h in rows]

    indexer_quick = [("bf16", *INDEXER_FULL[0])]
    out = plain(PLAIN_QUICK) + paged(PAGED_QUICK) + indexer(indexer_quick)
    if size != "quick":
        out += plain([p for p in PLAIN_FULL if p not in PLAIN_QUICK])
        out += paged([p for p in PAGED_FULL if p not in PAGED_QUICK])
        rows = [(dt, *r) for r in INDEXER_FULL for dt in ("bf16", "fp8")]
        out += indexer([r for r in rows if r not in indexer_quick])
    return out


def case(spec: dict[str, Any], dg: Any = None, dg_reason: str = "DeepGEMM not loaded") -> Case:
    """The benchmark row of one spec."""
    if spec["kind"] == "indexer":
        return _indexer_case(spec, dg, dg_reason)
    if spec["kind"] == "plain":
        s, skv, h, d = spec["S"], spec["S_kv"], spec["H"], spec["D"]
        pairs = sum(skv - s + i + 1 for i in range(s))
        nbytes = s * h * d + skv * (d + 4) + 4.0 * s * h + 8.0 * s + 4.0 * s * skv
        shape = {"S": s, "S_kv": skv, "H": h, "D": d, "pairs": pairs}
        build = lambda: _build_plain(s, skv, h, d, dg, dg_reason)  # noqa: E731
        return Case(FAMILY, "fp8_mqa_logits", "fp8", shape, 2.0 * pairs * h * d, nbytes, build, bar=1e-6)
    b, nn, avg = spec["B"], spec["next_n"], spec["avg_ctx"]
    lens = paged_lens(b, avg, inputs.seed_of("paged", b, nn, avg))
    pairs = sum(max(0, ctx - nn + t + 1) for ctx in lens for t in range(nn))
    width = -(-max(lens) // BLOCK_KV) * BLOCK_KV
    nbytes = sum(lens) * (PAGED_D + 4) + b * nn * PAGED_H * (PAGED_D + 4) + 4.0 * b * nn * width
    shape = {"B": b, "next_n": nn, "avg_ctx": avg, "H": PAGED_H, "D": PAGED_D, "pairs": pairs}
    build = lambda: _build_paged(b, nn, lens, dg, dg_reason)  # noqa: E731
    settings = {"clean_logits": False, "block_kv": BLOCK_KV}
    return Case(
        FAMILY,
        "fp8_paged_mqa_logits",
        "fp8",
        shape,
        2.0 * pairs * PAGED_H * PAGED_D,
        nbytes,
        build,
        settings=settings,
        bar=1e-6,
    )


def _indexer_case(spec: dict[str, Any], dg: Any, dg_reason: str) -> Case:
    """An indexer row: causal windows (the S queries are the last S of S_kv tokens)."""
    dt, s, skv, h, d = spec["dtype"], spec["S"], spec["S_kv"], spec["H"], spec["D"]
    pairs = sum(skv - s + i + 1 for i in range(s))
    elem = 2 if dt == "bf16" else 1
    nbytes = elem * (s * h * d + skv * d) + 4.0 * (s * h + skv) + 8.0 * s + 4.0 * s * skv
    shape = {"S": s, "S_kv": skv, "H": h, "D": d, "pairs": pairs}
    op = "bf16_mqa_logits" if dt == "bf16" else "fp8_mqa_logits"
    build = lambda: _build_indexer(dt, s, skv, h, d, dg, dg_reason)  # noqa: E731
    return Case(FAMILY, op, dt, shape, 2.0 * pairs * h * d, nbytes, build, settings={"kind": "indexer"}, bar=1e-6)


def stock_indexer_logits(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, ks, ke) -> torch.Tensor:
    """The stock transformers indexers' scoring on one sequence: ``[S, H, S_kv]`` fp32 scores materialized, relu,
    weighted head sum; ``-inf`` outside the windows. ``q`` [S, H, D], ``keys`` [S_kv, D], ``w`` fp32 [S, H]."""
    scores = torch.relu(torch.matmul(q.float(), keys.float().t().unsqueeze(0)))  # [S, H, S_kv]
    logits = torch.matmul(w.float().unsqueeze(1), scores).squeeze(1)
    cols = torch.arange(keys.shape[0], device=q.device)
    return logits.masked_fill_((cols < ks[:, None]) | (cols >= ke[:, None]), float("-inf"))


def _build_indexer(dt: str, s: int, skv: int, h: int, d: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm import indexer
    from tilegemm.testing import calc_diff

    seed = inputs.seed_of("mqa-indexer", dt, s, skv, h, d)
    ks, ke = indexer.causal_windows(s, skv, device=timing.DEVICE)
    keys = inputs.randn((skv, d), torch.bfloat16, seed)
    q_src = inputs.randn((s, h, d), torch.bfloat16, seed + 1)
    w = inputs.randn((s, h), torch.float32, seed + 2)
    rows = _sample(s)
    crop = lambda out, *args: out[rows]  # noqa: E731
    if dt == "bf16":
        ours = Impl("tilegemm", [(q_src, keys, w)], lambda q, k, x: tilegemm.bf16_mqa_logits(q, k, x, ks, ke), crop)
        ref_q, ref_keys, ref_scale, ref_w = q_src, keys, torch.ones(skv, device=timing.DEVICE), w
    else:
        kv = indexer.quantize_keys(keys)
        q8 = q_src.to(torch.float8_e4m3fn)
        ours = Impl("tilegemm", [(q8, kv, w)], lambda q, k, x: tilegemm.fp8_mqa_logits(q, k, x, ks, ke), crop)
        ref_q, ref_keys, ref_scale, ref_w = q8, kv[0], kv[1], w
    impls = [ours]
    if dg is None:
        impls.append(Impl("deepgemm", dg_reason, None))
    elif dt == "bf16":
        impls.append(Impl("deepgemm", "DeepGEMM 2.6 has no BF16 MQA logits", None))
    else:
        theirs = dg.utils.per_custom_dims_cast_to_fp8(keys, (0,), False)
        note = None if inputs.same_inputs(kv, theirs) else "DeepGEMM's key cast differs from tilegemm's"
        dg_call = lambda q, k, x: dg.fp8_mqa_logits(q, k, x, ks, ke)  # noqa: E731
        impls.append(Impl("deepgemm", [(q8, theirs, w)], dg_call, crop, note=note))
    stock_bytes = 4 * s * h * skv
    if dt == "bf16" and stock_bytes <= STOCK_LIMIT_BYTES:
        call = lambda q, k, x: stock_indexer_logits(q, k, x, ks, ke)  # noqa: E731
        impls.append(Impl("transformers", [(q_src, keys, w)], call, crop, note="stock [S, H, S_kv] fp32 formula"))
    elif dt == "bf16":
        impls.append(
            Impl("transformers", f"would materialize {stock_bytes / 2**30:.0f} GiB of [S, H, S_kv] scores", None)
        )

    def check(out: torch.Tensor) -> dict[str, Any]:
        ref = torch.full((len(rows), skv), float("-inf"), dtype=torch.float64, device=timing.DEVICE)
        for r, i in enumerate(rows.tolist()):
            lo, hi = int(ks[i]), int(ke[i])
            ref[r, lo:hi] = _logits64(ref_q[i], ref_keys[lo:hi], ref_scale[lo:hi], ref_w[i])
        valid = torch.isfinite(ref)
        same_mask = bool(torch.equal(torch.isneginf(out), ~valid))
        return {"calc_diff": calc_diff(out[valid], ref[valid]), "same_inf_mask": same_mask, "ok": same_mask}

    return Built(impls, check)


def paged_lens(batch: int, avg: int, seed: int) -> list[int]:
    """Context lengths ``int(avg * U(0.7, 1.3))`` per sequence."""
    rng = random.Random(seed)
    return [int(avg * rng.uniform(0.7, 1.3)) for _ in range(batch)]


def _sample(n: int) -> torch.Tensor:
    return torch.linspace(0, n - 1, min(n, SAMPLE_ROWS), device=timing.DEVICE).round().long().unique()


def _logits64(q: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Float64 ``scale[j] * sum_h w[h] * relu(q[h] . keys[j])`` for one query row: q [H, D], keys [L, D]."""
    return (w.double() @ torch.relu(q.double() @ keys.double().t())) * scale.double()


def _build_plain(s: int, skv: int, h: int, d: int, dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm import indexer
    from tilegemm.testing import calc_diff

    seed = inputs.seed_of("mqa", s, skv, h, d)
    ks, ke = indexer.causal_windows(s, skv, device=timing.DEVICE)
    kv_src = inputs.randn((skv, d), torch.bfloat16, seed)
    kv = indexer.quantize_keys(kv_src)
    nsets = timing.rotation_count(s * h * d + skv * (d + 4) + 4 * s * h)
    qs = [inputs.randn((s, h, d), torch.bfloat16, seed + 1 + i).to(torch.float8_e4m3fn) for i in range(nsets)]
    ws = [inputs.randn((s, h), torch.float32, seed + 101 + i) for i in range(nsets)]
    rows = _sample(s)
    crop = lambda out, *args: out[rows]  # noqa: E731
    impls = [
        Impl(
            "tilegemm",
            [(q, kv, w) for q, w in zip(qs, ws)],
            lambda q, k, w: tilegemm.fp8_mqa_logits(q, k, w, ks, ke),
            crop,
        )
    ]
    if dg:
        theirs = dg.utils.per_custom_dims_cast_to_fp8(kv_src, (0,), False)
        note = None if inputs.same_inputs(kv, theirs) else "DeepGEMM's key cast differs from tilegemm's"
        call = lambda q, k, w: dg.fp8_mqa_logits(q, k, w, ks, ke)  # noqa: E731
        impls.append(Impl("deepgemm", [(q, theirs, w) for q, w in zip(qs, ws)], call, crop, note=note))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))

    def check(out: torch.Tensor) -> dict[str, Any]:
        ref = torch.full((len(rows), skv), float("-inf"), dtype=torch.float64, device=timing.DEVICE)
        for r, i in enumerate(rows.tolist()):
            lo, hi = int(ks[i]), int(ke[i])
            ref[r, lo:hi] = _logits64(qs[0][i], kv[0][lo:hi], kv[1][lo:hi], ws[0][i])
        valid = torch.isfinite(ref)
        same_mask = bool(torch.equal(torch.isneginf(out), ~valid))
        return {"calc_diff": calc_diff(out[valid], ref[valid]), "same_inf_mask": same_mask, "ok": same_mask}

    return Built(impls, check)


def _paged_cache(lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A shuffled paged cache of random FP8 keys and positive scales, and its block table."""
    g = torch.Generator(device=timing.DEVICE).manual_seed(seed)
    per_seq = [-(-n // BLOCK_KV) for n in lens]
    num_blocks = sum(per_seq)
    row_bytes = BLOCK_KV * (PAGED_D + 4)
    cache = torch.empty(num_blocks, row_bytes, dtype=torch.uint8, device=timing.DEVICE)
    keys = torch.randn(num_blocks, BLOCK_KV * PAGED_D, device=timing.DEVICE, generator=g).to(torch.float8_e4m3fn)
    cache[:, : BLOCK_KV * PAGED_D] = keys.view(torch.uint8)
    scales = torch.rand(num_blocks, BLOCK_KV, device=timing.DEVICE, generator=g) * 0.01 + 0.001
    cache[:, BLOCK_KV * PAGED_D :] = scales.view(torch.uint8)
    perm = torch.randperm(num_blocks, device=timing.DEVICE, generator=g).to(torch.int32)
    table = torch.zeros(len(lens), max(per_seq), dtype=torch.int32, device=timing.DEVICE)
    start = 0
    for b, nb in enumerate(per_seq):
        table[b, :nb] = perm[start : start + nb]
        start += nb
    return cache.view(num_blocks, BLOCK_KV, 1, PAGED_D + 4), table


def _build_paged(batch: int, next_n: int, lens: list[int], dg: Any, dg_reason: str) -> Built:
    import tilegemm
    from tilegemm import indexer
    from tilegemm.testing import calc_diff

    seed = inputs.seed_of("paged", batch, next_n, sum(lens))
    cache, table = _paged_cache(lens, seed)
    # [B, next_n] lengths (row t of batch b sees keys j < lens[b] - next_n + t + 1): the form both libraries take
    steps = torch.arange(next_n, dtype=torch.int32, device=timing.DEVICE)
    ctx = (torch.tensor(lens, dtype=torch.int32, device=timing.DEVICE)[:, None] - next_n + 1 + steps).contiguous()
    width = -(-max(lens) // BLOCK_KV) * BLOCK_KV
    q = inputs.randn((batch, next_n, PAGED_H, PAGED_D), torch.bfloat16, seed + 1).to(torch.float8_e4m3fn)
    w = inputs.randn((batch * next_n, PAGED_H), torch.float32, seed + 2)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if timing.DEVICE == "cuda" else 8
    meta = tilegemm.get_paged_mqa_logits_metadata(ctx, BLOCK_KV, sms)
    rows = _sample(batch * next_n)
    crop = lambda out, *args: out[rows]  # noqa: E731
    call = lambda: tilegemm.fp8_paged_mqa_logits(q, cache, w, ctx, table, meta, width, clean_logits=False)  # noqa: E731
    impls = [Impl("tilegemm", [()], call, crop)]
    if dg:
        dg_meta = dg.get_paged_mqa_logits_metadata(ctx, BLOCK_KV, dg.get_num_sms())
        dg_call = lambda: dg.fp8_paged_mqa_logits(q, cache, w, ctx, table, dg_meta, width, clean_logits=False)  # noqa: E731
        impls.append(Impl("deepgemm", [()], dg_call, crop))
    else:
        impls.append(Impl("deepgemm", dg_reason, None))

    def check(out: torch.Tensor) -> dict[str, Any]:
        batches = sorted({int(r) // next_n for r in rows.tolist()})
        lens_t = torch.tensor([lens[b] for b in batches], dtype=torch.int32)
        keys = dict(zip(batches, indexer.read_paged_kv_cache(cache, table[batches], lens_t)))
        got, want = [], []
        for r_i, r in enumerate(rows.tolist()):
            b, t = divmod(r, next_n)
            visible = max(0, lens[b] - next_n + t + 1)
            data, scale = keys[b]
            want.append(_logits64(q[b, t], data[:visible], scale[:visible], w[r]))
            got.append(out[r_i, :visible])
        return {"calc_diff": calc_diff(torch.cat(got), torch.cat(want))}

    return Built(impls, check)
