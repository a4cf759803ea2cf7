"""tilegemm experts under transformers' own tensor and expert parallelism (``torch.distributed``).

transformers shards a model through ``from_pretrained(..., distributed_config=DistributedConfig(...))``
with the plans of the model's config (``base_model_tp_plan``, ``base_model_ep_plan``); the tilegemm experts
function is selected afterwards as on one device (:func:`~tilegemm.transformers.apply_tilegemm_to_model`).
The two layouts of the supported families:

* ``"tp"``, ``DistributedConfig(tp_size=N)``: attention and dense layers by rows/columns; every rank holds
  every expert, cut along the intermediate dimension (``gate_up_proj [E, 2I/N, H]``, ``down_proj [E, H, I/N]``,
  style ``moe_tp_experts``); the experts function runs on the local slices and the partial outputs are summed
  by an all-reduce.
* ``"ep"``, ``DistributedConfig(tp_size=N, ep_size=N)``: attention and dense layers as above, experts whole
  and split by expert (style ``grouped_gemm``: ``gate_up_proj [E/N, 2I, H]``, ``module.num_experts = E/N``).
  At inference the ranks share the batch (``AllReduceEP``): a token routed to another rank's expert arrives
  with the sentinel local id ``E/N`` and weight 0, and an all-reduce sums the ranks' outputs. In training, or
  with ``ep_implementation="all_to_all"``, the tokens travel to their expert's rank (local ids, top-1).

The experts function needs nothing more: it routes against ``module.num_experts`` (the local count), so
sentinel ids (``>= num_experts`` or ``-1``) sort past the last group, which the grouped GEMM never computes,
and their weights are zeroed; routing stays on the device (no host sync). transformers swaps the sharded
parameters for their local tensors around the experts forward.

:func:`distribute_model` applies the same plans to a model already built in every process with identical
weights (random-weight presets, tests): each rank keeps its own slice, without any communication.

Requirements (checked by feature, not version): ``transformers.distributed.DistributedConfig`` with
``tp_size``/``ep_size`` and ``PreTrainedModel.maybe_distribute_model`` (transformers >= 5.21; tested with 5.23),
and the family's ``base_model_tp_plan`` / ``base_model_ep_plan``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from tilegemm.transformers.compat import UnsupportedTransformersError, transformers_version

PARALLEL_MODES: tuple[str, ...] = ("tp", "ep")
"""``"tp"``: tensor parallel (experts cut along the intermediate dimension); ``"ep"``: tensor parallel attention
and dense layers, experts split by expert."""

MIN_TRANSFORMERS_PARALLEL = (5, 21)
"""The first transformers release with ``DistributedConfig(tp_size, ep_size)`` and the expert-parallel styles
``grouped_gemm`` / ``ep_dispatch_experts`` in ``transformers.distributed``, per the deprecation notes of
5.23's source."""

_PLAN_ATTR = {"tp": "base_model_tp_plan", "ep": "base_model_ep_plan"}


def _distributed_config_class() -> type | None:
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return None
    fields = (
        {f.name for f in dataclasses.fields(DistributedConfig)}
        if dataclasses.is_dataclass(DistributedConfig)
        else set()
    )
    return DistributedConfig if {"tp_size", "ep_size"} <= fields else None


def parallel_api_problem() -> str | None:
    """Why the installed transformers cannot shard models for tilegemm (``None``: it can)."""
    try:
        transformers_version()
    except UnsupportedTransformersError as exc:
        return str(exc)
    import transformers

    if _distributed_config_class() is None:
        return (
            f"transformers {transformers.__version__} has no transformers.distributed.DistributedConfig with "
            f"tp_size/ep_size (needs >= {MIN_TRANSFORMERS_PARALLEL[0]}.{MIN_TRANSFORMERS_PARALLEL[1]})"
        )
    from transformers import PreTrainedModel

    if not all(hasattr(PreTrainedModel, name) for name in ("prepare_distribute_model", "maybe_distribute_model")):
        return f"transformers {transformers.__version__} has no PreTrainedModel.maybe_distribute_model"
    if not torch.distributed.is_available():
        return "this torch build has no torch.distributed"
    return None


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def family_plan(config: Any, mode: str) -> dict[str, str]:
    """The family's transformers plan for ``mode``: ``base_model_tp_plan`` (``"tp"``) or ``base_model_ep_plan``
    (``"ep"``, which also runs attention on the tensor-parallel plan, so it is empty without one)."""
    if mode not in PARALLEL_MODES:
        raise ValueError(f"mode must be one of {PARALLEL_MODES}, got {mode!r}")
    text = _text_config(config)
    tp_plan = getattr(text, _PLAN_ATTR["tp"], None) or {}
    if mode == "tp":
        return dict(tp_plan)
    ep_plan = getattr(text, _PLAN_ATTR["ep"], None) or {}
    return dict(ep_plan) if tp_plan else {}


#: The config attributes that name the routed expert count, one per family's spelling (DeepSeek, Qwen, Mixtral).
EXPERT_COUNT_NAMES = ("n_routed_experts", "num_experts", "num_local_experts")


def num_routed_experts(config: Any) -> int | None:
    """The routed expert count of a supported family's config (``None`` if it names none)."""
    text = _text_config(config)
    for name in EXPERT_COUNT_NAMES:
        value = getattr(text, name, None)
        if isinstance(value, int):
            return value
    return None


