"""SpecEngine's batch lifecycle: results, validation, threads.

Tests taking the ``backend`` fixture (tests/conftest.py) run on the CPU backend
and on the CUDA backend (numba's CUDA simulator by default, a real GPU with
SASPEC_TEST_CUDA=device), expecting the same results.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest

from saspec import NgramDrafter, SpecEngine, SuffixAutomaton, core
from saspec import extend as kx
from saspec.ngram import ngram_draft

K = 5


# -- results: every row's match and draft are those of its own automaton ---------------


def step_arrays(b, k=K):
    return (
        np.zeros((b, k + 1), np.int32),
        np.zeros(b, np.int32),
        np.full(b, -7, np.int32),
        np.full((b, k), -7, np.int32),
    )


def reference_draft(sa: SuffixAutomaton, k: int) -> list[int]:
    d = sa.draft(k).tolist()
    return d + [-1] * (k - len(d))


@pytest.mark.parametrize("occurrence", ["first", "near-recent"])
@pytest.mark.parametrize("parallel_threshold, lookahead", [(1, None), (1000, None), (1000, 0)])
def test_interleaved_lifecycle_matches_single_automata(occurrence, parallel_threshold, lookahead, backend):
    """``lookahead`` 0: the serial kernel prefetches rows ahead at any size."""
    if backend.cuda and (parallel_threshold == 1 or lookahead is not None):
        pytest.skip("parallel_threshold and the look-ahead are CPU-backend settings")
    rng = np.random.default_rng(0)
    eng = backend.engine(occurrence=occurrence, parallel_threshold=parallel_threshold)
    if lookahead is not None:
        eng._backend._ctl[kx.C_LOOKAHEAD] = lookahead
    refs: dict[int, SuffixAutomaton] = {}
    next_id = 0
    for step in range(300):
        if len(refs) < 3 or rng.random() < 0.15:  # add
            base = rng.integers(0, 40, rng.integers(1, 30))
            prompt = np.concatenate([base] * int(rng.integers(1, 4)))
            eng.add_request(next_id, prompt)
            refs[next_id] = SuffixAutomaton(prompt, occurrence=occurrence)
            next_id += 1
        if rng.random() < 0.1 and len(refs) > 3:  # remove
            rid = int(rng.choice(list(refs)))
            eng.remove_request(rid)
            del refs[rid]
        ids = list(rng.permutation(list(refs)))[: rng.integers(1, len(refs) + 1)]
        eng.prepare(ids)
        acc, lens, mout, dout = step_arrays(len(ids))
        for b, rid in enumerate(ids):
            lens[b] = rng.integers(0, K + 2)
            acc[b] = rng.integers(0, 40, K + 1)
            if rng.random() < 0.5:  # often repeat the request's own text
                text = refs[rid].tokens
                chunk = text[rng.integers(0, len(text)) :][: lens[b]]
                acc[b, : len(chunk)] = chunk
        backend.extend(eng, acc, lens, mout, dout)
        for b, rid in enumerate(ids):
            ref = refs[rid]
            ref.extend(acc[b, : lens[b]])
            assert mout[b] == ref.match()[0], (step, rid)
            assert dout[b].tolist() == reference_draft(ref, K), (step, rid)
            assert eng.automaton_len(rid) == len(ref)
    stats = eng.stats()
    assert stats["requests"] == len(refs)
    assert stats["tokens"] == sum(len(r) for r in refs.values())


def test_torch_tensors_are_written_in_place(backend):
    torch = pytest.importorskip("torch")
    eng = backend.engine()
    eng.add_request("r", torch.tensor([4, 5, 6, 4, 5]))
    eng.prepare(["r"])
    dev = "cuda" if backend.on_device else "cpu"
    acc = torch.tensor([[6, 0, 0, 0, 0, 0]], dtype=torch.int32, device=dev)
    lens = torch.tensor([1], dtype=torch.int32, device=dev)
    mout = torch.zeros(1, dtype=torch.int32, device=dev)
    dout = torch.zeros((1, K), dtype=torch.int32, device=dev)
    eng.extend(acc, lens, mout, dout)
    assert mout.tolist() == [3] and dout.tolist() == [[4, 5, 6, 4, 5]]


def test_ngram_drafter_matches_brute_force():
    rng = np.random.default_rng(3)
    drafter = NgramDrafter(min_n=1, max_n=3)
    texts = {i: list(rng.integers(0, 6, 20)) for i in range(4)}
    for rid, t in texts.items():
        drafter.add_request(rid, t)
    for _ in range(30):
        ids = list(texts)
        drafter.prepare(ids)
        acc, lens, mout, dout = step_arrays(len(ids))
        lens[:] = rng.integers(0, K + 2, len(ids))
        acc[:] = rng.integers(0, 6, acc.shape)
        drafter.extend(acc, lens, mout, dout)
        for b, rid in enumerate(ids):
            texts[rid] += acc[b, : lens[b]].tolist()
            t = texts[rid]
            expected, n_exp = [-1] * K, 0
            for n in range(3, 0, -1):  # longest n-gram first, earliest occurrence
                hits = [i for i in range(len(t) - n) if t[i : i + n] == t[-n:]]
                if hits:
                    cont = t[hits[0] + n : hits[0] + n + K]
                    expected, n_exp = cont + [-1] * (K - len(cont)), n
                    break
            assert dout[b].tolist() == expected and mout[b] == n_exp
    out = np.zeros(3, np.int32)
    assert ngram_draft(np.array([1, 2, 3], np.int32), 3, 1, 2, out, 3) == (0, 0)


def test_batch_property(eng):
    assert eng.batch == ("a", "b")
    eng.prepare(["b"])
    assert eng.batch == ("b",)
    eng.remove_request("a")  # not in the batch: it stays
    assert eng.batch == ("b",)
    eng.remove_request("b")
    assert eng.batch is None


# -- validation: one test per rule, each checking that nothing changed -----------------


def snapshot(eng: SpecEngine):
    wait = getattr(eng._backend, "wait_growth", None)
    if wait is not None:  # growth ahead of need lands on its own thread: let it land before the call under test
        wait()
    return eng._blob_copies(), eng._batch, eng.stats()


def assert_unchanged(eng, snap):
    blobs, batch, stats = snap
    assert eng._batch == batch and eng.stats() == stats
    now = eng._blob_copies()
    assert set(blobs) == set(now)
    for rid, blob in blobs.items():
        assert np.array_equal(now[rid], blob)


@pytest.fixture
def bk(backend):
    return backend


@pytest.fixture
def eng(bk):
    e = bk.engine()
    e.add_request("a", [1, 2, 3, 1, 2])
    e.add_request("b", [7, 7, 7])
    e.prepare(["a", "b"])
    return e


def rejects(eng, exc, match, fn, *args):
    snap = snapshot(eng)
    with pytest.raises(exc, match=match):
        fn(*args)
    assert_unchanged(eng, snap)


def test_add_duplicate_id(eng):
    rejects(eng, KeyError, "already added", eng.add_request, "a", [1])


@pytest.mark.parametrize(
    "prompt, exc, match",
    [
        ([[1, 2]], ValueError, "1-D"),
        ([1.5, 2.0], TypeError, "integers"),
        ([1, -3], ValueError, "-3"),
        (np.array([2**31], np.int64), ValueError, str(2**31)),
        ("abc", ValueError, "1-D"),
    ],
)
def test_add_bad_prompt(eng, prompt, exc, match):
    rejects(eng, exc, match, eng.add_request, "c", prompt)
    assert "c" not in eng


@pytest.mark.parametrize(
    "hint, exc, match",
    [(-1, ValueError, "expected_new_tokens"), (1.5, TypeError, "expected_new_tokens"), (True, TypeError, "expected_new_tokens"),
     ("8", TypeError, "expected_new_tokens"), (2**40, ValueError, "prompt plus expected_new_tokens")],
)
def test_add_bad_expected_new_tokens(eng, hint, exc, match):
    rejects(eng, exc, match, eng.add_request, "c", [1, 2], hint)
    assert "c" not in eng


def test_remove_unknown(eng):
    rejects(eng, KeyError, "unknown request 'zz'", eng.remove_request, "zz")


def test_prepare_unknown(eng):
    rejects(eng, KeyError, "unknown request 'zz'", eng.prepare, ["a", "zz"])


def test_prepare_duplicate(eng):
    rejects(eng, ValueError, "appears twice", eng.prepare, ["a", "b", "a"])


def test_extend_without_prepare(bk):
    e = bk.engine()
    e.add_request("a", [1, 2])
    rejects(e, RuntimeError, "prepare", bk.extend, e, *step_arrays(1))


def test_extend_after_removing_a_batch_request(eng, bk):
    eng.remove_request("b")
    rejects(eng, RuntimeError, "prepare", bk.extend, eng, *step_arrays(2))


@pytest.mark.parametrize("which", range(4))
def test_extend_wrong_dtype(eng, bk, which):
    arrays = list(step_arrays(2))
    arrays[which] = arrays[which].astype(np.int64)
    rejects(eng, TypeError, "int32", bk.extend, eng, *arrays)


@pytest.mark.parametrize("which", range(4))
def test_extend_byte_swapped_int32(eng, bk, which):
    if bk.on_device:
        pytest.skip("torch tensors have no byte order: a byte-swapped array cannot reach the device path")
    # numba's type cache types a byte-swapped array like a native one once it has
    # seen an unaligned array of that rank: warm it, then check the swapped one is refused.
    raw = np.zeros(64, np.uint8)
    numba.njit(lambda a, b: a.sum() + b.sum())(raw[1:5].view(np.int32), raw[1:17].view(np.int32).reshape(1, 4))
    arrays = list(step_arrays(2))
    arrays[which] = arrays[which].astype(">i4")
    rejects(eng, TypeError, "int32", bk.extend, eng, *arrays)


@pytest.mark.parametrize("which", range(4))
def test_extend_not_an_array(eng, bk, which):
    arrays = list(step_arrays(2))
    arrays[which] = arrays[which].tolist()
    rejects(eng, TypeError, "numpy array or torch tensor|torch CUDA tensor", bk.extend, eng, *arrays)


@pytest.mark.parametrize("which", range(4))
def test_extend_wrong_ndim(eng, bk, which):
    arrays = list(step_arrays(2))
    arrays[which] = arrays[which][..., None]
    rejects(eng, ValueError, "-D", bk.extend, eng, *arrays)


@pytest.mark.parametrize("which, shape", [(0, (2, K)), (0, (3, K + 1)), (1, (3,)), (2, (1,)), (3, (3, K))])
def test_extend_wrong_shape(eng, bk, which, shape):
    arrays = list(step_arrays(2))
    arrays[which] = np.zeros(shape, np.int32)
    rejects(eng, ValueError, "shape|rows", bk.extend, eng, *arrays)


@pytest.mark.parametrize("which", range(4))
def test_extend_not_contiguous(eng, bk, which):
    arrays = list(step_arrays(2))
    a = arrays[which]
    arrays[which] = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), np.int32)[..., ::2]
    rejects(eng, ValueError, "contiguous", bk.extend, eng, *arrays)


@pytest.mark.parametrize("which", [2, 3])
def test_extend_read_only_output(eng, bk, which):
    if bk.on_device:
        pytest.skip("torch tensors have no read-only flag")
    arrays = list(step_arrays(2))
    arrays[which].flags.writeable = False
    rejects(eng, ValueError, "writable", bk.extend, eng, *arrays)


# The CUDA backend reads no values on the host (that would sync): it clamps
# lengths and stops a row at a negative token instead (tests/test_cuda.py).


@pytest.mark.parametrize("bad_len", [K + 2, -1])
def test_extend_accepted_lens_out_of_range(eng, bad_len):
    if eng.backend != "cpu":
        pytest.skip("value checks are CPU-backend only")
    acc, lens, mout, dout = step_arrays(2)
    lens[:] = [1, bad_len]
    rejects(eng, ValueError, r"accepted_lens\[1\]", eng.extend, acc, lens, mout, dout)


def test_extend_negative_token(eng):
    if eng.backend != "cpu":
        pytest.skip("value checks are CPU-backend only")
    acc, lens, mout, dout = step_arrays(2)
    lens[:] = [2, 3]
    acc[0, :2] = [4, 4]
    acc[1, :3] = [5, -2, 5]
    acc[0, 4] = -9  # padding is ignored
    rejects(eng, ValueError, r"accepted\[1, 1\] = -2", eng.extend, acc, lens, mout, dout)


def test_extend_rejects_gpu_tensor_on_cpu_backend(eng):
    if eng.backend != "cpu":
        pytest.skip("CPU-backend rule")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU tensor")
    arrays = [torch.from_numpy(a).cuda() for a in step_arrays(2)]
    rejects(eng, ValueError, "CPU tensor", eng.extend, *arrays)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="unknown occurrence rule 'best'"):
        SpecEngine(occurrence="best")
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(min_n=3, max_n=2)
    with pytest.raises(TypeError, match="min_n must be an int"):
        NgramDrafter(min_n=1.5, max_n=3)
    with pytest.raises(TypeError, match="max_n must be an int"):
        NgramDrafter(min_n=1, max_n=2.9)
    with pytest.raises(ValueError, match="k must be >= 0"):
        SuffixAutomaton([1]).draft(-1)


def test_read_only_inputs_take_the_checked_path(eng):
    """Read-only inputs are valid (only outputs must be writable); they miss
    the exact-type fast path and must give the same results."""
    if eng.backend != "cpu":
        pytest.skip("CPU backend: the CUDA simulator writes back every kernel argument")
    ref = SpecEngine()
    ref.add_request("a", [1, 2, 3, 1, 2])
    ref.add_request("b", [7, 7, 7])
    ref.prepare(["a", "b"])
    for _ in range(3):
        acc, lens, mout, dout = step_arrays(2)
        acc[:, :2], lens[:] = [[3, 1], [7, 7]], 2
        want = step_arrays(2)
        ref.extend(acc, lens, want[2], want[3])
        acc.flags.writeable = lens.flags.writeable = False
        eng.extend(acc, lens, mout, dout)
        assert mout.tolist() == want[2].tolist() and dout.tolist() == want[3].tolist()


def test_ngram_drafter_checks_like_the_engine():
    drafter = NgramDrafter()
    drafter.add_request("a", [1, 2, 3, 1, 2])
    drafter.prepare(["a"])
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = K + 2
    rejects(drafter, ValueError, r"accepted_lens\[0\]", drafter.extend, acc, lens, mout, dout)
    lens[0] = 1
    rejects(drafter, ValueError, "accepted_lens and match_len_out share memory", drafter.extend, acc, lens, lens, dout)
    acc[0, 0] = 3
    drafter.extend(acc, lens, mout, dout)
    assert mout[0] == 3 and dout[0].tolist() == [1, 2, 3, -1, -1]


# -- outputs that share memory with an input or each other are refused -----------------


def _grow_until_full(eng, rid, k=K):
    """Feed single tokens until ``rid``'s blob has no room for one more."""
    acc, lens, mout, dout = step_arrays(1, k)
    lens[0] = 1
    eng.prepare([rid])
    blob = eng._backend.slots.blobs[eng._slot[rid]]
    while True:
        blob = eng._backend.slots.blobs[eng._slot[rid]]
        if int(blob[core.H_CAP_TOK]) - int(blob[core.H_N]) <= 0:
            return
        acc[0, 0] = 1 + int(blob[core.H_N]) % 7
        eng.extend(acc, lens, mout, dout)


