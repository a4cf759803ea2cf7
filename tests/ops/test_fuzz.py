"""Property-based fuzzing of every public tensor op on the CPU (``pytorch`` backend).

Each family draws a valid call (random sizes, zero sizes included), then one mutation: none, a weird
but valid one (strided inputs, odd real scalars, every tensor on the meta device) or a bad one (a wrong
type, dtype, device, shape, contiguity or value). The invariant: the call either returns the float64
formula's result (``calc_diff`` under the design's bar, ``-inf`` masks identical), or raises
``TypeError``/``ValueError``/``NotImplementedError`` naming the offending argument, with the output
``d`` bitwise untouched. Any other exception fails the test.
"""

from __future__ import annotations

import fractions
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilegemm as tg
from tilegemm.testing import (
    MOE_ACTIVATIONS,
    assert_fp8_rows,
    calc_diff,
    dequantize,
    fp8_round_trip_per_token,
    rms_norm_float64,
    window_ends_float64,
)

FP8 = torch.float8_e4m3fn
BAD_DTYPE = {torch.int32: torch.int64, torch.uint8: torch.int16}  # any other dtype -> float16
GOOD_SCALARS = [0.5, 2, fractions.Fraction(1, 3), 2**64, np.float32(1.5), np.int64(3), -1.25, 0]
BAD_SCALARS = [(10**400, ValueError), ("2", TypeError), (True, TypeError), (None, TypeError), (1j, TypeError)]
SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


# --------------------------------------------------------------------------------- case model


@dataclass
class Case:
    """A valid call: ``op(**kwargs)``; ``dims`` names each tensor slot's dims by letter (shared letter =
    shared size); ``reference()`` gives the expected float64 result (of ``d``, or the returned tensor)."""

    op: Callable[..., Any]
    kwargs: dict[str, Any]
    dims: dict[str, str]
    reference: Callable[[dict[str, Any], Any], Any]  # (the call's kwargs, its result) -> expected
    out: str | None = "d"
    bar: float = 1e-6
    free: str = ""  # dim letters whose size is free (a longer block table is still valid)
    contiguous: tuple[str, ...] = ()  # input slots that must be contiguous
    scalars: tuple[str, ...] = ()  # real-number arguments (alpha, beta)
    values: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)  # slot -> bad values
    compare: str = "diff"  # "diff", "exact", "logits"/"nan_aware" (masks identical), "asserts" (reference checks)
    related: dict[str, str] = field(default_factory=dict)  # dim letter -> letters derived from it
    bad_dtype: torch.dtype | None = None  # the wrong dtype for every slot (default: int64/int16/float16)
    dtype_free: bool = False  # any dtype is valid
    dispatched: bool = True  # a @dispatch op (takes backend=)
    meta_ok: bool = True  # every tensor on the meta device is a valid call


def get(kwargs: dict, slot: str) -> Any:
    name, _, idx = slot.partition("[")
    return kwargs[name] if not idx else kwargs[name][int(idx[0])]


def put(kwargs: dict, slot: str, value: Any) -> dict:
    out = dict(kwargs)
    name, _, idx = slot.partition("[")
    if not idx:
        out[name] = value
    else:
        parts = list(out[name])
        parts[int(idx[0])] = value
        out[name] = tuple(parts)
    return out


def names(message: str, slots: list[str]) -> bool:
    """True when ``message`` names one of ``slots`` as a word (``a[1]`` also matches ``a[1] (scales)``)."""
    return any(re.search(rf"(?<![\w\[]){re.escape(s)}(?![\w])", message) for s in slots)


