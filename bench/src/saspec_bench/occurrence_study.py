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
  occurrences went on with more than one token: the engine's branch flag).

A draft is an occurrence's continuation, repeating with its period where it runs into the end of the text, as
``SpecEngine`` drafts. A step accepts the draft's longest prefix equal to the output and one token of the target's
own, so the last output token is never a draft's. Deterministic: no timing.

    python -m saspec_bench.occurrence_study --json benchmarks/policy/results/occurrence_study.json \\
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

from .positions import Flat, sa_positions

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
        if n >= 2:
            t = text[n - 1]
            for e in range(n - 2, 0, -1):  # descending: lcs[e - 1] still describes the text one token shorter
                lcs[e] = lcs[e - 1] + 1 if text[e] == t else 0
            lcs[0] = 1 if text[0] == t else 0
        if n < n0:
            continue
        pos = n - n0
        reach[pos] = 1
        m = 0
        for e in range(n - 1):
            m = max(m, lcs[e])
        match[pos] = m
        if m == 0:
            continue
        cnt = 0
        for e in range(n - 1):
            if lcs[e] == m:
                ends[cnt] = e
                cnt += 1
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
            for x in range(nc):
                nxt[x] = text[alive[x] + a % (n - alive[x])]
                srt[x] = nxt[x]
            s = np.sort(srt[:nc])
            top_c = 0
            run = 0
            for x in range(nc):
                run = run + 1 if x > 0 and s[x] == s[x - 1] else 1
                top_c = max(top_c, run)
            top = -1
            for x in range(nc):  # ties: the earliest occurrence's token
                c = np.searchsorted(s, nxt[x], side="right") - np.searchsorted(s, nxt[x], side="left")
                if c == top_c:
                    top = nxt[x]
                    break
            if top != text[n + a]:
                break
            kept = 0
            for x in range(nc):
                if nxt[x] == top:
                    alive[kept] = alive[x]
                    kept += 1
            nc = kept
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
    engine), each candidate (``CANDIDATES``) and ``oracle`` to an int64 array aligned with ``flat.tokens``; ``reach``
    (int64, aligned the same way) holds the acceptances on offer (see :class:`References`); ``acceptance["match"]``
    is the match length and ``acceptance["occurrences"]`` / ``["branched"]`` the brute force's counts.

    Raises:
        ValueError: no requests, or a request :func:`references` refuses (the message names it).
        RuntimeError: the engine disagrees with the brute force (its match length differs, or a rule's draft is not
            the continuation of an earlier occurrence of the match): the study's premise fails.
    """
    _check_k(k)
    if not requests:
        raise ValueError("the study needs at least one request")
    refs = []
    for i, (p, o) in enumerate(requests):
        try:
            refs.append(references(p, o, k))
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
        for name in (*OCCURRENCES, *CANDIDATES, "oracle"):
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
                       for name in (*OCCURRENCES, *CANDIDATES) if name != BASE},
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
    from .datafiles import CROSS_REQUESTS_PATH, REAL_OUTPUTS_PATH
    from .prompts import split_workloads

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
    from .served_sim import load_run
    from .tokenizers import get_tokenizer

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
    others = [c for c in (*OCCURRENCES, *CANDIDATES) if c != BASE]
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
    ap = argparse.ArgumentParser(prog="python -m saspec_bench.occurrence_study",
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
