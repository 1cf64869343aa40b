"""The occurrence study: its brute force equals a naive scan on small random texts, the oracle is at least every
occurrence rule at every position, the plan is the fewest steps of any sequence of choices, the walks count what
greedy verification accepts, and bad inputs are refused."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from oracle import draft, matches

from saspec import OCCURRENCES
from saspec_bench.studies.occurrence_study import (BASE, CANDIDATES, FALLBACK_BOUNDS, MAX_K, NEAR, NEW_RULES,
                                                   causal_rules, markdown, positions, references, served_workloads,
                                                   study)
from saspec_bench.served_sim import CHAT
from saspec_bench.tokenizers import get_tokenizer


def _random_requests(seed: int, n: int = 3, alphabet: int = 3) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        base = rng.integers(0, alphabet, int(rng.integers(0, 30))).tolist()
        # outputs that partly copy the prompt, so matches are long and occurrences many
        copy = base[int(rng.integers(0, len(base) + 1)):] if base else []
        noise = rng.integers(0, alphabet, int(rng.integers(1, 25))).tolist()
        output = (copy + noise)[: int(rng.integers(1, 40))] or [0]
        out.append((base, output))
    return out


def _naive(prompt: list[int], output: list[int], k: int) -> list[dict]:
    """Per output position, by the plainest scan: the match, every occurrence's acceptance, the latest occurrence's
    and the greedy most-frequent continuation's, and whether the occurrences branch."""
    text = list(prompt) + list(output)
    rows = matches(text)
    res = []
    for pos in range(len(output)):
        n = len(prompt) + pos
        m, _, _, ends = rows[n - 1] if n > 0 else (0, -1, -1, [])

        def accepted(d: list[int]) -> int:
            a = 0
            while a < k and pos + a < len(output) and d[a] == output[pos + a]:
                a += 1
            return a

        accs = [accepted(draft(text, n, e + 1, k)) for e in ends]
        alive, freq_draft = list(ends), []
        for j in range(k if ends else 0):
            toks = [draft(text, n, e + 1, k)[j] for e in alive]
            count = Counter(toks)
            top = next(t for t in toks if count[t] == max(count.values()))
            freq_draft.append(top)
            alive = [e for e, t in zip(alive, toks) if t == top]
        res.append({"match": m, "occurrences": len(ends), "accs": accs,
                    "latest": accs[-1] if accs else 0, "freq": accepted(freq_draft) if ends else 0,
                    "branched": int(len({text[e + 1] for e in ends}) > 1)})
    return res


def _fewest_steps(options: list[set[int]]) -> int:
    """Exhaustive search over every sequence of choices (memoized on the position)."""
    memo: dict[int, int] = {}

    def go(p: int) -> int:
        if p >= len(options):
            return 0
        if p not in memo:
            memo[p] = 1 + min(go(p + min(a, len(options) - p - 1) + 1) for a in options[p])
        return memo[p]

    return go(0)


def _greedy_steps(acc: list[int], k: int) -> tuple[int, int]:
    pos = steps = accepted = 0
    while pos < len(acc):
        a = min(acc[pos], k, len(acc) - pos - 1)
        steps, accepted, pos = steps + 1, accepted + a, pos + a + 1
    return steps, accepted


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("k", [1, 3, 8])
def test_the_brute_force_equals_a_naive_scan(seed, k):
    for prompt, output in _random_requests(seed, alphabet=2 + seed % 3):
        ref = references(prompt, output, k)
        naive = _naive(prompt, output, k)
        assert ref.match.tolist() == [r["match"] for r in naive]
        assert ref.occurrences.tolist() == [r["occurrences"] for r in naive]
        assert ref.best.tolist() == [max(r["accs"], default=0) for r in naive]
        assert ref.reach.tolist() == [sum(1 << a for a in set(r["accs"] or [0])) for r in naive]
        assert ref.latest.tolist() == [r["latest"] for r in naive]
        assert ref.freq.tolist() == [r["freq"] for r in naive]
        assert ref.branched.tolist() == [r["branched"] for r in naive]