def rand(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def fp8(*shape: int) -> torch.Tensor:
    return (torch.randn(*shape) * 100).clamp(-448, 448).to(FP8)


def scales(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.25


def cdiv(x: int, y: int) -> int:
    return -(-x // y)


def strided(x: torch.Tensor) -> torch.Tensor:
    """The values of ``x`` in a non-contiguous view (last dim at stride 2)."""
    if x.dim() == 0:
        return x
    buf = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype).view(torch.uint8 if x.dtype == FP8 else x.dtype)
    view = buf[..., ::2]
    view.copy_(x.view(torch.uint8) if x.dtype == FP8 else x)
    return view.view(FP8) if x.dtype == FP8 else view


def snapshot(x: Any) -> torch.Tensor | None:
    if not isinstance(x, torch.Tensor) or x.device.type == "meta":
        return None
    return torch.empty(x.shape, dtype=x.dtype).copy_(x.detach()).view(-1).view(torch.uint8)


def d64(x: torch.Tensor) -> torch.Tensor:
    return x.double()


# ------------------------------------------------------------------------------- families

LAYOUT_DIMS = {"nt": ("MK", "NK"), "nn": ("MK", "KN"), "tn": ("KM", "KN"), "tt": ("KM", "NK")}


def _as_layout(x: torch.Tensor, flip: bool) -> torch.Tensor:
    return x.t().contiguous() if flip else x


def _epilogue(draw, m: int, n: int, out_dtype) -> tuple[dict, Callable[[torch.Tensor], torch.Tensor]]:
    kw: dict[str, Any] = {"d": torch.full((m, n), math.nan, dtype=out_dtype)}
    alpha, beta = draw(st.sampled_from([1.0, 0.5, -2])), draw(st.sampled_from([1.0, 0.0, 0.25]))
    kw.update(alpha=alpha, beta=beta)
    c = rand(m, n, dtype=draw(st.sampled_from([torch.float32, torch.bfloat16]))) if draw(st.booleans()) else None
    kw["c"] = c

    def finish(call: dict[str, Any], acc: torch.Tensor) -> torch.Tensor:
        a, b = float(call["alpha"]), float(call["beta"])
        return a * acc + (b * d64(call["c"]) if call["c"] is not None and b != 0 else 0)

    return kw, finish


def dense(draw, fp8_op: bool) -> Case:
    layout = draw(st.sampled_from(list(LAYOUT_DIMS)))
    m, n = draw(st.integers(0, 24)), draw(st.integers(3, 40))
    k = draw(st.sampled_from([0, 1, 64, 128, 200, 300] if fp8_op else [0, 1, 7, 64, 130]))
    out_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    kw, finish = _epilogue(draw, m, n, out_dtype)
    flip_a, flip_b = layout[0] == "t", layout[1] == "n"
    da, db = LAYOUT_DIMS[layout]
    dims = {"d": "MN", "c": "MN"}
    if not fp8_op:
        a, b = rand(m, k), rand(n, k)
        kw.update(a=_as_layout(a, flip_a), b=_as_layout(b, flip_b))
        dims.update(a=da, b=db)
        op = getattr(tg, f"bf16_gemm_{layout}")
        product = lambda: d64(a) @ d64(b).T  # noqa: E731
    else:
        row_recipe = draw(st.booleans())
        aq, sa = fp8(m, k), scales(m, cdiv(k, 128))
        bq, sb = fp8(n, k), scales(n if row_recipe else cdiv(n, 128), cdiv(k, 128))
        kw.update(
            a=(_as_layout(aq, flip_a), _as_layout(sa, flip_a)), b=(_as_layout(bq, flip_b), _as_layout(sb, flip_b))
        )
        sb_dims = ("N" if row_recipe else "n") + "k"
        dims.update({"a[0]": da, "a[1]": "Mk" if not flip_a else "kM", "b[0]": db})
        dims["b[1]"] = sb_dims if not flip_b else sb_dims[::-1]
        op = getattr(tg, draw(st.sampled_from([f"fp8_gemm_{layout}", f"fp8_fp4_gemm_{layout}"])))
        product = lambda: dequantize(aq, sa, 1) @ dequantize(bq, sb, 1 if row_recipe else 128).T  # noqa: E731
    bar = 1e-6 if out_dtype == torch.float32 else 1e-5
    return Case(op, kw, dims, lambda call, _: finish(call, product()), bar=bar, scalars=("alpha", "beta"))


def cublaslt(draw) -> Case:
    layout = draw(st.sampled_from(list(LAYOUT_DIMS)))
    m, n, k = draw(st.integers(0, 24)), draw(st.integers(3, 40)), draw(st.sampled_from([0, 1, 7, 64, 130]))
    out_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    a, b = rand(m, k), rand(n, k)
    c = rand(m, n, dtype=draw(st.sampled_from([torch.float32, torch.bfloat16]))) if draw(st.booleans()) else None
    da, db = LAYOUT_DIMS[layout]
    kw = dict(a=_as_layout(a, layout[0] == "t"), b=_as_layout(b, layout[1] == "n"), c=c)
    kw["d"] = torch.full((m, n), math.nan, dtype=out_dtype)

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        return d64(a) @ d64(b).T + (d64(call["c"]) if call["c"] is not None else 0)

    bar = 1e-6 if out_dtype == torch.float32 else 1e-5
    dims = {"a": da, "b": db, "d": "MN", "c": "MN"}
    return Case(getattr(tg, f"cublaslt_gemm_{layout}"), kw, dims, reference, bar=bar)


def moe_experts(draw) -> Case:
    tokens, top_k, experts = draw(st.integers(0, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    hidden, inter = draw(st.integers(1, 24)), draw(st.integers(1, 12))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32]))
    activation = draw(st.sampled_from(["silu", "gelu", "gelu_tanh"]))
    ids = torch.randint(-1, experts + 1, (tokens, top_k))
    act = MOE_ACTIVATIONS[activation]

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        x, w, w13, w2 = (d64(call[name]) for name in ("hidden", "topk_weights", "w13", "w2"))
        ids_, inter_ = call["topk_ids"], w2.shape[2]
        out = torch.zeros(x.shape, dtype=torch.float64)
        for t in range(x.shape[0]):
            for j in range(ids_.shape[1]):
                e = int(ids_[t, j])
                if 0 <= e < w13.shape[0]:
                    gu = w13[e] @ x[t]
                    out[t] += w[t, j] * (w2[e] @ (act(gu[:inter_]) * gu[inter_:]))
        return out

    kw = dict(
        hidden=rand(tokens, hidden, dtype=dtype), topk_ids=ids, topk_weights=rand(tokens, top_k, dtype=torch.float32),
        w13=rand(experts, 2 * inter, hidden, dtype=dtype), w2=rand(experts, hidden, inter, dtype=dtype),
        activation=activation,
    )  # fmt: skip
    dims = {"hidden": "TH", "topk_ids": "TK", "topk_weights": "TK", "w13": "EJH", "w2": "EHI"}
    bar = 1e-5 if dtype == torch.bfloat16 else 1e-9
    return Case(
        tg.moe_experts, kw, dims, reference, out=None, bar=bar, related={"I": "J", "J": "I"},
        bad_dtype=torch.int16, meta_ok=False,
    )  # fmt: skip


def fp8_moe_experts(draw) -> Case:
    tokens, top_k, experts = draw(st.integers(0, 4)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    hidden, inter = draw(st.sampled_from([128, 256])), 128
    activation = draw(st.sampled_from(["silu", "gelu", "gelu_tanh"]))
    ids = torch.randint(-1, experts + 1, (tokens, top_k))
    w13 = tg.per_block_cast_to_fp8(torch.randn(experts, 2 * inter, hidden) / 16)
    w2 = tg.per_block_cast_to_fp8(torch.randn(experts, hidden, inter) / 16)
    act = MOE_ACTIVATIONS[activation]

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        x64 = dequantize(*tg.per_token_cast_to_fp8(call["hidden"]), 1)
        w13_64, w2_64 = (dequantize(*call[name], 128) for name in ("w13", "w2"))
        w, ids_ = d64(call["topk_weights"]), call["topk_ids"]
        out = torch.zeros(x64.shape, dtype=torch.float64)
        for t in range(x64.shape[0]):
            for j in range(ids_.shape[1]):
                e = int(ids_[t, j])
                if 0 <= e < experts:
                    gu = w13_64[e] @ x64[t]
                    out[t] += w[t, j] * (w2_64[e] @ fp8_round_trip_per_token(act(gu[:inter]) * gu[inter:]))
        return out

    kw = dict(
        hidden=rand(tokens, hidden), topk_ids=ids, topk_weights=rand(tokens, top_k, dtype=torch.float32), w13=w13,
        w2=w2, activation=activation,
    )  # fmt: skip
    dims = {
        "hidden": "TH", "topk_ids": "TK", "topk_weights": "TK", "w13[0]": "EJH", "w13[1]": "Ejh", "w2[0]": "EHI",
        "w2[1]": "Ehi",
    }  # fmt: skip
    related = {"I": "Jji", "J": "Iji", "H": "h", "h": "H", "i": "IJj", "j": "IJi"}
    # bar: test_fp8_moe_experts.BAR (requantizing h is not continuous)
    return Case(
        tg.fp8_moe_experts, kw, dims, reference, out=None, bar=2e-4, related=related, bad_dtype=torch.int16,
        meta_ok=False,
    )  # fmt: skip


def skip_head_mid(draw) -> Case:
    left, mid, right = draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 3))
    heads, m, k = draw(st.integers(3, 4)), draw(st.integers(0, 16)), draw(st.sampled_from([64, 128, 256]))
    n = heads * (left + right)
    aq, sa, bq, sb = fp8(m, k), scales(m, cdiv(k, 128)), fp8(n, k), scales(cdiv(n, 128), cdiv(k, 128))
    d = torch.full((m, n + heads * mid), math.nan)

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        out = (dequantize(aq, sa, 1) @ dequantize(bq, sb, 128).T).view(m, heads, left + right)
        ref = d64(d).clone().view(m, heads, left + mid + right)
        ref[:, :, :left], ref[:, :, left + mid :] = out[:, :, :left], out[:, :, left:]
        return ref.view(m, n + heads * mid)

    kw = dict(a=(aq, sa), b=(bq, sb), d=d, head_splits=(left, mid, right))
    dims = {"a[0]": "MK", "a[1]": "Mk", "b[0]": "NK", "b[1]": "nk", "d": "MW", "head_splits": "N"}
    return Case(tg.fp8_gemm_nt_skip_head_mid, kw, dims, reference, compare="nan_aware", related={"N": "W"})


def _psum_layout(draw, groups: int, alignment: int) -> tuple[list[int], list[int], int]:
    """(ends, per-row group ids, M_sum) of a psum layout whose groups start at aligned rows."""
    ends, rows, end = [], [], 0
    for g in range(groups):
        start = cdiv(end, alignment) * alignment
        size = draw(st.integers(0, 40))
        rows += [-1] * (start - len(rows)) + [g] * size
        end = start + size
        ends.append(end)
    tail = draw(st.integers(0, 3))
    return ends, rows + [-1] * tail, end + tail


def _m_indices(draw, groups: int) -> list[int]:
    rows: list[int] = []
    for g in draw(st.permutations(list(range(groups)))):
        size = draw(st.integers(0, 130))
        rows += [g] * size + [-1] * (cdiv(size, 128) * 128 - size)
    return rows + [-1] * draw(st.sampled_from([0, 0, 5, 128]))


def m_grouped(draw, fp8_op: bool) -> Case:
    layout = draw(st.sampled_from(["nt", "nn"]))
    groups, n, k = draw(st.integers(1, 3)), draw(st.sampled_from([0, 3, 24, 40])), draw(st.sampled_from([0, 64, 160]))
    psum = draw(st.booleans())
    kw: dict[str, Any] = {}
    if psum:
        alignment = draw(st.sampled_from([None, 1, 16]))
        ends, rows, m_sum = _psum_layout(draw, groups, alignment or 128)
        kw.update(grouped_layout=torch.tensor(ends, dtype=torch.int32), use_psum_layout=True, alignment=alignment)
        layout_dims, bad = "G", lambda t: t + m_sum + 1  # noqa: E731
    else:
        rows = _m_indices(draw, groups)
        m_sum = len(rows)
        kw.update(grouped_layout=torch.tensor(rows, dtype=torch.int32))
        layout_dims, bad = "S", lambda t: torch.full_like(t, groups)  # noqa: E731
    if m_sum == 0 and not psum:
        bad = None
    flip = layout == "nn"
    out_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    kw["d"] = torch.full((m_sum, n), math.nan, dtype=out_dtype)
    dims = {"d": "SN", "grouped_layout": layout_dims}
    bd = "GKN" if flip else "GNK"
    if fp8_op:
        aq, sa, bq, sb = (
            fp8(m_sum, k),
            scales(m_sum, cdiv(k, 128)),
            fp8(groups, n, k),
            scales(groups, cdiv(n, 128), cdiv(k, 128)),
        )
        kw.update(a=(aq, sa), b=(bq.mT.contiguous(), sb.mT.contiguous()) if flip else (bq, sb))
        dims.update({"a[0]": "SK", "a[1]": "Sk", "b[0]": bd, "b[1]": "Gkn" if flip else "Gnk"})
        a64, b64 = lambda: dequantize(aq, sa, 1), lambda: dequantize(bq, sb, 128)  # noqa: E731
        name = f"m_grouped_fp8_gemm_{layout}_contiguous"
    else:
        a, b = rand(m_sum, k), rand(groups, n, k)
        kw.update(a=a, b=b.mT.contiguous() if flip else b)
        dims.update(a="SK", b=bd)
        a64, b64 = lambda: d64(a), lambda: d64(b)  # noqa: E731
        name = f"m_grouped_bf16_gemm_{layout}_contiguous"
    row_group = torch.tensor(rows, dtype=torch.long)

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        ref = torch.zeros(m_sum, n, dtype=torch.float64)
        av, bv = a64(), b64()
        for g in range(groups):
            sel = row_group == g
            ref[sel] = av[sel] @ bv[g].T
        return ref

    values = {"grouped_layout": bad} if bad is not None else {}
    return Case(getattr(tg, name), kw, dims, reference, bar=1e-6 if out_dtype == torch.float32 else 1e-5, values=values)


