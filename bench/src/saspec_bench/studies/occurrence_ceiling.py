"""How much can the choice of occurrence gain? SA-only AL of each occurrence rule against
two brute-force references, on the simulator's workloads.

For every output position the longest earlier-occurring suffix (length m) is
fixed; an occurrence rule only chooses *which* earlier occurrence of it to copy from.

* ``freq``: the most frequent continuation, greedily token by token (among the
  occurrences still consistent with the draft so far), as suffix-tree drafters
  such as SuffixDecoding do.
* ``oracle``: the occurrence whose continuation is accepted longest, chosen
  with knowledge of the output: the ceiling for any occurrence rule.

Usage: python -m saspec_bench.studies.occurrence_ceiling [--size-scale 1.0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from saspec_bench import workloads as wl
from saspec_bench.acceptance import walk
from saspec_bench.positions import SA, Flat, sa_positions
from saspec_bench.tokenizers import get_tokenizer

K = 8


@njit(cache=True)
def _reference_acceptance(text, n0, out, m_arr, k):
    """Per output position: accepted tokens of the greedy-frequency draft and of
    the best occurrence, both over all occurrences of the m-suffix."""
    n_out = out.shape[0]
    best = np.zeros(n_out, np.int32)
    freq = np.zeros(n_out, np.int32)
    ends = np.empty(text.shape[0], np.int64)
    draft = np.empty(k, np.int64)
    for pos in range(n_out):
        n = n0 + pos
        m = m_arr[pos]
        if m == 0:
            continue
        cnt = 0
        for e in range(m - 1, n - 1):
            j = 0
            while j < m and text[e - j] == text[n - 1 - j]:
                j += 1
            if j == m:
                ends[cnt] = e
                cnt += 1
        for x in range(cnt):  # oracle: the best single occurrence (periodic past the end)
            st = ends[x] + 1
            per = n - st
            a = 0
            while a < k and pos + a < n_out and text[st + a % per] == out[pos + a]:
                a += 1
            best[pos] = max(best[pos], a)
        nc = cnt  # greedy frequency
        for j in range(k):
            draft[j] = -1
        for j in range(k):
            top, top_c = -1, 0
            for x in range(nc):
                p = ends[x] + 1 + j
                if p >= n:
                    continue
                c = 0
                for y in range(nc):
                    q = ends[y] + 1 + j
                    if q < n and text[q] == text[p]:
                        c += 1
                if c > top_c:
                    top, top_c = text[p], c
            if top < 0:
                break
            draft[j] = top
            kept = 0
            for x in range(nc):
                p = ends[x] + 1 + j
                if p < n and text[p] == top:
                    ends[kept] = ends[x]
                    kept += 1
            nc = kept
        a = 0
        while a < k and pos + a < n_out and draft[a] == out[pos + a]:
            a += 1
        freq[pos] = a
    return best, freq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-scale", type=float, default=1.0)
    args = ap.parse_args()
    tok = get_tokenizer()
    sizes = {"code-edits": 40, "humaneval-edit": 80, "chat": 100}
    print("| workload | first | recent | near-first | near-recent | freq (brute force) | oracle occurrence | oracle / first |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n in sizes.items():
        t0 = time.perf_counter()
        w = wl.build_workload(name, tok, max(1, int(n * args.size_scale)), 0)
        flat = Flat.of(w.traces)

        def al(acc):
            hist = np.zeros(K + 2, np.int64)
            steps = walk(flat.offsets, np.ones_like(acc), acc, acc, K, SA, 1, hist, 0.0)[0]
            return flat.tokens.shape[0] / steps

        res = {}
        match = None
        for occurrence in ("first", "recent", "near-first", "near-recent"):
            m, acc = sa_positions(flat, K, occurrence)
            match = m if match is None else match
            assert np.array_equal(m, match)  # the match length never depends on the occurrence rule
            res[occurrence] = al(acc)
        best = np.zeros_like(match)
        freq = np.zeros_like(match)
        for i, t in enumerate(w.traces):
            s, e = flat.offsets[i], flat.offsets[i + 1]
            text = np.concatenate([t.prompt, t.output]).astype(np.int32)
            best[s:e], freq[s:e] = _reference_acceptance(text, len(t.prompt), t.output.astype(np.int32), match[s:e], K)
        res["freq"], res["oracle"] = al(freq), al(best)
        print(f"| {name} ({len(w.traces)} traces) | " + " | ".join(f"{res[k]:.3f}" for k in
              ("first", "recent", "near-first", "near-recent", "freq", "oracle"))
              + f" | {res['oracle'] / res['first']:.3f}x |  <!-- {time.perf_counter() - t0:.0f} s -->")


if __name__ == "__main__":
    main()
