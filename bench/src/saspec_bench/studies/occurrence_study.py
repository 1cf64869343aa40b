"""Which earlier occurrence to draft from: every occurrence rule against the bound of choosing the best one.

At each output position the automaton's match is the longest suffix of the text that also ends earlier (length
``m``); an occurrence rule only picks *which* earlier occurrence of that suffix the draft copies (the match length
is the same under every rule). This study replays greedy verification at a fixed K, the same length rule for every
chooser (a K-token draft wherever ``m > 0``, none elsewhere), over the shipped recordings (``saspec record-traces``:
``real_outputs.jsonl.gz`` and ``cross_requests.jsonl.gz``) and the served runs' requests
(``benchmarks/vllm/served-*``: each prompt in its chat template and plain decoding's output), each request with its
own automaton, and counts the draft tokens each chooser gets accepted:

* the shipped rules (``saspec.OCCURRENCES``: first, recent, near-first, near-recent), from the real engine;
* ``oracle``: at each step, the earlier occurrence whose continuation agrees with the actual future text for the most
  tokens, found by scanning every occurrence (brute force): the bound of any rule that picks one occurrence a step;
* ``plan``: the fewest steps any sequence of such choices takes (a choice may accept less now to land better later),
  by dynamic programming over every occurrence's acceptance at every position;
* candidate rules, brute force, to see what would close the gap: ``latest`` (the most recent occurrence, exactly),
  ``freq`` (the most frequent continuation, token by token among the occurrences still consistent with the draft, as
  suffix-tree drafters do; ties to the earliest occurrence) and ``branched-freq`` (near-first, ``freq`` where the
  occurrences went on with more than one token: the engine's branch flag);
* causal rules that read only the text so far (``NEW_RULES``): following the previous occurrence while it continues
  (``sticky``, which is ``first`` again: the earliest occurrence stays the earliest as the match grows), a majority
  vote over the occurrences' continuations, the context past the token that ends the match, and near-first's anchor
  with those as its fallback (the anchor emulated by brute force, and checked against the engine's near-first);
* bounds on a better fallback alone (``FALLBACK_BOUNDS``): follow the previous occurrence or near-first's anchor,
  else draft from the best occurrence.

A draft is an occurrence's continuation, repeating with its period where it runs into the end of the text, as
``SpecEngine`` drafts. A step accepts the draft's longest prefix equal to the output and one token of the target's
own, so the last output token is never a draft's. Deterministic: no timing.

    python -m saspec_bench.studies.occurrence_study --json benchmarks/policy/results/occurrence_study.json \\
        --md benchmarks/policy/results/occurrence_study.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec.build import OCCURRENCES

from saspec_bench.positions import Flat, sa_positions

#: Draft lengths the study reports.
KS = (8, 32)
#: Most draft tokens a study may use (acceptance sets are bit masks of an int64).
MAX_K = 62
#: The brute-force choosers, beside the shipped rules, in the tables' column order.
CANDIDATES = ("latest", "freq", "branched-freq")
#: The bounds.
BOUNDS = ("oracle", "plan")
#: The rule the study measures the bound against: the engine's default.
BASE = "near-first"

Request = tuple[Sequence[int], Sequence[int]]  # (prompt ids, output ids)


@dataclass
class References:
    """Brute-force per-position results for one request's output (each array int64 [len(output)]).

    ``match``: the longest suffix of the text before the position that also ends earlier; ``occurrences``: how many
    earlier end positions it has; ``branched``: 1 where their next tokens are not all the same; ``best``: the most
    draft tokens any one occurrence's continuation gets accepted (at most K); ``reach``: bit ``a`` set where some
    occurrence gets exactly ``a`` accepted (bit 0 alone without a match); ``latest``, ``freq``: the acceptance of the
    most recent occurrence and of the greedy most-frequent continuation."""

    match: np.ndarray
    occurrences: np.ndarray
    branched: np.ndarray
    best: np.ndarray
    reach: np.ndarray
    latest: np.ndarray
    freq: np.ndarray


@njit(cache=True)
def _accepted(text, st, per, n, n_out, pos, k):
    """Leading tokens of the periodic continuation from ``st`` (period ``per``) equal to the output from ``pos``."""
    a = 0
    while a < k and pos + a < n_out and text[st + a % per] == text[n + a]:
        a += 1
    return a


@njit(cache=True)
def _majority(text, alive, nc, n, a, nxt, srt):
    """The ``a``-th next token of each of the ``nc`` occurrences continuing at ``alive`` (periodic past the end
    of the text) into ``nxt``; returns the most frequent one (ties: the earliest occurrence's)."""
    for x in range(nc):
        nxt[x] = text[alive[x] + a % (n - alive[x])]
        srt[x] = nxt[x]
    s = np.sort(srt[:nc])
    top_c = 0
    run = 0
    for x in range(nc):
        run = run + 1 if x > 0 and s[x] == s[x - 1] else 1
        top_c = max(top_c, run)
    for x in range(nc):
        c = np.searchsorted(s, nxt[x], side="right") - np.searchsorted(s, nxt[x], side="left")
        if c == top_c:
            return nxt[x]
    return -1


@njit(cache=True)
def _keep(alive, nxt, nc, top):
    """Keeps the occurrences whose next token is ``top`` at the front of ``alive``; returns how many."""
    kept = 0
    for x in range(nc):
        if nxt[x] == top:
            alive[kept] = alive[x]
            kept += 1
    return kept


@njit(cache=True)
def _advance_lcs(text, lcs, n):
    """Make ``lcs`` describe the text of ``n`` tokens (it described ``n - 1``): ``lcs[e]``, the longest common
    suffix of the text and its prefix ending at ``e`` (``e`` <= n - 2)."""
    if n >= 2:
        t = text[n - 1]
        for e in range(n - 2, 0, -1):  # descending: lcs[e - 1] still describes the text one token shorter
            lcs[e] = lcs[e - 1] + 1 if text[e] == t else 0
        lcs[0] = 1 if text[0] == t else 0


@njit(cache=True)
def _matched_ends(lcs, n, ends):
    """The match of the text of ``n`` tokens (the largest ``lcs``) and how many earlier ends reach it, written
    in order into ``ends``; (0, 0) without a match."""
    m = 0
    for e in range(n - 1):
        m = max(m, lcs[e])
    cnt = 0
    if m > 0:
        for e in range(n - 1):
            if lcs[e] == m:
                ends[cnt] = e
                cnt += 1
    return m, cnt


@njit(cache=True)
def _references(text, n0, k, match, occ, branched, best, reach, latest, freq):
    """Fill the per-position arrays of :class:`References` for ``text`` = prompt (``n0`` tokens) + output.

    ``lcs[e]``: the longest common suffix of the text so far and its prefix ending at ``e`` (``e`` <= n - 2),
    updated in place token by token; the match is its maximum, the occurrences the ends that reach it."""
    total = text.shape[0]
    n_out = total - n0
    lcs = np.zeros(total, np.int64)
    ends = np.empty(total, np.int64)
    alive = np.empty(total, np.int64)
    nxt = np.empty(total, np.int64)
    srt = np.empty(total, np.int64)
    for n in range(total):
        _advance_lcs(text, lcs, n)
        if n < n0:
            continue
        pos = n - n0
        reach[pos] = 1
        m, cnt = _matched_ends(lcs, n, ends)
        match[pos] = m
        if m == 0:
            continue
        occ[pos] = cnt
        reach[pos] = 0
        for x in range(cnt):
            st = ends[x] + 1
            a = _accepted(text, st, n - st, n, n_out, pos, k)
            reach[pos] |= np.int64(1) << a
            best[pos] = max(best[pos], a)
            if text[st] != text[ends[0] + 1]:
                branched[pos] = 1
        st = ends[cnt - 1] + 1
        latest[pos] = _accepted(text, st, n - st, n, n_out, pos, k)
        # freq: token by token, the most frequent next token among the occurrences still agreeing with the draft,
        # up to its first token the output does not have (the rest of the draft cannot be accepted)
        nc = cnt
        for x in range(nc):
            alive[x] = ends[x] + 1
        a = 0
        while a < k and pos + a < n_out:
            top = _majority(text, alive, nc, n, a, nxt, srt)
            if top != text[n + a]:
                break
            nc = _keep(alive, nxt, nc, top)
            a += 1
        freq[pos] = a


def references(prompt: Sequence[int], output: Sequence[int], k: int) -> References:
    """Brute-force per-position results (:class:`References`) for one request at draft length ``k``.

    Args:
        prompt: the prompt's token ids (may be empty).
        output: the output's token ids (at least one).
        k: draft tokens, 1 to ``MAX_K``.

    Raises:
        ValueError: an empty output, ``k`` out of range, token ids that are not integers in [0, 2**31).
    """
    _check_k(k)
    p, o = _ids(prompt, "prompt"), _ids(output, "output")
    if o.size == 0:
        raise ValueError("an output needs at least one token")
    text = np.concatenate([p, o])
    arrays = [np.zeros(o.size, np.int64) for _ in range(7)]
    _references(text, p.size, k, *arrays)
    return References(*arrays)


def _ids(ids: Sequence[int], what: str) -> np.ndarray:
    """``ids`` as a flat int64 array; refuses anything but integers (an empty sequence is fine)."""
    a = np.asarray(ids)
    if a.size and a.dtype.kind not in "iu":
        raise ValueError(f"{what} token ids must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64).reshape(-1)
    if a.size and (a.min() < 0 or a.max() >= 2**31):
        raise ValueError(f"{what} token ids must be in [0, 2**31), got {int(a.min())}..{int(a.max())}")
    return a


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be an int in [1, {MAX_K}], got {k!r}")


# -- causal rules beyond the shipped ones ---------------------------------------------

#: Causal rules the study measures beside the candidates above (brute force, text seen so far only), in the tables'
#: column order. ``sticky`` keeps the previous position's occurrence while its next token is the new one and it is
#: still an occurrence of the match, else the earliest; ``sticky-vote`` the same, else ``vote``; ``vote`` the
#: occurrence whose continuation agrees with the most others', token by token (the majority's next token, then the
#: majority among the occurrences that agree so far, up to K; ties to the earliest); ``context-run`` the occurrence
#: whose context goes on agreeing with the text furthest past the first disagreement that ends the match (one
#: substitution allowed; ``CONTEXT_RUN`` tokens at most), ``context-window`` the one with the most equal tokens,
#: position by position, among the ``CONTEXT_WINDOW`` before that disagreement (ties to the earliest); ``near-vote``,
#: ``near-run``, ``near-window``: near-first's anchor (the previous source while it continues, else the nearest
#: occurrence within ``NEAR_WINDOW`` of it), else that rule instead of the earliest.
NEW_RULES = ("sticky", "sticky-vote", "vote", "context-run", "context-window", "near-vote", "near-run", "near-window")
#: Not rules (they read the output), bounds on what a better fallback could do: ``sticky-oracle`` and ``near-oracle``
#: follow the previous occurrence (``sticky``) or near-first's anchor while they continue, else draft from the best
#: occurrence at that position (the earliest in the prompt, where nothing is drafted).
FALLBACK_BOUNDS = ("sticky-oracle", "near-oracle")
#: The brute force's emulation of near-first (checked against the engine's at every position), first in the arrays.
NEAR = "near"
_ROWS = (NEAR, *NEW_RULES, *FALLBACK_BOUNDS)
CONTEXT_RUN = 64
CONTEXT_WINDOW = 32
#: near-first's constants (saspec.core's NEAR_WINDOW and NEAR_MAX_CHECK), repeated here so the bench reads no
#: kernel module's internals; the emulation's check against the engine catches a change.
NEAR_WINDOW = 8
NEAR_MAX_CHECK = 32


@njit(cache=True)
def _vote(text, ends, cnt, n, k, alive, nxt, srt):
    """``vote``'s start: the occurrences' continuations (periodic past the end of the text) filtered token by token
    to the majority's next token (ties: the earliest occurrence's), up to ``k`` tokens or one occurrence left."""
    nc = cnt
    for x in range(nc):
        alive[x] = ends[x] + 1
    a = 0
    while a < k and nc > 1:
        nc = _keep(alive, nxt, nc, _majority(text, alive, nc, n, a, nxt, srt))
        a += 1
    return alive[0]


@njit(cache=True)
def _context(text, ends, cnt, n, m, run_cap, window):
    """(``context-run``'s start, ``context-window``'s start): the context before each occurrence of the m-suffix,
    compared with the text's past the token where the match ends (one substitution)."""
    best_run, run_st = -1, -1
    best_win, win_st = -1, -1
    for x in range(cnt):
        e = ends[x]
        run = 0
        going = True
        win = 0
        j = m + 1
        while j <= m + max(run_cap, window):
            i1 = e - j
            if i1 < 0:
                break
            same = text[i1] == text[n - 1 - j]
            if going and same and run < run_cap:
                run += 1
            else:
                going = False
            if j <= m + window and same:
                win += 1
            j += 1
        if run > best_run:
            best_run, run_st = run, e + 1
        if win > best_win:
            best_win, win_st = win, e + 1
    return run_st, win_st


@njit(cache=True)
def _ends_with_suffix(text, n, e, m):
    """True when the m tokens ending at position ``e`` < n - 1 equal the text's last m (of ``n``)."""
    if e < m - 1 or e >= n - 1:
        return False
    for j in range(m):
        if text[e - j] != text[n - 1 - j]:
            return False
    return True


@njit(cache=True)
def _near_end(text, n, anchor, prev_m, m, window, max_check):
    """near-first's end position at or near ``anchor`` (or -1), as the engine finds it: the anchor itself when its
    token is the new one, else the nearest position within ``window`` ending with the m-suffix."""
    if anchor < 0:
        return -1
    if text[anchor] == text[n - 1] and (prev_m > 0 or m <= 1):
        return anchor
    if m > max_check:
        return -1
    for d in range(window + 1):
        if _ends_with_suffix(text, n, anchor + d, m):
            return anchor + d
        if d > 0 and _ends_with_suffix(text, n, anchor - d, m):
            return anchor - d
    return -1


@njit(cache=True)
def _new_rules(text, n0, k, run_cap, window, near_window, near_max, acc, src):
    """Fill ``acc`` / ``src`` (int64 [len(_ROWS), n_out]) with each row of ``_ROWS``'s accepted draft tokens and
    draft start (-1 without a match) at every output position. The near rules see every token, the prompt's too,
    as the engine does; the sticky ones start at the first output position without a previous draft."""
    total = text.shape[0]
    n_out = total - n0
    lcs = np.zeros(total, np.int64)
    ends = np.empty(total, np.int64)
    alive = np.empty(total, np.int64)
    nxt = np.empty(total, np.int64)
    srt = np.empty(total, np.int64)
    anchors = np.full(5, -1, np.int64)  # near, near-vote, near-run, near-window, near-oracle
    sticky = np.full(3, -1, np.int64)  # sticky, sticky-vote, sticky-oracle: the previous position's start
    starts = np.empty(len(acc), np.int64)
    near = np.empty(5, np.int64)
    prev_m = 0
    for n in range(1, total):
        _advance_lcs(text, lcs, n)
        m, cnt = _matched_ends(lcs, n, ends)
        first = ends[0] + 1 if m > 0 else -1
        vote = -2
        run_st = -2
        win_st = -2
        best = first
        if m > 0 and n >= n0:
            top = -1
            for x in range(cnt):
                st = ends[x] + 1
                a = _accepted(text, st, n - st, n, n_out, n - n0, k)
                if a > top:
                    top, best = a, st
        for j in range(5):
            start = -1
            if m > 0:
                e = _near_end(text, n, anchors[j], prev_m, m, near_window, near_max)
                if e >= 0:
                    start = e + 1
                elif j == 0:
                    start = first
                elif j == 4:
                    start = best
                elif j == 1:
                    if vote == -2:
                        vote = _vote(text, ends, cnt, n, k, alive, nxt, srt)
                    start = vote
                else:
                    if run_st == -2:
                        run_st, win_st = _context(text, ends, cnt, n, m, run_cap, window)
                    start = run_st if j == 2 else win_st
            if start >= 0:
                anchors[j] = start
            elif anchors[j] >= 0 and anchors[j] + 1 < n:
                anchors[j] += 1
            else:
                anchors[j] = -1
            near[j] = start
        prev_m = m
        if n < n0:
            continue
        pos = n - n0
        # rows: 0 near, 1 sticky, 2 sticky-vote, 3 vote, 4 context-run, 5 context-window, 6-8 near-*,
        # 9 sticky-oracle, 10 near-oracle
        starts[0], starts[6], starts[7], starts[8] = near[0], near[1], near[2], near[3]
        if m > 0:
            if vote == -2:
                vote = _vote(text, ends, cnt, n, k, alive, nxt, srt)
            if run_st == -2:
                run_st, win_st = _context(text, ends, cnt, n, m, run_cap, window)
        for j in range(3):
            p = sticky[j]
            if m == 0:
                sticky[j] = -1
            elif p >= 0 and text[p] == text[n - 1] and lcs[p] == m:
                sticky[j] = p + 1
            else:
                sticky[j] = first if j == 0 else vote if j == 1 else best
        starts[1], starts[2] = sticky[0], sticky[1]
        starts[9], starts[10] = sticky[2], near[4]
        starts[3] = vote if m > 0 else -1
        starts[4] = run_st if m > 0 else -1
        starts[5] = win_st if m > 0 else -1
        for r in range(len(acc)):
            st = starts[r]
            src[r, pos] = st
            acc[r, pos] = 0 if st < 0 else _accepted(text, st, n - st, n, n_out, pos, k)


def causal_rules(prompt: Sequence[int], output: Sequence[int], k: int) -> tuple[dict[str, np.ndarray],
                                                                                 dict[str, np.ndarray]]:
    """Each of ``NEW_RULES``' and ``FALLBACK_BOUNDS``' (and the near-first emulation's, ``NEAR``) accepted draft tokens and draft start (the
    text position its draft copies from; -1 without a match) at every output position (int64 [len(output)]).

    Raises:
        ValueError: as :func:`references`.
    """
    _check_k(k)
    p, o = _ids(prompt, "prompt"), _ids(output, "output")
    if o.size == 0:
        raise ValueError("an output needs at least one token")
    text = np.concatenate([p, o])
    acc = np.zeros((len(_ROWS), o.size), np.int64)
    src = np.full((len(_ROWS), o.size), -1, np.int64)
    _new_rules(text, p.size, k, CONTEXT_RUN, CONTEXT_WINDOW, NEAR_WINDOW, NEAR_MAX_CHECK, acc, src)
    return dict(zip(_ROWS, acc)), dict(zip(_ROWS, src))


@njit(cache=True)
def _walk(offsets, acc, k):
    """Greedy verification of every request: (steps, accepted draft tokens) with at most ``k`` accepted a step."""
    steps = 0
    accepted = 0
    for r in range(offsets.shape[0] - 1):
        pos = offsets[r]
        end = offsets[r + 1]
        while pos < end:
            a = min(acc[pos], k, end - pos - 1)
            accepted += a
            steps += 1
            pos += a + 1
    return steps, accepted


@njit(cache=True)
def _plan(offsets, reach, k, k_max):
    """The fewest steps over every sequence of choices (``reach``: the acceptances on offer at each position, at
    draft length ``k_max``; at ``k`` an acceptance is cut to ``k``): (steps, accepted draft tokens)."""
    steps = 0
    for r in range(offsets.shape[0] - 1):
        s = offsets[r]
        length = offsets[r + 1] - s
        fewest = np.zeros(length + 1, np.int64)
        for p in range(length - 1, -1, -1):
            cap = min(k, length - p - 1)
            top = length + 1
            for b in range(k_max + 1):
                if (reach[s + p] >> b) & 1:
                    a = min(b, cap)
                    top = min(top, 1 + fewest[p + a + 1])
            fewest[p] = top
        steps += fewest[0]
    return steps, offsets[-1] - offsets[0] - steps


def positions(requests: Sequence[Request], k: int) -> tuple[Flat, dict[str, np.ndarray], np.ndarray]:
    """Every chooser's accepted draft tokens at every output position, at draft length ``k``.

    Returns (flat, acceptance, reach): ``acceptance`` maps each shipped rule (``saspec.OCCURRENCES``, from the real
    engine), each candidate (``CANDIDATES`` and ``NEW_RULES``) and ``oracle`` to an int64 array aligned with ``flat.tokens``; ``reach``
    (int64, aligned the same way) holds the acceptances on offer (see :class:`References`); ``acceptance["match"]``
    is the match length and ``acceptance["occurrences"]`` / ``["branched"]`` the brute force's counts.

    Raises:
        ValueError: no requests, or a request :func:`references` refuses (the message names it).
        RuntimeError: the engine disagrees with the brute force (its match length differs, or a rule's draft is not
            the continuation of an earlier occurrence of the match), or the brute force's near-first differs from the
            engine's: the study's premise fails.
    """
    _check_k(k)
    if not requests:
        raise ValueError("the study needs at least one request")
    refs, causal = [], []
    for i, (p, o) in enumerate(requests):
        try:
            refs.append(references(p, o, k))
            causal.append(causal_rules(p, o, k)[0])
        except ValueError as exc:
            raise ValueError(f"request {i}: {exc}") from None
    prompts = [np.asarray(p, np.int32).reshape(-1) for p, _ in requests]
    outs = [np.asarray(o, np.int32).reshape(-1) for _, o in requests]
    offsets = np.zeros(len(outs) + 1, np.int64)
    np.cumsum([o.size for o in outs], out=offsets[1:])
    flat = Flat(prompts, np.concatenate(outs), offsets)
    got: dict[str, np.ndarray] = {}
    for field in ("match", "occurrences", "branched", "best", "latest", "freq"):
        got[field] = np.concatenate([getattr(r, field) for r in refs])
    reach = np.concatenate([r.reach for r in refs])
    got["oracle"] = got.pop("best")
    for rule in OCCURRENCES:
        # One request at a time: in a wide batch, rows that fill their blobs in the same step past the step's
        # growth budget are parked and report no match for a step (saspec.growth), which would charge the
        # rules for a step without a draft, and depend on the background growth's timing.
        match = np.empty(flat.tokens.size, np.int32)
        acc = np.empty(flat.tokens.size, np.int32)
        for i in range(len(prompts)):
            s, e = offsets[i], offsets[i + 1]
            match[s:e], acc[s:e] = sa_positions(Flat([prompts[i]], outs[i], offsets[i: i + 2] - s), k, rule)
        bad = np.flatnonzero(match != got["match"])
        if bad.size:
            raise RuntimeError(f"occurrence {rule!r}: the engine's match length differs from the brute force's at "
                               f"{bad.size} positions (first: output position {int(bad[0])})")
        acc = acc.astype(np.int64)
        off = np.flatnonzero(((reach >> acc) & 1) == 0)
        if off.size:
            raise RuntimeError(f"occurrence {rule!r}: at {off.size} positions (first: {int(off[0])}) its draft is "
                               "no earlier occurrence's continuation")
        got[rule] = acc
    got["branched-freq"] = np.where(got["branched"] == 1, got["freq"], got[BASE])
    for rule in _ROWS:
        got[rule] = np.concatenate([c[rule] for c in causal])
    bad = np.flatnonzero(got.pop(NEAR) != got[BASE])
    if bad.size:
        raise RuntimeError(f"the brute force's near-first differs from the engine's at {bad.size} positions (first: "
                           f"{int(bad[0])}): the near-* rules would not be near-first's")
    return flat, got, reach


def study(requests: Sequence[Request], ks: Sequence[int] = KS) -> dict[str, Any]:
    """Totals per draft length: each chooser's steps, accepted draft tokens, accepted draft tokens and output tokens
    per step, the oracle's gain over ``near-first`` in % (in each of the last three) and the share of the steps it
    saves that each other chooser saves too (negative: more steps than near-first). The positions are computed once
    at the largest K: a shorter draft is a prefix of the longer one.

    Raises:
        ValueError: as :func:`positions`, or no ``ks``.
    """
    if not ks:
        raise ValueError("give at least one draft length")
    for k in ks:
        _check_k(k)
    k_max = max(ks)
    flat, acc, reach = positions(requests, k_max)
    tokens = int(flat.tokens.size)
    out: dict[str, Any] = {
        "requests": len(requests), "output_tokens": tokens,
        "positions": {"matched": int((acc["match"] > 0).sum()), "several_occurrences": int((acc["occurrences"] > 1)
                                                                                          .sum()),
                      "branched": int(acc["branched"].sum()),
                      "oracle_above_near_first": int((acc["oracle"] > acc[BASE]).sum())},
        "k": {},
    }
    for k in ks:
        rows: dict[str, dict[str, float]] = {}
        for name in (*OCCURRENCES, *CANDIDATES, *NEW_RULES, *FALLBACK_BOUNDS, "oracle"):
            steps, accepted = _walk(flat.offsets, acc[name], k)
            rows[name] = _row(int(steps), int(accepted), tokens)
        steps, accepted = _plan(flat.offsets, reach, k, k_max)
        rows["plan"] = _row(int(steps), int(accepted), tokens)
        base, best = rows[BASE], rows["oracle"]
        gap = base["steps"] - best["steps"]
        out["k"][str(k)] = {
            "rules": rows,
            "oracle_gain_pct": {m: _pct(best[m], base[m]) for m in ("accepted", "accepted_per_step",
                                                                        "tokens_per_step")},
            "closed": {name: (base["steps"] - rows[name]["steps"]) / gap if gap else None
                       for name in (*OCCURRENCES, *CANDIDATES, *NEW_RULES, *FALLBACK_BOUNDS) if name != BASE},
        }
    return out


def _row(steps: int, accepted: int, tokens: int) -> dict[str, float]:
    """A chooser's totals: steps (target forwards), accepted draft tokens, and both per step (output tokens per
    step counts the target's own token too)."""
    return {"steps": steps, "accepted": accepted, "accepted_per_step": accepted / steps,
            "tokens_per_step": tokens / steps}


def _pct(new: float, old: float) -> float | None:
    return 100.0 * (new / old - 1.0) if old else None


# -- the workloads ------------------------------------------------------------------


def recorded_workloads() -> dict[str, list[Request]]:
    """The shipped recordings as workloads ``real:<workload>`` (both files, where present)."""
    from saspec_bench.datafiles import CROSS_REQUESTS_PATH, REAL_OUTPUTS_PATH
    from saspec_bench.prompts import split_workloads

    out: dict[str, list[Request]] = {}
    for path in (REAL_OUTPUTS_PATH, CROSS_REQUESTS_PATH):
        if path.is_file():
            for name, w in split_workloads(path).items():
                out[name] = [(t.prompt, t.output) for t in w.traces]
    return out


def served_workloads(folders: Sequence[Path]) -> tuple[dict[str, list[Request]], dict[str, list[str]]]:
    """The served runs' requests as workloads ``served:<folder>``, one per distinct set of requests (folders that
    serve the same prompts with the same plain outputs are one workload). Returns (workloads, the folders each
    stands for).

    Raises:
        FileNotFoundError: a folder without ``dataset.jsonl`` or a plain run.
    """
    from saspec_bench.served_sim import load_run
    from saspec_bench.tokenizers import get_tokenizer

    encode = get_tokenizer("qwen2.5").encode
    out: dict[str, list[Request]] = {}
    same: dict[str, list[str]] = {}
    seen: dict[tuple, str] = {}
    for folder in sorted(Path(f) for f in folders):
        requests = load_run(folder, encode)
        key = tuple((tuple(p), tuple(o)) for p, o in requests)
        if key in seen:
            same[seen[key]].append(folder.name)
            continue
        name = f"served:{folder.name}"
        seen[key] = name
        out[name] = [(np.asarray(p, np.int32), np.asarray(o, np.int32)) for p, o in requests]
        same[name] = [folder.name]
    return out, same


# -- reporting ----------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    """The tables, per K: each workload's accepted draft tokens under every chooser; then output tokens per step
    and accepted draft tokens (near-first, the oracle), the oracle's gain and the share of its saved steps each other
    chooser saves."""
    cols = (*OCCURRENCES, *CANDIDATES, *BOUNDS)
    others = [c for c in (*OCCURRENCES, *CANDIDATES) if c != BASE]  # the new rules have their own table
    lines = []
    for k in results["ks"]:
        lines += [f"K = {k}, accepted draft tokens (greedy verification; a K-token draft wherever the match is "
                  "non-empty):", "",
                  "| workload | requests | output tokens | " + " | ".join(cols) + " |",
                  "|---|---:|---:|" + "---:|" * len(cols)]
        for name, w in results["workloads"].items():
            r = w["k"][str(k)]
            lines.append(f"| {name} | {w['requests']} | {w['output_tokens']} | "
                         + " | ".join(str(r["rules"][c]["accepted"]) for c in cols) + " |")
        lines += ["", f"K = {k}, per step: accepted draft tokens and output tokens (the target's own included) under "
                  f"{BASE} and the oracle, the oracle's gain, and the share of the steps it saves that each chooser "
                  "saves too:", "",
                  f"| workload | accepted / step, {BASE} | oracle | gain | tokens / step, {BASE} | oracle | gain | "
                  + " | ".join(f"closed by {c}" for c in others) + " |",
                  "|---|" + "---:|" * (6 + len(others))]
        for name, w in results["workloads"].items():
            r = w["k"][str(k)]
            gain = r["oracle_gain_pct"]
            lines.append(f"| {name} | " + " | ".join(
                f"{r['rules'][BASE][m]:.3f} | {r['rules']['oracle'][m]:.3f} | {_fmt_pct(gain[m])}"
                for m in ("accepted_per_step", "tokens_per_step")) + " | "
                         + " | ".join("n/a" if r["closed"][c] is None else f"{r['closed'][c]:.2f}" for c in others)
                         + " |")
        lines += ["", f"K = {k}, the causal rules beyond the candidates: output tokens per step, and (in brackets) the "
                  "share of the oracle's saved steps each saves:", "",
                  f"| workload | {BASE} | oracle | " + " | ".join((*NEW_RULES, *FALLBACK_BOUNDS)) + " |",
                  "|---|---:|---:|" + "---:|" * (len(NEW_RULES) + len(FALLBACK_BOUNDS))]
        for name, w in results["workloads"].items():
            r = w["k"][str(k)]
            cells = [f"{r['rules'][c]['tokens_per_step']:.3f}" for c in (BASE, "oracle")]
            cells += [f"{r['rules'][c]['tokens_per_step']:.3f} ("
                      + ("n/a" if r["closed"][c] is None else f"{r['closed'][c]:.2f}") + ")"
                      for c in (*NEW_RULES, *FALLBACK_BOUNDS)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _fmt_pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m saspec_bench.studies.occurrence_study",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=list(KS), help="draft lengths (default 8 32)")
    ap.add_argument("--served", type=Path, nargs="*", default=None,
                    help="served-run folders (default: benchmarks/vllm/served-* under the current directory)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--md", type=Path, default=None, help="write the tables here")
    a = ap.parse_args(argv)
    for k in a.k:
        if not 1 <= k <= MAX_K:
            ap.error(f"--k must be in [1, {MAX_K}], got {k}")
    folders = a.served if a.served is not None else sorted(Path("benchmarks/vllm").glob("served-*"))
    if a.served is None and not folders:
        ap.error("no served runs under benchmarks/vllm (run from the repository root, or pass --served)")
    workloads = recorded_workloads()
    served, same = served_workloads(folders)
    workloads.update(served)
    results: dict[str, Any] = {"commit": _commit(), "ks": list(a.k), "base": BASE, "served_folders": same,
                               "workloads": {}}
    for name, requests in workloads.items():
        results["workloads"][name] = study(requests, a.k)
        print(f"[{name} done]", flush=True)
    text = markdown(results)
    print("\n" + text)
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    if a.md is not None:
        a.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
