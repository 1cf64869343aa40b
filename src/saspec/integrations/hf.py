"""transformers: suffix-automaton drafts inside ``model.generate``.

::

    import saspec.integrations.hf as sahf
    out = model.generate(ids, custom_generate=sahf.generate, max_new_tokens=256, do_sample=False)
    out = model.generate(ids, custom_generate=sahf.generate, assistant_model=draft, max_new_tokens=256)

``generate`` is a ``custom_generate`` callable: transformers prepares the
inputs, cache, logits processors and stopping criteria as usual and then calls
it in place of its decoding loop. It runs transformers' own assisted-decoding
loop (``GenerationMixin._assisted_decoding``: verification, EOS, max length,
logits processors, cache crops) with one change, the candidate generator: a
:class:`SACandidateGenerator` whose drafts come from a
:class:`~saspec.SpecEngine` suffix automaton over the prompt and the tokens
generated so far. With ``assistant_model=draft`` it is the hybrid: the
automaton's draft when its match (the longest suffix of the text that occurred
earlier, in tokens) is at least ``saspec_threshold``, otherwise the draft
model's, through the candidate generator transformers itself builds for that
assistant.

Options (keyword arguments of ``model.generate``):

* ``saspec_k`` (int, default 8): automaton draft tokens per step.
* ``saspec_policy`` (default True): each step's source (the automaton, the
  assistant, or none) and draft length from :class:`saspec.policy.SequencePolicy`,
  for the most tokens per second: whole steps are timed on the policy's
  ``clock`` as they run (a cost model that no single slow or fast timing, burst
  or cold start moves for good), the automaton's draft is scored against the
  text that follows on every step, drafted or not, and the assistant's
  acceptance and cost are learnt from its calls. The assistant runs only on the
  steps it drafts: it skips the automaton's steps and reads the skipped tokens
  in one forward when it is next chosen, a catch-up the policy charges over the
  steps it is expected to serve. Where verifying several tokens costs about one
  forward (a GPU, or fp32 linears routed by ``saspec_fast_verify``) it drafts
  nearly always; where each verified token costs a forward it decodes plainly.
  Pass a :class:`saspec.policy.PolicySettings` to change its settings, a
  fresh ``SequencePolicy`` (``k_max >= saspec_k``) to inject a clock or read
  its ``stats`` afterwards, or False for the fixed rules below.
* ``saspec_threshold`` and ``saspec_length_rule`` / ``saspec_length_scale``:
  the fixed rules, used with ``saspec_policy=False``: the automaton drafts when
  its match is at least ``saspec_threshold`` tokens (default 1 alone, 4 with an
  assistant), ``per-match`` drafts ``ceil(scale * m)`` of its ``saspec_k``
  tokens after a match of ``m`` (``saspec.rules.draft_length``; ``fixed``
  always ``saspec_k``).
* ``saspec_gate``: deprecated, the former name of ``saspec_policy`` (a bool,
  or an object with the policy's calls, such as the bench's former gate, ``saspec_bench.former_gate.CostGate``).
* ``saspec_options`` (a mapping or :class:`saspec.options.DraftOptions`, default
  None): the request's drafting options. ``{"enabled": False}``: no drafts at
  all (plain decoding through the same loop); ``{"max_draft_tokens": n}``: no
  step drafts more than ``n`` tokens from either source; ``{"hints": ids}``:
  token ids (a file the output will edit, say) the automaton's drafts may copy
  from beside the request's own text. A bad option raises ``ValueError`` or
  ``TypeError`` naming it before anything runs.
* ``saspec_pool`` (a :class:`saspec.RequestPool`, default None): memory
  across calls: pass the same pool to every ``generate`` call, and each call
  drafts from the earlier calls' outputs too (where the match there is longer
  than in its own text), then adds its own when it ends.
* ``saspec_fast_verify`` (bool, default True): for the duration of the
  call, route the target's float32 ``nn.Linear`` layers through
  :func:`fast_small_linears` (restored afterwards; layers already routed
  stay so). On x86 CPUs torch's fp32 ``F.linear`` costs about one 1-row
  product per row from 2 to ~16 rows, so verifying a few drafts costs as
  many plain forwards; routed, about one. Plain (1-row) steps and the
  prefill are unchanged. No effect on other dtypes.

What the loop guarantees:

* ``do_sample=False``: the output is token-identical to plain greedy
  ``generate`` (every kept token is the target's own argmax), for any logits
  processors and stopping criteria. transformers' assisted loop checks
  stopping criteria once per step, after several tokens may have been
  accepted; :class:`_StopPerToken` checks them after every token instead, as
  plain decoding does, and the output (``sequences``, per-token scores,
  logits, attentions, hidden states, streamer) is cut at the first token they
  stop at.
* ``do_sample=True`` is supported: on automaton steps transformers samples
  each position from the target and keeps drafts while the samples agree,
  which for a deterministic draft is exact speculative sampling (the output
  has plain sampling's distribution, but not the same tokens for a given
  seed, since the random numbers are drawn differently); draft-model steps
  use transformers' speculative sampling.
* Batch size 1 only, as in transformers' assisted decoding (also no beams,
  no ``num_return_sequences`` > 1); decoder-only models only; the assistant
  must share the target's vocabulary.

transformers internals used, checked at each call against
:data:`TESTED_TRANSFORMERS` (outside it ``generate`` raises): the call
convention of ``custom_generate`` callables; ``GenerationMixin._assisted_decoding``
and the ``_get_candidate_generator`` hook it calls (overridden on the model
instance for the duration of the call, so one model must not run two
``generate`` calls at once); the candidate-generator interface
(``requires_model_outputs``, ``get_candidates``, ``update_candidate_strategy``);
the assistant's candidate generator's ``assistant_kwargs`` (its cache, and,
for a first call that the policy defers past the prompt, its attention mask and
position ids, extended with transformers' own ``_prepare_*`` helpers).
transformers does not pass ``assistant_model`` or ``streamer`` to a
``custom_generate`` callable (it keeps only the callable's own extra
arguments), so ``generate`` reads them from the calling
``GenerationMixin.generate`` frame, whose code object is checked first.

torch and transformers are imported when ``generate`` runs, never at import.
"""