def test_extend_rejects_aliased_lengths_and_outputs():
    """lens and match_len_out are one array and a blob must grow, so a second
    read of lens would see the outputs."""
    eng = SpecEngine()
    eng.add_request("long", list(range(50)) * 20)
    eng.add_request("full", [1], expected_new_tokens=255)  # its blob holds its hint: never grown ahead, it fills up
    _grow_until_full(eng, "full")
    eng.prepare(["long", "full"])
    acc = np.zeros((2, K), np.int32)
    lens = np.array([1, 5], np.int32)
    draft = np.zeros((2, K - 1), np.int32)
    rejects(eng, ValueError, "share memory", eng.extend, acc, lens, lens, draft)
    assert eng.automaton_len("long") == 1000


@pytest.mark.parametrize(
    "a, b",
    [("accepted", "match_len_out"), ("accepted", "draft_out"), ("accepted_lens", "match_len_out"),
     ("accepted_lens", "draft_out"), ("match_len_out", "draft_out")],
)
def test_extend_rejects_every_overlapping_pair(eng, bk, a, b):
    names = ["accepted", "accepted_lens", "match_len_out", "draft_out"]
    arrays = list(step_arrays(2))
    i, j = names.index(a), names.index(b)
    base = bk.array(np.zeros(64, np.int32))  # a device tensor on a GPU: its views share its memory
    # two views into one buffer with the right shapes, overlapping by one word
    first = base[: arrays[i].size].reshape(arrays[i].shape)
    start = arrays[i].size - 1
    second = base[start : start + arrays[j].size].reshape(arrays[j].shape)
    arrays[i], arrays[j] = first, second
    rejects(eng, ValueError, f"{a} and {b} share memory", bk.extend, eng, *arrays)


