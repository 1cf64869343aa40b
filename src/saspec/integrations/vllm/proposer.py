"""SAProposer: suffix-automaton drafts as vLLM's ``custom_class`` drafter.

::

    from vllm import LLM
    from saspec.integrations.vllm import proposer_config
    llm = LLM(model, speculative_config=proposer_config())   # K = 32, the drafting policy

vLLM builds ``SAProposer(vllm_config)`` in each worker, calls ``load_model(model)``
once, and after every step calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, ...)`` with the worker's persistent input batch: row ``b`` of the
arrays is the request in batch row ``b``, ``token_ids_cpu[b, :num_tokens_no_spec[b]]``
is its whole text (prompt and output, this step's sampled tokens included), and
``sampled_token_ids[b]`` are the tokens this step added (the accepted drafts and
one bonus token; empty for a row still in prefill). Every draft is verified by
the target model, so a draft only ever costs acceptance, never correctness.

The proposer is vLLM glue over :class:`saspec.drafter.Drafter`, which holds the
automata, the cross-request pool, the drafting policy (each row's draft length
for the most tokens per second of the step; vLLM's forward is timed from one
``propose`` return to the next call) and each request's options
(``SamplingParams.extra_args``: ``saspec.options.options_from_fields``).

Which request a row holds: with saspec's vLLM plugin (``plugin``; loaded by
vLLM whenever saspec is installed in its environment) the runner hands the
proposer its request ids, the scheduler's finished requests and its new ones,
whose automata are built while vLLM prefills them. Without the plugin, rows
are matched to requests by fingerprint (``fingerprint.FingerprintRows``), new
requests start building at the first prefill chunk the drafter sees (a row
that sampled nothing), and requests that leave their rows are kept for
``max_detached`` more departures before they are freed.

No draft runs past ``max_model_len`` (text plus draft, as vLLM's n-gram
drafter). vLLM builds the class itself and sets ``prompt_lookup_min`` to 0 for
custom classes, so inside vLLM the settings come from the environment, which
the spawned workers inherit (``config.resolve_proposer_settings``; see
:class:`SAProposer`).

``import saspec`` never imports this module, and this module never imports
vLLM: the constructor reads only ``vllm_config.speculative_config`` (and,
when present, ``model_config.max_model_len`` and
``scheduler_config.max_num_seqs``), so tests can pass a plain object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any, Callable

import numpy as np

from ... import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from ... import faults
from ...drafter import Drafter
from ...drafter import warm_up as warm_drafter
from ...policy import DraftPolicy, PolicySettings
from ...options import options_from_fields
from .config import DEFAULT_MIN_MATCH, resolve_proposer_settings, tensor_parallel_ranks
from .cpu_sampling import fix_sampled_verification
from .fingerprint import FingerprintRows

logger = logging.getLogger(__name__)
_I32 = np.dtype(np.int32)
_WARMED = False  # this process has run warm_up


@njit(nogil=True, cache=True)
def _gather(token_ids, num_tokens, lens, new, text_len):
    """new[b, :lens[b]] = the last ``lens[b]`` tokens of ``token_ids[b, :num_tokens[b]]``
    and ``text_len[b]`` the text before them; ``lens[b] = 0`` where they do not fit
    or one of them is negative (a placeholder)."""
    width = new.shape[1]
    for b in range(lens.shape[0]):
        s, n = lens[b], num_tokens[b]
        text_len[b] = n - s
        if s <= 0 or s > width or n > token_ids.shape[1] or n - s < 1:
            lens[b] = 0
            continue
        for j in range(s):
            t = token_ids[b, n - s + j]
            if t < 0:
                lens[b] = 0
                break
            new[b, j] = t


@njit(nogil=True, cache=True)
def _compact(tokens, lengths, flat, offsets):
    """``flat[offsets[b]:offsets[b + 1]] = tokens[b, :lengths[b]]`` for each row ``b`` (``flat`` holds at
    least ``tokens.size``, ``offsets`` B + 1 entries): one list conversion for the step. Returns how many
    rows draft."""
    width = tokens.shape[1]
    o = 0
    drafted = 0
    offsets[0] = 0
    for b in range(lengths.shape[0]):
        n = min(max(lengths[b], 0), width)
        for j in range(n):
            flat[o + j] = tokens[b, j]
        o += n
        offsets[b + 1] = o
        if n > 0:
            drafted += 1
    return drafted


class SAProposer:
    """Suffix-automaton drafter for vLLM's ``custom_class`` speculative method.

    Args:
        vllm_config: vLLM's ``VllmConfig`` or any object with
            ``speculative_config.num_speculative_tokens`` (K); optional:
            ``speculative_config.prompt_lookup_min`` (minimum match),
            ``model_config.max_model_len`` and ``scheduler_config.max_num_seqs``.
        min_match: draft only rows whose match is at least this many tokens.
            Default: ``$SASPEC_VLLM_MIN_MATCH``, else a nonzero
            ``prompt_lookup_min``, else 1 under the policy (it weighs every
            match) and :data:`DEFAULT_MIN_MATCH` under a fixed rule.
        length_rule: ``"policy"`` (default; ``$SASPEC_VLLM_LENGTH_RULE``):
            each row's draft length from ``saspec.policy.DraftPolicy``; or a
            fixed rule of ``saspec.rules.draft_lengths`` (``fixed`` drafts K,
            ``per-match`` ``ceil(length_scale * match)``, ...).
        length_scale: the fixed rules' tokens per matched token
            (``$SASPEC_VLLM_LENGTH_SCALE``, default 2).
        policy_settings: the policy's :class:`saspec.policy.PolicySettings`
            (default all defaults; the prior cost shape follows vLLM's device).
        log: called with each step's ``saspec.policy.Decision`` (None: logged to the ``saspec.policy``
            logger where ``$SASPEC_POLICY_LOG`` is set, else not).
        warm: run :func:`warm_up` with these settings (once per process) before serving.
        clock: the time source (seconds) the policy's step timings come from; a test or a
            simulation injects its own.
        fault_hook: a fault-injection test hook for the automata (``saspec.faults``), None, or
            (default) the one ``$SASPEC_FAULTS`` describes, the way into vLLM's workers.
        max_detached: without the plugin: how many requests that left their
            rows (finished, preempted or moved) are kept for a possible resume
            before the oldest is freed. Default: ``$SASPEC_VLLM_MAX_DETACHED``,
            else ``max_num_seqs`` (256 when unknown).
        occurrence: which earlier occurrence drafts copy from (``SpecEngine``'s ``occurrence``).
        pool_tokens: a cross-request pool of this many tokens (``saspec.request_drafts.RequestDrafts``);
            finished requests join it (without the plugin: when their detached
            automaton is freed); 0: none. Default: ``$SASPEC_VLLM_POOL_TOKENS`` (set by
            ``proposer_config(pool_tokens=...)``), else ``config.DEFAULT_POOL_TOKENS``.

    Raises:
        ValueError: K below 1, ``min_match`` or ``max_detached`` out of range,
            an unknown rule or a bad scale (also from the environment), or a bad
            policy setting.

    Attributes:
        drafter: the :class:`saspec.drafter.Drafter` this proposer drives.
        drafts: its ``RequestDrafts``, holding every tracked request's automaton.
        stats: counters: ``steps``, ``new`` (requests built), ``continued``,
            ``reclaimed`` (moved or resumed rows found by fingerprint),
            ``freed``, ``drafted`` (rows given a draft), ``draft_tokens``,
            ``by_id`` (steps whose rows vLLM named), ``build_failures`` (automata whose
            build failed: logged, drafting nothing until rebuilt), ``growth_failures`` (growths of an
            automaton that failed: logged, the request retried), ``option_errors`` (requests
            whose saspec options were refused: logged, never drafted for), ``disabled_rows``
            (row-steps of requests with drafting off), and the policy's counters
            prefixed ``policy_`` (``policy_automaton_rows``, ``policy_none_rows``,
            ``policy_timed``, ...; see ``DraftPolicy.stats``); ``drafts.stats["pool_rows"]``:
            rows whose draft came from the pool.
    """

    def __init__(
        self,
        vllm_config: Any,
        *,
        min_match: int | None = None,
        max_detached: int | None = None,
        occurrence: str | None = None,
        length_rule: str | None = None,
        length_scale: float | None = None,
        pool_tokens: int | None = None,
        policy_settings: PolicySettings | None = None,
        log: Any = None,
        warm: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        fault_hook: Any = faults.FAULTS_ENV,
    ) -> None:
        cfg = resolve_proposer_settings(vllm_config, min_match=min_match, max_detached=max_detached,
                                        length_rule=length_rule, length_scale=length_scale, pool_tokens=pool_tokens)
        self.settings = cfg
        self.k, self.max_detached = cfg.k, cfg.max_detached
        self.length_rule, self.length_scale, self.max_model_len = cfg.length_rule, cfg.length_scale, cfg.max_model_len
        self.drafter = Drafter(cfg.k, device=cfg.device, length_rule=cfg.length_rule, length_scale=cfg.length_scale,
                               min_match=cfg.min_match, occurrence=occurrence, pool_tokens=cfg.pool_tokens,
                               ranks=tensor_parallel_ranks(vllm_config), max_rows=cfg.max_rows,
                               policy_settings=policy_settings, log=log, clock=clock,
                               faults=faults.from_env() if fault_hook == faults.FAULTS_ENV else fault_hook)
        self.min_match = self.drafter.drafts.min_match  # unset: the Drafter's default for the rule
        self.policy: DraftPolicy | None = self.drafter.policy
        self.drafts = self.drafter.drafts
        self._rows = FingerprintRows(self.max_detached, self._forget)
        self._ids: list[Hashable] | None = None  # the next step's request ids, from the plugin
        self._step_tokens = 0  # the tokens the forward before the next propose processed, from the plugin
        self._new = np.zeros((0, self.k + 1), np.int32)  # this step's new tokens per row
        self._checked: list[Hashable] | None = None  # the last step's rows, each started in the drafter
        self._flat = np.zeros(0, np.int32)  # the step's drafts one after another (see _compact)
        self._offsets = np.zeros(1, np.int64)  # and where each row's starts
        self._text_len = np.zeros(0, np.int32)  # and each row's text length before them
        self._stats = {"steps": 0, "drafted": 0, "draft_tokens": 0, "by_id": 0, "option_errors": 0}
        fix_sampled_verification()  # point proposals need exact sampled verification, with or without the plugin
        if warm:
            warm_up(vllm_config, min_match=min_match, occurrence=occurrence, length_rule=length_rule,
                    length_scale=length_scale, pool_tokens=pool_tokens, policy_settings=policy_settings)

    # -- what the plugin calls ------------------------------------------------------

    def schedule(self, new_requests: Sequence[tuple], finished: Sequence[Hashable],
                 resumed: Sequence[Hashable] = ()) -> None:
        """The scheduler's news before a step's forward (from the plugin): each
        ``(request id, prompt ids, max new tokens[, sampling extra_args])`` in ``new_requests``
        starts building while vLLM prefills it, with its saspec options (``start_requests``);
        ``finished`` ids are freed. ``resumed`` (back from preemption) changes nothing here: an
        automaton, unlike a draft model's KV cache, survives a preemption."""
        for rid in finished:
            self._forget(rid)
        self._stats["option_errors"] += start_requests(self.drafter, new_requests)

    def _forget(self, rid: Hashable) -> None:
        self.drafter.finish(rid)
        self._checked = None  # the next step looks its rows up again

    def name_rows(self, req_ids: Sequence[Hashable], step_tokens: int = 0) -> None:
        """The request id of each row for the next ``propose``, and the tokens the forward before it
        processed (prefill chunks included; 0: unknown), from the plugin."""
        self._ids = list(req_ids)
        self._step_tokens = int(step_tokens)

    # -- what vLLM calls --------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the drafter has no weights."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        *args: Any,
        **kwargs: Any,
    ) -> list[list[int]]:
        """Drafts for this step's batch.

        Args:
            sampled_token_ids: per batch row, the tokens this step added
                (accepted drafts plus one bonus token); empty for rows in prefill.
                ``B = len(sampled_token_ids)`` rows are live.
            num_tokens_no_spec: int32 [>= B]: each row's text length, this
                step's tokens included.
            token_ids_cpu: int32 [>= B, max_model_len]: each row's text in
                ``[:num_tokens_no_spec[b]]``; read in place, never written.
            *args, **kwargs: further arguments of the runner (slot mappings
                etc.), unused.

        Returns:
            B lists of draft tokens (at most K each; empty where the row has no
            confident match).

        Raises:
            ValueError: ``token_ids_cpu`` is not 2-D, or it or
                ``num_tokens_no_spec`` has fewer than B rows.
        """
        ids, self._ids = self._ids, None
        b_live = len(sampled_token_ids)
        self._stats["steps"] += 1
        if b_live == 0:
            self.drafter.idle()
            return []
        token_ids = _int32_2d(token_ids_cpu, "token_ids_cpu")
        num_tokens = num_tokens_no_spec
        if not isinstance(num_tokens, np.ndarray) or num_tokens.dtype != np.int32:
            num_tokens = np.asarray(num_tokens, dtype=np.int32)
        if token_ids.shape[0] < b_live or num_tokens.shape[0] < b_live or (ids is not None and len(ids) < b_live):
            raise ValueError(
                f"{b_live} rows sampled but token_ids_cpu has {token_ids.shape[0]} rows and "
                f"num_tokens_no_spec {num_tokens.shape[0]}"
            )
        lens = np.fromiter(map(len, sampled_token_ids), np.int32, b_live)
        if self._new.shape[0] < b_live:
            self._new = np.zeros((max(b_live, 2 * self._new.shape[0]), self.k + 1), np.int32)
            self._text_len = np.zeros(self._new.shape[0], np.int32)
        new, text_len = self._new[:b_live], self._text_len[:b_live]
        if ids is not None:
            rids = ids[:b_live]
            self._stats["by_id"] += 1
        else:
            rids = self._rows.assign(token_ids, num_tokens, lens)
            for rid, b, n in self._rows.started:  # prefill chunks: build while vLLM prefills
                if rid not in self.drafter:
                    self.drafter.start(rid, token_ids[b, :n])
        if rids != self._checked:  # new rows (else each was started and none finished since)
            for rid in rids:  # a request the plugin did not announce: built from its row in the step
                if rid not in self.drafter:
                    self.drafter.start(rid, None)
            self._checked = list(rids)
        _gather(token_ids, num_tokens, lens, new, text_len)
        width = token_ids.shape[1] if self.max_model_len is None else min(self.max_model_len, token_ids.shape[1])
        step_tokens, self._step_tokens = self._step_tokens, 0
        batch = self.drafter.step(rids, new, lens, text_len=text_len, texts=token_ids, width=width,
                                  step_tokens=step_tokens)
        if b_live == 1:
            n = int(batch.lengths[0])
            if not n:
                return [[]]
            self._stats["drafted"] += 1
            self._stats["draft_tokens"] += n
            return [batch.tokens[0, :n].tolist()]
        if self._offsets.shape[0] <= b_live or self._flat.shape[0] < batch.tokens.size:
            self._flat, self._offsets = np.zeros(batch.tokens.size, np.int32), np.zeros(b_live + 1, np.int64)
        drafted = _compact(batch.tokens, batch.lengths, self._flat, self._offsets)
        if not drafted:
            return [[] for _ in range(b_live)]
        offsets = self._offsets[: b_live + 1].tolist()
        flat = self._flat[: offsets[-1]].tolist()
        self._stats["drafted"] += drafted
        self._stats["draft_tokens"] += len(flat)
        return [flat[a:e] for a, e in zip(offsets, offsets[1:])]

    # -- inspection -----------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counters (see the class docstring)."""
        d, r = self.drafts.stats, self._rows.stats
        return {**self._stats, "new": d["built"] + d["built_ahead"] - d["rebuilt"], "continued": r["continued"],
                "reclaimed": r["reclaimed"], "freed": r["freed"] + d["finished"], "rebuilt": d["rebuilt"],
                "built_ahead": d["built_ahead"], "waited": d["waited"], "build_failures": d["build_failures"],
                **{k: v for k, v in self.drafter.stats().items()
                   if k in ("disabled_rows", "longest_draft", "growth_failures") or k.startswith("policy_")}}

    @property
    def tracked(self) -> int:
        """Requests holding an automaton (built or being built)."""
        return len(self.drafts)

    @property
    def pooled(self) -> int:
        """Without the plugin: requests that left their rows and are kept for a possible resume."""
        return self._rows.pooled


