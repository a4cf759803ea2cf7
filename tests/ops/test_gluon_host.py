"""The gluon dense FP8 host path without a GPU: the kernels are replaced by recorders, so what reaches triton is
checked: the first call of a plan goes through the JIT with every parameter by name; later calls hand the compiled
kernel's launcher the same values, in the kernel's parameter order, with the same descriptor bases, shapes and
strides; the public op's hot lane replays the plan. DeepGEMM's recipe without an addend and with ``alpha`` 1 runs
the warp-specialized kernel (``fp8_gemm_ws``), every other call ``fp8_gemm_kernel``. A split design (the split
tail) launches one CTA per job and hands both launches the plan's own workspace and counters; so does the BF16 ws
kernel's."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from triton.backends.nvidia import driver as nvidia_driver  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

import tilegemm  # noqa: E402
from tilegemm.backend import hot_lane, registry, selector  # noqa: E402
from tilegemm.heuristics import gluon as gluon_rules  # noqa: E402
from tilegemm.ops import plans  # noqa: E402
from tilegemm.ops.checks import grouped as grouped_checks  # noqa: E402
from tilegemm.ops.gluon import bf16_gemm_ws, fp8_gemm_kernel, fp8_gemm_ws, split_tail, tma  # noqa: E402
from tilegemm.ops.gluon import gemm as gluon_gemm  # noqa: E402
from tilegemm.ops.gluon import grouped as gluon_grouped  # noqa: E402
from tilegemm.ops.gluon.options import COMPILE_OPTIONS  # noqa: E402
from tilegemm.ops.operands import cdiv  # noqa: E402

LEADING = 9  # grid (3), stream, function, packed metadata, launch metadata, enter and exit hooks


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](**kwargs)`` records a JIT call and returns a compiled kernel whose
    ``run`` records launcher calls."""

    def __init__(self, arg_names: list[str]) -> None:
        self.arg_names = arg_names
        self.jit: list[tuple] = []
        self.runs: list[tuple] = []
        recorder = self

        class Compiled:
            function, packed_metadata = "function", "packed"

            def launch_metadata(self, grid, stream, *values):
                return None

            def run(self, *args):
                recorder.runs.append(args)

        self.compiled = Compiled()

    def __getitem__(self, grid):
        def launch(num_warps, **kwargs):
            options = {name: kwargs.pop(name) for name in COMPILE_OPTIONS if name in kwargs}
            assert options == COMPILE_OPTIONS, "every gluon kernel compiles with the backend's options"
            self.jit.append((grid, num_warps, kwargs))
            return self.compiled

        return launch


def _launched_as_jitted(rec: _Recorder, kwargs: dict, run: tuple) -> dict:
    """The values launcher call ``run`` of ``rec`` got, by parameter name, after checking them against the JIT
    call's ``kwargs``: each descriptor over the same shape and strides, every value that is no tensor equal (a
    tensor parameter may be another call's tensor)."""
    launched = dict(zip(rec.arg_names, run[LEADING:]))
    for name in rec.arg_names:
        if name.endswith("_desc"):
            assert _view(launched[name]) == _view(kwargs[name]), name
        elif not isinstance(kwargs[name], torch.Tensor):
            assert launched[name] == kwargs[name], name
    return launched


def _view(value):
    """A comparable view of a launch value: a descriptor as (shape, strides) (an operand that is not TMA-ready is
    copied per call, so its base differs between calls), a tensor by pointer."""
    if hasattr(value, "base") and hasattr(value, "strides"):
        return ("desc", list(value.shape), list(value.strides))
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr())
    return value


@pytest.fixture(autouse=True)
def _triton_3_6(monkeypatch):
    """The designs the rules give under triton 3.6 (CI's), whatever triton this machine has (the dense BF16 rule
    reads it: :func:`gluon_rules.spill_free_here`)."""
    monkeypatch.setattr(selector, "triton_version", lambda: (3, 6))


@pytest.fixture
def recorders(monkeypatch) -> dict[str, _Recorder]:
    """The kernels recorded: ``v1`` (``fp8_gemm_kernel``), ``ws`` (``fp8_gemm_ws_kernel``) and ``bf16``
    (``bf16_gemm_ws_kernel``)."""
    recs = {
        "v1": _Recorder(fp8_gemm_kernel.fp8_gemm_kernel.arg_names),
        "ws": _Recorder(fp8_gemm_ws.fp8_gemm_ws_kernel.arg_names),
        "bf16": _Recorder(bf16_gemm_ws.bf16_gemm_ws_kernel.arg_names),
    }
    monkeypatch.setattr(
        gluon_gemm,
        "fp8_gemm_kernel",
        types.SimpleNamespace(
            fp8_gemm_kernel=recs["v1"], WG_ROWS=fp8_gemm_kernel.WG_ROWS, SB_BOX=fp8_gemm_kernel.SB_BOX
        ),
    )
    monkeypatch.setattr(fp8_gemm_ws, "fp8_gemm_ws_kernel", recs["ws"])
    monkeypatch.setattr(bf16_gemm_ws, "bf16_gemm_ws_kernel", recs["bf16"])
    monkeypatch.setattr(tma, "current_stream", lambda device: 7)
    monkeypatch.setattr(plans, "_PLANS", {})
    return recs


def _operands(m, n, k, rows_recipe):
    a = tilegemm.per_token_cast_to_fp8(torch.randn(m, k))
    b = (
        tilegemm.per_token_cast_to_fp8(torch.randn(n, k))
        if rows_recipe
        else tilegemm.per_block_cast_to_fp8(torch.randn(n, k))
    )
    return (a[0], tilegemm.get_mn_major_tma_aligned_tensor(a[1])), b


@pytest.mark.parametrize(
    "m, n, k, rows_recipe, alpha",
    [(300, 200, 1100, False, 1.0), (1, 136, 256, True, 1.0), (4096, 2048, 768, False, 1.0),
     (300, 200, 1100, False, 0.5)],
)  # fmt: skip
def test_compiled_launch_gets_what_the_jit_got(recorders, m, n, k, rows_recipe, alpha):
    recipe = (1, 1, 128) if rows_recipe else (1, 128, 128)
    design = fp8_gemm_ws.VARIANTS[gluon_rules.dense_fp8_ws_design(m, n, k, tilegemm.config.get_num_sms())]
    kernel, warps = ("v1", 4) if rows_recipe or alpha != 1.0 else ("ws", design.num_warps)
    recorder, other = recorders[kernel], recorders["ws" if kernel == "v1" else "v1"]
    a, b = _operands(m, n, k, rows_recipe)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    gluon_gemm.fp8_gemm(a, b, d, recipe=recipe, alpha=alpha, beta=0.0)
    gluon_gemm.fp8_gemm(a, b, d, recipe=recipe, alpha=alpha, beta=0.0)
    assert len(recorder.jit) == 1 and len(recorder.runs) == 1, "one JIT call, then the compiled kernel"
    assert not other.jit and not other.runs, f"{kernel}'s call reached the other kernel"
    grid, num_warps, kwargs = recorder.jit[0]
    run = recorder.runs[0]
    assert num_warps == warps and run[:3] == tuple(grid) + (1,) * (3 - len(grid)) and run[3] == 7
    assert list(kwargs) == list(recorder.arg_names)
    assert [_view(v) for v in run[LEADING:]] == [_view(kwargs[name]) for name in recorder.arg_names]
    launched = dict(zip(recorder.arg_names, run[LEADING:]))
    outputs = ("d_desc",) if kernel == "v1" else ("d0_desc", "d1_desc")
    for name in outputs:
        assert launched[name].base.data_ptr() == kwargs[name].base.data_ptr() == d.data_ptr()


