"""Recorded kernel launches of a fixed set of calls on CPU tensors (dense, grouped, MoE experts, einsum, MQA, RMSNorm),
to show a host-path refactor launches the same kernels with the same arguments (CPU only: nothing runs, every launch
is intercepted).

    PYTHONPATH=src python tests/launch_record.py OUT.json
    python tests/launch_record.py --compare A.json B.json

Run it at two commits (e.g. with another checkout's ``src`` on ``PYTHONPATH``) and compare the files. Every call goes
through the public op with ``backend=`` (cutile, and gluon for dense FP8), made to believe its backend can run CPU
tensors; each call is made twice (the second may take the hot lane). A launch is recorded as: the stream it was
given, the grid, the kernel (its function's name and compiler options; gluon: the constexprs), and every argument
(a tensor as dtype, shape, strides, storage offset, the call's tensor whose storage it views or ``new``, and a hash
of its contents; scalars as they are). Buffers the host path allocates with ``torch.empty`` / ``torch.empty_like``
come zero-filled while recording, so their hashes do not depend on what the allocator handed back.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

STREAM_ID = 7


class _FakeStream:
    """What a launch is handed for the current stream on the CPU."""

    cuda_stream = STREAM_ID
    device_index = 0

    def __repr__(self) -> str:
        return f"stream({self.cuda_stream})"


def _digest(t: torch.Tensor) -> str:
    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha1(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:12]


class Recorder:
    """Describes launch arguments relative to the tensors of the call being recorded."""

    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []
        self.names: dict[int, str] = {}

    def name_inputs(self, named: dict[str, Any]) -> None:
        self.names = {}
        for key, value in named.items():
            for i, t in enumerate(value if isinstance(value, (tuple, list)) else (value,)):
                if isinstance(t, torch.Tensor):
                    self.names.setdefault(t.untyped_storage().data_ptr(), f"{key}[{i}]" if t is not value else key)

    def describe(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            owner = self.names.get(x.untyped_storage().data_ptr(), "new")
            return ["tensor", str(x.dtype), list(x.shape), list(x.stride()), x.storage_offset(), owner, _digest(x)]
        if hasattr(x, "base") and isinstance(x.base, torch.Tensor):  # a gluon TMA descriptor
            return ["desc", self.describe(x.base), list(x.shape), list(x.strides), getattr(x, "padding", None)]
        if isinstance(x, (tuple, list)):
            return [self.describe(v) for v in x]
        if isinstance(x, float):
            return repr(x)
        if isinstance(x, (int, bool, str)) or x is None:
            return x
        return repr(x)

    def record(self, backend: str, stream: Any, grid: Any, kernel: str, options: Any, args: Any) -> None:
        self.launches.append(
            {
                "backend": backend,
                "stream": getattr(stream, "cuda_stream", stream),
                "grid": list(grid),
                "kernel": kernel,
                "options": options,
                "args": [self.describe(a) for a in args],
            }
        )


@contextlib.contextmanager
def intercepted(rec: Recorder) -> Iterator[None]:
    """Launches recorded instead of run; cutile and gluon treat CPU tensors as theirs; 132 SMs."""
    import cuda.tile as ct

    import tilegemm
    from tilegemm.backend import registry
    from tilegemm.ops.cutile import launch

    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, attr: str, value: Any) -> None:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    def ct_launch(stream, grid, kernel, args):
        rec.record("cutile", stream, grid, kernel._pyfunc.__name__, repr(kernel._compiler_options), args)

    original_unavailable = registry._unavailable_reason

    def unavailable(name, backend, arguments):
        if backend in ("cutile", "gluon") and backend in registry._IMPLS.get(name, {}):
            return None
        return original_unavailable(name, backend, arguments)

    real_empty, real_empty_like = torch.empty, torch.empty_like

    def zeroed(make):
        def empty(*args, **kwargs):
            t = make(*args, **kwargs)
            t.untyped_storage().fill_(0)
            return t

        return empty

    patch(ct, "launch", ct_launch)
    patch(torch, "empty", zeroed(real_empty))
    patch(torch, "empty_like", zeroed(real_empty_like))
    patch(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    patch(launch, "current_stream", lambda: _FakeStream())
    patch(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    patch(registry, "_unavailable_reason", unavailable)
    patch(tilegemm.config, "_num_sms", 132)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_gluon_intercepted(rec, patch))
        try:
            yield
        finally:
            for obj, attr, value in reversed(saved):
                setattr(obj, attr, value)
            clear_all_plans()


def clear_all_plans() -> None:
    """Forget every launch plan and hot-lane replay, of both kernel backends (whichever checkout this is)."""
    from tilegemm.ops.cutile import launch

    launch.clear_plans()
    with contextlib.suppress(Exception):
        from tilegemm.ops.gluon import gemm

        getattr(gemm, "_PLANS", {}).clear()


@contextlib.contextmanager
def _gluon_intercepted(rec: Recorder, patch: Callable[[Any, str, Any], None]) -> Iterator[None]:
    """The gluon kernels' JIT calls and their compiled kernels' launchers, recorded."""
    try:
        from tilegemm.ops.gluon import fp8_gemm_kernel, fp8_gemm_ws
    except Exception:  # no triton here: dense FP8 on gluon is not recorded
        yield
        return
    patch(fp8_gemm_kernel, "fp8_gemm_kernel", _recorded_jit(rec, fp8_gemm_kernel.fp8_gemm_kernel, "fp8_gemm_kernel"))
    patch(fp8_gemm_ws, "fp8_gemm_ws_kernel", _recorded_jit(rec, fp8_gemm_ws.fp8_gemm_ws_kernel, "fp8_gemm_ws_kernel"))
    from tilegemm.ops.gluon import tma

    if hasattr(tma, "current_stream"):  # the relaunch's stream (a checkout before it read torch.cuda.current_stream)
        patch(tma, "current_stream", lambda device: STREAM_ID)
    yield


def _recorded_jit(rec: Recorder, real: Any, label: str) -> Any:
    """Stands in for the gluon kernel ``real``: ``kernel[grid](**kwargs)`` and the compiled kernel's ``run`` record a
    launch named ``label`` (``label[compiled]``)."""

    class Compiled:
        function = packed_metadata = None

        def __init__(self, consts: dict[str, Any]) -> None:
            self.consts = consts

        def launch_metadata(self, grid, stream, *values):
            return None

        def run(self, gx, gy, gz, stream, function, packed, meta, enter, exit_, *values):
            rec.record("gluon", stream, (gx, gy, gz), f"{label}[compiled]", repr(self.consts), values)

    class Jit:
        arg_names = real.arg_names

        def __getitem__(self, grid):
            def call(**kwargs):
                named = sorted((k, v) for k, v in kwargs.items() if k not in real.arg_names)
                args = [kwargs[k] for k in real.arg_names if k in kwargs]
                rec.record("gluon", torch.cuda.current_stream(), grid, label, repr(named), args)
                return Compiled(named)

            return call

    return Jit()


# ------------------------------------------------------------------------------------------------- the calls


def _fp8(x: torch.Tensor, block: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from tilegemm.quant import per_block_cast_to_fp8, per_token_cast_to_fp8

    return per_block_cast_to_fp8(x) if block else per_token_cast_to_fp8(x)


def _layout(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x.t().contiguous() if transposed else x


def dense_calls() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(id, call, its tensors by name) of every recorded dense call."""
    import tilegemm

    shapes = [(1, 256, 512), (8, 512, 256), (64, 2112, 1024), (300, 512, 512), (512, 1024, 384), (96, 136, 200)]
    layouts = {"nt": (False, False), "nn": (False, True), "tn": (True, True), "tt": (True, False)}
    for m, n, k in shapes:
        for layout, (ta, tb) in layouts.items():
            for with_c in (False, True):
                g = torch.Generator().manual_seed(m * 7 + n + k)
                a = torch.randn(m, k, generator=g).bfloat16()
                b = torch.randn(n, k, generator=g).bfloat16()
                c = torch.randn(m, n, generator=g).bfloat16() if with_c else None
                d = torch.zeros(m, n, dtype=torch.float32 if with_c else torch.bfloat16)
                aa, bb = _layout(a, ta), _layout(b, tb)  # tn / tt: a [K, M]; nn / tt: b [K, N]
                op = getattr(tilegemm, f"bf16_gemm_{layout}")
                kw = {"alpha": 0.5, "beta": 2.0} if with_c else {}
                tensors = {"a": aa, "b": bb, "c": c, "d": d}
                yield (
                    f"bf16_{layout}_{m}x{n}x{k}{'_c' if with_c else ''}",
                    (lambda op=op, aa=aa, bb=bb, d=d, c=c, kw=kw: op(aa, bb, d, c, backend="cutile", **kw)),
                    tensors,
                )
                if layout not in ("nt", "nn"):
                    continue
                for block in (True, False):
                    qa = _fp8(a, False)
                    qb = _fp8(b, block)
                    if tb:  # nn: b [K, N] with its scales in the data's orientation
                        qb = (qb[0].t().contiguous(), qb[1].t().contiguous())
                    recipe = (1, 128, 128) if block else (1, 1, 128)
                    for backend in ("cutile", "gluon"):
                        op = getattr(tilegemm, f"fp8_gemm_{layout}")
                        tensors = {"a": qa, "b": qb, "c": c, "d": d}
                        yield (
                            f"fp8_{layout}_{m}x{n}x{k}_{recipe[1]}{'_c' if with_c else ''}_{backend}",
                            (
                                lambda op=op, qa=qa, qb=qb, d=d, c=c, kw=kw, recipe=recipe, be=backend: op(
                                    qa, qb, d, c, recipe=recipe, backend=be, **kw
                                )
                            ),
                            tensors,
                        )


