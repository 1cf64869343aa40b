"""Served runs replayed at concurrency under a modeled step cost: the drafting policy against its bound, the
fixed rules and the real peers, deterministically, in seconds to minutes.

``saspec bench-vllm --served`` measures the drafters in a real server, 15-30 minutes a run and a few percent
apart from one run to the next. This replays one of its runs: the run's prompts (``dataset.jsonl``) and plain
decoding's outputs (``runs/*plain*.json``, identical for every drafter at temperature 0) are served as vLLM's
scheduler would: up to ``concurrency`` requests at once, each admitted in one prefill step when a row frees,
every row's draft verified against its output (the accepted prefix plus the target's own token). A step costs
what a step-cost curve (``saspec_bench.step_curves``) says for its tokens (prefills, rows and draft tokens):
the CPU model or the published GPU curve, or any curve file (``--curve``). Each drafter
(``saspec_bench.served_drafters``) sees the batch as vLLM's proposers do, on the replay's clock:

* ``policy``: the real ``SAProposer`` with its drafting policy, given the regime's prior cost shape
  (``saspec.policy.cpu_like`` / ``gpu_like``, as the curve names);
* ``oracle``: the bound of any length policy over saspec's drafts: each row's own K = 32 draft cut to exactly
  what will be accepted (at every match the policy weighs, one token included);
* ``K=8``, ``K=16``, ``K=32``: saspec's drafts at a fixed length; ``match-capped``: no longer than the match
  (vLLM suffix's length rule), K = 32; these from a match of 2 tokens (the fixed rules' default);
* ``plain``: no drafts;
* ``arctic``: ArcticInference's suffix cache as vLLM's ``suffix`` method drives it (its defaults, a global cache
  of responses); ``ngram``: vLLM's n-gram proposer (2-5); both at K = ``--peer-k``, where they import (else
  reported absent).

Longer streams: ``--repeat N`` serves the run's requests N times, each round in its own seeded shuffled order
(``--in-order``: the order the run's client sent them, where prose and code come in stretches), every copy a
request of its own (the pool and Arctic's global cache hold the earlier rounds' texts); the stream's first quarter
is also replayed alone on a fresh drafter, as the *cold start* of a fresh server. ``--by-kind``: also the decoding
steps a request of each kind took (``dataset.jsonl``'s ``kind``: code edits, free-form questions), which a served
run's inter-token latencies give too (one a step): where a drafter's time goes, and what the oracle would save.

What it leaves out: vLLM's own overheads, the request that warms the server, chunked prefills, drafting time.
Compare drafters here, confirm in a served run.

    python -m saspec_bench.served_sim benchmarks/vllm/served-0.5b-code --concurrency 1 8 32 --repeat 4
"""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from .pool_sim import accepted_prefix
from .served_drafters import (ArcticDrafter, Batch, NgramDrafter, PlainDrafter, SaspecDrafter, peers_available)
from .step_curves import CURVES, Curve, load_curve

Request = tuple[list[int], list[int]]  # (prompt ids, output ids)
#: The drafters a table compares, in its column order.
DRAFTERS = ("policy", "oracle", "K=8", "K=16", "K=32", "match-capped", "plain", "arctic", "ngram")
#: The fixed rules the policy is held against.
FIXED_RULES = ("K=8", "K=16", "K=32", "match-capped")
#: The peers: built outside the repository, absent where they do not import.
PEERS = ("arctic", "ngram")
#: The four shipped served runs (``saspec bench-vllm --served``) the "Drafting policy" table replays.
SHIPPED_RUNS = ("served-0.5b-code", "served-0.5b-mixed-c8", "served-1.5b-code-c8", "served-1.5b-mixed")
#: K of saspec's drafts (and the oracle's, and match-capped's), as ``proposer_config()`` serves.
K = 32
#: The share of the stream replayed alone as the cold start.
COLD_SHARE = 0.25
#: Qwen2.5's chat template around one user message (its default system message included).
CHAT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
#: How many of a replay's first decode steps its ``ramp`` reports (tokens verified per step).
RAMP_STEPS = 8


