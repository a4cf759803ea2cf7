"""transformers' ``deepgemm`` experts implementation as a peer, its kernels taken from the DeepGEMM build at hand.

transformers (``transformers/integrations/deepgemm.py``) loads DeepGEMM through its hub-kernels loader
(``lazy_load_kernel("deep-gemm")``: the ``kernels`` package and a download), once, into the module global
``_DEEPGEMM`` (a ``DeepGEMM`` bundle of entry points), and returns early when that global is set. The GPU
machine has no network but a local DeepGEMM build (:func:`tilegemm.bench.peers.load_deepgemm`), so
:func:`install` fills ``_DEEPGEMM`` from that module: the same fields the hub loader reads, from the same
attribute names. transformers' own forwards (``deepgemm_bf16_experts_forward``,
``deepgemm_fp8_fp4_experts_forward``) then run unchanged on DeepGEMM's kernels.

Every function returns the reason as a string when the peer cannot run, so that a row records why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Field of transformers' ``DeepGEMM`` bundle -> the DeepGEMM attribute its hub loader reads (dotted: a submodule).
FIELDS = {
    "fp8_fp4_matmul": "fp8_fp4_gemm_nt",
    "grouped_fp8_fp4_matmul_nt": "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "grouped_fp8_fp4_matmul_nn": "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "grouped_bf16_matmul_nt": "m_grouped_bf16_gemm_nt_contiguous",
    "grouped_bf16_matmul_nn": "m_grouped_bf16_gemm_nn_contiguous",
    "per_token_cast_to_fp8": "utils.per_token_cast_to_fp8",
    "transform_sf_into_required_layout": "transform_sf_into_required_layout",
    "transform_weights_for_mega_moe": "transform_weights_for_mega_moe",
    "get_symm_buffer_for_mega_moe": "get_symm_buffer_for_mega_moe",
    "fp8_fp4_mega_moe": "fp8_fp4_mega_moe",
}


def _missing(name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"this DeepGEMM build has no {name}")

    return unavailable


def _attr(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def integration() -> Any | str:
    """transformers' ``transformers.integrations.deepgemm`` module, or why it cannot be imported."""
    try:
        from transformers.integrations import deepgemm
    except Exception as exc:
        return f"this transformers has no deepgemm integration ({type(exc).__name__}: {exc})"
    if not hasattr(deepgemm, "DeepGEMM") or not hasattr(deepgemm, "_DEEPGEMM"):
        return "this transformers' deepgemm integration has no DeepGEMM bundle to fill"
    return deepgemm


def install(dg: Any, dg_reason: str = "DeepGEMM not loaded") -> Any | str:
    """Point transformers' deepgemm integration at the DeepGEMM module ``dg``; returns the integration module.

    Returns a string instead (nothing changed) when ``dg`` is ``None`` (``dg_reason`` says why), when transformers
    lacks the integration, or when ``dg`` lacks an entry point the BF16/FP8 experts forwards call (the Mega MoE ones,
    SM100 only, become functions that raise).
    """
    if dg is None:
        return f"DeepGEMM not loaded: {dg_reason}"
    hf = integration()
    if isinstance(hf, str):
        return hf
    names = [f.name for f in dataclasses.fields(hf.DeepGEMM)]
    unknown = [n for n in names if n not in FIELDS and n != "m_alignment"]
    if unknown:
        return f"transformers' DeepGEMM bundle has fields this peer does not know: {unknown}"
    values: dict[str, Any] = {}
    for name in names:
        if name == "m_alignment":
            get = getattr(dg, "get_mk_alignment_for_contiguous_layout", None)
            if get is None:
                return "DeepGEMM lacks get_mk_alignment_for_contiguous_layout"
            values[name] = int(get())
            continue
        fn = _attr(dg, FIELDS[name])
        if fn is None and "mega_moe" in FIELDS[name]:
            fn = _missing(FIELDS[name])
        if fn is None:
            return f"DeepGEMM lacks {FIELDS[name]}"
        values[name] = fn
    hf._DEEPGEMM = hf.DeepGEMM(**values)
    return hf


def fp8_experts_module(model_type_config: Any, w13: tuple[Any, Any], w2: tuple[Any, Any]) -> Any:
    """transformers' ``FP8Experts`` (128x128 blocks, dynamic activation scales) of ``model_type_config`` holding the
    FP8 weights ``w13 = (fp8 [E, 2I, H], fp32 [E, 2I/128, H/128])`` and ``w2 = (fp8 [E, H, I], fp32 [E, H/128,
    I/128])`` (built on ``meta``, so nothing is allocated twice)."""
    import torch
    from transformers.integrations.finegrained_fp8 import FP8Experts

    with torch.device("meta"):
        module = FP8Experts(model_type_config, block_size=(128, 128))
    # what transformers' ``use_experts_implementation`` sets on the modules it makes (without re-wrapping the class)
    module.has_post_expert_norm, module.is_transposed, module.is_concatenated = False, False, True
    module._is_expert_parallel = False
    module.gate_up_proj = torch.nn.Parameter(w13[0], requires_grad=False)
    module.gate_up_proj_scale_inv = torch.nn.Parameter(w13[1], requires_grad=False)
    module.down_proj = torch.nn.Parameter(w2[0], requires_grad=False)
    module.down_proj_scale_inv = torch.nn.Parameter(w2[1], requires_grad=False)
    return module.eval()
