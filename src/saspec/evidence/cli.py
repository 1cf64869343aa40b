"""The ``saspec`` command line: simulate, bench, models, generate, bench-e2e.

Every bad option or input ends in one line on stderr,
``saspec <command>: error: <what is wrong>``, and exit status 2: option
values are checked by the ``type=`` validators below while parsing, and the
errors the commands raise for bad inputs (:class:`CliError`, a missing or
unreadable file, a malformed trace file, an unavailable workload, a failed
model install) are caught in :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Callable, Sequence


class CliError(Exception):
    """A bad option value or input that only shows once a command runs
    (e.g. ``--p`` shorter than ``-k``); :func:`main` prints it as one line and exits 2."""


# -- option value validators (argparse ``type=``) ----------------------------------
# Each returns the parsed value or raises ArgumentTypeError with a message that
# argparse prefixes with the option's name.


def int_at_least(lo: int) -> Callable[[str], int]:
    """A ``type=`` parsing an int >= ``lo``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value

    parse.__name__ = f"int >= {lo}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """A ``type=`` parsing an int in ``[lo, hi]``."""
    at_least = int_at_least(lo)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi}, got {value}")
        return value

    parse.__name__ = f"int in [{lo}, {hi}]"
    return parse


def float_in(lo: float, hi: float | None = None) -> Callable[[str], float]:
    """A ``type=`` parsing a finite float in ``[lo, hi]`` (``hi`` None: no upper bound)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            rng = f"in [{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {text}")
        return value

    parse.__name__ = f"number in [{lo}, {hi}]"
    return parse


probability = float_in(0.0, 1.0)


def comma_list(item: Callable[[str], object], choices: Sequence[str] | None = None,
               what: str = "value") -> Callable[[str], tuple]:
    """A ``type=`` parsing a non-empty comma-separated list, each item through
    ``item`` (and, with ``choices``, restricted to them); returns a tuple."""

    def parse(text: str) -> tuple:
        parts = [x.strip() for x in text.split(",")]
        if not text.strip() or any(not x for x in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}s without empty items, "
                                             f"got {text!r}")
        out = []
        for x in parts:
            if choices is not None and x not in choices:
                raise argparse.ArgumentTypeError(f"unknown {what} {x!r}; choose from {', '.join(choices)}")
            try:
                out.append(item(x))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{what} {x!r}: {exc}") from None
        return tuple(out)

    parse.__name__ = f"list of {what}s"
    return parse


def output_file(text: str) -> str:
    """A ``type=`` for a file the command will write: not a directory, in a
    directory that exists (checked before a long run rather than after it)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, expected a file path")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {path.parent} does not exist")
    return text


# -- parser ------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions/epilogs as written and appends ``(default: X)`` to
    every option that has a default worth showing (not None, not a False flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or default is None or default is False or default is argparse.SUPPRESS
                or not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)):
            return text
        if isinstance(default, (tuple, list)):
            default = ",".join(map(str, default))
        return f"{text} (default: {str(default).replace('%', '%%')})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # never break inside hyphenated names (code-edits, near-first, saspec-out)
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``<prog>: error: <message>``, exit 2.

    Sub-command parsers inherit the class and the help formatter."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    try:
        results = bench.run(quick=args.quick, peer_sa_spec=args.peer_sa_spec)
    except ValueError as exc:  # a bad --peer-sa-spec path
        print(f"saspec bench: error: {exc}", file=sys.stderr)
        return 2
    for name, rows in results.items():
        print(f"\n## {name}\n")
        print(bench.format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from . import simulate

    return simulate.main(args)


def build_parser() -> Parser:
    parser = Parser(prog="saspec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("bench", help="host ingestion, per-step and memory benchmarks",
                       description="Host ingestion speed, per-decode-step cost against the n-gram baseline, memory.")
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the results as JSON")
    p.add_argument("--peer-sa-spec", metavar="PATH", default=None,
                   help="sa_spec host-logic harness binary (built outside the repository, see BENCHMARKS.md): "
                        "adds side-by-side ingestion and per-step tables against it (default: not run)")
    p.set_defaults(func=_bench)

    from .simulate import EPILOG, add_arguments

    p = sub.add_parser("simulate", help="acceptance simulator on real tokenized workloads (the main job)",
                       description="Acceptance simulator: tokens per target forward (AL) per workload for each "
                                   "drafter and hybrid policy, a threshold sweep, tables, results.json and plots.",
                       epilog=EPILOG)
    add_arguments(p)
    p.set_defaults(func=_simulate)

    from .e2e import add_commands  # models, generate, bench-e2e (torch imported only when they run)

    add_commands(sub)

    from .record import add_commands as add_record_commands  # record-traces, calibrate (torch only when run)

    add_record_commands(sub)

    from .bench_vllm import add_command as add_bench_vllm  # bench-vllm (vLLM runs in its own environment)

    add_bench_vllm(sub)
    return parser


def _domain_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a command raises for bad inputs (not bugs): shown as one line."""
    from .models import ModelError
    from .workloads import TraceFormatError, WorkloadUnavailable

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
