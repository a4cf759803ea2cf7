"""What the op-family modules of ``tilegemm.ops.api`` share: the annotation aliases, :func:`op` and the signature
edits that make one written stub serve several ops (:func:`retyped`, :func:`fp8_form`)."""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch

from tilegemm.backend.registry import dispatch

Tensor = torch.Tensor
FP8Operand = tuple[torch.Tensor, torch.Tensor]
Recipe = tuple[int, int, int]

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD

#: DeepGEMM's FP8 recipe parameters, before ``compiled_dims`` in every FP8 GEMM that also has a BF16 form.
_RECIPE_PARAMETERS = (
    inspect.Parameter("recipe", _POSITIONAL, default=None, annotation="Recipe | None"),
    inspect.Parameter("recipe_a", _POSITIONAL, default=None, annotation="tuple[int, int] | None"),
    inspect.Parameter("recipe_b", _POSITIONAL, default=None, annotation="tuple[int, int] | None"),
)
#: After ``compiled_dims`` in those ops.
_UE8M0_PARAMETER = inspect.Parameter("disable_ue8m0_cast", _POSITIONAL, default=False, annotation="bool")


def _copy(stub: Any) -> Any:
    """A new function of ``stub``'s code, defaults, annotations and attributes (its signature among them)."""
    copy = types.FunctionType(stub.__code__, stub.__globals__, stub.__name__, stub.__defaults__, stub.__closure__)
    copy.__kwdefaults__ = stub.__kwdefaults__
    copy.__annotations__ = dict(stub.__annotations__)
    copy.__dict__.update(stub.__dict__)
    return copy


def op(name: str, stub: Any, doc: str, check: Any, signature: Any = None) -> Any:
    """Public op ``name`` from ``stub``, a signature written once for several ops (a family's layouts): a copy of the
    stub under that name with docstring ``doc``, through ``dispatch(name, check=check, signature=signature)``."""
    stub = _copy(stub)
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = doc
    return dispatch(name, check=check, signature=signature)(stub)


def _with_signature(stub: Any, signature: inspect.Signature) -> Any:
    """A copy of ``stub`` with ``signature`` in place of its own, its ``__annotations__`` made to match."""
    stub = _copy(stub)
    stub.__signature__ = signature
    annotations = {p.name: p.annotation for p in signature.parameters.values() if p.annotation is not p.empty}
    if signature.return_annotation is not signature.empty:
        annotations["return"] = signature.return_annotation
    stub.__annotations__ = annotations
    return stub


def retyped(stub: Any, drop: tuple[str, ...] = (), returns: str | None = None, **annotations: str) -> Any:
    """A copy of ``stub`` without the parameters ``drop``, with the annotations ``annotations`` (parameter name ->
    annotation) and ``returns`` (the return annotation) in place of its own."""
    signature = inspect.signature(stub)
    parameters = [
        p.replace(annotation=annotations.get(p.name, p.annotation))
        for p in signature.parameters.values()
        if p.name not in drop
    ]
    return_annotation = signature.return_annotation if returns is None else returns
    return _with_signature(stub, signature.replace(parameters=parameters, return_annotation=return_annotation))


def fp8_form(stub: Any) -> Any:
    """DeepGEMM's FP8 form of the BF16 GEMM ``stub``: ``a`` and ``b`` FP8 operands, the recipe parameters
    (``recipe``, ``recipe_a``, ``recipe_b``) before ``compiled_dims`` and ``disable_ue8m0_cast`` after it."""
    signature = inspect.signature(stub)
    parameters = []
    for p in signature.parameters.values():
        if p.name in ("a", "b"):
            p = p.replace(annotation="FP8Operand")
        if p.name == "compiled_dims":
            parameters += [*_RECIPE_PARAMETERS, p, _UE8M0_PARAMETER]
        else:
            parameters.append(p)
    return _with_signature(stub, signature.replace(parameters=parameters))
