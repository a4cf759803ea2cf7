"""``einsum``, ``fp8_einsum``, ``tf32_hc_prenorm_gemm`` against float64 formulas; the cutile host paths on the CPU.

Backend tests run each op on the pytorch reference (CPU; CUDA) and on cutile (CUDA, fallback disabled where
cutile runs the case): DeepGEMM's expressions at small sizes, with its layouts (a column-sliced ``y``), fp32
and bf16 outputs, ``c`` (as ``d`` and separate), sizes off the tiles, ``d`` poisoned with NaN and a rerun that
must be bitwise identical.

The composition tests run the cutile implementations' host code on CPU tensors, with the grouped GEMMs they
launch (masked and k-grouped, through ``registry.get_impl``) stood in by those ops' pytorch implementations
(the same contract): they check the views, permutations, scale layouts, copies and ``c`` handling around the
kernels. The kernels themselves run in the GPU tests (here and ``test_einsum_gpu.py``).
"""

from __future__ import annotations

import pytest
import torch

import tilegemm as tg
from tilegemm.backend import registry
from tilegemm.backend.registry import Unsupported
from tilegemm.ops.reference.gemm import round_to_tf32
from tilegemm.testing import assert_rerun_identical, backend_device_params, calc_diff, dequantize, poisoned

BACKENDS = backend_device_params()
BAR = {torch.float32: 1e-6, torch.bfloat16: 1e-5}
BAR_FP8_VS_UNQUANTIZED = 1e-3
FP8 = torch.float8_e4m3fn


@pytest.fixture
def strict(monkeypatch, backend):
    """On cutile a fallback would test the reference twice: make it an error."""
    if backend == "cutile":
        monkeypatch.setenv("TILEGEMM_DISABLE_FALLBACK", "1")


def _sid(shape) -> str:
    return "x".join(map(str, shape))


# ------------------------------------------------------------------------------------- BF16 einsum

# (S, M, N, K): DeepGEMM's tile-sized shapes, sizes off the tiles, K whose rows are not 16-byte aligned.
BMK_SHAPES = [(5, 128, 384, 128), (3, 130, 257, 200), (2, 33, 17, 20), (300, 16, 24, 64)]
# (B, H, R, D): DeepGEMM's (4, 8, 256, 128) form, sizes off the tiles, a batch above the 64-row tile.
HEAD_SHAPES = [(4, 8, 256, 128), (5, 3, 200, 72), (70, 2, 128, 64)]
BMK_MODES = ["f32-c-is-d", "bf16", "bf16-c", "f32"]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("mode", BMK_MODES)
@pytest.mark.parametrize("shape", BMK_SHAPES, ids=_sid)
def test_bmk_bnk_mn(backend, device, strict, shape, mode):
    s, m, n, k = shape
    torch.manual_seed(0)
    a = torch.randn(s, m, k, device=device).bfloat16()
    b = torch.randn(s, n, k, device=device).bfloat16()
    ref = torch.einsum("smk,snk->mn", a.double(), b.double())
    dtype = torch.float32 if mode.startswith("f32") else torch.bfloat16
    if mode == "f32-c-is-d":  # DeepGEMM's accumulate form: d += sum_s a[s] @ b[s].T
        d = torch.randn(m, n, device=device)
        c, ref = d, ref + d.double()
    elif mode == "bf16-c":
        c, d = torch.randn(m, n, device=device).bfloat16(), poisoned((m, n), dtype, device)
        ref = ref + c.double()
    else:
        c, d = None, poisoned((m, n), dtype, device)
    assert tg.einsum("bmk,bnk->mn", a, b, d, c=c, backend=backend) is d
    assert calc_diff(d, ref) < BAR[dtype]
    if c is None:
        assert_rerun_identical(lambda: tg.einsum("bmk,bnk->mn", a, b, d, backend=backend), d)


def _head_operands(expr: str, shape, device, dtype=torch.bfloat16):
    """``x`` and the column-sliced ``y = fy[:, :, :R]`` of DeepGEMM's test, in float64 too."""
    bsz, h, r, dd = shape
    x = torch.randn(bsz, h, r if expr.startswith("bhr") else dd, device=device).to(dtype)
    fy = torch.randn(h, dd, r + 128, device=device).to(dtype)
    return x, fy[:, :, :r]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("mode", ["bf16", "f32", "bf16-c", "f32-c-is-d"])
