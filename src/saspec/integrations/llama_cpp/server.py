"""llama-cpp-python's OpenAI server with saspec's speculative loop and drafters.

::

    python -m saspec.integrations.llama_cpp.server --model target.gguf --n_ctx 8192 --n_threads 2 \\
        [--saspec-draft-model draft.gguf] [--saspec-k 16] [--saspec-threshold 4] \\
        [--saspec-pool-tokens 1000000] [--saspec-draft-k 8] [--saspec-p-min 0.75] [--saspec-no-policy]

Every option of ``python -m llama_cpp.server`` works as there (they are passed to its
``main``); the ``--saspec-*`` options are saspec's:

* ``--saspec-k``: the automaton's most draft tokens per step (default 32).
* ``--saspec-draft-model PATH``: a small GGUF draft model (same vocabulary) beside the
  automaton (``--saspec-draft-k`` tokens at most, stopping below probability
  ``--saspec-p-min``). It is loaded with the target's ``n_ctx``, ``n_batch``,
  ``n_threads`` and ``n_gpu_layers``.
* The drafting choice: by default saspec's drafting policy (one per served model, in
  its :class:`saspec.drafter.Drafter`, learning across requests) chooses each step's
  source (the automaton, the draft model, or none) and draft length from timings of
  every target decode and draft-model call, so the draft model drafts only where it pays.
  ``--saspec-no-policy`` turns the policy off for the fixed rules: the per-match rule
  (``ceil(2 m)`` tokens after a match of ``m >= 3``), and with a draft model, the
  automaton where its match is at least ``--saspec-threshold`` tokens (default 4),
  the draft model otherwise (``--saspec-threshold`` is used only then).
* ``--saspec-pool-tokens N``: memory across requests (a :class:`saspec.RequestPool` of
  at most N tokens shared by every request; 0, the default: off).

Per-request options (``saspec.options``) travel in the request body of
``/v1/completions`` and ``/v1/chat/completions``, as a field ``"saspec"``::

    {"prompt": "...", "max_tokens": 256, "saspec": {"enabled": false}}
    {"prompt": "...", "saspec": {"max_draft_tokens": 2, "hints": [1234, 567, 89]}}

or as flat fields ``saspec_enabled``, ``saspec_max_draft_tokens``, ``saspec_hints``
(``saspec.options.options_from_fields``). ``enabled: false``: the request gets no draft
token; ``max_draft_tokens``: no step verifies more draft tokens for it; ``hints``: token
ids (below the vocabulary size) its automaton drafts may copy from, e.g. a file the
answer edits that the prompt does not hold. A bad option (unknown key, wrong type,
negative cap, ids out of range) is an HTTP 400 naming it, before the request is
queued. Requests that fall back to llama-cpp-python's own loop (below) get no drafts
at all.

How: the launcher wraps ``llama_cpp.server.model.LlamaProxy.load_llama_from_model_settings``
at run time (no file of the installed package changes) so that each ``Llama`` it
builds gets a ``generate`` method that runs saspec's loop (``loop.Speculator``) with the
same sampler chain: greedy, or temperature with top-k, top-p, min-p and the
repeat/frequency/presence penalties. Requests that need what the loop does not do
(grammars, logits processors, stopping criteria, mirostat, typical-p) run
llama-cpp-python's own ``generate``, unchanged. Requests are served one at a time, as
llama-cpp-python's server does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, Sequence

from ...options import DraftOptions, options_from_fields, parse_options
from ...pool import RequestPool
from ...rules import HYBRID_THRESHOLD
from .drafter import DEFAULT_K, DEFAULT_MODEL_K, DEFAULT_P_MIN, LlamaCppHybridDrafter, ModelDrafter, SADraftModel
from .loop import Sampler, Speculator


@dataclass
class SaspecSettings:
    """saspec's part of the server's configuration (see the module docstring)."""

    k: int = DEFAULT_K
    draft_model: str | None = None
    threshold: int = HYBRID_THRESHOLD
    draft_k: int = DEFAULT_MODEL_K
    p_min: float = DEFAULT_P_MIN
    pool_tokens: int = 0
    policy: bool = True


def parse_saspec_args(argv: Sequence[str]) -> tuple[SaspecSettings, list[str]]:
    """Split ``argv`` into saspec's settings and the rest (for ``llama_cpp.server``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--saspec-k", type=int, default=DEFAULT_K)
    p.add_argument("--saspec-draft-model", default=None)
    p.add_argument("--saspec-threshold", type=int, default=HYBRID_THRESHOLD)
    p.add_argument("--saspec-draft-k", type=int, default=DEFAULT_MODEL_K)
    p.add_argument("--saspec-p-min", type=float, default=DEFAULT_P_MIN)
    p.add_argument("--saspec-pool-tokens", type=int, default=0)
    p.add_argument("--saspec-no-policy", action="store_true")
    ns, rest = p.parse_known_args(list(argv))
    if ns.saspec_pool_tokens < 0:
        raise ValueError(f"--saspec-pool-tokens must be >= 0, got {ns.saspec_pool_tokens}")
    s = SaspecSettings(ns.saspec_k, ns.saspec_draft_model, ns.saspec_threshold, ns.saspec_draft_k, ns.saspec_p_min,
                       ns.saspec_pool_tokens, not ns.saspec_no_policy)
    return s, rest


