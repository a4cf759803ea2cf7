"""FP8 MQA-logits ops of the ``cutile`` backend, host side: ``fp8_mqa_logits``, ``bf16_mqa_logits``,
``get_paged_mqa_logits_metadata`` and ``fp8_paged_mqa_logits``.

The two plain ops run the plain kernel, or for a decode-sized call that ``$TILEGEMM_MQA_VARIANT=decode`` forces the
decode kernel (:mod:`tilegemm.ops.cutile.mqa_decode_kernels`: the keys split over the SMs). The paged op runs the
scheduled paged kernel, or with ``schedule_meta=None`` the paged decode kernel (no schedule; where its config does
not take the rows, the op makes the schedule itself).

Each op: problem -> config (:mod:`tilegemm.heuristics.cutile`) -> the arrays and constants its kernel takes -> launch;
a repeated call replays its launches (the registry's hot lane: ``checks.mqa_logits_signature`` and
:func:`_plain_replay`, ``checks.paged_mqa_logits_signature`` and :func:`_paged_replay`). The kernels and their
design are in :mod:`tilegemm.ops.cutile.mqa_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tilegemm.backend.hot_lane import register_replay
from tilegemm.backend.registry import Unsupported, register_impl
from tilegemm.heuristics.cutile import (
    MqaConfig,
    PagedMqaConfig,
    bf16_mqa_logits_config,  # noqa: F401  (the compile gate reads the configs through this module)
    mqa_logits_config,  # noqa: F401
    paged_decode_config,
    paged_mqa_config,
    plain_mqa_config,
    print_once,
    variant,
)
from tilegemm.ops.common import (
    cached_constant,
    cdiv,
    logits_result,
    paged_mqa_split_kv,
    paged_views,
)
from tilegemm.ops.cutile import mqa_prep
from tilegemm.ops.cutile.launch import launch, num_sms
from tilegemm.ops.cutile.mqa_decode_kernels import (
    decode_batched_kernel_for,
    decode_constants,
    decode_kernel_for,
    paged_decode_kernel_for,
)
from tilegemm.ops.cutile.mqa_kernels import NEG_INF, mqa_clean_logits_kernel, paged_kernel_for, plain_kernel_for


def tiles_inside(conf: MqaConfig, s: int, s_kv: int) -> bool:
    """Whether the plain kernel's ``[bq, bk]`` output tiles divide its fp32 ``[s, s_kv]`` output (and so its
    ``bk``-key tiles the keys): it then stores its output and, with ``MqaConfig.scales_ldg``, loads its key scales
    without bounds checks (``INSIDE``; tile indices never pass the last tile: :func:`window_tiles`).

    The store checks cost the kernel's loop 44-95 of 464-628 instructions per key tile (sm_90 SASS), and the loop
    is bound by its instruction issue. H100, 2026-11-24, same process, outputs bitwise equal
    (``results/mqa/README.md``, run 20): S=2048 S_kv=8192 H=64 D=64 212.3 -> 198.3 us, D=32 183.7 -> 172.9, H=32
    D=128 158.6 -> 154.8, H=64 D=128 273.4 -> 268.3.
    """
    return s % conf.bq == 0 and s_kv % conf.bk == 0


# --------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------


def _check_arch(t: torch.Tensor) -> int:
    """The compute capability of ``t``'s device as ``10 * major + minor``; raises below 8.9 (no FP8 MMA)."""
    major, minor = torch.cuda.get_device_capability(t.device)
    if (major, minor) < (8, 9):
        raise Unsupported(f"FP8 MMA needs compute capability >= 8.9, got {major}.{minor}")
    return 10 * major + minor


def _new_logits(rows: int, cols: int, clean: bool, device: torch.device) -> torch.Tensor:
    """The paged op's fp32 output; pre-filled with ``-inf`` when ``clean`` (its kernel writes only the tiles below
    each row's length)."""
    if clean:
        return torch.full((rows, cols), NEG_INF, dtype=torch.float32, device=device)
    return torch.empty((rows, cols), dtype=torch.float32, device=device)


