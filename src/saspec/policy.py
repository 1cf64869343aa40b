"""Policy: each step, every row's draft length and source for the most tokens per second of the whole step.

A speculative step verifies, for each of its ``B`` rows, the row's own token
plus ``d_b`` draft tokens, in one target forward over ``n = B + sum(d_b)``
tokens that costs ``C(n)`` seconds. If draft token ``i`` of row ``b`` is
accepted with probability ``P[b, i]`` (all tokens before it accepted too, so
``P`` falls along a row), the step emits ``B + sum of the P it verifies``
tokens on average. :class:`DraftPolicy` chooses the drafts that maximise

    expected tokens / (C(n) + the neural drafter's seconds, where it runs)

by marginal gain: every candidate draft token of every row is ranked by its
``P``; the verified set is the ``P >= threshold`` prefix of each row, with the
threshold (one per step) that gives the highest rate under the cost curve.
Since ``P`` is cumulative, a row's tokens above the threshold are a prefix,
so this is a draft length per row. The rank uses a 64-bin histogram, one
jitted pass over the ``B x K`` candidates: no sort.

Where the curve is compute-bound (a CPU, where a step of 8 rows costs about
its token count) the threshold rises with the batch and rows draft only what
is likely accepted; where it is memory-bound (a GPU at small batch: ``C``
flat) the threshold is low and rows draft long.

**The running rate.** The best rate of the step alone is the right yardstick
only where every step looks alike. At a short match (prose) a step's best rate
is low, so that rule drafts deep tokens of small chance; but a token skipped
there is drafted at the next step from a longer match, and the step's seconds
could have earned what the run earns. So the policy keeps a running rate ``lam``
(the tokens the rows emitted, no more than each step verified, over the steps
priced at the cost curve as it stands; both decayed by ``rate_memory`` a step)
and takes no lower threshold than the one that maximises ``expected tokens -
lam * C(n)``: where the step's own best rate is below ``lam`` it drafts only the
tokens that pay at ``lam``, but never fewer than a row's tokens within its
match (a noisy timing times a high ``lam`` must not stop a copy); where it is
above, the ratio rule stands.

**The cost model** is :class:`saspec.step_cost.StepCost` (re-exported here): the engine's
cost curve, profiled up front or a prior shape, corrected online by a rule that no single timing, burst or
cold start moves for good.

**Acceptance.** The automaton's draft token ``i`` at a match of ``m`` tokens
continues a copy matched over ``m + i`` tokens; its probability comes from
per-match-bucket counts (``match_bucket(m + i)``; about the latest
``BUCKET_MEMORY`` trials of each, so that they follow the requests of late) with ``prior_weight``
pseudo-tokens of prior at odds ``m`` to 1, times the row's own odds factor (a
Mantel-Haenszel ratio of its recent hits and misses against what was
predicted, at matches of two tokens or more: a one-token match is a guess, not
a copy). Under the policy the automaton offers a draft at every match, one
token included: a one-token match's next token is right often enough to pay
where a verified token is cheap (BENCHMARKS.md, "Drafting policy"), and its
bucket learns how often, where a minimum match would drop every one. Where
the matched suffix's earlier occurrences went on with several tokens
(``branched``, from ``SpecEngine.extend``'s ``branch_out``), the first draft
token is one guess among the continuations seen: it has buckets of
its own, at prior odds ``m / 4`` to 1 (on recorded code edits and chat, a
branched match's first token was accepted a third to half as often as an
unbranched one of the same length; the tokens after it then match as usual).
A draft token further from the draft's start than the match is long
(``i >= m``) continues the copy past what the matched suffix showed: it has
buckets of its own too, with the same prior, learnt apart (served free-form
answers accept such tokens less often than the ``m + i`` bucket predicts,
recorded code edits more often: each engine learns which). Every offered automaton draft is scored against the tokens the row
emitted that step, verified or not (:meth:`DraftPolicy.observe`), so the
automaton needs no exploration. The neural drafter's per-token acceptance is
learnt from its verified drafts, with ``neural_prior`` as prior; its evidence
decays towards the prior (``neural_memory`` per step), so a run of early
misses cannot keep it out for good. Its cost is the target's cost curve times
a ratio learnt like a knot (prior ``neural_cost`` until two calls are timed,
so a 100x slow first call moves nothing): a call of ``k`` drafts costs one forward
over the tokens it has not read (its catch-up; none where the engine runs the
catch-up anyway) and ``k - 1`` forwards over its rows.

Every decision is counted in :attr:`DraftPolicy.stats`; ``log`` (a callable)
receives each step's :class:`Decision`.

This module is the public entry; the code lives in one module per job:
:mod:`saspec.acceptance` (buckets, priors, scoring), :mod:`saspec.allocation` (the
allocation kernels), :mod:`saspec.step_cost`, :mod:`saspec.policy_settings`,
:mod:`saspec.draft_policy`, :mod:`saspec.catch_up` and :mod:`saspec.sequence_policy`.
"""

from __future__ import annotations

from .acceptance import BRANCHED_PRIOR_ODDS, N_BUCKETS, match_bucket
from .allocation import AUTOMATON, N_BINS, NEURAL, NONE, SOURCE_NAMES, STATS
from .catch_up import CatchUpShare
from .draft_policy import DraftPolicy
from .policy_settings import LOG_ENV, Decision, PolicySettings, engine_cost, env_log, log_decision
from .sequence_policy import SequencePolicy
from .step_cost import StepCost, cpu_like, gpu_like, linear

__all__ = ["AUTOMATON", "BRANCHED_PRIOR_ODDS", "CatchUpShare", "Decision", "DraftPolicy", "LOG_ENV", "N_BINS",
           "N_BUCKETS", "NEURAL", "NONE", "PolicySettings", "SOURCE_NAMES", "STATS", "SequencePolicy", "StepCost",
           "cpu_like", "engine_cost", "env_log", "gpu_like", "linear", "log_decision", "match_bucket"]
