"""The CUDA backend: device slots, uploads, the kernel's handling of any input
values, and the hybrid selection op.

Runs under numba's CUDA simulator by default and on a real GPU with
SASPEC_TEST_CUDA=device (see tests/conftest.py); the tests marked ``device``
need a real GPU. Tests of ``select`` need neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from saspec import SpecEngine, core
from saspec.build import DEFAULT_OCCURRENCE, occurrence_code
from saspec.rules import select_drafts, select_drafts_np
from test_engine import step_arrays

K = 5
device_only = pytest.mark.skipif(os.environ.get("SASPEC_TEST_CUDA", "sim") != "device", reason="needs a real GPU")



def no_draft(k=K):
    return 0, [-1] * k


@njit
def _init(buf, cap_tok, cap_st, ht_size):
    core.init(buf, cap_tok, cap_st, ht_size)


@njit
def _fill_fixed(buf, tokens, occurrence):
    """Feed tokens with extend_fixed; return how many were appended before overflow."""
    for i in range(tokens.shape[0]):
        if core.extend_fixed(buf, tokens[i], occurrence, 4) != core.APPENDED:
            return i
    return tokens.shape[0]


@njit
def _transition(buf, src, token):
    return core.transition(buf, src, token)


# -- the CUDA backend agrees with the CPU backend, whatever the input values -----------


def sanitize(acc_row, n, k=K):
    """What the GPU path appends for one row: lengths clamped, cut at a negative token."""
    toks = acc_row[: min(max(int(n), 0), k + 1)]
    neg = np.flatnonzero(toks < 0)
    return (toks[: neg[0]], True) if neg.size else (toks, False)


def test_matches_cpu_backend_through_reuse_overflow_and_bad_values(cuda_backend):
    """Random adds, removes and steps with few slots and short capacity, so
    slots are reused, prepare runs out of slots, requests overflow, batches are
    padded, and lengths and tokens are out of range; the CUDA engine must
    agree with the CPU engine fed the inputs the GPU path is documented to use."""
    bk = cuda_backend
    seq_len, n_slots = 128, 4
    gpu = bk.engine(max_slots=n_slots, max_seq_len=seq_len)
    cpu = SpecEngine()
    rng = np.random.default_rng(7)
    live: list[int] = []
    next_id = 0
    seen = dict.fromkeys(["no slot", "reuse", "overflow", "negative", "padding", "clamped", "compared"], 0)
    for step in range(120):
        if len(live) < 2 or rng.random() < 0.12:
            base = rng.integers(0, 8, rng.integers(1, 20))
            prompt = np.concatenate([base] * int(rng.integers(1, 4)))[:seq_len]
            if next_id % 7 == 3:
                prompt = rng.integers(0, 8, seq_len - int(rng.integers(0, 3)))  # (almost) full: overflows soon
            gpu.add_request(next_id, prompt)
            cpu.add_request(next_id, prompt)
            live.append(next_id)
            next_id += 1
        if len(live) > 1 and rng.random() < 0.12:
            rid = live.pop(int(rng.integers(len(live))))
            gpu.remove_request(rid)
            cpu.remove_request(rid)
        ids = [live[i] for i in rng.permutation(len(live))[: rng.integers(1, len(live) + 1)]]
        pool = gpu._backend.slots
        new = [r for r in ids if r not in pool.slot_of]
        seen["reuse"] += sum(pool._used[s] for s in pool._free[len(pool._free) - len(new) :]) if new else 0
        if len(new) > pool.free_slots:
            seen["no slot"] += 1
            snap = gpu._blob_copies(), gpu._batch, dict(pool.slot_of)
            with pytest.raises(RuntimeError, match="no free device slot"):
                gpu.prepare(ids)
            assert (gpu._blob_copies().keys(), gpu._batch, pool.slot_of) == (snap[0].keys(), snap[1], snap[2])
            ids = [r for r in ids if r in pool.slot_of] + new[: pool.free_slots]
            if not ids:
                continue
        gpu.prepare(ids)
        cpu.prepare(ids)

        pad = int(rng.integers(1, 3)) if rng.random() < 0.3 else 0
        acc, lens, mout, dout = step_arrays(len(ids) + pad)
        acc[:] = rng.integers(0, 8, acc.shape)
        lens[:] = rng.integers(-2, K + 4, lens.shape)
        bad_rows = rng.random(len(lens)) < 0.1
        acc[bad_rows, rng.integers(0, K + 1)] = -int(rng.integers(1, 2**31))
        bk.extend(gpu, acc, lens, mout, dout)

        cacc, clens, cmout, cdout = step_arrays(len(ids))
        negative = []
        for b in range(len(ids)):
            toks, neg = sanitize(acc[b], lens[b])
            cacc[b, : len(toks)], clens[b] = toks, len(toks)
            negative.append(neg)
        cpu.extend(cacc, clens, cmout, cdout)
        for b, rid in enumerate(ids):
            n_cpu = cpu.automaton_len(rid)
            assert gpu.automaton_len(rid) == min(n_cpu, seq_len), (step, rid)
            expected = no_draft() if negative[b] or n_cpu > seq_len else (cmout[b], cdout[b].tolist())
            seen["negative"] += negative[b]
            seen["overflow"] += n_cpu > seq_len
            seen["compared"] += not (negative[b] or n_cpu > seq_len)
            seen["clamped"] += not 0 <= lens[b] <= K + 1
            assert (mout[b], dout[b].tolist()) == expected, (step, rid, b)
        for b in range(len(ids), len(ids) + pad):
            assert (mout[b], dout[b].tolist()) == no_draft(), (step, "padding", b)
        seen["padding"] += pad
    assert min(seen.values()) > 0, seen
    stats = gpu.stats()
    assert stats["requests"] == len(live) and stats["free_slots"] == n_slots - len(gpu._backend.slots.slot_of)


def test_values_out_of_range_are_handled_on_the_device(cuda_backend):
    bk = cuda_backend
    eng = bk.engine(max_slots=4, max_seq_len=64)
    for rid in "abc":
        eng.add_request(rid, [1, 2, 3, 1, 2])
    eng.prepare(["a", "b", "c"])
    acc, lens, mout, dout = step_arrays(3)
    acc[:] = [3, 1, 2, 3, 1, 2]
    acc[1, 2] = -5  # row 1: 3, 1 appended, then stops
    lens[:] = [K + 9, 4, -3]  # row 0 clamped to K+1, row 2 to 0
    bk.extend(eng, acc, lens, mout, dout)
    assert [eng.automaton_len(r) for r in "abc"] == [5 + K + 1, 7, 5]
    assert (mout[1], dout[1].tolist()) == no_draft()
    assert mout[0] == 5 + K + 1 - 3 and mout[2] == 2
    acc[:, 0], lens[:] = 2, 1  # the next step of row 1 is normal again
    bk.extend(eng, acc, lens, mout, dout)
    assert mout[1] == 5 and eng.automaton_len("b") == 8  # 1 2 3 1 2 3 1 2


def test_add_request_in_threads_while_extending(cuda_backend):
    bk = cuda_backend
    gpu = bk.engine(max_slots=8, max_seq_len=4096)
    rng = np.random.default_rng(11)
    prompts = {i: np.tile(rng.integers(0, 50, 60), 4) for i in range(4)}
    gpu.add_request("warm", [1, 2, 3, 1, 2])
    gpu.prepare(["warm"])
    threads = [threading.Thread(target=gpu.add_request, args=(i, p)) for i, p in prompts.items()]
    for t in threads:
        t.start()
    acc, lens, mout, dout = step_arrays(1)
    lens[0] = 1
    warm = [1, 2, 3, 1, 2]
    while any(t.is_alive() for t in threads) or len(warm) < 10:
        acc[0, 0] = warm[-3]
        bk.extend(gpu, acc, lens, mout, dout)
        warm.append(warm[-3])
    for t in threads:
        t.join()
    assert gpu.automaton_len("warm") == len(warm)
    ids = [3, "warm", 0, 2, 1]
    gpu.prepare(ids)
    cpu = SpecEngine()
    for i, p in prompts.items():
        cpu.add_request(i, p)
    cpu.add_request("warm", warm)
    cpu.prepare(ids)
    got, want = step_arrays(len(ids)), step_arrays(len(ids))
    bk.extend(gpu, *got)
    cpu.extend(*want)
    assert np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3])


# -- slots: capacity, no free slot, reuse, size ----------------------------------------


def test_prompt_longer_than_max_seq_len_is_rejected(cuda_backend):
    bk = cuda_backend
    eng = bk.engine(max_slots=2, max_seq_len=16)
    eng.add_request("a", [1, 2, 3])
    before = eng.stats()
    with pytest.raises(ValueError, match="17 tokens, more than max_seq_len=16"):
        eng.add_request("b", list(range(17)))
    assert "b" not in eng and eng.stats() == before
    eng.add_request("full", [1, 2] * 8)  # exactly max_seq_len fits
    eng.prepare(["full", "a"])
    acc, lens, mout, dout = step_arrays(2)
    acc[:, 0], lens[:] = 1, 1
    bk.extend(eng, acc, lens, mout, dout)
    assert (mout[0], dout[0].tolist()) == no_draft()  # no room for a 17th token
    assert eng.automaton_len("full") == 16 and mout[1] == 1
    bk.extend(eng, acc, lens, mout, dout)
    assert (mout[0], dout[0].tolist()) == no_draft() and eng.automaton_len("full") == 16


def test_no_free_slot_changes_nothing_and_freed_slots_are_reused(cuda_backend):
    bk = cuda_backend
    eng = bk.engine(max_slots=2, max_seq_len=64)
    cpu = SpecEngine()
    prompts = {"a": [1, 2, 3, 1, 2], "b": [5, 6, 5, 6, 5], "c": [7, 8, 9, 7, 8, 9, 7]}
    for rid, p in prompts.items():
        eng.add_request(rid, p)
        cpu.add_request(rid, p)
    eng.prepare(["a", "b"])
    slots = dict(eng._backend.slots.slot_of)
    before = eng._blob_copies(), eng.stats()
    with pytest.raises(
        RuntimeError, match=r"no free device slot: the batch needs 1 new slot\(s\) but 0 of max_slots=2"
    ):
        eng.prepare(["a", "c"])
    assert eng._batch == ("a", "b") and eng._backend.slots.slot_of == slots
    assert eng.stats() == before[1]
    after = eng._blob_copies()
    assert all(np.array_equal(after[r], before[0][r]) for r in prompts)
    eng.remove_request("b")
    eng.prepare(["c", "a"])  # "c" reuses b's slot, which must be cleared first
    assert eng._backend.slots.slot_of["c"] == slots["b"]
    cpu.prepare(["c", "a"])
    for _ in range(3):
        got, want = step_arrays(2), step_arrays(2)
        for arrays in (got, want):
            arrays[0][:, :2] = [[7, 8], [3, 1]]
            arrays[1][:] = 2
        bk.extend(eng, *got)
        cpu.extend(*want)
        assert np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3])


def test_slot_size_and_stats(cuda_backend):
    eng = cuda_backend.engine(max_slots=3, max_seq_len=100)
    stats = eng.stats()
    slot_bytes = 4 * core.layout_words(100, 201, 134)  # 100 tokens, 201 states, ceil(400 / 3) table slots
    assert stats["device_bytes_per_slot"] == slot_bytes <= 100 * 100 + 80
    no_pool = 4 * (core.HEADER + 3 * 3 + 3)  # without a pool: its stand-in automaton, slot states and control words
    assert stats["device_bytes"] == 3 * slot_bytes + 4 * (1 + 3) + no_pool
    assert (stats["max_slots"], stats["free_slots"], stats["max_seq_len"]) == (3, 3, 100)
    eng.add_request("a", [1, 2, 3, 4])
    assert eng.stats()["bytes"] > 0 and eng.stats()["tokens"] == 4  # on the host until prepared
    eng.prepare(["a"])
    stats = eng.stats()
    assert (stats["bytes"], stats["tokens"], stats["free_slots"]) == (0, 4, 2)


@pytest.mark.parametrize("max_seq_len", [1, 2, 3, 7, 64])
def test_slot_layout_never_runs_out_before_max_seq_len(max_seq_len):
    pytest.importorskip("numba_cuda")
    from saspec.device.slots import slot_layout

    lay = slot_layout(max_seq_len)
    assert lay.nbytes <= 100 * max_seq_len + 80
    rng = np.random.default_rng(max_seq_len)
    fib = "a"
    prev = "b"
    while len(fib) < max_seq_len + 1:
        fib, prev = fib + prev, fib
    sequences = (
        [
            np.arange(max_seq_len + 1),  # all distinct
            np.zeros(max_seq_len + 1),  # one token
            np.array([0] + [1] * max_seq_len),  # "abbb...": the 2n-1 states bound
            np.array([ord(c) for c in fib[: max_seq_len + 1]]),  # Fibonacci word
        ]
        + [rng.integers(0, a, max_seq_len + 1) for a in (2, 3, 5) for _ in range(20)]
    )
    for seq in sequences:
        buf = np.empty(lay.words, np.int32)
        _init(buf, lay.cap_tok, lay.cap_st, lay.ht_size)
        assert _fill_fixed(buf, seq.astype(np.int32), occurrence_code(DEFAULT_OCCURRENCE)) == max_seq_len
        assert buf[core.H_OVERFLOW] == 1  # the token past max_seq_len
    with pytest.raises(ValueError, match="max_seq_len must be >= 1"):
        slot_layout(0)


# -- uploads rebuild the host's automaton, once per request ----------------------------


def edges_of(buf):
    slots, ht = buf[core.H_O_SLOTS], buf[core.H_HT_SIZE]
    recs = buf[slots : slots + core.SLOT_WORDS * ht].reshape(ht, core.SLOT_WORDS)
    used = recs[recs[:, core.SRC] != -1]
    return {(int(s), int(t), int(d)) for s, t, d in used[:, :3]}


def test_upload_rebuilds_the_same_automaton(cuda_backend):
    """The parallel rebuild (CAS inserts, exchanged chain heads) gives the
    host's states and edges in the device layout, every edge reachable by
    ``core.find_slot`` and on exactly its state's chain."""
    from saspec import build
    from saspec.device.slots import payload_words, slot_layout

    rng = np.random.default_rng(5)
    prompt = np.concatenate([np.tile(rng.integers(0, 9, 13), 8), rng.integers(0, 40, 150)])
    eng = cuda_backend.engine(max_slots=3, max_seq_len=400)
    eng.add_request("other", [4, 4, 4])
    eng.add_request("r", prompt)
    host = eng._blob_copies()["r"]
    eng.prepare(["other", "r"])
    dev = eng._blob_copies()["r"]
    lay = slot_layout(400)
    ref = np.empty(lay.words, np.int32)
    _init(ref, lay.cap_tok, lay.cap_st, lay.ht_size)
    for h in range(core.HEADER):  # capacities and offsets as core.init lays them out, the rest as the host
        layout_word = h in (
            core.H_CAP_TOK,
            core.H_CAP_ST,
            core.H_HT_SIZE,
            core.H_O_TEXT,
            core.H_O_STATES,
            core.H_O_AUX,
            core.H_O_SLOTS,
        )
        assert dev[h] == (ref[h] if layout_word else host[h]), h
    n, ns = int(host[core.H_N]), int(host[core.H_NSTATES])
    assert np.array_equal(dev[dev[core.H_O_TEXT] :][:n], prompt)
    hs = host[host[core.H_O_STATES] :][: core.STATE_WORDS * ns].reshape(ns, core.STATE_WORDS)
    ds = dev[dev[core.H_O_STATES] :][: core.STATE_WORDS * ns].reshape(ns, core.STATE_WORDS)
    assert np.array_equal(hs, ds)  # first edges travel inline
    ha = host[host[core.H_O_AUX] :][: core.AUX_WORDS * ns].reshape(ns, core.AUX_WORDS)
    da = dev[dev[core.H_O_AUX] :][: core.AUX_WORDS * ns].reshape(ns, core.AUX_WORDS)
    assert np.array_equal(ha[:, core.POS], da[:, core.POS])
    edges = edges_of(host)
    assert edges_of(dev) == edges and dev[core.H_USED] == len(edges)
    for s, t, d in edges:
        assert _transition(dev, s, t) == d
    slots = dev[core.H_O_SLOTS]
    for s in range(ns):
        i, chain = da[s, core.MORE], set()
        while i != -1:
            w = slots + core.SLOT_WORDS * i
            assert dev[w + core.SRC] == s and i not in chain
            chain.add(int(i))
            i = dev[w + core.NEXT]
        assert len(chain) == sum(1 for e in edges if e[0] == s)
        assert (ds[s, core.DST] < 0) == (len(chain) > 0)  # the record says whether the table holds more
    # The upload is O(request): tokens, states and table edges, whatever max_seq_len.
    words_per_state = core.STATE_WORDS + core.AUX_WORDS
    assert payload_words(host) == core.HEADER + n + words_per_state * ns + 3 * len(edges)
    blob = build.new_blob(0)
    assert payload_words(blob) == core.HEADER + words_per_state