def _unsplit_heads(config: Any, world_size: int) -> str | None:
    """Why the tensor-parallel plan cannot cut the attention heads over ``world_size`` ranks, or ``None``: a plan that
    shards ``k_proj`` by columns gives every rank ``heads / world_size`` query and key/value heads."""
    text = _text_config(config)
    if not any(k.endswith("k_proj") and v == "colwise" for k, v in family_plan(config, "tp").items()):
        return None
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, name, None)
        if isinstance(heads, int) and heads % world_size:
            return f"{heads} {name} do not split over {world_size} tensor-parallel ranks"
    return None


def parallel_unavailable_reason(config: Any, mode: str, world_size: int = 2) -> str | None:
    """Why ``mode`` cannot shard a model of ``config`` over ``world_size`` ranks here (``None``: it can)."""
    problem = parallel_api_problem()
    if problem is not None:
        return problem
    if not family_plan(config, mode):
        needed = " and ".join(_PLAN_ATTR[m] for m in (("tp", "ep") if mode == "ep" else ("tp",)))
        return f"the installed transformers has no {needed} for model_type {config.model_type!r}"
    heads = _unsplit_heads(config, world_size)
    if heads is not None:
        return heads
    if mode == "ep":
        experts = num_routed_experts(config)
        if experts is None or experts % world_size:
            return f"{experts} experts do not split evenly over {world_size} ranks"
        styles = set(family_plan(config, "ep").values())
        if not {"grouped_gemm", "ep_dispatch_experts"} <= styles:
            return f"the ep plan of {config.model_type!r} does not split experts by expert ({sorted(styles)})"
    return None


def make_distributed_config(mode: str, world_size: int, ep_implementation: str = "auto") -> Any:
    """transformers' ``DistributedConfig`` of ``mode`` over ``world_size`` ranks (see the module docstring).

    ``ep_implementation`` (``"ep"`` only): how tokens reach the experts (``"auto"``: the shared-batch
    all-reduce at inference, the all-to-all exchange in training; ``"all_to_all"``; ``"all_reduce"``).
    """
    problem = parallel_api_problem()
    if problem is not None:
        raise UnsupportedTransformersError(problem)
    if mode not in PARALLEL_MODES:
        raise ValueError(f"mode must be one of {PARALLEL_MODES}, got {mode!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    cls = _distributed_config_class()
    if mode == "tp":
        return cls(tp_size=world_size)
    kwargs = {"tp_size": world_size, "ep_size": world_size}
    if "ep_implementation" in {f.name for f in dataclasses.fields(cls)}:
        kwargs["ep_implementation"] = ep_implementation
    elif ep_implementation != "auto":
        raise UnsupportedTransformersError("the installed transformers' DistributedConfig has no ep_implementation")
    return cls(**kwargs)


def distribute_model(
    model: torch.nn.Module, mode: str = "ep", world_size: int | None = None, ep_implementation: str = "auto"
) -> torch.nn.Module:
    """Shard a built model with transformers' plans for ``mode``; every rank keeps its slice of its own copy.

    For models built with the same weights in every process (a seeded ``from_config``): parameters become
    DTensors over transformers' device mesh, and each rank keeps the local slice of the weights it already
    holds (no communication). A checkpoint is sharded by ``from_pretrained(path,
    distributed_config=make_distributed_config(mode, world_size))`` instead. ``torch.distributed`` is initialised
    by transformers from the ``torchrun`` environment unless it already is.

    Args:
        model: a transformers ``PreTrainedModel`` of a family with the plan (:func:`parallel_unavailable_reason`),
            on this rank's device.
        mode: ``"tp"`` or ``"ep"``.
        world_size: ranks (default: ``torch.distributed``'s world size, else ``$WORLD_SIZE``).
        ep_implementation: see :func:`make_distributed_config`.

    Returns:
        ``model``, sharded in place.
    """
    if world_size is None:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        world_size = torch.distributed.get_world_size() if initialized else int(os.environ.get("WORLD_SIZE", "1"))
    problem = parallel_unavailable_reason(model.config, mode, world_size)
    if problem is not None:
        raise ValueError(f"tilegemm: cannot shard {type(model).__name__} ({mode}): {problem}")
    config = make_distributed_config(mode, world_size, ep_implementation)
    config, _, mesh = type(model).prepare_distribute_model(config)
    return type(model).maybe_distribute_model(model, config, mesh)


def local_experts(module: torch.nn.Module) -> dict[str, Any]:
    """How an experts module is sharded on this rank: its expert count, whether transformers split it by expert,
    and the local and global shapes of its fused weights."""
    from torch.distributed.tensor import DTensor

    up_name = "gate_up_proj" if getattr(module, "gate_up_proj", None) is not None else "up_proj"
    out: dict[str, Any] = {
        "num_experts": int(module.num_experts),
        "expert_parallel": bool(getattr(module, "_is_expert_parallel", False)),
    }
    for name in (up_name, "down_proj"):
        weight = getattr(module, name)
        out[name] = tuple((weight.to_local() if isinstance(weight, DTensor) else weight).shape)
        out[f"global_{name}"] = tuple(weight.shape)
    return out