def mqa_launch_plan(conf: MqaConfig, s: int, s_kv: int, d: int, out_shape: tuple[int, ...], kernel=None) -> tuple:
    """``(kernel, grid, constants)`` of ``conf``'s launch over ``s`` query rows and ``s_kv`` keys of ``d`` (``out``
    of ``out_shape``): the plain kernel, one CTA per ``conf.bq`` rows, or with ``conf.path == "decode"`` the decode
    kernel (:mod:`~tilegemm.ops.cutile.mqa_decode_kernels`, grid ``(ceil(S / bq), conf.parts)``)."""
    if conf.path == "decode":
        return kernel or decode_kernel_for(conf.occupancy), (cdiv(s, conf.bq), conf.parts, 1), decode_constants(conf, d)
    consts = plain_constants(conf, d, tuple(out_shape) == (s, s_kv) and tiles_inside(conf, s, s_kv))
    return kernel or plain_kernel_for(conf.occupancy), (cdiv(s, conf.bq), 1, 1), consts


def plain_constants(conf: MqaConfig, d: int, inside: bool) -> tuple:
    """The plain kernel's constant arguments, in its parameter order (``BQ`` .. ``KEY_LATENCY``; ``inside``:
    :func:`tiles_inside` for its output); the compile gate builds its signatures from it."""
    return (
        conf.bq,
        conf.hp,
        d,
        conf.bk,
        conf.head_chain,
        conf.two_chains,
        conf.unroll,
        inside,
        inside and conf.scales_ldg,
        conf.key_latency,
    )


def _config(q: torch.Tensor, keys: int, bf16: bool, sequences: int = 1) -> MqaConfig | None:
    """:func:`~tilegemm.heuristics.cutile.plain_mqa_config` of a call of ``q`` ([..., S, H, D]) over ``keys`` keys on
    this device, with the settings it reads (``set_num_sms``, ``$TILEGEMM_MQA_VARIANT``); raises ``Unsupported``
    below compute capability 8.9."""
    s, h, d = q.shape[-3:]
    return plain_mqa_config(
        h, d, s, keys, num_sms(), sm=_check_arch(q), bf16=bf16, variant=variant("mqa"), sequences=sequences
    )


def clean_launch_plan(conf: MqaConfig, s: int) -> tuple:
    """``(kernel, grid, constants)`` of :func:`mqa_clean_logits_kernel` after ``conf``'s kernel on ``s`` rows."""
    return mqa_clean_logits_kernel, (cdiv(s, conf.bq), 1, 1), (conf.bq, conf.bk, conf.unroll)


def launch_mqa_logits(
    q: torch.Tensor,
    kv_data: torch.Tensor,
    kv_scale: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    out: torch.Tensor,
    conf: MqaConfig,
    kernel=None,
    clean: bool = False,
    stream: Any = None,
) -> None:
    """Launch ``conf``'s kernel (:func:`mqa_launch_plan`) on ``stream`` (``None``: the current one; inputs as the
    op's, already checked; ``out`` fp32 [S, S_kv]).

    ``clean``: also launch :func:`mqa_clean_logits_kernel`, so that every element of ``out`` is written (``out`` may be
    uninitialised); otherwise the tiles outside the windows are left as they were.
    """
    s, _, d = q.shape
    ks, ke = ks.to(torch.int32).contiguous(), ke.to(torch.int32).contiguous()
    arrays = (
        q.contiguous(),
        kv_data.contiguous(),
        kv_scale.to(torch.float32).contiguous(),
        weights.to(torch.float32).contiguous(),
        ks,
        ke,
        out,
    )
    main, grid, consts = mqa_launch_plan(conf, s, kv_data.shape[0], d, tuple(out.shape), kernel)
    launch(main, grid, arrays + consts, stream)
    if clean:
        cleaner, clean_grid, clean_consts = clean_launch_plan(conf, s)
        launch(cleaner, clean_grid, (ks, ke, out) + clean_consts, stream)


def launch_mqa_logits_batched(
    arrays: tuple[torch.Tensor, ...], out: torch.Tensor, conf: MqaConfig, stream: Any = None
) -> None:
    """Launch the batched decode kernel (``conf.path == "decode"``, its ``parts`` for all the sequences) on ``stream``:
    ``B`` sequences' logits in one launch, grid ``(ceil(S / bq), conf.parts, B)``.

    ``arrays``: contiguous operands of the kernel's dtypes, ``(q [B, S, H, D], keys [B, T, D] (fp8 or bf16, q's),
    fp32 kv_scale [B, T], fp32 weights [B, S, H], int32 ks [B, S], int32 ke [B, S])``; ``out`` fp32 [B, S, T] (the
    tiles outside the windows left as they were)."""
    batch, s, _, d = arrays[0].shape
    grid = (cdiv(s, conf.bq), conf.parts, batch)
    launch(decode_batched_kernel_for(conf.occupancy), grid, (*arrays, out, *decode_constants(conf, d)), stream)


