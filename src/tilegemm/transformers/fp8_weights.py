"""FP8 copies of expert and linear weights: quantized once to 128x128 blocks, cached, refreshed on change.

The cache lives in a plain dict attribute of the owning module (``_tilegemm_fp8_cache``), so it is not part
of ``state_dict`` and is not saved. An entry is keyed on the weight's storage pointer, autograd version
counter, shape, dtype and device: an in-place update (``with torch.no_grad(): w.copy_(new)``, an optimizer
step) bumps the version, ``param.data = new`` changes the pointer, and either makes the next forward
re-quantize. Writes through ``param.data.copy_(...)`` bypass the version counter and are NOT seen: call
:func:`clear_fp8_cache` after them. Reading the key touches host metadata only (no device sync), so a cached
forward can be captured in a CUDA graph; the first (quantizing) call should run before capture.
"""

from __future__ import annotations

import torch

_ATTR = "_tilegemm_fp8_cache"
_CHUNK_BYTES = 1 << 30


def _key(weight: torch.Tensor) -> tuple:
    return (weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype, weight.device)


def quantize_weight_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight [N, K]`` or ``[E, N, K]`` to FP8 e4m3 with one fp32 scale per 128x128 block.

    Returns ``(fp8 data, same shape, contiguous; fp32 scales [.., ceil(N/128), ceil(K/128)])`` with
    ``scale = amax(block) / 448`` (amax clamped at 1e-4), via ``tilegemm.quant.per_block_cast_to_fp8``.
    """
    from tilegemm.quant import per_block_cast_to_fp8

    w = weight.detach()
    if w.dim() not in (2, 3):
        raise ValueError(f"weight: got {w.dim()}-D, expected [N, K] or [E, N, K]")
    if w.dim() == 2:
        return per_block_cast_to_fp8(w)
    # Experts in chunks, so the fp32 temporaries stay near _CHUNK_BYTES (DeepSeek-V3: 30 GB in one go).
    per_expert = 4 * w.shape[1] * w.shape[2]
    step = max(1, _CHUNK_BYTES // per_expert)
    if step >= w.shape[0]:
        return per_block_cast_to_fp8(w)
    data, scale = None, None
    for e in range(0, w.shape[0], step):
        part_data, part_scale = per_block_cast_to_fp8(w[e : e + step])
        if data is None:
            data = torch.empty(w.shape, dtype=part_data.dtype, device=w.device)
            scale = torch.empty((w.shape[0], *part_scale.shape[1:]), dtype=part_scale.dtype, device=w.device)
        data[e : e + step] = part_data
        scale[e : e + step] = part_scale
    return data, scale


def cached_fp8_weight(module: torch.nn.Module, name: str, transpose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 block-quantized copy of ``module.<name>`` (``[..., N, K]``), rebuilt when the weight changed.

    ``transpose=True`` quantizes ``weight.transpose(-1, -2)`` (for weights stored ``[.., K, N]``), so the
    result is always in ``nt`` form: data ``[.., N, K]``, scales ``[.., ceil(N/128), ceil(K/128)]``.
    """
    weight = getattr(module, name)
    cache = module.__dict__.setdefault(_ATTR, {})
    key = (_key(weight), transpose)
    entry = cache.get(name)
    if entry is not None and entry[0] == key:
        return entry[1]
    source = weight.transpose(-1, -2) if transpose else weight
    value = quantize_weight_blocks(source)
    cache[name] = (key, value)
    return value


def clear_fp8_cache(model: torch.nn.Module) -> int:
    """Drop every cached FP8 weight under ``model`` (this module's cache and the copies the custom ops cache on the
    weight tensors, :func:`tilegemm.transformers.custom_ops.weight_fp8_blocks`); returns how many modules held one."""
    from tilegemm.transformers.custom_ops import clear_weight_fp8_blocks

    count = 0
    for module in model.modules():
        held = module.__dict__.pop(_ATTR, None) is not None
        for param in module.parameters(recurse=False):
            held = clear_weight_fp8_blocks(param) or held
        count += held
    return count
