"""``tilegemm-bench`` / ``python -m tilegemm.bench``: run the benchmark families, or read saved results back.

Run (needs a CUDA GPU)::

    tilegemm-bench --quick                                   # a handful of shapes per family (< 2 min on an H100)
    tilegemm-bench --full --time-budget 500 --save run.json --markdown run.md
    tilegemm-bench --family dense --family masked --quick --compare base.json --fail-on-regression 10

Read a saved run (no GPU needed)::

    tilegemm-bench --from run.json --markdown run.md --plot plots/ [--compare base.json]
    tilegemm-bench render --from benchmarks/results/h100.json --readme README.md

Exit codes: 0 ok; 1 a regression beyond ``--fail-on-regression``; 2 no GPU, no matplotlib for ``--plot`` /
``--replot`` (``pip install "tilegemm[bench]"``; checked before anything runs), or bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tilegemm.bench import compare as cmp
from tilegemm.bench import report, schema
from tilegemm.bench.runner import FAMILIES

#: Default time budget of a ``--quick`` run, seconds (JIT of both libraries included).
QUICK_BUDGET_S = 100.0


def _parser() -> argparse.ArgumentParser:
    """The options of a run (or of reading saved runs); its usage also shows :func:`_render_parser`'s."""
    p = argparse.ArgumentParser(
        prog="tilegemm-bench",
        description="tilegemm's benchmark harness: every op through the public API next to cuBLAS, torch and DeepGEMM.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", const="quick", dest="size", help="a few shapes per family")
    size.add_argument("--full", action="store_const", const="full", dest="size", help="the full shape sets")
    p.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only this family (repeatable)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="only rows whose shape has one of these values of KEY (repeatable), e.g. --where m=64,128,256",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help=f"start no new row after S seconds (default: {QUICK_BUDGET_S:.0f} with --quick, none with --full)",
    )
    p.add_argument("--deepgemm", default="auto", metavar="auto|off|DIR", help="DeepGEMM peer (DIR holds its peer.py)")
    p.add_argument(
        "--from",
        dest="from_json",
        action="append",
        metavar="FILE.json",
        help="read a saved run instead of running (repeat to merge runs, e.g. one per family)",
    )
    p.add_argument("--save", metavar="FILE.json", help="write the results (rewritten after every row)")
    p.add_argument("--markdown", metavar="FILE.md", help="write the markdown report")
    p.add_argument("--plot", metavar="DIR", help="write one PNG per family (needs matplotlib)")
    p.add_argument("--compare", metavar="BASE.json", help="per-row ratios against a saved run")
    p.add_argument("--fail-on-regression", type=float, metavar="PCT", help="exit 1 if a row is PCT%% slower than BASE")
    p.add_argument("--list", action="store_true", help="print the rows the run would measure and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    usages = (parser.format_usage().removeprefix("usage: ").rstrip() for parser in (p, _render_parser()))
    p.usage = "\n       ".join(usages)
    return p


def _render_parser() -> argparse.ArgumentParser:
    """The options of ``tilegemm-bench render``."""
    from tilegemm.bench import readme

    p = argparse.ArgumentParser(prog="tilegemm-bench render", description=readme.__doc__)
    p.add_argument("--from", dest="from_json", required=True, metavar="FILE.json")
    p.add_argument("--readme", required=True, metavar="README.md")
    p.add_argument("--plots", metavar="DIR", help="plots folder (default: plots/ next to the JSON)")
    p.add_argument("--replot", action="store_true", help="first (re)draw the plots from the JSON (needs matplotlib)")
    p.add_argument("--section", metavar="NAME", help="the README section of this name (default: the main one)")
    return p


def _plots_missing(option: str) -> bool:
    """True (after saying why on stderr) when ``option`` asks for plots and matplotlib is missing."""
    from tilegemm.bench import plots

    try:
        plots.require_matplotlib()
    except ImportError as exc:
        print(f"tilegemm-bench: {option} cannot draw: {exc}", file=sys.stderr)
        return True
    return False


def _render_main(argv: list[str]) -> int:
    from tilegemm.bench import readme

    args = _render_parser().parse_args(argv)
    if args.replot:
        from tilegemm.bench import plots

        if _plots_missing("--replot"):
            return 2
        out = args.plots or str(Path(args.from_json).parent / "plots")
        plots.plot_all(schema.load(args.from_json), out, progress=True)
    try:
        readme.render(args.from_json, args.readme, args.plots, args.section)
    except ValueError as exc:
        print(f"tilegemm-bench render: {exc}", file=sys.stderr)
        return 2
    print(f"updated the results section of {args.readme} from {args.from_json}")
    return 0


def _outputs(doc: dict[str, Any], args: argparse.Namespace) -> int:
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(report.markdown(doc))
        print(f"wrote {args.markdown}")
    if args.plot:
        from tilegemm.bench import plots

        for path in plots.plot_all(doc, args.plot, progress=not args.no_progress):
            print(f"wrote {path}")
    if not args.markdown:
        print(report.summary_table(doc["rows"]))
    code = 0
    if args.compare:
        result = cmp.compare(doc, schema.load(args.compare))
        print(cmp.markdown(result, args.fail_on_regression))
        if args.fail_on_regression is not None:
            bad = cmp.regressions(result, args.fail_on_regression)
            if bad:
                print(f"{len(bad)} rows regressed by more than {args.fail_on_regression}% against {args.compare}")
                code = 1
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tilegemm-bench``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "render":
        return _render_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.plot and _plots_missing("--plot"):
        return 2
    size = args.size or "quick"
    families = args.family or [f for f in FAMILIES if f in _available_families()]
    from tilegemm.bench import runner

    try:
        where = runner.parse_where(args.where)
    except ValueError as exc:
        print(f"tilegemm-bench: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for fam, specs in runner.plan(families, size, where).items():
            print(f"{fam}: {len(specs)} rows")
            for s in specs:
                print("   ", s)
        return 0
    if args.from_json:
        try:
            doc = schema.merge([schema.load(path) for path in args.from_json])
        except (OSError, ValueError) as exc:
            print(f"tilegemm-bench: {exc}", file=sys.stderr)
            return 2
        if args.family:
            doc["rows"] = [r for r in doc["rows"] if r["family"] in args.family]
        if args.save:
            schema.save(doc, args.save)
            print(f"wrote {args.save}")
        return _outputs(doc, args)

    from tilegemm.bench import device

    if not device.has_gpu():
        print(device.NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    if not device.has_cutile():
        print(device.NO_CUTILE_MESSAGE, file=sys.stderr)
        return 2
    save = (lambda d: schema.save(d, args.save)) if args.save else None
    budget = args.time_budget if args.time_budget is not None else (QUICK_BUDGET_S if size == "quick" else None)
    doc = runner.run(families, size, budget, args.deepgemm, not args.no_progress, on_row=save, where=where)
    if args.save:
        schema.save(doc, args.save)
        print(f"wrote {args.save}")
    return _outputs(doc, args)


def _available_families() -> list[str]:
    import importlib.util

    return [f for f, mod in FAMILIES.items() if importlib.util.find_spec(f"tilegemm.bench.{mod}") is not None]


if __name__ == "__main__":
    sys.exit(main())