def unit_key_scales(n: int, device: torch.device) -> torch.Tensor:
    """fp32 ones ``[n]``, the key scales of a BF16 call (:func:`~tilegemm.ops.common.cached_constant`)."""
    return cached_constant("unit_key_scales", n, device, _ones)


def _ones(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float32, device=device)


def fp8_mqa_logits(
    q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype, stream
):
    """cuTile MQA logits: the fp32 [S, S_kv] kernel, then (host side) compression and the cast to ``logits_dtype``.

    Head dims 32, 64 and 128 run natively (one to four 32-deep MMA steps); bf16 weights are read as fp32. A
    decode-sized call takes the decode kernel where ``$TILEGEMM_MQA_VARIANT=decode`` forces it
    (:func:`~tilegemm.heuristics.cutile.plain_mqa_config`).
    """
    kv_data, kv_scale = kv
    if q.dtype != torch.float8_e4m3fn or kv_data.dtype != torch.float8_e4m3fn:
        raise Unsupported(f"fp8_mqa_logits needs float8_e4m3fn q and kv, got {q.dtype} and {kv_data.dtype}")
    s, h, d = q.shape
    s_kv = kv_data.shape[0]
    conf = _config(q, s_kv, bf16=False)
    if conf is None:
        raise Unsupported(f"fp8_mqa_logits: H={h}, D={d} not supported (H <= 128, D in {{32, 64, 128}})")
    print_once("fp8_mqa_logits", {"S": s, "S_kv": s_kv, "H": h, "D": d}, conf)
    out = torch.empty((s, s_kv), dtype=torch.float32, device=q.device)  # clean_logits: the clean kernel fills it
    if s and s_kv:
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        launch_mqa_logits(q, kv_data, kv_scale, weights, ks, ke, out, conf, clean=clean_logits, stream=stream)
    return logits_result(out, cu_seq_len_k_start, max_seqlen_k, logits_dtype)


register_impl("fp8_fp4_mqa_logits", "cutile")(fp8_mqa_logits)
register_impl("fp8_mqa_logits", "cutile")(fp8_mqa_logits)


@register_impl("bf16_mqa_logits", "cutile")
def bf16_mqa_logits(
    q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k, logits_dtype, stream
):
    """cuTile BF16 MQA logits: the plain kernel on bf16 ``q`` and keys (BF16 MMAs, fp32 accumulate) with key scales
    of 1 and :func:`~tilegemm.heuristics.cutile.bf16_mqa_logits_config`'s tiles (or, forced, the decode kernel, as
    :func:`fp8_mqa_logits`); then compression and the cast, as :func:`fp8_mqa_logits`."""
    s, h, d = q.shape
    s_kv = kv.shape[0]
    conf = _config(q, s_kv, bf16=True)
    if conf is None:
        raise Unsupported(f"bf16_mqa_logits: H={h}, D={d} not supported (H <= 128, D in {{32, 64, 128}})")
    print_once("bf16_mqa_logits", {"S": s, "S_kv": s_kv, "H": h, "D": d}, conf)
    out = torch.empty((s, s_kv), dtype=torch.float32, device=q.device)
    if s and s_kv:
        ones = unit_key_scales(s_kv, q.device)
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        launch_mqa_logits(q, kv, ones, weights, ks, ke, out, conf, clean=clean_logits, stream=stream)
    return logits_result(out, cu_seq_len_k_start, max_seqlen_k, logits_dtype)


def _plain_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor] | None:
    """The hot-lane replay of a ragged call (``checks.mqa_logits_signature``): the config, kernels, grids and
    constants fixed; per call only the output, a BF16 call's unit key scales and the launches. The signature admits
    contiguous operands of the kernels' dtypes only, so the conversions of :func:`launch_mqa_logits` are no-ops
    here."""
    q, kv = derived["q"], derived["kv"]
    bf16 = not isinstance(kv, tuple)
    s, d = q.shape[0], q.shape[2]
    s_kv = (kv if bf16 else kv[0]).shape[0]
    try:
        conf = _config(q, s_kv, bf16)
    except Unsupported:
        return None
    if conf is None:
        return None
    main, grid, consts = mqa_launch_plan(conf, s, s_kv, d, (s, s_kv))
    cleaner, clean_grid, clean_consts = clean_launch_plan(conf, s)
    clean, runs = derived["clean_logits"], s > 0 and s_kv > 0
    max_seqlen_k, logits_dtype, device = derived["max_seqlen_k"], derived["logits_dtype"], q.device

    def replay(q, kv, weights, ks, ke) -> torch.Tensor:
        out = torch.empty((s, s_kv), dtype=torch.float32, device=device)
        if runs:
            keys, scales = (kv, unit_key_scales(s_kv, device)) if bf16 else kv
            launch(main, grid, (q, keys, scales, weights, ks, ke, out) + consts)
            if clean:
                launch(cleaner, clean_grid, (ks, ke, out) + clean_consts)
        return logits_result(out, ks, max_seqlen_k, logits_dtype)

    return replay