def grouped_calls() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(id, call, its tensors by name) of a few m-grouped, masked and k-grouped calls (cutile)."""
    import tilegemm

    g = torch.Generator().manual_seed(3)
    groups, n, k = 3, 256, 384
    m_indices = torch.tensor([0] * 128 + [-1] * 128 + [2] * 256 + [1] * 128, dtype=torch.int32)
    m_sum = m_indices.numel()
    a = torch.randn(m_sum, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    d = torch.zeros(m_sum, n, dtype=torch.bfloat16)
    t = {"a": a, "b": b, "d": d, "m_indices": m_indices}
    yield (
        "m_grouped_bf16_nt",
        lambda: tilegemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices, backend="cutile"),
        t,
    )
    offs = torch.tensor([100, 300, 640], dtype=torch.int32)
    t = {"a": a, "b": b, "d": d, "offs": offs}
    yield (
        "m_grouped_bf16_nt_psum",
        lambda: tilegemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, offs, use_psum_layout=True, backend="cutile"),
        t,
    )
    qa = _fp8(a, False)
    qb = [_fp8(b[i], True) for i in range(groups)]
    qb = (torch.stack([x[0] for x in qb]), torch.stack([x[1] for x in qb]))
    t = {"a": qa, "b": qb, "d": d, "m_indices": m_indices}
    yield (
        "m_grouped_fp8_nt",
        lambda: tilegemm.m_grouped_fp8_gemm_nt_contiguous(qa, qb, d, m_indices, backend="cutile"),
        t,
    )
    mmax = 64
    am = torch.randn(groups, mmax, k, generator=g).bfloat16()
    dm = torch.zeros(groups, mmax, n, dtype=torch.bfloat16)
    masked_m = torch.tensor([10, 64, 0], dtype=torch.int32)
    t = {"a": am, "b": b, "d": dm, "masked_m": masked_m}
    yield (
        "m_grouped_bf16_masked",
        lambda: tilegemm.m_grouped_bf16_gemm_nt_masked(am, b, dm, masked_m, 32, backend="cutile"),
        t,
    )
    ks = [128, 0, 256]
    ak = torch.randn(sum(ks), 128, generator=g).bfloat16()
    bk = torch.randn(sum(ks), n, generator=g).bfloat16()
    dk = torch.zeros(groups, 128, n, dtype=torch.float32)
    ks_t = torch.tensor(ks, dtype=torch.int32)
    t = {"a": ak, "b": bk, "d": dk, "ks": ks_t}
    yield (
        "k_grouped_bf16_tn",
        lambda: tilegemm.k_grouped_bf16_gemm_tn_contiguous(ak, bk, dk, ks, ks_t, backend="cutile"),
        t,
    )


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` set to ``value`` (``None``: unset) inside the block."""
    import os

    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def _moe_inputs(t: int, k: int, e: int, h: int, i: int, seed: int) -> dict[str, torch.Tensor]:
    """BF16 experts inputs: ids with a dropped slot (-1) and an out-of-range one (E) where there are slots."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    if t * k > 2:
        ids[0, 0], ids[-1, -1] = -1, e
    return {
        "hidden": torch.randn(t, h, generator=g).bfloat16(),
        "topk_ids": ids,
        "topk_weights": torch.softmax(torch.randn(t, k, generator=g), dim=-1),
        "w13": (torch.randn(e, 2 * i, h, generator=g) / h**0.5).bfloat16(),
        "w2": (torch.randn(e, h, i, generator=g) / i**0.5).bfloat16(),
    }


def moe_calls() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(id, call, its tensors by name) of the fused experts: BF16 on each of its three paths (forced by
    ``TILEGEMM_MOE_VARIANT`` and chosen by size), FP8 in both forms, the training forward and backward (cutile)."""
    import tilegemm
    from tilegemm.ops import api  # the training ops are dispatched ops, not public names

    # (t, k, e, h, i, variant): the variant forced on one shape, then each path by its size.
    cases = [(6, 2, 16, 256, 128, v) for v in ("slots", "blocks", "sorted")]
    cases += [(4, 2, 64, 256, 192, None), (96, 4, 16, 256, 128, None), (1024, 8, 8, 256, 128, None)]
    for t, k, e, h, i, variant in cases:
        x = _moe_inputs(t, k, e, h, i, seed=t + e)

        def call(x=x, variant=variant):
            with _env("TILEGEMM_MOE_VARIANT", variant):
                return tilegemm.moe_experts(**x, backend="cutile")

        yield f"moe_bf16_{t}x{k}x{e}x{h}x{i}_{variant or 'auto'}", call, x
    for t, k, e in ((8, 2, 16), (1024, 4, 8)):  # the block form, the row form
        x = _moe_inputs(t, k, e, 256, 256, seed=t)
        x["w13"] = _fp8(x["w13"].float(), True)
        x["w2"] = _fp8(x["w2"].float(), True)
        yield f"moe_fp8_{t}x{k}x{e}", (lambda x=x: tilegemm.fp8_moe_experts(**x, backend="cutile")), x
    x = _moe_inputs(40, 2, 8, 256, 128, seed=5)
    yield "moe_train_forward", (lambda: api.moe_experts_forward(**x, backend="cutile")), x
    _, state = api.moe_experts_forward(**x, backend="pytorch")
    grad = torch.randn(x["hidden"].shape, generator=torch.Generator().manual_seed(9)).bfloat16()
    args = {"grad_out": grad, **{n: x[n] for n in ("hidden", "topk_weights", "w13", "w2")}, "state": state}
    named = {**args, **state._asdict()}
    for needs in ((True, True, True, True), (False, True, False, True)):
        yield (
            f"moe_train_backward_{''.join('1' if n else '0' for n in needs)}",
            (lambda needs=needs: api.moe_experts_backward(**args, needs=needs, backend="cutile")),
            named,
        )


