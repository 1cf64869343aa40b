"""Drafters for llama.cpp: the suffix automaton, a small GGUF draft model, and the hybrid.

What the user passes to saspec's loop (``saspec.integrations.llama_cpp.loop``) to say how to
draft; the loop drives a :class:`saspec.drafter.Drafter` built from their settings:

* :class:`SADraftModel`: the automaton's settings (K, the length rule, ``min_match``, which
  earlier occurrence to copy, a cross-request :class:`saspec.RequestPool`). It is also a
  drafter of its own (a one-request :class:`~saspec.SpecEngine`, fed only the tokens it has
  not seen) and a ``llama_cpp.llama_speculative.LlamaDraftModel`` (registered at
  construction where llama-cpp-python is importable), so ``Llama(draft_model=SADraftModel())``
  uses it in llama-cpp-python's own speculative loop.
* :class:`ModelDrafter`: a small GGUF model (a second ``llama_cpp.Llama``) that drafts
  greedily. Its KV cache is kept across steps and caught up lazily: steps whose draft
  comes from elsewhere cost it nothing; the next step it drafts decodes the tokens it
  missed in one batch.
* :class:`LlamaCppHybridDrafter`: both. In the loop the drafting policy chooses each step's
  source and length; with the policy off, the automaton's draft where its match is at least
  ``threshold`` tokens, the draft model's otherwise.

Each also follows the single-sequence protocol a loop of your own may drive:
``begin(prompt)`` once, then each step ``propose(new_tokens)`` with the tokens verified
since the last call, returning the draft (a list of ints, cut by the fixed rules);
``source`` names where the last draft came from.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...engine import SpecEngine
from ...pool import RequestPool
from ...rules import DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, HYBRID_THRESHOLD, check_length_rule, draft_length
from ...single import SingleSequence
from ...validate import as_tokens, check_count, check_int, is_torch

#: Draft tokens per step the automaton may propose (the length rule cuts each draft to its match), and the
#: shortest match it drafts after. On a CPU a llama.cpp step costs nearly its token count (each verified
#: token almost a forward), so short matches' drafts cost more than they save, and long matches pay
#: most in long steps (BENCHMARKS.md, llama.cpp).
DEFAULT_K = 32
DEFAULT_MIN_MATCH = 3
#: The draft model's most draft tokens per step, and the probability below which it stops
#: (llama.cpp's ``--draft-p-min`` idea: an unsure draft model wastes verification).
DEFAULT_MODEL_K = 8
DEFAULT_P_MIN = 0.75


def _register_llama_draft_model(cls: type) -> None:
    """Make ``cls`` a virtual subclass of llama-cpp-python's ``LlamaDraftModel`` (no-op without it)."""
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel
    except ImportError:
        return
    if not issubclass(cls, LlamaDraftModel):
        LlamaDraftModel.register(cls)


