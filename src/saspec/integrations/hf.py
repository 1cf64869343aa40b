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
:class:`SACandidateGenerator`, engine glue over a :class:`saspec.drafter.Drafter`
(the library's drafting session: a suffix automaton over the prompt and the
tokens generated so far, the drafting policy, the step timings, the assistant's
acceptance and cost, the pool). With ``assistant_model=draft`` it is the
hybrid: each step the automaton's draft, the draft model's (through the
candidate generator transformers itself builds for that assistant) or none.

Options (keyword arguments of ``model.generate``; None: the default):

* ``saspec_k`` (int, default 8): the most automaton draft tokens of a step
  (and, with the policy, of the assistant's).
* ``saspec_policy`` (default True): each step's source (the automaton, the
  assistant, or none) and draft length from the drafter's policy
  (:class:`saspec.policy.DraftPolicy`), for the most tokens per second: the
  target's forwards are timed on the drafter's ``clock`` as they run, the
  prefill and the assistant's calls apart (a cost model that no single slow or
  fast timing, burst or cold start moves for good), the automaton's draft is
  scored against the text that follows on every step, drafted or not, and the
  assistant's acceptance and cost are learnt from its calls. The assistant runs
  only on the steps it drafts: it skips the automaton's steps and reads the
  skipped tokens in one forward when it is next chosen, a catch-up the policy
  charges over the steps it is expected to serve. Where verifying several
  tokens costs about one forward (a GPU, or fp32 linears routed by
  ``saspec_fast_verify``) it drafts nearly always; where each verified token
  costs a forward it decodes plainly. The prior cost shape follows the model's
  device (``"cpu"`` or not). Pass a :class:`saspec.policy.PolicySettings` to
  change its settings, or False for the fixed rules below.
* ``saspec_threshold`` and ``saspec_length_rule`` / ``saspec_length_scale``:
  the fixed rules, used with ``saspec_policy=False``: the automaton drafts when
  its match is at least ``saspec_threshold`` tokens (default 1 alone, 4 with an
  assistant), ``per-match`` (the default) drafts ``ceil(scale * m)`` of its
  ``saspec_k`` tokens after a match of ``m`` (scale default 2;
  ``saspec.rules.draft_length``; ``fixed`` always ``saspec_k``), and the
  assistant drafts where the automaton does not, from the first step on, with
  transformers' own schedule of ``num_assistant_tokens`` (at most
  :data:`MAX_ASSISTANT_TOKENS` a step).
* ``saspec_drafter`` (a :class:`saspec.drafter.Drafter`, default None): the
  drafter to use instead of a new one per call, built by the caller (e.g. with
  an injected ``clock=``, a ``cost=`` profiled on the model, a ``pool``); it may
  serve several ``generate`` calls in turn, each as a new request, and keeps its
  cost model, acceptance evidence and pool across them; read its ``stats()``
  and ``policy`` afterwards; the caller closes it. :func:`drafter_for` builds
  the one ``generate`` would build from the keywords. It brings its own settings:
  not with ``saspec_k``, ``saspec_policy``, ``saspec_threshold``,
  ``saspec_length_rule``, ``saspec_length_scale`` or ``saspec_pool``
  (``ValueError``). With a fixed rule and an assistant, build it with
  ``max_step_tokens`` above the assistant's longest draft.
* ``saspec_options`` (a mapping or :class:`saspec.options.DraftOptions`, default
  None): the request's drafting options. ``{"enabled": False}``: no drafts at
  all (plain decoding through the same loop); ``{"max_draft_tokens": n}``: no
  step drafts more than ``n`` tokens from either source; ``{"hints": ids}``:
  token ids (a file the output will edit, say) the automaton's drafts may copy
  from beside the request's own text. A bad option raises ``ValueError`` or
  ``TypeError`` naming it before anything runs.
