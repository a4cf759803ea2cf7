"""A synthetic saved run for the CPU tests of the harness (no GPU involved)."""

from __future__ import annotations

import copy
from typing import Any


def _row(family: str, op: str, dtype: str, shape: dict, ms: float, peers: dict, notes: dict | None = None) -> dict:
    flops = 2.0 * shape.get("m", 128) * shape.get("n", 4096) * shape.get("k", 7168)
    return {
        "family": family,
        "op": op,
        "dtype": dtype,
        "shape": shape,
        "settings": {},
        "flops": flops,
        "bytes": 2.0 * shape.get("n", 4096) * shape.get("k", 7168),
        "bar": 1e-5,
        "ms": ms * 1.5,
        "graph_ms": ms,
        "jit_ms": 1200.0,
        "calc_diff": 2e-7,
        "correct": True,
        "tflops": flops / (ms * 1e-3) / 1e12,
        "gbps": 100.0,
        "frac_copy_bw": 0.5,
        "peers": peers,
        "peer_notes": notes or {},
    }


def _peer(ms: float) -> dict[str, Any]:
    return {"ms": ms * 1.2, "graph_ms": ms, "calc_diff": 3e-7, "correct": True, "jit_ms": 5.0}


def _model_row(op: str, ms: float, peer_ms: float) -> dict[str, Any]:
    """A ``models`` row: prefill and decode rows share a shape and differ by their op."""
    row = _row("models", op, "bf16", {"model": "qwen3-30b-a3b", "layers": 4, "batch": 1, "prompt": 512}, ms,
               {"transformers": _peer(peer_ms)})  # fmt: skip
    row.update(bar=1e-3, calc_diff=1e-6, greedy_agreement=0.9375)
    row["peers"]["transformers"].update(calc_diff=0.0, note="experts_implementation=grouped_mm")
    return row


def make_doc(scale: float = 1.0) -> dict[str, Any]:
    """A results document with dense, masked, mqa and models rows; tilegemm's times multiplied by ``scale``."""
    rows = [
        _row("dense", "bf16_gemm_nt", "bf16", {"m": 1, "n": 4096, "k": 7168}, 0.020 * scale,
             {"cublas": _peer(0.025), "deepgemm": _peer(0.022)}),
        _row("dense", "fp8_gemm_nt", "fp8", {"m": 1, "n": 4096, "k": 7168}, 0.013 * scale,
             {"cublas": None, "deepgemm": _peer(0.013)}, {"cublas": "cuBLAS blockwise refuses M=1: RuntimeError"}),
        _row("dense", "fp8_gemm_nt", "fp8", {"m": 4096, "n": 7168, "k": 2048}, 0.110 * scale,
             {"cublas": _peer(0.100), "deepgemm": _peer(0.090)}),
        _row("masked", "m_grouped_bf16_gemm_nt_masked", "bf16",
             {"groups": 32, "expected_m": 4, "n": 4096, "k": 7168, "valid_rows": 130}, 0.9 * scale,
             {"cublas_loop": _peer(1.1), "deepgemm": _peer(0.8)}),
        _row("mqa", "fp8_mqa_logits", "fp8", {"S": 2048, "S_kv": 8192, "H": 64, "D": 128, "pairs": 10}, 0.3 * scale,
             {"deepgemm": None}, {"deepgemm": "disabled (--deepgemm off)"}),
        _model_row("decode", 2.0 * scale, 5.0),
        _model_row("prefill", 40.0 * scale, 44.0),
    ]  # fmt: skip
    meta = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "sm_count": 132,
        "date": "2026-11-24T10:00:00",
        "versions": {"torch": "2.11.0", "cuda": "13.0", "cutile": "1.7.0"},
        "clocks": {"sm_mhz": "1980", "max_sm_mhz": "1980"},
        "ceilings": {"copy_gbps": 3000.0, "bf16_tflops": 750.0, "fp8_tflops": 1300.0, "fp8_blockwise_tflops": 1150.0},
        "deepgemm": "deep_gemm 2.6.1",
        "size": "full",
        "seconds": 480.0,
    }
    return {
        "meta": meta,
        "rows": copy.deepcopy(rows),
        "skipped": [{"family": "mqa", "spec": {}, "reason": "time budget"}],
    }
