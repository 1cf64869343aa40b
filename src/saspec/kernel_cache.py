"""Where numba caches saspec's compiled kernels: outside the source tree, keyed on saspec's sources.

Numba's own locators cache next to each module (``__pycache__``) and check only
that module's file. saspec's kernels inline the core from ``core.py`` (and the
simulator inlines ``select``), so an edit there would leave stale machine code
in the cache. ``SaspecCacheLocator`` fixes both: it caches under
``$SASPEC_CACHE_DIR`` (default ``~/.cache/saspec/numba``; ``$NUMBA_CACHE_DIR/saspec``
when that is set), in a directory named for the package's location and the
hash of every ``.py`` file in it, so any source change starts a fresh cache.
Older directories of the same checkout are pruned, once idle for a day, when a new one is made.

Importing this module registers it (every module with cached kernels imports it
first), for functions defined in saspec's files only; numba keeps its
usual locators for everything else. ``import saspec`` writes nothing; the
cache directory is made when the first cached kernel compiles.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from numba.core import caching as numba_caching
from numba.core import config

PACKAGE_DIR = Path(__file__).resolve().parent
STALE_AFTER_S = 24 * 3600  # an older cache of this checkout is removed once idle this long


def cache_root() -> Path:
    """The directory under which saspec's numba caches live."""
    if os.environ.get("SASPEC_CACHE_DIR"):
        return Path(os.environ["SASPEC_CACHE_DIR"])
    if config.CACHE_DIR:
        return Path(config.CACHE_DIR) / "saspec"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "saspec" / "numba"


@functools.lru_cache(maxsize=None)
def cache_dir() -> Path:
    """This checkout's cache directory: named for where the package is and what its sources hold."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE_DIR)).encode())
        digest.update(path.read_bytes())
    where = hashlib.sha1(str(PACKAGE_DIR).encode()).hexdigest()[:12]
    return cache_root() / f"{where}-{digest.hexdigest()[:16]}"


def _prune_siblings(current: Path, max_idle_s: float = STALE_AFTER_S) -> None:
    """Drop caches of this checkout's earlier sources (same location prefix, other hash)
    that nothing has written to for ``max_idle_s`` seconds: a process still running
    the old sources may be writing to its directory right now."""
    prefix = current.name.split("-")[0] + "-"
    now = time.time()
    for old in current.parent.glob(prefix + "*"):
        if old == current:
            continue
        try:
            newest = max([f.stat().st_mtime for f in old.rglob("*")] + [old.stat().st_mtime])
        except OSError:
            continue  # being changed or removed by another process
        if now - newest > max_idle_s:
            shutil.rmtree(old, ignore_errors=True)


def _locator_class(caching):
    """A saspec locator built on ``caching``'s own bases (numba's, or numba-cuda's copy of them)."""

    class SaspecCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """Numba cache locator for functions defined in saspec's files (see ``saspec.kernel_cache``)."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            rel = Path(py_file).resolve().relative_to(PACKAGE_DIR)
            self._cache_path = str(cache_dir() / rel.parent)

        def get_cache_path(self):
            return self._cache_path

        def ensure_cache_path(self):
            fresh = not cache_dir().exists()
            os.makedirs(self._cache_path, exist_ok=True)
            tempfile.TemporaryFile(dir=self._cache_path).close()  # writable?
            if fresh:
                _prune_siblings(cache_dir())

        @classmethod
        def from_function(cls, py_func, py_file):
            try:
                Path(py_file).resolve().relative_to(PACKAGE_DIR)
            except ValueError:
                return None  # not saspec's: numba's other locators decide
            try:
                self = cls(py_func, py_file)
                self.ensure_cache_path()
            except OSError:
                return _NoCacheLocator(py_func, py_file)
            return self

    class _NoCacheLocator(SaspecCacheLocator):
        """The cache directory is not writable: cache in a private temporary directory
        rather than let numba fall back to the source tree."""

        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            self._cache_path = tempfile.mkdtemp(prefix="saspec-numba-")

        def ensure_cache_path(self):
            pass

    return SaspecCacheLocator


def install(caching_module=None) -> None:
    """Put saspec's locator first among a numba caching module's locators (idempotent).

    ``caching_module`` defaults to ``numba.core.caching``; the CUDA backend passes
    numba-cuda's ``numba.cuda.core.caching``.
    """
    caching_module = caching_module or numba_caching
    impl = getattr(caching_module, "_CacheImpl", None) or caching_module.CacheImpl
    classes = impl._locator_classes
    if not any(c.__name__ == "SaspecCacheLocator" for c in classes):
        classes.insert(0, _locator_class(caching_module))


install()  # on import: every module with cached kernels imports this module before defining them
