"""A served run replayed at concurrency through saspec's real vLLM proposer, under a modeled step cost.

``saspec bench-vllm --served`` measures the drafters in a real server, 15-30 minutes a run and a few percent
apart from one run to the next. This replays one of its runs in seconds, deterministically: the run's
prompts (``dataset.jsonl``) and plain decoding's outputs (``runs/*plain*.json``, identical for every drafter
at temperature 0) go through :class:`saspec.integrations.vllm.SAProposer` as vLLM's scheduler would feed it:
up to ``concurrency`` requests at once, each admitted in one prefill step when a row frees, every row's
drafts verified against its output (the accepted prefix plus the target's own token). The proposer's clock
is the simulation's, so its policy times the modeled steps. A step over ``n`` tokens (prefills, rows and
draft tokens) costs ``fixed + per_token * n`` seconds; the defaults are the 0.5B target's served steps on this
project's CPU as the policy timed them (BENCHMARKS.md, "Drafting policy").

What it leaves out: vLLM's own overheads, the request that warms the server, chunked prefills, and the
cross-request pool's effect across rounds. Compare policies here, confirm in a served run.

    python -m saspec_bench.served_sim benchmarks/vllm/served-0.5b-mixed-c8 --concurrency 1 4 8
"""

from __future__ import annotations

import glob
import json
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from saspec.integrations.vllm import SAProposer
from .pool_sim import accepted_prefix

Request = tuple[list[int], list[int]]  # (prompt ids, output ids)
#: The rules compared by default: the policy, and a draft as long as the match (vLLM suffix's length rule).
RULES = {"policy": {}, "per-match x1": {"length_rule": "per-match", "length_scale": 1.0}}
#: Qwen2.5's chat template around one user message (its default system message included).
CHAT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


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


def _config(k: int, concurrency: int, max_len: int) -> Any:
    """The parts of vLLM's config the proposer reads."""
    ns = types.SimpleNamespace
    return ns(speculative_config=ns(num_speculative_tokens=k, prompt_lookup_min=None),
              model_config=ns(max_model_len=max_len), scheduler_config=ns(max_num_seqs=concurrency),
              device_config=None)


def simulate(requests: Sequence[Request], concurrency: int, *, k: int = 32, fixed: float = 0.2,
             per_token: float = 0.0101, **proposer_args: Any) -> dict[str, Any]:
    """Serve ``requests`` in order, ``concurrency`` at a time, with an ``SAProposer(**proposer_args)``.

    Returns:
        ``seconds`` (modeled), ``tok_s`` (output tokens per second), ``steps``, ``drafted``, ``accepted``
        and ``wasted`` (draft tokens verified in vain).
    """
    requests = [(np.asarray(p, np.int32), np.asarray(o, np.int32)) for p, o in requests]
    max_len = max(len(p) + len(o) for p, o in requests) + k + 1
    now = [0.0]
    prop = SAProposer(_config(k, concurrency, max_len), warm=False, clock=lambda: now[0], **proposer_args)
    waiting, rows = list(range(len(requests))), []  # rows: [request, tokens emitted, draft]
    ids = np.zeros((concurrency, max_len), np.int32)
    n_ids = np.zeros(concurrency, np.int32)
    steps = drafted = accepted = 0
    while waiting or rows:
        admitted = []
        while waiting and len(rows) < concurrency:
            r = waiting.pop(0)
            rows.append([r, 0, None])
            admitted.append((r, requests[r][0], len(requests[r][1])))
        prop.schedule(admitted, [])
        tokens, sampled = 0, []
        for row in rows:
            prompt, out = requests[row[0]]
            if row[2] is None:  # the prefill step: the prompt, and the output's first token
                tokens += len(prompt)
                row[1], row[2] = 1, []
                sampled.append(out[:1].tolist())
                continue
            a = accepted_prefix(row[2], out, row[1])
            tokens += 1 + len(row[2])
            drafted += len(row[2])
            accepted += a
            sampled.append(out[row[1]: row[1] + a + 1].tolist())
            row[1] += a + 1
        now[0] += fixed + per_token * tokens
        steps += 1
        alive = [row[1] < len(requests[row[0]][1]) for row in rows]
        done = [row[0] for row, live in zip(rows, alive) if not live]
        sampled = [s for s, live in zip(sampled, alive) if live]
        rows = [row for row, live in zip(rows, alive) if live]
        if done:
            prop.schedule([], done)
            if prop.drafts.pool is not None:  # the finished texts built in before the next step: deterministic
                prop.drafts.pool.flush()
        if not rows:
            continue
        for b, row in enumerate(rows):
            prompt, out = requests[row[0]]
            ids[b, : len(prompt)] = prompt
            ids[b, len(prompt): len(prompt) + row[1]] = out[: row[1]]
            n_ids[b] = len(prompt) + row[1]
        prop.name_rows([row[0] for row in rows], tokens)
        for row, draft in zip(rows, prop.propose(sampled, n_ids[: len(rows)], ids[: len(rows)])):
            row[2] = list(draft)
    total = sum(len(o) for _, o in requests)
    return {"seconds": now[0], "tok_s": total / now[0], "steps": steps, "drafted": drafted, "accepted": accepted,
            "wasted": drafted - accepted}


def main() -> None:
    import argparse

    from .tokenizers import get_tokenizer

    ap = argparse.ArgumentParser(description="a served run replayed through saspec's vLLM proposer")
    ap.add_argument("runs", nargs="+", type=Path, help="folders of `saspec bench-vllm --served` runs")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--fixed", type=float, default=0.2, help="a step's fixed seconds")
    ap.add_argument("--per-token", type=float, default=0.0101, help="seconds per token a step processes")
    a = ap.parse_args()
    encode = get_tokenizer("qwen2.5").encode
    print("| run | concurrency | " + " | ".join(f"{r}: tok/s / in vain" for r in RULES) + " |")
    print("|---|---:|" + "---:|" * len(RULES))
    for folder in a.runs:
        requests = load_run(folder, encode)
        for c in a.concurrency:
            res = [simulate(requests, c, fixed=a.fixed, per_token=a.per_token, **kw) for kw in RULES.values()]
            print(f"| {folder.name} | {c} | " + " | ".join(f"{r['tok_s']:.2f} / {r['wasted']}" for r in res) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
