"""The ``saspec`` command line: simulate, bench, models, generate, bench-e2e."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    results = bench.run(quick=args.quick)
    for name, rows in results.items():
        print(f"\n## {name}\n")
        print(bench.format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from . import simulate

    return simulate.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="saspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("bench", help="host ingestion, per-step and memory benchmarks")
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.set_defaults(func=_bench)

    from .simulate import add_arguments

    p = sub.add_parser("simulate", help="acceptance simulator on real tokenized workloads (the main job)")
    add_arguments(p)
    p.set_defaults(func=_simulate)

    from .e2e import add_commands  # models, generate, bench-e2e (torch imported only when they run)

    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
