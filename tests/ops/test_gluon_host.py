"""The gluon dense FP8 host path without a GPU: the kernel is replaced by a recorder, so what reaches triton is
checked: the first call of a plan goes through the JIT with every parameter by name; later calls hand the compiled
kernel's launcher the same values, in the kernel's parameter order, with the same descriptor bases, shapes and
strides; the public op's hot lane replays the plan."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

import tilegemm  # noqa: E402
from tilegemm.backend import hot_lane, registry, selector  # noqa: E402
from tilegemm.ops import plans  # noqa: E402
from tilegemm.ops.gluon import fp8_gemm_kernel  # noqa: E402
from tilegemm.ops.gluon import gemm as gluon_gemm  # noqa: E402

LEADING = 9  # grid (3), stream, function, packed metadata, launch metadata, enter and exit hooks


class _Recorder:
    """Stands in for ``fp8_gemm_kernel``: ``kernel[grid](**kwargs)`` records a JIT call and returns a compiled
    kernel whose ``run`` records launcher calls."""

    arg_names = fp8_gemm_kernel.fp8_gemm_kernel.arg_names

    def __init__(self) -> None:
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
            self.jit.append((grid, num_warps, kwargs))
            return self.compiled

        return launch


def _view(value):
    """A comparable view of a launch value: a descriptor as (shape, strides) (an operand that is not TMA-ready is
    copied per call, so its base differs between calls), a tensor by pointer."""
    if hasattr(value, "base") and hasattr(value, "strides"):
        return ("desc", list(value.shape), list(value.strides))
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr())
    return value


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(
        gluon_gemm,
        "fp8_gemm_kernel",
        types.SimpleNamespace(fp8_gemm_kernel=rec, WG_ROWS=fp8_gemm_kernel.WG_ROWS, SB_BOX=fp8_gemm_kernel.SB_BOX),
    )
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(cuda_stream=7))
    monkeypatch.setattr(plans, "_PLANS", {})
    return rec


def _operands(m, n, k, rows_recipe):
    a = tilegemm.per_token_cast_to_fp8(torch.randn(m, k))
    b = (
        tilegemm.per_token_cast_to_fp8(torch.randn(n, k))
        if rows_recipe
        else tilegemm.per_block_cast_to_fp8(torch.randn(n, k))
    )
    return (a[0], tilegemm.get_mn_major_tma_aligned_tensor(a[1])), b


@pytest.mark.parametrize(
    "m, n, k, rows_recipe", [(300, 200, 1100, False), (1, 136, 256, True), (4096, 2048, 768, False)]
)
def test_compiled_launch_gets_what_the_jit_got(recorder, m, n, k, rows_recipe):
    recipe = (1, 1, 128) if rows_recipe else (1, 128, 128)
    a, b = _operands(m, n, k, rows_recipe)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    gluon_gemm.fp8_gemm(a, b, d, recipe=recipe, beta=0.0)
    gluon_gemm.fp8_gemm(a, b, d, recipe=recipe, beta=0.0)
    assert len(recorder.jit) == 1 and len(recorder.runs) == 1, "one JIT call, then the compiled kernel"
    grid, num_warps, kwargs = recorder.jit[0]
    run = recorder.runs[0]
    assert num_warps == 4 and run[:3] == grid and run[3] == 7
    assert list(kwargs) == list(recorder.arg_names)
    assert [_view(v) for v in run[LEADING:]] == [_view(kwargs[name]) for name in recorder.arg_names]
    launched = dict(zip(recorder.arg_names, run[LEADING:]))
    assert launched["d_desc"].base.data_ptr() == kwargs["d_desc"].base.data_ptr() == d.data_ptr()


def test_new_inputs_same_plan(recorder):
    a, b = _operands(300, 200, 1024, False)  # every operand TMA-ready: no copies, the caller's tensors are read
    d = torch.empty(300, 200, dtype=torch.bfloat16)
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), beta=0.0)
    a2, b2 = _operands(300, 200, 1024, False)
    d2 = torch.empty_like(d)
    gluon_gemm.fp8_gemm(a2, b2, d2, recipe=(1, 128, 128), alpha=0.5, beta=0.0)
    values = recorder.runs[-1][LEADING:]
    named = dict(zip(recorder.arg_names, values))
    assert named["a_desc"].base.data_ptr() == a2[0].data_ptr()
    assert named["sa_desc"].base.data_ptr() == a2[1].data_ptr()
    assert named["b_desc"].base.data_ptr() == b2[0].data_ptr()
    assert named["sb_desc"].base.data_ptr() == b2[1].data_ptr()
    assert named["d_desc"].base.data_ptr() == d2.data_ptr()
    assert named["alpha"] == 0.5 and named["beta"] == 0.0


def test_public_op_replays_the_plan(recorder, monkeypatch):
    monkeypatch.setattr(selector, "gluon_unavailable_reason", lambda: None)
    monkeypatch.setattr(registry, "_off_cuda", lambda value: False)
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    monkeypatch.setattr(hot_lane, "_HOT", {})
    a, b = _operands(300, 200, 1100, False)
    d = torch.empty(300, 200, dtype=torch.bfloat16)
    for _ in range(3):
        tilegemm.fp8_gemm_nt(a, b, d, backend="gluon")
    assert len(recorder.jit) == 1 and len(recorder.runs) == 2
    assert any(key[0] == "gluon" for key in hot_lane._HOT)


def test_launches_on_the_given_stream(recorder, monkeypatch):
    """``stream=`` reaches the launch: the JIT call runs with it current, the compiled kernel's launcher is handed it;
    without one, the current stream (7)."""
    entered = []

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
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), stream=given)
    assert entered == [given] and recorder.jit[-1] == "exit", "the JIT call inside the stream's context"
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128), stream=given)
    gluon_gemm.fp8_gemm(a, b, d, recipe=(1, 128, 128))
    assert [run[3] for run in recorder.runs] == [9, 7]