def masked(draw, fp8_op: bool) -> Case:
    groups, m_max, n = draw(st.integers(1, 3)), draw(st.integers(0, 20)), draw(st.sampled_from([3, 17, 40]))
    k = draw(st.sampled_from([64, 128, 200]))
    masked_m = torch.tensor([draw(st.integers(0, m_max)) for _ in range(groups)], dtype=torch.int32)
    d = torch.full((groups, m_max, n), math.nan)
    kw: dict[str, Any] = dict(d=d, masked_m=masked_m, expected_m=draw(st.integers(0, 32)))
    dims = {"d": "GMN", "masked_m": "G"}
    if fp8_op:
        aq, sa, bq, sb = (
            fp8(groups, m_max, k),
            scales(groups, m_max, cdiv(k, 128)),
            fp8(groups, n, k),
            scales(groups, cdiv(n, 128), cdiv(k, 128)),
        )
        kw.update(a=(aq, sa), b=(bq, sb))
        dims.update({"a[0]": "GMK", "a[1]": "GMk", "b[0]": "GNK", "b[1]": "Gnk"})
        a64, b64 = lambda: dequantize(aq, sa, 1), lambda: dequantize(bq, sb, 128)  # noqa: E731
        names_ = ["m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked"]
    else:
        a, b = rand(groups, m_max, k), rand(groups, n, k)
        kw.update(a=a, b=b)
        dims.update(a="GMK", b="GNK")
        a64, b64 = lambda: d64(a), lambda: d64(b)  # noqa: E731
        names_ = ["m_grouped_bf16_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked"]

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        ref = d64(d).clone()  # rows past masked_m keep d's (NaN) bits
        out = a64() @ b64().transpose(1, 2)
        for g in range(groups):
            ref[g, : masked_m[g]] = out[g, : masked_m[g]]
        return ref

    op = getattr(tg, draw(st.sampled_from(names_)))
    bad = {"masked_m": lambda t: t + m_max + 1}
    return Case(op, kw, dims, reference, values=bad, compare="nan_aware")


