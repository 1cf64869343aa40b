"""The ``saspec`` command line: simulate, bench, models, generate, bench-e2e, record-traces, calibrate, bench-vllm, bench-llama-cpp.

Every bad option or input ends in one line on stderr,
``saspec <command>: error: <what is wrong>``, and exit status 2: option
values are checked by the ``type=`` validators of :mod:`.options` while
parsing, and the errors the commands raise for bad inputs
(:class:`~.options.CliError`, a missing or unreadable file, a malformed trace
file, an unavailable workload, a failed model install) are caught in :func:`main`.

This module is the top of the evidence: it imports the commands, nothing imports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .commands import bench, bench_llama_cpp, bench_vllm, calibrate, e2e, proposer_cost, record, served_vllm, simulate
from .models import ModelError
from .options import CliError, Parser, output_file
from .workloads import TraceFormatError, WorkloadUnavailable


def _bench(args: argparse.Namespace) -> int:
    try:
        results = bench.run(quick=args.quick, peer_sa_spec=args.peer_sa_spec, only=args.only)
    except ValueError as exc:  # a bad --peer-sa-spec path
        print(f"saspec bench: error: {exc}", file=sys.stderr)
        return 2
    for name, rows in results.items():
        print(f"\n## {name}\n")
        print(bench.format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _bench_vllm(args: argparse.Namespace) -> int:
    """``bench-vllm`` runs models end to end; ``--proposer-cost`` times the drafters alone; ``--served``
    runs them behind vLLM's OpenAI server."""
    if args.proposer_cost and args.served:
        raise CliError("--proposer-cost and --served are separate benchmarks: pass one")
    if args.served:
        return served_vllm.main(args)
    return proposer_cost.main(args) if args.proposer_cost else bench_vllm.main(args)


def build_parser() -> Parser:
    parser = Parser(prog="saspec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("bench", help="host ingestion, per-step and memory benchmarks",
                       description="Host ingestion speed, per-decode-step cost against the n-gram baseline, memory.")
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the results as JSON")
    p.add_argument("--only", choices=("pool", "tail"), default=None,
                   help="run one benchmark alone: pool (the cross-request pool's per-step cost and memory) or "
                        "tail (median, p99 and worst step of a 64-row x 4k-prompt batch that outgrows its blobs)")
    p.add_argument("--peer-sa-spec", metavar="PATH", default=None,
                   help="sa_spec host-logic harness binary (built outside the repository, see BENCHMARKS.md): "
                        "adds side-by-side ingestion and per-step tables against it (default: not run)")
    p.set_defaults(func=_bench)

    p = sub.add_parser("simulate", help="acceptance simulator on real tokenized workloads (the main job)",
                       description="Acceptance simulator: tokens per target forward (AL) per workload for each "
                                   "drafter and hybrid policy, a threshold sweep, tables, results.json and plots.",
                       epilog=simulate.EPILOG)
    simulate.add_arguments(p)
    p.set_defaults(func=simulate.main)

    e2e.add_commands(sub)  # models, generate, bench-e2e (torch imported only when they run)
    record.add_command(sub)  # record-traces (torch only when run)
    calibrate.add_command(sub)
    bench_vllm.add_command(sub)  # bench-vllm (vLLM runs in its own environment)
    sub.choices["bench-vllm"].set_defaults(func=_bench_vllm)
    bench_llama_cpp.add_command(sub)  # bench-llama-cpp (llama-cpp-python runs in its own environment)
    return parser


def _domain_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a command raises for bad inputs (not bugs): shown as one line."""
    return CliError, TraceFormatError, WorkloadUnavailable, ModelError, OSError


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename}"
    return " ".join(str(exc).split()) or type(exc).__name__


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)parser of the command that was run, e.g. ``saspec models install``'s."""
    p = parser
    for dest in ("command", "models_command"):
        name = getattr(args, dest, None)
        sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        if name is None or sub is None:
            break
        p = sub.choices[name]
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``saspec`` command; returns the exit status (2 for a bad input).

    Bad option values exit through the parser (``SystemExit(2)``); both print
    one line on stderr, prefixed with the command's name."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = _command_parser(parser, args)
    if extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    errors = _domain_errors()
    try:
        return args.func(args)
    except errors as exc:
        print(f"{command.prog}: error: {_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
