"""saspec: speculative-decoding drafts from a suffix automaton over each request's own tokens.

The automaton core (``saspec.core``) is written once as numba ``register_jitable``
functions and compiled for the host (``numba.njit``) and the GPU (``numba.cuda``).
"""

from .build import POLICIES, SuffixAutomaton
from .engine import SpecEngine
from .ngram import NgramDrafter

__all__ = ["POLICIES", "NgramDrafter", "SpecEngine", "SuffixAutomaton"]
__version__ = "0.1.0"
