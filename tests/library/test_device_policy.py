"""The policy's step on the device (``saspec.device.policy.DevicePolicy``) chooses what the host's
``DraftPolicy.step`` chooses: the same lengths, sources, bucket estimates, row evidence and counters, on
random steps with requests arriving, finishing and moving between rows, random offers, emitted tokens and
timings. Runs under numba's CUDA simulator (``SASPEC_TEST_CUDA=sim``, the default; see tests/conftest.py)
or on a real GPU (``SASPEC_TEST_CUDA=device``); the kernel also compiles to PTX without a GPU (test_ptx.py, and
here without fused products).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import CUDA_SKIP, ptx_reports, slow_selected, to_device, to_host
from saspec.policy import (AUTOMATON, N_BUCKETS, NONE, DraftPolicy, PolicySettings, StepCost, cpu_like, gpu_like, linear,
                           match_bucket)

pytestmark = [pytest.mark.skipif(bool(CUDA_SKIP), reason=str(CUDA_SKIP)),
              pytest.mark.usefixtures("fast_thread_switching")]


def device_policy(*args, **kwargs):
    from saspec.device.policy import DevicePolicy

    return DevicePolicy(*args, **kwargs)


def q_of(p_bucket: np.ndarray, factor: float) -> float:
    """A row's chance at the first bucket, from its odds factor (what ``DraftPolicy.q_automaton`` computes)."""
    q = p_bucket[5]
    odds = q / (1 - q) * factor
    return float(odds / (1 + odds))


def random_step(rng, b: int, k: int) -> dict:
    """One step's rows: matches (none, short, long), offers (beyond K too), branched flags, drafts, and
    emitted tokens that follow each draft for a random stretch."""
    match = np.where(rng.random(b) < 0.2, rng.integers(-3, 1, b), rng.integers(1, 300, b)).astype(np.int32)
    match[rng.random(b) < 0.3] = rng.integers(1, 9)
    offered = rng.integers(0, k + 3, b).astype(np.int32)
    drafts = rng.integers(0, 4, (b, k + int(rng.integers(0, 3)))).astype(np.int32)
    width = k + 1 + int(rng.integers(-1, 3))
    new = rng.integers(0, 4, (b, max(width, 0))).astype(np.int32)
    for r in range(b):  # the row emitted its draft's first tokens, then something else
        run = min(int(rng.integers(0, k + 1)), drafts.shape[1], new.shape[1])
        new[r, :run] = drafts[r, :run]
    return {"match": match, "offered": offered, "branched": (rng.random(b) < 0.3).astype(np.int32),
            "drafts": drafts, "new": new, "new_lens": rng.integers(0, new.shape[1] + 2, b).astype(np.int32)}