def k_grouped(draw, variant: str) -> Case:
    groups, m, n = draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 20))
    step = 128 if variant != "bf16" else 1
    ks = [
        draw(st.sampled_from([0, 1, 2])) * step if variant != "bf16" else draw(st.integers(0, 40))
        for _ in range(groups)
    ]
    k_sum = sum(ks)
    d = torch.full((groups, m, n), math.nan)
    c = torch.randn(groups, m, n) if draw(st.booleans()) else None
    kw: dict[str, Any] = dict(d=d, ks_cpu=ks, grouped_layout=torch.tensor(ks, dtype=torch.int32), c=c)
    dims = {"d": "GMN", "c": "GMN", "grouped_layout": "G"}
    if variant == "bf16":
        a, b = rand(k_sum, m), rand(k_sum, n)
        kw.update(a=a, b=b)
        dims.update(a="SM", b="SN")
        a64, b64 = d64(a), d64(b)
        op, contiguous = tg.k_grouped_bf16_gemm_tn_contiguous, ()
    else:
        aq, sa, bq, sb = fp8(k_sum, m), scales(k_sum // 128, m), fp8(k_sum, n), scales(k_sum // 128, n)
        a64, b64 = dequantize(aq.t(), sa.t(), 1).t(), dequantize(bq.t(), sb.t(), 1).t()
        if variant == "tn":
            kw.update(a=(aq, sa), b=(bq, sb))
            dims.update({"a[0]": "SM", "a[1]": "sM", "b[0]": "SN", "b[1]": "sN"})
            op, contiguous = tg.k_grouped_fp8_gemm_tn_contiguous, ()
        else:  # nt: each group's [MN, K_g] block K-major, back to back; scales [MN, K_sum/128]
            starts = [sum(ks[:g]) for g in range(groups)]
            pack = lambda x: torch.cat([x[s : s + kg].t().reshape(-1) for s, kg in zip(starts, ks)])  # noqa: E731
            kw.update(a=(pack(aq.view(torch.uint8)).view(FP8), sa.t().contiguous()))
            kw.update(b=(pack(bq.view(torch.uint8)).view(FP8), sb.t().contiguous()))
            dims.update({"a[0]": "X", "a[1]": "Ms", "b[0]": "Y", "b[1]": "Ns"})
            op, contiguous = tg.k_grouped_fp8_gemm_nt_contiguous, ("a[0]", "b[0]")

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        ref, k0 = torch.zeros(groups, m, n, dtype=torch.float64), 0
        for g, kg in enumerate(ks):
            ref[g] = a64[k0 : k0 + kg].T @ b64[k0 : k0 + kg] + (d64(c[g]) if c is not None else 0)
            k0 += kg
        return ref

    bad = {"grouped_layout": lambda t: t + 128}
    related = {"M": "X", "N": "Y"} if variant == "nt" else {}
    return Case(op, kw, dims, reference, contiguous=contiguous, values=bad, related=related)


def _logits64(q: torch.Tensor, keys64: torch.Tensor, kscale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[rows, keys]: ``kscale[j] * sum_h w[i, h] * relu(q[i, h] . k[j])`` in float64."""
    scores = torch.einsum("ihd,jd->ihj", d64(q), keys64).relu()
    return torch.einsum("ih,ihj->ij", d64(w), scores) * d64(kscale)[None, :]


def mqa(draw) -> Case:
    s, s_kv, h, dim = (
        draw(st.integers(0, 6)),
        draw(st.integers(0, 40)),
        draw(st.integers(1, 4)),
        draw(st.sampled_from([32, 64])),
    )
    q, kv, kv_scale, w = fp8(s, h, dim), fp8(s_kv, dim), scales(s_kv), torch.randn(s, h)
    starts = [draw(st.integers(0, s_kv)) for _ in range(s)]
    ends = [draw(st.integers(st_, s_kv)) for st_ in starts]
    ks, ke = torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)
    width = draw(st.sampled_from([0, 0, 1, 8, 50]))
    name = draw(st.sampled_from(["fp8_mqa_logits", "fp8_fp4_mqa_logits"]))
    kw = dict(q=q, kv=(kv, kv_scale), weights=w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke, max_seqlen_k=width)
    dims = {
        "q": "SHD",
        "kv[0]": "VD",
        "kv[1]": "V",
        "weights": "SH",
        "cu_seq_len_k_start": "S",
        "cu_seq_len_k_end": "S",
    }

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        full = _logits64(q, d64(kv), kv_scale, w).reshape(s, s_kv)
        cols = torch.arange(s_kv)
        full = torch.where((cols >= ks[:, None]) & (cols < ke[:, None]), full, -math.inf)
        if not width:
            return full
        idx = ks.long()[:, None] + torch.arange(width)[None, :]
        padded = torch.cat([full, torch.full((s, width), -math.inf, dtype=torch.float64)], dim=1)
        return padded.gather(1, idx)

    bad = {"cu_seq_len_k_end": lambda t: t + s_kv + 1} if s else {}
    return Case(getattr(tg, name), kw, dims, reference, out=None, values=bad, compare="logits")


def bf16_mqa(draw) -> Case:
    s, s_kv, h, dim = (
        draw(st.integers(0, 6)),
        draw(st.integers(0, 40)),
        draw(st.integers(1, 4)),
        draw(st.sampled_from([32, 64])),
    )
    q, kv, w = torch.randn(s, h, dim).bfloat16(), torch.randn(s_kv, dim).bfloat16(), torch.randn(s, h)
    starts = [draw(st.integers(0, s_kv)) for _ in range(s)]
    ends = [draw(st.integers(st_, s_kv)) for st_ in starts]
    ks, ke = torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)
    width = draw(st.sampled_from([0, 0, 1, 8, 50]))
    kw = dict(q=q, kv=kv, weights=w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke, max_seqlen_k=width)
    dims = {"q": "SHD", "kv": "VD", "weights": "SH", "cu_seq_len_k_start": "S", "cu_seq_len_k_end": "S"}

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        full = _logits64(q, d64(kv), torch.ones(s_kv), w).reshape(s, s_kv)
        cols = torch.arange(s_kv)
        full = torch.where((cols >= ks[:, None]) & (cols < ke[:, None]), full, -math.inf)
        if not width:
            return full
        idx = ks.long()[:, None] + torch.arange(width)[None, :]
        padded = torch.cat([full, torch.full((s, width), -math.inf, dtype=torch.float64)], dim=1)
        return padded.gather(1, idx)

    bad = {"cu_seq_len_k_end": lambda t: t + s_kv + 1} if s else {}
    return Case(tg.bf16_mqa_logits, kw, dims, reference, out=None, values=bad, compare="logits")


def mqa_batched(draw) -> Case:
    b, s, t = draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.integers(0, 30))
    h, dim, bf16 = draw(st.integers(1, 4)), draw(st.sampled_from([32, 64])), draw(st.booleans())
    q = torch.randn(b, s, h, dim).bfloat16() if bf16 else fp8(b, s, h, dim)
    keys, kscale = (torch.randn(b, t, dim).bfloat16(), torch.ones(b, t)) if bf16 else (fp8(b, t, dim), scales(b, t))
    w = torch.randn(b, s, h)
    starts = [[draw(st.integers(0, t)) for _ in range(s)] for _ in range(b)]
    ends = [[draw(st.integers(x, t)) for x in row] for row in starts]
    ks, ke = torch.tensor(starts, dtype=torch.int32).reshape(b, s), torch.tensor(ends, dtype=torch.int32).reshape(b, s)
    kv = keys if bf16 else (keys, kscale)
    kw = dict(q=q, kv=kv, weights=w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke)
    key_dims = {"kv": "BTD"} if bf16 else {"kv[0]": "BTD", "kv[1]": "BT"}
    dims = {"q": "BSHD", **key_dims, "weights": "BSH", "cu_seq_len_k_start": "BS", "cu_seq_len_k_end": "BS"}

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        out = torch.full((b, s, t), -math.inf, dtype=torch.float64)
        cols = torch.arange(t)
        for i in range(b):
            full = _logits64(q[i], d64(keys[i]), kscale[i], w[i]).reshape(s, t)
            out[i] = torch.where((cols >= ks[i][:, None]) & (cols < ke[i][:, None]), full, -math.inf)
        return out

    bad = {"cu_seq_len_k_end": lambda x: x + t + 1} if b * s else {}
    return Case(tg.mqa_logits_batched, kw, dims, reference, out=None, values=bad, compare="logits")


def schedule64(lens: list[int], block_kv: int, num_sms: int) -> list[list[int]]:
    """The paged-MQA schedule in plain Python: where each SM starts, as (batch, split within it)."""
    split = math.lcm(256, block_kv)
    counts = [cdiv(max(x, 0), split) for x in lens]
    total = sum(counts)
    q, r = divmod(total, num_sms)
    rows = []
    for i in range(num_sms + 1):
        start, b, before = i * q + min(i, r), 0, 0
        while b < len(counts) and before + counts[b] <= start:
            before += counts[b]
            b += 1
        rows.append([b, start - before] if b < len(counts) else [len(counts), 0])
    return rows


def metadata(draw) -> Case:
    batch, block_kv, num_sms = draw(st.integers(0, 5)), draw(st.sampled_from([16, 64, 100])), draw(st.integers(1, 9))
    two_d = draw(st.booleans())
    lens = [draw(st.integers(0, 1500)) for _ in range(batch * (2 if two_d else 1))]
    ctx = torch.tensor(lens, dtype=torch.int32).view(batch, 2) if two_d else torch.tensor(lens, dtype=torch.int32)
    kw = dict(context_lens=ctx, block_kv=block_kv, num_sms=num_sms)

    def expected(call: dict[str, Any], _: Any) -> torch.Tensor:
        lens = call["context_lens"].tolist()
        per_batch = [max(row, default=0) if isinstance(row, list) else row for row in lens]
        return torch.tensor(schedule64(per_batch, block_kv, num_sms), dtype=torch.float64)

    bad = {"context_lens": lambda t: t - 2000} if batch else {}
    dims = {"context_lens": "BT" if two_d else "B"}
    return Case(tg.get_paged_mqa_logits_metadata, kw, dims, expected, out=None, free="BT", values=bad, compare="exact")


def fp8_rows(draw) -> Case:
    hadamard = draw(st.booleans())
    lead = draw(st.lists(st.integers(0, 5), min_size=0, max_size=2))
    dim = draw(st.sampled_from([2, 8, 64, 128])) if hadamard else draw(st.integers(1, 200))
    x = rand(*lead, dim, dtype=draw(st.sampled_from(FLOATS))) * 4

    def reference(call: dict[str, Any], result: Any) -> None:
        assert_fp8_rows(*result, call["x"], call["hadamard"])

    dims = {"x": "ABD"[-len(lead) - 1 :]}
    free = "AB" if hadamard else "ABD"
    kw = dict(x=x, hadamard=hadamard)
    return Case(
        tg.fp8_quantize_rows, kw, dims, reference, out=None, compare="asserts", free=free, bad_dtype=torch.int32,
        meta_ok=False,  # a pair of tensors (the meta check reads one)
    )  # fmt: skip


def _append_args(draw) -> tuple[dict[str, Any], dict[str, str], dict, int]:
    """A paged append's arguments: keys ``x`` for a zeroed paged cache (a grown cache is zeroed too), each sequence
    ending at a length that leaves room for one more key (the ``S`` dim is free), through a permuted block table.
    Returns ``(kwargs, dims, bad values, D)``."""
    batch, count, dim = draw(st.integers(0, 3)), draw(st.integers(0, 5)), draw(st.sampled_from([8, 32]))
    block_kv, width = draw(st.sampled_from([4, 16])), draw(st.integers(1, 3))
    num_blocks = max(1, batch * width + draw(st.integers(0, 2)))
    hadamard, one_length = draw(st.booleans()), draw(st.booleans())
    table = torch.randperm(num_blocks)[: batch * width].view(batch, width).to(torch.int32)
    room = width * block_kv
    ends = [draw(st.integers(min(count + 1, room), room)) for _ in range(1 if one_length else batch)]
    lens_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    lens = torch.tensor(ends, dtype=lens_dtype).reshape(() if one_length and draw(st.booleans()) else -1)
    x = rand(batch, count, dim, dtype=draw(st.sampled_from(FLOATS)))
    cache = torch.zeros(num_blocks, block_kv, 1, dim + 4, dtype=torch.uint8)
    kw = dict(x=x, kv_cache=cache, block_table=table, context_lens=lens, hadamard=hadamard)
    dims = {"x": "BSD", "kv_cache": "NKOE", "block_table": "BM"}
    dims["context_lens"] = "" if lens.dim() == 0 or one_length else "B"
    bad = {"context_lens": lambda t: t + room + 1} if batch and count else {}
    return kw, dims, bad, dim


def _assert_appended(cache: torch.Tensor, x: torch.Tensor, table: torch.Tensor, lens: torch.Tensor, hadamard: bool):
    """The cache is zero but for the appended keys' FP8 bytes and scales, where the table puts them."""
    lens = lens.reshape(-1)
    b_, s_, d_ = x.shape
    kv_ = cache.shape[1]
    q, s = tg.fp8_quantize_rows(x, hadamard=hadamard, backend="pytorch")
    want = torch.zeros_like(cache).view(cache.shape[0], -1)
    for b in range(b_):
        for t in range(s_):
            pos = int(lens[min(b, lens.numel() - 1)]) - s_ + t
            blk, slot = int(table[b, pos // kv_]), pos % kv_
            want[blk, slot * d_ : (slot + 1) * d_] = q[b, t].view(torch.uint8)
            want[blk].view(torch.float32)[kv_ * d_ // 4 + slot] = s[b, t]
    assert torch.equal(cache.view(cache.shape[0], -1), want)


def paged_append(draw) -> Case:
    kw, dims, bad, _ = _append_args(draw)

    def reference(call: dict[str, Any], result: torch.Tensor) -> None:
        assert result is call["kv_cache"]
        _assert_appended(result, call["x"], call["block_table"], call["context_lens"], call["hadamard"])

    return Case(
        tg.fp8_paged_append, kw, dims, reference, out=None, compare="asserts", free="SNM", related={"D": "E"},
        contiguous=("kv_cache",), values=bad, bad_dtype=torch.int16, meta_ok=False,
    )  # fmt: skip


def _draw_mask(draw, kw: dict[str, Any], dims: dict[str, str], batch: int, count: int) -> None:
    """Half the time, a decode step's ``attention_mask`` ``[B, S, T]`` into ``kw``: boolean or additive (hidden at
    the dtype's lowest value), 0-70 keys, none, half or all of them visible."""
    if draw(st.booleans()):
        keys, shown = draw(st.integers(0, 70)), draw(st.sampled_from([0.0, 0.5, 1.0]))
        seen = torch.rand(batch, count, keys) < shown
        dtype = draw(st.sampled_from([torch.bool, torch.bfloat16, torch.float16, torch.float32]))
        lowest = 0.0 if dtype == torch.bool else torch.finfo(dtype).min
        kw["attention_mask"] = seen if dtype == torch.bool else torch.where(seen, 0.0, lowest).to(dtype)
        dims["attention_mask"] = "BST"


def _assert_window_ends(mask: torch.Tensor | None, ends: torch.Tensor | None) -> None:
    """``ends``: int32, each mask row's last visible key + 1 (0 where none,
    :func:`~tilegemm.testing.window_ends_float64`); ``None`` without a mask."""
    if mask is None:
        assert ends is None
        return
    assert ends.dtype == torch.int32 and torch.equal(ends.cpu(), window_ends_float64(mask))


def indexer_prepare(draw) -> Case:
    """:func:`paged_append`'s keys as ``k``, with queries ``[B, S, H, D]`` and their weights: the cache as the append
    leaves it, the queries the FP8 rows of ``fp8_quantize_rows``, the weights ``weights * weight_scale * s``."""
    kw, dims, bad, dim = _append_args(draw)
    kw["k"] = kw.pop("x")
    dims = {"k": dims.pop("x"), **dims}
    batch, count = kw["k"].shape[:2]
    heads = draw(st.integers(1, 3))
    kw.update(
        q=rand(batch, count, heads, dim, dtype=draw(st.sampled_from(FLOATS))), weights=torch.randn(batch, count, heads)
    )
    kw.update(weight_scale=draw(st.sampled_from([1.0, 0.125, 3])))
    dims.update(q="BSHD", weights="BSH")
    _draw_mask(draw, kw, dims, batch, count)

    def reference(call: dict[str, Any], result: Any) -> None:
        _assert_appended(call["kv_cache"], call["k"], call["block_table"], call["context_lens"], call["hadamard"])
        q8, w, ends = result
        _, s = tg.fp8_quantize_rows(call["q"], hadamard=call["hadamard"], backend="pytorch")
        assert_fp8_rows(q8, s, call["q"], call["hadamard"])
        assert torch.equal(w, call["weights"].float() * float(call["weight_scale"]) * s)
        _assert_window_ends(call.get("attention_mask"), ends)

    return Case(
        tg.fp8_indexer_prepare, kw, dims, reference, out=None, compare="asserts", free="SNMT", related={"D": "E"},
        contiguous=("kv_cache",), values=bad, bad_dtype=torch.int16, meta_ok=False, scalars=("weight_scale",),
    )  # fmt: skip


def decode_prepare(draw) -> Case:
    """Head weights ``[B, S, H]`` and, half the time, a boolean or additive mask ``[B, S, T]``: the weights times
    ``weight_scale`` in fp32, and the mask rows' last visible key + 1."""
    batch, count, heads = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 9))
    kw = dict(weights=rand(batch, count, heads, dtype=draw(st.sampled_from(FLOATS))))
    kw.update(weight_scale=draw(st.sampled_from([1.0, 0.125, 3])))
    dims = {"weights": "BSH"}
    _draw_mask(draw, kw, dims, batch, count)

    def reference(call: dict[str, Any], result: Any) -> None:
        w, ends = result
        assert torch.equal(w, call["weights"].float() * float(call["weight_scale"]))
        _assert_window_ends(call.get("attention_mask"), ends)

    return Case(
        tg.indexer_decode_prepare, kw, dims, reference, out=None, compare="asserts",
        free="HT" if "attention_mask" in kw else "BSH", bad_dtype=torch.int16, scalars=("weight_scale",), meta_ok=False,
    )  # fmt: skip


def paged(draw) -> Case:
    batch, next_n, h, dim = draw(st.integers(1, 3)), draw(st.integers(0, 2)), draw(st.integers(1, 3)), 32
    block_kv, num_blocks, num_sms = draw(st.sampled_from([4, 16])), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    table_w = draw(st.integers(1, 3))
    lens = [draw(st.integers(next_n, table_w * block_kv)) for _ in range(batch)]
    keys, kscale = fp8(num_blocks, block_kv, dim), scales(num_blocks, block_kv)
    raw = torch.cat([keys.view(torch.uint8).flatten(1), kscale.view(torch.uint8).flatten(1)], 1)
    q, w = fp8(batch, next_n, h, dim), torch.randn(batch * next_n, h)
    width = max(lens) + draw(st.integers(0, 5))
    kw = dict(q=q, kv_cache=raw.view(num_blocks, block_kv, 1, dim + 4), weights=w)
    kw.update(context_lens=torch.tensor(lens, dtype=torch.int32))
    kw.update(block_table=torch.randint(0, num_blocks, (batch, table_w), dtype=torch.int32))
    scheduled = draw(st.booleans())  # without: schedule_meta=None (no schedule)
    meta = torch.tensor(schedule64(lens, block_kv, num_sms), dtype=torch.int32) if scheduled else None
    kw.update(schedule_meta=meta, max_context_len=width, clean_logits=True)
    name = draw(st.sampled_from(["fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits"]))
    dims = {"q": "BTHD", "kv_cache": "QLOE", "weights": "RH", "context_lens": "B", "block_table": "BW"}
    if scheduled:
        dims["schedule_meta"] = "PZ"

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        cache, table = call["kv_cache"], call["block_table"]
        blocks, block = cache.shape[0], cache.shape[1]
        flat = cache.reshape(blocks, -1)
        keys64 = d64(flat[:, : block * dim].contiguous().view(FP8).view(blocks, block, dim))
        scale64 = d64(flat[:, block * dim :].contiguous().view(torch.float32))
        out = torch.full((batch * next_n, width), -math.inf, dtype=torch.float64)
        for b in range(batch):
            blk = table[b].long().repeat_interleave(block)[:width]
            slot = torch.arange(block).repeat(table.shape[1])[:width]
            full = _logits64(q[b], keys64[blk, slot], scale64[blk, slot], w[b * next_n : (b + 1) * next_n])
            for t in range(next_n):
                visible = lens[b] - next_n + t + 1
                out[b * next_n + t, :visible] = full[t, :visible]
        return out

    bad = {"schedule_meta": lambda t: t + 1} if scheduled else {}
    bad["context_lens"] = lambda t: t - 10_000
    if next_n and max(lens):
        bad["block_table"] = lambda t: t + num_blocks
    related = {"B": "R", "T": "R", "D": "E"}
    return Case(
        getattr(tg, name), kw, dims, reference, out=None, free="QLW", contiguous=("kv_cache",), values=bad,
        compare="logits", related=related,
    )  # fmt: skip


EINSUM = {
    "bmk,bnk->mn": ("SMK", "SNK", "MN"),
    "bhr,hdr->bhd": ("BHR", "HDR", "BHD"),
    "bhd,hdr->bhr": ("BHD", "HDR", "BHR"),
}


def einsum(draw) -> Case:
    expr = draw(st.sampled_from(list(EINSUM)))
    da, db, dd = EINSUM[expr]
    size = {x: draw(st.integers(1, 9)) for x in "SMKNBHRD"}
    a, b = rand(*[size[x] for x in da]), rand(*[size[x] for x in db])
    d = torch.full([size[x] for x in dd], math.nan, dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])))
    c = torch.randn(d.shape).to(d.dtype) if draw(st.booleans()) else None

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        return torch.einsum(expr, d64(a), d64(b)) + (d64(c) if c is not None else 0)

    dims = {"a": da, "b": db, "d": dd, "c": dd}
    return Case(tg.einsum, dict(expr=expr, a=a, b=b, d=d, c=c), dims, reference, bar=1e-5)


