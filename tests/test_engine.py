"""SpecEngine's batch lifecycle: results, validation, threads.

Tests taking the ``backend`` fixture (tests/conftest.py) run on the CPU backend
and on the CUDA backend (numba's CUDA simulator by default, a real GPU with
SASPEC_TEST_CUDA=device), expecting the same results.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from saspec import NgramDrafter, SpecEngine, SuffixAutomaton
from saspec.ngram import ngram_draft

K = 5


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


@pytest.mark.parametrize("policy", ["first", "near-recent"])
@pytest.mark.parametrize("parallel_threshold", [1, 1000])
def test_interleaved_lifecycle_matches_single_automata(policy, parallel_threshold, backend):
    if backend.cuda and parallel_threshold == 1:
        pytest.skip("parallel_threshold is a CPU-backend setting")
    rng = np.random.default_rng(0)
    eng = backend.engine(policy=policy, parallel_threshold=parallel_threshold)
    refs: dict[int, SuffixAutomaton] = {}
    next_id = 0
    for step in range(300):
        if len(refs) < 3 or rng.random() < 0.15:  # add
            base = rng.integers(0, 40, rng.integers(1, 30))
            prompt = np.concatenate([base] * int(rng.integers(1, 4)))
            eng.add_request(next_id, prompt)
            refs[next_id] = SuffixAutomaton(prompt, policy=policy)
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


# -- validation: one test per rule, each checking that nothing changed ---------


def snapshot(eng: SpecEngine):
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
    with pytest.raises(ValueError, match="unknown policy 'best'"):
        SpecEngine(policy="best")
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="k must be >= 0"):
        SuffixAutomaton([1]).draft(-1)


# -- threads -------------------------------------------------------------------


def test_add_request_in_a_thread_overlaps_extend():
    eng = SpecEngine()
    eng.add_request("warm", [1, 2, 3])
    eng.prepare(["warm"])
    eng.extend(*step_arrays(1))  # compile before timing anything
    rng = np.random.default_rng(5)
    big = rng.integers(0, 50_000, 3_000_000)
    steps_during_build = []
    done = threading.Event()

    def add():
        eng.add_request("big", big)
        done.set()

    acc, lens, mout, dout = step_arrays(1)
    lens[0] = 2
    t = threading.Thread(target=add)
    t.start()
    n = 0
    while not done.is_set():
        acc[0, :2] = rng.integers(0, 3, 2)
        eng.extend(acc, lens, mout, dout)
        n += 1
        time.sleep(0)
    steps_during_build.append(n)
    t.join()
    assert eng.automaton_len("big") == len(big)
    assert steps_during_build[0] > 10, "extend did not run while add_request built"
    ref = SuffixAutomaton(big)
    eng.prepare(["big", "warm"])
    acc2, lens2, mout2, dout2 = step_arrays(2)
    eng.extend(acc2, lens2, mout2, dout2)
    assert mout2[0] == ref.match()[0] and dout2[0].tolist() == reference_draft(ref, K)
