"""Replay greedy outputs step by step with vLLM's n-gram drafter and with SAProposer's rule.

Run in the vLLM venv: ``python -P benchmarks/vllm/replay_drafts.py TRACES.json [K ...]``. TRACES is
``[{"id", "prompt": [ids], "out": [ids]}]`` (``saspec bench-vllm`` writes ``traces.json``: prompt ids
and the plain run's output). Each step drafts K tokens from the text so far, accepts the longest
prefix that equals the output plus one token (batch-1 greedy verification), and counts target
forwards. The n-gram drafts come from vLLM's own matching function, the SA drafts from a
``SuffixAutomaton`` with the proposer's minimum match, drafting K or (``per-match``) the proposer's
default draft length for the match; at K = 8 the counts equal the live bench's
(tokens / tok/fwd), so the replay shows where the two drafters differ without timing noise.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as ngram_draft

from saspec import SuffixAutomaton
from saspec.rules import DEFAULT_LENGTH_SCALE, draft_lengths


def forwards(prompt: list[int], out: list[int], draft) -> int:
    """Target forwards to produce ``out`` after ``prompt`` with drafts from ``draft(text) -> list``."""
    text, pos, fwd = list(prompt), 0, 0
    while pos < len(out):
        d = draft(text)
        n = 0
        while n < len(d) and pos + n < len(out) - 1 and d[n] == out[pos + n]:
            n += 1
        new = out[pos : pos + n + 1]
        text += new
        pos += len(new)
        fwd += 1
    return fwd


def drafters(k: int) -> dict:
    def ngram(lo: int, hi: int):
        return lambda text: ngram_draft(np.array(text, np.int32), lo, hi, 1 << 30, k).tolist()

    def sa(m: int, rule: str = "fixed"):
        def draft(text):
            s = SuffixAutomaton(text)
            match = s.match()[0]
            if match < m:
                return []
            n = int(draft_lengths(np.array([match]), k, rule, DEFAULT_LENGTH_SCALE)[0])
            return s.draft(k).tolist()[:n]

        return draft

    return {"ngram 5-5": ngram(5, 5), "ngram 2-5": ngram(2, 5), "saspec m>=5": sa(5), "saspec m>=3": sa(3),
            "saspec m>=2": sa(2), "saspec m>=5 per-match": sa(5, "per-match"),
            "saspec m>=3 per-match": sa(3, "per-match"), "saspec m>=2 per-match": sa(2, "per-match")}


def main(path: str, ks: list[int]) -> None:
    traces = json.load(open(path))
    for k in ks:
        names = list(drafters(k))
        print(f"\nK = {k}: target forwards (tokens per forward)\n")
        print("| prompt | tokens | " + " | ".join(names) + " |")
        print("|---|---:|" + "---:|" * len(names))
        for tr in traces:
            cells = []
            for name, fn in drafters(k).items():
                f = forwards(tr["prompt"], tr["out"], fn)
                cells.append(f"{f} ({len(tr['out']) / f:.2f})")
            print(f"| {tr['id']} | {len(tr['out'])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1], [int(k) for k in sys.argv[2:]] or [8])
