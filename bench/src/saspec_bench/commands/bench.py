"""`saspec bench`: host ingestion, per-decode-step cost and memory, with the
n-gram baseline measured in the same run.

Prompts are synthetic token streams that stand in for the two shapes that
matter: *random* (ids uniform over Qwen2.5's 151,936-token vocabulary: no
repeats, the automaton's cheapest case for matching but a wide alphabet for the
table) and *code-like* (blocks of 2,000 tokens, each a copy of one base block
with 1% of its tokens mutated: long repeats with many branch points, which is
what makes suffix structures expensive).

With ``peer`` (``saspec bench --peer-sa-spec PATH``) it also runs sa_spec's host
logic, an external harness binary built outside this repository (see
BENCHMARKS.md), on the same token streams, interleaved with saspec, and
reports the ratios. Its ingestion rows run sa_spec under two sizings
(``PEER_SIZINGS``), one row each: as a server runs it (capacity fitted to the
prompt, the slot reused) and with new memory for every build. Both sides of
that comparison are timed in thread CPU time (``time.thread_time`` here,
``CLOCK_THREAD_CPUTIME_ID`` in the harness): on a shared machine wall time
also counts other jobs' time slices. Progress
goes to stderr, one line per measurement.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from saspec import NgramDrafter, SpecEngine, SuffixAutomaton, build, core
from saspec.build import DEFAULT_OCCURRENCE
from saspec.pool import RequestPool
from ..synthetic import VOCAB, code_like_prompt, random_prompt







def progress(message: str) -> None:
    """One progress line on stderr (the tables go to stdout)."""
    print(f"[saspec bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def warm_up() -> None:
    """Compile (or load from cache) every kernel the benchmarks time, growth included."""
    tokens = code_like_prompt(3000)
    for occurrence in ("first", "near-first"):
        SuffixAutomaton(occurrence=occurrence).extend(tokens)
    for drafter in (SpecEngine(), NgramDrafter(), SpecEngine(parallel_threshold=1), NgramDrafter(parallel_threshold=1)):
        drafter.add_request(0, tokens[:10])
        drafter.prepare([0])
        acc = np.zeros((1, 600), np.int32)
        acc[0] = tokens[:600]
        drafter.extend(acc, np.array([600], np.int32), np.zeros(1, np.int32), np.zeros((1, 599), np.int32))


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs, in seconds (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_ingest(sizes: list[int], occurrences: list[str], repeat: int = 3) -> list[dict]:
    """Tokens per second of building an automaton from a prompt."""
    SuffixAutomaton([1, 2, 1], occurrence=occurrences[0])  # compile
    rows = []
    for kind, make in (("random", random_prompt), ("code-like", code_like_prompt)):
        for n in sizes:
            tokens = make(n)
            for occurrence in occurrences:
                t = best_time(lambda: SuffixAutomaton(tokens, occurrence=occurrence), repeat if n < 500_000 else 1)
                sa = SuffixAutomaton(tokens, occurrence=occurrence)
                progress(f"ingest {kind} {n:,} tokens, {occurrence}: {n / t / 1e6:.2f} M tok/s")
                rows.append(
                    {
                        "prompt": kind,
                        "tokens": n,
                        "occurrence": occurrence,
                        "Mtok_per_s": n / t / 1e6,
                        "bytes_per_token": sa.nbytes / n,
                        "states_per_token": sa.num_states / n,
                        "edges_per_token": sa.num_edges / n,
                    }
                )
    return rows


def _accepted_stream(prompts: list[np.ndarray], k: int, accepted: int, steps: int, mode: str) -> np.ndarray:
    """int32 [steps, B, k+1]: each step's accepted tokens per row.

    ``copy``: each row copies its own prompt from a random offset, jumping to
    a new offset every 16 steps (copy-heavy decoding, the case SA drafting is
    for); ``random``: uniform random ids (every step starts new branches, the
    automaton's most expensive case).
    """
    rng = np.random.default_rng(0)
    out = np.zeros((steps, len(prompts), k + 1), np.int32)
    for i, p in enumerate(prompts):
        if mode == "random":
            out[:, i, :accepted] = rng.integers(0, VOCAB, (steps, accepted))
            continue
        pos = 0
        for s in range(steps):
            if s % 16 == 0 or pos + accepted > len(p):
                pos = int(rng.integers(0, len(p) - accepted))
            out[s, i, :accepted] = p[pos : pos + accepted]
            pos += accepted
    return out


def _prepared(
    drafter: SpecEngine, prompts: list[np.ndarray], acc: np.ndarray, hint: int | None = None
) -> tuple[np.ndarray, ...]:
    """Add ``prompts`` as requests 0..B-1 (``hint``: their ``expected_new_tokens``),
    prepare them as the batch, and return the step arrays for ``acc``
    [steps, B, K+1]: lens (int32 [B], ``ACCEPTED`` each), match_len_out (int32
    [B]) and draft_out (int32 [B, K])."""
    _, b, k1 = acc.shape
    for i, p in enumerate(prompts):
        drafter.add_request(i, p, hint)
    drafter.prepare(list(range(b)))
    return np.full(b, ACCEPTED, np.int32), np.zeros(b, np.int32), np.zeros((b, k1 - 1), np.int32)


def _step_loop(
    drafter: SpecEngine,
    prompts: list[np.ndarray],
    acc: np.ndarray,
    clock: Callable[[], float] = time.perf_counter,
    hint: int | None = None,
) -> float:
    """Mean seconds (of ``clock``) per ``extend`` call over the steps in ``acc``
    [steps, B, K+1], each row accepting ``ACCEPTED`` tokens; ``hint``: the
    requests' ``expected_new_tokens``."""
    steps = acc.shape[0]
    lens, mout, dout = _prepared(drafter, prompts, acc, hint)
    drafter.extend(acc[0], lens, mout, dout)  # compile / warm
    t0 = clock()
    for s in range(1, steps):
        drafter.extend(acc[s], lens, mout, dout)
    return (clock() - t0) / (steps - 1)


ACCEPTED = 3
SERIAL = 2**31  # a parallel_threshold no batch reaches


def bench_step(
    batches: list[int], contexts: list[int], k: int = 8, steps: int = 200, modes: tuple[str, ...] = ("copy", "random")
) -> list[dict]:
    """Microseconds per request-step of ``extend`` (Python call included), with
    3 accepted tokens per row and K draft tokens, for the SA engine and the
    n-gram baseline on the same batch and the same tokens."""
    rows = []
    for ctx in contexts:
        for b in batches:
            prompts = [code_like_prompt(ctx, seed=i) for i in range(b)]
            n_steps = steps if ctx * b <= 2_000_000 else max(40, steps // 5)
            for mode in modes:
                acc = _accepted_stream(prompts, k, ACCEPTED, n_steps, mode)
                t_sa = _step_loop(SpecEngine(parallel_threshold=SERIAL), prompts, acc)
                t_par = _step_loop(SpecEngine(parallel_threshold=1), prompts, acc) if b >= 8 else float("nan")
                t_ng = _step_loop(NgramDrafter(parallel_threshold=SERIAL), prompts, acc[: max(5, n_steps // 4)])
                progress(f"step ctx {ctx:,} B={b} {mode}: SA {t_sa / b * 1e6:.2f} us/row, n-gram {t_ng / b * 1e6:.2f}")
                rows.append(
                    {
                        "context": ctx,
                        "batch": b,
                        "tokens": mode,
                        "sa_us_per_request_step": t_sa / b * 1e6,
                        "sa_parallel_us_per_request_step": t_par / b * 1e6,
                        "ngram_us_per_request_step": t_ng / b * 1e6,
                        "ngram_over_sa": t_ng / t_sa,
                    }
                )
    return rows


def bench_tail(batch: int = 64, context: int = 4096, steps: int = 1500, k: int = 8,
               clock: Callable[[], float] = time.perf_counter, gaps_s: tuple[float, ...] = (0.0, 0.005),
               sleep: Callable[[float], None] = time.sleep) -> list[dict]:
    """Per-step ``extend`` time of one batch whose rows outgrow their blobs together:
    ``batch`` code-like prompts of ``context`` tokens, each accepting ``ACCEPTED``
    tokens a step (copying its prompt) for ``steps`` steps, no ``expected_new_tokens``
    hint. Reports the median, p99 and worst step in µs for the whole batch (the worst
    is where a step pays blob growth), how many blobs grew ahead of need or inside
    a step and how many rows were parked (where the engine says), and the row-steps
    that drafted nothing. One row per gap in ``gaps_s``: the seconds between two
    steps, untimed (0: back to back; a server steps once per model forward, and the
    background growth runs in between)."""
    return [_tail_row(batch, context, steps, k, clock, gap, sleep) for gap in gaps_s]


def _tail_row(batch: int, context: int, steps: int, k: int, clock: Callable[[], float], gap: float,
              sleep: Callable[[float], None]) -> dict:
    prompts = [code_like_prompt(context, seed=i) for i in range(batch)]
    acc = _accepted_stream(prompts, k, ACCEPTED, steps, "copy")
    eng = SpecEngine(parallel_threshold=SERIAL)
    lens, mout, dout = _prepared(eng, prompts, acc)
    eng.extend(acc[0], lens, mout, dout)  # compile / warm
    times = np.empty(steps - 1)
    undrafted = 0  # row-steps with no match (on this copying stream: rows parked while their blobs grow)
    for s in range(1, steps):
        if gap:
            sleep(gap)
        t0 = clock()
        eng.extend(acc[s], lens, mout, dout)
        times[s - 1] = clock() - t0
        undrafted += int(np.count_nonzero(mout == 0))
    grown = eng.stats()
    row = {"batch": batch, "context": context, "steps": steps - 1, "gap_ms": gap * 1e3,
           "tokens_per_row": context + ACCEPTED * steps,
           "median_us": float(np.median(times)) * 1e6, "p99_us": float(np.percentile(times, 99)) * 1e6,
           "worst_us": float(times.max()) * 1e6, "mean_us": float(times.mean()) * 1e6,
           "grown_ahead": grown["grown_ahead"], "grown_in_step": grown["grown_in_step"],
           "parked": grown.get("parked", -1), "undrafted_row_steps": undrafted}
    progress(f"tail B={batch} ctx {context:,}, {gap * 1e3:g} ms between steps: median {row['median_us']:.1f} us, "
             f"p99 {row['p99_us']:.1f} us, worst {row['worst_us']:.1f} us")
    eng.close()
    return row


def _pool_texts(prompts: list[np.ndarray], tokens: int, seed: int = 1, related: bool = True) -> list[np.ndarray]:
    """Finished requests' texts for a pool of about ``tokens`` tokens: with ``related``, half are
    edited copies of the batch's prompts (so rows find long matches there), half unrelated
    code-like text; else all unrelated (rows find only short matches, and draft from their own)."""
    rng = np.random.default_rng(seed)
    out, n, i = [], 0, 0
    while n < tokens:
        if i % 2 == 0 and related:
            t = prompts[(i // 2) % len(prompts)].copy()
            idx = rng.integers(0, t.size, max(1, t.size // 20))
            t[idx] = rng.integers(0, VOCAB, idx.size)
        else:
            t = code_like_prompt(prompts[0].size, seed=10_000 + i)
        out.append(t)
        n += t.size + 1
        i += 1
    return out


def bench_pool(batches: tuple[int, ...] = (1, 64), context: int = 8000, pool_tokens: int = 1 << 20,
               steps: int = 100, repeat: int = 3) -> list[dict]:
    """The cross-request pool's cost: microseconds per ``extend`` (the whole batch) without
    and with a full pool of ``pool_tokens`` tokens, interleaved, best of ``repeat``, rows
    copying their own prompts (3 tokens a step); and the pool's bytes per token and build rate
    (texts added one at a time, each build copying the pool: tokens pooled per second of builds).
    Two pools: one that holds edited copies of the rows' prompts (``related``) and one that does not."""
    rows = []
    for b, related in ((b, r) for b in batches for r in (True, False)):
        prompts = [code_like_prompt(context, seed=i) for i in range(b)]
        acc = _accepted_stream(prompts, 8, ACCEPTED, steps, "copy")
        texts = _pool_texts(prompts, pool_tokens, related=related)
        pool = RequestPool(pool_tokens, prompts=True)
        t0 = time.perf_counter()
        for t in texts:  # one build per finished request, as a server finishing them one by one
            pool.add(t)
            pool.flush()
        build_s = time.perf_counter() - t0
        st = pool.stats()
        off = on = float("inf")
        for _ in range(repeat):
            off = min(off, _step_loop(SpecEngine(parallel_threshold=SERIAL), prompts, acc))
            on = min(on, _step_loop(SpecEngine(parallel_threshold=SERIAL, pool=pool), prompts, acc))
        progress(f"pool B={b} x {context:,}, {'related' if related else 'unrelated'} pool of {st['tokens']:,} tokens: "
                 f"{off * 1e6:.1f} us/step without, {on * 1e6:.1f} with ({on / off:.2f}x); "
                 f"{st['bytes'] / st['tokens']:.1f} B/token")
        rows.append({"batch": b, "context": context, "pool": "related" if related else "unrelated",
                     "pool_tokens": st["tokens"], "us_per_step": off * 1e6,
                     "us_per_step_pool": on * 1e6, "pool_over_none": on / off,
                     "pool_bytes_per_token": st["bytes"] / st["tokens"], "pool_texts": st["texts"],
                     "pool_build_Mtok_per_s": st["tokens"] / build_s / 1e6})
    return rows


def bench_memory(n: int = 200_000) -> list[dict]:
    """Host bytes per token after ``add_request``, from ``stats()`` (which
    counts a mid-size blob's arena block, ``build.BlobArena``) and from the
    arrays' own ``nbytes``."""
    rows = []
    for kind, make in (("random", random_prompt), ("code-like", code_like_prompt)):
        eng = SpecEngine()
        eng.add_request(kind, make(n))
        st = eng.stats()
        real = sum(int(eng._backend.slots.blobs[s].nbytes) for s in eng._slot.values())
        rows.append({"prompt": kind, "tokens": st["tokens"], "stats_bytes": st["bytes"], "nbytes": real,
                     "bytes_per_token": st["bytes"] / st["tokens"]})
        progress(f"memory {kind} {n:,} tokens: {st['bytes'] / st['tokens']:.1f} B/token")
    return rows


def bench_grow(sizes: tuple[int, ...] = (1000, 8000, 32_000), repeat: int = 7) -> list[dict]:
    """One re-allocation of a full request (``build.grow``: the copy a decode
    step pays when a blob runs out of room), best of ``repeat`` mean µs of
    thread CPU time. Per size, two blobs: a code-like prompt, whose text runs
    out first (the table is copied as is), and random tokens appended until
    the blob is full, whose table runs out with its text (a larger table:
    every edge is re-inserted)."""
    occurrence = build.occurrence_code("near-first")
    rows = []
    for n in sizes:
        code = build.ingest(build.new_blob(n), code_like_prompt(n, seed=1), occurrence, 0)
        rnd = build.new_blob(n)
        build._ingest(rnd, random_prompt(3 * n, seed=1), 0, occurrence, 0)  # stops when the blob is full
        for kind, blob in (("code-like", code), ("random", rnd)):
            grown = build.grow(blob, 1)
            calls = max(5, 200_000 // n)
            best = float("inf")
            for _ in range(repeat):
                t0 = time.thread_time()
                for _ in range(calls):
                    build.grow(blob, 1)
                best = min(best, (time.thread_time() - t0) / calls)
            table = "resized" if grown[core.H_HT_SIZE] != blob[core.H_HT_SIZE] else "copied"
            rows.append({"tokens": int(blob[core.H_N]), "text": kind, "blob_bytes": int(blob.nbytes),
                         "grow_us": best * 1e6, "table": table})
            progress(f"grow {kind} {rows[-1]['tokens']:,} tokens: {best * 1e6:.1f} us ({table} table)")
    return rows


PEER_SIZINGS = {
    # harness argument: what the table's sa_spec_sizing column says
    "server": "fitted, slot reused",
    "fresh": "fresh memory",
}
"""How the harness sizes sa_spec for an ingestion. ``server``: its
``C_MAX_SEQUENCE_LENGTH`` is the smallest power of two from 32,768 to 1,048,576
that holds the prompt (a server fits it to its longest request), and every
build reuses one slot whose memory was touched once before timing (sa_spec's
API keeps its automata in pinned host slots, allocated once and cleared between
requests). ``fresh`` (the sizing of runs before this option): 65,536 if the
prompt fits, else 1,048,576, in new lazily zeroed memory per build, so the
build pays the first touch of every page it writes."""


class PeerSaSpec:
    """sa_spec's host logic as an external harness binary (built outside this
    repository, see BENCHMARKS.md), driven through int32 files.

    ``harness ingest TOKENS.bin R SIZING`` (``SIZING``: a key of
    ``PEER_SIZINGS``) prints the best of R builds in seconds of thread CPU time
    (as every time it prints) and the ``C_MAX_SEQUENCE_LENGTH`` it used;
    ``harness steps PROMPTS.bin ACC.bin R`` builds each row's automaton from
    its prompt (untimed), then per step and row does what sa_spec's extend
    kernel does (extend the accepted tokens, lookup, copy K drafts) and prints
    the best of R mean seconds per step over steps 1.. and the sum of all rows'
    match lengths over all steps (a cross-check against saspec's).
    """

    def __init__(self, path: str) -> None:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ValueError(f"--peer-sa-spec {path!r} is not an executable file (build it as BENCHMARKS.md says)")
        self.path = path
        self._dir = tempfile.TemporaryDirectory(prefix="saspec-peer-")

    def _run(self, *args: str) -> list[str]:
        out = subprocess.run([self.path, *args], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{self.path} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.split()

    def _file(self, name: str, *arrays: np.ndarray) -> str:
        path = os.path.join(self._dir.name, name)
        with open(path, "wb") as f:
            for a in arrays:
                f.write(np.ascontiguousarray(a, dtype="<i4").tobytes())
        return path

    def ingest(self, tokens: np.ndarray, repeat: int = 1, sizing: str = "server") -> tuple[float, int]:
        """(best seconds of ``repeat`` builds from int32 ``tokens``, the
        capacity sa_spec was built with) under ``sizing``, a key of ``PEER_SIZINGS``."""
        if sizing not in PEER_SIZINGS:
            raise ValueError(f"sizing {sizing!r}: expected one of {sorted(PEER_SIZINGS)}")
        out = self._run("ingest", self._file("tokens.bin", tokens), str(repeat), sizing)
        if len(out) != 2:
            raise RuntimeError(f"{self.path} printed {out!r}, not 'SECONDS CAPACITY': a harness built before "
                               "the sizing argument; rebuild it as BENCHMARKS.md says")
        return float(out[0]), int(out[1])

    def steps(self, prompts: list[np.ndarray], acc: np.ndarray, lens: np.ndarray, repeat: int = 1) -> tuple[float, int]:
        """(best mean seconds per step, sum of match lengths) for ``acc``
        int32 [steps, B, K+1] with ``lens`` int32 [steps, B] accepted per row."""
        steps, b, k1 = acc.shape
        parts = [np.array([len(prompts)])]
        for p in prompts:
            parts += [np.array([len(p)]), p]
        pfile = self._file("prompts.bin", *parts)
        afile = self._file("accepted.bin", np.array([steps, b, k1 - 1]), lens, acc)
        t, total = self._run("steps", pfile, afile, str(repeat))
        return float(t), int(total)

    def close(self) -> None:
        self._dir.cleanup()


def _match_sum(prompts: list[np.ndarray], acc: np.ndarray) -> int:
    """Sum of the serial engine's match lengths over every step and row of ``acc``."""
    steps = acc.shape[0]
    eng = SpecEngine(parallel_threshold=SERIAL)
    lens, mout, dout = _prepared(eng, prompts, acc)
    total = 0
    for s in range(steps):
        eng.extend(acc[s], lens, mout, dout)
        total += int(mout.sum())
    return total


PEER_INGEST_CASES = (("code-like", 20_000), ("code-like", 200_000), ("code-like", 1_000_000), ("random", 200_000))


def bench_peer_ingest(
    peer: PeerSaSpec,
    repeat: int = 5,
    sizings: tuple[str, ...] = tuple(PEER_SIZINGS),
    cases: tuple[tuple[str, int], ...] = PEER_INGEST_CASES,
) -> list[dict]:
    """Ingestion, saspec (default occurrence rule and ``first``) against sa_spec under
    each of ``sizings`` (keys of ``PEER_SIZINGS``), interleaved, best of
    ``repeat``, in thread CPU time; M tokens per second. One row per case and
    sizing; the two rows of a case share saspec's figures.

    Each round times every prompt once per drafter, so the runs a best is taken
    from are spread over the whole benchmark rather than bunched in one moment
    of a shared machine's load; odd rounds time sa_spec first."""
    makers = {"code-like": code_like_prompt, "random": random_prompt}
    prompts = [makers[kind](n) for kind, n in cases]
    peers = [f"sa_spec:{z}" for z in sizings]
    best = [dict.fromkeys([DEFAULT_OCCURRENCE, "first", *peers], float("inf")) for _ in cases]
    capacity: list[dict[str, int]] = [{} for _ in cases]
    for r in range(repeat):
        for (kind, _), tokens, b, cap in zip(cases, prompts, best, capacity):
            drafters = [DEFAULT_OCCURRENCE, "first"]
            for d in peers:  # sa_spec's per-state tables degrade on wide alphabets: a few runs suffice
                if not (kind == "random" and r >= 2 and b[d] > 2.0):
                    drafters.append(d)
            for d in drafters if r % 2 == 0 else drafters[::-1]:
                if d in peers:
                    t, cap[d] = peer.ingest(tokens, sizing=d.split(":", 1)[1])
                    b[d] = min(b[d], t)
                    continue
                t0 = time.thread_time()
                SuffixAutomaton(tokens, occurrence=d)
                b[d] = min(b[d], time.thread_time() - t0)
        progress(f"peer ingest: round {r + 1} of {repeat} done")
    rows = []
    for (kind, n), b, cap in zip(cases, best, capacity):
        for z, d in zip(sizings, peers):
            row = {
                "prompt": kind,
                "tokens": n,
                "sa_spec_sizing": PEER_SIZINGS[z],
                "sa_spec_capacity": cap[d],
                "saspec_Mtok_per_s": n / b[DEFAULT_OCCURRENCE] / 1e6,
                "saspec_first_Mtok_per_s": n / b["first"] / 1e6,
                "sa_spec_Mtok_per_s": n / b[d] / 1e6,
                "saspec_over_sa_spec": b[d] / b[DEFAULT_OCCURRENCE],
            }
            rows.append(row)
            progress(
                f"peer ingest {kind} {n:,}: saspec {row['saspec_Mtok_per_s']:.2f} M tok/s, "
                f"sa_spec ({row['sa_spec_sizing']}, capacity {cap[d]:,}) {row['sa_spec_Mtok_per_s']:.3f}, "
                f"ratio {row['saspec_over_sa_spec']:.2f}x"
            )
    return rows


def bench_peer_step(
    peer: PeerSaSpec,
    batches: tuple[int, ...] = (64, 256),
    contexts: tuple[int, ...] = (1000, 8000, 32000),
    k: int = 8,
    steps: int = 200,
    repeat: int = 5,
) -> list[dict]:
    """Per decode step, serial saspec engine (Python call included) against
    sa_spec's per-row kernel logic, same prompts and accepted tokens (3 per
    row, K drafts), interleaved, best of ``repeat``; µs of thread CPU time
    per request-step. saspec runs twice: as is, and *hinted*, with
    ``expected_new_tokens`` set to the tokens the run appends (so it sizes each
    request once, as sa_spec does with its fixed maximum)."""
    rows = []
    for ctx in contexts:
        for b in batches:
            prompts = [code_like_prompt(ctx, seed=i) for i in range(b)]
            n_steps = steps if ctx * b <= 2_000_000 else max(40, steps // 5)
            for mode in ("copy", "random"):
                acc = _accepted_stream(prompts, k, ACCEPTED, n_steps, mode)
                lens = np.full((n_steps, b), ACCEPTED, np.int32)
                t_sa = t_hint = t_peer = float("inf")
                peer_sum = 0
                hint = ACCEPTED * n_steps  # the tokens each row appends
                for _ in range(repeat):
                    t_sa = min(t_sa, _step_loop(SpecEngine(parallel_threshold=SERIAL), prompts, acc, time.thread_time))
                    t_hint = min(t_hint, _step_loop(SpecEngine(parallel_threshold=SERIAL), prompts, acc, time.thread_time, hint))
                    t, peer_sum = peer.steps(prompts, acc, lens)
                    t_peer = min(t_peer, t)
                row = {
                    "context": ctx,
                    "batch": b,
                    "tokens": mode,
                    "saspec_us_per_request_step": t_sa / b * 1e6,
                    "saspec_hinted_us_per_request_step": t_hint / b * 1e6,
                    "sa_spec_us_per_request_step": t_peer / b * 1e6,
                    "saspec_over_sa_spec": t_peer / t_sa,
                    "saspec_hinted_over_sa_spec": t_peer / t_hint,
                    "same_match_lengths": peer_sum == _match_sum(prompts, acc),
                }
                rows.append(row)
                progress(
                    f"peer step ctx {ctx:,} B={b} {mode}: saspec {row['saspec_us_per_request_step']:.2f} us/row "
                    f"({row['saspec_hinted_us_per_request_step']:.2f} hinted), sa_spec {row['sa_spec_us_per_request_step']:.2f}, "
                    f"ratio {row['saspec_over_sa_spec']:.2f}x ({row['saspec_hinted_over_sa_spec']:.2f}x hinted)"
                )
    return rows


def format_table(rows: list[dict]) -> str:
    """Rows of dicts as a Markdown table, floats to 3 significant digits."""
    if not rows:
        return ""
    cols = list(rows[0])
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def run(quick: bool = False, peer_sa_spec: str | None = None, only: str | None = None) -> dict[str, list[dict]]:
    """All benchmarks; ``quick`` shrinks them to a smoke run. With
    ``peer_sa_spec`` (the harness binary's path) also the side-by-side
    comparison with sa_spec's host logic. ``only="pool"`` / ``"tail"``: the pool benchmark, or
    the step-time tail of a batch that outgrows its blobs, alone."""
    peer = PeerSaSpec(peer_sa_spec) if peer_sa_spec else None
    progress("compiling / loading kernels")
    warm_up()
    if only == "pool":
        return {"pool": bench_pool((8,), 1000, 20_000, steps=20, repeat=1) if quick else bench_pool()}
    if only == "tail":
        return {"tail": bench_tail(8, 1000, 300) if quick else bench_tail()}
    try:
        if quick:
            out = {
                "ingest": bench_ingest([1000, 20_000], [DEFAULT_OCCURRENCE], repeat=1),
                "step": bench_step([1, 8], [1000], steps=20),
                "memory": bench_memory(20_000),
                "grow": bench_grow((1000,), repeat=1),
                "pool": bench_pool((8,), 1000, 20_000, steps=20, repeat=1),
                "tail": bench_tail(8, 1000, 300),
            }
            if peer:
                out["peer_ingest"] = bench_peer_ingest(peer, repeat=1, cases=(("code-like", 20_000), ("random", 2000)))
                out["peer_step"] = bench_peer_step(peer, batches=(8,), contexts=(1000,), steps=20, repeat=1)
            return out
        out = {}
        if peer:
            out["peer_ingest"] = bench_peer_ingest(peer)
            out["peer_step"] = bench_peer_step(peer)
        out["ingest"] = bench_ingest([1000, 20_000, 200_000, 1_000_000], [DEFAULT_OCCURRENCE, "first"])
        out["step"] = bench_step([1, 8, 64, 256], [1000, 8000, 32000])
        out["memory"] = bench_memory(500) + bench_memory(8000) + bench_memory(200_000)
        out["grow"] = bench_grow()
        out["pool"] = bench_pool()
        out["tail"] = bench_tail()
        return out
    finally:
        if peer:
            peer.close()
