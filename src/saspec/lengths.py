"""Deprecated: the draft-length rules moved to :mod:`saspec.rules` (the default is :mod:`saspec.policy`).

Importing this module warns; every name it had is importable from ``saspec.rules``.
"""

import warnings

from .rules import (DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, DRAFT_LENGTH_RULES, check_length_rule,  # noqa: F401
                    draft_length, draft_lengths, truncate_drafts)

warnings.warn("saspec.lengths is deprecated: import the fixed rules from saspec.rules; the default drafting "
              "choice is saspec.policy", DeprecationWarning, stacklevel=2)
