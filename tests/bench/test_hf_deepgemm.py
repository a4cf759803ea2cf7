"""The ``transformers_deepgemm`` peer's plumbing on the CPU: transformers' deepgemm integration pointed at a DeepGEMM
module (here ``tilegemm`` itself, DeepGEMM's API on the pytorch backend), its experts forwards against float64, and
the reasons a row records when the peer cannot run."""

from __future__ import annotations

import types

import pytest
import torch

import tilegemm
from tilegemm.bench import core, hf_deepgemm, moe, timing
from tilegemm.testing import calc_diff

hf = pytest.importorskip("transformers.integrations.deepgemm")


@pytest.fixture
def integration(monkeypatch):
    """transformers' deepgemm module with its bundle restored afterwards and the SM100 probes answered for Hopper
    (they query the CUDA device, which a CPU run has not)."""
    monkeypatch.setattr(hf, "_DEEPGEMM", None)
    monkeypatch.setattr(hf, "is_sm100", lambda: False)
    monkeypatch.setattr(hf, "_assert_sm100_requirements", lambda *args: None)
    return hf


def _inputs(tokens=12, hidden=256, experts=4, top_k=2, inter=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    return x, ids, weights, w13, w2


def test_install_fills_the_bundle_from_the_module(integration):
    assert hf_deepgemm.install(tilegemm) is integration
    bundle = integration._DEEPGEMM
    assert bundle.grouped_bf16_matmul_nt is tilegemm.m_grouped_bf16_gemm_nt_contiguous
    assert bundle.grouped_fp8_fp4_matmul_nn is tilegemm.m_grouped_fp8_fp4_gemm_nn_contiguous
    assert bundle.per_token_cast_to_fp8 is tilegemm.utils.per_token_cast_to_fp8
    assert bundle.m_alignment == tilegemm.get_mk_alignment_for_contiguous_layout()
    assert integration.load_deepgemm_kernel() is bundle  # the hub loader is not consulted once the bundle is set


@pytest.mark.parametrize("tokens", [1, 12, 40])
def test_bf16_experts_forward_through_the_bundle(integration, tokens):
    hf_deepgemm.install(tilegemm)
    x, ids, weights, w13, w2 = _inputs(tokens=tokens, seed=tokens)
    module = moe.experts_module("qwen3_moe", w13, w2)
    out = integration.deepgemm_bf16_experts_forward(module, x, ids, weights)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    assert calc_diff(out, moe._reference(x, ids, weights, w13, w2)) < moe.BAR


def test_fp8_experts_forward_through_the_bundle(integration):
    from tilegemm.fp8_weights import quantize_weight_blocks

    hf_deepgemm.install(tilegemm)
    x, ids, weights, w13, w2 = _inputs(seed=7)
    q13, q2 = quantize_weight_blocks(w13), quantize_weight_blocks(w2)
    module = hf_deepgemm.fp8_experts_module(moe.experts_config("qwen3_moe", 4, 128, 256), q13, q2)
    out = integration.deepgemm_fp8_fp4_experts_forward(module, x, ids, weights)
    assert calc_diff(out, moe._reference_fp8(x, ids, weights, q13, q2)) < moe.FP8_BAR


def test_install_says_why_not(integration):
    assert hf_deepgemm.install(None, "disabled (--deepgemm off)") == "DeepGEMM not loaded: disabled (--deepgemm off)"
    partial = types.SimpleNamespace(**{k: getattr(tilegemm, k) for k in ("fp8_fp4_gemm_nt", "utils")})
    assert hf_deepgemm.install(partial) == "DeepGEMM lacks m_grouped_fp8_fp4_gemm_nt_contiguous"
    assert integration._DEEPGEMM is None  # nothing installed on failure


def test_moe_rows_record_why_the_peer_did_not_run(monkeypatch):
    monkeypatch.setattr(timing, "DEVICE", "cpu")
    spec = {"dtype": "bf16", "model": "qwen3-30b-a3b", "tokens": 3, "hidden": 64, "experts": 4, "top_k": 2, "inter": 32}
    row = core.measure_case(moe.case(spec, None, "disabled (--deepgemm off)"), {})
    assert row["peers"]["transformers_deepgemm"] is None
    assert row["peer_notes"]["transformers_deepgemm"] == "DeepGEMM not loaded: disabled (--deepgemm off)"
    if not torch.cuda.is_available():  # a module is given, but this machine has no Hopper GPU
        row = core.measure_case(moe.case(spec, tilegemm, "tilegemm"), {})
        assert "SM90 or SM100 GPU" in row["peer_notes"]["transformers_deepgemm"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_peer_runs_on_the_local_deepgemm_build(dtype):
    """On the GPU machine (``.devbundle/deepgemm`` built): transformers' deepgemm experts run on the real DeepGEMM
    and pass the row's float64 check, beside tilegemm."""
    from tilegemm.bench import peers

    dg, why = peers.load_deepgemm("auto")
    if dg is None:
        pytest.skip(f"DeepGEMM: {why}")
    spec = {"dtype": dtype, "model": "qwen3-30b-a3b", "tokens": 64}
    row = core.measure_case(moe.case(spec, dg, why), {})
    peer = row["peers"]["transformers_deepgemm"]
    assert peer is not None, row["peer_notes"]
    assert peer["correct"] and peer["graph_ms"] > 0, peer
    assert row["correct"], row