def test_extend_accepts_inputs_sharing_memory(eng, bk):
    """Two inputs may share memory (both are only read)."""
    base = bk.array(np.zeros(2 * (K + 1) + 2, np.int32))
    acc = base[: 2 * (K + 1)].reshape(2, K + 1)
    lens = base[2 * (K + 1) - 2 : 2 * (K + 1)]  # lens is the last two words of acc
    mout, dout = np.zeros(2, np.int32), np.zeros((2, K), np.int32)
    bk.extend(eng, acc, lens, mout, dout)
    assert mout.tolist() == [2, 2]


def test_device_overlap_check_reads_torch_metadata_only():
    """The CUDA backend's overlap check uses data_ptr ranges (no sync); shown
    here on CPU tensors, which carry the same metadata."""
    torch = pytest.importorskip("torch")
    from saspec.validate import check_no_overlap

    buf = torch.zeros(64, dtype=torch.int32)
    acc, lens = buf[:12].view(2, 6), buf[12:14]
    mout, dout = buf[14:16], buf[16:26].view(2, 5)
    check_no_overlap((acc, lens, mout, dout))  # adjacent, not overlapping
    with pytest.raises(ValueError, match="accepted_lens and match_len_out share memory"):
        check_no_overlap((acc, lens, buf[13:15], dout))
    with pytest.raises(ValueError, match="match_len_out and draft_out share memory"):
        check_no_overlap((acc, lens, mout, buf[15:25].view(2, 5)))
    check_no_overlap((acc, acc, mout, dout))  # inputs may share
    check_no_overlap((acc, lens, buf[14:14], dout))  # empty tensors share nothing