def _check_split_launches(rec: _Recorder, tiles: int) -> None:
    """A split plan's two launches (the JIT's, then the launcher's): one CTA per job on 132 SMs, the plan's
    workspace (fp32, a slot per tail tile and split) and zeroed counters (one per tail tile), the same in both."""
    assert len(rec.jit) == 1 and len(rec.runs) == 1
    grid, _, kwargs = rec.jit[0]
    splits, tail = kwargs["SPLITS"], split_tail.tail_tiles(tiles, 132, 4)
    assert splits == 4 and tail == 8 and grid[0] == 132 == split_tail.split_grid(tiles, 132, splits)
    assert kwargs["work_ptr"].dtype == torch.float32 and kwargs["work_ptr"].numel() == tail * splits * 128 * 128
    assert torch.equal(kwargs["counter_ptr"], torch.zeros(tail, dtype=torch.int32))
    launched = dict(zip(rec.arg_names, rec.runs[0][LEADING:]))
    assert [_view(launched[n]) for n in rec.arg_names] == [_view(kwargs[n]) for n in rec.arg_names]


def test_split_tail_plan_launches(recorders, monkeypatch):
    """2048x2112x7168 on 132 SMs: 272 128x128 tiles, two rounds and 8, run by the split design (8 tiles x 4 runs)."""
    monkeypatch.setattr(tilegemm.config, "get_num_sms", lambda: 132)
    assert gluon_rules.dense_fp8_ws_design(2048, 2112, 7168, 132) == "d_128x128_ov8_sk"
    a, b = _operands(2048, 2112, 7168, False)
    d = torch.empty(2048, 2112, dtype=torch.bfloat16)
    for _ in range(2):
        gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), beta=0.0)
    _check_split_launches(recorders["ws"], 272)


def test_bf16_split_tail_plan_launches(monkeypatch):
    """The BF16 ws kernel's split design on the same tiles: its parameters after the descriptors in order, D by
    pointer, the plan's buffers in both launches."""
    rec = _Recorder(bf16_gemm_ws.bf16_gemm_ws_kernel.arg_names)
    monkeypatch.setattr(bf16_gemm_ws, "bf16_gemm_ws_kernel", rec)
    monkeypatch.setattr(tma, "current_stream", lambda device: 7)
    a, b = torch.randn(2048, 7168).bfloat16(), torch.randn(2112, 7168).bfloat16()
    d = torch.empty(2048, 2112, dtype=torch.bfloat16)
    plan = bf16_gemm_ws.bf16_ws_plan(a, b, d, bf16_gemm_ws.VARIANTS["bf16_128x128_sk"], 132)
    plan(a, b, d)
    plan(a, b, d)
    assert list(rec.jit[0][2]) == list(rec.arg_names)
    _check_split_launches(rec, 272)
    assert plan.tails().counters is rec.jit[0][2]["counter_ptr"]


def test_new_inputs_same_plan(recorders):
    """A second call of the same shapes reuses the plan with the new operands: the caller's tensors themselves where
    they are TMA-ready (no copies), and ``alpha``, ``beta`` as given (``fp8_gemm_kernel``, alpha 0.5)."""
    for kernel, alpha in (("ws", 1.0), ("v1", 0.5)):
        a, b = _operands(300, 200, 1024, False)
        d = torch.empty(300, 200, dtype=torch.bfloat16)
        gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), alpha=alpha, beta=0.0)
        a2, b2 = _operands(300, 200, 1024, False)
        d2 = torch.empty_like(d)
        gluon_gemm.fp8_gemm(a2, b2, d2, recipe=(1, 128, 128), alpha=alpha, beta=0.0)
        rec = recorders[kernel]
        assert len(rec.jit) == 1 and len(rec.runs) == 1
        named = dict(zip(rec.arg_names, rec.runs[-1][LEADING:]))
        assert named["a_desc"].base.data_ptr() == a2[0].data_ptr()
        assert named["sa_desc"].base.data_ptr() == a2[1].data_ptr()
        if kernel == "v1":
            assert named["b_desc"].base.data_ptr() == b2[0].data_ptr()
            assert named["sb_desc"].base.data_ptr() == b2[1].data_ptr()
            assert named["d_desc"].base.data_ptr() == d2.data_ptr()
            assert named["alpha"] == 0.5 and named["beta"] == 0.0
        else:
            assert named["b0_desc"].base.data_ptr() == named["b1_desc"].base.data_ptr() == b2[0].data_ptr()
            assert named["sb_ptr"].data_ptr() == b2[1].data_ptr()
            assert named["d0_desc"].base.data_ptr() == named["d1_desc"].base.data_ptr() == d2.data_ptr()


def test_public_op_replays_the_plan(recorders, monkeypatch):
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: None)
    monkeypatch.setattr(registry, "_off_cuda", lambda value: False)
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    monkeypatch.setattr(hot_lane, "_HOT", {})
    a, b = _operands(300, 200, 1100, False)
    d = torch.empty(300, 200, dtype=torch.bfloat16)
    for _ in range(3):
        tilegemm.fp8_gemm_nt(a, b, d, backend="gluon")
    assert len(recorders["ws"].jit) == 1 and len(recorders["ws"].runs) == 2
    assert any(key[0] == "gluon" for key in hot_lane._HOT)


@pytest.mark.parametrize("kernel", ["ws", "v1"])
def test_launches_on_the_given_stream(recorders, monkeypatch, kernel):
    """``stream=`` reaches the launch: the JIT call runs with it current, the compiled kernel's launcher is handed it;
    without one, the current stream (7)."""
    entered = []
    recorder = recorders[kernel]

    class Context:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            entered.append(self.stream)

        def __exit__(self, *exc):
            recorder.jit.append("exit")

    monkeypatch.setattr(torch.cuda, "stream", Context)
    given = types.SimpleNamespace(cuda_stream=9)
    a, b = _operands(300, 200, 1024, False)
    d = torch.empty(300, 200, dtype=torch.bfloat16)
    alpha = 1.0 if kernel == "ws" else 2.0
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), alpha=alpha, stream=given)
    assert entered == [given] and recorder.jit[-1] == "exit", "the JIT call inside the stream's context"
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), alpha=alpha, stream=given)
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), alpha=alpha)
    assert [run[3] for run in recorder.runs] == [9, 7]


def _grouped_operands(sizes: list[int], n: int, k: int):
    """An m-grouped call's operands (A's scales MN-major and TMA-aligned, as DeepGEMM's callers keep them) and its
    ``m_indices``: each group's rows padded with -1 to a multiple of 128."""
    index = torch.cat([torch.tensor([g] * s + [-1] * (-s % 128), dtype=torch.int32) for g, s in enumerate(sizes)])
    qa, sa = tilegemm.per_token_cast_to_fp8(torch.randn(index.numel(), k))
    b = tilegemm.per_block_cast_to_fp8(torch.randn(len(sizes), n, k))
    return (qa, tilegemm.get_mn_major_tma_aligned_tensor(sa)), b, index