@pytest.mark.parametrize("shape", HEAD_SHAPES, ids=_sid)
@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_heads(backend, device, strict, expr, shape, mode):
    torch.manual_seed(1)
    x, y = _head_operands(expr, shape, device)
    ref = torch.einsum(expr, x.double(), y.double())
    dtype = torch.float32 if mode.startswith("f32") else torch.bfloat16
    if mode == "f32-c-is-d":
        d = torch.randn(ref.shape, device=device)
        c, ref = d, ref + d.double()
    elif mode == "bf16-c":
        c, d = torch.randn(ref.shape, device=device).bfloat16(), poisoned(ref.shape, dtype, device)
        ref = ref + c.double()
    else:
        c, d = None, poisoned(ref.shape, dtype, device)
    assert tg.einsum(expr, x, y, d, c, backend=backend) is d
    assert calc_diff(d, ref) < BAR[dtype]
    if c is None:
        assert_rerun_identical(lambda: tg.einsum(expr, x, y, d, backend=backend), d)


# -------------------------------------------------------------------------------------- FP8 einsum


def _fp8_heads(expr: str, shape, device):
    """DeepGEMM's FP8 operands: per-token ``x`` scales ``[B, H, K/128]``, per-block ``y`` scales ``[H, D/128, R/128]``;
    plus the float64 dequantized and unquantized operands."""
    bsz, h, r, dd = shape
    x = torch.randn(bsz, h, r if expr.startswith("bhr") else dd, device=device)
    y = torch.randn(h, dd, r, device=device)
    xq, sx = tg.per_token_cast_to_fp8(x, use_ue8m0=True)
    yq, sy = tg.per_block_cast_to_fp8(y, use_ue8m0=True)
    return (xq, sx), (yq, sy), dequantize(xq, sx, 1), dequantize(yq, sy, 128), x.double(), y.double()


# (B, H, R, D): FP8 rows stay 16-byte aligned (TMA), D and R off the 128 scale blocks in the second.
FP8_HEAD_SHAPES = [(4, 8, 512, 256), (5, 3, 208, 144), (70, 2, 256, 128)]


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("mode", ["bf16", "f32", "f32-c-is-d"])
@pytest.mark.parametrize("shape", FP8_HEAD_SHAPES, ids=_sid)
@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_fp8_heads(backend, device, strict, expr, shape, mode):
    torch.manual_seed(2)
    a, b, x64, y64, xu, yu = _fp8_heads(expr, shape, device)
    ref = torch.einsum(expr, x64, y64)
    unquant = torch.einsum(expr, xu, yu)
    dtype = torch.float32 if mode.startswith("f32") else torch.bfloat16
    c = None
    d = poisoned(ref.shape, dtype, device)
    if mode == "f32-c-is-d":
        d = c = torch.randn(ref.shape, device=device)
        ref, unquant = ref + c.double(), unquant + c.double()
    assert tg.fp8_einsum(expr, a, b, d, c, backend=backend) is d
    assert calc_diff(d, ref) < BAR[dtype]
    assert calc_diff(d, unquant) < BAR_FP8_VS_UNQUANTIZED
    if c is None:
        assert_rerun_identical(lambda: tg.fp8_einsum(expr, a, b, d, backend=backend), d)