#: The saspec options of the request being served in this context (None: the defaults); set by
#: :class:`OptionsMiddleware` from the request body, or by :func:`request_options`.
_REQUEST_OPTIONS: ContextVar[DraftOptions | None] = ContextVar("saspec_request_options", default=None)


@contextlib.contextmanager
def request_options(options: Any) -> Iterator[DraftOptions]:
    """Serve the requests made inside the block (``create_completion`` and the like on a ``Llama`` given
    saspec's ``generate``, in this thread or task) with these drafting options: a mapping of
    ``enabled``, ``max_draft_tokens``, ``hints`` or a ``saspec.options.DraftOptions``.

    Raises:
        TypeError, ValueError: a bad option, naming it (before anything runs).
    """
    opts = parse_options(options, "saspec options")
    token = _REQUEST_OPTIONS.set(opts)
    try:
        yield opts
    finally:
        _REQUEST_OPTIONS.reset(token)


#: What llama-cpp-python's ``Llama.generate`` takes that the loop honours; other values fall back.
_FALLBACK_DEFAULTS = {"typical_p": 1.0, "mirostat_mode": 0, "logits_processor": None, "stopping_criteria": None,
                      "grammar": None, "reset": True}


class SaspecGenerate:
    """A drop-in for one ``Llama``'s ``generate`` that runs saspec's loop.

    Args:
        llama: the target ``llama_cpp.Llama``.
        drafter: what :class:`~.loop.Speculator` takes.
        policy: :class:`~.loop.Speculator`'s ``policy`` (default True: saspec's policy).

    Calling it takes ``Llama.generate``'s arguments and yields tokens one at a
    time, with the drafting options of the request being served
    (:func:`request_options`); what the loop cannot honour goes to the
    original ``generate``.
    """

    def __init__(self, llama: Any, drafter: Any, policy: Any = True) -> None:
        self.llama = llama
        self.original = llama.generate
        self.spec = Speculator(llama, drafter, policy=policy)
        self.requests = 0
        self.fallbacks = 0

    def __call__(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: Any = None) -> Iterator[int]:
        given = {"typical_p": typical_p, "mirostat_mode": mirostat_mode, "logits_processor": logits_processor,
                 "stopping_criteria": stopping_criteria, "grammar": grammar, "reset": reset}
        self.requests += 1
        if given != _FALLBACK_DEFAULTS or temp < 0:
            self.fallbacks += 1
            yield from self.original(tokens, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
                                     repeat_penalty=repeat_penalty, reset=reset, frequency_penalty=frequency_penalty,
                                     presence_penalty=presence_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                                     mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, penalize_nl=penalize_nl,
                                     logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                                     grammar=grammar)
            return
        seed = getattr(self.llama, "_seed", None)  # what Llama.set_seed set for this request
        sampler = Sampler(temp, max(int(top_k), 0), top_p if 0 < top_p <= 1 else 1.0, min(max(min_p, 0.0), 0.999),
                          repeat_penalty, frequency_penalty, presence_penalty,
                          int(getattr(self.llama, "last_n_tokens_size", 64)), seed=seed)
        with contextlib.closing(self.spec.steps(tokens, sampler, options=_REQUEST_OPTIONS.get())) as steps:
            for new in steps:
                yield from new


#: The request paths whose JSON body may carry saspec options.
OPTION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/engines/copilot-codex/completions")

_Asgi = Callable[..., Awaitable[None]]


class OptionsMiddleware:
    """ASGI middleware for llama-cpp-python's server: each completion request's saspec options from its
    JSON body (the ``"saspec"`` field or the flat ``saspec_*`` ones, ``saspec.options.options_from_fields``),
    an HTTP 400 naming a bad one (the request goes no further), else the request served with them
    (:func:`request_options`'s context, which the server's worker threads inherit).

    Args:
        app: the ASGI app it wraps.
        vocab: returns the vocabulary size hint ids must stay below (the smallest of the models
            served), or None where none is loaded yet (the loop then checks them).
    """

    def __init__(self, app: _Asgi, vocab: Callable[[], int | None] = lambda: None) -> None:
        self.app, self.vocab = app, vocab

    async def __call__(self, scope: dict, receive: _Asgi, send: _Asgi) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in OPTION_PATHS:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body arrived
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            opts = self.options(body)
        except (TypeError, ValueError) as e:
            await _send_json(send, 400, {"error": {"message": str(e), "type": "invalid_request_error",
                                                   "param": "saspec", "code": None}})
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        token = _REQUEST_OPTIONS.set(opts)
        try:
            await self.app(scope, replay, send)
        finally:
            _REQUEST_OPTIONS.reset(token)

    def options(self, body: bytes) -> DraftOptions | None:
        """The options in a request body (None: it is not a JSON object; the server answers that itself).

        Raises:
            TypeError, ValueError: a bad option, naming it.
        """
        try:
            fields = json.loads(body)
        except ValueError:
            return None
        if not isinstance(fields, dict):
            return None
        opts = options_from_fields(fields)
        n_vocab = self.vocab()
        if opts.hints is not None and n_vocab is not None and int(opts.hints.max()) >= n_vocab:
            raise ValueError(f"saspec options: hints must be token ids below the vocabulary size {n_vocab}")
        return opts