# -- threads: builds overlap steps, parallel steps serialise, a remove cancels an add


def test_add_request_in_a_thread_overlaps_extend():
    """A build holds neither the engine's lock (steps run while it is in progress: an
    Event holds the build open) nor the GIL (its kernel is compiled ``nogil``)."""
    from saspec import build

    assert build._ingest.targetoptions.get("nogil") is True
    eng = SpecEngine()
    eng.add_request("warm", [1, 2, 3])
    eng.prepare(["warm"])
    started, release = threading.Event(), threading.Event()
    _blocking_build(eng, started, release)
    rng = np.random.default_rng(5)
    big = rng.integers(0, 50_000, 30_000)
    t = threading.Thread(target=eng.add_request, args=("big", big))
    t.start()
    assert started.wait(30)
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = 2
    warm = SuffixAutomaton([1, 2, 3])
    for _ in range(20):  # the build is held open: these steps run beside it
        acc[0, :2] = rng.integers(0, 3, 2)
        eng.extend(acc, lens, mout, dout)
        warm.extend(acc[0, :2])
        assert mout[0] == warm.match()[0]
    assert t.is_alive() and "big" not in eng
    release.set()
    t.join(30)
    del eng._backend.build
    assert eng.automaton_len("big") == len(big)
    ref = SuffixAutomaton(big)
    eng.prepare(["big", "warm"])
    acc2, lens2, mout2, dout2 = step_arrays(2)
    eng.extend(acc2, lens2, mout2, dout2)
    assert mout2[0] == ref.match()[0] and dout2[0].tolist() == reference_draft(ref, K)


