"""Structural checks over the op registry, in Liger-Kernel's manner: what every op and backend must have.

Every public op has a ``pytorch`` (reference) implementation, which is what the kernels are tested against
and what runs on a machine without a GPU; every op is named by a test module; every module of a kernel
backend that defines kernels is compiled by the CPU compile gate (``tests/compile_gate/test_compile_*.py``).
And over the package: no two modules import each other, directly or around a loop (module-level and
function-level imports alike); the registry layer imports nothing above it; no public name is in more than two
``__all__`` lists.
"""

from __future__ import annotations

import ast
import collections
import importlib
import re
from pathlib import Path

import torch

import tilegemm
from tilegemm.backend import registry
from tilegemm.ops import api
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
    assert not missing, f"ops no test module under tests/ops or tests/hf names: {missing}"


def test_every_kernel_module_is_in_the_compile_gate():
    gate_imports = "\n".join(
        line
        for p in (TESTS / "compile_gate").glob("test_compile_*.py")
        for line in p.read_text().splitlines()
        if line.startswith("from tilegemm.ops.")
    )
    kernel_modules = [
        (backend, path.stem)
        for backend in KERNEL_BACKENDS
        for path in sorted((SRC / "ops" / backend).glob("*.py"))
        if _DEFINES_KERNEL.search(path.read_text()) and path.stem not in _NOT_KERNEL_MODULES
    ]
    assert ("gluon", "fp8_gemm_kernel") in kernel_modules and ("cutile", "gemm_kernels") in kernel_modules
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
    for path in (TESTS / "compile_gate").glob("test_compile_*.py"):
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, dict[str, int]]:
    """``{module: {module it imports: line}}`` over ``src/tilegemm``, from every ``import`` statement anywhere in a
    module (function bodies included). ``from package import name`` is an import of ``package.name`` when that is a
    module, else of ``package``; an import of ``a.b.c`` counts as one of ``a.b.c`` only (not of its packages)."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph[name] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up per extra dot
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # `import tilegemm.a.b` of a module: that module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    """No tilegemm module imports itself around a loop, by module-level or function-level imports: data flows one way
    (api -> registry -> backend -> kernel), and a lower layer that needs to reach a higher one is called back
    (register_impl, register_replay, register_rule), never imported."""
    graph = _import_graph()
    assert {"tilegemm.backend.registry", "tilegemm.ops.cutile.gemm", "tilegemm.transformers.experts"} <= set(graph)
    assert "tilegemm.backend.registry" in graph["tilegemm.ops.cutile.gemm"]  # register_impl
    assert "tilegemm.ops.checks.base" in graph["tilegemm.ops.checks"]  # a package's own modules
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    cycles = _cycles(graph)
    loops = {
        " -> ".join(c): [f"{a} -> {b} (line {graph[a][b]})" for a in c for b in graph[a] if b in c] for c in cycles
    }
    assert not loops, f"import cycles: {loops}"


def test_registry_layer_imports_nothing_above_it():
    """``tilegemm.backend`` (registry, hot lane, choice, selector, binding) imports only its own modules and
    ``tilegemm.env``: the backends, their heuristics and the public API import it, never the reverse (the registry
    loads the backend packages by name, and their automatic-choice rules register themselves)."""
    graph = _import_graph()
    layer = [m for m in graph if m.startswith("tilegemm.backend")]
    assert "tilegemm.backend.hot_lane" in layer and "tilegemm.backend.choice" in layer
    outside = {m: sorted(t for t in graph[m] if not t.startswith("tilegemm.backend")) for m in layer}
    above = {m: [t for t in targets if t != "tilegemm.env"] for m, targets in outside.items()}
    above = {m: targets for m, targets in above.items() if targets}
    assert not above, f"the registry layer imports above it: {above}"


def _all_lists() -> dict[str, list[str]]:
    """``{module: its __all__}`` for every tilegemm module (imported: derived lists count as what they hold) whose
    optional dependencies (cuda.tile, triton, transformers) are installed."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        name = _module_name(path)
        if name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            if (exc.name or "").startswith("tilegemm"):
                raise
            continue
        names = getattr(module, "__all__", None)
        if names is not None:
            found[name] = list(names)
    return found


def test_no_public_name_in_more_than_two_all_lists():
    """A public name is listed where it is defined or collected (``tilegemm.ops.api`` for the ops, ``tilegemm.utils``
    for DeepGEMM's utils) and in ``tilegemm.__all__`` at most; ``tilegemm.__all__`` takes the ops from
    ``tilegemm.ops.api.__all__`` (a new op is listed once), so its own literal list holds no op."""
    lists = _all_lists()
    assert {"tilegemm", "tilegemm.ops.api", "tilegemm.utils"} <= set(lists)
    counts = collections.Counter(n for names in lists.values() for n in set(names))
    crowded = {n: [m for m, names in lists.items() if n in names] for n, k in counts.items() if k > 2}
    assert not crowded, f"names in more than two __all__ lists: {crowded}"
    ops = {n for n in tilegemm.__all__ if hasattr(getattr(tilegemm, n), "op_name")}
    assert ops == set(api.__all__), "tilegemm's public ops are exactly tilegemm.ops.api.__all__"
    written = next(
        node.value
        for node in ast.parse((SRC / "__init__.py").read_text()).body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )
    assert not set(ast.literal_eval(written)) & ops, "tilegemm/__init__.py lists an op that ops.api.__all__ lists"


def test_gpu_tests_follow_one_convention():
    """A GPU test is one marked ``gpu`` (on the test, a parameter, or a whole ``*_gpu.py`` module): tests/conftest.py
    skips it without CUDA and ``make test-gpu`` selects it by the mark. No test skips for want of a GPU on its own,
    which would leave it out of the GPU suite's selection or skip it twice."""
    own_skips = re.compile(
        r"skipif\(\s*not torch\.cuda\.is_available\(\)"
        r"|if not (?:torch\.cuda\.is_available\(\)|CUDA):\s*\n\s*pytest\.skip\("
    )
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        if own_skips.search(text):
            offenders.append(f"{path.relative_to(TESTS)}: skips without CUDA on its own")
        if path.stem.endswith("_gpu") and not re.search(r"^pytestmark = .*pytest\.mark\.gpu", text, re.M | re.S):
            offenders.append(f"{path.relative_to(TESTS)}: a *_gpu.py module without a module-level gpu mark")
    assert not offenders, offenders