def einsum_calls() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(id, call, its tensors by name) of the BF16 and FP8 einsum expressions and the pre-norm GEMM (cutile)."""
    import tilegemm

    g = torch.Generator().manual_seed(11)
    a = torch.randn(1, 1024, 128, generator=g).bfloat16()  # enough tiles: no split
    b = torch.randn(1, 1024, 128, generator=g).bfloat16()
    for with_c in (False, True):
        d = torch.zeros(1024, 1024, dtype=torch.float32)
        c = torch.randn(1024, 1024, generator=g) if with_c else None
        t = {"a": a, "b": b, "d": d, "c": c}
        yield (
            f"einsum_bmk_{with_c}",
            (lambda a=a, b=b, d=d, c=c: tilegemm.einsum("bmk,bnk->mn", a, b, d, c, backend="cutile")),
            t,
        )
    a = torch.randn(4, 2, 8192, generator=g).bfloat16()  # split over K: the reduce kernel too
    b = torch.randn(4, 16, 8192, generator=g).bfloat16()
    d = torch.zeros(2, 16, dtype=torch.bfloat16)
    t = {"a": a, "b": b, "d": d}
    yield "einsum_bmk_split", (lambda a=a, b=b, d=d: tilegemm.einsum("bmk,bnk->mn", a, b, d, backend="cutile")), t
    batch, heads, dd, r = 8, 4, 256, 128
    for expr, xa, yb, out in (
        ("bhr,hdr->bhd", (batch, heads, r), (heads, dd, r), (batch, heads, dd)),
        ("bhd,hdr->bhr", (batch, heads, dd), (heads, dd, r), (batch, heads, r)),
    ):
        x = torch.randn(*xa, generator=g).bfloat16()
        y = torch.randn(*yb, generator=g).bfloat16()
        for with_c in (False, True):
            d = torch.zeros(*out, dtype=torch.bfloat16)
            c = torch.randn(*out, generator=g).bfloat16() if with_c else None
            t = {"a": x, "b": y, "d": d, "c": c}
            yield (
                f"einsum_{expr}_{with_c}",
                (lambda expr=expr, x=x, y=y, d=d, c=c: tilegemm.einsum(expr, x, y, d, c, backend="cutile")),
                t,
            )
            xq = tilegemm.per_token_cast_to_fp8(x.float(), use_ue8m0=True)
            yq = tilegemm.per_block_cast_to_fp8(y.float(), use_ue8m0=True)
            t = {"a": xq, "b": yq, "d": d, "c": c}
            yield (
                f"fp8_einsum_{expr}_{with_c}",
                (lambda expr=expr, xq=xq, yq=yq, d=d, c=c: tilegemm.fp8_einsum(expr, xq, yq, d, c, backend="cutile")),
                t,
            )
    bsz, dd, r = 256, 128, 64
    xc = torch.randn(bsz, heads * dd, generator=g)
    yc = torch.randn(bsz, heads * r, generator=g)
    xq, sx = tilegemm.per_channel_cast_to_fp8(xc, use_ue8m0=True)
    yq, sy = tilegemm.per_channel_cast_to_fp8(yc, use_ue8m0=True)
    qa = (xq.view(bsz, heads, dd), sx.view(2, heads, dd))
    qb = (yq.view(bsz, heads, r), sy.view(2, heads, r))
    for dtype in (torch.float32, torch.bfloat16):
        d = torch.zeros(heads, dd, r, dtype=dtype)
        t = {"a": qa, "b": qb, "d": d}
        yield (
            f"fp8_einsum_bhd,bhr->hdr_{dtype}",
            (lambda d=d: tilegemm.fp8_einsum("bhd,bhr->hdr", qa, qb, d, recipe=(1, 1, 128), backend="cutile")),
            t,
        )
    a = torch.randn(37, 1024, generator=g).bfloat16()
    b = torch.randn(24, 1024, generator=g)
    for splits in (None, 3):
        lead = () if splits is None else (splits,)
        d, s = torch.zeros(*lead, 37, 24), torch.zeros(*lead, 37)
        t = {"a": a, "b": b, "d": d, "sqr_sum": s}
        yield (
            f"prenorm_{splits}",
            (lambda d=d, s=s, n=splits: tilegemm.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=n, backend="cutile")),
            t,
        )


def mqa_calls() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(id, call, its tensors by name) of the plain MQA logits (FP8 and BF16, clean or not, compressed) and the paged
    ones (cutile)."""
    import tilegemm

    g = torch.Generator().manual_seed(13)
    s, s_kv, h, dim = 96, 160, 8, 64
    q = torch.randn(s, h, dim, generator=g).to(torch.float8_e4m3fn)
    kv = torch.randn(s_kv, dim, generator=g).to(torch.float8_e4m3fn)
    kv_scale = torch.rand(s_kv, generator=g) + 0.5
    weights = torch.randn(s, h, generator=g)
    ks = torch.randint(0, 40, (s,), generator=g, dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(1, 120, (s,), generator=g, dtype=torch.int32), torch.tensor(s_kv))
    t = {"q": q, "kv": (kv, kv_scale), "weights": weights, "ks": ks, "ke": ke}
    for clean, max_k in ((True, 0), (False, 0), (True, 128)):
        yield (
            f"mqa_fp8_{clean}_{max_k}",
            (
                lambda clean=clean, max_k=max_k: tilegemm.fp8_mqa_logits(
                    q, (kv, kv_scale), weights, ks, ke, clean_logits=clean, max_seqlen_k=max_k, backend="cutile"
                )
            ),
            t,
        )
    qb, kvb = q.float().bfloat16(), kv.float().bfloat16()
    t = {"q": qb, "kv": kvb, "weights": weights, "ks": ks, "ke": ke}
    yield "mqa_bf16", (lambda: tilegemm.bf16_mqa_logits(qb, kvb, weights, ks, ke, backend="cutile")), t
    batch, next_n, block_kv = 2, 2, 16
    ctx = torch.tensor([37, 64], dtype=torch.int32)
    blocks = 4
    cache = torch.randint(0, 120, (batch * blocks, block_kv, 1, dim + 4), generator=g, dtype=torch.uint8)
    table = torch.arange(batch * blocks, dtype=torch.int32).view(batch, blocks)
    qp = torch.randn(batch, next_n, h, dim, generator=g).to(torch.float8_e4m3fn)
    wp = torch.randn(batch * next_n, h, generator=g)
    meta = tilegemm.get_paged_mqa_logits_metadata(ctx, block_kv, 4, backend="pytorch")
    t = {"q": qp, "kv_cache": cache, "weights": wp, "context_lens": ctx, "block_table": table, "meta": meta}
    for clean in (True, False):
        yield (
            f"mqa_paged_{clean}",
            (
                lambda clean=clean: tilegemm.fp8_paged_mqa_logits(
                    qp, cache, wp, ctx, table, meta, 69, clean_logits=clean, backend="cutile"
                )
            ),
            t,
        )


