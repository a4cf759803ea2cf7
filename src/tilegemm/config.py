"""Process-wide kernel settings that DeepGEMM exposes: SM count and tensor-core utilisation."""

from __future__ import annotations

_num_sms: int = 0
_tc_util: float = 1.0


def _device_sm_count() -> int:
    import torch

    if not torch.cuda.is_available():
        return 0
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def set_num_sms(n: int) -> None:
    """Limit persistent kernels to ``n`` SMs; ``0`` resets to the device's count.

    Raises ``ValueError`` for a negative count or one above the device's SM count.
    """
    global _num_sms
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_sms: n must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"set_num_sms: n must be >= 0, got {n}")
    device_sms = _device_sm_count()
    if device_sms and n > device_sms:
        raise ValueError(f"set_num_sms: n={n} exceeds the device's {device_sms} SMs")
    _num_sms = n


def get_num_sms() -> int:
    """SMs that persistent kernels use: the ``set_num_sms`` value, else the device's count (0 without a GPU)."""
    return _num_sms or _device_sm_count()


def set_tc_util(ratio: float) -> None:
    """Set the tensor-core utilisation hint: a float in (0, 1], or DeepGEMM's int percentage 2..100."""
    global _tc_util
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise TypeError(f"set_tc_util: ratio must be a float or int, got {type(ratio).__name__}")
    if isinstance(ratio, int):
        if not 2 <= ratio <= 100:
            raise ValueError(f"set_tc_util: an int percentage must be in 2..100, got {ratio}")
        _tc_util = ratio / 100.0
        return
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"set_tc_util: ratio must be in (0, 1], got {ratio}")
    _tc_util = float(ratio)


def get_tc_util() -> float:
    """The tensor-core utilisation hint as a float in (0, 1]."""
    return _tc_util