_TWO_ENGINES = """
import threading, numpy as np
from saspec import NgramDrafter, SpecEngine
B, K = 64, 4
def run(kind, seed, errors):
    try:
        rng = np.random.default_rng(seed)
        eng = kind(parallel_threshold=1)
        for i in range(B):
            eng.add_request(i, rng.integers(0, 20, 200))
        eng.prepare(list(range(B)))
        acc = rng.integers(0, 20, (B, K + 1)).astype(np.int32)
        lens = np.full(B, 2, np.int32)
        m, d = np.zeros(B, np.int32), np.zeros((B, K), np.int32)
        for _ in range(300):
            eng.extend(acc, lens, m, d)
    except BaseException as e:
        errors.append(e)
errors = []
ts = [threading.Thread(target=run, args=(kind, s, errors)) for s, kind in enumerate([SpecEngine, SpecEngine, NgramDrafter])]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
import numba
print("layer", numba.threading_layer())
"""


@pytest.mark.parametrize("layer", ["workqueue", "default"])
def test_engines_in_threads_run_parallel_batches(layer, tmp_path):
    """Several engines stepping parallel batches from several threads at once:
    numba's workqueue layer aborts the process on concurrent parallel calls
    unless saspec serialises them."""
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer != "default":
        env["NUMBA_THREADING_LAYER"] = layer
    run = subprocess.run([sys.executable, "-c", _TWO_ENGINES], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    if layer != "default":
        assert f"layer {layer}" in run.stdout


def test_parallel_is_off_by_default():
    """Parallel steps only when the caller opts in (on shared cores the
    parallel path is much slower than serial: BENCHMARKS.md, "Host engine")."""
    assert SpecEngine().parallel_threshold is None and NgramDrafter().parallel_threshold is None
    assert SpecEngine(parallel_threshold=64).parallel_threshold == 64
    for bad in (0, -1, 1.5, "64", True):
        with pytest.raises((TypeError, ValueError), match="parallel_threshold"):
            SpecEngine(parallel_threshold=bad)


def _blocking_build(eng, started: threading.Event, release: threading.Event):
    """Make ``eng``'s next build wait for ``release`` once it has started."""
    build = eng._backend.build

    def slow(tokens, headroom=None):
        started.set()
        assert release.wait(30)
        return build(tokens, headroom)

    eng._backend.build = slow


def test_remove_during_add_cancels_the_add(backend):
    eng = backend.engine()
    started, release = threading.Event(), threading.Event()
    _blocking_build(eng, started, release)
    result = []
    t = threading.Thread(target=lambda: result.append(eng.add_request("r", [1, 2, 3, 1, 2])))
    t.start()
    assert started.wait(30)
    eng.remove_request("r")  # cancels the build: no KeyError
    release.set()
    t.join(30)
    assert result == [False]
    assert "r" not in eng and len(eng) == 0 and eng.stats()["requests"] == 0
    with pytest.raises(KeyError, match="unknown request 'r'"):
        eng.remove_request("r")
    with pytest.raises(KeyError, match="unknown request 'r'"):
        eng.prepare(["r"])
    del eng._backend.build
    assert eng.add_request("r", [4, 5, 4]) is True  # the id can be added again
    eng.prepare(["r"])
    acc, lens, mout, dout = step_arrays(1)
    acc[0, 0], lens[0] = 5, 1
    backend.extend(eng, acc, lens, mout, dout)
    assert mout[0] == 2 and eng.automaton_len("r") == 4


def test_add_again_while_a_cancelled_build_runs():
    """After a cancel the id is free: a new add of it proceeds and the
    cancelled build's result never replaces it."""
    eng = SpecEngine()
    started, release = threading.Event(), threading.Event()
    _blocking_build(eng, started, release)
    result = []
    t = threading.Thread(target=lambda: result.append(eng.add_request("r", [9] * 50)))
    t.start()
    assert started.wait(30)
    eng.remove_request("r")
    del eng._backend.build
    assert eng.add_request("r", [1, 2, 3]) is True
    release.set()
    t.join(30)
    assert result == [False] and eng.automaton_len("r") == 3 and len(eng) == 1


# -- request sizes: the memory hint, the token limit, the recency depth ----------------


def test_expected_new_tokens_reserves_room_up_front():
    """With the hint the request's memory is sized at add_request and the
    steps within it never re-allocate; past it the request grows as usual, and
    matches and drafts are those of the plain automaton throughout."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 50, 300).astype(np.int32)
    stream = np.concatenate([prompt[40:400], rng.integers(0, 50, 400)]).astype(np.int32)
    hinted, plain = SpecEngine(), SpecEngine()
    hinted.add_request(0, prompt, expected_new_tokens=600)
    plain.add_request(0, prompt)
    assert hinted.stats()["bytes"] > plain.stats()["bytes"]
    ref = SuffixAutomaton(prompt, occurrence=hinted.occurrence)
    sizes = []
    for eng in (hinted, plain):
        eng.prepare([0])
    for i in range(0, len(stream), K + 1):
        chunk = stream[i : i + K + 1]
        ref.extend(chunk)
        for eng in (hinted, plain):
            acc, lens, mout, dout = step_arrays(1)
            acc[0, : len(chunk)] = chunk
            lens[0] = len(chunk)
            eng.extend(acc, lens, mout, dout)
            assert mout[0] == ref.match()[0] and dout[0].tolist() == reference_draft(ref, K)
        sizes.append((i + len(chunk), hinted.stats()["bytes"]))
    within = {b for n, b in sizes if n <= 600}
    assert within == {sizes[0][1]}  # no re-allocation within the hint
    assert sizes[-1][1] > sizes[0][1]  # 760 tokens: past the hint, it grew


def test_request_token_limit_fits_int32_offsets():
    """The limit leaves room for the largest blob any request of that many
    tokens can hold: 2n states and 3n edges (bounds for every automaton),
    each capacity overshot by a full growth step."""
    from saspec import build

    n = build.MAX_REQUEST_TOKENS
    worst = build.worst_case_words(n)
    assert worst <= build.MAX_BLOB_WORDS == 2**31 - 1
    assert worst >= core.layout_words(n, 2 * n, (4 * 3 * n) // 3)
    assert build.worst_case_words(2 * n) > build.MAX_BLOB_WORDS  # not needlessly small
    build.check_request_tokens(n, "prompt")
    with pytest.raises(ValueError, match=f"prompt would hold {n + 1} tokens, more than .*{n}"):
        build.check_request_tokens(n + 1, "prompt")


@pytest.fixture
def small_limit(monkeypatch):
    from saspec import build

    monkeypatch.setattr(build, "MAX_REQUEST_TOKENS", 40)
    return 40


def test_add_request_refuses_more_than_the_token_limit(eng, small_limit):
    rejects(eng, ValueError, "more than the limit of 40", eng.add_request, "c", list(range(41)))
    assert "c" not in eng
    eng.add_request("c", list(range(40)))


def test_suffix_automaton_refuses_more_than_the_token_limit(small_limit):
    with pytest.raises(ValueError, match="more than the limit of 40"):
        SuffixAutomaton(list(range(41)))
    sa = SuffixAutomaton(list(range(38)))
    with pytest.raises(ValueError, match="would hold 41 tokens"):
        sa.extend([1, 2, 3])
    assert len(sa) == 38
    sa.extend([1, 2])
    assert len(sa) == 40


def test_extend_refuses_growth_past_the_token_limit(small_limit):
    eng = SpecEngine()
    eng.add_request("a", list(range(30)))
    eng.add_request("b", list(range(38)))
    eng.prepare(["a", "b"])
    acc, lens, mout, dout = step_arrays(2)
    lens[:] = [3, 3]
    rejects(eng, ValueError, r"row 1 \(request 'b'\) would hold 41 tokens, more than the limit of 40", eng.extend,
            acc, lens, mout, dout)
    lens[:] = [3, 2]
    eng.extend(acc, lens, mout, dout)
    assert eng.automaton_len("b") == 40 and eng.automaton_len("a") == 33


@pytest.mark.parametrize("depth", [2**64, 2**31, -1, -5, 1.5, "4", None, True])
def test_recent_depth_is_validated(depth):
    with pytest.raises((TypeError, ValueError), match="recent_depth"):
        SpecEngine(recent_depth=depth)
    with pytest.raises((TypeError, ValueError), match="recent_depth"):
        SuffixAutomaton([1, 2], recent_depth=depth)


@pytest.mark.parametrize("depth", [0, 1, np.int64(7), 1024])
def test_recent_depth_in_range_is_accepted(depth):
    from saspec import build

    assert build.MAX_RECENT_DEPTH == 1024
    eng = SpecEngine(occurrence="near-recent", recent_depth=depth)
    eng.add_request("a", [1, 2, 1, 2])
    sa = SuffixAutomaton([1, 2, 1, 2], occurrence="recent", recent_depth=depth)
    assert sa.match() == (2, 2)


def test_recent_rule_cost_is_bounded_on_unary_text():
    """A unary prompt makes every suffix-link path as long as the text; the
    depth cap keeps the recent occurrence rules at O(depth) per token."""
    unary = np.zeros(200_000, np.int32)
    SuffixAutomaton(unary[:1000], occurrence="recent", recent_depth=1024)  # compile
    sa = SuffixAutomaton(unary, occurrence="recent", recent_depth=1024)
    assert sa.match()[0] == 199_999  # without the cap this build is quadratic: it would not finish


# -- a request that outgrows its device slot is reported -------------------------------


def test_device_overflow_is_reported(cuda_backend):
    import warnings

    bk = cuda_backend
    eng = bk.engine(max_slots=2, max_seq_len=8)
    eng.add_request("a", [1, 2, 3, 1, 2, 3, 1])
    eng.add_request("b", [4, 5])
    eng.prepare(["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert eng.stats()["overflowed"] == 0 and not eng.overflowed("a")
    acc, lens, mout, dout = step_arrays(2)
    acc[0, :3], lens[:] = [2, 3, 1], [3, 1]
    bk.extend(eng, acc, lens, mout, dout)  # "a" needs 10 tokens: overflows
    assert mout[0] == 0
    with pytest.warns(RuntimeWarning, match="request 'a' outgrew max_seq_len=8"):
        assert eng.stats()["overflowed"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per request
        assert eng.overflowed("a") and not eng.overflowed("b")
        assert eng.stats()["overflowed"] == 1
    with pytest.raises(KeyError, match="unknown request 'zz'"):
        eng.overflowed("zz")
    eng.remove_request("a")
    assert eng.stats()["overflowed"] == 0
    eng.add_request("a", [1, 2])  # a new request under the old id: not overflowed, warns again later
    assert not eng.overflowed("a")


def test_cpu_engine_never_overflows():
    eng = SpecEngine()
    eng.add_request("a", [1, 2])
    assert eng.stats()["overflowed"] == 0 and eng.overflowed("a") is False