for _name in ("fp8_fp4_mqa_logits", "fp8_mqa_logits", "bf16_mqa_logits"):
    register_replay(_name, "cutile")(_plain_replay)
del _name


@register_impl("mqa_logits_batched", "cutile")
def mqa_logits_batched(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, stream):
    """cuTile batched MQA logits: one launch of the batched decode kernel where a sequence's call would take the
    decode kernel (:func:`batched_plan`), else the ragged op's path once per sequence."""
    plan = batched_plan(q, kv)
    if plan is not None:
        return plan(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, stream)
    impl = bf16_mqa_logits if not isinstance(kv, tuple) else fp8_mqa_logits
    batch, s, _, _ = q.shape
    keys = (kv if not isinstance(kv, tuple) else kv[0]).shape[1]
    out = torch.empty(batch, s, keys, dtype=torch.float32, device=q.device)
    for b in range(batch):
        kv_b = kv[b] if not isinstance(kv, tuple) else (kv[0][b], kv[1][b])
        ks, ke = cu_seq_len_k_start[b], cu_seq_len_k_end[b]
        out[b] = impl(q[b], kv_b, weights[b], ks, ke, clean_logits, 0, torch.float32, stream)
    return out


def batched_plan(q: torch.Tensor, kv) -> Callable[..., torch.Tensor] | None:
    """The launch plan of a batched call shaped as this one, ``run(q, kv, weights, ks, ke, clean_logits, stream)
    -> [B, S, T]``, where one sequence's call takes the decode kernel (its ``parts`` over all ``B`` sequences'
    row blocks); ``None`` where it takes the plain kernel (or the shape is unsupported).

    A run makes its output (``-inf``-filled when ``clean_logits``: the kernel writes only the tiles that meet the
    windows), takes a BF16 call's unit key scales and the operands as the kernel's contiguous dtypes (no-ops for
    what the hot lane admits), and launches once, grid ``(ceil(S / bq), parts, B)``.
    """
    bf16 = not isinstance(kv, tuple)
    batch, s = q.shape[:2]
    keys = (kv if bf16 else kv[0]).shape[1]
    conf = _config(q, keys, bf16, sequences=batch)
    if conf is None or conf.path != "decode":
        return None
    runs = batch > 0 and s > 0 and keys > 0

    def run(q, kv, weights, ks, ke, clean_logits, stream=None) -> torch.Tensor:
        device = q.device
        out = _new_logits(batch * s, keys, clean_logits, device).view(batch, s, keys)
        if runs:
            keys_data, scales = (kv, unit_key_scales(batch * keys, device).view(batch, keys)) if bf16 else kv
            arrays = (
                q.contiguous(),
                keys_data.contiguous(),
                scales.to(torch.float32).contiguous(),
                weights.to(torch.float32).contiguous(),
                ks.to(torch.int32).contiguous(),
                ke.to(torch.int32).contiguous(),
            )
            launch_mqa_logits_batched(arrays, out, conf, stream)
        return out

    return run


@register_replay("mqa_logits_batched", "cutile")
def _batched_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor] | None:
    """The hot-lane replay of a batched call (``checks.mqa_logits_batched_signature``): its plan, where it has one
    (the per-sequence path keeps the full path)."""
    try:
        plan = batched_plan(derived["q"], derived["kv"])
    except Unsupported:
        return None
    if plan is None:
        return None
    clean = derived["clean_logits"]
    return lambda q, kv, weights, ks, ke: plan(q, kv, weights, ks, ke, clean)


@register_impl("get_paged_mqa_logits_metadata", "cutile")
def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
    """Balanced schedule on the device (no host sync): ``ops.common.paged_mqa_schedule``'s values, one kernel
    (``mqa_prep.paged_schedule``)."""
    return mqa_prep.paged_schedule(context_lens, block_kv, num_sms)