FP8_EINSUM = {
    "bhr,hdr->bhd": ("BHR", "HDR", "BHD"),
    "bhd,hdr->bhr": ("BHD", "HDR", "BHR"),
    "bhd,bhr->hdr": ("BHD", "BHR", "HDR"),
}


def _expand(data: torch.Tensor, sf: torch.Tensor, dims: str) -> torch.Tensor:
    """float64 ``data * scale`` where lower-case dims of ``sf`` are blocks of 128 of ``data``'s dim."""
    out = d64(sf)
    for axis, letter in enumerate(dims):
        if letter.islower():
            out = out.repeat_interleave(128, dim=axis).narrow(axis, 0, data.shape[axis])
    return d64(data) * out


def fp8_einsum(draw) -> Case:
    expr = draw(st.sampled_from(list(FP8_EINSUM)))
    da, db, dd = FP8_EINSUM[expr]
    size = {"B": draw(st.sampled_from([1, 130])), "H": draw(st.integers(1, 3))}
    size.update(R=draw(st.sampled_from([64, 200])), D=draw(st.sampled_from([64, 130])))
    if expr == "bhd,bhr->hdr":
        size["B"] = draw(st.sampled_from([128, 256]))
        sa_dims, sb_dims = "bHD", "bHR"
    else:
        sa_dims, sb_dims = "BH" + ("r" if expr.startswith("bhr") else "d"), "Hdr"
    shape = lambda dims: [size[x] if x.isupper() else cdiv(size[x.upper()], 128) for x in dims]  # noqa: E731
    aq, sa, bq, sb = fp8(*shape(da)), scales(*shape(sa_dims)), fp8(*shape(db)), scales(*shape(sb_dims))

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        return torch.einsum(expr, _expand(aq, sa, sa_dims), _expand(bq, sb, sb_dims))

    recipe = (1, 1, 128) if expr == "bhd,bhr->hdr" else (1, 128, 128)
    kw = dict(expr=expr, a=(aq, sa), b=(bq, sb), d=torch.full(shape(dd), math.nan), recipe=recipe)
    dims = {"a[0]": da, "a[1]": sa_dims, "b[0]": db, "b[1]": sb_dims, "d": dd}
    return Case(tg.fp8_einsum, kw, dims, reference)


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to TF32 (10 mantissa bits, to nearest even), as float64."""
    bits = x.float().view(torch.int32).long()
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.to(torch.int32).view(torch.float32).double()


def prenorm(draw) -> Case:
    m, n, k = draw(st.integers(0, 12)), draw(st.integers(1, 12)), draw(st.integers(0, 200))
    splits = draw(st.sampled_from([None, 1, 3]))
    a, b = rand(m, k), torch.randn(n, k)
    lead = [] if splits is None else [splits]

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        """``d`` and ``sqr_sum`` (summed over splits) side by side: [M, N + 1]."""
        got_d, got_s = d64(call["d"]), d64(call["sqr_sum"])
        got_d, got_s = (got_d.sum(0), got_s.sum(0)) if splits else (got_d, got_s)
        want = torch.cat([d64(a) @ tf32_round(b).T, (d64(a) ** 2).sum(1, keepdim=True)], 1)
        return want, torch.cat([got_d, got_s[:, None]], 1)

    kw = dict(a=a, b=b, d=torch.full([*lead, m, n], math.nan), sqr_sum=torch.full([*lead, m], math.nan))
    kw["num_splits"] = splits
    p = "P" if splits else ""
    dims = {"a": "MK", "b": "NK", "d": p + "MN", "sqr_sum": p + "M"}
    return Case(tg.tf32_hc_prenorm_gemm, kw, dims, reference, compare="pair", contiguous=("sqr_sum",))


def rms_norm(draw) -> Case:
    lead = draw(st.lists(st.integers(0, 6), min_size=1, max_size=2))
    h = draw(st.integers(1, 300))
    dtype, w_dtype = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS))
    differentiable = draw(st.booleans())

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        return rms_norm_float64(call["x"], call["weight"], call["eps"])

    kw = dict(x=rand(*lead, h, dtype=dtype), weight=rand(h, dtype=w_dtype), eps=draw(st.sampled_from([1e-6, 0.0, 2])))
    dims = {"x": "ABH"[-len(lead) - 1 :], "weight": "H"}
    op = tg.autograd.rms_norm if differentiable else tg.rms_norm
    return Case(op, kw, dims, reference, out=None, free="AB", bad_dtype=torch.int32, dispatched=not differentiable)


FLOATS = [torch.bfloat16, torch.float16, torch.float32]


def sparse_decode_attention(draw) -> Case:
    b, h, t = draw(st.integers(0, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 40))
    dim, dim_v, count = draw(st.integers(1, 70)), draw(st.integers(1, 70)), draw(st.integers(1, 12))
    dtype = draw(st.sampled_from(FLOATS))
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    indices = torch.randint(0, t, (b, count), dtype=index_dtype)
    mask = draw(st.sampled_from([None, "bool", "additive"]))
    if mask is not None:
        visible = torch.rand(b, t) > 0.3
        mask = visible if mask == "bool" else torch.zeros(b, t, dtype=dtype).masked_fill(~visible, -math.inf)
    scale = draw(st.sampled_from([0.125, 1, 3.0]))
    kw = dict(q=rand(b, h, dim, dtype=dtype), k=rand(b, 1, t, dim, dtype=dtype), v=rand(b, 1, t, dim_v, dtype=dtype))
    kw.update(indices=indices, scale=scale, mask=mask)

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        q, k, v = d64(call["q"]), d64(call["k"])[:, 0], d64(call["v"])[:, 0]
        rows = call["indices"].long()
        logits = torch.stack([q[i] @ k[i][rows[i]].T for i in range(b)]) * scale if b else torch.zeros(0, h, count)
        if call["mask"] is not None:
            at = torch.stack([call["mask"][i][rows[i]] for i in range(b)]) if b else torch.zeros(0, count)
            bias = torch.where(at, 0.0, -math.inf) if at.dtype == torch.bool else d64(at)
            logits = logits + bias[:, None, :].double()
        weights = torch.softmax(logits, -1).nan_to_num(0.0)
        return torch.stack([weights[i] @ v[i][rows[i]] for i in range(b)]) if b else torch.zeros(0, h, dim_v)

    dims = {"q": "BHD", "k": "BGTD", "v": "BGTE", "indices": "BK"} | ({"mask": "BT"} if mask is not None else {})
    return Case(
        tg.sparse_decode_attention, kw, dims, reference, out=None, bar=1e-5, free="HEK", contiguous=("q", "k", "v"),
        bad_dtype=torch.int16, meta_ok=False,
    )  # fmt: skip


def matmul(draw) -> Case:
    m, k, n = draw(st.integers(1, 12)), draw(st.integers(1, 40)), draw(st.integers(1, 12))

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        return d64(call["a"]) @ d64(call["b"])

    kw, dims = dict(a=rand(m, k), b=rand(k, n)), {"a": "MK", "b": "KN"}
    return Case(tg.matmul, kw, dims, reference, out=None, bar=1e-5, free="MN", dispatched=False, meta_ok=False)


def grouped_matmul(draw) -> Case:
    groups, k, n = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 12))
    ends = np.cumsum([draw(st.integers(0, 10)) for _ in range(groups)]).tolist()
    m = ends[-1] + draw(st.integers(0, 3))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    transposed = draw(st.booleans())
    w = rand(groups, k, n, dtype=dtype) if transposed else rand(groups, n, k, dtype=dtype)

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        x, w = call["x"], d64(call["w"]) if call["transposed"] else d64(call["w"]).mT
        ref, start = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64), 0
        for g, end in enumerate(ends):
            ref[start:end] = d64(x[start:end]) @ w[g]
            start = end
        return ref

    kw = dict(x=rand(m, k, dtype=dtype), w=w, offs=torch.tensor(ends, dtype=torch.int32), transposed=transposed)
    dims = {"x": "MK", "w": "GKN" if transposed else "GNK", "offs": "G"}
    bad = {"offs": lambda t: t + m + 1}
    return Case(
        tg.grouped_matmul, kw, dims, reference, out=None, bar=1e-5, values=bad, free="MN", bad_dtype=torch.int16,
        dispatched=False, meta_ok=False,
    )  # fmt: skip


def fp8_grouped_matmul(draw) -> Case:
    groups, k, n = draw(st.integers(1, 3)), draw(st.sampled_from([64, 200])), draw(st.integers(1, 20))
    ends = np.cumsum([draw(st.integers(0, 10)) for _ in range(groups)]).tolist()
    m = ends[-1] + draw(st.integers(0, 3))
    w = rand(groups, n, k)
    wq, sw = tg.per_block_cast_to_fp8(w)

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        x, (wq, sw) = call["x"], call["w_fp8"]
        xq, sx = tg.per_token_cast_to_fp8(x)
        xd, wd = dequantize(xq, sx, 1), dequantize(wq, sw, 128)
        ref, start = torch.zeros(x.shape[0], wq.shape[1], dtype=torch.float64), 0
        for g, end in enumerate(ends):
            ref[start:end] = xd[start:end] @ wd[g].T
            start = end
        return ref

    kw = dict(x=rand(m, k), w=w, offs=torch.tensor(ends, dtype=torch.int32), w_fp8=(wq, sw))
    dims = {"x": "MK", "w": "GNK", "offs": "G", "w_fp8[0]": "GNK", "w_fp8[1]": "Gnk"}
    bad = {"offs": lambda t: t + m + 1}
    return Case(
        tg.fp8_grouped_matmul, kw, dims, reference, out=None, bar=1e-5, values=bad, free="MN",
        bad_dtype=torch.int16, dispatched=False, meta_ok=False,
    )  # fmt: skip


def fp8_linear(draw) -> Case:
    lead, k, n = draw(st.sampled_from([[3], [2, 2], [0]])), draw(st.sampled_from([64, 200])), draw(st.integers(1, 20))
    bias = rand(n) if draw(st.booleans()) else None

    def reference(call: dict[str, Any], _: Any) -> torch.Tensor:
        x, weight = call["x"], call["weight"]
        xq, sx = tg.per_token_cast_to_fp8(x.reshape(-1, k))
        wq, sw = tg.per_block_cast_to_fp8(weight)
        out = (dequantize(xq, sx, 1) @ dequantize(wq, sw, 128).T).reshape(*x.shape[:-1], weight.shape[0])
        return out + (d64(call["bias"]) if call["bias"] is not None else 0)

    dims = {"x": "AK" if len(lead) == 1 else "ACK", "weight": "NK", "bias": "N"}
    kw = dict(x=rand(*lead, k), weight=rand(n, k), bias=bias)
    free = "AC" + ("N" if bias is None else "")
    return Case(tg.fp8_linear, kw, dims, reference, out=None, bar=1e-5, free=free, dispatched=False, meta_ok=False)


CAST_GRAN = {"token": (1, 128), "channel": (128, 1), "block": (128, 128)}
CAST_SHAPES = {
    "token": [[5, 200], [2, 3, 130], [0, 4]],
    "channel": [[200, 5], [1, 1]],
    "block": [[130, 260], [2, 5, 140]],
}


def _blocks(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``x`` as fp32 [lead, rows, cols] with the cast's blocks on the last two dims."""
    if kind == "token":
        return x.float().reshape(-1, 1, x.shape[-1])
    return x.float().reshape(-1, *x.shape[-2:])