def run_episode(seed: int, steps: int) -> dict:
    """Drive a host DraftPolicy (rows named by request ids) and a DevicePolicy (rows named by slots) with the
    same random episode; assert they agree after every step. Returns what the episode covered."""
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 2, 3, 5, 8, 16]))
    n_slots = int(rng.integers(2, 20))
    max_rows = int(rng.integers(1, n_slots + 1))
    settings = PolicySettings(prior_weight=float(rng.choice([1.0, 8.0, 30.0])),
                              row_memory=float(rng.choice([0.5, 0.9, 1.0])),
                              step_tolerance=float(rng.choice([0.0, 0.02, 0.2])))
    shape = [gpu_like, cpu_like, linear(3.0, 0.5)][int(rng.integers(0, 3))]
    window, max_age = int(rng.integers(2, 9)), int(rng.integers(4, 40))

    def cost():  # the same model twice: the host's policy and the device's each observe the same timings
        return StepCost(shape, max_tokens=max_rows * (k + 1), window=window, max_age=max_age)

    decisions = []
    host = DraftPolicy(k, cost=cost(), settings=settings, log=decisions.append)
    dev = device_policy(k, n_slots, max_rows=max_rows, cost=cost(), settings=settings)
    slot_of: dict[int, int] = {}
    free = list(range(n_slots))
    next_id = 0
    last_ids: list[int] | None = None
    seen = dict.fromkeys(["scored", "not_same", "finished", "replaced", "drafted", "none", "uploads", "running_rate"], 0)
    for step in range(steps):
        if free and (not slot_of or rng.random() < 0.25):  # arrivals
            for _ in range(int(rng.integers(1, 3))):
                if free:
                    slot_of[next_id] = free.pop(int(rng.integers(0, len(free))))
                    next_id += 1
        ids = None
        if len(slot_of) > 1 and rng.random() < 0.1:  # a request finishes (in the batch or not)
            rid = list(slot_of)[int(rng.integers(0, len(slot_of)))]
            host.forget(rid)
            dev.forget(slot_of[rid])
            slot = slot_of.pop(rid)
            seen["finished"] += 1
            if last_ids is not None and rid in last_ids and rng.random() < 0.5:
                # a new request takes its slot and its row at once: the same slots, other requests
                slot_of[next_id] = slot
                ids = [next_id if r == rid else r for r in last_ids]
                next_id += 1
                seen["replaced"] += 1
            else:
                free.append(slot)
        live = list(slot_of)
        if ids is not None:
            pass
        elif last_ids is not None and all(r in slot_of for r in last_ids) and rng.random() < 0.65:
            ids = list(last_ids)
        else:
            ids = [live[i] for i in rng.permutation(len(live))[: int(rng.integers(1, min(len(live), max_rows) + 1))]]
        b = len(ids)
        same = ids == last_ids
        rows = random_step(rng, b, k)
        seconds = float(rng.choice([0.01 * (1 + rng.random()), 0.02 * rng.random(), 0.0, math.nan, math.inf],
                                   p=[0.7, 0.15, 0.05, 0.05, 0.05]))
        tokens = int(rng.integers(1, max_rows * (k + 1) + 8))
        host.rows(ids)
        want = host.step(rows["match"], rows["offered"], rows["drafts"], rows["new"], rows["new_lens"], seconds,
                         same, rows["branched"], tokens).copy()
        if same:
            dev.observe_step(tokens, seconds)
        slots = np.array([slot_of[r] for r in ids], np.int32)
        lengths, sources = to_device(np.full(b, -7, np.int32)), to_device(np.full(b, -7, np.int32))
        dev.step(*(to_device(rows[n]) for n in ("match", "offered", "branched", "drafts", "new", "new_lens")),
                 to_device(slots), lengths, sources)
        got_len, got_src = to_host(lengths), to_host(sources)
        assert np.array_equal(got_len, want), (seed, step, got_len, want)
        assert np.array_equal(got_src, decisions[-1].sources), (seed, step)
        p_bucket = dev.p_bucket
        assert np.array_equal(p_bucket, host.p_bucket), (seed, step)
        for row, rid in enumerate(ids):
            assert q_of(p_bucket, dev.evidence(slot_of[rid])[0]) == host.q_automaton(5, row), (seed, step, row)
        assert dev.stats == host.stats, (seed, step)
        assert dev.running_rate == host.running_rate, (seed, step)
        seen["running_rate"] += int(host.running_rate > 0.0)
        seen["scored" if same else "not_same"] += 1
        seen["drafted"] += int((got_src == AUTOMATON).sum())
        seen["none"] += int((got_src == NONE).sum())
        last_ids = ids
    seen["uploads"] = dev.uploads
    return seen


def test_device_step_equals_host_step():
    """About 1,000 random steps in the default suite (the slow run below does 10,000)."""
    totals: dict[str, int] = {}
    for seed in range(10):
        for key, v in run_episode(seed, 100).items():
            totals[key] = totals.get(key, 0) + v
    assert min(totals.values()) >= 10, totals  # every case was met, many times


@pytest.mark.slow
def test_device_step_equals_host_step_on_10000_steps(request):
    if not slow_selected(request.config):
        pytest.skip("slow: run with `pytest -m slow` or SASPEC_SLOW=1")
    steps = 0
    for seed in range(100, 150):
        run_episode(seed, 200)
        steps += 200
    assert steps == 10_000


