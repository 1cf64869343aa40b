"""The --peer-sa-spec plumbing of ``saspec bench``: the int32 files the external
harness reads, checked by a stand-in harness that parses them back."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from saspec_bench.commands import bench

FAKE = """#!{python}
import sys
import numpy as np
mode = sys.argv[1]
if mode == "ingest":
    t = np.fromfile(sys.argv[2], dtype="<i4")
    sizing = sys.argv[4]
    assert sizing in ("server", "fresh")
    # "seconds": one microsecond per token, twice that for fresh memory; the capacity encodes the sizing
    print(float(t.size) / 1e6 * (2 if sizing == "fresh" else 1), 1 if sizing == "server" else 2)
elif mode == "steps":
    p = np.fromfile(sys.argv[2], dtype="<i4")
    a = np.fromfile(sys.argv[3], dtype="<i4")
    b, i, total = int(p[0]), 1, 0
    for _ in range(b):
        n = int(p[i]); total += int(p[i + 1 : i + 1 + n].sum()); i += 1 + n
    assert i == p.size
    steps, b2, k = (int(x) for x in a[:3])
    assert b2 == b and a.size == 3 + steps * b + steps * b * (k + 1)
    lens = a[3 : 3 + steps * b].reshape(steps, b)
    acc = a[3 + steps * b :].reshape(steps, b, k + 1)
    print(0.25, total + int(lens.sum()) * 1000 + int(acc.sum()) * 1000000)
else:
    sys.exit(2)
"""


@pytest.fixture
def fake_harness(tmp_path):
    path = tmp_path / "harness"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def test_peer_files_round_trip(fake_harness):
    peer = bench.PeerSaSpec(fake_harness)
    try:
        tokens = bench.code_like_prompt(1234)
        assert peer.ingest(tokens) == (pytest.approx(1234 / 1e6), 1)  # server sizing by default
        assert peer.ingest(tokens, sizing="fresh") == (pytest.approx(2 * 1234 / 1e6), 2)
        prompts = [bench.code_like_prompt(50 + i, seed=i) for i in range(3)]
        acc = bench._accepted_stream(prompts, 4, bench.ACCEPTED, 6, "copy")
        lens = np.full((6, 3), bench.ACCEPTED, np.int32)
        t, total = peer.steps(prompts, acc, lens)
        assert t == 0.25
        assert total == sum(int(p.sum()) for p in prompts) + int(lens.sum()) * 1000 + int(acc.sum()) * 1000000
    finally:
        peer.close()


def test_peer_errors_are_clear(tmp_path, fake_harness):
    with pytest.raises(ValueError, match="not an executable file"):
        bench.PeerSaSpec(str(tmp_path / "missing"))
    peer = bench.PeerSaSpec(fake_harness)
    try:
        with pytest.raises(RuntimeError, match="failed"):
            peer._run("bogus")
        with pytest.raises(ValueError, match="sizing"):
            peer.ingest(np.zeros(3, np.int32), sizing="huge")
    finally:
        peer.close()


def test_peer_harness_without_sizing_is_refused(tmp_path):
    """A harness built before the sizing argument prints only seconds; its
    figures would be labelled with a sizing it did not use."""
    path = tmp_path / "old_harness"
    path.write_text(f"#!{sys.executable}\nprint(0.5)\n")
    path.chmod(0o755)
    peer = bench.PeerSaSpec(str(path))
    try:
        with pytest.raises(RuntimeError, match="rebuild it"):
            peer.ingest(np.zeros(3, np.int32))
    finally:
        peer.close()


def test_bench_grow_reports_each_size():
    from saspec_bench.commands.bench import bench_grow

    rows = bench_grow((300, 2000), repeat=1)
    assert [r["text"] for r in rows] == ["code-like", "random"] * 2
    assert [r["tokens"] for r in rows][::2] == [300, 2000]
    assert rows[2]["table"] == "copied"  # 2,000 code-like tokens: the text ran out, the table has room
    assert rows[1]["table"] == rows[3]["table"] == "resized"  # random text fills the table with the text
    for r in rows:
        assert r["grow_us"] > 0 and r["blob_bytes"] > 0


def test_peer_ingest_rows(fake_harness):
    """Every prompt gets one row per sizing, which the row names; sa_spec's rate
    is the harness's "seconds" (one microsecond per token fitted and reused, two
    in fresh memory here), and the ratio is the two rates'."""
    peer = bench.PeerSaSpec(fake_harness)
    try:
        rows = bench.bench_peer_ingest(peer, repeat=2)
        quick = bench.bench_peer_ingest(peer, repeat=1, sizings=("fresh",), cases=(("random", 500),))
    finally:
        peer.close()
    cases = [("code-like", 20_000), ("code-like", 200_000), ("code-like", 1_000_000), ("random", 200_000)]
    assert [(r["prompt"], r["tokens"]) for r in rows] == [c for c in cases for _ in range(2)]
    assert [r["sa_spec_sizing"] for r in rows] == ["fitted, slot reused", "fresh memory"] * 4
    assert [r["sa_spec_capacity"] for r in rows] == [1, 2] * 4
    for r in rows:
        assert r["sa_spec_Mtok_per_s"] == pytest.approx(1.0 if r["sa_spec_capacity"] == 1 else 0.5)
        assert r["saspec_over_sa_spec"] == pytest.approx(r["saspec_Mtok_per_s"] / r["sa_spec_Mtok_per_s"])
        assert r["saspec_Mtok_per_s"] > 0 and r["saspec_first_Mtok_per_s"] > 0
    for a, b in zip(rows[::2], rows[1::2]):  # one saspec measurement per case
        assert a["saspec_Mtok_per_s"] == b["saspec_Mtok_per_s"]
    assert [(r["prompt"], r["tokens"], r["sa_spec_sizing"]) for r in quick] == [("random", 500, "fresh memory")]


def test_bench_tail_reports_median_p99_and_worst_step():
    """With an injected clock where step s takes s µs, the statistics are exact."""
    from saspec_bench.commands.bench import bench_tail

    ticks = iter(range(10**6))
    t = {"now": 0.0}

    def clock():  # start and end of each step: step i (1-based) lasts i µs
        i = next(ticks)
        if i % 2 == 0:
            return t["now"]
        t["now"] += (i // 2 + 1) * 1e-6
        return t["now"]

    (row,) = bench_tail(batch=4, context=300, steps=101, clock=clock)
    assert row["steps"] == 100 and row["median_us"] == pytest.approx(50.5) and row["worst_us"] == pytest.approx(100)
    assert row["p99_us"] == pytest.approx(99.01)
    assert row["grown_ahead"] + row["grown_in_step"] >= 4  # 300 + 303 tokens outgrow every first blob