def start_requests(drafter: Drafter, new_requests: Sequence[tuple]) -> int:
    """Start each ``(request id, prompt ids, max new tokens[, sampling extra_args])`` not started yet,
    with the saspec options of its ``extra_args`` (``saspec.options.options_from_fields``). A request
    whose options are bad (vLLM's front end refuses them first; these got past it) is logged and never
    drafted for, and the step goes on for every other one. Returns how many were refused so."""
    refused = 0
    for rid, prompt, max_new, *extra in new_requests:
        if rid in drafter:
            continue
        try:
            drafter.start(rid, prompt, options_from_fields(extra[0] if extra else None), max_new)
        except (TypeError, ValueError) as e:
            refused += 1
            logger.error("saspec: request %r: %s; it gets no drafts", rid, e)
            drafter.start(rid, prompt, {"enabled": False}, max_new)
    return refused


def _int32_2d(x: Any, name: str) -> np.ndarray:
    """``x`` as a C-contiguous int32 2-D numpy array, without a copy when it already is one
    (numpy array or CPU torch tensor)."""
    if type(x) is np.ndarray and x.dtype is _I32 and x.ndim == 2 and x.flags.c_contiguous:
        return x
    if not isinstance(x, np.ndarray) and hasattr(x, "numpy"):
        x = x.numpy()
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    if a.dtype != np.int32 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=np.int32)
    return a


def warm_up(vllm_config: Any, **settings: Any) -> None:
    """Compile every kernel a serving step uses while the engine starts, once per process: a throwaway
    :class:`SAProposer` with these settings runs a step without the plugin (its gather, its lists), then its
    drafter runs ``saspec.drafter.warm_up``. A failure is logged, never raised: serving works without."""
    global _WARMED
    if _WARMED:
        return
    _WARMED = True
    t0 = time.perf_counter()
    p = None
    try:
        p = SAProposer(vllm_config, warm=False, fault_hook=None, **settings)
        texts = np.array([[1, 2, 1, 2], [5, 6, 5, 6]], np.int32)  # two rows: the many-row list conversion too
        p.propose([[2], [6]], np.array([4, 4], np.int32), texts)
        warm_drafter(p.drafter)
        logger.info("saspec: kernels ready in %.1f s", time.perf_counter() - t0)
    except Exception:  # noqa: BLE001  (a warm-up must never stop a server from starting)
        logger.warning("saspec: warming up the kernels failed; they compile at first use", exc_info=True)
    finally:
        if p is not None:
            p.drafter.close()
