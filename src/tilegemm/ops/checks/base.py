"""What every family's check is built from: the value-check gate, argument primitives, layouts, FP8 recipes.

The primitives raise the errors the package docstring describes; each names the argument, what it got and
what it needs. The families' modules (dense, grouped, mqa, ...) import them from here.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from tilegemm.env import CHECK_VALUES, env_flag
from tilegemm.ops.common import cdiv

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float32)
RECIPES = ((1, 128, 128), (1, 1, 128))
BLOCK = 128
M_ALIGNMENT = 128
#: The float dtypes of the ops that take any float (RMSNorm, MoE experts, routing weights).
FLOATS = (torch.bfloat16, torch.float16, torch.float32)

_local = threading.local()


# --------------------------------------------------------------------------- value-check gate


@contextlib.contextmanager
def skip_value_checks() -> Iterator[None]:
    """Inside this context, value checks (which sync the host) are skipped on this thread."""
    _local.skip = getattr(_local, "skip", 0) + 1
    try:
        yield
    finally:
        _local.skip -= 1


@contextlib.contextmanager
def allow_float_operands() -> Iterator[None]:
    """Inside this context, the operands of BF16 ops may also be fp16 or fp32 (on this thread).

    For callers that route such inputs to the ``pytorch`` backend, which computes in fp32 from any
    float input (the model integration's fp16/fp32 models); the kernels never see them.
    """
    _local.any_float = getattr(_local, "any_float", 0) + 1
    try:
        yield
    finally:
        _local.any_float -= 1


def value_checks_enabled(device: torch.device | None = None) -> bool:
    """True when value checks of tensors on ``device`` should run now (see the module docstring).

    ``None`` or a CPU device: on (unless inside :func:`skip_value_checks`); a meta device: off (no values);
    a CUDA device: ``TILEGEMM_CHECK_VALUES`` (default off), never during CUDA-graph capture.
    """
    if getattr(_local, "skip", 0):
        return False
    if device is None or device.type == "cpu":
        return True
    if device.type == "meta" or not env_flag(CHECK_VALUES, default=False):
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


# --------------------------------------------------------------------------------- primitives


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor(shape={list(x.shape)}, dtype={x.dtype}, device={x.device})"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _tensor(name: str, x: Any, dtypes: Sequence[torch.dtype], ndim: int | None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: got {_describe(x)}, expected a torch.Tensor")
    if x.dtype not in dtypes:
        if getattr(_local, "any_float", 0) and torch.bfloat16 in dtypes:
            dtypes = (*dtypes, torch.float16, torch.float32)
        if x.dtype not in dtypes:
            need = " or ".join(str(d) for d in dtypes)
            raise TypeError(f"{name}: got dtype {x.dtype}, expected {need}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: got a {x.dim()}-D tensor of shape {list(x.shape)}, expected {ndim}-D")
    return x


def _shape(name: str, x: torch.Tensor, expected: Sequence[int], meaning: str) -> None:
    if list(x.shape) != list(expected):
        raise ValueError(f"{name}: got shape {list(x.shape)}, expected {list(expected)} ({meaning})")


def _fp8_operand(name: str, x: Any, ndim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(x, (tuple, list)) and len(x) == 2):
        raise TypeError(f"{name}: got {_describe(x)}, expected a (float8_e4m3fn data, float32 scales) tuple")
    data, scales = x
    if (
        isinstance(data, torch.Tensor)
        and isinstance(scales, torch.Tensor)
        and data.dtype == FP8
        and scales.dtype == torch.float32
        and (ndim is None or data.dim() == ndim)
    ):
        return data, scales  # the common case; anything else gets the detailed checks below
    if isinstance(x[0], torch.Tensor) and x[0].dtype in (torch.int8, torch.uint8):
        raise NotImplementedError(f"{name}: FP4 operands (packed e2m1 in {x[0].dtype}) are DeepGEMM's SM100 path")
    if isinstance(x[1], torch.Tensor) and x[1].dtype == torch.int32:
        raise NotImplementedError(f"{name}[1]: packed UE8M0 (int32) scale factors are DeepGEMM's SM100 path")
    data = _tensor(f"{name}[0] (data)", x[0], (FP8,), ndim)
    if not isinstance(x[1], torch.Tensor):
        raise TypeError(f"{name}[1] (scales): got {_describe(x[1])}, expected a float32 torch.Tensor")
    if x[1].dtype != torch.float32:
        raise TypeError(f"{name}[1] (scales): got dtype {x[1].dtype}, expected torch.float32")
    return data, x[1]


def _output(name: str, d: Any, dtypes: Sequence[torch.dtype], expected: Sequence[int], meaning: str) -> None:
    _tensor(name, d, dtypes, len(expected))
    _shape(name, d, expected, meaning)
    if not d.is_contiguous():
        raise ValueError(f"{name}: must be contiguous row-major, got strides {list(d.stride())}")
    if d.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{name}: requires grad, but the op writes it in place and is not differentiable "
            "(use tilegemm.matmul / grouped_matmul / fp8_linear, or call under torch.no_grad())"
        )


def _same_device(tensors: dict[str, Any]) -> None:
    """Every tensor of ``tensors`` (argument name -> value; ``None`` skipped) on the first one's device."""
    first = ref = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue
        device = t.device
        if ref is None:
            first, ref = name, device
        elif device != ref:
            raise ValueError(f"{name}: expected device {ref} (all tensors on {first}'s device), got {device}")


def _operand_devices(
    a: torch.Tensor, sa: torch.Tensor | None, b: torch.Tensor, sb: torch.Tensor | None, **others: Any
) -> dict[str, Any]:
    """The tensors of a GEMM call by argument name, FP8 data and scales apart, for :func:`_same_device`."""
    if sa is None:
        return dict(a=a, b=b, **others)
    return {"a[0] (data)": a, "a[1] (scales)": sa, "b[0] (data)": b, "b[1] (scales)": sb, **others}


def _gemm_placement(
    stream: Any, a: torch.Tensor, sa: torch.Tensor | None, b: torch.Tensor, sb: torch.Tensor | None, **others: Any
) -> None:
    """Where a GEMM call runs: ``stream`` is ``None`` or a ``torch.cuda.Stream``, and the operands (``sa`` / ``sb``:
    FP8 scales, ``None`` for plain tensors) and ``others`` are all on one device (:func:`_operand_devices`)."""
    _stream(stream)
    _same_device(_operand_devices(a, sa, b, sb, **others))


def _scalar(name: str, x: Any) -> float:
    """``x`` as a float: any real number (int, float, Fraction, numpy scalar) that a float can hold."""
    if type(x) is float:  # the common case, without the ABC check below
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: got {_describe(x)}, expected a real number")
    try:
        return float(x)
    except (OverflowError, ValueError, TypeError):
        text = str(x)
        text = text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
        raise ValueError(f"{name}: got {type(x).__name__} {text}, outside the range of a float") from None


#: The largest value of the int arguments that become sizes (output widths, SM counts): int32, as in DeepGEMM.
INT32_MAX = 2**31 - 1


def _int(name: str, x: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name}: got {_describe(x)}, expected an int")
    if x < minimum:
        raise ValueError(f"{name}: got {x}, expected an int >= {minimum}")
    if maximum is not None and x > maximum:
        raise ValueError(f"{name}: got {x}, expected an int <= {maximum}")


def _bool(name: str, x: Any) -> None:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: got {_describe(x)}, expected a bool")


def _stream(stream: Any) -> None:
    if stream is not None and not isinstance(stream, torch.cuda.Stream):
        raise TypeError(f"stream: got {_describe(stream)}, expected None or a torch.cuda.Stream")


def _string(name: str, x: Any) -> None:
    if not isinstance(x, str):
        raise TypeError(f"{name}: got {_describe(x)}, expected a str (it only steers DeepGEMM's JIT)")


def _dtype_arg(name: str, x: Any, allowed: Sequence[torch.dtype]) -> torch.dtype:
    if x not in allowed:
        raise TypeError(f"{name}: got {x!r}, expected one of {list(allowed)}")
    return x


def _addend(c: Any, dtypes: Sequence[torch.dtype], expected: Sequence[int], meaning: str) -> None:
    if c is None:
        return
    _tensor("c", c, dtypes, len(expected))
    _shape("c", c, expected, meaning)


# --------------------------------------------------------------------------------- layouts

#: Layout suffix -> (a is stored transposed, b is stored transposed) relative to the logical ``nt`` form.
LAYOUTS = {"nt": (False, False), "nn": (False, True), "tn": (True, True), "tt": (True, False)}
#: The shapes of a and b as the caller stores them, per layout.
LAYOUT_SHAPES = {
    "nt": ("[M, K]", "[N, K]"),
    "nn": ("[M, K]", "[K, N]"),
    "tn": ("[K, M]", "[K, N]"),
    "tt": ("[K, M]", "[N, K]"),
}


def _t(x: torch.Tensor, flip: bool) -> torch.Tensor:
    """``x`` with its last two dims swapped when ``flip`` (a view)."""
    return x.transpose(-1, -2) if flip else x


def _as_given(shape: Sequence[int], flip: bool) -> list[int]:
    shape = list(shape)
    return [*shape[:-2], shape[-1], shape[-2]] if flip else shape


def _logical_shape(name: str, x: torch.Tensor, expected: Sequence[int], meaning: str, flip: bool) -> None:
    """Check the logical view ``x`` against ``expected``; the message shows the caller's orientation."""
    if list(x.shape) != list(expected):
        raise ValueError(
            f"{name}: got shape {_as_given(x.shape, flip)}, expected {_as_given(expected, flip)} ({meaning})"
        )


# ----------------------------------------------------------------------------- FP8 recipes


def _gran_k(name: str, gran_k: Any) -> None:
    if gran_k == 32:
        raise NotImplementedError(f"{name}: gran_k=32 scales are DeepGEMM's SM100 FP4/UE8M0 recipe; only 128 here")
    if gran_k != BLOCK:
        raise ValueError(f"{name}: got gran_k={gran_k!r}, expected 128")


def _int_tuple(name: str, x: Any, length: int) -> tuple[int, ...]:
    ok = isinstance(x, (tuple, list)) and len(x) == length
    if not ok or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in x):
        raise ValueError(f"{name}: got {x!r}, expected a tuple of {length} ints")
    return tuple(int(v) for v in x)


