"""Structural checks over the op registry, in Liger-Kernel's manner: what every op and backend must have.

Every public op has a ``pytorch`` (reference) implementation, which is what the kernels are tested against
and what runs on a machine without a GPU; every op is named by a test module; every module of a kernel
backend that defines kernels is compiled by the CPU compile gate (``tests/kernels/test_compile_*.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

from tilegemm.backend import registry

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "tilegemm"
KERNEL_BACKENDS = ("cutile", "gluon")
_DEFINES_KERNEL = re.compile(r"^\s*@(ct\.kernel|gluon\.jit)\b|(?<![`@])\bct\.kernel\(", re.MULTILINE)


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
        if _DEFINES_KERNEL.search(path.read_text()) and path.stem != "aot"
    ]
    assert ("gluon", "fp8_gemm_kernel") in kernel_modules and ("cutile", "gemm") in kernel_modules
    missing = [
        f"tilegemm.ops.{backend}.{name}"
        for backend, name in kernel_modules
        if not re.search(rf"^from tilegemm\.ops\.{backend} import .*\b{name}\b", gate_imports, re.MULTILINE)
    ]
    assert not missing, f"kernel modules no compile-gate test imports: {missing}"


def test_every_kernel_backend_registers_through_its_package():
    for backend in KERNEL_BACKENDS:
        assert registry._BACKEND_MODULES[backend] == f"tilegemm.ops.{backend}"
        for op, impls in _ops().items():
            fn = impls.get(backend)
            assert fn is None or fn.__module__.startswith(f"tilegemm.ops.{backend}."), (op, backend, fn.__module__)
