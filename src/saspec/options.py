"""DraftOptions: what one request asks of its drafts (on, a cap, text to copy from).

Every engine passes them in its own way (vLLM's ``SamplingParams.extra_args``,
a ``generate`` keyword, a request body field); :func:`parse_options` turns each
form into one validated :class:`DraftOptions`, so a bad option is a clear
``ValueError`` for that request before anything is built, never a crash of a
later step or a silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .validate import MAX_TOKEN, as_tokens

#: The token between a request's hints and its text in its automaton: it occurs nowhere else, so no
#: match spans it, and a draft stops where it would cross it.
HINT_SEPARATOR = MAX_TOKEN
#: The keys :func:`parse_options` takes (a mapping with any other key is refused).
OPTION_KEYS = ("enabled", "max_draft_tokens", "hints")


@dataclass(frozen=True)
class DraftOptions:
    """One request's drafting options.

    Attributes:
        enabled: False: the request is never drafted for (its automaton is
            still built where a cross-request pool may take its text).
        max_draft_tokens: the most draft tokens any step proposes for the
            request (>= 0; None: the drafter's own K). 0 is like ``enabled=False``.
        hints: int32 [H] token ids the request's drafts may copy from beside
            its own text (a file the output will edit, a document to quote);
            None: none. They are never part of the request's text: a draft
            never runs from the hints into the prompt.
    """

    enabled: bool = True
    max_draft_tokens: int | None = None
    hints: np.ndarray | None = None

    @property
    def drafts(self) -> bool:
        """Whether the request may get drafts at all."""
        return self.enabled and self.max_draft_tokens != 0


#: Options of a request that gave none.
DEFAULT_OPTIONS = DraftOptions()


def parse_options(options: Any, where: str = "options") -> DraftOptions:
    """``options`` as :class:`DraftOptions`: None (the defaults), a ``DraftOptions``, or a mapping with
    the keys of :data:`OPTION_KEYS` (``enabled``: a bool; ``max_draft_tokens``: an int >= 0 or None;
    ``hints``: 1-D token ids in [0, 2**31) or None).

    Raises:
        TypeError, ValueError: an unknown key or a value of the wrong type or range, naming it
            (``where`` says whose options they are, e.g. ``"request 'a' options"``).
    """
    if options is None:
        return DEFAULT_OPTIONS
    if isinstance(options, DraftOptions):
        items = {"enabled": options.enabled, "max_draft_tokens": options.max_draft_tokens, "hints": options.hints}
    elif isinstance(options, Mapping):
        items = dict(options)
        unknown = sorted(str(k) for k in items if k not in OPTION_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown option {unknown[0]!r}; the options are {', '.join(OPTION_KEYS)}")
    else:
        raise TypeError(f"{where} must be a mapping or a saspec DraftOptions, got {type(options).__name__}")
    enabled = items.get("enabled", True)
    if not isinstance(enabled, (bool, np.bool_)):
        raise TypeError(f"{where}: enabled must be a bool, got {enabled!r}")
    cap = items.get("max_draft_tokens")
    if cap is not None:
        if isinstance(cap, (bool, np.bool_)) or not isinstance(cap, (int, np.integer)):
            raise TypeError(f"{where}: max_draft_tokens must be an int >= 0 or None, got {cap!r}")
        if cap < 0:
            raise ValueError(f"{where}: max_draft_tokens must be >= 0, got {cap}")
        cap = int(cap)
    hints = items.get("hints")
    if hints is not None:
        hints = as_tokens(hints, f"{where}: hints")
        hints = hints if hints.shape[0] else None
    return DraftOptions(bool(enabled), cap, hints)


#: The key of a request's fields (vLLM's ``SamplingParams.extra_args``, a server's request body) that
#: holds its saspec options as a mapping.
OPTIONS_KEY = "saspec"
#: The prefix of the flat keys that carry them where a field holds only numbers, strings or lists (the
#: OpenAI server's ``vllm_xargs``): ``saspec_enabled``, ``saspec_max_draft_tokens``, ``saspec_hints``.
FLAT_PREFIX = "saspec_"


def options_from_fields(extra_args: Any) -> DraftOptions:
    """One request's :class:`DraftOptions` from its fields (a dict, e.g. vLLM's ``SamplingParams.extra_args``):
    the mapping under ``"saspec"``, and/or the flat ``saspec_*`` keys (whose values are numbers, strings
    or lists: ``saspec_enabled`` 0 / 1 / "false" / "true", ``saspec_max_draft_tokens`` an int or its
    digits, ``saspec_hints`` a list of token ids or a string of them separated by commas or spaces).
    Other keys are not saspec's and are ignored. None or empty: the defaults.

    Raises:
        TypeError, ValueError: an unknown saspec key or a bad value, naming it.
    """
    if not extra_args:
        return parse_options(None)
    if not isinstance(extra_args, dict):
        raise TypeError(f"extra_args must be a dict, got {type(extra_args).__name__}")
    nested = extra_args.get(OPTIONS_KEY)
    if nested is not None and not isinstance(nested, dict):
        raise TypeError(f"extra_args[{OPTIONS_KEY!r}] must be a mapping of saspec options, got {nested!r}")
    merged = dict(nested or {})
    for key, value in extra_args.items():
        if not (isinstance(key, str) and key.startswith(FLAT_PREFIX)):
            continue
        name = key[len(FLAT_PREFIX):]
        if name in merged:
            raise ValueError(f"saspec option {name!r} is given twice (extra_args[{OPTIONS_KEY!r}] and {key!r})")
        merged[name] = _flat_value(key, name, value)
    return parse_options(merged, "saspec options")


def _flat_value(key: str, name: str, value: Any) -> Any:
    """A ``vllm_xargs`` value (numbers, strings, lists) as the option it stands for."""
    if name == "enabled" and not isinstance(value, bool):
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{key} must be true or false (or 1 / 0), got {value!r}")
    if name == "max_draft_tokens" and isinstance(value, str):
        if not value.strip().isdigit():
            raise ValueError(f"{key} must be an int >= 0, got {value!r}")
        return int(value)
    if name == "hints" and isinstance(value, str):
        parts = value.replace(",", " ").split()
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"{key} must be token ids (a list, or a string of ids separated by commas), got {value!r}")
        return [int(p) for p in parts]
    return value
