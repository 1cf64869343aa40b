"""numba unpickles its cache files, so saspec keeps its kernel cache only where no other user can
write: ``kernel_cache.cache_problem`` refuses a cache root, checkout directory or cache file that is
another user's or writable by others, and a directory above the root through which another user
could swap it; a refused ``$SASPEC_CACHE_DIR`` is warned about once and left untouched (kernels
go to a private temporary directory), and the directories saspec makes are private (0700).

The tests run as root in the project's containers; owner checks compare against ``os.geteuid()``,
and ``os.chown`` hands a path to another uid."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from saspec.kernel_cache import cache_problem

OTHER_UID = 54321  # no user of the container: "another user"
OTHER_GID = 54321
needs_uids = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="no user ids on this platform")
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A private cache root, a checkout directory in it with a subdirectory, and an index file there."""
    root = tmp_path / "cache"
    sub = root / "abc123-def456" / "device"
    sub.mkdir(parents=True)
    for d in (root, root / "abc123-def456", sub):
        d.chmod(0o700)
    index = sub / "kernels.f-1.py311.nbi"
    index.write_bytes(b"index")
    index.chmod(0o600)
    (sub / "kernels.f-1.py311.1.nbc").write_bytes(b"data")
    (sub / "kernels.f-1.py311.1.nbc").chmod(0o600)
    return root, sub, index


@needs_uids
def test_a_private_tree_is_taken(tmp_path):
    root, sub, _ = _tree(tmp_path)
    assert cache_problem(sub, root) is None
    assert cache_problem(root, root) is None


@needs_uids
@pytest.mark.parametrize("which", ["root", "checkout", "sub", "index", "data"])
@pytest.mark.parametrize("mode_bits", [0o002, 0o020])
def test_anything_others_may_write_is_refused(tmp_path, which, mode_bits):
    root, sub, index = _tree(tmp_path)
    target = {"root": root, "checkout": root / "abc123-def456", "sub": sub, "index": index,
              "data": sub / "kernels.f-1.py311.1.nbc"}[which]
    if mode_bits == 0o020 and hasattr(os, "chown") and os.geteuid() == 0:
        os.chown(target, -1, OTHER_GID)  # group write is refused unless the group is the user's own
    elif mode_bits == 0o020:
        pytest.skip("needs root to give the path a shared group")
    target.chmod(stat.S_IMODE(target.stat().st_mode) | mode_bits)
    problem = cache_problem(sub, root)
    assert problem is not None and str(target) in problem and "writable by other users" in problem


@needs_root
@pytest.mark.parametrize("which", ["root", "checkout", "sub", "index", "data"])
def test_anything_another_user_owns_is_refused(tmp_path, which):
    root, sub, index = _tree(tmp_path)
    target = {"root": root, "checkout": root / "abc123-def456", "sub": sub, "index": index,
              "data": sub / "kernels.f-1.py311.1.nbc"}[which]
    os.chown(target, OTHER_UID, -1)
    problem = cache_problem(sub, root)
    assert problem is not None and str(target) in problem and f"owned by uid {OTHER_UID}" in problem


@needs_uids
def test_a_directory_above_the_root_that_others_may_write_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    root = shared / "cache"
    root.mkdir(mode=0o700)
    shared.chmod(0o777)  # another user could rename "cache" away and put their own in its place
    problem = cache_problem(root, root)
    assert problem is not None and str(shared) in problem and "not sticky" in problem
    shared.chmod(0o1777)  # like /tmp: only a file's owner may rename or remove it
    assert cache_problem(root, root) is None


@needs_root
def test_a_directory_above_the_root_owned_by_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / "cache").mkdir(parents=True, mode=0o700)
    os.chown(theirs, OTHER_UID, -1)
    problem = cache_problem(theirs / "cache", theirs / "cache")
    assert problem is not None and str(theirs) in problem and "above the cache root" in problem


@needs_uids
def test_a_symlinked_root_is_judged_where_it_points(tmp_path):
    shared = tmp_path / "shared"
    (shared / "cache").mkdir(parents=True, mode=0o700)
    shared.chmod(0o777)
    link = tmp_path / "mine"
    link.symlink_to(shared / "cache")
    problem = cache_problem(link, link)
    assert problem is not None and str(shared) in problem


def _compile_one_kernel(cache: Path) -> subprocess.CompletedProcess:
    """A fresh process that compiles one small cached kernel with ``$SASPEC_CACHE_DIR`` = ``cache``."""
    code = ("import warnings\n"
            "warnings.simplefilter('always')\n"
            "from saspec.step_cost import StepCost\n"
            "print(StepCost(max_tokens=8).observe(3, 0.5))\n")  # observe_cost: a small cached kernel
    env = {**os.environ, "SASPEC_CACHE_DIR": str(cache), "PYTHONWARNINGS": "always"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)


@needs_uids
def test_a_cache_dir_others_may_write_is_warned_about_once_and_left_untouched(tmp_path):
    cache = tmp_path / "open"
    cache.mkdir()
    cache.chmod(0o777)
    out = _compile_one_kernel(cache)
    assert out.stdout.strip() == "True"  # the timing was taken: the kernel ran
    assert out.stderr.count("RuntimeWarning") == 1 and str(cache) in out.stderr, out.stderr
    assert "not caching compiled kernels there" in out.stderr
    assert not any(cache.rglob("*.nb*")), "nothing may be cached where another user can write"


@needs_uids
def test_the_directories_saspec_makes_are_private_and_cached_in(tmp_path):
    cache = tmp_path / "new" / "cache"
    out = _compile_one_kernel(cache)
    assert "RuntimeWarning" not in out.stderr, out.stderr
    assert list(cache.rglob("*.nbi")), "the kernel is cached there"
    made = [tmp_path / "new", *[p for p in cache.rglob("*") if p.is_dir()], cache]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in made), \
        {str(p): oct(p.stat().st_mode) for p in made}