from __future__ import annotations

import inspect
import re
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine import SpecEngine
from ..pool import RequestPool
from ..policy import PolicySettings, SequencePolicy
from ..rules import DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, HYBRID_THRESHOLD, check_length_rule, draft_length
from ..options import DEFAULT_OPTIONS, HINT_SEPARATOR, DraftOptions, parse_options
from ..single import SingleSequence

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: transformers versions this module is tested with, ``[low, high)`` as (major, minor): the suite passes
#: on 5.18.0, 5.20.2 and 5.24.0. Before 5.18 the assisted loop also ran the stopping criteria on each
#: step's unverified candidates, which :class:`_StopPerToken` does not expect (5.12.1 stops early);
#: 5.25 and later are untested.
TESTED_TRANSFORMERS: tuple[tuple[int, int], tuple[int, int]] = ((5, 18), (5, 25))

# The automaton is sized for up to this many new tokens at the start (it grows past them).
_MAX_RESERVED_TOKENS = 1 << 16


def _range_text() -> str:
    (a, b), (c, d) = TESTED_TRANSFORMERS
    return f">={a}.{b},<{c}.{d}"


def check_transformers_version(version: str | None = None) -> None:
    """Raise ``RuntimeError`` unless transformers' version (default: the
    installed one) is in :data:`TESTED_TRANSFORMERS`."""
    if version is None:
        import transformers

        version = transformers.__version__
    m = re.match(r"(\d+)\.(\d+)", version)
    key = (int(m.group(1)), int(m.group(2))) if m else None
    low, high = TESTED_TRANSFORMERS
    if key is None or not (low <= key < high) or ".dev" in version:
        raise RuntimeError(
            f"saspec.integrations.hf relies on private transformers internals (the assisted-decoding loop and "
            f"the custom_generate call convention) and is tested with transformers {_range_text()}; "
            f"transformers {version} is installed. Install a version in that range."
        )


