"""Normalized sm_90 SASS fingerprints of the cutile compile gate's kernel variants, to show a refactor keeps the
generated code (CPU only; ``tileiras`` runs out of process).

    PYTHONPATH=src:tests python tests/compile_gate/sass_snapshot.py OUT.json [--threads N] [--only dense,grouped,...]

run at two commits (e.g. in two ``git worktree`` checkouts) and compare the files with ``--compare A.json B.json``.
A fingerprint is the SHA-1 of ``cuobjdump --dump-sass`` with the kernel's symbol name replaced (a renamed kernel
keeps its fingerprint). Variants: every one of the dense, grouped, MQA (sm_90 jobs and the ``-inf`` fill kernel),
einsum, MoE, MoE-training and RMSNorm gates; ``--only`` keeps the named families (their ids' prefixes). The script
may be run with another checkout's ``src`` and ``tests`` on ``PYTHONPATH``: it reads kernels only through the gates
and the names the host modules keep (``grouped.get_kernel``, ``mqa.plain_kernel_for``, ...).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

FAMILIES = ("dense", "grouped", "mqa", "einsum", "moe", "moe_train", "norm")


def _mqa_jobs() -> list[tuple[str, Any, Any]]:
    """The MQA gates' sm_90 jobs (plain, paged and decode kernels, the FP8 operand and schedule kernels) and the
    ``-inf`` fill kernel's."""
    from compile_gate import test_compile_mqa as q

    mqa = q.mqa
    jobs = []
    for kind, variant, arch in q.JOBS:
        if arch != "sm_90":
            continue
        if kind == "plain":
            conf = mqa.mqa_logits_config(*variant[:2], sm=90)
            kernel, params = mqa.plain_kernel_for(conf.occupancy), q.plain_params(*variant, arch=arch)
        else:
            conf = mqa.paged_mqa_config(*variant[:4], sm=90)
            kernel, params = mqa.paged_kernel_for(conf.occupancy), q.paged_params(*variant, arch=arch)
        jobs.append((f"mqa:{q._ids((kind, variant, arch))}", kernel, params))
    for h, d in q.PLAIN_VARIANTS:
        for al in (16, 4):
            jobs.append((f"mqa:clean-{h}-{d}-{al}", mqa.mqa_clean_logits_kernel, q.clean_params(h, d, al, "sm_90")))
    for variant in q.DECODE_VARIANTS:
        kernel = q.mqa_decode_kernels.decode_kernel_for(q.decode_config(*variant).occupancy)
        jobs.append((f"mqa:decode-{'-'.join(map(str, variant))}", kernel, q.decode_params(*variant)))
    from compile_gate import test_compile_mqa_prep as prep

    for vid, name, _, _, params in prep.VARIANTS:
        jobs.append((f"mqa:prep-{vid}", prep.mqa_prep.get_kernel(name), params))
    return jobs


def _jobs(only: tuple[str, ...] = FAMILIES) -> list[tuple[str, Any, Any]]:
    """(variant id, kernel, params) of every gated cutile variant of the families ``only``."""
    jobs = []
    if "mqa" in only:
        jobs += _mqa_jobs()
    if only == ("mqa",):
        return jobs
    from compile_gate import (
        test_compile_dense,
        test_compile_einsum,
        test_compile_grouped,
        test_compile_moe,
        test_compile_moe_train,
        test_compile_norm,
    )
    from tilegemm.ops.cutile import grouped, moe, moe_blocks, moe_fp8, moe_slots, norm

    jobs += [(f"dense:{vid}", kernel, params) for vid, _, kernel, params in test_compile_dense.VARIANTS]
    jobs += [
        (f"grouped:{vid}", grouped.get_kernel(fam, cfg.num_worker_warps, cfg.occupancy), params)
        for vid, fam, cfg, params, _ in test_compile_grouped.VARIANTS
    ]
    jobs += [(f"einsum:{vid}", kernel, params) for vid, kernel, params, _ in test_compile_einsum.VARIANTS]
    m = test_compile_moe
    jobs += [(f"moe:{vid}", moe.get_kernel(name, *hints), params) for vid, name, hints, params in m.VARIANTS]
    jobs += [(f"moe:{vid}", moe_slots.get_kernel(name), params) for vid, name, params in m.SLOT_VARIANTS]
    jobs += [(f"moe:{vid}", moe_blocks.get_kernel(name), params) for vid, name, params in m.BLOCK_VARIANTS]
    jobs += [(f"moe:{vid}", moe_fp8.get_kernel(name, *hints), params) for vid, name, hints, params in m.FP8_VARIANTS]
    jobs += [(f"moe_train:{vid}", kernel, params) for vid, kernel, params in test_compile_moe_train.VARIANTS]
    jobs += [(f"norm:{vid}", norm.get_kernel(), params) for vid, params in test_compile_norm.VARIANTS]
    return [job for job in jobs if job[0].split(":")[0] in only]


def fingerprint(kernel: Any, params: Any) -> str:
    """SHA-1 (16 hex digits) of the kernel's sm_90 SASS with its symbol names replaced, and its line count."""
    from compile_gate.sass import dump_sass
    from tilegemm.ops.cutile import aot

    text = dump_sass(aot.compile_cubin(kernel, params, "sm_90"))
    for name in set(re.findall(r"Function : (\S+)", text)):
        text = text.replace(name, "FN")
    return f"{hashlib.sha1(text.encode()).hexdigest()[:16]} ({len(text.splitlines())} lines)"


def _one(job: tuple[str, Any, Any]) -> tuple[str, str]:
    vid, kernel, params = job
    try:
        return vid, fingerprint(kernel, params)
    except Exception as exc:  # reported in the file: a variant that no longer compiles is a difference too
        return vid, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def compare(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The variant ids whose fingerprints differ (or that one side lacks)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="JSON file to write the fingerprints to")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TILEGEMM_COMPILE_THREADS", "2")))
    parser.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families (default: all)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two fingerprint files")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        diff = compare(a, b)
        for k in diff:
            print(f"DIFF {k}: {a.get(k)} -> {b.get(k)}")
        print(f"{len(set(a) | set(b)) - len(diff)} same, {len(diff)} different")
        return 1 if diff else 0
    if not args.out:
        parser.error("give OUT.json or --compare A B")
    only = tuple(args.only.split(","))
    unknown = set(only) - set(FAMILIES)
    if unknown:
        parser.error(f"--only: unknown families {sorted(unknown)}, expected some of {list(FAMILIES)}")
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        result = dict(pool.map(_one, _jobs(only)))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"{len(result)} variants, {sum(v.startswith('error') for v in result.values())} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