def load_run(folder: Path, encode: Callable[[str], list[int]]) -> list[Request]:
    """A served run's requests: each prompt in its chat template and plain decoding's output (ending in
    ``<|im_end|>``), tokenized by ``encode``.

    Raises:
        FileNotFoundError: no ``dataset.jsonl`` or no plain run in ``folder``.
    """
    folder = Path(folder)
    plain = sorted(glob.glob(str(folder / "runs" / "*plain-r0-c*.json")))
    if not plain:
        raise FileNotFoundError(f"no plain run (runs/*plain-r0-c*.json) in {folder}")
    prompts = [json.loads(line)["prompt"] for line in (folder / "dataset.jsonl").read_text().splitlines()]
    texts = json.loads(Path(plain[0]).read_text())["generated_texts"]
    return [(encode(CHAT.format(p)), encode(t + "<|im_end|>")) for p, t in zip(prompts, texts)]


def load_kinds(folder: Path) -> list[str]:
    """Each request's kind in a served run (``dataset.jsonl``'s ``kind``: ``code-edit``, ``free-form``, ...;
    ``""`` where a line has none), in :func:`load_run`'s order.

    Raises:
        FileNotFoundError: no ``dataset.jsonl`` in ``folder``.
    """
    lines = (Path(folder) / "dataset.jsonl").read_text().splitlines()
    return [str(json.loads(line).get("kind", "")) for line in lines]


def repeat_stream(n: int, repeat: int, seed: int = 0, shuffle: bool = True) -> list[int]:
    """The order a stream of ``repeat`` rounds serves ``n`` requests in: each round every request once, in
    its own shuffled order (seeded: the same ``seed`` gives the same stream), or without ``shuffle`` in the
    run's own order.

    Raises:
        ValueError: ``n`` or ``repeat`` below 1.
    """
    if n < 1 or repeat < 1:
        raise ValueError(f"a stream needs at least one request and one round, got {n} requests, {repeat} rounds")
    rng = np.random.default_rng(seed)
    return [int(i) for _ in range(repeat) for i in (rng.permutation(n) if shuffle else range(n))]


def cold_part(stream: Sequence[Any], share: float = COLD_SHARE) -> list[Any]:
    """The stream's first ``share`` (at least one request): the cold start."""
    return list(stream[: max(1, math.floor(len(stream) * share))])


def make_drafter(name: str, *, clock: Callable[[], float], concurrency: int, max_len: int, prior: str,
                 outputs: dict[Hashable, np.ndarray], peer_k: int = K) -> Any:
    """A fresh drafter of :data:`DRAFTERS` (see the module doc), ``prior`` the policy's cost shape (``"cpu"`` /
    ``"gpu"``).

    Raises:
        ValueError: an unknown drafter name.
        ImportError: a peer that does not import here.
    """
    if name == "plain":
        return PlainDrafter()
    if name == "arctic":
        return ArcticDrafter(peer_k, max_len)
    if name == "ngram":
        return NgramDrafter(peer_k, concurrency, max_len)
    saspec = lambda k, **kw: SaspecDrafter(k, concurrency, max_len, clock, **kw)  # noqa: E731
    if name == "policy":
        from saspec.policy import PolicySettings, cpu_like, gpu_like

        shape = cpu_like if prior == "cpu" else gpu_like
        return saspec(K, length_rule="policy", policy_settings=PolicySettings(cost_shape=shape))
    if name == "oracle":
        return saspec(K, length_rule="fixed", outputs=outputs, min_match=1)  # every offer the policy weighs
    if name == "match-capped":
        return saspec(K, length_rule="per-match", length_scale=1.0)
    if name.startswith("K=") and name[2:].isdigit() and int(name[2:]) >= 1:
        return saspec(int(name[2:]), length_rule="fixed")
    raise ValueError(f"unknown drafter {name!r}; known: {', '.join(DRAFTERS)} (or K=<n>)")


