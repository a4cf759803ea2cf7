"""Process-wide settings with DeepGEMM's names: SM count, tensor-core utilisation, contiguous-layout alignment.

Some of DeepGEMM's settings only steer its JIT or its launches (PDL, compiled dims, block-size
multiples); they are accepted and stored here so that code written for DeepGEMM runs unchanged,
and have no effect on tilegemm's kernels.
"""

from __future__ import annotations

import functools

#: DeepGEMM's alignment of the m-grouped contiguous layout (and of K in the k-grouped one).
DEFAULT_MK_ALIGNMENT = 128

_num_sms: int = 0
_tc_util: int = 100
_mk_alignment: int = DEFAULT_MK_ALIGNMENT
_pdl: bool = False
_ignore_compile_dims: bool = False
_block_size_multiple_of: tuple[int, int] = (1, 1)


def _device_sm_count() -> int:
    import torch

    if not torch.cuda.is_available():
        return 0
    return _sm_count_of(torch.cuda.current_device())


@functools.cache
def _sm_count_of(index: int) -> int:
    """Device ``index``'s SM count, read once (every full-path call of a persistent kernel asks for it)."""
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def check_int(name: str, x: object, minimum: int) -> int:
    """``x`` when it is an int (not a bool) ``>= minimum``; else ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {x}")
    return x


def _check_bool(name: str, x: object) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {type(x).__name__}")
    return x


def set_num_sms(n: int) -> None:
    """Limit persistent kernels to ``n`` SMs; ``0`` resets to the device's count.

    Raises ``ValueError`` for a negative count or one above the device's SM count.
    """
    global _num_sms
    check_int("set_num_sms", n, 0)
    device_sms = _device_sm_count()
    if device_sms and n > device_sms:
        raise ValueError(f"set_num_sms: n={n} exceeds the device's {device_sms} SMs")
    _num_sms = n


def get_num_sms() -> int:
    """SMs that persistent kernels use: the ``set_num_sms`` value, else the device's count (0 without a GPU)."""
    return _num_sms or _device_sm_count()


def set_tc_util(new_tc_util: int | float) -> None:
    """Set the tensor-core utilisation hint: DeepGEMM's int percentage ``0..100`` (0 means 100).

    A float in ``(0, 1]`` is accepted as a ratio (tilegemm's earlier form) and stored as a percentage.
    """
    global _tc_util
    if isinstance(new_tc_util, bool) or not isinstance(new_tc_util, (int, float)):
        raise TypeError(f"set_tc_util: expected an int percentage, got {type(new_tc_util).__name__}")
    if isinstance(new_tc_util, float):
        if not 0.0 < new_tc_util <= 1.0:
            raise ValueError(f"set_tc_util: a float ratio must be in (0, 1], got {new_tc_util}")
        _tc_util = max(1, round(new_tc_util * 100))
        return
    if not 0 <= new_tc_util <= 100:
        raise ValueError(f"set_tc_util: an int percentage must be in 0..100, got {new_tc_util}")
    _tc_util = new_tc_util or 100


def get_tc_util() -> int:
    """The tensor-core utilisation hint as DeepGEMM returns it: an int percentage in ``1..100``."""
    return _tc_util


def set_mk_alignment_for_contiguous_layout(new_value: int) -> None:
    """Set the row alignment of each group's start in the m-grouped psum layout (and K in the k-grouped one)."""
    global _mk_alignment
    _mk_alignment = check_int("set_mk_alignment_for_contiguous_layout", new_value, 1)


def get_mk_alignment_for_contiguous_layout() -> int:
    """The alignment set by :func:`set_mk_alignment_for_contiguous_layout` (default 128)."""
    return _mk_alignment


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """The alignment the kernels work best with: 128 (DeepGEMM's on SM90; ``expected_m`` only matters on SM100)."""
    if expected_m is not None:
        check_int("expected_m", expected_m, 0)
    return DEFAULT_MK_ALIGNMENT


def set_pdl(new_enable_pdl: bool) -> None:
    """DeepGEMM's programmatic-dependent-launch switch: stored, no effect (cuTile launches are plain)."""
    global _pdl
    _pdl = _check_bool("set_pdl", new_enable_pdl)


def get_pdl() -> bool:
    """The value last given to :func:`set_pdl` (default ``False``)."""
    return _pdl


def set_ignore_compile_dims(new_value: bool) -> None:
    """DeepGEMM's JIT switch for compiled dims: stored, no effect (cuTile specialises on its own)."""
    global _ignore_compile_dims
    _ignore_compile_dims = _check_bool("set_ignore_compile_dims", new_value)


def set_block_size_multiple_of(new_value: int | tuple[int, int]) -> None:
    """DeepGEMM's block-size constraint ``x`` or ``(block_m, block_n)``: stored, no effect on tilegemm's configs."""
    global _block_size_multiple_of
    if isinstance(new_value, tuple) and len(new_value) == 2:
        m, n = new_value
    else:
        m = n = new_value
    _block_size_multiple_of = (check_int("block_m multiple", m, 1), check_int("block_n multiple", n, 1))
