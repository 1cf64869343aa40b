"""Which source should a row draft from once earlier requests are pooled? A study for
cross-request memory (no engine support yet): greedy acceptance in arrival order.

Each workload's traces run in order; request i's pool is the outputs of the
``--pool`` requests before it (oldest first, a separator between them). At every
step each rule proposes K = 8 tokens, the accepted ones are the common prefix with
the recorded output, and the text grows by them plus one bonus token; AL is output
tokens per step. Rules:

* ``own``: the request's own automaton (what saspec drafts today);
* ``prepend``: one automaton over the pool followed by the request, drafting from
  any match with the ``first`` occurrence rule (the naive pool);
* ``longer+M``: the prepended automaton's draft only where its match is longer
  than the own automaton's by more than M tokens; the own draft otherwise.

Usage: python -m saspec_bench.studies.pool_rules [--pool 50] [--n 60] [--margins 0,4,16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from saspec import SuffixAutomaton
from saspec_bench import workloads as wl
from saspec_bench.datafiles import REAL_OUTPUTS_PATH as REAL_OUTPUTS
from saspec_bench.tokenizers import get_tokenizer

K = 8
SEP = 2**31 - 2  # a token no output holds: no match crosses a request boundary


def accepted(draft: np.ndarray, out: np.ndarray, q: int) -> int:
    """Leading draft tokens equal to ``out[q:]``; the last output token is never drafted."""
    n = min(draft.shape[0], out.shape[0] - q - 1)
    a = 0
    while a < n and draft[a] == out[q + a]:
        a += 1
    return a


def run(prompt: np.ndarray, out: np.ndarray, pool: list[int], rule: str, margin: int) -> int:
    """Steps to emit ``out`` under ``rule``."""
    own = SuffixAutomaton(prompt, occurrence="first")
    comb = SuffixAutomaton(np.concatenate([np.asarray(pool, np.int32), prompt]), occurrence="first") \
        if rule != "own" else None
    q = steps = 0
    while q < out.shape[0]:
        m_own = own.match()[0]
        if rule == "own":
            draft = own.draft(K)
        elif rule == "prepend":
            draft = comb.draft(K)
        else:
            draft = comb.draft(K) if comb.match()[0] > m_own + margin else own.draft(K)
        a = accepted(draft, out, q)
        new = out[q : q + a + 1]
        own.extend(new)
        if comb is not None:
            comb.extend(new)
        q += a + 1
        steps += 1
    return steps


def study(name: str, traces: list, pool_n: int, margins: list[int]) -> dict[str, float]:
    rules = [("own", 0), ("prepend", 0)] + [(f"longer+{m}", m) for m in margins]
    steps = {r: 0 for r, _ in rules}
    tokens = 0
    outputs: list[np.ndarray] = []
    for t in traces:
        pool: list[int] = []
        for o in outputs[-pool_n:]:
            pool += o.tolist() + [SEP]
        for r, m in rules:
            steps[r] += run(t.prompt, t.output, pool, r.split("+")[0], m)
        tokens += t.output.shape[0]
        outputs.append(t.output)
    return {r: tokens / s for r, s in steps.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=int, default=50, help="earlier outputs in the pool")
    ap.add_argument("--n", type=int, default=60, help="requests per built workload")
    ap.add_argument("--margins", default="0,4,16", help="the longer+M rules' margins")
    args = ap.parse_args()
    margins = [int(x) for x in args.margins.split(",") if x.strip()]
    tok = get_tokenizer()
    workloads = {name: list(wl.build_workload(name, tok, args.n, seed=0).traces)
                 for name in ("humaneval", "code-edits", "chat")}
    workloads["real outputs"] = list(wl.load_traces(REAL_OUTPUTS).traces)
    print(f"pool of {args.pool} earlier outputs, K = {K}, greedy acceptance, arrival order; AL, and / own")
    for name, traces in workloads.items():
        t0 = time.perf_counter()
        al = study(name, traces, args.pool, margins)
        row = ", ".join(f"{r} {v:.3f} ({v / al['own']:.3f}x)" for r, v in al.items())
        print(f"{name} ({len(traces)} requests, {time.perf_counter() - t0:.0f} s): {row}", flush=True)


if __name__ == "__main__":
    main()
