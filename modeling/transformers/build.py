"""Random-weight preset models built identically on one device or sharded over any number of ranks.

A preset model's routed experts hold nearly all of its weights (DeepSeek-V3: 22.5 GB of bf16 per MoE layer), so
building the whole model on every rank and then keeping each rank's slice (what a seeded ``from_config`` followed
by :func:`tilegemm.transformers.parallel.distribute_model` does) needs the whole model on one device. Here:

1. every module but the experts is built on the device by a seeded ``from_config`` (the same values on every
   rank and in every layout); the experts' weights are created on the ``meta`` device (no memory);
2. with a layout, transformers' plan shards the model (:func:`~tilegemm.transformers.parallel.distribute_model`),
   the meta expert weights becoming DTensors with meta local shards;
3. each expert weight is materialized: expert ``e`` of parameter ``p`` is ``N(0, initializer_range)`` drawn from
   a generator seeded by ``(seed, p, e)`` alone, so a rank computes only the experts its shard touches (expert
   parallel) or slices each expert with the DTensor placement transformers chose (tensor parallel), and a sharded
   model holds exactly the slices of the one-device model.

Peak memory per rank: the non-expert modules whole, the local expert shards and one chunk of experts.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
from collections.abc import Iterator

import torch

from tilegemm.transformers import presets
from tilegemm.transformers.monkey_patch import experts_modules

#: Experts generated at once while slicing a tensor-parallel expert weight (bounds the temporary).
EXPERT_CHUNK_BYTES = 1 << 30


def _experts_classes(model_type: str) -> list[type]:
    """The family's experts module classes (``<Family>Experts`` of its modeling module)."""
    from tilegemm.transformers.families import FAMILY_BY_MODEL_TYPE

    family = FAMILY_BY_MODEL_TYPE[model_type]
    module = importlib.import_module(f"transformers.models.{family.model_type}.{family.module}")
    return [v for k, v in vars(module).items() if isinstance(v, type) and k.endswith("Experts")]


@contextlib.contextmanager
def experts_on_meta(model_type: str) -> Iterator[None]:
    """While open, the family's experts modules create their parameters on the ``meta`` device."""
    originals = {}
    for cls in _experts_classes(model_type):
        original = cls.__init__
        originals[cls] = original

        def init(self, *args, __original=original, **kwargs):
            with torch.device("meta"):
                __original(self, *args, **kwargs)

        cls.__init__ = init
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__init__ = original


def _seed(seed: int, name: str, expert: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{expert}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


def expert_weight(
    seed: int, name: str, expert: int, shape: tuple[int, ...], std: float, dtype: torch.dtype, device
) -> torch.Tensor:
    """Expert ``expert`` of the weight named ``name``: ``N(0, std)`` of ``shape`` from a generator seeded by
    ``(seed, name, expert)`` (drawn in fp32, cast to ``dtype``)."""
    gen = torch.Generator(device=device).manual_seed(_seed(seed, name, expert))
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)


def _draw(seed: int, name: str, experts: range, shape: tuple[int, ...], std: float, dtype, device) -> torch.Tensor:
    """Experts ``experts`` of weight ``name`` stacked into a new ``shape`` tensor (filled in place, no second copy)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    for i, e in enumerate(experts):
        out[i] = expert_weight(seed, name, e, shape[1:], std, dtype, device)
    return out


def _materialize(param: torch.Tensor, name: str, seed: int, std: float, device) -> torch.Tensor:
    """The value of the meta expert weight ``param`` ``[E, N, K]`` (a plain tensor or a DTensor) on ``device``."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        return _draw(seed, name, range(param.shape[0]), tuple(param.shape), std, param.dtype, device)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh, placements = param.device_mesh, param.placements
    global_shape = tuple(param.shape)
    local_shape, offset = compute_local_shape_and_global_offset(global_shape, mesh, placements)
    per_expert = global_shape[1:]
    sharded = {p.dim % len(global_shape) for p in placements if hasattr(p, "dim")}  # Shard, _StridedShard
    if sharded <= {0}:  # split by expert only (or not at all)
        experts = range(offset[0], offset[0] + local_shape[0])
        local = _draw(seed, name, experts, tuple(local_shape), std, param.dtype, device)
    else:  # cut inside each expert: draw a chunk of whole experts, keep this rank's slice of each
        if 0 in sharded:
            raise NotImplementedError(f"{name}: placements {placements} cut both the experts and inside them")
        local = torch.empty(local_shape, dtype=param.dtype, device=device)
        step = max(1, EXPERT_CHUNK_BYTES // (4 * max(1, per_expert[0] * per_expert[1])))
        for start in range(0, global_shape[0], step):
            stop = min(global_shape[0], start + step)
            chunk = _draw(seed, name, range(start, stop), (stop - start, *per_expert), std, param.dtype, device)
            local[start:stop] = distribute_tensor(chunk, mesh, placements, src_data_rank=None).to_local()
            del chunk
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=param.shape, stride=param.stride())


def materialize_experts(model: torch.nn.Module, seed: int, device) -> int:
    """Give every meta expert weight of ``model`` its deterministic value (see the module docstring); returns how
    many weights were materialized."""
    std = float(getattr(model.config.get_text_config(), "initializer_range", 0.02))
    names = {id(m): n for n, m in model.named_modules()}
    count = 0
    for module in experts_modules(model):
        for pname, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            value = _materialize(param, f"{names[id(module)]}.{pname}", seed, std, device)
            module._parameters[pname] = torch.nn.Parameter(value, requires_grad=False)
            count += 1
    return count


def build_model(
    preset: str | presets.Preset,
    layers: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    mode: str | None = None,
    world_size: int = 1,
    ep_implementation: str = "auto",
    **config_overrides,
) -> torch.nn.Module:
    """The preset's causal LM in eval mode, whole (``mode=None`` or ``world_size == 1``) or this rank's shard.

    Args:
        preset: a preset name of :data:`tilegemm.transformers.presets.PRESETS` or a ``Preset``.
        layers: decoder layers (``None``: the preset's own count).
        dtype: parameter dtype (the routers keep transformers' own choice).
        device: this rank's device.
        seed: the seed of every weight (the same on every rank).
        mode: ``"tp"`` or ``"ep"`` to shard over ``world_size`` ranks with transformers' plans.
        world_size: ranks of the layout.
        ep_implementation: see :func:`tilegemm.transformers.parallel.make_distributed_config`.
        config_overrides: config attributes set after the preset's (e.g. ``num_key_value_heads``).
    """
    from transformers import AutoModelForCausalLM

    from tilegemm.transformers.parallel import distribute_model

    if isinstance(preset, str):
        preset = presets.PRESETS[preset]
    config = preset.config(layers)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    device = torch.device(device)
    torch.manual_seed(seed)
    with experts_on_meta(config.model_type), torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    if mode is not None and world_size > 1:
        model = distribute_model(model, mode, world_size, ep_implementation)
    materialize_experts(model, seed, device)
    return model


def free(device: torch.device | str) -> None:
    """Collect a dropped model (a sharded model's hooks hold reference cycles) and return its device memory."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