@pytest.mark.parametrize("seed", range(8))
def test_the_oracle_is_at_least_every_rule_and_the_plan_is_the_fewest_steps(seed):
    requests = _random_requests(100 + seed, n=4, alphabet=2 + seed % 3)
    k = 6
    flat, acc, reach = positions(requests, k)
    choosers = (*OCCURRENCES, *CANDIDATES, *NEW_RULES, *FALLBACK_BOUNDS)
    assert set(choosers) | {"oracle"} <= set(acc)
    for name in choosers:
        assert (acc[name] <= acc["oracle"]).all(), name
        assert (((reach >> acc[name]) & 1) == 1).all(), name  # each rule's draft is one of the occurrences'
    # the shipped "first" rule copies the earliest occurrence: the engine against the naive scan
    naive = [r for p, o in requests for r in _naive(p, o, k)]
    assert acc["first"].tolist() == [r["accs"][0] if r["accs"] else 0 for r in naive]
    res = study(requests, ks=(2, k))
    for kk in (2, k):
        rows = res["k"][str(kk)]["rules"]
        options = [{min(a, kk) for a in (r["accs"] or [0])} for r in naive]
        fewest, s = 0, 0
        for i in range(len(requests)):
            n = flat.offsets[i + 1] - flat.offsets[i]
            fewest += _fewest_steps(options[s: s + n])
            s += n
        assert rows["plan"]["steps"] == fewest
        assert all(rows["plan"]["steps"] <= rows[name]["steps"] for name in (*choosers, "oracle"))
        for name in (*choosers, "oracle"):
            steps = accepted = 0
            for i in range(len(requests)):
                st, ac = _greedy_steps(acc[name][flat.offsets[i]: flat.offsets[i + 1]].tolist(), kk)
                steps, accepted = steps + st, accepted + ac
            assert (rows[name]["steps"], rows[name]["accepted"]) == (steps, accepted), name
            assert rows[name]["accepted"] + rows[name]["steps"] == res["output_tokens"]


def test_a_copy_is_drafted_in_full_and_the_oracle_finds_the_occurrence_first_misses():
    # "1 2 3" occurs twice in the prompt; only the second goes on as the output does
    prompt = [1, 2, 3, 9, 9, 9, 5, 1, 2, 3, 4, 5, 6, 7, 8]
    output = [1, 2, 3, 4, 5, 6, 7, 8, 0]
    res = study([(prompt, output)], ks=(8,))
    rows = res["k"]["8"]["rules"]
    assert rows["oracle"]["accepted"] > rows["first"]["accepted"]
    assert rows["oracle"]["accepted"] >= rows[BASE]["accepted"]
    assert res["k"]["8"]["oracle_gain_pct"]["accepted"] == pytest.approx(
        100 * (rows["oracle"]["accepted"] / rows[BASE]["accepted"] - 1))
    assert study([(prompt, output)], ks=(8,)) == res  # deterministic
    json.dumps(res)  # plain JSON
    text = markdown({"ks": [8], "workloads": {"tiny": res}})
    assert "| tiny | 1 | 9 |" in text and "oracle" in text


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("k", [1, 4, 8])
def test_each_causal_rule_drafts_from_a_real_earlier_occurrence(seed, k):
    for prompt, output in _random_requests(200 + seed, alphabet=2 + seed % 3):
        acc, src = causal_rules(prompt, output, k)
        naive = _naive(prompt, output, k)
        text = list(prompt) + list(output)
        rows = matches(text)
        best = references(prompt, output, k).best
        for name in (NEAR, *NEW_RULES, *FALLBACK_BOUNDS):
            for pos, row in enumerate(naive):
                n = len(prompt) + pos
                st = int(src[name][pos])
                if row["match"] == 0:
                    assert (st, acc[name][pos]) == (-1, 0), (name, pos)
                    continue
                ends = rows[n - 1][3]
                assert st - 1 in ends, (name, pos)  # an earlier end of the matched suffix
                d = draft(text, n, st, k)
                a = 0
                while a < k and pos + a < len(output) and d[a] == output[pos + a]:
                    a += 1
                assert acc[name][pos] == a, (name, pos)
            assert (acc[name] <= best).all(), name
        # following the previous occurrence while it continues is the earliest occurrence again (it stays the
        # earliest of the match's occurrences as both grow by the same token)
        assert src["sticky"].tolist() == [rows[len(prompt) + p - 1][3][0] + 1 if r["match"] else -1
                                          for p, r in enumerate(naive)]
        assert (acc["sticky-oracle"] <= best).all() and (acc["near-oracle"] <= best).all()
    # the brute force's near-first is the engine's
    requests = _random_requests(300 + seed, alphabet=2 + seed % 3)
    _, got, _ = positions(requests, k)
    assert np.concatenate([causal_rules(p, o, k)[0][NEAR] for p, o in requests]).tolist() == got[BASE].tolist()