* ``saspec_pool`` (a :class:`saspec.RequestPool`, default None; the
  drafter's ``pool``): memory across calls: pass the same pool to every ``generate`` call, and each call
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
the assistant's candidate generator's ``num_assistant_tokens`` (set to each
step's length) and ``assistant_kwargs`` (its cache, and,
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
import itertools
import math
import re
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from ..drafter import DraftBatch, Drafter
from ..options import parse_options
from ..policy import AUTOMATON, NEURAL, PolicySettings
from ..pool import RequestPool
from ..rules import DEFAULT_LENGTH_RULE, DEFAULT_LENGTH_SCALE, HYBRID_THRESHOLD, check_length_rule

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: transformers versions this module is tested with, ``[low, high)`` as (major, minor): the suite passes
#: on 5.18.0, 5.20.2 and 5.24.0. Before 5.18 the assisted loop also ran the stopping criteria on each
#: step's unverified candidates, which :class:`_StopPerToken` does not expect (5.12.1 stops early);
#: 5.25 and later are untested.
TESTED_TRANSFORMERS: tuple[tuple[int, int], tuple[int, int]] = ((5, 18), (5, 25))

#: ``saspec_k``'s default: the most automaton draft tokens of a step.
DEFAULT_K = 8
#: With the fixed rules (``saspec_policy=False``) the assistant follows transformers' schedule of
#: ``num_assistant_tokens`` (its heuristic schedule adds 2 after every fully accepted draft, without a
#: bound), clamped to this many tokens a step (at least ``saspec_k``): a step may emit that many and one more,
#: and the drafter is built for such steps.
MAX_ASSISTANT_TOKENS = 64

# The automaton is sized for up to this many new tokens at the start (it grows past them).
_MAX_RESERVED_TOKENS = 1 << 16
_request_ids = itertools.count()  # the requests this module starts in a drafter


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
    """transformers' candidate generator over a :class:`~saspec.drafter.Drafter` (batch 1).

    Implements transformers' ``CandidateGenerator`` interface (duck-typed, so
    this module does not import transformers): ``get_candidates`` and
    ``update_candidate_strategy``. It is engine glue only: each step it hands
    ``drafter`` the tokens the sequence gained since the last step (one
    :meth:`Drafter.step <saspec.drafter.Drafter.step>`) and runs the source the
    drafter chose; the drafter keeps the policy, the offers and their scores,
    the step timings and the assistant's acceptance and cost. The sequence is
    the drafter's request ``request_id`` from construction to :meth:`end` or
    :meth:`close`.

    The first step drafts from the prompt (its candidates are verified with the
    prefill): the request starts ``before_prefill`` (see
    :meth:`Drafter.start <saspec.drafter.Drafter.start>`), so its first step hands
    over no tokens and drafts from the whole prompt. The first forward (the
    prefill) is not timed.

    With the drafter's policy (``drafter.policy`` not None) each step's source
    and length are the policy's: the automaton's draft, the assistant's
    (``fallback``, run with ``num_assistant_tokens`` set to the policy's length;
    its calls are timed on the drafter's clock and handed to
    :meth:`Drafter.time_neural <saspec.drafter.Drafter.time_neural>`, and the
    target forward is timed from after them) or none. With a fixed rule the
    automaton drafts where the drafter offers a draft (its match at least the
    drafter's ``min_match``, cut by its length rule), the assistant elsewhere,
    and the assistant drafts at the first step (transformers' assisted
    decoding starts it on the prompt), following transformers' own schedule of
    ``num_assistant_tokens`` clamped to the drafter's widest step (its
    ``max_step_tokens`` less one).

    Args:
        input_ids: int64 tensor [1, L], the prompt.
        drafter: the :class:`~saspec.drafter.Drafter` to drive (CPU; any K).
        max_length: transformers' ``generation_config.max_length`` (prompt
            included); drafts never reach past ``max_length - 1``.
        eos_token_ids: EOS ids; an automaton draft ends at its first EOS.
        fallback: transformers' candidate generator for the draft model, or None.
        options: the request's :class:`~saspec.options.DraftOptions` (or a
            mapping of them; the drafter checks it).
        request_id: the request's id in ``drafter`` (default: a new one).

    Raises:
        KeyError: ``request_id`` is started in ``drafter`` and not finished.
        TypeError, ValueError: a bad option (named).

    ``stats`` counts steps, drafted and accepted tokens per draft source
    (``"sa"``, ``"pool"``: the automaton's draft from the drafter's pool,
    ``"assistant"``, ``"none"``).
    """

    requires_model_outputs = False

    def __init__(
        self,
        input_ids: torch.Tensor,
        *,
        drafter: Drafter,
        max_length: int,
        eos_token_ids: list[int],
        fallback: Any = None,
        options: Any = None,
        request_id: Any = None,
    ) -> None:
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must be a saspec.drafter.Drafter, got {type(drafter).__name__}")
        self.drafter = drafter
        self.max_length = int(max_length)
        self.eos = set(int(e) for e in eos_token_ids)
        self.fallback = fallback
        self.request_id = request_id if request_id is not None else ("saspec.integrations.hf", next(_request_ids))
        prompt = input_ids[0].cpu().numpy()
        new_tokens = min(max(0, self.max_length - int(prompt.shape[0])), _MAX_RESERVED_TOKENS)
        drafter.start(self.request_id, prompt, options, max_new_tokens=new_tokens, before_prefill=True)
        self._open = True
        opts = drafter.options(self.request_id)
        # The request's cap on a step's draft holds for the assistant too (None: none of its own).
        self._cap = 0 if not opts.drafts else opts.max_draft_tokens
        self._fed = int(prompt.shape[0])  # tokens the drafter holds
        self._steps = 0
        self._fallback_started = False
        self._source = "none"
        self._drafted = 0
        self.stats: dict[str, dict[str, int]] = {
            s: {"steps": 0, "drafted": 0, "accepted": 0} for s in ("sa", "pool", "assistant", "none")
        }

    def _step(self, input_ids: torch.Tensor, **kwargs: Any) -> DraftBatch:
        """Hand the drafter the tokens of ``input_ids`` [1, L] it has not seen (one step)."""
        new = input_ids[0, self._fed:].cpu().numpy().astype(np.int32)
        # The last forward verified the last step's drafts and one token of its own; the first is the prefill.
        timing = {"seconds": math.nan} if self._steps == 1 else {}
        batch = self.drafter.step([self.request_id], new.reshape(1, -1), np.array([new.shape[0]], np.int32),
                                  step_tokens=1 + self._drafted if self._steps else 0, **timing, **kwargs)
        self._fed = int(input_ids.shape[1])
        self._steps += 1
        return batch

    def get_candidates(self, input_ids: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``input_ids`` [1, L] int64 -> (``input_ids`` followed by the drafts,
        [1, L + n] int64; draft logits [1, n, vocab] float from the fallback, or None)."""
        import torch

        length = int(input_ids.shape[1])
        room = self.max_length - length - 1  # the target adds one token of its own
        assistant = self.fallback is not None and room > 0
        behind = max(length - _cached(self.fallback), 1) if assistant else 0  # tokens the assistant has not read
        d = self.drafter
        batch = self._step(input_ids, width=self.max_length - 1, neural_k=d.k if assistant else 0,
                           neural_behind=behind, remaining=self.max_length - length)
        source, n = int(batch.sources[0]), int(batch.lengths[0])
        if d.policy is None:  # a fixed rule: the automaton's draft where it offers one, else the assistant
            assistant = assistant and self._cap != 0
            source = NEURAL if assistant and (source != AUTOMATON or not self._fallback_started) else source
        if source == AUTOMATON:
            draft = batch.row(0)
            for i, t in enumerate(draft):
                if t in self.eos:
                    draft = draft[: i + 1]
                    break
            self._source, self._drafted = "pool" if d.drafts.source[0] else "sa", len(draft)
            tail = torch.tensor([draft], dtype=input_ids.dtype, device=input_ids.device)
            return torch.cat([input_ids, tail], dim=1), None
        if source == NEURAL:
            return self._assist(input_ids, n if d.policy is not None else None, behind, **kwargs)
        self._source, self._drafted = "none", 0
        return input_ids, None

    def _assist(self, input_ids: torch.Tensor, n: int | None, behind: int,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the assistant for ``n`` tokens (None: its own schedule, within the drafter's widest step and
        the request's cap); hand its time and its draft's length to the drafter."""
        d, fb = self.drafter, self.fallback
        widest = d.max_step_tokens - 1  # a step gains its drafts and one token of its own
        cap = widest if self._cap is None else min(self._cap, widest)
        if hasattr(fb, "num_assistant_tokens"):  # no draft forwards past what the step may take
            fb.num_assistant_tokens = n if n is not None else max(min(fb.num_assistant_tokens, cap), 1)
        if not self._fallback_started:
            _mask_to(fb, int(input_ids.shape[1]))
            self._fallback_started = True
        t0 = d.clock()
        ids, logits = fb.get_candidates(input_ids, **kwargs)
        seconds = d.clock() - t0
        if ids.shape[1] - input_ids.shape[1] > cap:
            ids = ids[:, : input_ids.shape[1] + cap]
            logits = logits[:, :cap] if logits is not None else None
        drafted = int(ids.shape[1] - input_ids.shape[1])
        self._source, self._drafted = "assistant", drafted
        if drafted:
            d.time_neural(seconds, read=behind, drafted=drafted)
        if n is not None and drafted != n:
            d.neural_drafted([drafted])
        d.mark_forward()  # the target forward starts now: the assistant's time is not the step's
        return ids, logits

    def update_candidate_strategy(self, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: int) -> None:
        """Count the step's outcome per source; the assistant adapts after its own steps."""
        st = self.stats[self._source]
        st["steps"] += 1
        st["drafted"] += self._drafted
        st["accepted"] += int(num_matches)
        if self._source == "assistant":
            self.fallback.update_candidate_strategy(input_ids, scores, num_matches)

    def end(self, output_ids: torch.Tensor) -> None:
        """The sequence ended as ``output_ids`` [1, T]: hand the drafter the tokens of its last step (one
        step with no room left, which times the last forward, scores the last offer and drafts nothing)
        and finish the request (its whole text joins the drafter's pool, if any)."""
        if self._open and self._steps and int(output_ids.shape[1]) > self._fed:
            self._step(output_ids, width=int(output_ids.shape[1]), remaining=0)
        self.close()

    def close(self) -> None:
        """Finish the request in the drafter (idempotent)."""
        if self._open:
            self._open = False
            self.drafter.finish(self.request_id)


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
    saspec_k: int | None = None,
    saspec_threshold: int | None = None,
    saspec_length_rule: str | None = None,
    saspec_length_scale: float | None = None,
    saspec_policy: bool | PolicySettings | None = None,
    saspec_fast_verify: bool = True,
    saspec_pool: RequestPool | None = None,
    saspec_options: Any = None,
    saspec_drafter: Drafter | None = None,
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
            stateful model, an assistant with another vocabulary, a ``saspec_*``
            setting out of range or of the wrong type, a bad ``saspec_options``
            value, or ``saspec_drafter`` with settings of its own.
        TypeError: a ``saspec_options`` entry of the wrong type, or a
            ``saspec_drafter`` that is not a ``Drafter``.
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
    eos = generation_config._eos_token_tensor
    eos_ids = [] if eos is None else [int(e) for e in eos.reshape(-1).tolist()]
    settings = {"saspec_k": saspec_k, "saspec_threshold": saspec_threshold, "saspec_length_rule": saspec_length_rule,
                "saspec_length_scale": saspec_length_scale, "saspec_policy": saspec_policy, "saspec_pool": saspec_pool}
    if saspec_drafter is not None:
        if not isinstance(saspec_drafter, Drafter):
            raise TypeError(f"saspec_drafter must be a saspec.drafter.Drafter, got {type(saspec_drafter).__name__}")
        given = [name for name, value in settings.items() if value is not None]
        if given:
            raise ValueError(f"saspec_drafter brings its own settings: drop {', '.join(given)} (or saspec_drafter)")
        drafter = saspec_drafter
    else:
        device = getattr(getattr(model, "device", None), "type", "cpu")
        drafter = drafter_for(device, assistant_model is not None, **settings)
    made: list[SACandidateGenerator] = []
    original = model._get_candidate_generator  # bound method (or an instance override)

    def candidate_generator(**kwargs: Any) -> SACandidateGenerator:
        fallback = original(**kwargs) if kwargs.get("assistant_model") is not None and options.drafts else None
        gen = SACandidateGenerator(kwargs["input_ids"], drafter=drafter, max_length=generation_config.max_length,
                                   eos_token_ids=eos_ids, fallback=fallback, options=options)
        made.append(gen)
        return gen

    stop = _StopPerToken(stopping_criteria, int(input_ids.shape[1]), streamer)
    had_override = "_get_candidate_generator" in vars(model)
    plain = [m for m in model.modules() if getattr(m, "_saspec_small_rows", None) is None] if saspec_fast_verify else []
    routed: list[Any] = []
    try:
        model._get_candidate_generator = candidate_generator
        if saspec_fast_verify:
            fast_small_linears(model)
        routed = [m for m in plain if getattr(m, "_saspec_small_rows", None) is not None]
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
        for gen in made:  # the drafter gets the whole output, the last step's tokens too
            gen.end(getattr(out, "sequences", out))
    finally:
        if had_override:
            model._get_candidate_generator = original
        else:
            del model._get_candidate_generator
        for gen in made:
            gen.close()
        if saspec_drafter is None:
            drafter.close()
        for mod in routed:  # undo this call's routing
            del mod.forward, mod._saspec_small_rows
    if streamer is not None:
        streamer.end()
    return out


def drafter_for(device: str = "cpu", assistant: bool = False, *, saspec_k: int | None = None,
                saspec_threshold: int | None = None, saspec_length_rule: str | None = None,
                saspec_length_scale: float | None = None, saspec_policy: bool | PolicySettings | None = None,
                saspec_pool: RequestPool | None = None, **drafter_kwargs: Any) -> Drafter:
    """The :class:`~saspec.drafter.Drafter` that ``generate`` builds for a call with these ``saspec_*``
    keywords (None: the default; see the module doc): the policy with its prior cost shape by the model's
    ``device`` type (``"cpu"``: compute-bound, any other: memory-bound), or the fixed rules; with an
    ``assistant`` and the fixed rules, steps as wide as the assistant's drafts (:data:`MAX_ASSISTANT_TOKENS`).
    Build one to pass as ``saspec_drafter`` (to keep it across calls or read its ``stats()``); the caller
    closes it.

    Args:
        device: the target model's device type (``model.device.type``).
        assistant: whether the calls have an ``assistant_model``.
        drafter_kwargs: more :class:`~saspec.drafter.Drafter` arguments (``clock``, ``cost``, ``log``, ...).

    Raises:
        ValueError: a setting out of range or of the wrong type (named as the ``generate`` keyword).
    """
    k = DEFAULT_K if saspec_k is None else saspec_k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"saspec_k must be an int >= 1, got {k!r}")
    threshold = saspec_threshold if saspec_threshold is not None else (HYBRID_THRESHOLD if assistant else 1)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"saspec_threshold must be an int >= 1, got {threshold!r}")
    rule = DEFAULT_LENGTH_RULE if saspec_length_rule is None else saspec_length_rule
    scale = DEFAULT_LENGTH_SCALE if saspec_length_scale is None else saspec_length_scale
    check_length_rule(rule, scale)
    policy = True if saspec_policy is None else saspec_policy
    if not isinstance(policy, (bool, PolicySettings)):
        raise ValueError("saspec_policy must be True, False or a saspec.policy.PolicySettings (a Drafter of your "
                         f"own goes in saspec_drafter), got {type(policy).__name__}")
    if saspec_pool is not None and not isinstance(saspec_pool, RequestPool):
        raise ValueError(f"saspec_pool must be a saspec.RequestPool, got {type(saspec_pool).__name__}")
    if policy is False:
        wide = {"max_step_tokens": max(k, MAX_ASSISTANT_TOKENS) + 1} if assistant else {}
        return Drafter(k, device=device, length_rule=rule, length_scale=float(scale), min_match=threshold,
                       pool=saspec_pool, **wide, **drafter_kwargs)
    # The policy weighs every match the automaton offers (min_match 1) on its evidence.
    return Drafter(k, device=device, min_match=1, pool=saspec_pool,
                   policy_settings=policy if isinstance(policy, PolicySettings) else None, **drafter_kwargs)


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