#: What each supported recipe's RHS scales are, for messages.
RECIPE_NAMES = {(1, 128, 128): "128x128 blocks", (1, 1, 128): "1x128 rows"}


def resolve_recipe(
    sb: torch.Tensor,
    n: int,
    k: int,
    recipe: Any,
    recipe_a: Any = None,
    recipe_b: Any = None,
    lead: Sequence[int] = (),
    flip: bool = False,
    *,
    takes: Sequence[tuple[int, int, int]] = RECIPES,
    op: str = "this op",
    lead_names: Sequence[str] = (),
) -> tuple[int, int, int]:
    """The recipe of an FP8 GEMM from its arguments and the logical RHS scales ``sb`` (``lead + [.., K/128]``).

    DeepGEMM's rule: either ``recipe`` ``(gran_m, gran_n, gran_k)`` or the pair ``recipe_a``
    ``(gran_m, gran_k)`` + ``recipe_b`` ``(gran_n, gran_k)``; neither means "inferred from ``sb``'s
    shape". Supported: ``(1, 128, 128)`` (128x128 RHS blocks) and ``(1, 1, 128)`` (1x128 RHS rows); an op
    that takes fewer names them in ``takes`` (and itself in ``op``, for the message). ``lead_names`` names the
    dims of ``lead`` in messages (e.g. ``("G",)``).

    Raises:
        ValueError: the recipe the caller gave (named: ``recipe``, or ``recipe_a, recipe_b``) is not one the
            op takes, or ``sb``'s shape fits none of them; then the message names ``b[1] (scales)``, its shape
            and the shape each recipe the op takes needs.
    """
    given = "recipe"
    if recipe_a is not None or recipe_b is not None:
        if recipe is not None or recipe_a is None or recipe_b is None:
            raise ValueError("recipe, recipe_a, recipe_b: give either recipe, or both recipe_a and recipe_b")
        gran_m, gran_ka = _int_tuple("recipe_a", recipe_a, 2)
        gran_n, gran_kb = _int_tuple("recipe_b", recipe_b, 2)
        _gran_k("recipe_a", gran_ka)
        _gran_k("recipe_b", gran_kb)
        given, recipe = "recipe_a, recipe_b", (gran_m, gran_n, BLOCK)
        shown = f"recipe_a={tuple(recipe_a)}, recipe_b={tuple(recipe_b)}, that is recipe {recipe}"
    kb = cdiv(k, BLOCK)
    shapes = {(1, 128, 128): [*lead, cdiv(n, BLOCK), kb], (1, 1, 128): [*lead, n, kb]}
    lead_sym = list(lead_names) if len(lead_names) == len(lead) else ["..."] * len(lead)
    symbols = {
        (1, 128, 128): [*lead_sym, "ceil(N/128)", "ceil(K/128)"],
        (1, 1, 128): [*lead_sym, "N", "ceil(K/128)"],
    }
    takes_text = " or ".join(str(r) for r in takes)
    if recipe is not None:
        if given == "recipe":
            recipe = _int_tuple("recipe", recipe, 3)
            _gran_k("recipe", recipe[2])
            shown = str(recipe)
        if recipe not in shapes:
            raise ValueError(f"{given}: got {shown}, expected None, (1, 128, 128) or (1, 1, 128)")
        if recipe not in takes:
            raise ValueError(f"{given}: got {shown} ({RECIPE_NAMES[recipe]} RHS scales), but {op} takes {takes_text}")
        _logical_shape("b[1] (scales)", sb, shapes[recipe], f"recipe {recipe}", flip)
        return recipe
    for candidate in takes:
        if list(sb.shape) == shapes[candidate]:
            return candidate
    expected = " or ".join(
        f"{_as_given(shapes[r], flip)} ({RECIPE_NAMES[r]} [{', '.join(map(str, _as_given(symbols[r], flip)))}])"
        for r in takes
    )
    other = [r for r in shapes if r not in takes and list(sb.shape) == shapes[r]]
    got = f" ({RECIPE_NAMES[other[0]]}, which {op} does not take)" if other else ""
    raise ValueError(
        f"b[1] (scales): got shape {_as_given(sb.shape, flip)}{got}, expected {expected}, in the data's orientation"
    )


def _operands(fp8: bool, a: Any, b: Any, ndim_a: int | None, ndim_b: int | None):
    """(a data, a scales or None, b data, b scales or None) after the type checks."""
    if fp8:
        a_data, sa = _fp8_operand("a", a, ndim_a)
        b_data, sb = _fp8_operand("b", b, ndim_b)
        return a_data, sa, b_data, sb
    return _tensor("a", a, (torch.bfloat16,), ndim_a), None, _tensor("b", b, (torch.bfloat16,), ndim_b), None


def _pack(data: torch.Tensor, scales: torch.Tensor | None) -> Any:
    return data if scales is None else (data, scales)