def test_requests_stay_resident_and_are_uploaded_once(cuda_backend):
    bk = cuda_backend
    eng = bk.engine(max_slots=4, max_seq_len=64)
    for rid in "abc":
        eng.add_request(rid, [1, 2, 3, 1])
    eng.prepare(["a", "b"])
    slots = dict(eng._backend.slots.slot_of)
    assert eng._backend.host.blobs[eng._slot["a"]][core.H_N] == 0  # the host copy was dropped
    arrays = step_arrays(2)
    arrays[0][:, 0], arrays[1][:] = 2, 1
    bk.extend(eng, *arrays)
    eng.prepare(["b", "c", "a"])  # a and b keep their slots and their appended token
    assert {r: eng._backend.slots.slot_of[r] for r in "ab"} == slots
    assert [eng.automaton_len(r) for r in "abc"] == [5, 5, 4]


# -- construction, and a CPU backend that never loads numba-cuda -----------------------


def test_constructor_arguments(cuda_backend):
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        SpecEngine(backend="tpu")
    with pytest.raises(ValueError, match="needs max_slots and max_seq_len"):
        SpecEngine(backend="cuda", max_slots=4)
    with pytest.raises(ValueError, match="max_slots applies to backend='cuda' only"):
        SpecEngine(max_slots=4)
    with pytest.raises(ValueError, match="max_slots must be .*an int >= 1, got 0"):
        SpecEngine(backend="cuda", max_slots=0, max_seq_len=8)
    for bad in ({"max_slots": 2.7, "max_seq_len": 8}, {"max_slots": "3", "max_seq_len": 8},
                {"max_slots": 2, "max_seq_len": 8.9}, {"max_slots": True, "max_seq_len": 8}):
        with pytest.raises(TypeError, match="must be .*an int >= 1"):
            SpecEngine(backend="cuda", **bad)
    with pytest.raises(ValueError, match="more than 2\\*\\*31 - 1"):
        SpecEngine(backend="cuda", max_slots=1, max_seq_len=2**27)
    with pytest.raises(ValueError, match="unknown occurrence rule"):
        SpecEngine(backend="cuda", max_slots=1, max_seq_len=8, occurrence="best")


