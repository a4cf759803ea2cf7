"""tilegemm inside HuggingFace transformers (>= 5.17) MoE models: DeepSeek-V2/V3, Qwen2-MoE, Qwen3-MoE, Mixtral.

The integration: the experts functions, the patchers (one per row of :data:`FAMILIES`), the class swaps (RMSNorm,
sparse-attention indexer, ``nn.Linear``; :mod:`.swap`) and :func:`clear_fp8_cache` of the FP8 weight cache, plus
the random-weight model presets (:mod:`.presets`, read by ``tilegemm-bench``'s ``models`` family and the tests).
The inference comparison harness (timing, reports) is ``modeling/transformers/`` in the repository.

Quick start::

    from tilegemm.transformers import apply_tilegemm_to_model
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    apply_tilegemm_to_model(model)                      # experts -> fused experts op, RMSNorms -> one kernel
    apply_tilegemm_to_model(model, linear=True, fp8=True)  # + dense layers, FP8 everywhere

or select the experts function by name: importing this package registers ``"tilegemm"`` and ``"tilegemm_fp8"`` in
transformers' ``ExpertsInterface`` (:func:`register_experts_functions`), so ``model.set_experts_implementation(
"tilegemm")`` and ``from_pretrained(path, experts_implementation="tilegemm")`` work after ``import
tilegemm.transformers``. ``apply_tilegemm_to_model`` takes any model with transformers' fused experts (OLMoE,
gpt-oss, ...); the RMSNorm swap applies where :data:`FAMILIES` knows the family's norm class.

Sharded over ``torchrun`` ranks by transformers' own tensor / expert parallel plans (:mod:`.parallel`)::

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                 distributed_config=make_distributed_config("ep", world_size))
    apply_tilegemm_to_model(model)                      # each rank runs its local experts
"""

from tilegemm.fp8_weights import clear_fp8_cache
from tilegemm.transformers import experts
from tilegemm.transformers.compat import UnsupportedTransformersError, after_import
from tilegemm.transformers.experts import (
    EXPERTS_NAME,
    FP8_EXPERTS_NAME,
    register_experts_functions,
    tilegemm_experts_forward,
    tilegemm_fp8_experts_forward,
)
from tilegemm.transformers.families import FAMILIES, SUPPORTED_MODEL_TYPES, ModelFamily
from tilegemm.transformers.indexer import restore_indexers, swap_indexers, swapped_indexers
from tilegemm.transformers.linear import TileGemmLinear, restore_linear_layers, swap_linear_layers
from tilegemm.transformers.monkey_patch import (
    MODEL_TYPE_TO_PATCHER,
    apply_tilegemm_kernel_to_deepseek_v2,
    apply_tilegemm_kernel_to_deepseek_v3,
    apply_tilegemm_kernel_to_deepseek_v32,
    apply_tilegemm_kernel_to_glm_moe_dsa,
    apply_tilegemm_kernel_to_mixtral,
    apply_tilegemm_kernel_to_model_type,
    apply_tilegemm_kernel_to_qwen2_moe,
    apply_tilegemm_kernel_to_qwen3_moe,
    apply_tilegemm_to_model,
    revert_tilegemm_kernel_patches,
    revert_tilegemm_model,
)
from tilegemm.transformers.norm import restore_rms_norms, swap_rms_norms, swapped_rms_norms
from tilegemm.transformers.parallel import (
    PARALLEL_MODES,
    distribute_model,
    make_distributed_config,
    parallel_unavailable_reason,
)

__all__ = [
    "EXPERTS_NAME",
    "FAMILIES",
    "FP8_EXPERTS_NAME",
    "MODEL_TYPE_TO_PATCHER",
    "PARALLEL_MODES",
    "SUPPORTED_MODEL_TYPES",
    "ModelFamily",
    "TileGemmLinear",
    "UnsupportedTransformersError",
    "apply_tilegemm_kernel_to_deepseek_v2",
    "apply_tilegemm_kernel_to_deepseek_v3",
    "apply_tilegemm_kernel_to_deepseek_v32",
    "apply_tilegemm_kernel_to_glm_moe_dsa",
    "apply_tilegemm_kernel_to_mixtral",
    "apply_tilegemm_kernel_to_model_type",
    "apply_tilegemm_kernel_to_qwen2_moe",
    "apply_tilegemm_kernel_to_qwen3_moe",
    "apply_tilegemm_to_model",
    "clear_fp8_cache",
    "distribute_model",
    "make_distributed_config",
    "parallel_unavailable_reason",
    "register_experts_functions",
    "restore_indexers",
    "restore_linear_layers",
    "restore_rms_norms",
    "revert_tilegemm_kernel_patches",
    "revert_tilegemm_model",
    "swap_indexers",
    "swap_linear_layers",
    "swap_rms_norms",
    "swapped_indexers",
    "swapped_rms_norms",
    "tilegemm_experts_forward",
    "tilegemm_fp8_experts_forward",
]


# The experts functions are registered in transformers' ExpertsInterface when transformers.integrations.moe is
# imported (now if it is; else by transformers itself, before any model can ask for them), not by importing it here:
# it imports transformers' DeepGEMM and hub-kernels integrations (about a second). An old or missing transformers
# keeps the import working; the patchers raise UnsupportedTransformersError then.
after_import("transformers.integrations.moe", experts.bind_transformers_moe)