def casts(draw) -> Case:
    kind = draw(st.sampled_from(list(CAST_GRAN)))
    x = torch.randn(*draw(st.sampled_from(CAST_SHAPES[kind]))) * 10
    fn = getattr(tg, f"per_{kind}_cast_to_fp8")
    gr, gc = CAST_GRAN[kind]

    def reference(call: dict[str, Any], result: Any) -> None:
        """Scales are ``max(amax, 1e-4) / 448`` per block, data ``x / scale`` cast to FP8: both exactly."""
        q, s = result
        view = _blocks(call["x"], kind)
        lead, rows, cols = view.shape
        sf = s.reshape(lead, cdiv(rows, gr), cdiv(cols, gc))
        amax = torch.zeros_like(sf)
        for i in range(sf.shape[1]):
            for j in range(sf.shape[2]):
                block = view[:, i * gr : (i + 1) * gr, j * gc : (j + 1) * gc]
                amax[:, i, j] = block.abs().amax(dim=(1, 2)) if block.numel() else 0
        assert torch.equal(sf, amax.clamp(min=1e-4) / 448)
        full = sf.repeat_interleave(gr, 1)[:, :rows].repeat_interleave(gc, 2)[:, :, :cols]
        expected = (view / full).clamp(-448, 448).to(FP8)
        assert torch.equal(q.reshape(view.shape).view(torch.uint8), expected.view(torch.uint8))

    dims = {"x": "PQR"[: x.dim()]}
    return Case(
        fn, dict(x=x), dims, reference, out=None, compare="asserts", free="PQR", bad_dtype=torch.int32,
        dispatched=False, meta_ok=False,
    )  # fmt: skip


