"""The drafting step on the device (``saspec.device.drafter.DeviceDrafter``) drafts what the host's
``saspec.Drafter`` drafts (length_rule "policy", the same K, settings and timings): the same tokens,
lengths, sources and match lengths, on random streams with requests arriving and finishing, a pool,
per-request options (off, caps, hints) and rows outgrowing their slots. Runs under numba's CUDA simulator
(``SASPEC_TEST_CUDA=sim``, the default; see tests/conftest.py) or on a real GPU
(``SASPEC_TEST_CUDA=device``); its kernels also compile to PTX without a GPU (test_ptx.py).

A row's drafts never run past its slot (``max_seq_len`` tokens, hints included), as the host's never run
past ``width``: episodes with small slots give every request hints of one length (or none) and the host
``width = max_seq_len - (hints and separator)``; episodes with varied hints have slots no row fills. Those
with small slots have no pool: a finished request pools the text its slot holds, on the device only the
first ``max_seq_len`` tokens.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from conftest import CUDA_SKIP, slow_selected, to_device, to_host
from saspec.drafter import Drafter
from saspec.policy import AUTOMATON, NONE, PolicySettings, StepCost, cpu_like, gpu_like, linear

pytestmark = [pytest.mark.skipif(bool(CUDA_SKIP), reason=str(CUDA_SKIP)),
              pytest.mark.usefixtures("fast_thread_switching")]


def device_drafter(*args, **kwargs):
    from saspec.device.drafter import DeviceDrafter

    return DeviceDrafter(*args, **kwargs)


def make_stream(rng, patterns: list[np.ndarray], n: int) -> np.ndarray:
    """A request's tokens: pieces of a few shared patterns, now and then a token of its own (so rows
    match their own text, the hints and the pool, and their drafts are often but not always accepted)."""
    out: list[int] = []
    while len(out) < n:
        out += patterns[int(rng.integers(0, len(patterns)))].tolist()
        if rng.random() < 0.3:
            out.append(int(rng.integers(0, 9)))
    return np.array(out[:n], np.int32)


def outputs(b: int, k: int) -> list:
    return [to_device(np.full((b, k), -9, np.int32))] + [to_device(np.full(b, -9, np.int32)) for _ in range(3)]


def run_episode(seed: int, steps: int) -> dict:
    """Drive a host Drafter and a DeviceDrafter with the same random episode; assert after every step that
    they drafted alike. Returns what the episode covered."""
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 2, 3, 5, 8]))
    n_slots = int(rng.integers(2, 8))
    small = rng.random() < 0.4
    if small:  # rows outgrow their slots
        seq_len = int(rng.integers(30, 160))
        hint_len = int(rng.choice([0, 0, 2, 5]))
        width = seq_len - (hint_len + 1 if hint_len else 0)
    else:
        seq_len, hint_len, width = 4096, -1, None
    # a pool only where no row outgrows its slot: a slot keeps max_seq_len tokens, so the device pools less
    # of an overflowed request's text than the host does
    pool_tokens = 0 if small else int(rng.choice([0, 3000]))
    settings = PolicySettings(prior_weight=float(rng.choice([1.0, 8.0, 30.0])),
                              row_memory=float(rng.choice([0.5, 0.9, 1.0])),
                              step_tolerance=float(rng.choice([0.0, 0.02, 0.2])))
    shape = [gpu_like, cpu_like, linear(3.0, 0.5)][int(rng.integers(0, 3))]
    window, max_age = int(rng.integers(2, 9)), int(rng.integers(4, 40))

    def cost():  # the same model twice: each drafter observes the same timings
        return StepCost(shape, max_tokens=n_slots * (k + 1), window=window, max_age=max_age)

    patterns = [rng.integers(0, 6, int(rng.integers(3, 12))).astype(np.int32) for _ in range(4)]
    host = Drafter(k, length_rule="policy", pool_tokens=pool_tokens, max_rows=n_slots, policy_settings=settings,
                   cost=cost())
    dev = device_drafter(k, n_slots, seq_len, pool_tokens=pool_tokens, policy_settings=settings, cost=cost())
    streams: dict[int, np.ndarray] = {}
    pos: dict[int, int] = {}
    live: list[int] = []
    next_id = 0
    last: list[int] | None = None
    verified = 0  # the tokens the host's last step verifies (its rows' new tokens and drafts)
    seen = dict.fromkeys(["rows", "drafted", "none", "overflowed", "off", "capped", "hints", "finished",
                          "pooled_finishes", "same"], 0)
    try:
        for step in range(steps):
            changed = False
            if len(live) > 1 and rng.random() < 0.1:  # a request finishes (in the batch or not)
                rid = live.pop(int(rng.integers(0, len(live))))
                host.finish(rid)
                dev.finish(rid)
                seen["finished"] += 1
                if host.pool is not None:  # its text is in both pools before the next step
                    assert host.pool.flush(60.0) and dev.pool.flush(60.0)
                    seen["pooled_finishes"] += 1
                changed = last is not None and rid in last
            arrivals = []
            if len(live) < n_slots and (not live or rng.random() < 0.25):
                for _ in range(int(rng.integers(1, 3))):
                    if len(live) + len(arrivals) >= n_slots:
                        break
                    rid = next_id
                    next_id += 1
                    stream = make_stream(rng, patterns, 40 + steps * (k + 1))
                    hints = None
                    if hint_len > 0 or (hint_len < 0 and rng.random() < 0.3):
                        n = hint_len if hint_len > 0 else int(rng.integers(1, 16))
                        hints = make_stream(rng, patterns, n) if rng.random() < 0.5 else stream[30: 30 + n].copy()
                    prompt_len = int(rng.integers(1, 30))
                    if small:
                        prompt_len = max(1, min(prompt_len, width - 1))
                    opts = {}
                    u = rng.random()
                    if u < 0.1:
                        opts["enabled"] = False
                        seen["off"] += 1
                    elif u < 0.3:
                        opts["max_draft_tokens"] = int(rng.integers(0, k + 2))
                        seen["capped"] += 1
                    if hints is not None:
                        opts["hints"] = hints
                        seen["hints"] += 1
                    options = opts if opts or rng.random() < 0.5 else None
                    host.start(rid, stream[:prompt_len], options)
                    dev.start(rid, stream[:prompt_len], options)
                    streams[rid], pos[rid] = stream, prompt_len
                    arrivals.append(rid)
                live += arrivals
            if arrivals or changed or last is None or rng.random() < 0.3:
                # a new batch; every arrival joins it (the host Drafter rereads its rows' options after a start)
                others = [r for r in live if r not in arrivals]
                n = int(rng.integers(0, len(others) + 1))
                ids = arrivals + [others[i] for i in rng.permutation(len(others))[:n]]
                ids = [ids[i] for i in rng.permutation(len(ids))]
                if not ids:
                    ids = [live[0]]
            else:
                ids = list(last)
            b = len(ids)
            same = ids == last
            seen["same"] += same
            dev.prepare(ids)
            lens = np.where(rng.random(b) < 0.1, 0, rng.integers(1, k + 2, b)).astype(np.int32)
            new = np.zeros((b, k + 1), np.int32)
            for i, rid in enumerate(ids):
                new[i, : lens[i]] = streams[rid][pos[rid]: pos[rid] + lens[i]]
                pos[rid] += int(lens[i])
            seconds = float(rng.choice([0.01 * (1 + rng.random()), 0.02 * rng.random(), 0.0, math.nan],
                                       p=[0.75, 0.15, 0.05, 0.05]))
            tokens = int(rng.integers(1, n_slots * (k + 1) + 8))
            mixed = same and verified > 0 and tokens > verified  # that forward also prefilled: not timed
            want = host.step(ids, new, lens, seconds=seconds, step_tokens=tokens, width=width)
            dev.observe_step(tokens, math.nan if mixed else seconds)
            verified = int((lens > 0).sum()) + int(want.lengths.sum())  # what the host's next step compares with
            out = outputs(b, k)
            dev.step(to_device(new), to_device(lens), *out)
            got_tokens, got_len, got_src, got_match = (to_host(x) for x in out)
            with warnings.catch_warnings():  # the engine warns once per request that outgrew its slot
                warnings.simplefilter("ignore", RuntimeWarning)
                over = np.array([dev.engine.overflowed(r) for r in ids], bool)
            where = (seed, step)
            assert np.array_equal(got_len, want.lengths), (*where, got_len, want.lengths, over)
            assert np.array_equal(got_src, want.sources), where
            assert np.array_equal(got_tokens, want.tokens), where
            ok = ~over
            assert np.array_equal(got_match[ok], want.match[ok]), (*where, got_match, want.match, over)
            if over.any():
                assert (got_len[over] == 0).all() and (got_tokens[over] == -1).all()
                if dev.pool is None:
                    assert (got_match[over] == 0).all()
            seen["overflowed"] += int(over.sum())
            seen["rows"] += b
            seen["drafted"] += int((got_src == AUTOMATON).sum())
            seen["none"] += int((got_src == NONE).sum())
            last = ids
    finally:
        host.close()
        dev.close()
    return seen


def test_device_step_equals_host_step():
    """About 1,000 random steps in the default suite (the slow run below does 10,000)."""
    totals: dict[str, int] = {}
    for seed in range(10):
        for key, v in run_episode(seed, 100).items():
            totals[key] = totals.get(key, 0) + v
    assert min(totals.values()) >= 5, totals  # every case was met


@pytest.mark.slow
def test_device_step_equals_host_step_on_10000_steps(request):
    if not slow_selected(request.config):
        pytest.skip("slow: run with `pytest -m slow` or SASPEC_SLOW=1")
    steps = 0
    for seed in range(100, 150):
        run_episode(seed, 200)
        steps += 200
    assert steps == 10_000


def started(k: int = 4, slots: int = 3, seq_len: int = 256, **kwargs):
    """A DeviceDrafter with two requests prepared (the second drafting off)."""
    dev = device_drafter(k, slots, seq_len, **kwargs)
    text = np.tile(np.arange(1, 7, dtype=np.int32), 6)
    dev.start("a", text)
    dev.start("b", text, {"enabled": False})
    dev.prepare(["a", "b"])
    return dev, text


def test_rows_past_the_prepared_batch_and_rows_with_drafting_off_draft_nothing():
    k = 4
    dev, text = started(k)
    try:
        new = np.zeros((3, k + 1), np.int32)
        new[:2, 0] = text[0]
        lens = np.array([1, 1, 1], np.int32)
        out = outputs(3, k)
        dev.step(to_device(new), to_device(lens), *out)
        tokens, lengths, sources, match = (to_host(x) for x in out)
        assert match[0] > 0 and lengths[0] > 0 and sources[0] == AUTOMATON
        assert (tokens[0, : lengths[0]] == text[1: 1 + lengths[0]]).all()
        assert (lengths[1:] == 0).all() and (sources[1:] == NONE).all() and (match[1:] == 0).all()
        assert (tokens[1:] == -1).all() and (tokens[0, lengths[0]:] == -1).all()
    finally:
        dev.close()


def test_bad_calls_are_refused_and_change_nothing():
    k = 4
    dev, text = started(k)
    try:
        new, lens = np.zeros((2, k + 1), np.int32), np.ones(2, np.int32)
        new[:, 0] = text[0]

        def step(**bad):
            args = {"accepted": new, "accepted_lens": lens, "tokens_out": np.zeros((2, k), np.int32),
                    "lengths_out": np.zeros(2, np.int32), "sources_out": np.zeros(2, np.int32),
                    "match_out": np.zeros(2, np.int32), **bad}
            dev.step(*(to_device(a) if isinstance(a, np.ndarray) else a for a in args.values()))

        with pytest.raises(TypeError, match="accepted_lens must have dtype int32"):
            step(accepted_lens=lens.astype(np.int64))
        with pytest.raises(ValueError, match="accepted must have shape"):
            step(accepted=np.zeros((2, k), np.int32))
        with pytest.raises(ValueError, match="tokens_out must have shape"):
            step(tokens_out=np.zeros((2, k + 1), np.int32))
        with pytest.raises(ValueError, match="at least the prepared batch's 2 rows"):
            step(accepted=new[:1].copy(), accepted_lens=lens[:1].copy(), tokens_out=np.zeros((1, k), np.int32),
                 lengths_out=np.zeros(1, np.int32), sources_out=np.zeros(1, np.int32), match_out=np.zeros(1, np.int32))
        shared = to_device(np.zeros(4, np.int32))
        with pytest.raises(ValueError, match="lengths_out overlaps sources_out"):
            step(lengths_out=shared[:2], sources_out=shared[1:3])
        with pytest.raises(KeyError, match="already started"):
            dev.start("a", text)
        with pytest.raises(ValueError, match="max_seq_len=256"):
            dev.start("c", np.zeros(257, np.int32))
        with pytest.raises(ValueError, match="unknown option"):
            dev.start("c", text, {"max_draft": 2})
        with pytest.raises(KeyError, match="'z' was not started"):
            dev.prepare(["a", "z"])
        with pytest.raises(ValueError, match="at most max_slots=3 rows"):
            dev.prepare(["a", "b", "c", "d"])
        assert "c" not in dev and len(dev) == 2
        # nothing changed: the batch drafts as the first step of a fresh drafter does
        out = outputs(2, k)
        dev.step(to_device(new), to_device(lens), *out)
        fresh, _ = started(k)
        want = outputs(2, k)
        fresh.step(to_device(new), to_device(lens), *want)
        fresh.close()
        for got, expected in zip(out, want):
            assert np.array_equal(to_host(got), to_host(expected))
        dev.finish("a")
        with pytest.raises(RuntimeError, match="call prepare"):
            step()
        dev.finish("a")  # unknown ids are ignored
    finally:
        dev.close()
    with pytest.raises(RuntimeError, match="closed"):
        dev.start("d", text)


def test_a_pool_still_empty_at_the_first_prepare_matches_rows_from_their_text_once_a_text_is_pooled():
    """The CUDA engine's rows follow the pool only once it holds a text, as the CPU engine's do: a row that
    stepped while the pool was empty matches the first pooled text from its own last tokens (it followed an
    empty pool before, and its pool match restarted from nothing)."""
    from saspec import SpecEngine

    k = 8
    engines = {"cpu": SpecEngine(pool_tokens=1000),
               "cuda": SpecEngine(backend="cuda", max_slots=4, max_seq_len=128, pool_tokens=1000)}
    got = {}
    for name, engine in engines.items():
        conv = to_device if name == "cuda" else (lambda a: a)
        engine.add_request("a", np.arange(100, 104, dtype=np.int32))
        engine.add_request("b", np.arange(1, 6, dtype=np.int32))

        def step(rows: list[str], tokens: list[list[int]]):
            b = len(rows)
            acc, lens = np.zeros((b, k + 1), np.int32), np.array([len(t) for t in tokens], np.int32)
            for i, t in enumerate(tokens):
                acc[i, : len(t)] = t
            match, draft, source = (conv(np.zeros(b, np.int32)), conv(np.zeros((b, k), np.int32)),
                                    conv(np.zeros(b, np.int32)))
            engine.step(rows, conv(acc), conv(lens), match, draft, source)
            return to_host(match), to_host(source)

        step(["a", "b"], [[7, 8, 9], list(range(6, 15))])
        step(["a", "b"], [[], list(range(15, 24))])
        engine.remove_request("b")  # its output (6..23) is pooled
        assert engine.request_pool.flush(60.0)
        got[name] = step(["a"], [[10, 11]])
        engine.close()
    assert got["cpu"][0].tolist() == [5] and got["cpu"][1].tolist() == [1]  # 7 8 9 10 11, from the pool
    assert got["cuda"][0].tolist() == [5] and got["cuda"][1].tolist() == [1]
