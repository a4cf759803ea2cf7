"""Hot-lane keys (see :mod:`tilegemm.backend.registry`), built from what each argument's check reads.

A :class:`HotLane` names, per argument of an op, the *kind* of key part that vouches for it: everything
the op's check and its launch plan read from that argument (a tensor's shape, strides, dtype and device;
a scalar's value). A call whose every argument gives its part has a key; a key that passed the check once
passes it again, so the registry replays it without the check. An argument outside its kind (another
dtype, a misaligned tensor, a ``stream``) gives no key: the call takes the full path.

The registry binds a lane to an op's parameter list once (:meth:`HotLane.for_op`); every parameter of the
stub must have a kind, so the op's parameter list is written only in the stub and the check. Written for
speed: the key is built on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from tilegemm.env import CHECK_VALUES, env_flag

#: A kind: an argument's value -> its part of the key; raises :class:`Miss` for a value it cannot vouch for.
Kind = Callable[[Any], Hashable]


class Miss(Exception):
    """The argument is outside its kind: the call takes the full path."""


_TENSOR = torch.Tensor


def tensor(*dtypes: torch.dtype) -> Kind:
    """A 16-byte aligned tensor of ``dtypes``: (shape, strides, dtype, device)."""

    def part(x: Any) -> Hashable:
        if not isinstance(x, _TENSOR) or x.dtype not in dtypes or x.data_ptr() & 15:
            raise Miss
        return (x.shape, x.stride(), x.dtype, x.get_device())

    return part


def output(*dtypes: torch.dtype) -> Kind:
    """An output: as :func:`tensor`, and not requiring grad."""
    inner = tensor(*dtypes)

    def part(x: Any) -> Hashable:
        if isinstance(x, _TENSOR) and x.requires_grad:
            raise Miss
        return inner(x)

    return part


def packed(*dtypes: torch.dtype) -> Kind:
    """A contiguous tensor of ``dtypes``: (shape, dtype, device)."""

    def part(x: Any) -> Hashable:
        if not isinstance(x, _TENSOR) or x.dtype not in dtypes or not x.is_contiguous():
            raise Miss
        return (x.shape, x.dtype, x.get_device())

    return part


def pair(data: torch.dtype, scales: torch.dtype) -> Kind:
    """A ``(data, scales)`` tuple of 16-byte aligned tensors of those dtypes: both tensors' parts."""
    return _pair_of(tensor(data), tensor(scales))


def packed_pair(data: torch.dtype, scales: torch.dtype) -> Kind:
    """A ``(data, scales)`` tuple of contiguous tensors of those dtypes: both tensors' parts."""
    return _pair_of(packed(data), packed(scales))


def _pair_of(first: Kind, second: Kind) -> Kind:
    def part(x: Any) -> Hashable:
        if type(x) is not tuple or len(x) != 2:
            raise Miss
        return (first(x[0]), second(x[1]))

    return part


def packed_or_pair_with_none(*dtypes: torch.dtype) -> Kind:
    """A contiguous tensor of ``dtypes`` (as :func:`packed`), or DeepGEMM's ``(tensor, None)`` form of it."""
    inner = packed(*dtypes)

    def part(x: Any) -> Hashable:
        if type(x) is tuple:
            if len(x) != 2 or x[1] is not None:
                raise Miss
            x = x[0]
        return inner(x)

    return part


def optional(kind: Kind) -> Kind:
    """``None``, or a value of ``kind``."""

    def part(x: Any) -> Hashable:
        return None if x is None else kind(x)

    return part


def exact(*types: type) -> Kind:
    """A value whose type is one of ``types`` exactly (``bool`` is not an ``int`` here): the value."""

    def part(x: Any) -> Hashable:
        if type(x) not in types:
            raise Miss
        return x

    return part


def one_of(values: Sequence[Hashable]) -> Kind:
    """One of ``values``: the value."""

    def part(x: Any) -> Hashable:
        if x not in values:
            raise Miss
        return x

    return part


def none(x: Any) -> Hashable:
    """Only ``None`` (a ``stream``, DeepGEMM's varlen ``indices``): the full path handles anything else."""
    if x is not None:
        raise Miss
    return None


def int_tuple(x: Any) -> Hashable:
    """``None`` or a tuple of ints (a recipe, kept as given)."""
    if x is not None and not (type(x) is tuple and all(type(v) is int for v in x)):
        raise Miss
    return x


#: The kinds of DeepGEMM's FP8 recipe parameters and ``compiled_dims`` (the parameters
#: :func:`tilegemm.ops.api._stubs.fp8_form` gives an FP8 GEMM; ``compiled_dims`` alone in the BF16 forms).
RECIPE_KINDS: dict[str, Kind] = dict(
    recipe=int_tuple,
    recipe_a=int_tuple,
    recipe_b=int_tuple,
    compiled_dims=exact(str),
    disable_ue8m0_cast=exact(bool),
)


def transpose(x: torch.Tensor) -> torch.Tensor:
    """The last two dims of ``x`` swapped (a view)."""
    return x.transpose(-1, -2)


def transpose_pair(x: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Data and scales of an FP8 operand, both transposed (views)."""
    return (x[0].transpose(-1, -2), x[1].transpose(-1, -2))


def first_of_pair(x: Any) -> Any:
    """DeepGEMM's ``(tensor, None)`` form as its tensor; a tensor as itself."""
    return x[0] if type(x) is tuple else x


Signature = Callable[..., "tuple[tuple, tuple] | None"]


class HotLane:
    """An op's hot-lane key: one kind per argument, and the operands its replay takes.

    Args:
        kinds: argument name -> :data:`Kind`. Every parameter of the op's stub needs one (extra names, for
            parameters another stub of the same check has, are allowed).
        operands: the replay's arguments, in order: argument name -> a function giving the operand from the
            argument (the check's logical form, e.g. :func:`transpose`), or ``None`` for the argument as given.
        setting: a function of no arguments whose value the key also holds (a global setting the plan reads).
        value_checks: the check reads tensor values when ``TILEGEMM_CHECK_VALUES`` is on: no key then.
    """

    def __init__(
        self,
        kinds: dict[str, Kind],
        operands: dict[str, Callable[[Any], Any] | None],
        *,
        setting: Callable[[], Hashable] | None = None,
        value_checks: bool = False,
    ) -> None:
        unknown = set(operands) - set(kinds)
        if unknown:
            raise ValueError(f"operands: {sorted(unknown)} have no kind")
        self.kinds, self.operands, self.setting, self.value_checks = kinds, operands, setting, value_checks

    def for_op(self, name: str, parameters: Sequence[str]) -> Signature:
        """The signature function of op ``name`` whose stub has ``parameters`` (in order): ``fn(*values)`` ->
        ``(key, operands)`` or ``None``."""
        missing = [p for p in parameters if p not in self.kinds]
        if missing:
            raise TypeError(f"hot lane of {name}: parameters {missing} have no kind")
        kinds = tuple(self.kinds[p] for p in parameters)
        picks = tuple((list(parameters).index(n), f) for n, f in self.operands.items())
        setting, value_checks = self.setting, self.value_checks

        def signature(*values: Any) -> tuple[tuple, tuple] | None:
            if value_checks and env_flag(CHECK_VALUES, default=False):
                return None
            try:
                parts = tuple([kind(value) for kind, value in zip(kinds, values)])
            except Miss:
                return None
            key = (name, parts, setting()) if setting is not None else (name, parts)
            return key, tuple([values[i] if f is None else f(values[i]) for i, f in picks])

        signature.parameters = tuple(parameters)  # type: ignore[attr-defined]
        return signature