def tma_aligned(draw) -> Case:
    sf = torch.randn(*draw(st.sampled_from([[5, 3], [2, 7, 2], [4, 1]])))
    sf = sf.mT.contiguous().mT if draw(st.booleans()) else sf

    def reference(call: dict[str, Any], out: torch.Tensor) -> None:
        """The same values, MN-major with the MN stride padded to 16 bytes."""
        assert torch.equal(out, call["sf"])
        assert out.stride(-2) == 1 and out.stride(-1) == tg.get_tma_aligned_size(out.shape[-2], out.element_size())

    return Case(
        tg.get_mn_major_tma_aligned_tensor, dict(sf=sf), {"sf": "PQR"[: sf.dim()]}, reference, out=None,
        compare="asserts", free="PQR", bad_dtype=torch.int32, dispatched=False, meta_ok=False,
    )  # fmt: skip


def diff(draw) -> Case:
    x = torch.randn(draw(st.integers(0, 6)), 3, dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])))
    y = x + (0.01 * torch.randn(x.shape)).to(x.dtype)

    def reference(call: dict[str, Any], got: float) -> None:
        """``1 - 2 sum(xy) / sum(x^2 + y^2)`` in float64 (0 for two zero tensors)."""
        x64, y64 = d64(call["x"]), d64(call["y"])
        denom = float((x64 * x64 + y64 * y64).sum())
        want = 0.0 if denom == 0 else 1 - 2 * float((x64 * y64).sum()) / denom
        assert abs(got - want) <= 1e-12

    return Case(
        tg.calc_diff, dict(x=x, y=y), {"x": "MK", "y": "MK"}, reference, out=None, compare="asserts",
        dtype_free=True, dispatched=False, meta_ok=False,
    )  # fmt: skip


FAMILIES: dict[str, Callable[[Any], Case]] = {
    "dense_bf16": lambda draw: dense(draw, False),
    "dense_fp8": lambda draw: dense(draw, True),
    "cublaslt": cublaslt,
    "moe_experts": moe_experts,
    "fp8_moe_experts": fp8_moe_experts,
    "skip_head_mid": skip_head_mid,
    "m_grouped_bf16": lambda draw: m_grouped(draw, False),
    "m_grouped_fp8": lambda draw: m_grouped(draw, True),
    "masked_bf16": lambda draw: masked(draw, False),
    "masked_fp8": lambda draw: masked(draw, True),
    "k_grouped_bf16": lambda draw: k_grouped(draw, "bf16"),
    "k_grouped_fp8_tn": lambda draw: k_grouped(draw, "tn"),
    "k_grouped_fp8_nt": lambda draw: k_grouped(draw, "nt"),
    "mqa": mqa,
    "bf16_mqa": bf16_mqa,
    "mqa_batched": mqa_batched,
    "metadata": metadata,
    "fp8_rows": fp8_rows,
    "paged_append": paged_append,
    "indexer_prepare": indexer_prepare,
    "decode_prepare": decode_prepare,
    "paged_mqa": paged,
    "einsum": einsum,
    "fp8_einsum": fp8_einsum,
    "tf32_hc_prenorm_gemm": prenorm,
    "rms_norm": rms_norm,
    "sparse_decode_attention": sparse_decode_attention,
    "matmul": matmul,
    "grouped_matmul": grouped_matmul,
    "fp8_grouped_matmul": fp8_grouped_matmul,
    "fp8_linear": fp8_linear,
    "casts": casts,
    "tma_aligned": tma_aligned,
    "calc_diff": diff,
}