def as_history(input_ids: Any) -> np.ndarray:
    """A verified history as a 1-D int32 array; ``ValueError``/``TypeError`` naming the problem."""
    a = np.asarray(input_ids)
    if a.ndim != 1:
        raise ValueError(f"input_ids must be 1-D token ids, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"input_ids must hold integers, got dtype {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= 2**31):
        raise ValueError("input_ids must be token ids in [0, 2**31)")
    return a.astype(np.int32, copy=False)


class SADraftModel:
    """Automaton drafts over one verified history, incremental.

    Args:
        k: the most draft tokens per call (>= 1).
        length_rule, length_scale: the draft length from the match length
            (``saspec.rules.draft_length``; default per-match: ``ceil(2 m)``).
        pool: an optional :class:`saspec.RequestPool`: each call drafts from
            earlier histories too (where the match there is longer), and a
            history joins the pool when a new one replaces it (or at
            :meth:`close`). Share one pool across drafters for memory across
            requests (the server does); in saspec's loop, its ``Drafter``
            uses it, so memory across ``generate`` calls works there too.
        occurrence: which earlier occurrence drafts copy from
            (``saspec.build.OCCURRENCES``; None: the automaton's default).
        min_match: draft only after a match of at least this many tokens
            (>= 1; default 3). On a CPU, where verifying each drafted token
            costs nearly a forward of its own, the drafts of short matches
            cost more than they save.

    ``length_rule``, ``length_scale`` and ``min_match`` cut :meth:`propose`'s
    drafts (the fixed rules: the loop's ``policy=False``, and
    llama-cpp-python's own loop); the loop's drafting policy instead is
    offered the automaton's whole draft at any match and chooses its length
    itself.

    Raises:
        ValueError, TypeError: a bad ``k``, length rule, scale, pool, occurrence or ``min_match``.

    As a ``LlamaDraftModel``: ``model(input_ids)`` with the whole verified history
    (int 1-D) returns the draft (int32 1-D, possibly empty). When ``input_ids``
    extends the last history (checked by one array comparison of the overlap),
    only the new tokens are appended; otherwise (a new prompt, a rollback) the
    automaton is rebuilt over ``input_ids``.
    """

    def __init__(self, k: int = DEFAULT_K, *, length_rule: str = DEFAULT_LENGTH_RULE,
                 length_scale: float = DEFAULT_LENGTH_SCALE, pool: RequestPool | None = None,
                 occurrence: str | None = None, min_match: int = DEFAULT_MIN_MATCH) -> None:
        self.k = check_count(k, "k")
        self.min_match = check_int(min_match, "min_match", 1)
        self._rule = check_length_rule(length_rule, length_scale)
        self.length_rule, self.length_scale = length_rule, float(length_scale)
        kw = {} if occurrence is None else {"occurrence": occurrence}
        self.engine = SpecEngine(pool=pool, **kw)
        self.pool = pool
        self.occurrence = occurrence
        self._seq: SingleSequence | None = None
        self._hist = np.zeros(1024, np.int32)  # the history the automaton holds, first _n entries
        self._n = 0
        self.match_len = 0  # the last call's match length in tokens
        self.branched = False  # the last call's match went on with several tokens earlier (SingleSequence.branched)
        self.source = "none"  # "sa", "pool" or "none" (no draft)
        self.rebuilds = 0
        _register_llama_draft_model(type(self))

    # -- the loop protocol ---------------------------------------------------

    def begin(self, prompt: Any) -> None:
        """Start a new history at ``prompt`` (1-D token ids, at least one): appended
        where it extends the current history (a conversation's next turn), else rebuilt."""
        p = as_history(prompt)
        if p.size == 0:
            raise ValueError("the prompt must hold at least one token")
        self._sync(p)

    def _sync(self, h: np.ndarray) -> tuple[int, list[int]]:
        """Make the history ``h``: append its new tokens where it extends the current one, else rebuild."""
        n = self._n
        if self._seq is not None and h.size >= n and np.array_equal(h[:n], self._hist[:n]):
            new = h[n:]
            self._append(new)
            return self._seq.extend(new.tolist())
        return self._rebuild(h)

    def propose(self, new_tokens: Sequence[int]) -> list[int]:
        """Append ``new_tokens`` (verified since the last call); return the draft (list of ints)."""
        if self._seq is None:
            raise RuntimeError("call begin(prompt) first")
        return self._cut(*self.lookup(new_tokens))

    def lookup(self, new_tokens: Sequence[int]) -> tuple[int, list[int]]:
        """Append ``new_tokens``; return ``(match, draft)`` before the length rule and ``min_match``
        cut it: the match length in tokens and up to ``k`` draft tokens.

        ``new_tokens``: ints (or a 1-D integer array) in [0, 2**31), all checked before any is
        appended (``saspec.validate.as_tokens``); floats, strings and bools raise ``TypeError``,
        out-of-range ids ``ValueError``, and the history is unchanged."""
        if self._seq is None:
            raise RuntimeError("call begin(prompt) first")
        new = as_tokens(new_tokens if isinstance(new_tokens, np.ndarray) or is_torch(new_tokens)
                        else list(new_tokens), "new_tokens")
        self._append(new)
        m, d = self._seq.extend(new.tolist())
        self.match_len, self.branched = m, self._seq.branched
        self.source = ("pool" if self._seq.from_pool else "sa") if d else "none"
        return m, d

    # -- the LlamaDraftModel interface ---------------------------------------

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> np.ndarray:
        h = as_history(input_ids)
        if h.size == 0:
            raise ValueError("input_ids must hold at least one token")
        m, d = self._sync(h)
        return np.asarray(self._cut(m, d), dtype=np.intc)

    # -- internals -------------------------------------------------------------

    def _cut(self, m: int, draft: list[int]) -> list[int]:
        self.match_len = m
        n = draft_length(m, self.k, self._rule, self.length_scale, -1) if m >= self.min_match else 0
        draft = draft[:n]
        self.source = ("pool" if self._seq.from_pool else "sa") if draft else "none"
        return draft

    def _append(self, new: np.ndarray) -> None:
        end = self._n + new.size
        if end > self._hist.size:
            grown = np.zeros(max(end, 2 * self._hist.size), np.int32)
            grown[: self._n] = self._hist[: self._n]
            self._hist = grown
        self._hist[self._n: end] = new
        self._n = end

    def _rebuild(self, history: np.ndarray) -> tuple[int, list[int]]:
        self._close_seq()
        self._n = 0
        self._append(history)
        self._seq = SingleSequence(self.engine, history.astype(np.int64), self.k)
        self.rebuilds += 1
        return self._seq.extend([])

    def _close_seq(self) -> None:
        if self._seq is not None:
            self._seq.close()  # with a pool, the history joins it
            self._seq = None

    def close(self) -> None:
        """Free the automaton (idempotent); with a pool, the history joins it."""
        self._close_seq()
        self._n = 0


class ModelDrafter:
    """Greedy drafts from a small GGUF model, its KV cache kept and caught up lazily.

    Args:
        model: a ``llama_cpp.Llama`` (the draft model; same vocabulary as the
            target). The drafter owns its context while in use: do not run
            the model elsewhere meanwhile.
        k: the most draft tokens per step (>= 1).
        p_min: stop drafting when the model's probability of its own next
            token falls below this, in [0, 1] (0: always ``k`` tokens).

    Raises:
        TypeError, ValueError: a model without a context, a bad ``k`` or ``p_min``.
    """

    def __init__(self, model: Any, k: int = DEFAULT_MODEL_K, p_min: float = DEFAULT_P_MIN) -> None:
        from .lowlevel import Context

        self.k = check_count(k, "k")
        p_min = float(p_min)
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {p_min}")
        self.p_min = p_min
        self.ctx = Context(model)
        self._hist: list[int] = []  # the verified history
        self._cached = 0  # how many of its tokens the KV cache surely holds
        self.source = "none"
        self.forwards = 0  # decode calls made
        self.decoded = 0  # tokens decoded (catch-up and drafting)

    def begin(self, prompt: Any) -> None:
        """Start a new history at ``prompt``; the KV cache keeps any prefix it shares."""
        p = as_history(prompt)
        if p.size == 0:
            raise ValueError("the prompt must hold at least one token")
        self._hist = p.tolist()
        self._cached = min(self.ctx.common_prefix(self._hist), len(self._hist) - 1)

    def behind(self, new_tokens: Sequence[int] = ()) -> int:
        """Tokens the next :meth:`propose` (given ``new_tokens``) decodes before drafting: the
        verified ones its KV cache lacks (an upper bound: drafts it kept may match), at least 1."""
        return max(len(self._hist) + len(new_tokens) - self._cached, 1)

    def note(self, new_tokens: Sequence[int]) -> None:
        """Append verified tokens without running the model (it catches up when next asked)."""
        self._hist.extend(int(t) for t in new_tokens)

    def propose(self, new_tokens: Sequence[int], k: int | None = None) -> list[int]:
        """Append ``new_tokens``, catch up over every token not yet in the KV cache, draft up to
        ``k`` tokens (default: the drafter's ``k``; ``ValueError`` unless >= 1)."""
        k = self.k if k is None else check_count(k, "k")
        self.note(new_tokens)
        ctx = self.ctx
        keep = ctx.common_prefix(self._hist)
        if keep == len(self._hist):  # the logits of the last token are gone: decode it again
            keep -= 1
        ctx.truncate(keep)
        logits = ctx.decode(self._hist[keep:], want_last=True)
        self.forwards += 1
        self.decoded += len(self._hist) - keep
        self._cached = len(self._hist)
        draft: list[int] = []
        while True:
            t, p = _top(logits)
            if p < self.p_min:
                break
            draft.append(t)
            if len(draft) >= k or ctx.n_past + 1 >= ctx.n_ctx:
                break
            logits = ctx.decode([t], want_last=True)
            self.forwards += 1
            self.decoded += 1
        self.source = "draft" if draft else "none"
        return draft


def _top(logits: np.ndarray) -> tuple[int, float]:
    """The argmax of one row of logits and its softmax probability."""
    t = int(np.argmax(logits))
    z = logits - logits[t]
    return t, float(1.0 / np.exp(z, dtype=np.float64).sum())


class LlamaCppHybridDrafter:
    """The automaton and a draft model over one history.

    In :class:`~.loop.Speculator` with its policy on (the default) the policy
    chooses each step's source and length and this object only holds the two
    drafters' settings; with the policy off, the loop (and :meth:`propose`)
    applies the match-length rule: the automaton where its match is long
    enough, the draft model otherwise.

    Args:
        sa: an :class:`SADraftModel`.
        model: a :class:`ModelDrafter`.
        threshold: with the policy off, the automaton drafts when its match is
            at least this many tokens (>= 1; default ``saspec.rules.HYBRID_THRESHOLD``).

    The draft model only reads the verified tokens (``note``) on automaton steps;
    it decodes them when it next drafts.
    """

    def __init__(self, sa: SADraftModel, model: ModelDrafter, threshold: int = HYBRID_THRESHOLD) -> None:
        if not isinstance(sa, SADraftModel):
            raise TypeError(f"sa must be an SADraftModel, got {type(sa).__name__}")
        if not isinstance(model, ModelDrafter):
            raise TypeError(f"model must be a ModelDrafter, got {type(model).__name__}")
        self.sa, self.model = sa, model
        self.threshold = check_int(threshold, "threshold", 1)
        self.source = "none"

    def begin(self, prompt: Any) -> None:
        self.sa.begin(prompt)
        self.model.begin(prompt)

    def propose(self, new_tokens: Sequence[int]) -> list[int]:
        new = list(new_tokens)
        d = self.sa.propose(new)
        if d and self.sa.match_len >= self.threshold:
            self.model.note(new)
            self.source = self.sa.source
            return d
        d = self.model.propose(new)
        self.source = self.model.source
        return d

    def close(self) -> None:
        self.sa.close()