@register_replay("get_paged_mqa_logits_metadata", "cutile")
def _metadata_replay(derived: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The hot-lane replay of a schedule call (``checks.paged_mqa_metadata_signature``): the same kernel."""
    block_kv, sms = derived["block_kv"], derived["num_sms"]
    return lambda context_lens: mqa_prep.paged_schedule(context_lens, block_kv, sms)


def paged_constants(conf: PagedMqaConfig, next_n: int, d: int, block_kv: int, ctx_2d: bool) -> tuple:
    """The paged kernel's constant arguments, in its parameter order (``NN`` .. ``ROWS_OUTER``); the compile gate
    (``tests/compile_gate/test_compile_mqa.py``) builds its signatures from it."""
    return (
        next_n,
        conf.nnp,
        conf.rg,
        conf.hp,
        d,
        block_kv,
        conf.ck,
        conf.split,
        ctx_2d,
        conf.head_chain,
        conf.batch_major,
        conf.rows_outer,
    )


def _paged_arrays(q, kv_cache, weights, context_lens, block_table, schedule_meta, out) -> tuple:
    """The paged kernel's array arguments from contiguous operands of the kernel's dtypes (``weights`` fp32); without
    a schedule (``schedule_meta`` None) the paged decode kernel's, which take none."""
    batch, next_n, h, d = q.shape
    kv_keys, kv_scales = paged_views(kv_cache, d)
    w = weights.view(batch, next_n, h)
    meta = () if schedule_meta is None else (schedule_meta,)
    return (q, kv_keys, kv_scales, w, context_lens, block_table, *meta, out.view(batch, next_n, out.shape[1]))


def paged_decode_constants(conf: PagedMqaConfig, next_n: int, d: int, block_kv: int, ctx_2d: bool) -> tuple:
    """The paged decode kernel's constant arguments, in its parameter order (``NN`` .. ``ROWS_OUTER``)."""
    return (next_n, conf.nnp, conf.rg, conf.hp, d, block_kv, conf.ck, ctx_2d, conf.head_chain, conf.rows_outer)


def paged_launch_plan(
    conf: PagedMqaConfig, q: torch.Tensor, kv_cache: torch.Tensor, ctx_2d: bool, meta_rows: int | None
) -> tuple:
    """``(kernel, grid, constants)`` of a paged call: the scheduled kernel, ``conf.parts`` CTAs per schedule row
    (``meta_rows``: the schedule's ``num_sms + 1`` rows), or without a schedule (``None``) the paged decode kernel,
    :func:`~tilegemm.heuristics.cutile.paged_decode_config`'s ``parts`` CTAs per sequence and row group."""
    batch, next_n, _, d = q.shape
    block_kv = kv_cache.shape[1]
    if meta_rows is None:
        grid = (conf.nnp // conf.rg, conf.parts, batch)
        return paged_decode_kernel_for(conf.occupancy), grid, paged_decode_constants(conf, next_n, d, block_kv, ctx_2d)
    grid = (meta_rows - 1, conf.parts, 1)
    return paged_kernel_for(conf.occupancy), grid, paged_constants(conf, next_n, d, block_kv, ctx_2d)


def launch_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    out: torch.Tensor,
    conf: PagedMqaConfig,
    kernel=None,
    stream: Any = None,
) -> None:
    """Launch ``conf``'s paged kernel on ``stream`` (``None``: the current one; :func:`paged_launch_plan`, ``kernel``
    replacing its kernel; ``out`` [B*next_n, W])."""
    meta = None if schedule_meta is None else schedule_meta.to(torch.int32).contiguous()
    arrays = _paged_arrays(
        q.contiguous(),
        kv_cache,
        weights.to(torch.float32).contiguous(),
        context_lens.to(torch.int32).contiguous(),
        block_table.to(torch.int32).contiguous(),
        meta,
        out,
    )
    main, grid, consts = paged_launch_plan(conf, q, kv_cache, context_lens.dim() == 2, _meta_rows(meta))
    launch(kernel or main, grid, arrays + consts, stream)


def _meta_rows(schedule_meta: torch.Tensor | None) -> int | None:
    return None if schedule_meta is None else schedule_meta.shape[0]


def _paged_config(
    q: torch.Tensor, kv_cache: torch.Tensor, scheduled: bool = True, width: int = 0
) -> PagedMqaConfig | None:
    """The paged kernel's config for these operands (``scheduled=False``: the paged decode kernel's for an output of
    ``width`` keys, :func:`~tilegemm.heuristics.cutile.paged_decode_config`, ``None`` where it takes none), or
    :class:`Unsupported`."""
    if q.dtype != torch.float8_e4m3fn:
        raise Unsupported(f"fp8_paged_mqa_logits needs float8_e4m3fn q, got {q.dtype}")
    _, next_n, h, d = q.shape
    block_kv = kv_cache.shape[1]
    conf = paged_mqa_config(h, d, next_n, block_kv, paged_mqa_split_kv(block_kv), sm=_check_arch(q))
    if conf is None:
        raise Unsupported(
            f"fp8_paged_mqa_logits: H={h}, D={d}, next_n={next_n}, block_kv={block_kv} not supported "
            "(H <= 128, D in {64, 128}, next_n <= 4, block_kv in {16, 32, 64})"
        )
    if not kv_cache.is_contiguous():
        raise Unsupported("fp8_paged_mqa_logits: kv_cache must be contiguous (DeepGEMM's byte layout)")
    return conf if scheduled else paged_decode_config(conf, q.shape[0], width, num_sms(), _check_arch(q))


def fp8_paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits, logits_dtype, stream
):
    """cuTile paged MQA logits: the fp32 [B * next_n, max_context_len] kernel (the scheduled kernel, or with
    ``schedule_meta=None`` the paged decode kernel), then the cast to ``logits_dtype``."""
    conf = _paged_config(q, kv_cache, False, int(max_context_len)) if schedule_meta is None else None
    if conf is None:
        if schedule_meta is None:  # the paged decode kernel does not take these rows: schedule them here
            schedule_meta = mqa_prep.paged_schedule(context_lens, kv_cache.shape[1], num_sms(), stream)
        conf = _paged_config(q, kv_cache)
    scheduled = schedule_meta is not None
    batch, next_n, h, d = q.shape
    shape = {"B": batch, "next_n": next_n, "H": h, "D": d, "block_kv": kv_cache.shape[1], "scheduled": scheduled}
    print_once("fp8_paged_mqa_logits", shape, conf)
    out = _new_logits(batch * next_n, int(max_context_len), clean_logits, q.device)
    if out.numel() and kv_cache.shape[0] and (not scheduled or schedule_meta.shape[0] > 1):
        launch_paged_mqa_logits(
            q, kv_cache, weights, context_lens, block_table, schedule_meta, out, conf, stream=stream
        )
    return out.to(logits_dtype)


