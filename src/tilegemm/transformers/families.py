"""The HuggingFace MoE model families tilegemm patches: one table, read by the patchers and the tests.

Each row names a transformers ``model_type``, the ``PreTrainedModel`` base class whose ``post_init`` the
before-creation patcher wraps (``transformers.models.<model_type>.<module>.<pretrained_class>``) and the family's
RMSNorm module class, whose instances the norm swap takes over. Adding a family is one row here;
``tests/hf/test_families.py`` then asks for its tiny preset and tests.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFamily:
    """A supported transformers MoE family.

    Attributes:
        model_type: ``config.model_type`` (e.g. ``"qwen3_moe"``).
        module: the modeling module inside ``transformers.models.<model_type>``.
        pretrained_class: that module's ``PreTrainedModel`` base class of the family.
        rms_norm_class: that module's RMSNorm class (``weight``, ``variance_epsilon`` and the forward of
            transformers' ``LlamaRMSNorm``; ``tests/hf/test_norm.py`` holds every row to that formula).
    """

    model_type: str
    module: str
    pretrained_class: str
    rms_norm_class: str

    @property
    def patcher_name(self) -> str:
        """Name of the family's before-creation patcher in :mod:`tilegemm.transformers`."""
        return f"apply_tilegemm_kernel_to_{self.model_type}"

    def load_class(self) -> type:
        """Import and return the family's ``PreTrainedModel`` base class."""
        return getattr(self._module(), self.pretrained_class)

    def load_rms_norm_class(self) -> type:
        """Import and return the family's RMSNorm module class."""
        return getattr(self._module(), self.rms_norm_class)

    def _module(self):
        return importlib.import_module(f"transformers.models.{self.model_type}.{self.module}")


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("deepseek_v2", "modeling_deepseek_v2", "DeepseekV2PreTrainedModel", "DeepseekV2RMSNorm"),
    ModelFamily("deepseek_v3", "modeling_deepseek_v3", "DeepseekV3PreTrainedModel", "DeepseekV3RMSNorm"),
    ModelFamily("deepseek_v32", "modeling_deepseek_v32", "DeepseekV32PreTrainedModel", "DeepseekV32RMSNorm"),
    ModelFamily("glm_moe_dsa", "modeling_glm_moe_dsa", "GlmMoeDsaPreTrainedModel", "GlmMoeDsaRMSNorm"),
    ModelFamily("qwen2_moe", "modeling_qwen2_moe", "Qwen2MoePreTrainedModel", "Qwen2MoeRMSNorm"),
    ModelFamily("qwen3_moe", "modeling_qwen3_moe", "Qwen3MoePreTrainedModel", "Qwen3MoeRMSNorm"),
    ModelFamily("mixtral", "modeling_mixtral", "MixtralPreTrainedModel", "MixtralRMSNorm"),
)
"""Every supported family, in documentation order."""

FAMILY_BY_MODEL_TYPE: dict[str, ModelFamily] = {f.model_type: f for f in FAMILIES}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILY_BY_MODEL_TYPE)