# On x86 CPUs (AVX2, MKL) torch's fp32 ``F.linear`` over 2 to ~16 rows costs
# about one 1-row product per row, while the transposed product ``W @ x.T``
# costs little more for 8 rows than for 2 (BENCHMARKS.md, "Verify cost on a
# CPU"). Verification forwards have exactly those sizes, so routing them
# through it makes a verify of a few drafts cost about one plain forward.
# bf16 has no such gap and is left alone.
SMALL_ROWS = 32


def fast_small_linears(model: Any, max_rows: int = SMALL_ROWS) -> int:
    """Route ``model``'s float32 ``nn.Linear`` layers through ``(W @ x.T).T``
    for inputs of 2..``max_rows`` rows (tokens x batch); 1 row (plain
    decoding) and larger inputs (prefill) keep ``F.linear``, so plain greedy
    decoding is bit-identical. Values differ from ``F.linear``'s only by
    float rounding. Layers that already have a forward of their own (an
    instance attribute, as accelerate's hooks install) are left alone.
    Idempotent; returns the number of layers routed (0 for a non-float32
    model)."""
    import torch

    if max_rows < 2:
        raise ValueError(f"max_rows must be >= 2, got {max_rows}")
    n = 0
    for mod in model.modules():
        if not isinstance(mod, torch.nn.Linear) or mod.weight.dtype != torch.float32:
            continue
        ours = getattr(mod, "_saspec_small_rows", None) is not None
        if "forward" in vars(mod) and not ours:
            continue  # someone else's per-layer forward (e.g. accelerate's hooks): left as it is
        if not ours:
            mod.forward = _small_rows_forward(mod)
        mod._saspec_small_rows = max_rows
        n += 1
    return n


def _small_rows_forward(mod: Any) -> Any:
    import torch

    linear = torch.nn.functional.linear

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows < 2 or rows > mod._saspec_small_rows:
            return linear(x, mod.weight, mod.bias)
        # MKL is fast for W @ (row-major x).T at 2, 4, 8, 16 and 32 rows (3 rows
        # cost more than 4), so pad to a power of two; the result goes on
        # row-major too, or the next layer gets the slow layout.
        pad = 1 << (rows - 1).bit_length()
        xs = x.new_zeros(pad, x.shape[-1])
        xs[:rows] = x.reshape(rows, x.shape[-1])
        y = (mod.weight @ xs.T).T[:rows].contiguous().reshape(*x.shape[:-1], mod.out_features)
        return y if mod.bias is None else y + mod.bias

    return forward