# ------------------------------------------------------------------------------ mutations


@dataclass
class Outcome:
    """What a mutated call must do: succeed, or raise ``error`` naming one of ``slots``."""

    kwargs: dict[str, Any]
    error: type[Exception] | None = None
    slots: list[str] = field(default_factory=list)
    meta: bool = False


def tensor_slots(case: Case) -> list[str]:
    return [s for s in case.dims if isinstance(get_or_none(case.kwargs, s), torch.Tensor)]


def get_or_none(kwargs: dict, slot: str) -> Any:
    name = slot.partition("[")[0]
    return get(kwargs, slot) if kwargs.get(name) is not None else None


def mutate(draw, case: Case) -> Outcome:
    slots = tensor_slots(case)
    kinds = ["none", "dtype", "type", "shape", "strided"]
    kinds += ["device"] if len(slots) > 1 else []
    kinds += ["meta"] if case.meta_ok else []
    kinds += ["scalar"] if case.scalars else []
    kinds += ["values"] if case.values else []
    kinds += ["requires_grad"] if case.out else []
    kind = draw(st.sampled_from(kinds))
    kw = case.kwargs
    if kind == "none":
        return Outcome(kw)
    if kind == "meta":
        moved = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        moved = {
            k: tuple(t.to("meta") for t in v) if isinstance(v, tuple) and isinstance(v[0], torch.Tensor) else v
            for k, v in moved.items()
        }
        return Outcome(moved, meta=True)
    if kind == "scalar":
        name = draw(st.sampled_from(case.scalars))
        if draw(st.booleans()):
            return Outcome(put(kw, name, draw(st.sampled_from(GOOD_SCALARS))))
        value, error = draw(st.sampled_from(BAD_SCALARS))
        return Outcome(put(kw, name, value), error, [name])
    if kind == "requires_grad":
        return Outcome(put(kw, case.out, get(kw, case.out).clone().requires_grad_()), ValueError, [case.out])
    if kind == "values":
        slot = draw(st.sampled_from(sorted(case.values)))
        return Outcome(put(kw, slot, case.values[slot](get(kw, slot))), ValueError, [slot])
    slot = draw(st.sampled_from(slots[1:] if kind == "device" else slots))
    x = get(kw, slot)
    if kind == "dtype":
        bad = case.bad_dtype or BAD_DTYPE.get(x.dtype, torch.float16)
        return Outcome(put(kw, slot, x.to(bad)), None if case.dtype_free else TypeError, [slot])
    if kind == "type":
        if "[" in slot and draw(st.booleans()):  # the (data, scales) tuple replaced by its data
            name = slot.partition("[")[0]
            return Outcome(put(kw, name, get(kw, f"{name}[0]")), TypeError, [name])
        return Outcome(put(kw, slot, x.tolist()), TypeError, [slot])
    if kind == "device":
        return Outcome(put(kw, slot, x.to("meta")), ValueError, [slot])
    if kind == "strided":
        view = strided(x)
        if (slot == case.out or slot in case.contiguous) and not view.is_contiguous():
            return Outcome(put(kw, slot, view), ValueError, [slot])
        return Outcome(put(kw, slot, view))
    # shape: one dim one longer; the error names a slot sharing that dim (or the slot itself)
    letters = [(i, ch) for i, ch in enumerate(case.dims[slot]) if ch not in case.free]
    if not letters:
        return Outcome(kw)
    axis, letter = draw(st.sampled_from(letters))
    shape = list(x.shape)
    shape[axis] += 1
    grown = torch.zeros(shape, dtype=torch.float32).to(x.dtype)
    sharing = [s for s, dims in case.dims.items() if any(ch in dims for ch in letter + case.related.get(letter, ""))]
    return Outcome(put(kw, slot, grown), ValueError, sharing + [s.partition("[")[0] for s in [*sharing, slot]])


# ------------------------------------------------------------------------------- the test


def call(case: Case, kwargs: dict[str, Any]) -> Any:
    if case.dispatched:
        return case.op(**kwargs, backend="pytorch")
    with tg.use_backend("pytorch"):
        return case.op(**kwargs)


def check_result(case: Case, kwargs: dict[str, Any], result: Any) -> None:
    got = get(kwargs, case.out) if case.out else result
    if case.compare == "asserts":
        case.reference(kwargs, result)
        return
    if case.compare == "pair":
        want, got = case.reference(kwargs, result)
        assert calc_diff(want, got) < case.bar
        return
    want = case.reference(kwargs, result)
    assert list(got.shape) == list(want.shape)
    if case.compare == "exact":
        assert torch.equal(d64(got), want)
    elif case.compare in ("logits", "nan_aware"):
        masked_ = torch.isinf(want) if case.compare == "logits" else torch.isnan(want)
        assert torch.equal(masked_, torch.isinf(d64(got)) if case.compare == "logits" else torch.isnan(d64(got)))
        assert calc_diff(d64(got)[~masked_], want[~masked_]) < case.bar
    else:
        assert calc_diff(d64(got), want) < case.bar


def run_case(case: Case, outcome: Outcome) -> None:
    out = get(outcome.kwargs, case.out) if case.out else None
    before = snapshot(out)
    try:
        result = call(case, outcome.kwargs)
    except (TypeError, ValueError, NotImplementedError) as exc:
        assert outcome.error is not None, f"a valid call was rejected: {type(exc).__name__}: {exc}"
        assert isinstance(exc, outcome.error), f"expected {outcome.error.__name__}, got {type(exc).__name__}: {exc}"
        assert names(str(exc), outcome.slots), f"the message names none of {outcome.slots}: {exc}"
        if before is not None:
            assert torch.equal(snapshot(out), before), "the output was written before the error"
        return
    assert outcome.error is None, (
        f"bad input accepted silently (expected {outcome.error.__name__} naming {outcome.slots})"
    )
    if outcome.meta:
        got = out if case.out else result
        assert got.device.type == "meta"
        return
    check_result(case, outcome.kwargs, result)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@SETTINGS
@given(data=st.data())
def test_fuzz(family, data):
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    case = FAMILIES[family](data.draw)
    outcome = mutate(data.draw, case)
    run_case(case, outcome)


def test_every_public_tensor_op_is_fuzzed():
    """The families above reach every public op that takes tensors (mega-MoE: NotImplementedError)."""
    reached = {
        "bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn", "bf16_gemm_tt", "fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_tn",
        "fp8_gemm_tt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_nt", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
        "fp8_gemm_nt_skip_head_mid", "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
        "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked",
        "bf16_m_grouped_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
        "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous",
        "fp8_mqa_logits", "fp8_fp4_mqa_logits", "bf16_mqa_logits", "get_paged_mqa_logits_metadata",
        "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits", "einsum", "fp8_einsum", "tf32_hc_prenorm_gemm", "matmul",
        "grouped_matmul",
        "fp8_grouped_matmul", "fp8_linear", "per_token_cast_to_fp8", "per_channel_cast_to_fp8", "per_block_cast_to_fp8",
        "get_mn_major_tma_aligned_tensor", "calc_diff", "cublaslt_gemm_nn", "cublaslt_gemm_nt", "cublaslt_gemm_tn",
        "cublaslt_gemm_tt", "moe_experts", "fp8_moe_experts", "rms_norm", "sparse_decode_attention",
        "mqa_logits_batched", "fp8_quantize_rows", "fp8_paged_append", "fp8_indexer_prepare",
        "indexer_decode_prepare",
    }  # fmt: skip
    aliases = {
        "m_grouped_fp8_fp4_gemm_nt_contiguous",
        "m_grouped_fp8_fp4_gemm_nn_contiguous",
        "m_grouped_fp8_fp4_gemm_nt_masked",
    }
    # Not fuzzed here yet: the two halves of tilegemm.autograd.moe_experts. The forward's check is moe_experts_check
    # (fuzzed through moe_experts); both are tested against float64 and for bad input in test_moe_experts_train.py.
    training_halves = {"moe_experts_forward", "moe_experts_backward"}
    ops = set(tg.list_ops()) | {"matmul", "grouped_matmul", "fp8_grouped_matmul", "fp8_linear"}
    assert ops - reached - aliases - training_halves == set()
    assert reached <= set(tg.__all__)
