"""SASS inspection of a cubin with ``cuobjdump --dump-sass`` (CPU only; no GPU needed).

``sass_summary(cubin)`` counts the instructions that tell whether a GEMM kernel got what it
needs: tensor-core MMAs (Hopper ``HGMMA`` for 16-bit and ``QGMMA`` for FP8 operands;
Blackwell ``UTCHMMA``/``UTCQMMA`` and friends, issued to the tensor memory units), TMA
loads (``UTMALDG``), byte-wide global loads (``LDG.E.U8``: a sign that TMA was lost on FP8
operands) and local-memory traffic (``LDL``/``STL``: register spills).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def cuobjdump_path() -> str:
    """Path of ``cuobjdump`` from the venv's ``nvidia/cu13/bin`` (or ``$CUOBJDUMP``, or PATH)."""
    env = os.environ.get("CUOBJDUMP")
    if env:
        return env
    for base in [Path(sys.prefix)] + [Path(p) for p in sys.path if p]:
        for cand in (
            base / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages",
            base,
        ):
            exe = cand / "nvidia" / "cu13" / "bin" / "cuobjdump"
            if exe.exists():
                return str(exe)
    return "cuobjdump"


def _cuobjdump(cubin: bytes, *flags: str) -> list[str]:
    """``cuobjdump <flag> cubin``'s output for each of ``flags`` (one temporary file for all)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = lambda flag: subprocess.run([cuobjdump_path(), flag, f.name], capture_output=True, text=True, check=True)  # noqa: E731
        return [run(flag).stdout for flag in flags]


def dump_sass(cubin: bytes) -> str:
    """The SASS text of ``cubin`` (``cuobjdump --dump-sass``)."""
    return _cuobjdump(cubin, "--dump-sass")[0]


def opcode_counts(sass: str) -> Counter[str]:
    """Count every opcode (with its modifiers, e.g. ``LDG.E.U8``) in a SASS listing."""
    return Counter(m.group(1) for m in _OPCODE.finditer(sass))


def _count(ops: Counter[str], prefixes: tuple[str, ...]) -> int:
    return sum(n for op, n in ops.items() if op.split(".")[0] in prefixes)


def sass_summary(cubin: bytes) -> dict[str, int]:
    """Counts that matter for a GEMM kernel's machine code.

    Keys: ``hgmma`` (Hopper 16-bit warpgroup MMA), ``qgmma`` (Hopper FP8 warpgroup MMA),
    ``utc_mma`` (all Blackwell tcgen05 MMAs: UTCHMMA, UTCQMMA, UTCOMMA, UTCIMMA, UTCMMA),
    ``utchmma``, ``utcqmma`` (Blackwell 16-bit / FP8 MMAs), ``hmma`` (legacy mma.sync),
    ``utmaldg`` (TMA loads), ``utmastg`` (TMA stores), ``utmaredg`` (TMA reduce-adds), ``ldg_u8`` (byte-wide
    global loads ``LDG.E.U8``), ``tensormap_writes`` (``UTMACCTL.IV``: TMA descriptors
    the kernel wrote to global memory itself, as a dynamic ``Array.slice`` makes it do),
    ``ldl``/``stl`` (local memory: spills), ``instructions`` (total), ``gmma_group_min`` (the fewest Hopper
    warpgroup MMAs issued in one ``gsb0`` group, :func:`gmma_group_sizes`; 0 without any).
    """
    sass = dump_sass(cubin)
    ops = opcode_counts(sass)
    utc = {op for op in ops if re.match(r"UTC\w*MMA", op.split(".")[0])}
    return {
        "hgmma": _count(ops, ("HGMMA",)),
        "qgmma": _count(ops, ("QGMMA",)),
        "utc_mma": sum(ops[op] for op in utc),
        "utchmma": _count(ops, ("UTCHMMA",)),
        "utcqmma": _count(ops, ("UTCQMMA",)),
        "hmma": _count(ops, ("HMMA",)),
        "utmaldg": _count(ops, ("UTMALDG",)),
        "utmastg": _count(ops, ("UTMASTG",)),
        "utmaredg": _count(ops, ("UTMAREDG",)),
        "ldg_u8": sum(n for op, n in ops.items() if op.startswith("LDG") and ".U8" in op),
        "tensormap_writes": ops["UTMACCTL.IV"],
        "ldl": _count(ops, ("LDL",)),
        "stl": _count(ops, ("STL",)),
        "instructions": sum(ops.values()),
        "gmma_group_min": min(gmma_group_sizes(sass), default=0),
    }


def gmma_group_sizes(sass: str) -> Counter[int]:
    """How many Hopper warpgroup MMAs (``HGMMA`` / ``QGMMA``) each ``gsb0`` group of the listing holds: the
    instruction that closes a group carries ``gsb0`` and is waited on with ``WARPGROUP.DEPBAR``. A K block of
    ``BK`` is ``BK / 16`` (16-bit) or ``BK / 32`` (FP8) MMAs per warpgroup; groups of one mean the warpgroup waits
    for every MMA before issuing the next."""
    sizes: Counter[int] = Counter()
    run = 0
    for line in sass.splitlines():
        if re.search(r"\b[HQ]GMMA\.", line):
            run += 1
            if "gsb0" in line:
                sizes[run] += 1
                run = 0
    return sizes


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH = re.compile(r"\bBRA (?:`\()?0x([0-9a-f]+)")


def loop_bodies(sass: str) -> list[list[str]]:
    """The instructions of each loop of a SASS listing: from a backward branch's target to the branch.

    Only branches before the kernel's last ``EXIT`` count: after it tileiras puts the slow paths of its barrier
    waits (try-wait, sleep, branch back into the body), which are not loops of the source.
    """
    instrs = [(int(m.group(1), 16), m.group(2).strip()) for m in _INSTR.finditer(sass)]
    exits = [i for i, (_, text) in enumerate(instrs) if re.search(r"\bEXIT\b", text)]
    end = exits[-1] if exits else len(instrs)
    index = {addr: i for i, (addr, _) in enumerate(instrs)}
    bodies = []
    for i, (addr, text) in enumerate(instrs[:end]):
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
            bodies.append([t for _, t in instrs[index[int(m.group(1), 16)] : i + 1]])
    return bodies


def launch_resources(cubin: bytes) -> dict[str, int]:
    """What one CTA of the cubin's kernel takes: ``threads`` (its ``.reqntid``), ``registers`` per thread and
    ``shared`` bytes (``cuobjdump -elf`` / ``-res-usage``); with them, how many CTAs fit on an SM."""
    elf, res = _cuobjdump(cubin, "-elf", "-res-usage")
    threads = re.search(r"\.reqntid (\d+)", elf)
    usage = re.search(r"REG:(\d+).*?SHARED:(\d+)", res)
    if not threads or not usage:
        raise ValueError("cuobjdump printed no .reqntid or resource usage for this cubin")
    return {"threads": int(threads.group(1)), "registers": int(usage.group(1)), "shared": int(usage.group(2))}


def compile_all(
    jobs: Iterable[tuple[str, Any, Any, str]],
    compile_cubin: Callable[[Any, Any, str], bytes],
    summarize: Callable[[bytes], Any] = sass_summary,
) -> Mapping[tuple[str, str], Any]:
    """``{(variant id, arch): summarize(cubin)}`` of every ``(variant id, kernel, params, arch)`` job, the cubin made
    by ``compile_cubin(kernel, params, arch)`` (see :func:`compile_each`). A job that fails maps to its exception, for
    the test of that variant to report."""
    by_key = {(vid, arch): (kernel, params, arch) for vid, kernel, params, arch in jobs}

    def work(key):
        try:
            return summarize(compile_cubin(*by_key[key]))
        except Exception as exc:
            return exc

    return compile_each(list(by_key), work)


class _OnFirstLookup(Mapping):
    """A mapping whose value for a key is ``work(key)``, computed on its first lookup."""

    def __init__(self, keys: list, work: Callable[[Any], Any]):
        self._keys, self._work, self._done = keys, work, {}

    def __getitem__(self, key):
        if key not in self._done:
            if key not in self._keys:
                raise KeyError(key)
            self._done[key] = self._work(key)
        return self._done[key]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def compile_each(keys: list, work: Callable[[Any], Any]) -> Mapping:
    """``{key: work(key)}`` for a compile gate's jobs (``work`` runs tileiras out of process and catches its errors).

    Run alone, every job runs up front in ``$TILEGEMM_COMPILE_THREADS`` (default 2) threads. Under pytest-xdist a job
    runs when a test first reads it: a module's tests are spread over the workers, and each worker compiling every
    variant of the module up front would compile each of them once per worker."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return _OnFirstLookup(keys, work)
    workers = int(os.environ.get("TILEGEMM_COMPILE_THREADS", "2"))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(keys, pool.map(work, keys)))


def stage_releases(sass: str) -> tuple[int, int]:
    """The one-thread mbarrier arrivals of a SASS listing (``SYNCS.ARRIVE.TRANS64.A1T0``: stage releases, and any
    other such arrival) and how many of them follow a ``FENCE.VIEW.ASYNC.S`` since the previous ``SYNCS``
    instruction (the wait for the stage's data or the last arrival): the fence that orders a stage's generic scale
    reads before the TMA that refills it (``tiles.release_stage``)."""
    releases = fenced = 0
    fence = False
    for line in sass.splitlines():
        if "FENCE.VIEW.ASYNC.S" in line:
            fence = True
        elif "SYNCS." in line:
            if "SYNCS.ARRIVE.TRANS64.A1T0" in line:
                releases += 1
                fenced += fence
            fence = False
    return releases, fenced