def _fp8_channels(bsz: int, h: int, dd: int, r: int, device):
    """``bhd,bhr->hdr`` operands: per-channel scales along B, ``[B/128, H, *]``, and their float64 values."""
    x = torch.randn(bsz, h, dd, device=device)
    y = torch.randn(bsz, h, r, device=device)
    xq, sx = tg.per_channel_cast_to_fp8(x.view(bsz, -1), use_ue8m0=True)
    yq, sy = tg.per_channel_cast_to_fp8(y.view(bsz, -1), use_ue8m0=True)
    kb = -(-bsz // 128)
    a = (xq.view(bsz, h, dd), sx.view(kb, h, dd))
    b = (yq.view(bsz, h, r), sy.view(kb, h, r))
    x64 = (xq.double() * sx.double().repeat_interleave(128, 0)[:bsz]).view(bsz, h, dd)
    y64 = (yq.double() * sy.double().repeat_interleave(128, 0)[:bsz]).view(bsz, h, r)
    return a, b, x64, y64


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("mode", ["f32-c-is-d", "bf16", "f32-c"])
@pytest.mark.parametrize("shape", [(256, 4, 128, 64), (128, 3, 72, 200)], ids=_sid)
def test_fp8_bhd_bhr_hdr(backend, device, strict, shape, mode):
    bsz, h, dd, r = shape
    torch.manual_seed(3)
    a, b, x64, y64 = _fp8_channels(bsz, h, dd, r, device)
    ref = torch.einsum("bhd,bhr->hdr", x64, y64)
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    if mode == "f32-c-is-d":  # DeepGEMM's form: z = z_0 + einsum
        d = c = torch.randn(h, dd, r, device=device) * 10
        ref = ref + c.double()
    elif mode == "f32-c":
        c, d = torch.randn(h, dd, r, device=device), poisoned((h, dd, r), dtype, device)
        ref = ref + c.double()
    else:
        c, d = None, poisoned((h, dd, r), dtype, device)
    tg.fp8_einsum("bhd,bhr->hdr", a, b, d, c, recipe=(1, 1, 128), backend=backend)
    assert calc_diff(d, ref) < BAR[dtype]


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_fp8_bhd_bhr_hdr_ragged_batch(backend, device):
    """B not a multiple of 128 (a partial last scale block): cutile falls back, the result is the formula's."""
    torch.manual_seed(4)
    a, b, x64, y64 = _fp8_channels(130, 2, 64, 48, device)
    d = poisoned((2, 64, 48), torch.float32, device)
    tg.fp8_einsum("bhd,bhr->hdr", a, b, d, recipe=(1, 1, 128), backend=backend)
    assert calc_diff(d, torch.einsum("bhd,bhr->hdr", x64, y64)) < BAR[torch.float32]


# ------------------------------------------------------------------------------------ pre-norm GEMM

# (M, N, K): DeepGEMM's N = 24, M off the 64-row tile, K off the 64 block, N above the 32-column tile.
PRENORM_SHAPES = [(37, 24, 1024), (13, 24, 7168), (130, 8, 200), (5, 40, 64), (64, 32, 100)]


def _prenorm_ref(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``a @ tf32(b).T`` (ties away from zero, the documented rounding) and ``sum_k a^2``."""
    return a.double() @ round_to_tf32(b).double().T, a.double().square().sum(-1)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("num_splits", [None, 1, 3, 16])
@pytest.mark.parametrize("shape", PRENORM_SHAPES, ids=_sid)
def test_prenorm(backend, device, strict, shape, num_splits):
    m, n, k = shape
    torch.manual_seed(5)
    a = torch.randn(m, k, device=device).bfloat16()
    b = torch.randn(n, k, device=device)
    lead = () if num_splits is None else (num_splits,)
    d = poisoned((*lead, m, n), torch.float32, device)
    s = poisoned((*lead, m), torch.float32, device)
    assert tg.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=num_splits, backend=backend) is d
    ref_d, ref_s = _prenorm_ref(a, b)
    got_d, got_s = (d, s) if num_splits is None else (d.double().sum(0), s.double().sum(0))
    assert calc_diff(got_d, ref_d) < 1e-9
    assert calc_diff(got_s, ref_s) < 1e-9
    assert_rerun_identical(lambda: tg.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=num_splits, backend=backend), d)


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_prenorm_rounds_b_to_tf32_ties_away(backend, device, strict):
    """A ``b`` value on a TF32 rounding tie goes away from zero (to even it would stay 1)."""
    tie = 1 + 2**-11
    assert round_to_tf32(torch.tensor([tie, -tie])).tolist() == [1 + 2**-10, -(1 + 2**-10)]
    a = torch.ones(1, 64, dtype=torch.bfloat16, device=device)
    b = torch.full((1, 64), tie, device=device)
    d, s = poisoned((1, 1), torch.float32, device), poisoned((1,), torch.float32, device)
    tg.tf32_hc_prenorm_gemm(a, b, d, s, backend=backend)
    assert d.item() == 64 * (1 + 2**-10) and s.item() == 64.0


# ----------------------------------------------------------------------- cutile host paths on the CPU

cutile_einsum = pytest.importorskip("tilegemm.ops.cutile.einsum")
from tilegemm.heuristics.cutile import einsum as einsum_rules  # noqa: E402

cutile_fp8_einsum = pytest.importorskip("tilegemm.ops.cutile.fp8_einsum")
cutile_prenorm = pytest.importorskip("tilegemm.ops.cutile.prenorm")


@pytest.fixture
def grouped_stand_ins(monkeypatch):
    """The grouped GEMMs the cutile einsum paths launch, stood in by the same ops' pytorch implementations."""
    real = registry.get_impl
    launched: list[str] = []

    def stand_in(name: str, backend: str):
        assert backend == "cutile"
        impl = real(name, "pytorch")

        def run(**kwargs):
            launched.append(name)
            return impl(**kwargs)

        return run

    monkeypatch.setattr(cutile_einsum, "get_impl", stand_in)
    monkeypatch.setattr(cutile_fp8_einsum, "get_impl", stand_in)
    return launched


@pytest.mark.parametrize("mode", ["bf16", "f32-c-is-d", "bf16-c"])
@pytest.mark.parametrize("shape", HEAD_SHAPES, ids=_sid)
def test_cutile_bhr_composes_masked(grouped_stand_ins, shape, mode):
    """``bhr,hdr->bhd``: the masked BF16 GEMM over ``[H, B, *]`` views (a temporary only with ``c``)."""
    torch.manual_seed(6)
    x, y = _head_operands("bhr,hdr->bhd", shape, "cpu")
    ref = torch.einsum("bhr,hdr->bhd", x.double(), y.double())
    c = None
    if mode == "f32-c-is-d":
        d = c = torch.randn(ref.shape)
        ref = ref + c.double()
    elif mode == "bf16-c":
        c, d = torch.randn(ref.shape).bfloat16(), poisoned(ref.shape, torch.bfloat16)
        ref = ref + c.double()
    else:
        d = poisoned(ref.shape, torch.bfloat16)
    assert cutile_einsum.einsum(expr="bhr,hdr->bhd", a=x, b=y, d=d, c=c, stream=None) is d
    assert grouped_stand_ins == ["m_grouped_bf16_gemm_nt_masked"]
    assert calc_diff(d, ref) < BAR[d.dtype]


@pytest.mark.parametrize("mode", ["bf16", "f32", "f32-c-is-d"])
@pytest.mark.parametrize("shape", FP8_HEAD_SHAPES, ids=_sid)
@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr"])
def test_cutile_fp8_heads_compose_masked(grouped_stand_ins, expr, shape, mode):
    """FP8 per-head expressions: the masked FP8 GEMM (``bhd``: on ``y`` copied K-major with its scales)."""
    torch.manual_seed(7)
    a, b, x64, y64, _, _ = _fp8_heads(expr, shape, "cpu")
    ref = torch.einsum(expr, x64, y64)
    c = None
    d = poisoned(ref.shape, torch.bfloat16 if mode == "bf16" else torch.float32)
    if mode == "f32-c-is-d":
        d = c = torch.randn(ref.shape)
        ref = ref + c.double()
    y_before = b[0].clone()
    out = cutile_fp8_einsum.fp8_einsum(expr=expr, a=a, b=b, d=d, c=c, recipe=(1, 128, 128), stream=None)
    assert out is d and grouped_stand_ins == ["m_grouped_fp8_fp4_gemm_nt_masked"]
    assert torch.equal(b[0].view(torch.uint8), y_before.view(torch.uint8))
    assert calc_diff(d, ref) < BAR[d.dtype]


@pytest.mark.parametrize("mode", ["f32-c-is-d", "bf16", "bf16-c", "f32-c"])
def test_cutile_fp8_bhd_bhr_hdr_composes_k_grouped(grouped_stand_ins, mode):
    """``bhd,bhr->hdr``: the k-grouped FP8 GEMM, one 256-row K range per head (an fp32 temporary for bf16 d)."""
    torch.manual_seed(8)
    bsz, h, dd, r = 256, 3, 72, 40
    a, b, x64, y64 = _fp8_channels(bsz, h, dd, r, "cpu")
    ref = torch.einsum("bhd,bhr->hdr", x64, y64)
    dtype = torch.bfloat16 if mode.startswith("bf16") else torch.float32
    c = None
    d = poisoned((h, dd, r), dtype)
    if mode == "f32-c-is-d":
        d = c = torch.randn(h, dd, r) * 10
    elif mode.endswith("-c"):
        c = torch.randn(h, dd, r).to(dtype)
    if c is not None:
        ref = ref + c.double()
    out = cutile_fp8_einsum.fp8_einsum(expr="bhd,bhr->hdr", a=a, b=b, d=d, c=c, recipe=(1, 1, 128), stream=None)
    assert out is d and grouped_stand_ins == ["k_grouped_fp8_gemm_tn_contiguous"]
    assert calc_diff(d, ref) < BAR[dtype]


def test_cutile_unsupported_cases_raise_before_writing():
    """Cases the cutile paths lack raise ``Unsupported`` (dispatch then falls back) and leave ``d`` alone."""
    x = torch.zeros(2, 2, 2, dtype=torch.bfloat16)
    d = poisoned((2, 2), torch.float32)
    with pytest.raises(Unsupported, match="expression"):
        cutile_einsum.einsum(expr="ij,jk->ik", a=x, b=x, d=d, c=None, stream=None)
    a, b, _, _ = _fp8_channels(130, 2, 16, 8, "cpu")
    d3 = poisoned((2, 16, 8), torch.float32)
    with pytest.raises(Unsupported, match="multiple of 128"):
        cutile_fp8_einsum.fp8_einsum(expr="bhd,bhr->hdr", a=a, b=b, d=d3, c=None, recipe=(1, 1, 128), stream=None)
    assert torch.isnan(d3).all()
    with pytest.raises(Unsupported, match="expression"):
        cutile_fp8_einsum.fp8_einsum(expr="bhr,bhd->hrd", a=a, b=b, d=d3, c=None, recipe=(1, 1, 128), stream=None)
    s = poisoned((4,), torch.float32)
    with pytest.raises(Unsupported, match="N == 0"):
        cutile_prenorm.tf32_hc_prenorm_gemm(
            a=torch.zeros(4, 8, dtype=torch.bfloat16), b=torch.zeros(0, 8), d=torch.zeros(4, 0), sqr_sum=s,
            num_splits=None, stream=None,
        )  # fmt: skip
    assert torch.isnan(s).all()


def test_cutile_empty_sums_launch_nothing():
    """Empty problems are finished on the host: ``bmk`` with S == 0 or K == 0 gives ``c`` (or 0), M == 0 returns."""
    a = torch.zeros(0, 3, 8, dtype=torch.bfloat16)
    b = torch.zeros(0, 5, 8, dtype=torch.bfloat16)
    c = torch.randn(3, 5)
    d = poisoned((3, 5), torch.float32)
    cutile_einsum.einsum(expr="bmk,bnk->mn", a=a, b=b, d=d, c=c, stream=None)
    assert torch.equal(d, c)
    d = poisoned((3, 5), torch.bfloat16)
    cutile_einsum.einsum(expr="bmk,bnk->mn", a=a, b=b, d=d, c=None, stream=None)
    assert torch.equal(d, torch.zeros(3, 5, dtype=torch.bfloat16))
    x = torch.zeros(2, 3, 0, dtype=torch.bfloat16)
    y = torch.zeros(3, 0, 4, dtype=torch.bfloat16)
    d = poisoned((2, 3, 4), torch.float32)
    cutile_einsum.einsum(expr="bhd,hdr->bhr", a=x, b=y, d=d, c=None, stream=None)
    assert torch.equal(d, torch.zeros(2, 3, 4))
    d = poisoned((0, 6), torch.float32)
    cutile_prenorm.tf32_hc_prenorm_gemm(
        a=torch.zeros(0, 8, dtype=torch.bfloat16), b=torch.zeros(6, 8), d=d, sqr_sum=torch.zeros(0), num_splits=None,
        stream=None,
    )  # fmt: skip


# ------------------------------------------------------------------------------- host-side planning


@pytest.mark.parametrize("tiles,steps,slots", [(3, 8192, 132), (9, 24, 132), (1, 3, 132), (66, 500, 132),
                                               (200, 100, 132), (4, 6, 132), (1, 10**6, 1024)])  # fmt: skip
def test_split_steps_cover_every_step_once(tiles, steps, slots):
    splits, per = einsum_rules.split_steps(tiles, steps, slots)
    ranges = [range(sp * per, min(steps, (sp + 1) * per)) for sp in range(splits)]
    assert sorted(j for r in ranges for j in r) == list(range(steps))
    assert all(len(r) > 0 for r in ranges) and splits <= einsum_rules.MAX_SPLITS
    if splits > 1:
        assert tiles * splits <= slots and per >= einsum_rules.MIN_SPLIT_STEPS
        assert tiles < einsum_rules.SPLIT_BELOW * slots


@pytest.mark.parametrize("blocks,splits", [(120, 16), (448, 16), (112, 16), (3, 16), (0, 4), (7, 1)])
def test_prenorm_split_blocks_cover_k(blocks, splits):
    """DeepGEMM's split points: every K block in exactly one split, the first ``rem`` splits one block longer."""
    per, rem = cutile_prenorm.split_blocks(blocks, splits)
    spans = [range(s * per + min(s, rem), s * per + min(s, rem) + per + (s < rem)) for s in range(splits)]
    assert [kb for span in spans for kb in span] == list(range(blocks))


def test_tile_choices():
    assert [cutile_prenorm.tile_n(n) for n in (1, 8, 16, 17, 24, 32, 33, 100)] == [16, 16, 16, 32, 32, 32, 32, 32]
    assert einsum_rules.heads_config(64, False).bm == 64 and einsum_rules.heads_config(65, False).bm == 128
    assert einsum_rules.heads_config(65, True).num_worker_warps == 8
    assert einsum_rules.bmk_config(True).num_worker_warps == 8
    assert einsum_rules.bmk_config(False).num_worker_warps is None
    assert cutile_einsum.masked_hint(4096, torch.bfloat16) == 4096
    assert cutile_einsum.masked_hint(4096, torch.float32) == cutile_einsum.FP32_OUT_MAX_HINT
    assert cutile_einsum.masked_hint(5, torch.float32) == 5


def test_aligned_operands():
    """Operands whose strides TMA cannot use are copied into 16-byte rows (same values); others pass as they are (the
    einsum kernels take their operands through the ground floor's TMA contract, ``ops/operands.py``)."""
    from tilegemm.ops.operands import as_row_major, tma_ready

    x = torch.randn(3, 4, 20).bfloat16()  # 40-byte rows
    assert not tma_ready(x)
    y = as_row_major(x)
    assert tma_ready(y) and torch.equal(y, x) and y.stride() == (4 * 24, 24, 1)
    z = torch.randn(4, 8, 136).bfloat16()[:, :, :128]  # DeepGEMM's column-sliced weights
    assert tma_ready(z) and as_row_major(z) is z
    assert tma_ready(torch.randn(5, 6, 16).bfloat16().transpose(0, 1))
    assert not tma_ready(torch.randn(16, 16).bfloat16().t())


def test_addend_aliasing():
    d = torch.randn(4, 8)
    assert cutile_einsum.addend(d, None)[1:] == (False, False)
    assert cutile_einsum.addend(d, d)[1:] == (True, True)
    assert cutile_einsum.addend(d, d.view(4, 8))[1:] == (True, True)
    overlap = d.view(-1)[1:9].view(1, 8).expand(4, 8)
    c = cutile_einsum.separate_addend(d, overlap)
    assert c is not overlap and torch.equal(c, overlap)
    other = torch.randn(4, 8)
    assert cutile_einsum.separate_addend(d, other) is other


def test_cutile_registered():
    for op in ("einsum", "fp8_einsum", "tf32_hc_prenorm_gemm"):
        assert "cutile" in registry.get_registered_backends_for_op(op)
    with pytest.raises(ValueError, match="no 'nope' implementation"):
        registry.get_impl("einsum", "nope")