def replay(requests: Sequence[Request], concurrency: int, cost: Callable[[int], float],
           make: Callable[..., Any], *, k: int = K, kinds: Sequence[str] | None = None) -> dict[str, Any]:
    """Serve ``requests`` in order, ``concurrency`` at a time, request ``i`` of the sequence under id ``i``, with
    the drafter ``make(clock=, concurrency=, max_len=, outputs=)`` builds; a step over ``n`` tokens costs
    ``cost(n)`` seconds. ``kinds``: each request's kind (:func:`load_kinds`), or None.

    Returns:
        ``seconds`` (modeled), ``tok_s`` (output tokens per second), ``tokens`` (output tokens), ``steps``,
        ``drafted``, ``accepted`` and ``wasted`` (draft tokens verified in vain), ``rows`` (row-steps decoding),
        ``ramp`` (draft tokens verified in each of the first :data:`RAMP_STEPS` steps after the first
        prefill, all rows together) and, where ``kinds`` is given, ``rows_by_kind``: the decoding row-steps a
        request of each kind took, on average (a served run's steps per request: its inter-token latencies).

    Raises:
        ValueError: ``concurrency`` below 1, no requests, or ``kinds`` of another length.
    """
    if concurrency < 1 or not requests:
        raise ValueError(f"a replay needs concurrency >= 1 and requests, got {concurrency} and {len(requests)}")
    if kinds is not None and len(kinds) != len(requests):
        raise ValueError(f"kinds must name each of the {len(requests)} requests, got {len(kinds)}")
    requests = [(np.asarray(p, np.int32), np.asarray(o, np.int32)) for p, o in requests]
    max_len = max(len(p) + len(o) for p, o in requests) + k + 1
    now = [0.0]
    drafter = make(clock=lambda: now[0], concurrency=concurrency, max_len=max_len,
                   outputs={i: o for i, (_, o) in enumerate(requests)})
    waiting, rows = list(range(len(requests))), []  # rows: [request, tokens emitted, draft]
    ids = np.zeros((concurrency, max_len), np.int32)
    n_ids = np.zeros(concurrency, np.int32)
    n_prompt = np.zeros(concurrency, np.int32)
    steps = drafted = accepted = row_steps = 0
    ramp: list[int] = []
    own_steps = [0] * len(requests)  # each request's decoding row-steps
    while waiting or rows:
        admitted = []
        while waiting and len(rows) < concurrency:
            r = waiting.pop(0)
            rows.append([r, 0, None])
            admitted.append((r, requests[r][0], len(requests[r][1])))
        drafter.schedule(admitted, [])
        tokens, sampled, step_drafted = 0, [], 0
        for row in rows:
            prompt, out = requests[row[0]]
            if row[2] is None:  # the prefill step: the prompt, and the output's first token
                tokens += len(prompt)
                row[1], row[2] = 1, []
                sampled.append(out[:1].tolist())
                continue
            a = accepted_prefix(row[2], out, row[1])
            tokens += 1 + len(row[2])
            step_drafted += len(row[2])
            accepted += a
            row_steps += 1
            own_steps[row[0]] += 1
            sampled.append(out[row[1]: row[1] + a + 1].tolist())
            row[1] += a + 1
        drafted += step_drafted
        if steps and len(ramp) < RAMP_STEPS:
            ramp.append(step_drafted)
        now[0] += cost(tokens)
        steps += 1
        alive = [row[1] < len(requests[row[0]][1]) for row in rows]
        done = [row[0] for row, live in zip(rows, alive) if not live]
        sampled = [s for s, live in zip(sampled, alive) if live]
        rows = [row for row, live in zip(rows, alive) if live]
        if done:
            drafter.schedule([], done)
        if not rows:
            continue
        for b, row in enumerate(rows):
            prompt, out = requests[row[0]]
            ids[b, : len(prompt)] = prompt
            ids[b, len(prompt): len(prompt) + row[1]] = out[: row[1]]
            n_ids[b] = len(prompt) + row[1]
            n_prompt[b] = len(prompt)
        batch = Batch([row[0] for row in rows], ids[: len(rows)], n_ids[: len(rows)], n_prompt[: len(rows)])
        for row, draft in zip(rows, drafter.propose(batch, sampled, tokens)):
            row[2] = [int(t) for t in draft]
    total = sum(len(o) for _, o in requests)
    out = {"seconds": now[0], "tok_s": total / now[0], "tokens": total, "steps": steps, "drafted": drafted,
           "accepted": accepted, "wasted": drafted - accepted, "rows": row_steps, "ramp": ramp}
    if kinds is not None:
        out["rows_by_kind"] = {kind: float(np.mean([n for n, kd in zip(own_steps, kinds) if kd == kind]))
                               for kind in sorted(set(kinds))}
    return out


def simulate(requests: Sequence[Request], concurrency: int, *, k: int = K, fixed: float = 0.2,
             per_token: float = 0.0101, **proposer_args: Any) -> dict[str, Any]:
    """:func:`replay` with an ``SAProposer(**proposer_args)`` of K = ``k`` under the linear model
    ``fixed + per_token * n`` seconds a step (see :func:`replay` for what it returns)."""
    def make(clock: Callable[[], float], concurrency: int, max_len: int, outputs: Any) -> SaspecDrafter:
        return SaspecDrafter(k, concurrency, max_len, clock, **proposer_args)

    return replay(requests, concurrency, Curve.linear(fixed, per_token), make, k=k)