def norm_calls() -> Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(id, call, its tensors by name) of RMSNorm calls (cutile)."""
    import tilegemm

    g = torch.Generator().manual_seed(17)
    for shape in ((7, 256), (2, 3, 1000)):
        x = torch.randn(*shape, generator=g).bfloat16()
        w = torch.randn(shape[-1], generator=g).bfloat16()
        t = {"x": x, "weight": w}
        yield f"rms_norm_{'x'.join(map(str, shape))}", (lambda x=x, w=w: tilegemm.rms_norm(x, w, backend="cutile")), t


FAMILIES: dict[str, Callable[[], Iterator[tuple[str, Callable[[], Any], dict[str, Any]]]]] = {
    "dense": dense_calls,
    "grouped": grouped_calls,
    "moe": moe_calls,
    "einsum": einsum_calls,
    "mqa": mqa_calls,
    "norm": norm_calls,
}


def record(families: tuple[str, ...] = tuple(FAMILIES)) -> dict[str, Any]:
    """Every call's launches (or the error it raised), by call id."""
    import os
    import warnings

    os.environ["TILEGEMM_DISABLE_FALLBACK"] = "1"
    rec = Recorder()
    out: dict[str, Any] = {}
    with intercepted(rec), warnings.catch_warnings():
        calls = [call for family in families for call in FAMILIES[family]()]
        warnings.simplefilter("ignore")
        for vid, call, tensors in calls:
            rec.name_inputs(tensors)
            clear_all_plans()
            runs = []
            for _ in range(2):
                rec.launches = []
                try:
                    call()
                    runs.append(rec.launches)
                except Exception as exc:
                    runs.append(f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            out[vid] = runs
    return out


HOP_CALLS = (
    "bf16_nt_300x512x512",
    "fp8_nt_300x512x512_128_cutile",
    "fp8_nt_300x512x512_128_gluon",
    "moe_bf16_6x2x16x256x128_slots",
    "moe_bf16_6x2x16x256x128_blocks",
    "moe_bf16_6x2x16x256x128_sorted",
    "moe_fp8_8x2x16",
    "moe_train_forward",
    "moe_train_backward_1111",
)


def _traced(call: Callable[[], Any], rec: Recorder, root: str) -> tuple[list[list[str]], dict[str, set[str]]]:
    """Run ``call``: the tilegemm frames on the stack at each of its launches, and the tilegemm functions that ran,
    by file (paths relative to ``root``)."""
    import os
    import traceback

    import cuda.tile as ct

    stacks: list[list[str]] = []
    ran: dict[str, set[str]] = {}

    def stack() -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if f.filename.startswith(root)]
        stacks.append([f"{os.path.relpath(f.filename, root)}:{f.name}" for f in frames])

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            file = os.path.relpath(frame.f_code.co_filename, root)
            ran.setdefault(file, set()).add(frame.f_code.co_name)

    cutile_launch, record = ct.launch, rec.record

    def on_launch(*args, **kwargs):
        stack()
        return cutile_launch(*args, **kwargs)

    def on_record(backend, *rest):
        if backend == "gluon":
            stack()
        return record(backend, *rest)

    ct.launch, rec.record = on_launch, on_record
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        ct.launch, rec.record = cutile_launch, record
    return stacks, ran


