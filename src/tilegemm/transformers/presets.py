"""Random-weight model presets (configs only, nothing downloaded), one table read by ``tilegemm-bench``'s
``models`` family, ``modeling/transformers/`` (``infer.py``, ``dist_check.py``) and the tests.

* ``tiny-<family>``: a few-layer model of each supported family with tiny dimensions (runs on a CPU in
  well under a second per forward); ``tiny`` means all of them.
* realistic dimensions, random weights, ``layers`` decoder layers (the harnesses default to 4): ``qwen3-30b-a3b``
  (Qwen3-30B-A3B: H=2048, 128 experts of I=768, top-8), ``deepseek-v3`` (DeepSeek-V3: H=7168, MLA,
  256 experts of I=2048, top-8, group-limited routing, 1 shared expert; the first 3 layers dense as in the
  real model, so 4 layers hold one MoE layer), ``deepseek-v3.2`` (DeepSeek-V3.2: V3's dimensions plus the DSA
  indexer, 64 heads of 128, top-2048), ``glm-5`` (GLM-MoE-DSA: H=6144, 256 experts, indexer 32 heads of 128),
  ``qwen2-moe-a2.7b``, ``mixtral-8x7b``.

Building a config imports transformers; this module's own code does not (its package, ``tilegemm.transformers``,
imports transformers where it is installed, to register the experts functions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A named random-weight model: its ``model_type`` and config keyword arguments."""

    name: str
    model_type: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    tiny: bool = True
    description: str = ""

    def config(self, layers: int | None = None):
        """Build the transformers config (``layers`` overrides ``num_hidden_layers``)."""
        from transformers import AutoConfig

        kwargs = dict(self.kwargs)
        if layers is not None:
            kwargs["num_hidden_layers"] = layers
        return AutoConfig.for_model(self.model_type, **kwargs)


_TINY_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)

_TINY_MLA = dict(
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    num_key_value_heads=4,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    num_hidden_layers=3,
)


def _indexer(heads: int, head_dim: int, topk: int) -> dict[str, int]:
    """The config keyword arguments of a DSA sparse-attention indexer: ``heads`` heads of ``head_dim``, top-``topk``
    keys."""
    return dict(index_n_heads=heads, index_head_dim=head_dim, index_topk=topk)


_TINY_INDEXER = _indexer(4, 32, 6)
"""The sparse-attention indexer of the tiny DSA presets: top-6 keys, so prompts of 12 tokens exercise the top-k."""