def test_public_m_grouped_op_replays_the_plan(recorders, monkeypatch):
    """The public m-grouped op's later calls of one signature take the hot lane: checked once, one JIT call, and each
    later launch hands the launcher that call's own tensors (``m_indices`` by pointer). The ``nn`` op's replay gets
    the weights in the check's logical form (copied K-major per call, as on the full path)."""
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: None)
    monkeypatch.setattr(registry, "_off_cuda", lambda value: False)
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    monkeypatch.setattr(hot_lane, "_HOT", {})
    checked = []
    original = grouped_checks._check_m_indices
    monkeypatch.setattr(grouped_checks, "_check_m_indices", lambda *args: checked.append(1) or original(*args))
    sizes, n, k = [300, 0, 129], 256, 1024
    for _ in range(3):
        a, b, index = _grouped_operands(sizes, n, k)
        d = torch.empty(index.numel(), n, dtype=torch.bfloat16)
        assert tilegemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, index, backend="gluon") is d
    rec = recorders["ws"]
    assert len(checked) == 1 and len(rec.jit) == 1 and len(rec.runs) == 2
    launched = dict(zip(rec.arg_names, rec.runs[-1][LEADING:]))
    assert launched["a_desc"].base.data_ptr() == a[0].data_ptr() and launched["sb_ptr"].data_ptr() == b[1].data_ptr()
    assert launched["group_ptr"].data_ptr() == index.data_ptr() and launched["d0_desc"].base.data_ptr() == d.data_ptr()
    assert any(key[0] == "gluon" and key[1][0] == "m_grouped_fp8_fp4_gemm_nt_contiguous" for key in hot_lane._HOT)
    bt = tuple(x.transpose(1, 2).contiguous() for x in b)  # the nn op's [G, K, N] weights
    for _ in range(2):
        tilegemm.m_grouped_fp8_gemm_nn_contiguous(a, bt, d, index, backend="gluon")
    assert len(checked) == 2 and len(rec.jit) == 2, "one check and one JIT call for the nn signature"
    launched = dict(zip(rec.arg_names, rec.runs[-1][LEADING:]))
    assert list(launched["b0_desc"].shape) == [len(sizes) * n, k], "the K-major copy of the weights"


def test_m_grouped_plan_launches_the_grouped_kernel(recorders):
    """An m-grouped call runs the ws kernel's grouped form: B as one [G * N, K] matrix, the group pitch of its
    scales, the groups' count, ``m_indices`` by pointer; a second call of the same shapes reuses the plan with the
    new tensors as given (no copies), the compiled launcher handed what the JIT got."""
    sizes, n, k = [300, 0, 129], 256, 1024
    a, b, index = _grouped_operands(sizes, n, k)
    d = torch.empty(index.numel(), n, dtype=torch.bfloat16)
    gluon_grouped.m_grouped_fp8(a, b, d, index)
    a2, b2, index2 = _grouped_operands(sizes, n, k)
    d2 = torch.empty_like(d)
    gluon_grouped.m_grouped_fp8(a2, b2, d2, index2)
    rec = recorders["ws"]
    assert len(rec.jit) == 1 and len(rec.runs) == 1 and not recorders["v1"].jit
    grid, num_warps, kwargs = rec.jit[0]
    assert kwargs["GROUPING"] == fp8_gemm_ws.M_GROUPED and kwargs["WAVES"] == 1 and kwargs["ACCUMULATE"] is False
    assert kwargs["num_groups"] == len(sizes) and kwargs["sb_group_stride"] == b[1].stride(0)
    assert kwargs["sb_stride"] == b[1].stride(1) and kwargs["M"] == index.numel() and kwargs["N"] == n
    assert list(kwargs["b0_desc"].shape) == [len(sizes) * n, k]
    assert kwargs["group_ptr"].data_ptr() == index.data_ptr()
    tiles = cdiv(index.numel(), 128) * cdiv(n, 128)
    assert grid[0] == max(1, min(tiles, tilegemm.config.get_num_sms())), "one CTA per tile, at most one per SM"
    run = rec.runs[0]
    assert list(kwargs) == list(rec.arg_names)
    launched = _launched_as_jitted(rec, kwargs, run)
    assert launched["a_desc"].base.data_ptr() == a2[0].data_ptr()
    assert launched["sa_desc"].base.data_ptr() == a2[1].data_ptr()
    assert launched["b0_desc"].base.data_ptr() == b2[0].data_ptr()
    assert launched["sb_ptr"].data_ptr() == b2[1].data_ptr()
    assert launched["group_ptr"].data_ptr() == index2.data_ptr()
    assert launched["d0_desc"].base.data_ptr() == d2.data_ptr()