def hops(ids: tuple[str, ...] = HOP_CALLS) -> dict[str, Any]:
    """For each call (its first run: plan built, then launched; and its second: the hot lane): the tilegemm frames
    on the stack at its first launch and at its deepest (``file:function``, outermost first), the files those
    stacks pass through, and the tilegemm files and functions that ran during the call (the checks, the chooser,
    the plan's build included)."""
    import os
    import warnings

    import tilegemm

    root = os.path.dirname(tilegemm.__file__)
    rec = Recorder()
    out: dict[str, Any] = {}
    with intercepted(rec), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calls = {vid: (call, tensors) for family in FAMILIES.values() for vid, call, tensors in family()}
        for vid in ids:
            call, tensors = calls[vid]
            rec.name_inputs(tensors)
            clear_all_plans()
            for run in ("first", "again"):
                stacks, ran = _traced(call, rec, root)
                out[f"{vid} ({run})"] = {
                    "stack at the first launch": stacks[0] if stacks else None,
                    "deepest stack at a launch": max(stacks, key=len) if stacks else None,
                    "launches": len(stacks),
                    "stack files": sorted({f.split(":")[0] for st in stacks for f in st}),
                    "files": {f: sorted(names) for f, names in sorted(ran.items())},
                }
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The call ids whose recorded launches differ (or that one side lacks)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="JSON file to write the recorded launches to")
    parser.add_argument("--only", default=",".join(FAMILIES), help=f"comma-separated: {', '.join(FAMILIES)}")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two recordings")
    parser.add_argument("--hops", action="store_true", help="print the path from the public op to the launch")
    args = parser.parse_args(argv)
    if args.hops:
        for vid, found in hops().items():
            stack, deepest = found["stack at the first launch"], found["deepest stack at a launch"]
            print(
                f"{vid}: {found['launches']} launches; {len(stack or ())} frames at the first, {len(deepest or ())} at"
                f" the deepest, in {len(found['stack files'])} files; {len(found['files'])} files ran"
            )
            print("  first: " + " -> ".join(stack or ()))
            print("  deepest: " + " -> ".join(deepest or ()))
            print("  stack files: " + ", ".join(found["stack files"]))
            for file, names in found["files"].items():
                print(f"  {file}: {', '.join(names)}")
        return 0
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        diff = compare(a, b)
        for k in diff:
            print(f"DIFF {k}:\n  {json.dumps(a.get(k))[:600]}\n  {json.dumps(b.get(k))[:600]}")
        print(f"{len(set(a) | set(b)) - len(diff)} same, {len(diff)} different")
        return 1 if diff else 0
    if not args.out:
        parser.error("give OUT.json or --compare A B")
    result = record(tuple(args.only.split(",")))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    launches = sum(len(r) for runs in result.values() for r in runs if isinstance(r, list))
    errors = sum(isinstance(r, str) for runs in result.values() for r in runs)
    print(f"{len(result)} calls, {launches} launches, {errors} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
