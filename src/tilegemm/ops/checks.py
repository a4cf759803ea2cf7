"""Input validation shared by all backends; runs in the dispatch wrapper before any backend.

Each op's check validates the call and returns what it derived, which is what the backends
receive (they trust it and never check again):

* the logical form of the operands: every layout collapses here into one form per family, as
  DeepGEMM's own ``nn``/``tn``/``tt`` ops call ``nt`` on transposed views. A transposed operand's
  FP8 scales are in the data's own orientation, so the logical form is a plain transpose of data
  and scales together (dense: a [M, K], b [N, K]; m-grouped: b [G, N, K]; k-grouped: the ``tn``
  form a [K_sum, M], b [K_sum, N]);
* resolved settings: the FP8 recipe, the psum alignment;
* nothing that only steers DeepGEMM's JIT (``compiled_dims``, ...): those are validated and dropped.

Errors name the argument, what it got and what it needs: ``TypeError`` for a wrong type or
dtype, ``ValueError`` for shape, device, range and value faults, ``NotImplementedError`` for
DeepGEMM features tilegemm does not have (FP4 operands, packed UE8M0 scales, SM100-only paths).
Nothing is written before a check fails.

Two kinds of check:

* metadata (types, dtypes, shapes, devices): free, always on;
* values (index ranges, alignment, ``grouped_layout == ks_cpu``, MQA windows, block tables): they
  read tensor memory. On CPU tensors they always run (free). On CUDA tensors they cost a host
  sync, so they are off by default and run only with ``TILEGEMM_CHECK_VALUES=1``, never during
  CUDA-graph capture. Inside :func:`skip_value_checks` (internal callers that built the indices
  themselves) they never run.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from tilegemm import config
from tilegemm.env import CHECK_VALUES, env_flag
from tilegemm.ops.common import cdiv, paged_mqa_schedule

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float32)
RECIPES = ((1, 128, 128), (1, 1, 128))
BLOCK = 128
M_ALIGNMENT = 128

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


def resolve_recipe(
    sb: torch.Tensor,
    n: int,
    k: int,
    recipe: Any,
    recipe_a: Any = None,
    recipe_b: Any = None,
    lead: Sequence[int] = (),
    flip: bool = False,
) -> tuple[int, int, int]:
    """The recipe of an FP8 GEMM from its arguments and the logical RHS scales ``sb`` (``lead + [.., K/128]``).

    DeepGEMM's rule: either ``recipe`` ``(gran_m, gran_n, gran_k)`` or the pair ``recipe_a``
    ``(gran_m, gran_k)`` + ``recipe_b`` ``(gran_n, gran_k)``; neither means "inferred from ``sb``'s
    shape". Supported: ``(1, 128, 128)`` (128x128 RHS blocks) and ``(1, 1, 128)`` (1x128 RHS rows).
    """
    if recipe_a is not None or recipe_b is not None:
        if recipe is not None or recipe_a is None or recipe_b is None:
            raise ValueError("recipe, recipe_a, recipe_b: give either recipe, or both recipe_a and recipe_b")
        gran_m, gran_ka = _int_tuple("recipe_a", recipe_a, 2)
        gran_n, gran_kb = _int_tuple("recipe_b", recipe_b, 2)
        _gran_k("recipe_a", gran_ka)
        _gran_k("recipe_b", gran_kb)
        recipe = (gran_m, gran_n, BLOCK)
    kb = cdiv(k, BLOCK)
    shapes = {(1, 128, 128): [*lead, cdiv(n, BLOCK), kb], (1, 1, 128): [*lead, n, kb]}
    if recipe is not None:
        recipe = _int_tuple("recipe", recipe, 3)
        _gran_k("recipe", recipe[2])
        if recipe not in shapes:
            raise ValueError(f"recipe: got {recipe}, expected None, (1, 128, 128) or (1, 1, 128)")
        _logical_shape("b[1] (scales)", sb, shapes[recipe], f"recipe {recipe}", flip)
        return recipe
    for candidate, shape in shapes.items():
        if list(sb.shape) == shape:
            return candidate
    raise ValueError(
        f"b[1] (scales): got shape {_as_given(sb.shape, flip)}, expected {_as_given(shapes[(1, 128, 128)], flip)} "
        f"(128x128 blocks) or {_as_given(shapes[(1, 1, 128)], flip)} (1x128 rows), in the data's orientation"
    )


def _block_recipe(rec: tuple[int, int, int], op: str) -> None:
    if rec != (1, 128, 128):
        raise ValueError(f"recipe: {op} takes 128x128 RHS scales (recipe (1, 128, 128)), got {rec}")


def _operands(fp8: bool, a: Any, b: Any, ndim_a: int | None, ndim_b: int | None):
    """(a data, a scales or None, b data, b scales or None) after the type checks."""
    if fp8:
        a_data, sa = _fp8_operand("a", a, ndim_a)
        b_data, sb = _fp8_operand("b", b, ndim_b)
        return a_data, sa, b_data, sb
    return _tensor("a", a, (torch.bfloat16,), ndim_a), None, _tensor("b", b, (torch.bfloat16,), ndim_b), None


def _pack(data: torch.Tensor, scales: torch.Tensor | None) -> Any:
    return data if scales is None else (data, scales)


# ----------------------------------------------------------------------------- dense GEMMs


def dense_gemm_check(layout: str, fp8: bool) -> Callable[..., dict[str, Any]]:
    """The check of ``{bf16,fp8_fp4}_gemm_<layout>``; returns the logical ``nt`` form.

    Derived: ``a`` [M, K] (``(data, sa [M, K/128])`` for FP8), ``b`` [N, K] (``(data, sb)``, sb
    ``[N/128, K/128]`` or ``[N, K/128]``), ``d``, ``c``, ``recipe`` (FP8, resolved), ``alpha``,
    ``beta``, ``stream``.
    """
    flip_a, flip_b = LAYOUTS[layout]
    a_shape, b_shape = LAYOUT_SHAPES[layout]

    def check(
        a,
        b,
        d,
        c=None,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        *,
        alpha=1.0,
        beta=1.0,
        stream=None,
    ) -> dict[str, Any]:
        a_data, sa, b_data, sb = _operands(fp8, a, b, 2, 2)
        la, lb = _t(a_data, flip_a), _t(b_data, flip_b)
        (m, k), (n, kb) = la.shape, lb.shape
        if k != kb:
            raise ValueError(
                f"a and b disagree on K for layout {layout} (a {a_shape}, b {b_shape}): "
                f"a has shape {list(a_data.shape)} (K={k}), b has shape {list(b_data.shape)} (K={kb})"
            )
        derived: dict[str, Any] = {}
        if fp8:
            sa, sb = _t(sa, flip_a), _t(sb, flip_b)
            meaning = "1x128 LHS scales, in the data's orientation"
            _logical_shape("a[1] (scales)", sa, [m, cdiv(k, BLOCK)], meaning, flip_a)
            derived["recipe"] = resolve_recipe(sb, n, k, recipe, recipe_a, recipe_b, flip=flip_b)
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _string("compiled_dims", compiled_dims)
        _output("d", d, OUT_DTYPES, [m, n], "[M, N]")
        _addend(c, OUT_DTYPES, [m, n], "[M, N]")
        alpha, beta = _scalar("alpha", alpha), _scalar("beta", beta)
        _stream(stream)
        _same_device(_operand_devices(a_data, sa, b_data, sb, d=d, c=c))
        return dict(a=_pack(la, sa), b=_pack(lb, sb), d=d, c=c, **derived, alpha=alpha, beta=beta, stream=stream)

    return check


# The hot lane (see tilegemm.backend.registry): a signature holds everything a check and a launch plan read
# from a call, so that a signature which passed once passes again. Only the canonical dtypes and 16-byte
# aligned tensors take it (the fp16/fp32 operands that allow_float_operands admits depend on a thread-local
# setting, not on the call). Written for speed: it runs on every call.


def _hot_tensor(x: Any, dtypes: Sequence[torch.dtype]) -> tuple | None:
    """Tensor ``x``'s part of a signature: shape, strides, dtype, device (``None``: not a 16-byte aligned
    tensor of ``dtypes``)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes or x.data_ptr() & 15:
        return None
    return (x.shape, x.stride(), x.dtype, x.get_device())