class SACandidateGenerator:
    """Draft candidates for transformers' assisted-decoding loop from a suffix automaton.

    Implements transformers' ``CandidateGenerator`` interface (duck-typed, so
    this module does not import transformers): ``get_candidates`` and
    ``update_candidate_strategy``. One sequence (batch 1); the request lives
    in ``engine`` from construction to :meth:`close`.

    Args:
        input_ids: int64 tensor [1, L], the prompt.
        engine: the CPU :class:`~saspec.SpecEngine` that holds the automaton.
        k: draft tokens per automaton step (>= 1).
        threshold: the automaton drafts when its match is at least this many
            tokens (>= 1); below it ``fallback`` drafts, or nothing does.
        max_length: transformers' ``generation_config.max_length`` (prompt
            included); drafts never reach past ``max_length - 1``.
        eos_token_ids: EOS ids; an automaton draft ends at its first EOS.
        fallback: transformers' candidate generator for the draft model, or None.
        length_rule, length_scale: the draft-length rule
            (``saspec.rules.draft_length``; ``per-match-recent`` uses the
            automaton's accepted tokens at its previous step).
        gate: a :class:`~saspec.policy.SequencePolicy` (``k_max >= k``; or
            an object with its calls) that chooses each step's source and
            length instead of ``threshold`` and the length rule, or None. It
            is offered the automaton's draft every step, and told each step's
            time on its ``clock`` (from one ``update_candidate_strategy`` to
            the next, less the draft model's drafting), the draft model's
            calls, the draft model's outcome and the tokens each step emitted.

    ``stats`` counts steps, drafted and accepted tokens per draft source
    (``"sa"``, ``"pool"``: the automaton's draft from ``engine``'s pool,
    ``"assistant"``, ``"none"``).
    """

    requires_model_outputs = False

    def __init__(
        self,
        input_ids: torch.Tensor,
        *,
        engine: SpecEngine,
        k: int,
        threshold: int,
        max_length: int,
        eos_token_ids: list[int],
        fallback: Any = None,
        length_rule: str = DEFAULT_LENGTH_RULE,
        length_scale: float = DEFAULT_LENGTH_SCALE,
        gate: Any = None,
        options: DraftOptions = DEFAULT_OPTIONS,
    ) -> None:
        rule = check_length_rule(length_rule, length_scale)
        if k < 1:
            raise ValueError(f"saspec_k must be >= 1, got {k}")
        if gate is not None and gate.k_max < k:
            raise ValueError(f"the policy's k_max ({gate.k_max}) must be >= saspec_k ({k})")
        if threshold < 1:
            raise ValueError(f"saspec_threshold must be >= 1, got {threshold}")
        self.engine, self.k, self.threshold = engine, int(k), int(threshold)
        self.max_length = int(max_length)
        self.eos = set(int(e) for e in eos_token_ids)
        self.fallback = fallback
        self._rule, self.length_scale = rule, float(length_scale)
        self._last_sa = -1  # draft tokens accepted at the last automaton step; -1 when the last step was not one
        self.gate = gate
        if isinstance(gate, SequencePolicy):
            gate.begin()  # a given policy may have served an earlier generate call
        self._fallback_started = False
        self._step_end: float | None = None  # when the last step ended (gate clock); None before the prefill's
        self._assist_s = 0.0  # the draft model's time this step (counted as drafting, not as the step)
        self._step_len = 0  # input_ids' length when this step began
        new_tokens = min(max(0, self.max_length - int(input_ids.shape[1])), _MAX_RESERVED_TOKENS)
        self.options = options
        self._cap = self.k if options.max_draft_tokens is None else min(self.k, options.max_draft_tokens)
        if not options.drafts:
            self.gate = self.fallback = None
        prompt = input_ids[0].cpu().numpy().astype(np.int64)
        if options.hints is not None:  # the hints first, then a separator no match spans (see request_drafts)
            prompt = np.concatenate((options.hints, [HINT_SEPARATOR], prompt))
        self._seq = SingleSequence(engine, prompt, self.k, new_tokens)
        self._fed = int(input_ids.shape[1])  # tokens the automaton holds
        self._source = "none"
        self._drafted = 0
        self.stats: dict[str, dict[str, int]] = {
            s: {"steps": 0, "drafted": 0, "accepted": 0} for s in ("sa", "pool", "assistant", "none")
        }

    def lookup(self, input_ids: torch.Tensor, capped: bool = True) -> tuple[int, list[int]]:
        """Feed the tokens of ``input_ids`` [1, L] the automaton has not seen;
        return (match length in tokens, up to ``k`` draft tokens, cut by the
        length rule unless ``capped`` is False)."""
        m, draft = self._seq.extend(input_ids[0, self._fed:].tolist())
        self._fed = int(input_ids.shape[1])
        if HINT_SEPARATOR in draft:  # a draft copied from the hints ends with them
            draft = draft[: draft.index(HINT_SEPARATOR)]
        draft = draft[: self._cap] if self.options.drafts else []
        if capped:
            draft = draft[: draft_length(m, self.k, self._rule, self.length_scale, self._last_sa)]
        return m, draft

    def get_candidates(self, input_ids: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``input_ids`` [1, L] int64 -> (``input_ids`` followed by the drafts,
        [1, L + n] int64; draft logits [1, n, vocab] float from the fallback, or None)."""
        import torch

        match, draft = self.lookup(input_ids, capped=self.gate is None)
        room = self.max_length - int(input_ids.shape[1]) - 1  # the target adds one token of its own
        for i, t in enumerate(draft):
            if t in self.eos:
                draft = draft[: i + 1]
                break
        self._step_len, self._assist_s = int(input_ids.shape[1]), 0.0
        if self.gate is not None:
            self.gate.offer(match, draft, self._seq.branched)  # scored against what follows, verified or not
        draft = draft[: max(room, 0)]
        use_sa, use_fallback = bool(draft) and match >= self.threshold, self.fallback is not None and room > 0
        if use_fallback and not self._fallback_started and self.gate is None:
            use_sa = False  # the fixed rules start the assistant at the first step, as transformers does
        behind = int(input_ids.shape[1]) - _cached(self.fallback) if use_fallback else 0  # tokens it has not read
        if self.gate is not None:  # the gate starts the assistant only when its draft pays (it reads the prompt then)
            source, n = self._choose(match, len(draft), self.k if use_fallback else 0, behind,
                                     self.max_length - int(input_ids.shape[1]))
            if source == "probe" and room <= 0:  # no room for a draft token
                source, n = "none", 0
            elif source == "probe":  # one token, to time a multi-token verify: the automaton's, else a guess
                draft = draft[:1] or input_ids[0, -1:].tolist()
                source = "sa"
            draft = draft[:n]
            use_sa, use_fallback = source == "sa", source == "draft"
            if use_fallback and hasattr(self.fallback, "num_assistant_tokens"):
                self.fallback.num_assistant_tokens = n  # the gate's length (transformers' schedule adapts it after)
        if use_sa:
            self._source, self._drafted = "pool" if self._seq.from_pool else "sa", len(draft)
            tail = torch.tensor([draft], dtype=input_ids.dtype, device=input_ids.device)
            return torch.cat([input_ids, tail], dim=1), None
        if use_fallback:
            if not self._fallback_started:
                _mask_to(self.fallback, int(input_ids.shape[1]))
                self._fallback_started = True
            clock = self.gate.clock if self.gate is not None else time.perf_counter
            t0 = clock()
            ids, logits = self.fallback.get_candidates(input_ids, **kwargs)
            self._assist_s = clock() - t0
            if ids.shape[1] - input_ids.shape[1] > self._cap:  # the request's cap holds for the assistant too
                ids = ids[:, : input_ids.shape[1] + self._cap]
                logits = logits[:, : self._cap] if logits is not None else None
            self._source, self._drafted = "assistant", int(ids.shape[1] - input_ids.shape[1])
            if self.gate is not None and self._drafted and self._assist_s > 0:
                self.gate.observe_draft_call(self._assist_s, read=max(behind, 1), drafted=self._drafted)
            return ids, logits
        self._source, self._drafted = "none", 0
        return input_ids, None

    def _choose(self, match: int, sa_len: int, model_k: int, behind: int, remaining: int) -> tuple[str, int]:
        if isinstance(self.gate, SequencePolicy):
            return self.gate.choose(match, sa_len, model_k, behind, remaining=remaining)
        return self.gate.choose(match, sa_len, model_k, behind)  # an object with the old gate's calls

    def update_candidate_strategy(self, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: int) -> None:
        """Record the step's outcome; the fallback adapts after its own steps."""
        if self.gate is not None:
            now = self.gate.clock()
            step_s = None if self._step_end is None else now - self._step_end - self._assist_s
            if step_s is not None and step_s > 0:  # not the prefill; a clock that did not move tells nothing
                self.gate.observe_forward(1 + self._drafted, step_s)  # the whole step, less the draft model's
            self._step_end = now
            if self._source == "assistant" and self._drafted:
                self.gate.observe("draft", 0, self._drafted, min(int(num_matches), self._drafted))
            self.gate.observe_tokens(input_ids[0, self._step_len:].tolist())
        st = self.stats[self._source]
        st["steps"] += 1
        st["drafted"] += self._drafted
        st["accepted"] += int(num_matches)
        self._last_sa = int(num_matches) if self._source in ("sa", "pool") else -1
        if self._source == "assistant":
            self.fallback.update_candidate_strategy(input_ids, scores, num_matches)

    @property
    def request_id(self) -> Any:
        """The automaton's id in ``engine`` (None once closed)."""
        return self._seq.request_id

    def close(self) -> None:
        """Free the request's automaton (idempotent)."""
        self._seq.close()


def _cached(assistant: Any) -> int:
    """Tokens in transformers' assistant candidate generator's cache (0 before its first call)."""
    cache = getattr(assistant, "assistant_kwargs", {}).get("cache")
    return int(cache.get_seq_length()) if cache is not None else 0


def _mask_to(assistant: Any, length: int) -> None:
    """Extend the assistant's attention mask and position ids, made for the prompt, to ``length`` tokens:
    its first call may come after steps it did not draft, and transformers extends them (with these same
    helpers) only once the assistant's cache exists."""
    from transformers.generation import candidate_generator as cg

    kw = getattr(assistant, "assistant_kwargs", None)
    if kw is None:
        return
    encdec = assistant.assistant_model.config.is_encoder_decoder
    kw = cg._prepare_attention_mask(kw, length, encdec)
    kw = cg._prepare_position_ids(kw, length, encdec)
    assistant.assistant_kwargs = cg._prepare_token_type_ids(kw, length)


class _StopPerToken:
    """Stopping criteria checked after every token, as plain decoding checks them.

    transformers' assisted loop calls its criteria once per step on the whole
    sequence. This wrapper, called the same way, runs ``criteria`` on each
    prefix that ends at a token new since its last call, records the first
    length at which they stop (``stop_at``), forwards the new tokens up to it
    to ``streamer``, and reports whether the sequence is finished (bool tensor [1]).
    """

    def __init__(self, criteria: Any, prompt_len: int, streamer: Any) -> None:
        self.criteria = criteria
        self.prompt_len = prompt_len
        self.seen = prompt_len
        self.streamer = streamer
        self.stop_at: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        import torch

        total = int(input_ids.shape[1])
        end = total
        for n in range(self.seen + 1, total + 1):
            s = scores[: n - self.prompt_len] if scores is not None else None
            if bool(self.criteria(input_ids[:, :n], s, **kwargs).all()):
                end = self.stop_at = n
                break
        if self.streamer is not None and end > self.seen:
            self.streamer.put(input_ids[0, self.seen:end].cpu())
        self.seen = total
        return torch.full((input_ids.shape[0],), self.stop_at is not None, dtype=torch.bool, device=input_ids.device)


def _from_generate_frame(frame: Any) -> dict[str, Any]:
    """``assistant_model`` and ``streamer`` as given to ``GenerationMixin.generate``,
    read from its frame (transformers does not pass them to a ``custom_generate``
    callable). Raises ``RuntimeError`` when ``frame`` is not that function's:
    an assistant would otherwise be dropped without a word."""
    from transformers.generation.utils import GenerationMixin

    code = inspect.unwrap(GenerationMixin.generate).__code__
    if frame is None or frame.f_code is not code:
        raise RuntimeError(
            "saspec.integrations.hf.generate runs inside transformers' generate: call "
            "model.generate(..., custom_generate=saspec.integrations.hf.generate), not the function itself"
        )
    return {k: frame.f_locals.get(k) for k in ("assistant_model", "streamer")}


def generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    inputs_tensor: torch.Tensor | None = None,
    assistant_model: Any = None,
    saspec_k: int = 8,
    saspec_threshold: int | None = None,
    saspec_length_rule: str = DEFAULT_LENGTH_RULE,
    saspec_length_scale: float = DEFAULT_LENGTH_SCALE,
    saspec_policy: bool | SequencePolicy | PolicySettings = True,
    saspec_fast_verify: bool = True,
    saspec_pool: RequestPool | None = None,
    saspec_gate: Any = None,
    saspec_options: Any = None,
    **model_kwargs: Any,
) -> Any:
    """Speculative ``generate`` with suffix-automaton drafts (see the module doc).

    Called by ``model.generate(..., custom_generate=generate)``, not directly:
    the arguments are what transformers prepares (``input_ids``: int64 tensor
    [1, L]; the processed logits processors, stopping criteria and generation
    config; ``model_kwargs`` with the cache). Returns what ``generate`` returns:
    the int64 tensor [1, L + new] of sequences, or transformers' output object
    when ``return_dict_in_generate=True``.

    Raises:
        RuntimeError: transformers outside :data:`TESTED_TRANSFORMERS`.
        ValueError: batch size other than 1, beam search, an encoder-decoder or
            stateful model, or an assistant with another vocabulary.
    """
    check_transformers_version()
    options = parse_options(saspec_options, "saspec_options")
    caller = _from_generate_frame(sys._getframe(1))
    assistant_model = assistant_model if assistant_model is not None else caller.get("assistant_model")
    streamer = streamer if streamer is not None else caller.get("streamer")

    if (generation_config.num_beams or 1) > 1:
        raise ValueError(f"saspec's transformers integration does not do beam search (num_beams={generation_config.num_beams})")
    batch = int(input_ids.shape[0])
    if batch != 1:
        raise ValueError(
            f"saspec's transformers integration decodes one sequence at a time (batch size 1, like transformers' "
            f"assisted decoding); got batch size {batch} (num_return_sequences counts too). "
            "Call generate once per prompt."
        )
    if model.config.is_encoder_decoder:
        raise ValueError("saspec's transformers integration supports decoder-only models only")
    if getattr(model, "_is_stateful", False):
        raise ValueError(f"{type(model).__name__} is stateful (its cache cannot be rolled back), so it cannot verify drafts")
    if generation_config.prompt_lookup_num_tokens is not None:
        raise ValueError("prompt_lookup_num_tokens selects transformers' prompt lookup; saspec drafts instead, drop it")
    if assistant_model is not None:
        v_target = model.config.get_text_config().vocab_size
        v_draft = assistant_model.config.get_text_config().vocab_size
        if v_target != v_draft:
            raise ValueError(
                f"the assistant model's vocabulary ({v_draft}) differs from the target's ({v_target}); "
                "saspec's hybrid needs a draft model with the target's tokenizer"
            )
    threshold = saspec_threshold if saspec_threshold is not None else (HYBRID_THRESHOLD if assistant_model is not None else 1)
    eos = generation_config._eos_token_tensor
    eos_ids = [] if eos is None else [int(e) for e in eos.reshape(-1).tolist()]

    if saspec_gate is not None:  # the former name
        import warnings

        warnings.warn("saspec_gate is deprecated: pass saspec_policy (True, False, a PolicySettings or a "
                      "SequencePolicy)", DeprecationWarning, stacklevel=3)
        saspec_policy = saspec_gate
    if not (isinstance(saspec_policy, (bool, SequencePolicy, PolicySettings)) or hasattr(saspec_policy, "choose")):
        raise ValueError("saspec_policy must be a bool, a saspec.policy.PolicySettings or a saspec.policy."
                         f"SequencePolicy, got {type(saspec_policy).__name__}")
    if saspec_pool is not None and not isinstance(saspec_pool, RequestPool):
        raise ValueError(f"saspec_pool must be a saspec.RequestPool, got {type(saspec_pool).__name__}")
    made: list[SACandidateGenerator] = []
    original = model._get_candidate_generator  # bound method (or an instance override)

    def candidate_generator(**kwargs: Any) -> SACandidateGenerator:
        fallback = original(**kwargs) if kwargs.get("assistant_model") is not None and options.drafts else None
        gate = _policy_for(saspec_policy, saspec_k, model) if options.drafts else None
        gen = SACandidateGenerator(kwargs["input_ids"], engine=SpecEngine(pool=saspec_pool), k=saspec_k, threshold=threshold,
                                   max_length=generation_config.max_length, eos_token_ids=eos_ids, fallback=fallback,
                                   length_rule=saspec_length_rule, length_scale=saspec_length_scale, gate=gate,
                                   options=options)
        made.append(gen)
        return gen

    stop = _StopPerToken(stopping_criteria, int(input_ids.shape[1]), streamer)
    had_override = "_get_candidate_generator" in vars(model)
    model._get_candidate_generator = candidate_generator
    routed = [m for m in model.modules() if getattr(m, "_saspec_small_rows", None) is None] if saspec_fast_verify else []
    if saspec_fast_verify:
        fast_small_linears(model)
    routed = [m for m in routed if getattr(m, "_saspec_small_rows", None) is not None]
    try:
        out = model._assisted_decoding(
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stop,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=None,  # fed token by token by `stop`
            inputs_tensor=inputs_tensor,
            assistant_model=assistant_model,
            **model_kwargs,
        )
        out = _cut(out, stop.stop_at, stop.prompt_len)
        if saspec_pool is not None and made:  # the pool gets the whole output, its last step's tokens too
            made[-1].lookup(getattr(out, "sequences", out))
    finally:
        if had_override:
            model._get_candidate_generator = original
        else:
            del model._get_candidate_generator
        for gen in made:
            gen.close()
        for mod in routed:  # undo this call's routing
            del mod.forward, mod._saspec_small_rows
    if streamer is not None:
        streamer.end()
    return out