_DEEPSEEK_V3 = dict(
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,
    n_shared_experts=1,
    n_routed_experts=256,
    routed_scaling_factor=2.5,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    v_head_dim=128,
    qk_nope_head_dim=128,
    n_group=8,
    topk_group=4,
    num_experts_per_tok=8,
    first_k_dense_replace=3,
    norm_topk_prob=True,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
"""DeepSeek-V3's dimensions (the first 3 layers dense); DeepSeek-V3.2 adds the DSA indexer to them."""

PRESETS: dict[str, Preset] = {
    "tiny-deepseek-v2": Preset(
        "tiny-deepseek-v2",
        "deepseek_v2",
        {
            **_TINY_COMMON,
            **_TINY_MLA,
            "topk_method": "group_limited_greedy",
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
        },
        description="DeepSeek-V2 family, 3 layers (1 dense), 8 experts top-2, group-limited routing",
    ),
    "tiny-deepseek-v3": Preset(
        "tiny-deepseek-v3",
        "deepseek_v3",
        {**_TINY_COMMON, **_TINY_MLA, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5},
        description="DeepSeek-V3 family, 3 layers (1 dense), 8 experts top-2, sigmoid group routing",
    ),
    "tiny-deepseek-v32": Preset(
        "tiny-deepseek-v32",
        "deepseek_v32",
        {**_TINY_COMMON, **_TINY_MLA, **_TINY_INDEXER, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5},
        description="DeepSeek-V3.2 family, 3 layers (1 dense), 8 experts top-2, indexer 4 heads of 32, top-6 keys",
    ),
    "tiny-glm-moe-dsa": Preset(
        "tiny-glm-moe-dsa",
        "glm_moe_dsa",
        {
            **_TINY_COMMON,
            **_TINY_MLA,
            **_TINY_INDEXER,
            "qk_nope_head_dim": 24,  # GLM-5's head ratios (nope 192 : rope 64 : v 256)
            "v_head_dim": 32,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
        },
        description="GLM-MoE-DSA family, 3 layers (1 dense), 8 experts top-2, indexer 4 heads of 32, top-6 keys",
    ),
    "tiny-qwen2-moe": Preset(
        "tiny-qwen2-moe",
        "qwen2_moe",
        {
            **_TINY_COMMON,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
        },
        description="Qwen2-MoE family, 2 layers, 8 experts top-2 + gated shared expert",
    ),
    "tiny-qwen3-moe": Preset(
        "tiny-qwen3-moe",
        "qwen3_moe",
        {
            **_TINY_COMMON,
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
        },
        description="Qwen3-MoE family, 2 layers, 8 experts top-2",
    ),
    "tiny-mixtral": Preset(
        "tiny-mixtral",
        "mixtral",
        {**_TINY_COMMON, "num_local_experts": 4, "num_experts_per_tok": 2},
        description="Mixtral family, 2 layers, 4 experts of I=128 top-2",
    ),
    "qwen3-30b-a3b": Preset(
        "qwen3-30b-a3b",
        "qwen3_moe",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        tiny=False,
        description="Qwen3-30B-A3B dimensions, random weights",
    ),
    "deepseek-v3": Preset(
        "deepseek-v3",
        "deepseek_v3",
        _DEEPSEEK_V3,
        tiny=False,
        description="DeepSeek-V3 dimensions (first 3 layers dense), random weights",
    ),
    "deepseek-v3.2": Preset(
        "deepseek-v3.2",
        "deepseek_v32",
        {**_DEEPSEEK_V3, **_indexer(64, 128, 2048), "max_position_embeddings": 163840},
        tiny=False,
        description="DeepSeek-V3.2 dimensions (DSA indexer: 64 heads of 128, top-2048; first 3 layers dense)",
    ),
    "glm-5": Preset(
        "glm-5",
        "glm_moe_dsa",
        {
            **_DEEPSEEK_V3,
            **_indexer(32, 128, 2048),
            "vocab_size": 154880,
            "hidden_size": 6144,
            "intermediate_size": 12288,
            "num_hidden_layers": 78,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "q_lora_rank": 2048,
            "v_head_dim": 256,
            "qk_nope_head_dim": 192,
            "n_group": 1,
            "topk_group": 1,
            "max_position_embeddings": 202752,
        },
        tiny=False,
        description="GLM-MoE-DSA (GLM-5) dimensions (DSA indexer: 32 heads of 128, top-2048; first 3 layers dense)",
    ),
    "qwen2-moe-a2.7b": Preset(
        "qwen2-moe-a2.7b",
        "qwen2_moe",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            num_experts=60,
            num_experts_per_tok=4,
            tie_word_embeddings=False,
        ),
        tiny=False,
        description="Qwen1.5-MoE-A2.7B dimensions, random weights",
    ),
    "mixtral-8x7b": Preset(
        "mixtral-8x7b",
        "mixtral",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            tie_word_embeddings=False,
        ),
        tiny=False,
        description="Mixtral-8x7B dimensions, random weights",
    ),
}

TINY_PRESETS: tuple[str, ...] = tuple(name for name, p in PRESETS.items() if p.tiny)
ALIASES: dict[str, tuple[str, ...]] = {"tiny": TINY_PRESETS}
TINY_BY_MODEL_TYPE: dict[str, str] = {PRESETS[name].model_type: name for name in TINY_PRESETS}
"""``model_type`` -> its tiny preset (one per supported family)."""


def resolve(name: str) -> list[Preset]:
    """Presets named by ``name`` (a preset or the alias ``tiny``); ``KeyError`` if unknown."""
    if name in ALIASES:
        return [PRESETS[n] for n in ALIASES[name]]
    return [PRESETS[name]]
