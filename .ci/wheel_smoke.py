"""The README's install path on the CPU: run from outside the checkout by the venv that installed the built wheel.

Checks that ``tilegemm`` comes from the installed wheel (not the checkout), ships ``py.typed``, runs the README's
DeepGEMM snippet (on the CPU, small sizes) and its transformers snippet: a tiny random Qwen3-MoE made with
``experts_implementation="tilegemm"`` after ``import tilegemm.transformers``, its logits against the same weights
under transformers' eager experts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import tilegemm
import tilegemm as deep_gemm
import tilegemm.transformers  # noqa: F401  (registers the "tilegemm" experts implementations)
from tilegemm.testing import calc_diff, dequant_per_block, dequant_per_token


def main() -> int:
    """Exit 0 when every check passes (each prints one line)."""
    where = Path(tilegemm.__file__).resolve()
    assert "site-packages" in where.parts, f"tilegemm imported from {where}, not from the installed wheel"
    assert (where.parent / "py.typed").is_file(), "the wheel lacks py.typed"
    print(f"tilegemm {tilegemm.__version__} from {where.parent}; torch {torch.__version__}")

    a = torch.randn(64, 256, dtype=torch.bfloat16)
    b = torch.randn(384, 256, dtype=torch.bfloat16)
    d = torch.empty(64, 384, dtype=torch.bfloat16)
    qa, qb = deep_gemm.per_token_cast_to_fp8(a), deep_gemm.per_block_cast_to_fp8(b)
    deep_gemm.fp8_gemm_nt(qa, qb, d)
    diff = calc_diff(d, dequant_per_token(*qa) @ dequant_per_block(*qb).T)  # float64 of the FP8 operands
    assert diff < 1e-5, diff
    print(f"DeepGEMM snippet: fp8_gemm_nt calc_diff {diff:.1e}")

    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    def config() -> Qwen3MoeConfig:
        return Qwen3MoeConfig(
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=128,
        )

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), experts_implementation="tilegemm")
    stock = AutoModelForCausalLM.from_config(config(), experts_implementation="eager")
    stock.load_state_dict(model.state_dict())
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        out, ref = model(ids).logits, stock(ids).logits
    assert model.config._experts_implementation == "tilegemm"
    diff = calc_diff(out, ref)
    assert diff < 1e-6, diff
    print(f"transformers snippet: experts_implementation='tilegemm' logits vs eager experts calc_diff {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
