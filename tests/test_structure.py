"""Structural checks over the op registry, in Liger-Kernel's manner: what every op and backend must have.

Every public op has a ``pytorch`` (reference) implementation, which is what the kernels are tested against
and what runs on a machine without a GPU; every op is named by a test module; every module of a kernel
backend that defines kernels is compiled by the CPU compile gate (``tests/kernels/test_compile_*.py``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch

from tilegemm.backend import registry
from tilegemm.ops.reference import cublaslt

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "tilegemm"
KERNEL_BACKENDS = ("cutile", "gluon")
_DEFINES_KERNEL = re.compile(
    r"^\s*@(ct\.kernel|gluon\.jit)\b|(?<![`@])\bct\.kernel\(|\blaunch\.kernel_factory\(", re.MULTILINE
)
#: Modules of a kernel backend that make no kernels of their own: the AOT compiler, the launch layer (its
#: ``kernel_factory`` makes the other modules' kernels).
_NOT_KERNEL_MODULES = {"aot", "launch"}
#: Implementations every backend registers (DeepGEMM's cuBLAS baseline: no kernel of ours, cuBLAS through torch).
SHARED_IMPLS = {cublaslt.cublaslt_gemm}


def _ops() -> dict[str, dict]:
    registry._load_backends()
    return {op: impls for op, impls in registry._IMPLS.items() if not op.startswith("_")}


def test_every_op_has_a_reference_implementation():
    missing = [op for op, impls in _ops().items() if "pytorch" not in impls]
    assert not missing, f"ops without a pytorch implementation: {missing}"


def test_every_op_is_named_by_a_test_module():
    texts = [p.read_text() for folder in ("ops", "transformers") for p in (TESTS / folder).glob("test_*.py")]
    missing = [op for op in _ops() if not any(re.search(rf"\b{op}\b", t) for t in texts)]
    assert not missing, f"ops no test module under tests/ops or tests/transformers names: {missing}"


def test_every_kernel_module_is_in_the_compile_gate():
    gate_imports = "\n".join(
        line
        for p in (TESTS / "kernels").glob("test_compile_*.py")
        for line in p.read_text().splitlines()
        if line.startswith("from tilegemm.ops.")
    )
    kernel_modules = [
        (backend, path.stem)
        for backend in KERNEL_BACKENDS
        for path in sorted((SRC / "ops" / backend).glob("*.py"))
        if _DEFINES_KERNEL.search(path.read_text()) and path.stem not in _NOT_KERNEL_MODULES
    ]
    assert ("gluon", "fp8_gemm_kernel") in kernel_modules and ("cutile", "gemm") in kernel_modules
    assert ("cutile", "moe_blocks") in kernel_modules  # kernels made by launch.kernel_factory count
    missing = [
        f"tilegemm.ops.{backend}.{name}"
        for backend, name in kernel_modules
        if not re.search(rf"^from tilegemm\.ops\.{backend} import .*\b{name}\b", gate_imports, re.MULTILINE)
    ]
    assert not missing, f"kernel modules no compile-gate test imports: {missing}"


def test_every_kernel_backend_registers_through_its_package():
    """A kernel backend's implementations are its package's, except the one every backend shares (registered by
    each backend's package when it imports)."""
    for backend in KERNEL_BACKENDS:
        assert registry._BACKEND_MODULES[backend] == f"tilegemm.ops.{backend}"
        for op, impls in _ops().items():
            fn = impls.get(backend)
            own = fn is None or fn.__module__.startswith(f"tilegemm.ops.{backend}.")
            assert own or fn in SHARED_IMPLS, (op, backend, fn.__module__)


def test_every_custom_op_is_made_in_one_module():
    """Every ``torch.library`` custom op (``tilegemm::...``) is made in ``tilegemm/custom_ops.py``, and every one of
    them takes ``backend`` (what the tilegemm ops it calls run on)."""
    from tilegemm import custom_ops

    elsewhere = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "custom_ops.py" and re.search(r"torch\.library\.|\bcustom_op\(", path.read_text())
    ]
    assert not elsewhere, f"custom ops made outside tilegemm/custom_ops.py: {elsewhere}"
    assert set(custom_ops.MODEL_OPS) < set(custom_ops.OPS)
    for name in custom_ops.OPS:
        schema = getattr(torch.ops.tilegemm, name.removeprefix("tilegemm::")).default._schema
        assert "backend" in [argument.name for argument in schema.arguments], name