def _policy_for(setting: Any, k: int, model: Any) -> Any:
    """The step policy ``generate`` uses: None (off), the given one, or a fresh ``SequencePolicy`` whose
    prior cost shape follows the model's device (compute-bound on a CPU, memory-bound elsewhere)."""
    if setting is False:
        return None
    if setting is not True and not isinstance(setting, PolicySettings):
        return setting
    device = getattr(getattr(model, "device", None), "type", "cpu")
    return SequencePolicy.for_engine(max(int(k), 1), device=device,
                                     settings=setting if isinstance(setting, PolicySettings) else None)


def _cut(out: Any, stop_at: int | None, prompt_len: int) -> Any:
    """``out`` (tensor [1, T] or an output object) cut to ``stop_at`` tokens."""
    import torch

    seqs = out if isinstance(out, torch.Tensor) else out.sequences
    if stop_at is None or stop_at >= seqs.shape[1]:
        return out
    if isinstance(out, torch.Tensor):
        return out[:, :stop_at]
    drop = int(seqs.shape[1]) - stop_at
    out.sequences = seqs[:, :stop_at]
    for name in ("scores", "logits", "attentions", "hidden_states"):
        value = getattr(out, name, None)
        if value is not None:
            setattr(out, name, value[: stop_at - prompt_len])
    cache = getattr(out, "cache", None)  # named past_key_values before transformers 5.2x
    cache = getattr(out, "past_key_values", None) if cache is None else cache
    if cache is not None:
        cache.crop(-drop)
    return out
