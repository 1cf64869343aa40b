"""Deprecated: the hybrid's threshold rule moved to :mod:`saspec.rules` (the default is :mod:`saspec.policy`).

Importing this module warns. ``select_drafts`` / ``select_drafts_np`` and the length rules are importable
from ``saspec.rules``; the cost gate from ``saspec.gate`` (deprecated too); the adaptive selector's helpers
from ``saspec.adaptive`` (deprecated too).
"""

import warnings

from .rules import (DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, DRAFT_LENGTH_RULES, HYBRID_THRESHOLD,  # noqa: F401
                    check_length_rule, draft_length, draft_lengths, select_drafts, select_drafts_np, truncate_drafts)

warnings.warn("saspec.select is deprecated: import select_drafts and the fixed rules from saspec.rules; the "
              "default drafting choice is saspec.policy", DeprecationWarning, stacklevel=2)