def _hot_ints(x: Any) -> bool:
    """True for ``None`` or a tuple of ints (a recipe the signature may hold as it is)."""
    return x is None or (type(x) is tuple and all(type(v) is int for v in x))


def dense_gemm_signature(layout: str, fp8: bool) -> Callable[..., tuple[tuple, tuple] | None]:
    """The hot-lane signature of ``{bf16,fp8_fp4}_gemm_<layout>``: ``(key, (a, b, d, c, alpha, beta))`` with
    ``a``/``b`` in the logical ``nt`` form :func:`dense_gemm_check` derives, or ``None`` (the full path).

    The key holds the shape, strides, dtype and device of every tensor, ``alpha``, ``beta``, the recipe
    arguments and the ``set_num_sms`` setting. Calls with a ``stream``, non-float ``alpha``/``beta``, an
    output that requires grad, a tensor not 16-byte aligned, or operands of other than the canonical dtypes
    take the full path.
    """
    flip_a, flip_b = LAYOUTS[layout]
    tag = f"{'fp8' if fp8 else 'bf16'}_{layout}"
    tensor, bf16, fp32, fp8_dtype = torch.Tensor, torch.bfloat16, torch.float32, FP8

    def output(d, c, alpha, beta, stream) -> tuple | None:
        """The key's part for ``d``, ``c``, ``alpha``, ``beta`` (``stream`` must be ``None``)."""
        if stream is not None or type(alpha) is not float or type(beta) is not float:
            return None
        kd = _hot_tensor(d, OUT_DTYPES)
        if kd is None or d.requires_grad:
            return None
        kc = None
        if c is not None:
            kc = _hot_tensor(c, OUT_DTYPES)
            if kc is None:
                return None
        return (kd, kc, alpha, beta, config._num_sms)

    def bf16_call(a, b, d, c, compiled_dims, alpha, beta, stream):
        if not (isinstance(a, tensor) and isinstance(b, tensor)) or a.dtype is not bf16 or b.dtype is not bf16:
            return None
        rest = output(d, c, alpha, beta, stream)
        if rest is None or (a.data_ptr() | b.data_ptr()) & 15 or type(compiled_dims) is not str:
            return None
        key = (tag, a.shape, a.stride(), a.get_device(), b.shape, b.stride(), b.get_device(), rest)
        return key, (_t(a, flip_a), _t(b, flip_b), d, c, alpha, beta)

    def fp8_call(a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, alpha, beta, stream):
        if type(a) is not tuple or type(b) is not tuple or len(a) != 2 or len(b) != 2:
            return None
        (x, sx), (y, sy) = a, b
        if not (isinstance(x, tensor) and isinstance(sx, tensor) and isinstance(y, tensor) and isinstance(sy, tensor)):
            return None
        if x.dtype is not fp8_dtype or y.dtype is not fp8_dtype or sx.dtype is not fp32 or sy.dtype is not fp32:
            return None
        rest = output(d, c, alpha, beta, stream)
        if rest is None or (x.data_ptr() | sx.data_ptr() | y.data_ptr() | sy.data_ptr()) & 15:
            return None
        if type(compiled_dims) is not str or type(disable_ue8m0_cast) is not bool:
            return None
        if not (_hot_ints(recipe) and _hot_ints(recipe_a) and _hot_ints(recipe_b)):
            return None
        key = (
            tag,
            (x.shape, x.stride(), x.get_device(), sx.shape, sx.stride(), sx.get_device()),
            (y.shape, y.stride(), y.get_device(), sy.shape, sy.stride(), sy.get_device()),
            rest,
            recipe,
            recipe_a,
            recipe_b,
        )
        if flip_a:
            a = (_t(x, True), _t(sx, True))
        if flip_b:
            b = (_t(y, True), _t(sy, True))
        return key, (a, b, d, c, alpha, beta)

    return fp8_call if fp8 else bf16_call


