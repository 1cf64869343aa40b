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

Numba unpickles its cache files, so whoever can write them runs code in every
process that loads them. Directories this module makes are private (0700), and
before using a cache directory it checks (:func:`cache_problem`) that the cache
root, this checkout's directory and the files in it are the user's and
writable by nobody else, and that no directory above the root lets another
user replace it. Where one is not, it warns once (``RuntimeWarning``) and
caches in a private temporary directory, removed at exit, instead: the kernels
then compile in every process.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import stat
import tempfile
import time
import warnings
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


@functools.lru_cache(maxsize=None)
def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is the user's own (a user private group: the user's group, with no
    other members), so that its write bit lets nobody else write."""
    if gid != os.getegid():
        return False
    try:
        import grp
        import pwd

        members = set(grp.getgrgid(gid).gr_mem)
        return members <= {pwd.getpwuid(os.geteuid()).pw_name}
    except (ImportError, KeyError):
        return False


def _others_may_write(st: os.stat_result) -> bool:
    """Whether a user other than the owner may write what ``st`` describes (through its mode)."""
    return bool(st.st_mode & stat.S_IWOTH) or bool(st.st_mode & stat.S_IWGRP) and not _private_group(st.st_gid)


def cache_problem(path: Path, root: Path | None = None) -> str | None:
    """Why numba's cache files must not be read from or written to directory ``path`` (inside the cache
    root ``root``, default :func:`cache_root`), or None where they may.

    Every directory from ``root`` down to ``path``, and each cache file (``*.nbi`` index, ``*.nbc``
    data) in ``path``, must be owned by the effective user and writable by no other user (group
    write is allowed for the user's private group). Each directory above ``root`` must be owned by
    the user or by root, and where others may write it, sticky (like ``/tmp``), so that nobody else
    can swap what is below it. A path that does not exist, or cannot be read, is a problem too.
    Not checked where the platform has no user ids (``os.geteuid``).
    """
    if not hasattr(os, "geteuid"):
        return None
    uid = os.geteuid()
    path = Path(os.path.realpath(path))  # what the kernel will traverse: a symlink's target, and its parents
    root = Path(os.path.realpath(cache_root() if root is None else root))
    if path != root and root not in path.parents:
        return f"{path} is not inside the cache root {root}"
    try:
        for d in reversed(root.parents):
            st = os.stat(d)
            if st.st_uid not in (uid, 0):
                return f"{d}, above the cache root, is owned by uid {st.st_uid}, not by this user ({uid}) or root"
            if _others_may_write(st) and not st.st_mode & stat.S_ISVTX:
                return (f"{d}, above the cache root, is writable by other users and not sticky "
                        f"(mode {st.st_mode & 0o7777:o})")
        chain = [path, *[p for p in path.parents if p == root or root in p.parents]]
        files = [path / name for name in os.listdir(path) if name.endswith((".nbi", ".nbc"))]
        for f in [*reversed(chain), *files]:  # the root first: its problem is the one to fix
            st = os.stat(f)
            if st.st_uid != uid:
                return f"{f} is owned by uid {st.st_uid}, not by this user ({uid})"
            if _others_may_write(st):
                return f"{f} is writable by other users (mode {st.st_mode & 0o7777:o})"
    except OSError as e:
        return f"{path} cannot be checked: {e}"
    return None


class UnsafeCacheError(OSError):
    """A cache directory :func:`cache_problem` refuses."""


def _make_private_dirs(path: Path) -> None:
    """Make ``path`` and its missing parents, each readable and writable by the user only."""
    missing = []
    p = Path(os.path.abspath(path))
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass  # made meanwhile by another process: checked like any other


_warned: set[str] = set()
_safe: set[str] = set()  # cache paths found safe in this process: only this user can write there since


def _warn_unsafe(problem: str) -> None:
    if problem not in _warned:  # once per problem and process, not once per kernel
        _warned.add(problem)
        warnings.warn(
            f"saspec: not caching compiled kernels there: {problem}. numba unpickles its cache files, so a "
            "cache another user can write would run their code; kernels are cached in a private temporary "
            "directory instead and compile again in each process. Set SASPEC_CACHE_DIR to a directory of "
            "your own that only you can write (mode 0700).",
            RuntimeWarning,
            stacklevel=2,
        )


@functools.lru_cache(maxsize=None)
def _private_dir() -> Path:
    """This process's fallback cache (mode 0700), removed at exit."""
    d = Path(tempfile.mkdtemp(prefix="saspec-numba-"))
    atexit.register(shutil.rmtree, d, True)
    return d


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
            if self._cache_path not in _safe:
                _make_private_dirs(Path(self._cache_path))
                problem = cache_problem(Path(self._cache_path))
                if problem is not None:
                    raise UnsafeCacheError(problem)
                _safe.add(self._cache_path)
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
            except UnsafeCacheError as e:
                _warn_unsafe(str(e))
                return _NoCacheLocator(py_func, py_file)
            except OSError:
                return _NoCacheLocator(py_func, py_file)
            return self

    class _NoCacheLocator(SaspecCacheLocator):
        """The cache directory is not writable or not safe: cache in this process's private
        temporary directory rather than let numba fall back to the source tree."""

        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            rel = Path(py_file).resolve().relative_to(PACKAGE_DIR)
            self._cache_path = str(_private_dir() / rel.parent)
            os.makedirs(self._cache_path, mode=0o700, exist_ok=True)

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
