"""Checks of the dense GEMMs (``{bf16,fp8_fp4}_gemm_<layout>``, ``cublaslt_gemm_<layout>``,
``fp8_gemm_nt_skip_head_mid``) and the dense ops' hot-lane keys."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from tilegemm import config
from tilegemm.env import DECODE_VARIANT
from tilegemm.ops.checks import hot
from tilegemm.ops.checks.base import (
    BLOCK,
    FP8,
    LAYOUT_SHAPES,
    LAYOUTS,
    OUT_DTYPES,
    _addend,
    _bool,
    _gemm_placement,
    _int_tuple,
    _logical_shape,
    _operands,
    _output,
    _pack,
    _scalar,
    _shape,
    _string,
    _t,
    _tensor,
    resolve_recipe,
)
from tilegemm.ops.common import cdiv


def _nt_form(layout: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``layout``'s matrices ``a`` and ``b`` as views in the ``nt`` form, a [M, K] and b [N, K].

    Raises:
        ValueError: they disagree on K (the message gives ``layout``'s shapes).
    """
    flip_a, flip_b = LAYOUTS[layout]
    la, lb = _t(a, flip_a), _t(b, flip_b)
    k, kb = la.shape[1], lb.shape[1]
    if k != kb:
        a_shape, b_shape = LAYOUT_SHAPES[layout]
        raise ValueError(
            f"a and b disagree on K for layout {layout} (a {a_shape}, b {b_shape}): "
            f"a has shape {list(a.shape)} (K={k}), b has shape {list(b.shape)} (K={kb})"
        )
    return la, lb


def dense_gemm_check(layout: str, fp8: bool) -> Callable[..., dict[str, Any]]:
    """The check of ``{bf16,fp8_fp4}_gemm_<layout>``; returns the logical ``nt`` form.

    Derived: ``a`` [M, K] (``(data, sa [M, K/128])`` for FP8), ``b`` [N, K] (``(data, sb)``, sb
    ``[N/128, K/128]`` or ``[N, K/128]``), ``d``, ``c``, ``recipe`` (FP8, resolved), ``alpha``,
    ``beta``, ``stream``.
    """
    flip_a, flip_b = LAYOUTS[layout]

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
        la, lb = _nt_form(layout, a_data, b_data)
        (m, k), n = la.shape, lb.shape[0]
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
        _gemm_placement(stream, a_data, sa, b_data, sb, d=d, c=c)
        return dict(a=_pack(la, sa), b=_pack(lb, sb), d=d, c=c, **derived, alpha=alpha, beta=beta, stream=stream)

    return check


# The hot lane (see tilegemm.backend.registry): a signature holds everything a check and a launch plan read
# from a call, so that a signature which passed once passes again. Only the canonical dtypes and 16-byte
# aligned tensors take it (the fp16/fp32 operands that allow_float_operands admits depend on a thread-local
# setting, not on the call). Written for speed: it runs on every call.


def cublaslt_gemm_check(layout: str) -> Callable[..., dict[str, Any]]:
    """The check of ``cublaslt_gemm_<layout>`` (DeepGEMM's cuBLASLt GEMM); returns the logical ``nt`` form.

    ``a`` and ``b`` are bare tensors of one dtype, bf16 or float8_e4m3fn (unscaled FP8, as DeepGEMM takes them),
    in ``layout``'s shapes; ``d`` bf16/fp32 [M, N]; ``c`` (optional) of ``d``'s shape.
    Derived: ``a`` [M, K], ``b`` [N, K], ``d``, ``c``, ``stream``.
    """

    def check(a, b, d, c=None, *, stream=None) -> dict[str, Any]:
        _tensor("a", a, (torch.bfloat16, FP8), 2)
        _tensor("b", b, (torch.bfloat16, FP8), 2)
        if a.dtype != b.dtype:
            raise TypeError(f"b: got dtype {b.dtype}, expected a's dtype {a.dtype} (both bf16 or both float8_e4m3fn)")
        la, lb = _nt_form(layout, a, b)
        m, n = la.shape[0], lb.shape[0]
        _output("d", d, OUT_DTYPES, [m, n], "[M, N]")
        _addend(c, OUT_DTYPES, [m, n], "[M, N]")
        _gemm_placement(stream, a, None, b, None, d=d, c=c)
        return dict(a=la, b=lb, d=d, c=c, stream=stream)

    return check


def _settings() -> tuple[int, str | None]:
    """The global settings the dense plans read: ``set_num_sms`` and ``$TILEGEMM_DECODE_VARIANT``."""
    return config._num_sms, os.environ.get(DECODE_VARIANT)


def dense_gemm_signature(layout: str, fp8: bool) -> hot.HotLane:
    """The hot-lane key of ``{bf16,fp8_fp4}_gemm_<layout>``: the replay takes ``(a, b, d, c, alpha, beta)`` with
    ``a``/``b`` in the logical ``nt`` form :func:`dense_gemm_check` derives.

    The key holds the shape, strides, dtype and device of every tensor, ``alpha``, ``beta``, the recipe
    arguments, ``compiled_dims``, the ``set_num_sms`` setting and ``$TILEGEMM_DECODE_VARIANT``. Calls with a
    ``stream``, non-float ``alpha``/``beta``, an output that requires grad, a tensor not 16-byte aligned, or
    operands of other than the canonical dtypes (the fp16/fp32 operands that ``allow_float_operands`` admits
    depend on a thread-local setting, not on the call) take the full path.
    """
    flip_a, flip_b = LAYOUTS[layout]
    operand = hot.pair(FP8, torch.float32) if fp8 else hot.tensor(torch.bfloat16)
    flip = hot.transpose_pair if fp8 else hot.transpose
    kinds = dict(
        a=operand,
        b=operand,
        d=hot.output(*OUT_DTYPES),
        c=hot.optional(hot.tensor(*OUT_DTYPES)),
        **hot.RECIPE_KINDS,
        alpha=hot.exact(float),
        beta=hot.exact(float),
        stream=hot.none,
    )
    operands = dict(a=flip if flip_a else None, b=flip if flip_b else None, d=None, c=None, alpha=None, beta=None)
    return hot.HotLane(kinds, operands, setting=_settings)


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
    _gemm_placement(stream, a_data, sa, b_data, sb, d=d)
    return dict(a=(a_data, sa), b=(b_data, sb), d=d, head_splits=(left, mid, right), recipe=rec, stream=stream)