def skip_head_mid_check(
    a, b, d, head_splits, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False, *, stream=None
) -> dict[str, Any]:
    """The check of ``fp8_gemm_nt_skip_head_mid``: d [M, N + N / (left + right) * mid].

    Derived: ``a``, ``b`` (``nt`` FP8 operands), ``d``, ``head_splits`` (a tuple), ``recipe``, ``stream``.
    """
    a_data, sa, b_data, sb = _operands(True, a, b, 2, 2)
    (m, k), (n, kb) = a_data.shape, b_data.shape
    if k != kb:
        raise ValueError(f"a [M, K] has shape {list(a_data.shape)} but b [N, K] has {list(b_data.shape)}")
    left, mid, right = _int_tuple("head_splits", head_splits, 3)
    if min(left, mid, right) < 0 or left + right == 0 or n % (left + right):
        raise ValueError(
            f"head_splits: got {(left, mid, right)}, expected non-negative (left, mid, right) with N={n} "
            "a multiple of left + right"
        )
    _shape("a[1] (scales)", sa, [m, cdiv(k, BLOCK)], "[M, ceil(K/128)]")
    rec = resolve_recipe(sb, n, k, recipe)
    _bool("disable_ue8m0_cast", disable_ue8m0_cast)
    _string("compiled_dims", compiled_dims)
    _output("d", d, OUT_DTYPES, [m, n + n // (left + right) * mid], "[M, N + N / (left + right) * mid]")
    _stream(stream)
    _same_device(_operand_devices(a_data, sa, b_data, sb, d=d))
    return dict(a=(a_data, sa), b=(b_data, sb), d=d, head_splits=(left, mid, right), recipe=rec, stream=stream)


# ---------------------------------------------------------------------- m-grouped contiguous


def _check_m_indices(m_indices: torch.Tensor, m_sum: int, groups: int) -> None:
    _shape("grouped_layout", m_indices, [m_sum], "[M_sum], one group id per row")
    if not value_checks_enabled(m_indices.device) or m_sum == 0:
        return
    bad = (m_indices < -1) | (m_indices >= groups)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"grouped_layout: row {row} has group {int(m_indices[row])}, expected -1 or 0..{groups - 1}")
    blocks = cdiv(m_sum, M_ALIGNMENT)
    padded = torch.full((blocks * M_ALIGNMENT,), -1, dtype=m_indices.dtype, device=m_indices.device)
    padded[:m_sum] = m_indices
    padded = padded.view(blocks, M_ALIGNMENT)
    owner = padded.amax(dim=1, keepdim=True)  # the block's group, or -1 for an all-padding block
    mixed = ((padded != owner) & (padded != -1)).any(dim=1)
    if bool(mixed.any()):
        blk = int(mixed.nonzero()[0, 0])
        raise ValueError(
            f"grouped_layout: rows {blk * M_ALIGNMENT}..{min(m_sum, (blk + 1) * M_ALIGNMENT) - 1} mix groups; every "
            f"{M_ALIGNMENT}-row block must hold one group's rows, padded with -1"
        )


def check_group_offsets(offs: torch.Tensor, m_sum: int, groups: int, name: str = "grouped_layout") -> None:
    """psum-layout ends ``name``: int32 [G], non-decreasing, within ``0..m_sum`` (the values only when enabled)."""
    _shape(name, offs, [groups], "[G] cumulative group end rows")
    if not value_checks_enabled(offs.device) or groups == 0:
        return
    prev = torch.cat([offs.new_zeros(1), offs[:-1]])
    if bool((offs < prev).any()) or bool((offs > m_sum).any()):
        raise ValueError(f"{name} (psum ends): got {offs.tolist()[:16]}, expected non-decreasing values in 0..{m_sum}")


def resolve_alignment(alignment: Any) -> int:
    """The psum group-start alignment: ``alignment``, or ``get_mk_alignment_for_contiguous_layout()`` for None."""
    if alignment is None:
        return config.get_mk_alignment_for_contiguous_layout()
    _int("alignment", alignment, 1)
    return int(alignment)


def m_grouped_contiguous_check(layout: str, fp8: bool) -> Callable[..., dict[str, Any]]:
    """The check of ``m_grouped_{bf16,fp8_fp4}_gemm_<layout>_contiguous``; returns the logical ``nt`` form.

    Derived: ``a`` [M_sum, K] (FP8: ``(data, sa [M_sum, K/128])``), ``b`` [G, N, K] (FP8: ``(data,
    sb [G, N/128, K/128])``), ``d``, ``grouped_layout``, ``use_psum_layout``, ``alignment`` (resolved),
    ``stream``.
    """
    flip_b = layout == "nn"
    b_meaning = "[G, K, N]" if flip_b else "[G, N, K]"

    def check(
        a,
        b,
        d,
        grouped_layout,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        use_psum_layout=False,
        ensure_zero_padding=True,
        expected_m_for_psum_layout=None,
        *,
        alignment=None,
        stream=None,
    ) -> dict[str, Any]:
        a_data, sa, b_data, sb = _operands(fp8, a, b, 2, 3)
        lb = _t(b_data, flip_b)
        (m_sum, k), (groups, n, kb) = a_data.shape, lb.shape
        if k != kb:
            raise ValueError(
                f"a and b disagree on K: a [M_sum, K] has shape {list(a_data.shape)}, "
                f"b {b_meaning} has shape {list(b_data.shape)}"
            )
        if fp8:
            _shape("a[1] (scales)", sa, [m_sum, cdiv(k, BLOCK)], "[M_sum, ceil(K/128)]")
            sb = _t(sb, flip_b)
            rec = resolve_recipe(sb, n, k, recipe, recipe_a, recipe_b, lead=[groups], flip=flip_b)
            _block_recipe(rec, "m-grouped FP8")
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _string("compiled_dims", compiled_dims)
        _output("d", d, OUT_DTYPES, [m_sum, n], "[M_sum, N]")
        _bool("use_psum_layout", use_psum_layout)
        _bool("ensure_zero_padding", ensure_zero_padding)
        if expected_m_for_psum_layout is not None:
            if not use_psum_layout:
                raise ValueError("expected_m_for_psum_layout: only taken with use_psum_layout=True")
            _int("expected_m_for_psum_layout", expected_m_for_psum_layout, 0)
        align = resolve_alignment(alignment)
        _tensor("grouped_layout", grouped_layout, (torch.int32,), 1)
        _stream(stream)
        _same_device(_operand_devices(a_data, sa, b_data, sb, d=d, grouped_layout=grouped_layout))
        if use_psum_layout:
            check_group_offsets(grouped_layout, m_sum, groups)
        else:
            _check_m_indices(grouped_layout, m_sum, groups)
        return dict(
            a=_pack(a_data, sa),
            b=_pack(lb, sb),
            d=d,
            grouped_layout=grouped_layout,
            use_psum_layout=use_psum_layout,
            alignment=align,
            stream=stream,
        )

    return check


# -------------------------------------------------------------------------- m-grouped masked


def m_grouped_masked_check(fp8: bool) -> Callable[..., dict[str, Any]]:
    """The check of ``m_grouped_{bf16,fp8_fp4}_gemm_nt_masked``.

    Derived: ``a``, ``b``, ``d``, ``masked_m``, ``expected_m``, ``stream``.
    """

    def check(
        a,
        b,
        d,
        masked_m,
        expected_m,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        *,
        stream=None,
    ) -> dict[str, Any]:
        a_data, sa, b_data, sb = _operands(fp8, a, b, 3, 3)
        groups, m_max, k = a_data.shape
        if b_data.shape[0] != groups or b_data.shape[2] != k:
            raise ValueError(
                f"b: got shape {list(b_data.shape)}, expected [G={groups}, N, K={k}] to match a [G, Mmax, K] "
                f"of shape {list(a_data.shape)}"
            )
        n = b_data.shape[1]
        if fp8:
            _shape("a[1] (scales)", sa, [groups, m_max, cdiv(k, BLOCK)], "[G, Mmax, ceil(K/128)]")
            _block_recipe(resolve_recipe(sb, n, k, recipe, recipe_a, recipe_b, lead=[groups]), "masked FP8")
            _bool("disable_ue8m0_cast", disable_ue8m0_cast)
        _string("compiled_dims", compiled_dims)
        _output("d", d, OUT_DTYPES, [groups, m_max, n], "[G, Mmax, N]")
        _tensor("masked_m", masked_m, (torch.int32,), 1)
        _shape("masked_m", masked_m, [groups], "[G], valid rows per group")
        _int("expected_m", expected_m, 0)
        _stream(stream)
        _same_device(_operand_devices(a_data, sa, b_data, sb, d=d, masked_m=masked_m))
        if value_checks_enabled(masked_m.device) and groups:
            bad = (masked_m < 0) | (masked_m > m_max)
            if bool(bad.any()):
                g = int(bad.nonzero()[0, 0])
                raise ValueError(f"masked_m: group {g} has {int(masked_m[g])} rows, expected 0..Mmax={m_max}")
        return dict(a=a, b=b, d=d, masked_m=masked_m, expected_m=expected_m, stream=stream)

    return check


# ------------------------------------------------------------------------------- k-grouped


def _ks(ks_cpu: Any) -> list[int]:
    if not isinstance(ks_cpu, (list, tuple)) or any(
        isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in ks_cpu
    ):
        raise TypeError(f"ks_cpu: got {_describe(ks_cpu)}, expected a list of ints (per-group K)")
    if any(x < 0 for x in ks_cpu):
        raise ValueError(f"ks_cpu: got {list(ks_cpu)}, expected every per-group K >= 0")
    return [int(x) for x in ks_cpu]


def _k_major_groups(name: str, data: torch.Tensor, ks: list[int], mn: int) -> torch.Tensor:
    """DeepGEMM's per-group K-major buffer (group g: ``[MN, K_g]`` row-major, groups back to back) as [MN, K_sum]."""
    if data.numel() != sum(ks) * mn:
        raise ValueError(
            f"{name}: holds {data.numel()} elements, expected sum(ks_cpu) * {mn} = {sum(ks) * mn} "
            "(each group's [MN, K_g] block, K-major, back to back)"
        )
    if not data.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (each group's [MN, K_g] block, K-major, back to back)")
    flat, parts, start = data.reshape(-1), [], 0
    for kg in ks:
        parts.append(flat[start * mn : (start + kg) * mn].view(mn, kg))
        start += kg
    return torch.cat(parts, dim=1) if parts else flat.new_empty(mn, 0)


def k_grouped_check(fp8: bool, layout: str = "tn") -> Callable[..., dict[str, Any]]:
    """The check of ``k_grouped_{bf16,fp8}_gemm_<layout>_contiguous``; returns the ``tn`` form.

    ``tn``: a [K_sum, M], b [K_sum, N] (FP8 scales [K_sum/128, M] / [K_sum/128, N]). ``nt`` (FP8,
    DeepGEMM's SM90 op): a and b hold each group's K-major ``[M, K_g]`` / ``[N, K_g]`` block back to
    back, scales [M, K_sum/128] / [N, K_sum/128]; they are gathered into the ``tn`` form (one copy).
    Derived: ``a``, ``b``, ``d``, ``ks_cpu`` (a list), ``grouped_layout``, ``c``, ``stream``.
    """

    def check(
        a,
        b,
        d,
        ks_cpu,
        grouped_layout,
        c=None,
        recipe=(1, 1, 128),
        compiled_dims="mn",
        use_psum_layout=False,
        *,
        stream=None,
    ) -> dict[str, Any]:
        _bool("use_psum_layout", use_psum_layout)
        if use_psum_layout:
            raise NotImplementedError("k-grouped use_psum_layout=True is DeepGEMM's SM100 path; pass ks_cpu instead")
        ks = _ks(ks_cpu)
        _tensor("d", d, (torch.float32,), 3)
        groups, m, n = d.shape
        if len(ks) != groups:
            raise ValueError(f"ks_cpu: got {len(ks)} groups, expected G={groups} (d is [G, M, N])")
        k_sum = sum(ks)
        ndim = 2 if layout == "tn" else None
        a_data, sa, b_data, sb = _operands(fp8, a, b, ndim, ndim)
        if fp8:
            rec = _int_tuple("recipe", recipe, 3)
            _gran_k("recipe", rec[2])
            if rec != (1, 1, 128):
                raise ValueError(f"recipe: k-grouped FP8 takes 1x128 scales on both sides (1, 1, 128), got {rec}")
            if any(x % BLOCK for x in ks):
                raise ValueError(f"ks_cpu: got {ks}, expected multiples of {BLOCK} for the FP8 op")
        if layout == "nt":
            a_data = _k_major_groups("a[0] (data)", a_data, ks, m).t()
            b_data = _k_major_groups("b[0] (data)", b_data, ks, n).t()
            sa, sb = _t(sa, True), _t(sb, True)
        elif a_data.shape[0] != k_sum or b_data.shape[0] != k_sum:
            raise ValueError(
                f"a [K_sum, M] has shape {list(a_data.shape)} and b [K_sum, N] has {list(b_data.shape)}, "
                f"expected K_sum = sum(ks_cpu) = {k_sum}"
            )
        if list(a_data.shape) != [k_sum, m] or list(b_data.shape) != [k_sum, n]:
            raise ValueError(
                f"a and b: got shapes {list(a_data.shape)}, {list(b_data.shape)} for d [G, M, N] {[groups, m, n]}"
            )
        if fp8:
            flip = layout == "nt"
            _logical_shape("a[1] (scales)", sa, [k_sum // BLOCK, m], "1x128 along K", flip)
            _logical_shape("b[1] (scales)", sb, [k_sum // BLOCK, n], "1x128 along K", flip)
        _string("compiled_dims", compiled_dims)
        _output("d", d, (torch.float32,), [groups, m, n], "[G, M, N]")
        _addend(c, (torch.float32,), [groups, m, n], "[G, M, N]")
        _tensor("grouped_layout", grouped_layout, (torch.int32,), 1)
        _shape("grouped_layout", grouped_layout, [groups], "[G], the device mirror of ks_cpu")
        _stream(stream)
        _same_device(_operand_devices(a_data, sa, b_data, sb, d=d, c=c, grouped_layout=grouped_layout))
        if value_checks_enabled(grouped_layout.device) and groups and grouped_layout.cpu().tolist() != ks:
            raise ValueError(f"grouped_layout: holds {grouped_layout.cpu().tolist()}, expected ks_cpu={ks}")
        return dict(
            a=_pack(a_data, sa), b=_pack(b_data, sb), d=d, ks_cpu=ks, grouped_layout=grouped_layout, c=c, stream=stream
        )

    return check


# ------------------------------------------------------------------------------ MQA logits

LOGITS_DTYPES = (torch.float32, torch.bfloat16)


def _q_operand(q: Any, ndim: int) -> torch.Tensor:
    """``q`` as an FP8 tensor: DeepGEMM's ``(q, None)`` tuple or the tensor itself; FP4 ``(q, sf)`` is refused."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2 or not (q[1] is None or isinstance(q[1], torch.Tensor)):
            raise TypeError(f"q: got {_describe(q)}, expected an fp8 tensor or a (fp8 tensor, None) tuple")
        if q[1] is not None:
            raise NotImplementedError("q: FP4 queries with scale factors are DeepGEMM's SM100 path; pass (q, None)")
        q = q[0]
    if isinstance(q, torch.Tensor) and q.dtype in (torch.int8, torch.uint8):
        raise NotImplementedError(f"q: FP4 queries (packed e2m1 in {q.dtype}) are DeepGEMM's SM100 path")
    return _tensor("q", q, (FP8,), ndim)


def _weights(weights: Any, shape: Sequence[int], meaning: str, logits_dtype: torch.dtype) -> None:
    _tensor("weights", weights, (torch.float32, torch.bfloat16), 2)
    _shape("weights", weights, shape, meaning)
    if weights.dtype == torch.bfloat16 and logits_dtype != torch.bfloat16:
        raise TypeError("weights: bf16 weights need logits_dtype=torch.bfloat16 (DeepGEMM's rule)")


def mqa_logits_check(
    q,
    kv,
    weights,
    cu_seq_len_k_start,
    cu_seq_len_k_end,
    clean_logits=True,
    max_seqlen_k=0,
    logits_dtype=torch.float32,
    *,
    stream=None,
) -> dict[str, Any]:
    """The check of ``fp8_fp4_mqa_logits`` / ``fp8_mqa_logits``.

    Derived: ``q`` (the fp8 tensor), ``kv``, ``weights``, ``cu_seq_len_k_start``, ``cu_seq_len_k_end``,
    ``clean_logits``, ``max_seqlen_k``, ``logits_dtype``, ``stream``.
    """
    q = _q_operand(q, 3)
    kv_data, kv_scale = _fp8_operand("kv", kv, 2)
    s, h, dim = q.shape
    s_kv = kv_data.shape[0]
    _shape("kv[0] (data)", kv_data, [s_kv, dim], f"[S_kv, D={dim}]")
    _tensor("kv[1] (scales)", kv_scale, (torch.float32,), 1)
    _shape("kv[1] (scales)", kv_scale, [s_kv], "[S_kv], one per key")
    _dtype_arg("logits_dtype", logits_dtype, LOGITS_DTYPES)
    _weights(weights, [s, h], "[S, H]", logits_dtype)
    for name, x in (("cu_seq_len_k_start", cu_seq_len_k_start), ("cu_seq_len_k_end", cu_seq_len_k_end)):
        _tensor(name, x, (torch.int32,), 1)
        _shape(name, x, [s], "[S], one per query")
    _bool("clean_logits", clean_logits)
    _int("max_seqlen_k", max_seqlen_k, 0, INT32_MAX)
    _stream(stream)
    _same_device(
        {
            "q": q,
            "kv[0] (data)": kv_data,
            "kv[1] (scales)": kv_scale,
            "weights": weights,
            "cu_seq_len_k_start": cu_seq_len_k_start,
            "cu_seq_len_k_end": cu_seq_len_k_end,
        }
    )
    if value_checks_enabled(cu_seq_len_k_start.device) and s:
        ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
        bad = (ks < 0) | (ks > ke) | (ke > s_kv)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"cu_seq_len_k_start, cu_seq_len_k_end: query {i} has window [{int(ks[i])}, {int(ke[i])}), "
                f"expected 0 <= start <= end <= S_kv={s_kv}"
            )
    return dict(
        q=q,
        kv=(kv_data, kv_scale),
        weights=weights,
        cu_seq_len_k_start=cu_seq_len_k_start,
        cu_seq_len_k_end=cu_seq_len_k_end,
        clean_logits=clean_logits,
        max_seqlen_k=int(max_seqlen_k),
        logits_dtype=logits_dtype,
        stream=stream,
    )


def _context_lens(context_lens: Any, batch: int | None, next_n: int | None) -> None:
    if not isinstance(context_lens, torch.Tensor):
        raise TypeError(f"context_lens: got {_describe(context_lens)}, expected an int32 torch.Tensor")
    if context_lens.dtype != torch.int32:
        raise TypeError(f"context_lens: got dtype {context_lens.dtype}, expected torch.int32")
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens: got shape {list(context_lens.shape)}, expected [B] or [B, next_n]")
    if batch is not None:
        expected = [batch] if context_lens.dim() == 1 else [batch, next_n]
        _shape("context_lens", context_lens, expected, "[B] or [B, next_n]")


def _indices(indices: Any, batch: int) -> None:
    """DeepGEMM's varlen ``indices`` (int32 [B], each row's sequence): validated; the math does not depend on it."""
    if indices is None:
        return
    _tensor("indices", indices, (torch.int32,), 1)
    _shape("indices", indices, [batch], "[B], the sequence of each row")


def paged_mqa_metadata_check(context_lens, block_kv, num_sms, indices=None) -> dict[str, Any]:
    """The check of ``get_paged_mqa_logits_metadata``; derived: ``context_lens``, ``block_kv``, ``num_sms``."""
    _context_lens(context_lens, None, None)
    _int("block_kv", block_kv, 1, INT32_MAX)
    _int("num_sms", num_sms, 1, INT32_MAX)
    _indices(indices, context_lens.shape[0])
    _same_device(dict(context_lens=context_lens, indices=indices))
    if value_checks_enabled(context_lens.device):
        _nonnegative_lengths(context_lens)
    return dict(context_lens=context_lens, block_kv=block_kv, num_sms=num_sms)


def _nonnegative_lengths(context_lens: torch.Tensor) -> None:
    if context_lens.numel() and bool((context_lens < 0).any()):
        raise ValueError(f"context_lens: got a negative length (min {int(context_lens.min())}), expected >= 0")


def visible_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Keys row ``(b, t)`` sees, as int64 [B, next_n]: ``ctx[b] - next_n + t + 1`` (1-D) or ``ctx[b, t]`` (2-D)."""
    if context_lens.dim() == 2:
        return context_lens.long()
    offsets = torch.arange(next_n, device=context_lens.device) - next_n + 1
    return context_lens.long()[:, None] + offsets[None, :]


def paged_mqa_logits_check(
    q,
    kv_cache,
    weights,
    context_lens,
    block_table,
    schedule_meta,
    max_context_len,
    clean_logits=False,
    logits_dtype=torch.float32,
    indices=None,
    *,
    stream=None,
) -> dict[str, Any]:
    """The check of ``fp8_fp4_paged_mqa_logits`` / ``fp8_paged_mqa_logits``.

    Derived: ``q`` (the fp8 tensor), ``kv_cache``, ``weights``, ``context_lens``, ``block_table``,
    ``schedule_meta``, ``max_context_len``, ``clean_logits``, ``logits_dtype``, ``stream``.
    """
    q = _q_operand(q, 4)
    batch, next_n, h, dim = q.shape
    _tensor("kv_cache", kv_cache, (torch.uint8,), 4)
    num_blocks, block_kv = kv_cache.shape[0], kv_cache.shape[1]
    if kv_cache.shape[2] != 1 or kv_cache.shape[3] != dim + 4:
        raise ValueError(
            f"kv_cache: got shape {list(kv_cache.shape)}, expected [num_blocks, block_kv, 1, D + 4 = {dim + 4}]"
        )
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous (its bytes hold keys then scales per block)")
    _dtype_arg("logits_dtype", logits_dtype, LOGITS_DTYPES)
    _weights(weights, [batch * next_n, h], "[B * next_n, H]", logits_dtype)
    _context_lens(context_lens, batch, next_n)
    _tensor("block_table", block_table, (torch.int32,), 2)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: got shape {list(block_table.shape)}, expected [B={batch}, max_blocks]")
    _tensor("schedule_meta", schedule_meta, (torch.int32,), 2)
    if schedule_meta.shape[0] < 2 or schedule_meta.shape[1] != 2:
        raise ValueError(f"schedule_meta: got shape {list(schedule_meta.shape)}, expected [num_sms + 1, 2]")
    _int("max_context_len", max_context_len, 0, INT32_MAX)
    _bool("clean_logits", clean_logits)
    _indices(indices, batch)
    _stream(stream)
    _same_device(
        dict(
            q=q,
            kv_cache=kv_cache,
            weights=weights,
            context_lens=context_lens,
            block_table=block_table,
            schedule_meta=schedule_meta,
            indices=indices,
        )
    )
    if value_checks_enabled(block_table.device):
        _paged_values(context_lens, block_table, schedule_meta, next_n, num_blocks, block_kv, max_context_len)
    return dict(
        q=q,
        kv_cache=kv_cache,
        weights=weights,
        context_lens=context_lens,
        block_table=block_table,
        schedule_meta=schedule_meta,
        max_context_len=max_context_len,
        clean_logits=clean_logits,
        logits_dtype=logits_dtype,
        stream=stream,
    )


def paged_mqa_logits_signature(fp4_form: bool) -> Callable[..., tuple[tuple, tuple] | None]:
    """The hot-lane signature of ``fp8_fp4_paged_mqa_logits`` (``fp4_form``) or ``fp8_paged_mqa_logits``:
    ``(key, (q, kv_cache, weights, context_lens, block_table, schedule_meta))`` or ``None`` (the full path).

    The key holds the shape, dtype and device of every tensor, ``max_context_len``, ``clean_logits`` and
    ``logits_dtype``. Calls with a ``stream``, ``indices``, a non-contiguous tensor, dtypes other than the
    canonical ones (fp8 ``q``, uint8 cache, int32 lengths/table/schedule, fp32 weights or bf16 with bf16
    logits), tensors on several devices, or with value checks on (``TILEGEMM_CHECK_VALUES=1``) take the full path.
    """
    tensor, u8, i32, f32, bf16 = torch.Tensor, torch.uint8, torch.int32, torch.float32, torch.bfloat16

    def key_of(
        q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits, logits_dtype
    ):
        if type(q) is tuple and fp4_form:
            if len(q) != 2 or q[1] is not None:
                return None
            q = q[0]
        tensors = (q, kv_cache, weights, context_lens, block_table, schedule_meta)
        if not all(isinstance(t, tensor) and t.is_contiguous() for t in tensors):
            return None
        if q.dtype is not FP8 or kv_cache.dtype is not u8:
            return None
        if context_lens.dtype is not i32 or block_table.dtype is not i32 or schedule_meta.dtype is not i32:
            return None
        if type(max_context_len) is not int or type(clean_logits) is not bool or logits_dtype not in LOGITS_DTYPES:
            return None
        if weights.dtype is not f32 and not (weights.dtype is bf16 and logits_dtype is bf16):
            return None
        device = q.get_device()
        if any(t.get_device() != device for t in tensors) or env_flag(CHECK_VALUES, default=False):
            return None
        key = (
            "paged_mqa_logits",
            q.shape,
            kv_cache.shape,
            weights.shape,
            weights.dtype,
            context_lens.shape,
            block_table.shape,
            schedule_meta.shape,
            device,
            max_context_len,
            clean_logits,
            logits_dtype,
        )
        return key, (q, *tensors[1:])

    def call(*values):  # the stub's parameters in order; logits_dtype only in the fp8_fp4 form
        *arguments, indices, stream = values
        if indices is not None or stream is not None:
            return None
        return key_of(*arguments) if fp4_form else key_of(*arguments, f32)

    return call


def _paged_values(
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    next_n: int,
    num_blocks: int,
    block_kv: int,
    max_context_len: int,
) -> None:
    """The value checks of the paged MQA logits: lengths, the block table, the schedule."""
    _nonnegative_lengths(context_lens)
    visible = visible_lengths(context_lens, next_n)
    if visible.numel():
        _paged_block_table(visible, block_table, num_blocks, block_kv, max_context_len)
    expected = paged_mqa_schedule(context_lens, block_kv, schedule_meta.shape[0] - 1)
    if not torch.equal(schedule_meta, expected):
        raise ValueError(
            "schedule_meta: does not match get_paged_mqa_logits_metadata(context_lens, block_kv="
            f"{block_kv}, num_sms={schedule_meta.shape[0] - 1}) (built for other lengths or another block size?)"
        )


def _paged_block_table(
    visible: torch.Tensor, block_table: torch.Tensor, num_blocks: int, block_kv: int, max_context_len: int
) -> None:
    """Every row's visible keys fit ``max_context_len`` and the table, whose used entries name real blocks."""
    longest = int(visible.max())
    if longest > max_context_len:
        raise ValueError(f"max_context_len: got {max_context_len}, but a row sees {longest} keys")
    if longest > block_table.shape[1] * block_kv:
        raise ValueError(
            f"block_table: {block_table.shape[1]} blocks of {block_kv} keys cover {block_table.shape[1] * block_kv} "
            f"keys, but a row sees {longest}"
        )
    used_blocks = (visible.max(dim=1).values.clamp(min=0) + block_kv - 1) // block_kv
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    used = cols[None, :] < used_blocks[:, None]
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        b, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"block_table: batch {b} slot {col} holds block {int(block_table[b, col])}, "
            f"expected 0..{num_blocks - 1} (kv_cache has {num_blocks} blocks)"
        )


# ----------------------------------------------------------------------- einsum, prenorm

#: DeepGEMM's einsum expressions: expr -> (a dims, b dims, d dims), each a string of dim letters.
EINSUM_EXPRS = {
    "bmk,bnk->mn": ("bmk", "bnk", "mn"),
    "bhr,hdr->bhd": ("bhr", "hdr", "bhd"),
    "bhd,hdr->bhr": ("bhd", "hdr", "bhr"),
}
#: DeepGEMM's FP8 einsum expressions: expr -> (a dims, b dims, d dims, K letter).
FP8_EINSUM_EXPRS = {
    "bhr,hdr->bhd": ("bhr", "hdr", "bhd", "r"),
    "bhd,hdr->bhr": ("bhd", "hdr", "bhr", "d"),
    "bhd,bhr->hdr": ("bhd", "bhr", "hdr", "b"),
}


def _einsum_sizes(expr: str, a_dims: str, b_dims: str, a: torch.Tensor, b: torch.Tensor) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name, dims, x in (("a", a_dims, a), ("b", b_dims, b)):
        for letter, size in zip(dims, x.shape):
            if sizes.setdefault(letter, size) != size:
                raise ValueError(
                    f"{name}: dim {letter!r} has size {size}, but another operand has {sizes[letter]} ({expr})"
                )
    return sizes


def _einsum_expr(expr: Any, table: dict[str, tuple]) -> tuple:
    if expr not in table:
        raise ValueError(f"expr: got {expr!r}, expected one of {sorted(table)} (DeepGEMM's einsum expressions)")
    return table[expr]


def einsum_check(expr, a, b, d, c=None, use_cublaslt=False, *, stream=None) -> dict[str, Any]:
    """The check of ``einsum`` (BF16); derived: ``expr``, ``a``, ``b``, ``d``, ``c``, ``stream``."""
    a_dims, b_dims, d_dims = _einsum_expr(expr, EINSUM_EXPRS)
    _tensor("a", a, (torch.bfloat16,), 3)
    _tensor("b", b, (torch.bfloat16,), 3)
    sizes = _einsum_sizes(expr, a_dims, b_dims, a, b)
    out_shape = [sizes[x] for x in d_dims]
    _output("d", d, OUT_DTYPES, out_shape, f"[{', '.join(d_dims.upper())}]")
    if c is not None:
        _tensor("c", c, (d.dtype,), len(out_shape))
        _shape("c", c, out_shape, "d's shape")
    _bool("use_cublaslt", use_cublaslt)
    _stream(stream)
    _same_device(dict(a=a, b=b, d=d, c=c))
    return dict(expr=expr, a=a, b=b, d=d, c=c, stream=stream)


def fp8_einsum_check(expr, a, b, d, c=None, recipe=(1, 128, 128), *, stream=None) -> dict[str, Any]:
    """The check of ``fp8_einsum``: scales in the data's orientation, ``/128`` along K (and along N for 128x128).

    ``bhr,hdr->bhd`` / ``bhd,hdr->bhr``: sa ``[B, H, K/128]``; sb ``[H, D/128, R/128]`` (recipe
    ``(1, 128, 128)``). ``bhd,bhr->hdr`` (recipe ``(1, 1, 128)``): sa ``[B/128, H, D]``, sb ``[B/128, H, R]``.
    Derived: ``expr``, ``a``, ``b``, ``d``, ``c``, ``recipe``, ``stream``.
    """
    a_dims, b_dims, d_dims, k_dim = _einsum_expr(expr, FP8_EINSUM_EXPRS)
    a_data, sa, b_data, sb = _operands(True, a, b, 3, 3)
    sizes = _einsum_sizes(expr, a_dims, b_dims, a_data, b_data)
    rec = _int_tuple("recipe", recipe, 3)
    _gran_k("recipe", rec[2])
    want = (1, 1, 128) if k_dim == "b" else (1, 128, 128)
    if rec != want:
        raise ValueError(f"recipe: {expr} takes recipe {want}, got {rec}")

    def scale_shape(dims: str, per_block: str) -> list[int]:
        return [cdiv(sizes[x], BLOCK) if x in per_block else sizes[x] for x in dims]

    if k_dim == "b":
        sa_shape, sb_shape = scale_shape(a_dims, "b"), scale_shape(b_dims, "b")
    else:
        sa_shape, sb_shape = scale_shape(a_dims, k_dim), scale_shape(b_dims, "dr")
    _shape("a[1] (scales)", sa, sa_shape, "in the data's orientation")
    _shape("b[1] (scales)", sb, sb_shape, "in the data's orientation")
    out_shape = [sizes[x] for x in d_dims]
    _output("d", d, OUT_DTYPES, out_shape, f"[{', '.join(d_dims.upper())}]")
    _addend(c, OUT_DTYPES, out_shape, "d's shape")
    _stream(stream)
    _same_device(_operand_devices(a_data, sa, b_data, sb, d=d, c=c))
    return dict(expr=expr, a=(a_data, sa), b=(b_data, sb), d=d, c=c, recipe=rec, stream=stream)


def tf32_hc_prenorm_gemm_check(a, b, d, sqr_sum, num_splits=None, *, stream=None) -> dict[str, Any]:
    """The check of ``tf32_hc_prenorm_gemm``; derived: ``a``, ``b``, ``d``, ``sqr_sum``, ``num_splits``, ``stream``."""
    _tensor("a", a, (torch.bfloat16,), 2)
    _tensor("b", b, (torch.float32,), 2)
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"a [M, K] has shape {list(a.shape)} but b [N, K] has {list(b.shape)}")
    if num_splits is None:
        _output("d", d, (torch.float32,), [m, n], "[M, N]")
        _output("sqr_sum", sqr_sum, (torch.float32,), [m], "[M]")
    else:
        _int("num_splits", num_splits, 1)
        _output("d", d, (torch.float32,), [num_splits, m, n], "[num_splits, M, N]")
        _output("sqr_sum", sqr_sum, (torch.float32,), [num_splits, m], "[num_splits, M]")
    _stream(stream)
    _same_device(dict(a=a, b=b, d=d, sqr_sum=sqr_sum))
    return dict(a=a, b=b, d=d, sqr_sum=sqr_sum, num_splits=num_splits, stream=stream)


# ------------------------------------------------------------------------------- RMSNorm

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def rms_norm_check(x, weight, eps=1e-6, *, stream=None) -> dict[str, Any]:
    """The check of ``rms_norm``: float ``x [..., H]`` (at least 1-D), float ``weight [H]``, ``eps`` a finite real
    number >= 0; derived: ``x``, ``weight``, ``eps`` (a float), ``stream``."""
    _tensor("x", x, _FLOATS, None)
    if x.dim() < 1:
        raise ValueError("x: got a 0-D tensor, expected [..., H] (the norm runs over the last dimension)")
    _tensor("weight", weight, _FLOATS, 1)
    _shape("weight", weight, [x.shape[-1]], "[H], one per element of x's last dimension")
    eps = _scalar("eps", eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: got {eps}, expected a finite number >= 0")
    _stream(stream)
    _same_device(dict(x=x, weight=weight))
    return dict(x=x, weight=weight, eps=eps, stream=stream)


# ----------------------------------------------------------------------------- MoE experts

#: Gated activations ``moe_experts`` knows (the reference implements all of them).
MOE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _moe_tokens_check(hidden, topk_ids, topk_weights, hidden_dtypes) -> int:
    """The token side of both experts ops: ``hidden [T, H]`` of ``hidden_dtypes``, int ``topk_ids [T, k]``, float
    ``topk_weights [T, k]``; returns H."""
    _tensor("hidden", hidden, hidden_dtypes, 2)
    tokens, hidden_dim = hidden.shape
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), 2)
    if topk_ids.shape[0] != tokens:
        raise ValueError(f"topk_ids: got shape {list(topk_ids.shape)}, expected [T={tokens}, k] to match hidden")
    _tensor("topk_weights", topk_weights, _FLOATS, 2)
    _shape("topk_weights", topk_weights, [tokens, topk_ids.shape[1]], "[T, k], like topk_ids")
    return hidden_dim


def _moe_activation_check(activation: str) -> None:
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"activation: got {activation!r}, expected one of {list(MOE_ACTIVATIONS)}")


def moe_experts_check(hidden, topk_ids, topk_weights, w13, w2, activation="silu", *, stream=None) -> dict[str, Any]:
    """The check of ``moe_experts`` (shapes, dtypes, devices; no value checks: any expert id is allowed)."""
    hidden_dim = _moe_tokens_check(hidden, topk_ids, topk_weights, _FLOATS)
    _tensor("w13", w13, (hidden.dtype,), 3)
    experts, two_inter, h13 = w13.shape
    if two_inter % 2 or h13 != hidden_dim:
        raise ValueError(f"w13: got shape {list(w13.shape)}, expected [E, 2I, H={hidden_dim}] (gate rows then up rows)")
    _tensor("w2", w2, (hidden.dtype,), 3)
    _shape("w2", w2, [experts, hidden_dim, two_inter // 2], "[E, H, I] to match w13 [E, 2I, H]")
    _moe_activation_check(activation)
    _stream(stream)
    _same_device(dict(hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w2=w2))
    return dict(
        hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13, w2=w2, activation=activation,
        stream=stream,
    )  # fmt: skip


def moe_experts_backward_check(
    grad_out, hidden, topk_weights, w13, w2, state, activation="silu", needs=(True, True, True, True), *, stream=None
) -> dict[str, Any]:
    """The check of ``moe_experts_backward``: the forward's operands, ``grad_out`` like the output and a
    ``MoETrainState`` of matching shapes (its values are the forward's own: not read here)."""
    from tilegemm.ops.common import MoETrainState
    from tilegemm.routing import ALIGNED_ROWS, max_padded_rows

    if not isinstance(state, MoETrainState):
        raise TypeError(f"state: got {_describe(state)}, expected the MoETrainState of moe_experts_forward")
    _tensor("state.dest", state.dest, (torch.int32,), 2)
    moe_experts_check(hidden, state.dest, topk_weights, w13, w2, activation)
    _tensor("grad_out", grad_out, (hidden.dtype,), 2)
    _shape("grad_out", grad_out, list(hidden.shape), "[T, H], like the output")
    (tokens, hidden_dim), top_k = hidden.shape, state.dest.shape[1]
    experts, inter = w13.shape[0], w2.shape[2]
    rows = max_padded_rows(tokens, top_k, experts, ALIGNED_ROWS)
    expected = {
        "row_token": ((torch.int32,), [rows]), "row_weight": ((torch.float32,), [rows]),
        "ends": ((torch.int32,), [experts]), "gate_up": ((hidden.dtype,), [rows, 2 * inter]),
        "h": ((hidden.dtype,), [rows, inter]), "y": ((hidden.dtype,), [rows, hidden_dim]),
    }  # fmt: skip
    for name, (dtypes, shape) in expected.items():
        _tensor(f"state.{name}", getattr(state, name), dtypes, len(shape))
        _shape(f"state.{name}", getattr(state, name), shape, "as moe_experts_forward made it")
    if not (isinstance(needs, (tuple, list)) and len(needs) == 4 and all(isinstance(n, bool) for n in needs)):
        raise TypeError(f"needs: got {_describe(needs)}, expected four bools (hidden, topk_weights, w13, w2)")
    _same_device(dict(grad_out=grad_out, hidden=hidden, **state._asdict()))
    return dict(
        grad_out=grad_out, hidden=hidden, topk_weights=topk_weights, w13=w13, w2=w2, state=state,
        activation=activation, needs=tuple(needs), stream=stream,
    )  # fmt: skip


def fp8_moe_experts_check(hidden, topk_ids, topk_weights, w13, w2, activation="silu", *, stream=None) -> dict[str, Any]:
    """The check of ``fp8_moe_experts``: bf16 ``hidden [T, H]``, FP8 ``w13`` / ``w2`` tuples with 128x128 block
    scales, H and I multiples of 128 (the 1x128 activation blocks); no value checks (any expert id is allowed)."""
    hidden_dim = _moe_tokens_check(hidden, topk_ids, topk_weights, (torch.bfloat16,))
    w13_data, w13_scales = _fp8_operand("w13", w13, 3)
    experts, two_inter, h13 = w13_data.shape
    if two_inter % 2 or h13 != hidden_dim:
        raise ValueError(
            f"w13[0]: got shape {list(w13_data.shape)}, expected [E, 2I, H={hidden_dim}] (gate rows then up rows)"
        )
    inter = two_inter // 2
    if hidden_dim % 128 or inter % 128:
        raise ValueError(f"fp8_moe_experts: H={hidden_dim} and I={inter} must be multiples of 128 (1x128 blocks)")
    _shape("w13[1]", w13_scales, [experts, two_inter // 128, hidden_dim // 128], "128x128 block scales of w13")
    w2_data, w2_scales = _fp8_operand("w2", w2, 3)
    _shape("w2[0]", w2_data, [experts, hidden_dim, inter], "[E, H, I] to match w13 [E, 2I, H]")
    _shape("w2[1]", w2_scales, [experts, hidden_dim // 128, inter // 128], "128x128 block scales of w2")
    _moe_activation_check(activation)
    _stream(stream)
    _same_device(
        {
            "hidden": hidden, "topk_ids": topk_ids, "topk_weights": topk_weights, "w13[0]": w13_data,
            "w13[1]": w13_scales, "w2[0]": w2_data, "w2[1]": w2_scales,
        }
    )  # fmt: skip
    return dict(
        hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=(w13_data, w13_scales),
        w2=(w2_data, w2_scales), activation=activation, stream=stream,
    )  # fmt: skip


# ------------------------------------------------------------------ differentiable functions


def matmul_check(a: Any, b: Any) -> None:
    """The check of ``tilegemm.matmul``: bf16 ``a [M, K]``, ``b [K, N]`` on one device."""
    _tensor("a", a, (torch.bfloat16,), 2)
    _tensor("b", b, (torch.bfloat16,), 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a [M, K] has shape {list(a.shape)} but b [K, N] has {list(b.shape)}: K differs")
    _same_device(dict(a=a, b=b))


#: The dtypes :func:`tilegemm.grouped_matmul` trains in (fp16/fp32 on the ``pytorch`` backend's exact ops).
GROUPED_MATMUL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def grouped_matmul_check(x: Any, w: Any, offs: Any, transposed: bool = False) -> None:
    """The check of ``tilegemm.grouped_matmul``: ``x [M, K]`` and ``w [G, N, K]`` (``[G, K, N]`` when
    ``transposed``) of one dtype among :data:`GROUPED_MATMUL_DTYPES`, int32 ``offs [G]``.

    The values of ``offs`` (non-decreasing, within ``0..M``) are checked when value checks run and the
    call is not being traced by ``torch.compile``.
    """
    _tensor("x", x, GROUPED_MATMUL_DTYPES, 2)
    _tensor("w", w, GROUPED_MATMUL_DTYPES, 3)
    if w.dtype != x.dtype:
        raise TypeError(f"w: got dtype {w.dtype}, expected x's dtype {x.dtype} (one dtype for x and w)")
    if not isinstance(transposed, bool):
        raise TypeError(f"transposed: got {type(transposed).__name__}, expected bool")
    k_dim, form = (1, "[G, K, N]") if transposed else (2, "[G, N, K]")
    if x.shape[1] != w.shape[k_dim]:
        raise ValueError(f"x [M, K] has shape {list(x.shape)} but w {form} has {list(w.shape)}: K differs")
    _tensor("offs", offs, (torch.int32,), 1)
    _same_device(dict(x=x, w=w, offs=offs))
    if torch.compiler.is_compiling():
        _shape("offs", offs, [w.shape[0]], "[G] cumulative group end rows")
    else:
        check_group_offsets(offs, x.shape[0], w.shape[0], name="offs")


def fp8_weight_check(w_fp8: Any, w: torch.Tensor) -> None:
    """``w_fp8`` is the 128x128-block FP8 copy of ``w [..., N, K]``: ``(float8_e4m3fn [..., N, K], fp32
    [..., ceil(N/128), ceil(K/128)])`` on ``w``'s device."""
    data, scale = _fp8_operand("w_fp8", w_fp8, w.dim())
    _shape("w_fp8[0]", data, list(w.shape), "the shape of w")
    blocks = [*w.shape[:-2], cdiv(w.shape[-2], BLOCK), cdiv(w.shape[-1], BLOCK)]
    _shape("w_fp8[1]", scale, blocks, "one fp32 scale per 128x128 block of w")
    _same_device({"w": w, "w_fp8[0]": data, "w_fp8[1]": scale})


def fp8_linear_check(x: Any, weight: Any, bias: Any) -> None:
    """The check of ``tilegemm.fp8_linear``: bf16 ``x [..., K]``, ``weight [N, K]``, ``bias`` None or bf16 [N]."""
    _tensor("x", x, (torch.bfloat16,), None)
    if x.dim() == 0:
        raise ValueError("x: got a 0-D tensor, expected [..., K]")
    _tensor("weight", weight, (torch.bfloat16,), 2)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., K] has shape {list(x.shape)} but weight [N, K] has {list(weight.shape)}: K differs")
    if bias is not None:
        _tensor("bias", bias, (torch.bfloat16,), 1)
        _shape("bias", bias, [weight.shape[0]], "[N], one per output feature")
    _same_device(dict(x=x, weight=weight, bias=bias))


# ------------------------------------------------------------------- quantization helpers


def _real_tensor(fn: str, name: str, x: Any, min_dim: int, max_dim: int | None = None) -> torch.Tensor:
    """``x`` as a floating tensor with ``min_dim..max_dim`` dims and values (not on the meta device)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name}: got {_describe(x)}, expected a floating torch.Tensor")
    if not x.is_floating_point():
        raise TypeError(f"{fn}: {name}: got dtype {x.dtype}, expected a floating dtype")
    if x.dim() < min_dim or (max_dim is not None and x.dim() > max_dim):
        dims = (
            f"{min_dim}"
            if max_dim == min_dim
            else f"at least {min_dim}"
            if max_dim is None
            else f"{min_dim} to {max_dim}"
        )
        raise ValueError(f"{fn}: {name}: got shape {list(x.shape)}, expected {dims} dims")
    return x


def quant_input_check(fn: str, x: Any, min_dim: int, max_dim: int | None, gran_k: Any, use_ue8m0: Any) -> None:
    """The check of the FP8 casts: a floating ``x`` of ``min_dim..max_dim`` dims, ``gran_k >= 1``, a bool flag."""
    _real_tensor(fn, "x", x, min_dim, max_dim)
    _int(f"{fn}: gran_k", gran_k, 1)
    _bool(f"{fn}: use_ue8m0", use_ue8m0)


def scale_tensor_check(fn: str, sf: Any, min_dim: int, max_dim: int | None) -> None:
    """The check of the scale-layout helpers' ``sf``: a floating tensor of ``min_dim..max_dim`` dims."""
    _real_tensor(fn, "sf", sf, min_dim, max_dim)


def ceil_to_ue8m0_check(x: Any) -> None:
    """The check of ``ceil_to_ue8m0``: a real (not bool, not complex) tensor of any shape, 0-d included."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"ceil_to_ue8m0: x: got {_describe(x)}, expected a torch.Tensor")
    if x.dtype == torch.bool or x.dtype.is_complex:
        raise TypeError(f"ceil_to_ue8m0: x: got dtype {x.dtype}, expected a real dtype (float32 in practice)")


def pack_ue8m0_check(x: Any) -> None:
    """The check of ``pack_ue8m0_to_int``: a float32 tensor ``[..., K]`` with K a multiple of 4."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"pack_ue8m0_to_int: x: got {_describe(x)}, expected a float32 torch.Tensor")
    if x.dtype != torch.float32:
        raise TypeError(f"pack_ue8m0_to_int: x: got dtype {x.dtype}, expected torch.float32 powers of two")
    if x.dim() == 0 or x.shape[-1] % 4:
        raise ValueError(f"pack_ue8m0_to_int: x: got shape {list(x.shape)}, expected [..., K] with K % 4 == 0")


def tma_aligned_size_check(x: Any, element_size: Any) -> None:
    """The check of ``get_tma_aligned_size``: ``x >= 0`` and ``element_size >= 1`` ints."""
    _int("get_tma_aligned_size: x", x, 0)
    _int("get_tma_aligned_size: element_size", element_size, 1)


def transform_sf_check(
    mn: Any, k: Any, recipe: Any, num_groups: Any, is_sfa: Any, disable_ue8m0_cast: Any
) -> tuple[int, ...]:
    """The non-tensor arguments of ``transform_sf_into_required_layout``; returns ``recipe`` as ints."""
    fn = "transform_sf_into_required_layout"
    _int(f"{fn}: mn", mn, 0)
    _int(f"{fn}: k", k, 0)
    if num_groups is not None:
        _int(f"{fn}: num_groups", num_groups, 0)
    if is_sfa is not None:
        _bool(f"{fn}: is_sfa", is_sfa)
    _bool(f"{fn}: disable_ue8m0_cast", disable_ue8m0_cast)
    if not isinstance(recipe, (tuple, list)):
        raise TypeError(f"{fn}: recipe: got {_describe(recipe)}, expected a tuple of 2 or 3 ints")
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in recipe):
        raise TypeError(f"{fn}: recipe: got {recipe!r}, expected a tuple of 2 or 3 ints")
    return tuple(int(v) for v in recipe)


def k_grouped_ue8m0_check(
    sf: Any, grouped_layout: Any, ks_cpu: Any, gran_k: Any, k_alignment: Any, use_psum_layout: Any
) -> None:
    """The check of ``get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor``'s arguments.

    ``sf`` a floating 2-D tensor; ``ks_cpu`` None or a list/tuple of ints >= 0; ``grouped_layout`` an
    integer 1-D tensor wherever it is read (``use_psum_layout``, or no ``ks_cpu``).
    """
    fn = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
    _real_tensor(fn, "sf", sf, 2, 2)
    _int(f"{fn}: gran_k", gran_k, 1)
    _int(f"{fn}: k_alignment", k_alignment, 1)
    _bool(f"{fn}: use_psum_layout", use_psum_layout)
    if ks_cpu is not None:
        if not isinstance(ks_cpu, (tuple, list)):
            raise TypeError(f"{fn}: ks_cpu: got {_describe(ks_cpu)}, expected None or a list of ints")
        for v in ks_cpu:
            _int(f"{fn}: ks_cpu", v, 0)
    if use_psum_layout or not ks_cpu:
        if not isinstance(grouped_layout, torch.Tensor):
            raise TypeError(f"{fn}: grouped_layout: got {_describe(grouped_layout)}, expected an int torch.Tensor")
        if grouped_layout.is_floating_point() or grouped_layout.is_complex() or grouped_layout.dtype == torch.bool:
            raise TypeError(f"{fn}: grouped_layout: got dtype {grouped_layout.dtype}, expected an integer dtype")
        if grouped_layout.dim() != 1:
            raise ValueError(f"{fn}: grouped_layout: got shape {list(grouped_layout.shape)}, expected 1-D")


def calc_diff_check(x: Any, y: Any) -> None:
    """The check of ``calc_diff``: two tensors of one shape on one device, with values (not meta)."""
    for name, t in (("x", x), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"calc_diff: {name}: got {_describe(t)}, expected a torch.Tensor")
    if x.device != y.device:
        raise ValueError(f"calc_diff: x is on {x.device} but y is on {y.device}, expected one device")
    for name, t in (("x", x), ("y", y)):
        if t.device.type == "meta":
            raise ValueError(f"calc_diff: {name}: a meta tensor has no values")
    if x.shape != y.shape:
        raise ValueError(f"calc_diff: x has shape {list(x.shape)} but y has {list(y.shape)}, expected one shape")