def test_experts_plans_launch_the_gated_and_row_scaled_forms(recorders):
    """The fused FP8 experts' two plans (``ops/gluon/moe_fp8.py``): the gate/up one runs the gated form (B as the
    [G * 2I, H] gate and up rows, D FP8 [M, I], its scales by pointer, no overlap), the down one the row-scaled form
    (the routing weights by pointer); a second call hands the launcher the new scales; a run without the tensor its
    plan was made with is refused."""
    sizes, inter, k = [300, 0, 129], 256, 512
    a, w13, index = _grouped_operands(sizes, 2 * inter, k)
    rows = index.numel()

    def gate_up():
        hq = torch.empty(rows, inter, dtype=torch.float8_e4m3fn)
        sh = torch.empty(inter // 128, rows)
        plan = gluon_grouped.m_grouped_plan(a, w13, hq, index, gated=1, d_scales=sh)
        plan(a, w13, hq, None, index, d_scales=sh)
        return plan, hq, sh

    plan, hq, sh = gate_up()
    _, hq2, sh2 = gate_up()
    rec = recorders["ws"]
    assert len(rec.jit) == 1 and len(rec.runs) == 1
    _, _, kwargs = rec.jit[0]
    assert kwargs["GATED"] == 1 and kwargs["ROW_SCALE"] is False and kwargs["OVERLAP"] == 0 and kwargs["N"] == inter
    assert list(kwargs["b0_desc"].shape) == [len(sizes) * 2 * inter, k]
    assert kwargs["d_scale_ptr"].data_ptr() == sh.data_ptr() and kwargs["d0_desc"].base.dtype == torch.float8_e4m3fn
    launched = dict(zip(rec.arg_names, rec.runs[0][LEADING:]))
    assert (
        launched["d_scale_ptr"].data_ptr() == sh2.data_ptr() and launched["d0_desc"].base.data_ptr() == hq2.data_ptr()
    )
    with pytest.raises(ValueError, match="row_scale / d_scales"):
        plan(a, w13, hq, None, index)

    w2 = tilegemm.per_block_cast_to_fp8(torch.randn(len(sizes), 384, inter))
    weight = torch.rand(rows)
    h = (hq.view(torch.uint8).zero_().view(torch.float8_e4m3fn), sh.t())
    y = torch.empty(rows, 384, dtype=torch.bfloat16)
    down = gluon_grouped.m_grouped_plan(h, w2, y, index, weight)
    down(h, w2, y, None, index, row_scale=weight)
    _, _, kwargs = rec.jit[1]
    assert (
        kwargs["ROW_SCALE"] is True and kwargs["GATED"] == 0 and kwargs["row_scale_ptr"].data_ptr() == weight.data_ptr()
    )
    with pytest.raises(ValueError, match="row_scale / d_scales"):
        down(h, w2, y, None, index)


@pytest.mark.parametrize("gated", [1, 0])
def test_experts_plans_take_the_design_asked(recorders, gated):
    """``m_grouped_plan(..., design=)``: the fused experts' 64-row designs launch A's box and D's box 64 rows high,
    and a plan of another design is a plan of its own."""
    sizes, inter, k = [300, 0, 129], 256, 512
    a, w13, index = _grouped_operands(sizes, 2 * inter, k)
    rows = index.numel()
    up, down = "e_64x128_p", "e_64x128_ov2"
    if gated:
        d, extra = torch.empty(rows, inter, dtype=torch.float8_e4m3fn), {"d_scales": torch.empty(inter // 128, rows)}
    else:
        d, extra = torch.empty(rows, 2 * inter, dtype=torch.bfloat16), {}
    for design in ((up if gated else down), None):
        plan = gluon_grouped.m_grouped_plan(a, w13, d, index, gated=gated, design=design, **extra)
        plan(a, w13, d, None, index, **extra)
    rec = recorders["ws"]
    assert len(rec.jit) == 2, "one plan a design"
    (_, _, short), (_, _, wide) = rec.jit
    assert list(short["a_desc"].block_shape) == [64, 128] and list(short["d0_desc"].block_shape) == [64, 128]
    assert list(wide["a_desc"].block_shape) == [128, 128]
    assert short["OVERLAP"] == (0 if gated else fp8_gemm_ws.VARIANTS[down].overlap)


@pytest.mark.parametrize(
    "m_sum, groups, k, design",
    [(33408, 8, 7168, "d_128x128_ov8"), (16640, 32, 2048, "d_128x128_ov8"), (27648, 64, 2048, "d_128x128_ov8"),
     (32768, 128, 7168, "d_128x128_ov4"), (40448, 128, 2048, "d_128x128_ov4"), (32768, 256, 7168, "d_128x128_ov4"),
     (30464, 4, 768, "g_128x128_ov8"), (32768, 256, 768, "g_128x128_ov8"), (33024, 8, 896, "d_128x128_ov8"),
     (0, 0, 768, "d_128x128_ov4")],
)  # fmt: skip
def test_m_grouped_fp8_ws_design(m_sum, groups, k, design):
    """Each MMA warpgroup a partition up to K 768 (the measured K 768 rows gained at every group count); above it,
    runs of 8 K blocks from 384 rows a group on average (the measured rows: 8-64 groups of 432-8192 rows gained,
    groups of 128-316 rows lost), runs of 4 below."""
    assert gluon_rules.m_grouped_fp8_ws_design(m_sum, groups, k) == design


def test_m_grouped_call_runs_the_design_of_its_group_length_and_k(recorders):
    """Above K 768 a call of long groups launches the runs-of-8 design, one of short groups the runs-of-4 one; up to
    K 768 either launches each MMA warpgroup as a partition, in runs of 8."""
    for sizes, k, overlap, parts in (([512, 384], 896, 8, 1), ([128, 200, 56], 896, 4, 1), ([128, 200], 768, 8, 2)):
        a, b, index = _grouped_operands(sizes, 256, k)
        d = torch.empty(index.numel(), 256, dtype=torch.bfloat16)
        gluon_grouped.m_grouped_fp8(a, b, d, index)
        meta = recorders["ws"].jit[-1][2]
        assert (meta["OVERLAP"], meta["WG_PARTS"]) == (overlap, parts)


@pytest.mark.parametrize("tokens, top_k, experts", [(512, 8, 128), (512, 8, 256), (512, 2, 8)])
def test_moe_fp8_ws_designs(tokens, top_k, experts):
    """The fused experts run the 128-row designs at every size (64-row tiles measured slower at 16-32 rows/expert)."""
    want = (gluon_rules.MOE_FP8_GATE_UP_WS_DESIGN, gluon_rules.M_GROUPED_FP8_WS_DESIGN)
    assert gluon_rules.moe_fp8_ws_designs(tokens, top_k, experts) == want


@pytest.mark.parametrize("addend", [None, "d", "apart"])
def test_k_grouped_plan_launches_the_grouped_kernel(recorders, addend):
    """A k-grouped call (``tn`` form) runs the ws kernel's k-grouped form on K-major copies of A and B: D as
    [G * M, N], B's column scales by TMA, the groups' K offsets and D itself by pointer, ``ACCUMULATE`` with an
    addend (one apart from D copied into D first); a second call reuses the plan."""
    ks, m, n = [256, 0, 512], 256, 200
    k_sum = sum(ks)

    def operands_tn():
        qa, sa = tilegemm.per_token_cast_to_fp8(torch.randn(m, k_sum))
        qb, sb = tilegemm.per_token_cast_to_fp8(torch.randn(n, k_sum))
        return (qa.t().contiguous(), sa.t().contiguous()), (qb.t().contiguous(), sb.t().contiguous())

    layout = torch.tensor(ks, dtype=torch.int32)
    for _ in range(2):
        a, b = operands_tn()
        d = torch.zeros(len(ks), m, n)
        c = {None: None, "d": d, "apart": torch.ones(len(ks), m, n)}[addend]
        gluon_grouped.k_grouped_fp8(a, b, d, ks, layout, c)
        if addend == "apart":
            assert torch.equal(d, c), "the addend is copied into d, which the kernel then accumulates into"
    rec = recorders["ws"]
    assert len(rec.jit) == 1 and len(rec.runs) == 1
    grid, num_warps, kwargs = rec.jit[0]
    assert kwargs["GROUPING"] == fp8_gemm_ws.K_GROUPED and kwargs["ACCUMULATE"] is (addend is not None)
    assert kwargs["num_groups"] == len(ks) and (kwargs["M"], kwargs["N"], kwargs["K"]) == (m, n, k_sum)
    assert list(kwargs["a_desc"].shape) == [m, k_sum] and list(kwargs["b0_desc"].shape) == [n, k_sum]
    assert list(kwargs["sb_desc"].shape) == [k_sum // 128, n] and list(kwargs["d0_desc"].shape) == [len(ks) * m, n]
    assert kwargs["group_ptr"].tolist() == [0, 256, 256, 768]
    assert grid[0] == max(1, min(len(ks) * 2 * 2, tilegemm.config.get_num_sms()))
    launched = _launched_as_jitted(rec, kwargs, rec.runs[0])
    assert launched["d0_desc"].base.data_ptr() == d.data_ptr()  # the product is added to D in place


def test_k_grouped_nt_reads_the_blocks_in_place(recorders):
    """The ``nt`` op (DeepGEMM's layout: each group's K-major block back to back) runs the k-grouped form with
    ``IN_PLACE``: the blocks' own memory under ``a_blocks`` / ``b_blocks`` (no gather), A's and B's descriptors over
    [M, K_sum] / [N, K_sum] views of it (their boxes and layouts only), the scales as the ``tn`` form's; a base off
    16 bytes is gathered into the ``tn`` form instead (``IN_PLACE`` off)."""
    ks, m, n = [256, 0, 384], 256, 200
    k_sum = sum(ks)
    qa, sa = tilegemm.per_token_cast_to_fp8(torch.randn(m, k_sum))
    qb, sb = tilegemm.per_token_cast_to_fp8(torch.randn(n, k_sum))
    bounds = [0, 256, 256, 640]
    flat_a = torch.cat([qa[:, s:e].reshape(-1) for s, e in zip(bounds[:-1], bounds[1:])])
    flat_b = torch.cat([qb[:, s:e].reshape(-1) for s, e in zip(bounds[:-1], bounds[1:])])
    layout = torch.tensor(ks, dtype=torch.int32)
    d = torch.zeros(len(ks), m, n)
    gluon_grouped.k_grouped_fp8_nt((flat_a, sa), (flat_b, sb), d, ks, layout, d)
    gluon_grouped.k_grouped_fp8_nt((flat_a, sa), (flat_b, sb), d, ks, layout, d)
    rec = recorders["ws"]
    assert len(rec.jit) == 1 and len(rec.runs) == 1, "one plan for both calls"
    _, _, kwargs = rec.jit[0]
    assert kwargs["IN_PLACE"] is True and kwargs["ACCUMULATE"] is True and kwargs["GROUPING"] == fp8_gemm_ws.K_GROUPED
    assert kwargs["LOADER_REGS"] >= fp8_gemm_ws.IN_PLACE_LOADER_REGS, "the loader builds descriptors: no spills"
    assert kwargs["a_blocks"].data_ptr() == flat_a.data_ptr() and kwargs["b_blocks"].data_ptr() == flat_b.data_ptr()
    assert list(kwargs["a_desc"].shape) == [m, k_sum] and kwargs["a_desc"].base.data_ptr() == flat_a.data_ptr()
    assert list(kwargs["sa_desc"].shape) == [k_sum // 128, m] and list(kwargs["sb_desc"].shape) == [k_sum // 128, n]
    launched = _launched_as_jitted(rec, kwargs, rec.runs[0])
    assert launched["a_blocks"].data_ptr() == flat_a.data_ptr() and launched["b_blocks"].data_ptr() == flat_b.data_ptr()
    shifted = torch.empty(flat_a.numel() + 1, dtype=flat_a.dtype)[1:]  # a base 1 byte past an aligned one
    shifted.copy_(flat_a)
    gluon_grouped.k_grouped_fp8_nt((shifted, sa), (flat_b, sb), d, ks, layout, d)
    _, _, kwargs = rec.jit[-1]
    assert len(rec.jit) == 2 and kwargs["IN_PLACE"] is False and kwargs["a_blocks"].data_ptr() == d.data_ptr()


def test_k_grouped_unsupported_cases(recorders):
    """M off the 128-row tiles (a tile would cross groups) and an output that is not TMA-aligned are refused."""
    qa, sa = tilegemm.per_token_cast_to_fp8(torch.randn(200, 256))
    a = (qa.t().contiguous(), sa.t().contiguous())
    layout = torch.tensor([256], dtype=torch.int32)
    with pytest.raises(registry.Unsupported, match="multiple of 128"):
        gluon_grouped.k_grouped_fp8(a, a, torch.empty(1, 200, 200), [256], layout)
    qa, sa = tilegemm.per_token_cast_to_fp8(torch.randn(128, 256))
    a = (qa.t().contiguous(), sa.t().contiguous())
    qb, sb = tilegemm.per_token_cast_to_fp8(torch.randn(130, 256))
    b = (qb.t().contiguous(), sb.t().contiguous())
    with pytest.raises(registry.Unsupported, match="TMA"):
        gluon_grouped.k_grouped_fp8(a, b, torch.empty(1, 128, 130), [256], layout)
    assert not recorders["ws"].jit


@pytest.mark.parametrize("addend", [None, "d", "apart"])
def test_k_grouped_bf16_plan_launches_the_ws_kernel(recorders, addend):
    """A k-grouped BF16 call runs the BF16 ws kernel's k-grouped form on the caller's MN-major operands (no copy):
    [BLOCK_K, tile] boxes, D as [G * M, N], the groups' K offsets by pointer, ``ACCUMULATE`` with an addend (one
    apart from D copied into D first); a second call reuses the plan and hands the launcher the same values."""
    ks, m, n = [256, 0, 448], 256, 200
    layout = torch.tensor(ks, dtype=torch.int32)
    calls = []
    for _ in range(2):
        a, b = torch.randn(sum(ks), m).bfloat16(), torch.randn(sum(ks), n).bfloat16()
        d = torch.zeros(len(ks), m, n)
        c = {None: None, "d": d, "apart": torch.ones(len(ks), m, n)}[addend]
        gluon_grouped.k_grouped_bf16(a, b, d, ks, layout, c)
        calls.append((a, d))
        if addend == "apart":
            assert torch.equal(d, c), "the addend is copied into d, which the kernel then accumulates into"
    rec = recorders["bf16"]
    assert len(rec.jit) == 1 and len(rec.runs) == 1
    grid, num_warps, kwargs = rec.jit[0]
    design = bf16_gemm_ws.VARIANTS[gluon_rules.k_grouped_bf16_ws_design(len(ks), m, n, tilegemm.config.get_num_sms())]
    assert kwargs["K_GROUPED"] is True and kwargs["ACCUMULATE"] is (addend is not None)
    assert kwargs["num_groups"] == len(ks) and (kwargs["M"], kwargs["N"], kwargs["K"]) == (m, n, sum(ks))
    assert list(kwargs["a_desc"].shape) == [sum(ks), m] and list(kwargs["b_desc"].shape) == [sum(ks), n]
    assert list(kwargs["a_desc"].block_shape) == [bf16_gemm_ws.BLOCK_K, design.block_m]
    assert list(kwargs["d_desc"].shape) == [len(ks) * m, n]
    assert kwargs["a_desc"].base.data_ptr() == calls[0][0].data_ptr(), "A read in place"
    assert kwargs["group_ptr"].tolist() == [0, 256, 256, 704]
    launched = _launched_as_jitted(rec, kwargs, rec.runs[0])
    a, d = calls[1]
    assert launched["d_desc"].base.data_ptr() == d.data_ptr() and launched["a_desc"].base.data_ptr() == a.data_ptr()


def test_k_grouped_bf16_unsupported_cases(recorders):
    """A group's K off the 64-deep blocks, M off the 128-row tiles, and an operand whose rows are not unit-stride
    are refused before anything runs."""
    a, b, layout = torch.randn(256, 128).bfloat16(), torch.randn(256, 256).bfloat16(), torch.tensor([96, 160])
    with pytest.raises(registry.Unsupported, match="multiple of 64"):
        gluon_grouped.k_grouped_bf16(a, b, torch.empty(2, 128, 256), [96, 160], layout.int())
    with pytest.raises(registry.Unsupported, match="multiple of 128"):
        gluon_grouped.k_grouped_bf16(a[:, :64], b, torch.empty(1, 64, 256), [256], layout[:1].int())
    with pytest.raises(registry.Unsupported, match="TMA"):
        gluon_grouped.k_grouped_bf16(a.t().contiguous().t(), b, torch.empty(1, 128, 256), [256], layout[:1].int())
    assert not recorders["bf16"].jit


@pytest.mark.parametrize("m_sum, groups, k", [(256, 2, 0), (256, 0, 512), (0, 2, 512)], ids=["k0", "g0", "m0"])
def test_m_grouped_call_with_an_empty_dimension_launches_nothing(recorders, m_sum, groups, k):
    """An m-grouped call with no K or no groups writes every row 0 (each an empty sum, or padding); one with no rows
    has nothing to write. Neither launches, and neither leaves a hot-lane replay (the full path is as short)."""
    fp8 = torch.float8_e4m3fn
    a = (torch.zeros(m_sum, k, dtype=fp8), torch.ones(m_sum, cdiv(k, 128)))
    b = (torch.zeros(groups, 256, k, dtype=fp8), torch.ones(groups, 2, cdiv(k, 128)))
    d = torch.full((m_sum, 256), float("nan"), dtype=torch.bfloat16)
    index = torch.full((m_sum,), 0 if groups else -1, dtype=torch.int32)
    assert gluon_grouped.m_grouped_fp8(a, b, d, index) is d
    assert bool((d == 0).all())
    assert gluon_grouped._m_grouped_replay(dict(a=a, b=b, d=d, grouped_layout=index)) is None
    assert not recorders["ws"].jit and not recorders["ws"].runs


def test_m_grouped_unsupported_cases(recorders):
    """What the grouped kernel lacks is refused before anything runs: the psum layout, 1x128-row RHS scales, an
    output of another dtype or not TMA-aligned."""
    a, b, index = _grouped_operands([200, 56], 256, 512)
    d = torch.empty(index.numel(), 256, dtype=torch.bfloat16)
    with pytest.raises(registry.Unsupported, match="psum"):
        gluon_grouped.m_grouped_fp8(a, b, d, index, use_psum_layout=True)
    rows_scaled = (b[0], torch.ones(2, 256, 4))
    with pytest.raises(registry.Unsupported, match="128x128"):
        gluon_grouped.m_grouped_fp8(a, rows_scaled, d, index)
    with pytest.raises(registry.Unsupported, match="dtype"):
        gluon_grouped.m_grouped_fp8(a, b, d.half(), index)
    unaligned = torch.empty(index.numel(), 260, dtype=torch.bfloat16)[:, :250]
    with pytest.raises(registry.Unsupported, match="TMA"):
        gluon_grouped.m_grouped_fp8(a, (b[0][:, :250], b[1]), unaligned, index)
    assert not recorders["ws"].jit


def test_m_grouped_rule_wants_enough_tiles():
    """The automatic choice gives the grouped kernel calls with enough 128x128 tiles and tile-steps for the SMs."""
    from tilegemm.heuristics.gluon import prefers_k_grouped_fp8, prefers_m_grouped_fp8

    assert prefers_m_grouped_fp8(8192, 4096, 7168, 132)
    assert not prefers_m_grouped_fp8(256, 2048, 768, 132)  # 32 tiles on 132 SMs
    assert not prefers_m_grouped_fp8(1024, 1536, 128, 132)  # 96 tiles of one K block
    assert prefers_k_grouped_fp8(8, 4096, 7168, 8 * 4096, 132)
    assert not prefers_k_grouped_fp8(4, 4000, 7168, 4 * 4096, 132)  # M off the tiles
    assert not prefers_k_grouped_fp8(2, 128, 256, 2 * 256, 132)  # 8 tiles


def _wrapper_of_triton_3_7(launcher, signature, tensordesc_meta):
    """triton 3.7's ``wrap_handle_tensordesc`` in form: 3.6's closure, the kernel's arguments handed on as one list."""
    tensordesc_indices = {i for i, sig in enumerate(signature.values()) if str(sig).startswith("tensordesc")}

    def inner(*args):
        final, n = [], 0
        for i, arg in enumerate(args[-1]):
            if i in tensordesc_indices:
                final.extend(nvidia_driver.make_tensordesc_arg(arg, tensordesc_meta[n]))
                n += 1
            else:
                final.append(arg)
        return launcher(*args[:-1], final)

    return inner


def _wrapper_of_triton_3_8(launcher, signature, tensordesc_meta):
    """triton 3.8's ``wrap_handle_tensordesc_impl`` in form: its closure (the encoder among it, called with the base
    arguments too), descriptors found by path, the kernel's arguments handed on as one list."""
    make_tensordesc_arg = nvidia_driver.make_tensordesc_arg
    signature = tuple(signature.values())
    relevant_paths = {i: {} for i, sig in enumerate(signature) if str(sig).startswith("tensordesc")}

    def inner(*args):
        assert len(args[-1]) == len(signature)
        final, n = [], 0
        for i, arg in enumerate(args[-1]):
            if i in relevant_paths:
                final.extend(make_tensordesc_arg(arg, tensordesc_meta[n], args[:-1]))
                n += 1
            else:
                final.append(arg)
        return launcher(*args[:-1], final)

    return inner


def _installed_launches_one_list() -> bool:
    """Whether the installed triton's launcher takes the kernel's arguments as one list (3.7 on)."""
    import triton

    return tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 7)


def _relaunch_against_triton(monkeypatch, scratch: int = 0, form: str | None = None):
    """A :class:`tma.Relaunch` over a kernel whose launcher is a recorder under a descriptor wrapper, and the
    launcher arguments triton's path (``CudaLauncher.__call__``) would give for the same values. ``form``: ``None``
    for the installed triton's own wrapper, ``"3.7"`` / ``"3.8"`` for one in that version's form. Descriptors are
    encoded by a stand-in (no GPU): ``("map", address, metadata)``, counted."""
    from triton.backends.nvidia import driver

    encoded = []

    def encode(arg, meta, *base_args):
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), meta["i"]), *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", encode)
    monkeypatch.setattr(tma, "make_tensordesc_arg", encode)
    monkeypatch.setattr(tma, "current_stream", lambda device: 7)
    launched = []
    signature = {"a_desc": "tensordesc<fp8[128, 128]>", "d_desc": "tensordesc<bf16[64, 128]>", "x": "*fp32",
                 "n": "i32", "C": "constexpr"}  # fmt: skip
    wrap = {None: driver.wrap_handle_tensordesc, "3.7": _wrapper_of_triton_3_7, "3.8": _wrapper_of_triton_3_8}[form]
    listed = _installed_launches_one_list() if form is None else True
    wrapper = wrap(lambda *args: launched.append(args), signature, [{"i": 0}, {"i": 1}])
    run = types.SimpleNamespace(launch=wrapper, global_scratch_size=scratch, profile_scratch_size=0,
                                launch_cooperative_grid=False, launch_pdl=True)  # fmt: skip
    if listed:
        run.arg_annotations, run.kernel_signature = "annotations", "signature"
    compiled = types.SimpleNamespace(run=run, function=11, packed_metadata="packed")
    shapes = [([256, 512], [512, 1]), ([256, 64], [64, 1])]
    relaunch = tma.Relaunch(compiled, (5, 1, 1), torch.device("cpu"), shapes)

    def triton_path(bases, rest, stream, scratch=None):
        values = [tma.Bound(t, *shape) for t, shape in zip(bases, shapes)] + list(rest)
        if listed:
            wrapper(5, 1, 1, stream, 11, False, True, "packed", None, None, None, scratch, None, "annotations",
                    "signature", values)  # fmt: skip
        else:
            wrapper(5, 1, 1, stream, 11, False, True, scratch, None, "packed", None, None, None, *values)
        return launched.pop()

    return relaunch, triton_path, launched, encoded


def test_bound_descriptor_has_every_field_of_tritons_but_the_compiled_in_ones():
    """``tma.Bound`` stands in for gluon's ``TensorDescriptor`` where a kernel is launched again: every field of the
    installed triton's descriptor but the block shape and layout (compiled into the kernel) is there, with its
    default (triton 3.8's launcher reads ``round_f32_to_tf32``)."""
    bound = tma.Bound(torch.empty(4, 8), [4, 8], [8, 1])
    for field in dataclasses.fields(TensorDescriptor):
        if field.name in ("block_shape", "layout"):
            continue
        assert field.name in tma.Bound._fields, field.name
        if field.default is not dataclasses.MISSING:
            assert getattr(bound, field.name) == field.default, field.name


@pytest.mark.parametrize("form", [None, "3.7", "3.8"], ids=["installed", "3.7", "3.8"])
def test_relaunch_hands_tritons_launcher_what_its_wrapper_would(monkeypatch, form):
    """The direct launch gives triton's C launcher the same arguments as triton's own path, on the current stream
    or the given one, and encodes a descriptor once per address: under the installed triton's wrapper and under
    wrappers in 3.7's and 3.8's forms (the kernel's arguments as one list)."""
    relaunch, triton_path, launched, encoded = _relaunch_against_triton(monkeypatch, form=form)
    a, d, x = torch.empty(256, 512), torch.empty(256, 64), torch.empty(4)
    relaunch((a, d), (x, 3, 16), None)
    assert relaunch.direct is not None and launched[-1] == triton_path((a, d), (x, 3, 16), 7)
    encoded.clear()
    a2 = torch.empty_like(a)
    relaunch((a2, d), (x, 4, 16), types.SimpleNamespace(cuda_stream=9))
    assert encoded == [a2.data_ptr()], "d's descriptor is kept, a2's encoded once"
    assert launched[-1] == triton_path((a2, d), (x, 4, 16), 9)
    for _ in range(tma.Relaunch.KEPT + 1):
        relaunch((torch.empty_like(a), d), (x, 4, 16), None)
    assert max(len(kept) for kept in relaunch.kept) <= tma.Relaunch.KEPT


def test_relaunch_takes_tritons_path_under_a_wrapper_it_does_not_know(monkeypatch):
    """A wrapper whose convention does not match its launcher's (3.6's spread arguments beside a launcher with 3.7's
    argument annotations, or 3.7's list without them), a descriptor inside a tuple parameter (3.8's paths), or a
    closure of other names: every launch goes through the compiled kernel's ``run``."""

    def again(compiled):
        return tma.Relaunch(compiled, (5, 1, 1), torch.device("cpu"), [([256, 512], [512, 1]), ([256, 64], [64, 1])])

    relaunch, _, _, _ = _relaunch_against_triton(monkeypatch, form="3.7")
    del relaunch.compiled.run.arg_annotations
    assert again(relaunch.compiled).direct is None
    if not _installed_launches_one_list():
        relaunch, _, _, _ = _relaunch_against_triton(monkeypatch)
        relaunch.compiled.run.arg_annotations, relaunch.compiled.run.kernel_signature = "annotations", "signature"
        assert again(relaunch.compiled).direct is None
    relaunch, _, _, _ = _relaunch_against_triton(monkeypatch, form="3.8")
    assert relaunch.direct is not None
    cells = dict(zip(relaunch.compiled.run.launch.__code__.co_freevars, relaunch.compiled.run.launch.__closure__))
    cells["relevant_paths"].cell_contents[1] = {0: {}}
    assert again(relaunch.compiled).direct is None
    unknown = 0

    def wrapper(*args):
        return unknown

    relaunch.compiled.run.launch = wrapper
    assert again(relaunch.compiled).direct is None


@pytest.mark.parametrize("listed", [False, True], ids=["3.6", "3.7-on"])
def test_relaunch_of_a_kernel_without_descriptors_calls_its_launcher(monkeypatch, listed):
    """A kernel without descriptor parameters has no wrapper (triton hands the C launcher over as is): the direct
    launch gives that launcher the arguments ``CudaLauncher.__call__`` would, in the installed convention's form."""
    monkeypatch.setattr(tma, "current_stream", lambda device: 7)
    launched = []

    class Launcher:  # a C function: no ``__code__``
        def __call__(self, *args):
            launched.append(args)

    run = types.SimpleNamespace(launch=Launcher(), global_scratch_size=0, profile_scratch_size=0,
                                launch_cooperative_grid=False, launch_pdl=False)  # fmt: skip
    if listed:
        run.arg_annotations, run.kernel_signature = "annotations", "signature"
    compiled = types.SimpleNamespace(run=run, function=11, packed_metadata="packed")
    x = torch.empty(4)
    tma.Relaunch(compiled, (3, 2, 1), torch.device("cpu"), [])((), (x, 5), None)
    if listed:
        base = (3, 2, 1, 7, 11, False, False, "packed", None, None, None, None, None, "annotations", "signature")
        assert launched == [(*base, [x, 5])]
    else:
        assert launched == [(3, 2, 1, 7, 11, False, False, None, None, "packed", None, None, None, x, 5)]
    assert tma.Relaunch(compiled, (3, 2, 1), torch.device("cpu"), [([4], [1])]).direct is None


@pytest.mark.parametrize("form", [None, "3.7", "3.8"], ids=["installed", "3.7", "3.8"])
def test_relaunch_gives_a_kernel_with_scratch_a_buffer_a_launch(monkeypatch, form):
    """A kernel that needs global scratch (descriptors built on the device: 128 bytes each a CTA) is launched
    directly, with a fresh buffer of its size times the grid in the launcher's global-scratch argument, where
    triton's own path puts its allocator's."""
    relaunch, triton_path, launched, _ = _relaunch_against_triton(monkeypatch, scratch=256, form=form)
    buffers = []

    def buffer(nbytes, device):
        buffers.append(torch.empty(nbytes, dtype=torch.uint8))
        return buffers[-1]

    monkeypatch.setattr(tma, "scratch_buffer", buffer)
    a, d, x = torch.empty(256, 512), torch.empty(256, 64), torch.empty(4)
    assert relaunch.direct is not None and relaunch.scratch == 5 * 256
    relaunch((a, d), (x, 3, 16), None)
    relaunch((a, d), (x, 3, 16), None)
    assert [b.numel() for b in buffers] == [5 * 256, 5 * 256]
    assert launched[-1] == triton_path((a, d), (x, 3, 16), 7, scratch=buffers[-1])


def test_scratch_allocator_is_torchs_within_the_block_only():
    """Within :func:`tma.scratch_allocator` triton's allocator (a context variable) is torch's; after it, the one
    set before (here triton's default, which refuses)."""
    from triton.runtime import _allocation

    before = _allocation._allocator.get()
    with tma.scratch_allocator():
        assert _allocation._allocator.get() is tma.torch_scratch
    assert _allocation._allocator.get() is before


def test_relaunch_takes_tritons_path_with_a_launch_hook(monkeypatch):
    """With a launch hook set every launch goes through the compiled kernel's ``run`` (triton's own path), hooks
    and all."""
    from triton import knobs

    relaunch, _, launched, _ = _relaunch_against_triton(monkeypatch)
    ran = []
    relaunch.compiled.run = _Runs(ran, relaunch.compiled.run)
    relaunch.compiled.launch_metadata = lambda grid, stream, *values: "meta"
    hook = knobs.HookChain()
    hook.add(lambda metadata: None)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    a, d, x = torch.empty(256, 512), torch.empty(256, 64), torch.empty(4)
    relaunch((a, d), (x, 3, 16), None)
    assert not launched and len(ran) == 1
    args = ran[0]
    assert args[:8] == (5, 1, 1, 7, 11, "packed", "meta", hook)
    assert [(v.base.data_ptr(), v.shape, v.strides) for v in args[9:11]] == [
        (a.data_ptr(), [256, 512], [512, 1]),
        (d.data_ptr(), [256, 64], [64, 1]),
    ]
    assert args[11:] == (x, 3, 16)


class _Runs:
    """A compiled kernel's ``run`` that records its calls (and keeps the attributes :class:`tma.Relaunch` reads)."""

    def __init__(self, calls: list, like) -> None:
        self.calls, self.launch = calls, like.launch
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def __call__(self, *args):
        self.calls.append(args)


@pytest.mark.parametrize("name", ["g_128x128_ov4", "g_128x192", "d_128x128_ov8", "c_128x192"])
def test_warpgroup_partitions_launch_as_configured(recorders, name):
    """A design with each MMA warpgroup a partition of its own (``wg_parts`` 2) launches 4 warps (the default
    partition is warpgroup 0; warpgroup 1 and the loader are workers) with ``WG_PARTS`` 2, its loader at 24 registers
    and D's boxes a warpgroup's 64 rows; the lockstep design 8 warps, D's boxes 128 rows. A's box is the tile's 128
    rows either way."""
    cfg = fp8_gemm_ws.VARIANTS[name]
    a, b = _operands(300, 200, 1100, False)
    d = torch.empty(300, 200, dtype=torch.bfloat16)
    fp8_gemm_ws.ws_plan(a, b, d, cfg, 132)(a, b, d)
    _, num_warps, kwargs = recorders["ws"].jit[-1]
    parts = 2 if name.startswith("g_") else 1
    assert cfg.wg_parts == kwargs["WG_PARTS"] == parts and num_warps == cfg.num_warps == 8 // parts
    assert list(kwargs["d0_desc"].block_shape) == [128 // parts, 128]
    if cfg.block_n == 192:  # the 64 columns past the 128-wide sub-tile: a box of its own
        assert list(kwargs["d1_desc"].block_shape) == [128 // parts, 64]
    assert list(kwargs["a_desc"].block_shape) == [128, 128]
    assert kwargs["LOADER_REGS"] == (24 if parts == 2 else cfg.loader_regs)


@pytest.mark.parametrize(
    "name, shape, tiles, cols",
    [("i_64x64_ov2_sk2", (128, 2048, 7168), 64, 64), ("i_64x128_ov4_sk4", (256, 1024, 16384), 32, 128)],
)
def test_one_mma_warpgroup_splits_a_single_short_round(recorders, name, shape, tiles, cols):
    """The one-warpgroup split designs on a single short round of 132 SMs (64 64x64 tiles at 128x2048x7168 split
    2 ways, 32 64x128 tiles at 256x1024x16384 split 4 ways): one warpgroup (4 warps) on 128 CTAs, a workspace slot
    per tile and split of 64 x ``cols`` fp32, zeroed counters."""
    cfg = fp8_gemm_ws.VARIANTS[name]
    m, n, k = shape
    a, b = _operands(m, n, k, False)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    fp8_gemm_ws.ws_plan(a, b, d, cfg, 132)(a, b, d)
    grid, num_warps, kwargs = recorders["ws"].jit[-1]
    assert num_warps == 4 and kwargs["SPLITS"] == cfg.splits and split_tail.tail_tiles(tiles, 132, cfg.splits) == tiles
    assert grid[0] == 128 == split_tail.split_grid(tiles, 132, cfg.splits) == tiles * cfg.splits
    assert kwargs["work_ptr"].numel() == tiles * cfg.splits * 64 * cols
    assert torch.equal(kwargs["counter_ptr"], torch.zeros(tiles, dtype=torch.int32))


@pytest.mark.parametrize(
    "change, problem, message",
    [
        ({"wg_parts": 3}, {}, "wg_parts 1 or 2"),
        ({"waves": 2}, {}, "128-row tiles of one wave"),
        ({"wave_m": 64}, {}, "128-row tiles of one wave"),
        ({"overlap": 0}, {"groups": 2, "grouping": fp8_gemm_ws.M_GROUPED, "gated": 1}, "not gated"),
    ],
)
def test_warpgroup_partitions_refuse_other_tiles(change, problem, message):
    """``ws_config`` refuses a ``wg_parts`` 2 design on anything but one 128-row wave of a tile, unsplit and not
    gated (the kernel's static assertion), with a message that says so, before any launch."""
    cfg = fp8_gemm_ws.VARIANTS["g_128x128_ov4"]._replace(**change)
    out = torch.float8_e4m3fn if problem.get("gated") else torch.bfloat16
    with pytest.raises(ValueError, match=message):
        fp8_gemm_ws.ws_config(fp8_gemm_ws.Problem(256, 256, 256, out, **problem), cfg)


@pytest.mark.parametrize("name", ["i_64x128_ov4", "i_64x64_ov2", "e_64x128_ov2"])
def test_one_mma_warpgroup_launches_four_warps(recorders, name):
    """A 64-row design on one MMA warpgroup (``mma_warps`` 4) launches 4 warps (the default partition is that
    warpgroup; the loader warp a worker), its A and D boxes the tile's 64 rows and full width; the two-warpgroup
    design of the same tile 8 warps."""
    cfg = fp8_gemm_ws.VARIANTS[name]
    a, b = _operands(300, 200, 1100, False)
    d = torch.empty(300, 200, dtype=torch.bfloat16)
    fp8_gemm_ws.ws_plan(a, b, d, cfg, 132)(a, b, d)
    _, num_warps, kwargs = recorders["ws"].jit[-1]
    assert num_warps == cfg.num_warps == (4 if name.startswith("i_") else 8) and kwargs["WG_PARTS"] == 1
    assert list(kwargs["a_desc"].block_shape) == [64, 128]
    assert list(kwargs["d0_desc"].block_shape) == [64, cfg.block_n]


@pytest.mark.parametrize(
    "change, problem, message",
    [
        ({"mma_warps": 6}, {}, "mma_warps 4"),
        ({"wave_m": 128}, {}, "runs a 64-row tile"),
        ({"wg_parts": 2, "wave_m": 64}, {}, "tiles of one wave"),
        ({"overlap": 0}, {"groups": 2, "grouping": fp8_gemm_ws.M_GROUPED, "gated": 1}, "not gated"),
    ],
)
def test_one_mma_warpgroup_refuses_other_tiles(change, problem, message):
    """``ws_config`` refuses ``mma_warps`` other than 8 or 4, and 4 on anything but an ungated 64-row tile,
    with a message that says so, before any launch."""
    cfg = fp8_gemm_ws.VARIANTS["i_64x128_ov4"]._replace(**change)
    out = torch.float8_e4m3fn if problem.get("gated") else torch.bfloat16
    with pytest.raises(ValueError, match=message):
        fp8_gemm_ws.ws_config(fp8_gemm_ws.Problem(256, 256, 256, out, **problem), cfg)
