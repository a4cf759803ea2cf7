"""Call every tilegemm op once and check it against float64 math: ``python modeling/demo.py``.

Each op runs on realistic small shapes (CPU-friendly) on the current backend, is compared with
an independent float64 formula on the upcast (dequantized) inputs, and is timed. A table of
(op, shape, backend, calc_diff, time) is printed; the exit status is 1 if any check fails.
Bars: fp32 outputs ``calc_diff < 1e-6``, bf16 outputs ``< 1e-5``; MQA ``-inf`` masks identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make src/ importable from a checkout
    sys.path[0] = str(Path(__file__).resolve().parents[1] / "src")

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

import tilegemm as tg  # noqa: E402
from tilegemm import per_block_cast_to_fp8, per_token_cast_to_fp8  # noqa: E402
from tilegemm.backend.registry import FallbackWarning  # noqa: E402
from tilegemm.backend.selector import BACKENDS, cutile_unavailable_reason  # noqa: E402
from tilegemm.testing import bench_kernel, calc_diff, dequant_per_block, dequant_per_token, poisoned  # noqa: E402

BARS = {torch.float32: 1e-6, torch.bfloat16: 1e-5}


@dataclass
class Row:
    op: str
    shape: str
    backend: str
    diff: float
    ms: float
    ok: bool
    note: str = ""


def _run(op: str, shape: str, call: Callable[[], torch.Tensor], check: Callable[[torch.Tensor], tuple[float, bool]]):
    """Call once (recording fallbacks), check the result, then time repeated calls."""
    backend = tg.get_current_backend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        out = call()
    fell_back = any(issubclass(w.category, FallbackWarning) for w in caught)
    diff, ok = check(out)
    ms = bench_kernel(call, warmup=5, rep=40)
    return Row(op, shape, f"{backend}->pytorch" if fell_back else backend, diff, ms, ok)


def _gemm_check(ref64: torch.Tensor, bar: float) -> Callable[[torch.Tensor], tuple[float, bool]]:
    def check(out: torch.Tensor) -> tuple[float, bool]:
        diff = calc_diff(out, ref64)
        return diff, bool(not torch.isnan(out).any()) and diff < bar

    return check


def _layout(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x.t().contiguous() if transposed else x


def dense_rows(dev: torch.device) -> list[Row]:
    m, n, k = 128, 2112, 512
    a = torch.randn(m, k, device=dev).bfloat16()
    b = torch.randn(n, k, device=dev).bfloat16()
    ref = a.double() @ b.double().T
    aq, sa = per_token_cast_to_fp8(a)
    bq, sb = per_block_cast_to_fp8(b)
    bq_row, sb_row = per_token_cast_to_fp8(b)
    ref8 = dequant_per_token(aq, sa) @ dequant_per_block(bq, sb).T
    ref8_row = dequant_per_token(aq, sa) @ dequant_per_token(bq_row, sb_row).T
    rows = []
    for layout in ("nt", "nn", "tn", "tt"):
        ta, tb = layout[0] == "t", layout[1] == "n"
        a_l, b_l = _layout(a, ta), _layout(b, tb)
        d = poisoned((m, n), torch.float32, dev)
        op = getattr(tg, f"bf16_gemm_{layout}")
        rows.append(
            _run(
                op.__name__,
                f"{m}x{n}x{k}",
                lambda op=op, a_l=a_l, b_l=b_l, d=d: op(a_l, b_l, d),
                _gemm_check(ref, 1e-6),
            )
        )
        # a transposed operand's scales are transposed too (DeepGEMM's orientation)
        fa, fb = (_layout(aq, ta), sa.t() if ta else sa), (_layout(bq, tb), sb.t() if tb else sb)
        d8 = poisoned((m, n), torch.bfloat16, dev)
        op8 = getattr(tg, f"fp8_gemm_{layout}")
        rows.append(
            _run(
                op8.__name__,
                f"{m}x{n}x{k} bf16",
                lambda op8=op8, fa=fa, fb=fb, d8=d8: op8(fa, fb, d8),
                _gemm_check(ref8, 1e-5),
            )
        )
    d8 = poisoned((m, n), torch.float32, dev)
    rows.append(
        _run(
            "fp8_gemm_nt",
            f"{m}x{n}x{k} 1x128 rhs",
            lambda: tg.fp8_gemm_nt((aq, sa), (bq_row, sb_row), d8),
            _gemm_check(ref8_row, 1e-6),
        )
    )
    return rows


def _m_indices(sizes: list[int], dev: torch.device) -> torch.Tensor:
    parts = []
    for g, size in enumerate(sizes):
        pad = -(-size // 128) * 128 - size
        parts += [torch.full((size,), g, dtype=torch.int32), torch.full((pad,), -1, dtype=torch.int32)]
    return torch.cat(parts).to(dev)


def _grouped_ref(a64: torch.Tensor, b64: torch.Tensor, row_group: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(a64.shape[0], b64.shape[1], dtype=torch.float64, device=a64.device)
    for g in range(b64.shape[0]):
        rows = (row_group == g).nonzero().flatten()
        out[rows] = a64[rows] @ b64[g].T
    return out


def grouped_rows(dev: torch.device) -> list[Row]:
    sizes, n, k = [200, 90, 0, 300], 512, 256
    groups = len(sizes)
    m_indices = _m_indices(sizes, dev)
    m_sum = m_indices.numel()
    a = torch.randn(m_sum, k, device=dev).bfloat16()
    b = torch.randn(groups, n, k, device=dev).bfloat16()
    aq, sa = per_token_cast_to_fp8(a)
    bq, sb = per_block_cast_to_fp8(b)
    ref = _grouped_ref(a.double(), b.double(), m_indices.long())
    ref8 = _grouped_ref(dequant_per_token(aq, sa), dequant_per_block(bq, sb), m_indices.long())
    offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
    psum_rows = torch.searchsorted(offs.long(), torch.arange(m_sum, device=dev), right=True)
    ref_psum = _grouped_ref(a.double(), b.double(), psum_rows)
    shape = f"G={groups} M={m_sum} N={n} K={k}"
    rows = []
    for layout in ("nt", "nn"):
        b_l = b if layout == "nt" else b.transpose(1, 2).contiguous()
        bq_l = bq if layout == "nt" else bq.transpose(1, 2).contiguous()
        sb_l = sb if layout == "nt" else sb.transpose(1, 2).contiguous()
        op = getattr(tg, f"m_grouped_bf16_gemm_{layout}_contiguous")
        op8 = getattr(tg, f"m_grouped_fp8_gemm_{layout}_contiguous")
        d, d8 = poisoned((m_sum, n), torch.float32, dev), poisoned((m_sum, n), torch.float32, dev)
        rows.append(
            _run(op.__name__, shape, lambda op=op, b_l=b_l, d=d: op(a, b_l, d, m_indices), _gemm_check(ref, 1e-6))
        )
        rows.append(
            _run(
                op8.__name__,
                shape,
                lambda op8=op8, bq_l=bq_l, sb_l=sb_l, d8=d8: op8((aq, sa), (bq_l, sb_l), d8, m_indices),
                _gemm_check(ref8, 1e-6),
            )
        )
    dp = poisoned((m_sum, n), torch.float32, dev)
    rows.append(
        _run(
            "m_grouped_bf16_gemm_nt_contiguous",
            shape + " psum",
            lambda: tg.m_grouped_bf16_gemm_nt_contiguous(a, b, dp, offs, use_psum_layout=True, alignment=1),
            _gemm_check(ref_psum, 1e-6),
        )
    )

    m_max, ms = 64, [5, 64, 0, 33]
    am = torch.randn(groups, m_max, k, device=dev).bfloat16()
    amq, samq = per_token_cast_to_fp8(am)
    masked_m = torch.tensor(ms, dtype=torch.int32, device=dev)
    valid = torch.arange(m_max, device=dev)[None, :] < masked_m[:, None]
    ref_m = torch.einsum("gmk,gnk->gmn", am.double(), b.double())
    ref_m8 = torch.einsum("gmk,gnk->gmn", dequant_per_token(amq, samq), dequant_per_block(bq, sb))

    def masked_check(ref64: torch.Tensor) -> Callable[[torch.Tensor], tuple[float, bool]]:
        def check(out: torch.Tensor) -> tuple[float, bool]:
            diff = calc_diff(out[valid], ref64[valid])
            return diff, bool(torch.isnan(out[~valid]).all()) and diff < 1e-6

        return check

    dm, dm8 = poisoned((groups, m_max, n), torch.float32, dev), poisoned((groups, m_max, n), torch.float32, dev)
    mshape = f"G={groups} Mmax={m_max} N={n} K={k}"
    rows.append(
        _run(
            "m_grouped_bf16_gemm_nt_masked",
            mshape,
            lambda: tg.m_grouped_bf16_gemm_nt_masked(am, b, dm, masked_m, 32),
            masked_check(ref_m),
        )
    )
    rows.append(
        _run(
            "m_grouped_fp8_gemm_nt_masked",
            mshape,
            lambda: tg.m_grouped_fp8_gemm_nt_masked((amq, samq), (bq, sb), dm8, masked_m, 32),
            masked_check(ref_m8),
        )
    )

    ks, mk, nk = [256, 0, 384, 128], 256, 512
    k_sum = sum(ks)
    ka = torch.randn(k_sum, mk, device=dev).bfloat16()
    kb = torch.randn(k_sum, nk, device=dev).bfloat16()
    qa, qsa = (t.t().contiguous() for t in per_token_cast_to_fp8(ka.t()))
    qb, qsb = (t.t().contiguous() for t in per_token_cast_to_fp8(kb.t()))
    ka8 = qa.double() * qsa.double().repeat_interleave(128, 0)
    kb8 = qb.double() * qsb.double().repeat_interleave(128, 0)
    bounds = torch.tensor([0, *ks]).cumsum(0).tolist()
    ref_k = torch.stack([ka.double()[s:e].T @ kb.double()[s:e] for s, e in zip(bounds[:-1], bounds[1:])])
    ref_k8 = torch.stack([ka8[s:e].T @ kb8[s:e] for s, e in zip(bounds[:-1], bounds[1:])])
    dk, dk8 = poisoned((len(ks), mk, nk), torch.float32, dev), poisoned((len(ks), mk, nk), torch.float32, dev)
    kshape = f"ks={ks} M={mk} N={nk}"
    ks_dev = torch.tensor(ks, dtype=torch.int32, device=dev)
    rows.append(
        _run(
            "k_grouped_bf16_gemm_tn_contiguous",
            kshape,
            lambda: tg.k_grouped_bf16_gemm_tn_contiguous(ka, kb, dk, ks, ks_dev),
            _gemm_check(ref_k, 1e-6),
        )
    )
    rows.append(
        _run(
            "k_grouped_fp8_gemm_tn_contiguous",
            kshape,
            lambda: tg.k_grouped_fp8_gemm_tn_contiguous((qa, qsa), (qb, qsb), dk8, ks, ks_dev),
            _gemm_check(ref_k8, 1e-6),
        )
    )
    return rows


def _row_cast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / 448.0
    return (x.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(-1)


def _logits_check(ref64: torch.Tensor, inside: torch.Tensor) -> Callable[[torch.Tensor], tuple[float, bool]]:
    def check(out: torch.Tensor) -> tuple[float, bool]:
        diff = calc_diff(out[inside], ref64[inside])
        return diff, bool(torch.equal(torch.isneginf(out), ~inside)) and diff < 1e-6

    return check


def mqa_rows(dev: torch.device) -> list[Row]:
    rows = []
    s, h, dim, s_kv = 128, 32, 128, 512
    q, qs = _row_cast(torch.randn(s * h, dim, device=dev))
    q = q.view(s, h, dim)
    weights = torch.randn(s, h, device=dev) * qs.view(s, h)
    kv, kv_scale = _row_cast(torch.randn(s_kv, dim, device=dev))
    ke = (torch.arange(s, device=dev) + (s_kv - s) + 1).to(torch.int32)
    ks = (ke - 256).clamp(min=0).to(torch.int32)
    qk = torch.einsum("ihd,jd->ihj", q.double(), kv.double()).clamp(min=0)
    ref = torch.einsum("ih,ihj->ij", weights.double(), qk) * kv_scale.double()[None, :]
    cols = torch.arange(s_kv, device=dev)
    inside = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    rows.append(
        _run(
            "fp8_mqa_logits",
            f"S={s} H={h} D={dim} S_kv={s_kv}",
            lambda: tg.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke),
            _logits_check(ref, inside),
        )
    )

    batch, next_n, block_kv, num_sms = 4, 2, 64, 16
    lens = [900, 64, 1000, 333]
    context_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    meta = tg.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)

    def meta_check(out: torch.Tensor) -> tuple[float, bool]:
        ok = out.shape == (num_sms + 1, 2) and out[-1].tolist() == [batch, 0]
        return 0.0, bool(ok and torch.equal(out, meta))

    rows.append(
        _run(
            "get_paged_mqa_logits_metadata",
            f"B={batch} sms={num_sms}",
            lambda: tg.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms),
            meta_check,
        )
    )

    blocks_per = [-(-n // block_kv) for n in lens]
    num_blocks = sum(blocks_per)
    perm = torch.randperm(num_blocks)
    key_bytes = torch.zeros(num_blocks, block_kv * dim, dtype=torch.uint8)
    scale_vals = torch.ones(num_blocks, block_kv)
    table = torch.zeros(batch, max(blocks_per), dtype=torch.int32)
    keys, scales, used = [], [], 0
    for b, n in enumerate(lens):
        kq, kscale = _row_cast(torch.randn(n, dim))
        keys.append(kq)
        scales.append(kscale)
        for i in range(blocks_per[b]):
            blk = int(perm[used])
            used += 1
            table[b, i] = blk
            lo, hi = i * block_kv, min(n, (i + 1) * block_kv)
            key_bytes[blk].view(block_kv, dim)[: hi - lo] = kq[lo:hi].view(torch.uint8)
            scale_vals[blk, : hi - lo] = kscale[lo:hi]
    cache = torch.cat([key_bytes, scale_vals.view(torch.uint8)], dim=1).view(num_blocks, block_kv, 1, dim + 4).to(dev)
    pq, pqs = _row_cast(torch.randn(batch * next_n * h, dim))
    pq = pq.view(batch, next_n, h, dim)
    pw = torch.randn(batch * next_n, h) * pqs.view(batch * next_n, h)
    width = max(lens)
    ref_p = torch.zeros(batch * next_n, width, dtype=torch.float64)
    vis = torch.zeros(batch * next_n, width, dtype=torch.bool)
    for b, n in enumerate(lens):
        for t in range(next_n):
            row, nv = b * next_n + t, n - next_n + t + 1
            qk = (pq[b, t].double() @ keys[b][:nv].double().T).clamp(min=0)
            ref_p[row, :nv] = (pw[row].double() @ qk) * scales[b][:nv].double()
            vis[row, :nv] = True
    pq, pw, table = pq.to(dev), pw.to(dev), table.to(dev)
    rows.append(
        _run(
            "fp8_paged_mqa_logits",
            f"B={batch} next_n={next_n} H={h} D={dim} block_kv={block_kv} ctx<={width}",
            lambda: tg.fp8_paged_mqa_logits(pq, cache, pw, context_lens, table, meta, width, clean_logits=True),
            _logits_check(ref_p.to(dev), vis.to(dev)),
        )
    )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help``); a ``--backend`` that cannot run here is an argparse error (exit 2)."""
    p = argparse.ArgumentParser(prog="modeling/demo.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=BACKENDS, default=None, help="default: the current tilegemm backend")
    args = p.parse_args(argv)
    if args.backend == "cutile" and cutile_unavailable_reason() is not None:
        p.error(f"argument --backend: the cutile backend cannot run on this machine: {cutile_unavailable_reason()}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every op, print the table, return the exit status (0: all checks passed)."""
    args = parse_args(argv)
    if args.backend is not None:
        with tg.use_backend(args.backend):
            return _run_all()
    return _run_all()


def _run_all() -> int:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    start = time.perf_counter()
    rows = dense_rows(dev) + grouped_rows(dev) + mqa_rows(dev)
    header = f"{'op':36} {'shape':48} {'backend':18} {'calc_diff':>10} {'time ms':>9}  check"
    print(f"tilegemm demo on {dev} (backend: {tg.get_current_backend()})")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.op:36} {r.shape:48} {r.backend:18} {r.diff:10.2e} {r.ms:9.3f}  {'ok' if r.ok else 'FAIL'}")
    failed = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(failed)}/{len(rows)} checks passed in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
