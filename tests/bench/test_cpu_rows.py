"""Every family's row logic end to end on the CPU (pytorch backend, tiny shapes): inputs, the float64
check, the timing path and the row schema. The numbers are meaningless here; the structure is not."""

from __future__ import annotations

import pytest

from tilegemm.bench import core, schema, timing

CEIL = {"copy_gbps": 100.0, "bf16_tflops": 1.0, "fp8_tflops": 2.0}
SPECS = [
    ("dense", {"dtype": "bf16", "m": 3, "n": 256, "k": 384}),
    ("dense", {"dtype": "fp8", "m": 64, "n": 256, "k": 384}),
    ("m_grouped", {"dtype": "bf16", "groups": 2, "m_per_group": 128, "n": 128, "k": 256}),
    ("m_grouped", {"dtype": "fp8", "groups": 2, "m_per_group": 128, "n": 128, "k": 256}),
    ("masked", {"dtype": "bf16", "groups": 3, "expected_m": 4, "n": 128, "k": 256}),
    ("masked", {"dtype": "fp8", "groups": 3, "expected_m": 4, "n": 128, "k": 256}),
    ("k_grouped", {"dtype": "bf16", "groups": 2, "m": 64, "n": 128, "k_per_group": 256}),
    ("k_grouped", {"dtype": "fp8", "groups": 2, "m": 64, "n": 128, "k_per_group": 256}),
    ("mqa", {"kind": "plain", "S": 16, "S_kv": 64, "H": 4, "D": 32}),
    ("mqa", {"kind": "paged", "B": 2, "next_n": 2, "avg_ctx": 100, "H": 64, "D": 128}),
    ("mqa", {"kind": "indexer", "dtype": "bf16", "S": 16, "S_kv": 64, "H": 4, "D": 32}),
    ("mqa", {"kind": "indexer", "dtype": "fp8", "S": 1, "S_kv": 40, "H": 8, "D": 64}),
    (
        "moe",
        {"dtype": "bf16", "model": "qwen3-30b-a3b", "tokens": 5, "hidden": 64, "experts": 8, "top_k": 2, "inter": 32},
    ),
    (
        "moe",
        {"dtype": "bf16", "model": "mixtral-8x7b", "tokens": 3, "hidden": 64, "experts": 4, "top_k": 2, "inter": 48},
    ),
    ("norm", {"dtype": "bf16", "rows": 3, "hidden": 96}),
    ("models", {"dtype": "bf16", "model": "tiny-qwen3-moe", "layers": 2, "phase": "decode", "batch": 2, "prompt": 8}),
    (
        "models",
        {"dtype": "bf16", "model": "tiny-deepseek-v3", "layers": 3, "phase": "prefill", "batch": 2, "prompt": 8},
    ),
]
#: Families without a DeepGEMM peer: the MoE layer, the norm and whole models.
NO_DEEPGEMM = ("moe", "norm", "models")


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(timing, "DEVICE", "cpu")


@pytest.mark.parametrize(("family", "spec"), SPECS, ids=[f"{f}-{s.get('dtype', s.get('kind'))}" for f, s in SPECS])
def test_row_on_cpu(on_cpu, family, spec):
    import importlib

    mod = importlib.import_module(f"tilegemm.bench.{family}")
    row = core.measure_case(mod.case(spec, None, "disabled (--deepgemm off)"), CEIL)
    assert schema.validate_row(row) == [], row
    assert row.get("error") is None, row["error"]
    assert row["correct"] is True and row["calc_diff"] < row["bar"]
    assert row["ms"] > 0 and row["graph_ms"] is None and "CUDA graphs need a GPU" in row["graph_error"]
    if family not in NO_DEEPGEMM:
        assert row["peers"]["deepgemm"] is None and row["peer_notes"]["deepgemm"] == "disabled (--deepgemm off)"
    assert row["tflops"] >= 0 and row["gbps"] >= 0 and "frac_copy_bw" in row and "frac_peak_flops" in row
    for name, peer in row["peers"].items():
        if peer is not None:  # a peer that ran on the CPU is checked like tilegemm
            assert peer["correct"] is True, (name, peer)
    if spec.get("kind") in ("plain", "indexer"):
        assert row["same_inf_mask"] is True
    if spec.get("kind") == "indexer" and spec["dtype"] == "bf16":  # the stock formula ran beside it
        assert row["peers"]["transformers"]["correct"] is True
    if family == "models":  # the stock model is the reference; only the patched one has a greedy agreement
        assert 0.0 <= row["greedy_agreement"] <= 1.0
        peer = row["peers"]["transformers"]
        assert peer["calc_diff"] == 0.0 and "greedy_agreement" not in peer
        assert peer["note"].startswith("experts_implementation=")


def test_a_wrong_implementation_is_flagged(on_cpu):
    from tilegemm.bench import dense

    case = dense.case({"dtype": "bf16", "m": 8, "n": 128, "k": 256})
    build = case.build

    def broken():
        built = build()
        good = built.impls[0].call
        built.impls[0].call = lambda a, b, d: good(a, b, d).mul_(1.01)
        return built

    case.build = broken
    row = core.measure_case(case, CEIL)
    assert row["correct"] is False and row["calc_diff"] > row["bar"]
    assert row["peers"]["cublas"]["correct"] is True