def _paged_replay(derived: dict[str, Any]) -> Callable[..., torch.Tensor] | None:
    """The hot-lane replay of a paged call (``checks.paged_mqa_logits_signature``): the config, grid and constants
    fixed, per call only the output, the cache views and the launch. The signature admits contiguous operands of
    the kernel's dtypes only, so the conversions of :func:`launch_paged_mqa_logits` are no-ops here."""
    q, kv_cache, weights = derived["q"], derived["kv_cache"], derived["weights"]
    context_lens, schedule_meta = derived["context_lens"], derived["schedule_meta"]
    batch, next_n, _, _ = q.shape
    rows, width = batch * next_n, int(derived["max_context_len"])
    meta_rows = _meta_rows(schedule_meta)
    try:
        conf = _paged_config(q, kv_cache, meta_rows is not None, width)
    except Unsupported:
        return None
    if conf is None:  # no schedule given and the paged decode kernel does not take the rows: the full path
        return None
    clean, logits_dtype = derived["clean_logits"], derived["logits_dtype"]
    runs = rows * width > 0 and kv_cache.shape[0] > 0 and (meta_rows is None or meta_rows > 1)
    kernel, grid, consts = paged_launch_plan(conf, q, kv_cache, context_lens.dim() == 2, meta_rows)
    weights_f32 = weights.dtype == torch.float32

    def replay(q, kv_cache, weights, context_lens, block_table, schedule_meta) -> torch.Tensor:
        out = _new_logits(rows, width, clean, q.device)
        if runs:
            w = weights if weights_f32 else weights.float()
            launch(kernel, grid, _paged_arrays(q, kv_cache, w, context_lens, block_table, schedule_meta, out) + consts)
        return out if logits_dtype is torch.float32 else out.to(logits_dtype)

    return replay


for _name in ("fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits"):
    register_impl(_name, "cutile")(fp8_paged_mqa_logits)
    register_replay(_name, "cutile")(_paged_replay)
del _name
