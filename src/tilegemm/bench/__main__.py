"""``python -m tilegemm.bench {dense,all} [options]``: run a benchmark, print a table, optionally save it.

``dense`` runs the dense GEMM set (BF16 vs torch.matmul, FP8 vs torch blockwise scaled_mm);
``all`` runs every family that has a module here (``tilegemm.bench.<family>`` with ``run``).
``--out PREFIX`` writes ``PREFIX.json`` (rows) and ``PREFIX.md`` (the table).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

FAMILIES = ("dense", "grouped", "mqa")


def _save(rows: list[dict], prefix: str, markdown) -> None:
    path = Path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(rows))
    print(f"wrote {path.with_suffix('.json')} and {path.with_suffix('.md')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tilegemm.bench", description=__doc__)
    parser.add_argument("family", choices=(*FAMILIES, "all"))
    parser.add_argument("--kinds", default="bf16,fp8", help="dense: comma list of bf16,fp8")
    parser.add_argument("--layouts", default="nt", help="dense: comma list of nt,nn,tn,tt")
    parser.add_argument("--recipes", default="128x128", help="dense FP8: comma list of 128x128,1x128")
    parser.add_argument("--quick", action="store_true", help="a small subset of shapes")
    parser.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    args = parser.parse_args(argv)

    families = FAMILIES if args.family == "all" else (args.family,)
    for family in families:
        try:
            mod = importlib.import_module(f"tilegemm.bench.{family}")
        except ModuleNotFoundError:
            print(f"[bench] no benchmark module for {family!r}; skipped")
            continue
        if family == "dense":
            recipes = [(1, 128, 128) if r == "128x128" else (1, 1, 128) for r in args.recipes.split(",")]
            shapes = [(4096, 2112, 7168), (64, 2112, 7168), (4096, 4096, 7168)] if args.quick else None
            rows = mod.run(args.kinds.split(","), args.layouts.split(","), recipes, shapes)
        else:
            rows = mod.run()
        print(mod.markdown(rows))
        if args.out:
            prefix = args.out if len(families) == 1 else f"{args.out}_{family}"
            _save(rows, prefix, mod.markdown)


if __name__ == "__main__":
    main()