def test_no_module_defines_a_name_twice():
    """A module-level function or class defined twice hides the first (a kernel and its host function under one
    name, say); ``_`` (the fake implementations of custom ops) is exempt."""
    repeated = {}
    for path in sorted(SRC.rglob("*.py")):
        names = [
            node.name
            for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name != "_"
        ]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            repeated[str(path.relative_to(SRC))] = twice
    assert not repeated, f"names defined twice: {repeated}"


def test_kernel_modules_share_code_through_public_names():
    """A kernel module uses another module's helpers by their public names (device helpers live in
    ``ops/cutile/tile_lib.py``), never by a private ``module._name``."""
    for backend in KERNEL_BACKENDS:
        folder = SRC / "ops" / backend
        siblings = "|".join(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        attribute = rf"(?<![\w.])({siblings})\._[a-z]\w*"
        imported = rf"^from tilegemm\.ops\.{backend}\.\w+ import .*\b_[a-z]\w*"
        private = re.compile(f"{attribute}|{imported}", re.MULTILINE)
        found = {
            p.name: sorted({m.group(0) for m in private.finditer(p.read_text())})
            for p in sorted(folder.glob("*.py"))
            if private.search(p.read_text())
        }
        assert not found, f"private names of sibling modules: {found}"


def test_modules_are_small_or_say_why():
    """No module under ``src/tilegemm`` is over 600 lines, except kernel modules that say why in their docstring
    (a line ``Over 600 lines: <reason>``)."""
    long = {}
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 600:
            doc = ast.get_docstring(ast.parse(text)) or ""
            is_kernel = path.parent.name in KERNEL_BACKENDS and _DEFINES_KERNEL.search(text)
            if not (is_kernel and re.search(r"^Over 600 lines: \S", doc, re.MULTILINE)):
                long[str(path.relative_to(SRC))] = text.count("\n")
    assert not long, f"modules over 600 lines without a reason (kernel modules only): {long}"


def _gate_imports() -> set[tuple[str, str]]:
    """(backend, module) pairs the compile-gate tests import."""
    found = set()
    for path in (TESTS / "kernels").glob("test_compile_*.py"):
        for m in re.finditer(r"^from tilegemm\.ops\.(\w+) import ([\w, ]+)", path.read_text(), re.MULTILINE):
            found |= {(m.group(1), name.strip()) for name in m.group(2).split(",")}
    return found


def test_every_kernel_backend_op_has_a_compile_gate_entry():
    """Every op a kernel backend implements runs kernels the CPU compile gate compiles: its implementation's module
    is in the gate, or it composes ops or kernel modules that are (``get_impl``, imported sibling modules). A module
    that runs none of its backend's kernels needs no entry, nor does the implementation every backend shares
    (``cublaslt_gemm_*``: cuBLAS through torch)."""
    gated = _gate_imports()
    missing = []
    for op, impls in _ops().items():
        for backend in KERNEL_BACKENDS:
            fn = impls.get(backend)
            if fn is None or fn in SHARED_IMPLS:
                continue
            module = fn.__module__.rsplit(".", 1)[-1]
            text = (SRC / "ops" / backend / f"{module}.py").read_text()
            siblings = {
                name.strip()
                for m in re.finditer(rf"^from tilegemm\.ops\.{backend}(?:\.\w+)? import ([\w, ]+)", text, re.M)
                for name in m.group(1).split(",")
            }
            composed = "get_impl(" in text or any((backend, name) in gated for name in siblings)
            runs_kernels = _DEFINES_KERNEL.search(text) or siblings or "get_impl(" in text
            if runs_kernels and (backend, module) not in gated and not composed:
                missing.append(f"{op} ({backend}: {fn.__module__})")
    assert not missing, f"kernel-backend ops whose kernels no compile-gate test compiles: {missing}"
