"""What every ``saspec`` command parses its options with: the ``type=`` validators,
:class:`CliError` and the parser classes.

A bad option value fails while parsing, in a validator below; a bad input
that shows only once a command runs raises :class:`CliError`. Either way the
user sees one line, ``saspec <command>: error: <what is wrong>``, and exit
status 2 (``cli.main``). The commands import this module, never ``cli``.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from pathlib import Path
from typing import Callable, Sequence


class CliError(Exception):
    """A bad option value or input that only shows once a command runs
    (e.g. ``--p`` shorter than ``-k``); ``cli.main`` prints it as one line and exits 2."""


# -- option value validators (argparse ``type=``) ----------------------------------
# Each returns the parsed value or raises ArgumentTypeError with a message that
# argparse prefixes with the option's name.


def _as_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_at_least(lo: int) -> Callable[[str], int]:
    """A ``type=`` parsing an int >= ``lo``."""

    def parse(text: str) -> int:
        value = _as_int(text)
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value

    parse.__name__ = f"int >= {lo}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """A ``type=`` parsing an int in ``[lo, hi]``."""

    def parse(text: str) -> int:
        value = _as_int(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {value}")
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


def pick(text: str, choices: Sequence[str], flag: str, what: str, allow_empty: bool = False) -> list[str]:
    """The comma-separated items of a command's ``flag`` value (empty items dropped), each one of
    ``choices``; :class:`CliError` names the first unknown item, or says the list is empty (unless
    ``allow_empty``). For lists checked once the command runs (a default that depends on other options)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in choices:
            raise CliError(f"unknown {what} {x!r} in {flag}; expected some of {', '.join(choices)}")
    if not items and not allow_empty:
        raise CliError(f"no {what}s in {flag}; expected some of {', '.join(choices)}")
    return items


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