def _fake_deepgemm():
    """A stand-in with DeepGEMM 2.6's signatures, formats and None returns, computed by tilegemm's
    pytorch backend: it checks how the harness feeds DeepGEMM (casts, layouts, arguments), not DeepGEMM."""
    from types import SimpleNamespace

    import torch

    import tilegemm
    from tilegemm import indexer

    def per_channel(x, use_ue8m0):
        q, s = tilegemm.per_token_cast_to_fp8(x.t())
        return q.t().contiguous(), s.t().contiguous()

    def k_grouped_fp8_nt(a, b, d, ks, ks_tensor, c=None, recipe=None):
        assert recipe == (1, 1, 128) and c is d
        m, n = d.shape[1], d.shape[2]

        def unflatten(flat, width):  # per group: K_g x width stored width-major (K-major)
            parts, start = [], 0
            for k in ks:
                parts.append(flat[start : start + k * width].view(width, k).t())
                start += k * width
            return torch.cat(parts)

        qa, qb = unflatten(a[0], m), unflatten(b[0], n)
        tilegemm.k_grouped_fp8_gemm_tn_contiguous((qa, a[1].t()), (qb, b[1].t()), d, ks, ks_tensor, c=c)

    def void(fn):
        return lambda *args, **kw: (fn(*args, **kw), None)[1]

    utils = SimpleNamespace(
        per_token_cast_to_fp8=lambda x, use_ue8m0: tilegemm.per_token_cast_to_fp8(x),
        per_block_cast_to_fp8=lambda x, use_ue8m0: tilegemm.per_block_cast_to_fp8(x),
        per_channel_cast_to_fp8=per_channel,
        per_custom_dims_cast_to_fp8=lambda x, dims, ue8m0: indexer.quantize_keys(x),
    )
    return SimpleNamespace(
        utils=utils,
        get_mn_major_tma_aligned_tensor=tilegemm.get_mn_major_tma_aligned_tensor,
        bf16_gemm_nt=void(tilegemm.bf16_gemm_nt),
        fp8_gemm_nt=void(tilegemm.fp8_gemm_nt),
        m_grouped_bf16_gemm_nt_contiguous=void(tilegemm.m_grouped_bf16_gemm_nt_contiguous),
        m_grouped_fp8_gemm_nt_contiguous=void(tilegemm.m_grouped_fp8_gemm_nt_contiguous),
        m_grouped_bf16_gemm_nt_masked=void(tilegemm.m_grouped_bf16_gemm_nt_masked),
        m_grouped_fp8_gemm_nt_masked=void(tilegemm.m_grouped_fp8_gemm_nt_masked),
        k_grouped_bf16_gemm_tn_contiguous=void(tilegemm.k_grouped_bf16_gemm_tn_contiguous),
        k_grouped_fp8_gemm_nt_contiguous=k_grouped_fp8_nt,
        fp8_mqa_logits=tilegemm.fp8_mqa_logits,
        fp8_paged_mqa_logits=tilegemm.fp8_paged_mqa_logits,
        get_paged_mqa_logits_metadata=tilegemm.get_paged_mqa_logits_metadata,
        get_num_sms=lambda: 8,
    )


#: Rows DeepGEMM has no op for (its peer then says so).
NO_DEEPGEMM_OP = [("mqa", {"kind": "indexer", "dtype": "bf16", "S": 16, "S_kv": 64, "H": 4, "D": 32})]
DG_SPECS = [(f, s) for f, s in SPECS if f not in NO_DEEPGEMM and (f, s) not in NO_DEEPGEMM_OP]


@pytest.mark.parametrize(
    ("family", "spec"), DG_SPECS, ids=[f"{f}-{s.get('dtype', s.get('kind'))}" for f, s in DG_SPECS]
)
def test_deepgemm_peer_wiring_on_cpu(on_cpu, family, spec):
    import importlib

    mod = importlib.import_module(f"tilegemm.bench.{family}")
    row = core.measure_case(mod.case(spec, _fake_deepgemm(), "unused"), CEIL)
    peer = row["peers"]["deepgemm"]
    assert peer is not None, row["peer_notes"].get("deepgemm")
    assert peer["correct"] is True and peer["calc_diff"] < row["bar"], peer
    assert "differ" not in (peer.get("note") or "")  # same casts as tilegemm's here


@pytest.mark.parametrize(("family", "spec"), NO_DEEPGEMM_OP, ids=["mqa-indexer-bf16"])
def test_rows_without_a_deepgemm_op_say_so(on_cpu, family, spec):
    import importlib

    mod = importlib.import_module(f"tilegemm.bench.{family}")
    row = core.measure_case(mod.case(spec, _fake_deepgemm(), "unused"), CEIL)
    assert row["peers"]["deepgemm"] is None and "no BF16" in row["peer_notes"]["deepgemm"]
