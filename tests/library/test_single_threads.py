"""Several ``SingleSequence`` objects on one ``SpecEngine``, each driven by its own thread: every
sequence's automaton holds exactly its own tokens, and every step's match and draft equal those of
the same sequence alone on its own engine."""

from __future__ import annotations

import sys
import threading

import numpy as np

from saspec import SpecEngine
from saspec.single import SingleSequence

K = 4
STEPS = 400


def _stream(seed: int) -> tuple[list[int], list[list[int]]]:
    """A prompt and the per-step token lists of one sequence (a small alphabet, so it matches often;
    each sequence its own alphabet, so a token in the wrong automaton changes its matches)."""
    rng = np.random.default_rng(seed)
    base = 10 * seed
    prompt = (base + rng.integers(0, 4, 64)).tolist()
    steps = [(base + rng.integers(0, 4, int(rng.integers(1, 2 * K + 3)))).tolist() for _ in range(STEPS)]
    return prompt, steps


def _alone(prompt: list[int], steps: list[list[int]]) -> list[tuple[int, list[int]]]:
    """The same sequence on an engine of its own: the reference results."""
    with SpecEngine() as engine:
        seq = SingleSequence(engine, prompt, K)
        out = [seq.extend(s) for s in steps]
        seq.close()
    return out


def test_two_threads_on_one_engine_keep_their_own_tokens():
    streams = [_stream(seed) for seed in (1, 2, 3)]
    expected = [_alone(p, s) for p, s in streams]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: interleave the steps finely
    try:
        for _ in range(3):
            engine = SpecEngine()
            seqs = [SingleSequence(engine, p, K) for p, _ in streams]
            got: list[list[tuple[int, list[int]]]] = [[] for _ in streams]
            start = threading.Barrier(len(streams))
            errors: list[BaseException] = []

            def drive(i: int) -> None:
                try:
                    start.wait()
                    for s in streams[i][1]:
                        got[i].append(seqs[i].extend(s))
                except BaseException as e:  # surfaced below
                    errors.append(e)

            threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(streams))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
            for i, (prompt, steps) in enumerate(streams):
                assert engine.automaton_len(seqs[i].request_id) == len(prompt) + sum(map(len, steps))
                assert got[i] == expected[i], f"sequence {i}'s matches or drafts differ from it alone"
            for s in seqs:
                s.close()
            engine.close()
    finally:
        sys.setswitchinterval(old)
