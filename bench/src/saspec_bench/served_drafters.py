"""The drafters the served replay compares, each driven the way vLLM's runner drives it.

Every drafter sees the replay's batch as vLLM's proposers see the worker's persistent input batch
(:class:`Batch`: ``token_ids_cpu``, ``num_tokens_no_spec``, ``num_prompt_tokens``, the request ids) and the
tokens each row sampled in the step just run, and returns each row's draft. The replay's news reach them
through :meth:`schedule` (requests admitted before a step, requests finished after it), as saspec's vLLM
plugin hands them to ``SAProposer``; the peers ignore it, as vLLM does for them.

* :class:`SaspecDrafter`: the real ``saspec.integrations.vllm.SAProposer`` on the replay's clock: the policy,
  or a fixed length rule; with ``outputs``, the *oracle length*: each row's draft cut to exactly the tokens that
  will be accepted;
* :class:`PlainDrafter`: no drafts (plain decoding);
* :class:`ArcticDrafter`: ArcticInference's ``SuffixDecodingCache`` driven as vLLM's ``suffix`` method drives it
  (``vllm/v1/spec_decode/suffix_decoding.py``) with its defaults (:data:`SUFFIX_DEFAULTS`); needs
  ``arctic_inference`` built outside the repository (BENCHMARKS.md, "vLLM");
* :class:`NgramDrafter`: vLLM's ``NgramProposer`` (its numba kernel), ``prompt_lookup_min`` 2, max 5; needs vLLM.
"""

from __future__ import annotations

import importlib.util
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from .pool_sim import accepted_prefix

#: vLLM's defaults for its ``suffix`` method (``SpeculativeConfig.suffix_decoding_*``).
SUFFIX_DEFAULTS = {"max_tree_depth": 24, "max_spec_factor": 1.0, "min_token_prob": 0.1,
                   "max_cached_requests": 10_000}
#: vLLM's n-gram match lengths as the served benchmarks run them.
NGRAM_MIN, NGRAM_MAX = 2, 5


@dataclass
class Batch:
    """The replay's batch as vLLM's proposers see the persistent input batch: row ``b`` holds request
    ``req_ids[b]`` whose text is ``token_ids_cpu[b, :num_tokens_no_spec[b]]`` (int32), its prompt the first
    ``num_prompt_tokens[b]`` of them."""

    req_ids: list[Hashable]
    token_ids_cpu: np.ndarray
    num_tokens_no_spec: np.ndarray
    num_prompt_tokens: np.ndarray
    req_id_to_index: dict[Hashable, int] = field(init=False)

    def __post_init__(self) -> None:
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}


def vllm_config(k: int, concurrency: int, max_len: int) -> Any:
    """The parts of vLLM's config the proposers read (K, the n-gram lengths, ``max_model_len``, the batch)."""
    ns = types.SimpleNamespace
    return ns(speculative_config=ns(num_speculative_tokens=k, prompt_lookup_min=None, prompt_lookup_max=None),
              model_config=ns(max_model_len=max_len), scheduler_config=ns(max_num_seqs=concurrency),
              parallel_config=ns(tensor_parallel_size=1), device_config=None)


class SaspecDrafter:
    """``SAProposer`` as saspec's vLLM plugin drives it, on the replay's ``clock``.

    Args:
        k: K, the most draft tokens a row proposes.
        concurrency: the most rows a step holds.
        max_len: ``max_model_len``.
        clock: the replay's clock (seconds), the policy's time source.
        outputs: the oracle length: each request's output tokens (by request id); each draft is cut to the
            tokens greedy verification will accept.
        proposer_args: ``SAProposer``'s settings (``length_rule``, ``length_scale``, ``policy_settings``, ...).
    """

    def __init__(self, k: int, concurrency: int, max_len: int, clock: Callable[[], float], *,
                 outputs: dict[Hashable, np.ndarray] | None = None, **proposer_args: Any) -> None:
        from saspec.integrations.vllm import SAProposer

        self.proposer = SAProposer(vllm_config(k, concurrency, max_len), warm=False, clock=clock, **proposer_args)
        self.outputs = outputs

    def schedule(self, admitted: Sequence[tuple[Hashable, np.ndarray, int]], finished: Sequence[Hashable]) -> None:
        self.proposer.schedule(admitted, finished)
        pool = self.proposer.drafts.pool
        if finished and pool is not None:  # finished texts built in before the next step: deterministic
            pool.flush()

    def propose(self, batch: Batch, sampled: list[list[int]], step_tokens: int) -> list[list[int]]:
        self.proposer.name_rows(batch.req_ids, step_tokens)
        drafts = self.proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
        if self.outputs is None:
            return drafts
        out = []
        for b, draft in enumerate(drafts):
            q = int(batch.num_tokens_no_spec[b] - batch.num_prompt_tokens[b])
            out.append(list(draft[: accepted_prefix(draft, self.outputs[batch.req_ids[b]], q)]))
        return out