def test_cpu_backend_does_not_import_numba_cuda():
    code = (
        "import sys, numpy as np, saspec\n"
        "e = saspec.SpecEngine(); e.add_request(0, [1, 2, 1]); e.prepare([0])\n"
        "a = np.zeros((1, 3), np.int32); l = np.ones(1, np.int32); m = np.zeros(1, np.int32); d = np.zeros((1, 2), np.int32)\n"
        "e.extend(a, l, m, d)\n"
        "import saspec.rules, saspec.policy\n"
        "bad = [m for m in sys.modules if m.startswith(('numba.cuda', 'numba_cuda'))]\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parent, timeout=300)


# -- on a real GPU: tensor checks, no host sync, CUDA-graph replays --------------------


@device_only
def test_device_rejects_bad_tensors(cuda_backend):
    import torch

    eng = cuda_backend.engine(max_slots=2, max_seq_len=32)
    eng.add_request("a", [1, 2, 1])
    eng.prepare(["a"])
    good = [torch.from_numpy(a).cuda() for a in step_arrays(1)]
    eng.extend(*good)
    cases = [
        (0, good[0].cpu(), ValueError, "must be on cuda"),
        (1, good[1].long(), TypeError, "int32"),
        (3, torch.zeros((1, 2 * K), dtype=torch.int32, device="cuda")[:, ::2], ValueError, "contiguous"),
        (2, good[2].float().requires_grad_(), TypeError, "int32"),
        (0, good[0].tolist(), TypeError, "torch CUDA tensor"),
    ]
    for which, bad, exc, match in cases:
        args = list(good)
        args[which] = bad
        with pytest.raises(exc, match=match):
            eng.extend(*args)


@device_only
def test_extend_does_not_sync_and_graph_replays_match_cpu(cuda_backend):
    """extend + select_drafts captured in a CUDA graph; replays (with batches
    re-prepared in between) agree with the CPU backend step by step."""
    import torch

    rng = np.random.default_rng(3)
    b, k = 16, 8
    gpu = cuda_backend.engine(max_slots=32, max_seq_len=4096)
    cpu = SpecEngine()
    ids = list(range(b))
    for rid in ids:
        p = np.tile(rng.integers(0, 30, 40), 5)
        gpu.add_request(rid, p)
        cpu.add_request(rid, p)
    gpu.prepare(ids)
    cpu.prepare(ids)
    acc = torch.zeros((b, k + 1), dtype=torch.int32, device="cuda")
    lens = torch.zeros(b, dtype=torch.int32, device="cuda")
    mout = torch.zeros(b, dtype=torch.int32, device="cuda")
    dout = torch.zeros((b, k), dtype=torch.int32, device="cuda")
    neural = torch.full((b, k), 7, dtype=torch.int32, device="cuda")
    threshold = torch.tensor(3, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up (compiles) outside the capture
            gpu.extend(acc, lens, mout, dout)
    torch.cuda.current_stream().wait_stream(side)
    cpu.extend(*[np.zeros(t.shape, np.int32) for t in (acc, lens, mout, dout)])
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu.extend(acc, lens, mout, dout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu.extend(*[np.zeros(t.shape, np.int32) for t in (acc, lens, mout, dout)])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.extend(acc, lens, mout, dout)
        drafts, use_sa = select_drafts(neural, dout, mout, threshold)
    for step in range(40):
        if step == 20:  # a smaller batch: the captured kernel must read the new map
            gpu.prepare(ids[: b // 2])
            cpu.prepare(ids[: b // 2])
        nb = b if step < 20 else b // 2
        a = rng.integers(0, 30, (b, k + 1)).astype(np.int32)
        n = rng.integers(0, k + 2, b).astype(np.int32)
        acc.copy_(torch.from_numpy(a))
        lens.copy_(torch.from_numpy(n))
        graph.replay()
        ca, cn, cm, cd = a[:nb].copy(), n[:nb].copy(), np.zeros(nb, np.int32), np.zeros((nb, k), np.int32)
        cpu.extend(ca, cn, cm, cd)
        m, d = mout.cpu().numpy(), dout.cpu().numpy()
        assert np.array_equal(m[:nb], cm) and np.array_equal(d[:nb], cd), step
        assert (m[nb:] == 0).all() and (d[nb:] == -1).all()
        want, want_use = select_drafts_np(np.full((b, k), 7), d, m, 3)
        assert np.array_equal(drafts.cpu().numpy(), want) and np.array_equal(use_sa.cpu().numpy(), want_use)


# -- select_drafts: the SA where the match reaches the threshold, neural elsewhere -----


def select_cases():
    neural = np.arange(12, dtype=np.int64).reshape(4, 3) + 100
    sa = -np.arange(12, dtype=np.int32).reshape(4, 3)
    match = np.array([0, 2, 5, 9], np.int32)
    return neural, sa, match


@pytest.mark.parametrize(
    "threshold, use",
    [
        (0, [0, 1, 1, 1]),  # a row without a match never uses the SA
        (2, [0, 1, 1, 1]),
        (2.5, [0, 0, 1, 1]),
        (9, [0, 0, 0, 1]),
        (float("inf"), [0, 0, 0, 0]),
        (float("-inf"), [0, 1, 1, 1]),
        (np.array([1, 3, 5, 10]), [0, 0, 1, 0]),
    ],
)
def test_select_drafts(threshold, use):
    neural, sa, match = select_cases()
    want = np.where(np.array(use, bool)[:, None], sa, neural)
    drafts, use_sa = select_drafts_np(neural, sa, match, threshold)
    assert use_sa.tolist() == [bool(u) for u in use] and np.array_equal(drafts, want)
    torch = pytest.importorskip("torch")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        t = [torch.from_numpy(x).to(dev) for x in (neural, sa, match)]
        thr = torch.from_numpy(threshold).to(dev) if isinstance(threshold, np.ndarray) else threshold
        drafts, use_sa = select_drafts(*t, thr)
        assert drafts.dtype == torch.int64 and use_sa.dtype == torch.bool
        assert use_sa.cpu().tolist() == [bool(u) for u in use] and np.array_equal(drafts.cpu().numpy(), want)
        if not isinstance(threshold, np.ndarray) and np.isfinite(threshold):
            d0, u0 = select_drafts(*t, torch.tensor(threshold, device=dev))  # a 0-d tensor threshold
            assert u0.cpu().tolist() == [bool(u) for u in use] and np.array_equal(d0.cpu().numpy(), want)


def test_select_drafts_rejects_bad_shapes():
    neural, sa, match = select_cases()
    with pytest.raises(ValueError, match="shape of neural"):
        select_drafts_np(neural, sa[:, :2], match, 1)
    with pytest.raises(ValueError, match="match_len must have shape"):
        select_drafts_np(neural, sa, match[:3], 1)
    with pytest.raises(ValueError, match="NaN"):
        select_drafts_np(neural, sa, match, float("nan"))
    with pytest.raises(ValueError, match="threshold must be a number"):
        select_drafts_np(neural, sa, match, np.array([1, 2]))
    torch = pytest.importorskip("torch")
    t = [torch.from_numpy(x) for x in (neural, sa, match)]
    with pytest.raises(ValueError, match="threshold must be 0-d"):
        select_drafts(*t, torch.ones((4, 1)))
    with pytest.raises(ValueError, match="2-D"):
        select_drafts(t[0][0], t[1][0], t[2], 1)


def test_the_pool_drafts_alike_on_both_backends(cuda_backend):
    """A cross-request pool on the device: the same adds, removes and steps give the CUDA
    engine the matches, drafts and sources the CPU engine gives (the device sees a grown
    pool from the next prepare, so the CPU engine's pool is published at the same calls)."""
    from saspec import RequestPool

    bk = cuda_backend
    rng = np.random.default_rng(3)
    phrases = [rng.integers(0, 30, int(rng.integers(3, 8))).tolist() for _ in range(10)]

    def text(n):
        out = []
        while len(out) < n:
            out += phrases[int(rng.integers(len(phrases)))] if rng.random() < 0.7 else [int(rng.integers(30))]
        return out[:n]

    gpool, cpool = RequestPool(3000, prompts=True, manual=True), RequestPool(3000, prompts=True, manual=True)
    gpu = bk.engine(max_slots=4, max_seq_len=256, pool=gpool)
    cpu = SpecEngine(pool=cpool)
    live, next_id, pooled = [], 0, 0
    for step in range(80):
        if len(live) < 3:
            prompt = text(int(rng.integers(1, 30)))
            for e in (gpu, cpu):
                e.add_request(next_id, prompt)
            live.append(next_id)
            next_id += 1
        if rng.random() < 0.15 and len(live) > 1:
            rid = live.pop(0)
            for e in (gpu, cpu):
                e.remove_request(rid)
        if step % 5 == 0:  # both pools change here; the device takes it at this prepare
            for p in (gpool, cpool):
                p.publish()
                p.flush()
            for p in (gpool, cpool):
                p.publish()
        for e in (gpu, cpu):
            e.prepare(live)
        acc, lens, mout, dout = step_arrays(len(live))
        for b in range(len(live)):
            new = text(int(rng.integers(0, K + 2)))[: K + 1]
            acc[b, : len(new)], lens[b] = new, len(new)
        src = np.zeros(len(live), np.int32)
        bk.extend(gpu, acc, lens, mout, dout, src)
        cacc, clens, cm, cd = acc.copy(), lens.copy(), np.zeros_like(mout), np.zeros_like(dout)
        csrc = np.zeros_like(src)
        cpu.extend(cacc, clens, cm, cd, csrc)
        assert (mout.tolist(), dout.tolist(), src.tolist()) == (cm.tolist(), cd.tolist(), csrc.tolist()), step
        pooled += int(src.sum())
    assert pooled > 0 and gpu.stats()["device_bytes"] > 0