def compare(requests: Sequence[Request], concurrency: int, curve: Curve, drafters: Sequence[str], *,
            repeat: int = 1, seed: int = 0, peer_k: int = K, shuffle: bool = True,
            kinds: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every drafter of ``drafters`` over the stream of ``repeat`` rounds of ``requests`` (shuffled unless
    not ``shuffle``: :func:`repeat_stream`) under ``curve``, and over its cold start (:func:`cold_part`) alone;
    ``kinds``: each request's kind (each replay then counts its row-steps by kind), or None.

    Returns:
        Per drafter ``{"stream": replay result, "cold": replay result}``, or ``{"absent": reason}`` for a peer
        that does not import.
    """
    order = repeat_stream(len(requests), repeat, seed, shuffle)
    stream = [requests[i] for i in order]
    cold = cold_part(stream)
    stream_kinds = [kinds[i] for i in order] if kinds is not None else None
    cold_kinds = cold_part(stream_kinds) if stream_kinds is not None else None
    have = peers_available()
    out: dict[str, dict[str, Any]] = {}
    for name in drafters:
        if name in PEERS and not have[name]:
            out[name] = {"absent": f"{'arctic_inference' if name == 'arctic' else 'vllm'} does not import"}
            continue

        def make(name: str = name, **kw: Any) -> Any:
            return make_drafter(name, prior=curve.prior, peer_k=peer_k, **kw)

        out[name] = {"stream": replay(stream, concurrency, curve, make, kinds=stream_kinds),
                     "cold": replay(cold, concurrency, curve, make, kinds=cold_kinds)}
    return out


def _tok_s(res: dict[str, Any], name: str, part: str = "stream") -> float | None:
    cell = res.get(name, {})
    return cell[part]["tok_s"] if part in cell else None


def ratios(res: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The policy's ratios in one :func:`compare` result: ``oracle`` (policy / oracle length), ``best_fixed``
    (policy / the best of :data:`FIXED_RULES`), ``arctic`` (policy / Arctic) and ``cold_match_capped`` (the
    cold start's policy / match-capped); None where a drafter is missing."""
    p = _tok_s(res, "policy")
    fixed = [v for v in (_tok_s(res, r) for r in FIXED_RULES) if v is not None]

    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {"oracle": over(p, _tok_s(res, "oracle")), "best_fixed": over(p, max(fixed) if fixed else None),
            "arctic": over(p, _tok_s(res, "arctic")),
            "cold_match_capped": over(_tok_s(res, "policy", "cold"), _tok_s(res, "match-capped", "cold"))}


def table(results: dict[str, dict[str, dict[int, dict[str, dict[str, Any]]]]], drafters: Sequence[str]) -> str:
    """A markdown table: per run (``results[regime][run][concurrency]``, :func:`compare`'s results) and regime,
    output tok/s of each drafter over the stream and then the policy's ratios (:func:`ratios`), each cell
    its values at the concurrencies in order (``a / b / c``)."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    keys = ("oracle", "best_fixed", "arctic", "cold_match_capped")
    head = (["run", "regime"] + list(drafters)
            + ["policy / oracle", "policy / best fixed", "policy / arctic", "cold: policy / match-capped"])
    concurrencies = sorted({c for by_run in results.values() for by_c in by_run.values() for c in by_c})
    lines = ["Output tok/s at concurrency " + " / ".join(map(str, concurrencies))
             + " (absent: a peer that does not import here):", "",
             "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    runs = list(dict.fromkeys(run for by_run in results.values() for run in by_run))
    for run in runs:
        for regime, by_run in results.items():
            if run not in by_run:
                continue
            cells = []
            for d in drafters:
                vals = [by_run[run][c].get(d, {}) for c in sorted(by_run[run])]
                if any("absent" in v for v in vals):
                    cells.append("absent")
                    continue
                tok = [v["stream"]["tok_s"] for v in vals]
                cells.append(" / ".join(num(t, ".0f" if t >= 100 else ".1f") for t in tok))
            rs = [ratios(by_run[run][c]) for c in sorted(by_run[run])]
            cells += [" / ".join(num(r[key], ".3f") for r in rs) for key in keys]
            lines.append(f"| {run} | {regime} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kind_table(results: dict[str, dict[str, dict[int, dict[str, dict[str, Any]]]]], drafters: Sequence[str]) -> str:
    """A markdown table of the decoding row-steps a request of each kind took (``rows_by_kind`` of each
    stream), per run, regime and concurrency: each cell the kinds' values in the order of the header."""
    kinds = sorted({kind for by_run in results.values() for by_c in by_run.values() for res in by_c.values()
                    for cell in res.values() for kind in cell.get("stream", {}).get("rows_by_kind", {})})
    head = ["run", "regime", "concurrency"] + list(drafters)
    lines = ["Decoding steps per request, " + " / ".join(kinds) + ":", "",
             "| " + " | ".join(head) + " |", "|---|---|---:|" + "---:|" * len(drafters)]
    for regime, by_run in results.items():
        for run, by_c in by_run.items():
            for c in sorted(by_c):
                cells = []
                for d in drafters:
                    by_kind = by_c[c].get(d, {}).get("stream", {}).get("rows_by_kind")
                    cells.append("-" if by_kind is None else
                                 " / ".join("-" if k not in by_kind else f"{by_kind[k]:.1f}" for k in kinds))
                lines.append(f"| {run} | {regime} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    import argparse

    from .tokenizers import get_tokenizer

    ap = argparse.ArgumentParser(description="served runs replayed: the drafting policy against its bound, the "
                                             "fixed rules and the peers, under modeled step-cost curves")
    ap.add_argument("runs", nargs="+", type=Path, help="folders of `saspec bench-vllm --served` runs")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--regimes", nargs="*", default=["cpu", "gpu"], choices=sorted(CURVES),
                    help="the shipped curves to replay under")
    ap.add_argument("--curve", nargs="*", type=Path, default=[], help="curve files (JSON or CSV) to replay under too")
    ap.add_argument("--curve-prior", choices=["cpu", "gpu"], default=None,
                    help="the policy's prior shape under the --curve files (default: each file's own, else gpu)")
    ap.add_argument("--fixed", type=float, default=None, help="the CPU model's fixed seconds a step")
    ap.add_argument("--per-token", type=float, default=None, help="the CPU model's seconds a token")
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS))
    ap.add_argument("--repeat", type=int, default=4, help="rounds of the run's requests, each shuffled")
    ap.add_argument("--seed", type=int, default=0, help="the shuffles' seed")
    ap.add_argument("--in-order", action="store_true", help="each round in the run's own order (no shuffle)")
    ap.add_argument("--peer-k", type=int, default=K, help="K of the peers (Arctic, n-gram)")
    ap.add_argument("--json", type=Path, default=None, help="write every replay's counters here")
    ap.add_argument("--by-kind", action="store_true",
                    help="also a table of the decoding steps a request of each kind took (dataset.jsonl's kind)")
    a = ap.parse_args()
    curves = []
    for name in a.regimes:
        curve = CURVES[name]
        if name == "cpu" and (a.fixed is not None or a.per_token is not None):
            base = curve.points()
            fixed = a.fixed if a.fixed is not None else 2 * base[0][1] - base[1][1]
            per_token = a.per_token if a.per_token is not None else base[1][1] - base[0][1]
            curve = Curve.linear(fixed, per_token, name="cpu", prior="cpu", source="--fixed / --per-token")
        curves.append(curve)
    curves += [load_curve(p, prior=a.curve_prior) for p in a.curve]
    have = peers_available()
    print("peers: " + ", ".join(f"{p} {'present' if have[p] else 'absent'}" for p in PEERS), flush=True)
    encode = get_tokenizer("qwen2.5").encode
    runs = {folder.name: load_run(folder, encode) for folder in a.runs}
    kinds = {folder.name: load_kinds(folder) for folder in a.runs}
    everything: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    for curve in curves:
        results: dict[str, dict[int, Any]] = {}
        for run, requests in runs.items():
            results[run] = {}
            for c in a.concurrency:
                results[run][c] = compare(requests, c, curve, a.drafters, repeat=a.repeat, seed=a.seed,
                                          peer_k=a.peer_k, shuffle=not a.in_order, kinds=kinds[run])
        print(f"[{curve.name} done]", flush=True)
        tables[curve.name] = results
        everything[curve.name] = {"curve": curve.points(), "prior": curve.prior, "source": curve.source,
                                  "results": results}
    print("\n" + "Regimes: " + "; ".join(f"{c.name}: {c.source}, the policy's prior {c.prior}" for c in curves)
          + "\n\n" + table(tables, a.drafters), flush=True)
    if a.by_kind:
        print("\n" + kind_table(tables, a.drafters), flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps({"repeat": a.repeat, "seed": a.seed, "in_order": a.in_order, "peer_k": a.peer_k,
                                      "regimes": everything}) + "\n")


if __name__ == "__main__":
    main()