def test_device_buckets_forget_as_the_hosts_do():
    """Past ``BUCKET_MEMORY`` trials a bucket's counts are halved on the device as on the host (the random
    episodes above stay under it): full copies past a 4-token match, then copies that stop at the match."""
    k, b = 8, 8
    host = DraftPolicy(k, cost=StepCost(cpu_like, max_tokens=b * (k + 1)))
    dev = device_policy(k, b, max_rows=b, cost=StepCost(cpu_like, max_tokens=b * (k + 1)))
    match, offered = np.full(b, 4, np.int32), np.full(b, k, np.int32)
    branched, lens = np.zeros(b, np.int32), np.full(b, k, np.int32)
    drafts = np.tile(np.arange(k, dtype=np.int32), (b, 1))
    prose = drafts.copy()
    prose[:, 4] = 99
    slots = np.arange(b, dtype=np.int32)
    beyond = 2 * N_BUCKETS + match_bucket(8)  # draft token 4 of a 4-token match
    for step in range(80):
        new = drafts if step < 40 else prose
        want = host.step(match, offered, drafts, new, lens, 0.01, step > 0, branched, b * (k + 1)).copy()
        if step > 0:
            dev.observe_step(b * (k + 1), 0.01)
        out = [to_device(np.zeros(b, np.int32)) for _ in range(2)]
        dev.step(*(to_device(x) for x in (match, offered, branched, drafts, new, lens, slots)), *out)
        assert np.array_equal(to_host(out[0]), want), step
        assert np.array_equal(dev.p_bucket, host.p_bucket), step
    assert dev.p_bucket[beyond] < 0.3  # 40 steps of misses turned a bucket of 1,280 hits: its counts were halved


def test_the_cost_table_is_uploaded_when_the_host_timings_change_it_and_only_then():
    k, n = 4, 6
    dev = device_policy(k, n, cost=StepCost(gpu_like, max_tokens=n * (k + 1)))
    rows = random_step(np.random.default_rng(1), 3, k)
    args = [rows[x] for x in ("match", "offered", "branched", "drafts", "new", "new_lens")]
    slots = np.array([0, 1, 2], np.int32)
    out = [np.zeros(3, np.int32), np.zeros(3, np.int32)]
    dev.step(*map(to_device, args), to_device(slots), *map(to_device, out))
    assert dev.uploads == 0  # the table went with the state; nothing changed since
    changes = 0
    for tokens, seconds in ((8, 0.01), (8, 0.011), (None, None), (20, 0.03), (20, 0.031), (8, 0.0), (8, math.nan)):
        before = dev.cost.knot_ratio.copy()
        if tokens is not None:
            dev.observe_step(tokens, seconds)
        uploads = dev.uploads
        dev.step(*map(to_device, args), to_device(slots), *map(to_device, out))
        changed = not np.array_equal(before, dev.cost.knot_ratio)
        assert dev.uploads == uploads + changed, (tokens, seconds)
        changes += changed
    assert changes >= 2 and dev.stats["ignored_timings"] == 2