async def _send_json(send: _Asgi, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def attach(llama: Any, settings: SaspecSettings, pool: RequestPool | None = None, draft: Any = None) -> SaspecGenerate:
    """Give ``llama`` saspec's ``generate`` (an instance attribute: the class is unchanged).

    Args:
        llama: the target ``llama_cpp.Llama``.
        settings: saspec's settings.
        pool: the cross-request pool to share (None: none).
        draft: the draft ``llama_cpp.Llama`` for the hybrid (None: the automaton alone).

    Returns:
        the :class:`SaspecGenerate` now at ``llama.generate``.
    """
    sa = SADraftModel(settings.k, pool=pool)
    drafter: Any = sa
    if draft is not None:
        drafter = LlamaCppHybridDrafter(sa, ModelDrafter(draft, settings.draft_k, settings.p_min), settings.threshold)
    gen = SaspecGenerate(llama, drafter, settings.policy)
    llama.generate = gen
    return gen


def describe(settings: SaspecSettings) -> str:
    """One line naming the drafter a server's models get."""
    what = f"automaton K {settings.k}"
    if settings.draft_model:
        what += f", draft model {settings.draft_model}"
        what += ", by saspec's policy" if settings.policy else f" below a match of {settings.threshold}"
    elif settings.policy:
        what += ", by saspec's policy"
    return what + (f", pool of {settings.pool_tokens} tokens" if settings.pool_tokens else "")


def install(settings: SaspecSettings) -> list[SaspecGenerate]:
    """Make llama-cpp-python's server give every ``Llama`` it loads saspec's ``generate``, and every app
    its ``create_app`` makes the :class:`OptionsMiddleware` (call it before the server's ``__main__``
    imports ``create_app``, as :func:`main` does).

    Returns:
        the :class:`SaspecGenerate` of each model loaded, appended as the server loads them.
    """
    import llama_cpp
    from llama_cpp.server import app as server_app
    from llama_cpp.server.model import LlamaProxy

    pool = RequestPool(settings.pool_tokens) if settings.pool_tokens else None
    attached: list[SaspecGenerate] = []
    load = LlamaProxy.load_llama_from_model_settings

    def load_with_saspec(model_settings: Any) -> Any:
        if model_settings.draft_model is not None:
            raise ValueError("give --draft_model (llama-cpp-python's prompt lookup) or saspec's options, not both")
        llama = load(model_settings)
        draft = None
        if settings.draft_model is not None:
            draft = llama_cpp.Llama(model_path=settings.draft_model, n_ctx=llama.n_ctx(), n_batch=llama.n_batch,
                                    n_threads=model_settings.n_threads, n_threads_batch=model_settings.n_threads_batch,
                                    n_gpu_layers=model_settings.n_gpu_layers, verbose=model_settings.verbose)
        attached.append(attach(llama, settings, pool, draft))
        print(f"saspec: {model_settings.model} decodes with saspec's loop ({describe(settings)})", file=sys.stderr)
        return llama

    LlamaProxy.load_llama_from_model_settings = staticmethod(load_with_saspec)
    create = server_app.create_app

    def vocab() -> int | None:
        return min((g.spec.ctx.n_vocab for g in attached), default=None)

    def create_with_saspec(*args: Any, **kwargs: Any) -> Any:
        app = create(*args, **kwargs)
        app.add_middleware(OptionsMiddleware, vocab=vocab)
        return app

    server_app.create_app = create_with_saspec
    entry = sys.modules.get("llama_cpp.server.__main__")
    if entry is not None:  # imported already: it holds create_app by name
        entry.create_app = create_with_saspec
    return attached


def main(argv: Sequence[str] | None = None) -> None:
    """Parse saspec's options, install the hook, run ``llama_cpp.server``'s ``main`` with the rest."""
    settings, rest = parse_saspec_args(sys.argv[1:] if argv is None else argv)
    install(settings)
    from llama_cpp.server.__main__ import main as server_main

    sys.argv = [sys.argv[0]] + rest
    server_main()


if __name__ == "__main__":
    main()