class PlainDrafter:
    """No drafts: plain decoding."""

    def schedule(self, admitted: Sequence[Any], finished: Sequence[Hashable]) -> None:
        pass

    def propose(self, batch: Batch, sampled: list[list[int]], step_tokens: int) -> list[list[int]]:
        return [[] for _ in sampled]


class ArcticDrafter:
    """ArcticInference's ``SuffixDecodingCache`` driven as vLLM's ``SuffixDecodingProposer.propose`` drives it:
    a request is started (its prompt's tree built) the first time its row is seen, each step's sampled tokens
    are appended to its response (and the global tree of responses), the pattern is the text's last
    ``max_tree_depth`` tokens, and requests no longer in the batch are stopped.

    Args:
        k: K (``num_speculative_tokens``).
        max_len: ``max_model_len``: no draft runs past it.
        settings: overrides of :data:`SUFFIX_DEFAULTS`.

    Raises:
        ImportError: ``arctic_inference`` does not import.
    """

    def __init__(self, k: int, max_len: int, **settings: Any) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        unknown = set(settings) - set(SUFFIX_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown suffix settings {sorted(unknown)}; known: {sorted(SUFFIX_DEFAULTS)}")
        self.settings = {**SUFFIX_DEFAULTS, **settings}
        self.k, self.max_len = k, max_len
        self.cache = SuffixDecodingCache(max_tree_depth=self.settings["max_tree_depth"],
                                         max_cached_requests=self.settings["max_cached_requests"])

    def schedule(self, admitted: Sequence[Any], finished: Sequence[Hashable]) -> None:
        pass  # vLLM hands the suffix proposer no news: it learns from the batch

    def propose(self, batch: Batch, sampled: list[list[int]], step_tokens: int) -> list[list[int]]:
        cache, depth = self.cache, self.settings["max_tree_depth"]
        drafts: list[list[int]] = []
        for i, sampled_ids in enumerate(sampled):
            if not sampled_ids:
                drafts.append([])
                continue
            rid = batch.req_ids[i]
            n = int(batch.num_tokens_no_spec[i])
            if n >= self.max_len:
                drafts.append([])
                continue
            if rid not in cache.active_requests:
                if rid in cache.cached_requests:
                    cache.evict_cached_response(rid)
                cache.start_request(rid, batch.token_ids_cpu[i, : batch.num_prompt_tokens[i]])
            cache.add_active_response(rid, sampled_ids)
            pattern = batch.token_ids_cpu[i, max(0, n - depth): n]
            draft = cache.speculate(rid, pattern, max_spec_tokens=min(self.k, self.max_len - n - 1),
                                    max_spec_factor=self.settings["max_spec_factor"],
                                    min_token_prob=self.settings["min_token_prob"])
            drafts.append(list(draft.token_ids))
        for rid in cache.active_requests - batch.req_id_to_index.keys():
            cache.stop_request(rid)
        return drafts


class NgramDrafter:
    """vLLM's ``NgramProposer`` (its numba kernel: the longest 2-5-gram that ends the text, matched at its
    earliest occurrence, and the K tokens after it).

    Raises:
        ImportError: vLLM does not import.
    """

    def __init__(self, k: int, concurrency: int, max_len: int) -> None:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        cfg = vllm_config(k, concurrency, max_len)
        cfg.speculative_config.prompt_lookup_min, cfg.speculative_config.prompt_lookup_max = NGRAM_MIN, NGRAM_MAX
        self.k = k
        self.proposer = NgramProposer(cfg)

    def schedule(self, admitted: Sequence[Any], finished: Sequence[Hashable]) -> None:
        pass

    def propose(self, batch: Batch, sampled: list[list[int]], step_tokens: int) -> list[list[int]]:
        return self.proposer.propose(self.k, sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)


def peers_available() -> dict[str, bool]:
    """Whether each peer's code is importable here: ``arctic`` (``arctic_inference``) and ``ngram`` (vLLM)."""
    return {"arctic": importlib.util.find_spec("arctic_inference") is not None,
            "ngram": importlib.util.find_spec("vllm") is not None}