def test_bad_arguments_are_refused_and_change_nothing():
    k, n = 4, 5
    dev = device_policy(k, n, max_rows=3, cost=StepCost(gpu_like, max_tokens=3 * (k + 1)))
    host = DraftPolicy(k, cost=StepCost(gpu_like, max_tokens=3 * (k + 1)))
    rows = random_step(np.random.default_rng(2), 2, k)
    good = {**rows, "slots": np.array([3, 1], np.int32), "lengths_out": np.zeros(2, np.int32),
            "sources_out": np.zeros(2, np.int32)}
    names = ["match", "offered", "branched", "drafts", "new", "new_lens", "slots", "lengths_out", "sources_out"]

    def call(**bad):
        args = {**good, **bad}
        dev.step(*(a if not isinstance(a, np.ndarray) else to_device(a) for a in (args[x] for x in names)))

    with pytest.raises(TypeError, match="match must have dtype int32"):
        call(match=rows["match"].astype(np.int64))
    with pytest.raises(ValueError, match="offered must have 2 rows"):
        call(offered=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="drafts must be 2-D"):
        call(drafts=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="drafts must have at least one column"):
        call(drafts=np.zeros((2, 0), np.int32))
    with pytest.raises(TypeError):
        call(slots=[3, 1])
    big = random_step(np.random.default_rng(3), 4, k)
    with pytest.raises(ValueError, match="at most 3 rows"):
        call(**big, slots=np.arange(4, dtype=np.int32), lengths_out=np.zeros(4, np.int32),
             sources_out=np.zeros(4, np.int32))
    both = to_device(np.zeros(4, np.int32))  # overlap is found from the arrays' memory (no sync)
    with pytest.raises(ValueError, match="lengths_out overlaps sources_out"):
        call(lengths_out=both[:2], sources_out=both[1:3])
    match = to_device(good["match"].copy())
    with pytest.raises(ValueError, match="lengths_out overlaps match"):
        call(match=match, lengths_out=match)
    for bad in (-1, n, 2.0, True, None):
        with pytest.raises(ValueError, match="slot must be an int"):
            dev.forget(bad)
    assert dev.stats["steps"] == 0
    # nothing changed: the next steps are the host's
    for step in range(3):
        host.rows([3, 1])
        want = host.step(rows["match"], rows["offered"], rows["drafts"], rows["new"], rows["new_lens"], 0.01,
                         step > 0, rows["branched"], 9).copy()
        if step > 0:
            dev.observe_step(9, 0.01)
        out = [to_device(np.zeros(2, np.int32)) for _ in range(2)]
        dev.step(*(to_device(rows[x]) for x in names[:6]), to_device(good["slots"]), *out)
        assert np.array_equal(to_host(out[0]), want)
    assert np.array_equal(dev.p_bucket, host.p_bucket)


def test_rows_outside_the_state_get_no_draft_and_change_nothing():
    """A slot the host could not check without a sync (out of range) drafts nothing and writes nowhere else
    (the simulator raises on any out-of-bounds index)."""
    k, n = 4, 3
    dev = device_policy(k, n, max_rows=4, cost=StepCost(gpu_like, max_tokens=4 * (k + 1)))
    rows = random_step(np.random.default_rng(4), 4, k)
    rows["match"][:] = 50
    rows["offered"][:] = k
    slots = np.array([0, -1, n, 2], np.int32)
    for _ in range(3):
        out = [to_device(np.full(4, 9, np.int32)) for _ in range(2)]
        dev.step(*(to_device(rows[x]) for x in ("match", "offered", "branched", "drafts", "new", "new_lens")),
                 to_device(slots), *out)
        lengths, sources = to_host(out[0]), to_host(out[1])
        assert lengths[1] == lengths[2] == 0 and sources[1] == sources[2] == NONE
        assert lengths[0] > 0 and lengths[3] > 0
    assert dev.stats["rows"] == 12


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match="row_memory"):
        device_policy(4, 4, settings=PolicySettings(row_memory=0.0))
    with pytest.raises(ValueError, match="max_rows \\* k_max"):
        device_policy(1 << 12, 1 << 10)
    with pytest.raises(ValueError, match="cost must be"):
        device_policy(4, 4, cost=object())
    with pytest.raises(ValueError, match="slots"):
        device_policy(4, 0)


@pytest.mark.parametrize("cc", [(9, 0)], ids=["sm_90"])
def test_the_kernel_compiles_to_ptx_without_fused_products(cc):
    """No FMA may appear: a fused product rounds once where the host rounds twice, and the lengths would
    differ (``conftest.ptx_reports`` compiles without a GPU)."""
    pytest.importorskip("numba_cuda")
    report = ptx_reports([cc], ["saspec.device.policy_kernel"])[cc]["saspec.device.policy_kernel"]
    assert set(report) == {"decide_kernel"}
    r = report["decide_kernel"]
    assert r["target"] == f"sm_{cc[0]}{cc[1]}"
    assert len(r["entries"]) == 1 and "decide_kernel" in r["entries"][0]
    assert r["restype"] == "none"
    assert r["calls"] == 0, "the policy's functions should be inlined"
    assert r["local_bytes"] == 0
    assert r["fma_f64"] == 0 and r["mul_rn_f64"] > 0
    assert r["atomics"] == ["atom.global.add.f64", "atom.global.add.u64"]
