"""FP8 copies of weights: quantized once to 128x128 blocks, cached on the weight tensor, refreshed on change.

The one FP8 weight cache: the FP8 experts (the fused op, the unfused grouped GEMMs, FP8 training's forward) and
the FP8 ``nn.Linear`` swap read a weight's copy through :func:`weight_fp8_blocks`. It lives in a plain dict
attribute of the weight tensor itself (``_tilegemm_fp8_blocks``), because the custom ops that use it receive
tensors, not modules (``torch.compile`` passes the Parameter objects through); it is not part of ``state_dict``.
An entry is keyed on the weight's storage pointer, autograd version counter, shape, dtype and device: an in-place
update (``with torch.no_grad(): w.copy_(new)``, an optimizer step) bumps the version, ``param.data = new`` changes
the pointer, and either makes the next call re-quantize. Writes through ``param.data.copy_(...)`` bypass the
version counter and are NOT seen: call :func:`clear_fp8_cache` after them. Reading the key touches host metadata
only (no device sync), so a cached forward can be captured in a CUDA graph; the first (quantizing) call should run
before capture.
"""

from __future__ import annotations

import torch

_ATTR = "_tilegemm_fp8_blocks"
_CHUNK_BYTES = 1 << 30


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


def _key(weight: torch.Tensor, transpose: bool) -> tuple:
    return (weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype, weight.device, transpose)


def weight_fp8_blocks(weight: torch.Tensor, transpose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The 128x128-block FP8 copy of ``weight [..., N, K]``, cached on the tensor and rebuilt when it changed.

    ``transpose=True`` quantizes ``weight.transpose(-1, -2)`` (for weights stored ``[..., K, N]``), so the result
    is always in ``nt`` form. Returns ``(fp8 [..., N, K], fp32 scales [..., ceil(N/128), ceil(K/128)])``
    (:func:`quantize_weight_blocks`).
    """
    key = _key(weight, transpose)
    entries = weight.__dict__.setdefault(_ATTR, {})
    entry = entries.get(transpose)
    if entry is not None and entry[0] == key:
        return entry[1]
    value = quantize_weight_blocks(weight.transpose(-1, -2) if transpose else weight)
    entries[transpose] = (key, value)
    return value


def clear_weight_fp8_blocks(weight: torch.Tensor) -> bool:
    """Drop ``weight``'s cached FP8 copies (:func:`weight_fp8_blocks`); True if it held any."""
    return weight.__dict__.pop(_ATTR, None) is not None


def clear_fp8_cache(model: torch.nn.Module) -> int:
    """Drop every cached FP8 weight under ``model`` (:func:`weight_fp8_blocks`); returns how many modules held one
    on their own parameters."""
    count = 0
    for module in model.modules():
        held = False
        for param in module.parameters(recurse=False):
            held = clear_weight_fp8_blocks(param) or held
        count += held
    return count
