"""saspec: speculative-decoding drafts from a suffix automaton over each request's own tokens.

The automaton core (``saspec.core``) is written once as numba ``register_jitable``
functions and compiled for the host (``numba.njit``) and the GPU (``numba.cuda``).
"""

import hashlib as _hashlib
from pathlib import Path as _Path


def _drop_stale_numba_cache() -> None:
    """Numba keys its on-disk cache by each jitted module's own source file, so
    an edit to the shared core would not invalidate the kernels that inline it.
    Key the cache on the core's hash too: when it changed, drop saspec's cache."""
    here = _Path(__file__).parent
    cache = here / "__pycache__"
    stamp = cache / "core.sha256"
    digest = _hashlib.sha256((here / "core.py").read_bytes()).hexdigest()
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return
        for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            f.unlink()
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: numba then caches elsewhere or not at all
        pass


_drop_stale_numba_cache()

from .build import POLICIES, SuffixAutomaton  # noqa: E402
from .engine import SpecEngine  # noqa: E402
from .ngram import NgramDrafter  # noqa: E402

__all__ = ["POLICIES", "NgramDrafter", "SpecEngine", "SuffixAutomaton"]
__version__ = "0.1.0"