def test_sticky_follows_its_source_until_it_breaks_then_takes_the_earliest():
    # text: 1 2 3 4 5 0 | 1 2 3 6 7 0 | output 1 2 3 6 8 2 3 4
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 3, 6, 7, 0]
    output = [1, 2, 3, 6, 8, 2, 3, 4]
    acc, src = causal_rules(prompt, output, 8)
    # "0" occurs once (ends at 5): draft from 6 and follow it while its next token is the output's (7, 8, 9, 10);
    # 7 is not 8, and "8" never occurred: no draft; then "2" ends at 1, 7 and 13: the earliest, start 2, which the
    # last token 3 continues (start 3; "2 3" ends at 2, 8 and 14)
    assert src["sticky"].tolist() == [6, 7, 8, 9, 10, -1, 2, 3]
    assert acc["sticky"].tolist() == [4, 3, 2, 1, 0, 0, 2, 1]
    # near-first's anchor advanced through the unmatched 8 to 11 and finds "2" nearest it, at 13 (3 6 8: one)
    assert src[NEAR].tolist()[5:7] == [-1, 14] and acc[NEAR][6] == 1
    _, got, _ = positions([(prompt, output)], 8)
    assert got[BASE].tolist() == acc[NEAR].tolist() and got["first"].tolist() == acc["sticky"].tolist()


@pytest.mark.parametrize("call, match", [
    (lambda: references([1], [], 4), "at least one token"),
    (lambda: references([1], [2], 0), r"k must be an int in \[1, 62\]"),
    (lambda: references([1], [2], MAX_K + 1), r"k must be an int in \[1, 62\]"),
    (lambda: references([1], [2], True), "k must be an int"),
    (lambda: references([1.5], [2], 4), "prompt token ids must be integers"),
    (lambda: references([1], [-2], 4), r"output token ids must be in \[0, 2\*\*31\)"),
    (lambda: references([2**31], [2], 4), r"prompt token ids must be in \[0, 2\*\*31\)"),
    (lambda: causal_rules([1], [], 4), "at least one token"),
    (lambda: causal_rules([1], [2], MAX_K + 1), r"k must be an int in \[1, 62\]"),
    (lambda: causal_rules([1], [0.5], 4), "output token ids must be integers"),
    (lambda: positions([], 4), "at least one request"),
    (lambda: positions([([1], [2]), ([1], [])], 4), "request 1: an output needs at least one token"),
    (lambda: study([([1], [2])], ks=()), "at least one draft length"),
    (lambda: study([([1], [2])], ks=(8, 0)), "k must be an int"),
])
def test_bad_inputs_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_served_runs_with_the_same_requests_are_one_workload(tmp_path):
    def run(name: str, prompts: list[str], texts: list[str]) -> None:
        folder = tmp_path / name
        (folder / "runs").mkdir(parents=True)
        (folder / "dataset.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in prompts))
        (folder / "runs" / "0.5b-plain-r0-c4.json").write_text(json.dumps({"generated_texts": texts}))

    run("served-a", ["fix this", "and that"], ["fixed", "done"])
    run("served-a-c8", ["fix this", "and that"], ["fixed", "done"])
    run("served-b", ["fix this", "and that"], ["fixed", "other"])
    got, same = served_workloads([tmp_path / "served-a-c8", tmp_path / "served-b", tmp_path / "served-a"])
    assert list(got) == ["served:served-a", "served:served-b"]
    assert same == {"served:served-a": ["served-a", "served-a-c8"], "served:served-b": ["served-b"]}
    encode = get_tokenizer("qwen2.5").encode
    prompt, output = got["served:served-a"][0]
    assert prompt.tolist() == encode(CHAT.format("fix this")) and output.tolist() == encode("fixed<|im_end|>")
    with pytest.raises(FileNotFoundError):
        served_workloads([tmp_path / "nowhere"])
