"""saspec's vLLM plugin: request ids for the ``custom_class`` drafter, and the hybrid.

vLLM loads ``register`` from the package's ``vllm.general_plugins`` entry
point in each of its processes. It wraps a property and four methods, which
leave vLLM's behaviour unchanged unless a saspec drafter is configured:

* ``VllmConfig.use_v2_model_runner``: saspec patches the V1 model runner
  (``vllm/v1/worker/gpu_model_runner.py``), not Model Runner V2
  (``vllm/v1/worker/gpu/model_runner.py``), which vLLM picks wherever Triton
  is usable and every configured feature is V2-supported (``draft_model``,
  EAGLE and MTP are, so the hybrid would land there and draft without the
  automaton, silently). Where a saspec drafter is configured V1 is chosen
  instead; where V2 is forced (``VLLM_USE_V2_MODEL_RUNNER=1``, or a feature
  only V2 has) the configuration is refused with an error saying so;
* ``VllmConfig.__post_init__``: for the hybrid (``hybrid_config``), async
  scheduling is turned off before vLLM would turn it on (async scheduling
  schedules K placeholder drafts per request; SA drafts vary in length);
* ``GPUModelRunner._update_states`` (the start of each step, before the
  forward): the scheduler's new requests start building their automata on a
  background thread while vLLM prefills them, and finished ones are freed;
* ``GPUModelRunner.propose_draft_token_ids``: the ``custom_class`` drafter is
  told the request id of each row before vLLM calls it; the hybrid drafts
  from the automaton first, runs the neural drafter with its K (or with K = 0,
  or, for a draft model, not at all: see ``hybrid``) and merges the two;
* for the hybrid with a draft model, its proposer's ``propose`` (on the
  instance): a step the hybrid skips runs no draft forward, and the next one
  reads what was skipped (``catch_up``);
* ``InputProcessor._validate_params`` (the front end, when a request is
  admitted): a request's saspec options (``SamplingParams.extra_args``, see
  ``saspec.options.options_from_fields``) are checked there, so a bad one is refused with
  vLLM's validation error (HTTP 400 from the OpenAI server) before it reaches
  a worker; the workers still log and turn off drafting for a request whose
  options they cannot use.

vLLM's CPU runner subclasses ``GPUModelRunner``, so both backends get the same
code. The wrapped internals are those of :data:`config.TESTED_VLLM`; on any
other version ``register`` patches nothing, and the hybrid refuses to start.
This module imports no numba until a runner drafts: vLLM's CPU worker scans the
loaded modules when it starts and cannot scan numba's.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from .config import (HYBRID_ENV, PROPOSER_CLASS, check_vllm_version, hybrid_settings,
                     tensor_parallel_ranks)

logger = logging.getLogger(__name__)

_PATCHED = "_saspec_patched"
_LOGGED_V1: set[str] = set()  # drafters whose choice of the V1 runner this process has logged
_STATE = "_saspec_drafter"  # runner attribute: the HybridDrafter, the SAProposer, or None (neither)


def register() -> None:
    """vLLM's plugin entry point (idempotent)."""
    import vllm

    try:
        check_vllm_version(vllm.__version__)
    except RuntimeError as e:
        if os.environ.get(HYBRID_ENV, "").strip():  # a hybrid was asked for: say why it cannot run
            raise
        logger.warning("saspec plugin inactive: %s", e)
        return
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, _PATCHED, False):
        return
    try:
        from vllm.v1.engine.input_processor import InputProcessor
    except ImportError:  # pragma: no cover  (the tested version has it)
        InputProcessor = None
    if InputProcessor is not None:
        InputProcessor._validate_params = _wrap_validate_params(InputProcessor._validate_params)
    VllmConfig.use_v2_model_runner = _wrap_use_v2(VllmConfig.use_v2_model_runner)
    VllmConfig.__post_init__ = _wrap_post_init(VllmConfig.__post_init__)
    GPUModelRunner._update_states = _wrap_update_states(GPUModelRunner._update_states)
    GPUModelRunner.propose_draft_token_ids = _wrap_propose(GPUModelRunner.propose_draft_token_ids)
    setattr(GPUModelRunner, _PATCHED, True)


def saspec_drafter(speculative_config: Any) -> str | None:
    """Which saspec drafter ``speculative_config`` asks for: ``"hybrid"`` (``hybrid_config``),
    ``"custom_class drafter"`` (``proposer_config``), or None (no saspec drafter).

    Raises:
        ValueError: ``$SASPEC_VLLM_HYBRID`` is set but is not what ``hybrid_config`` writes.
    """
    if hybrid_settings(speculative_config) is not None:  # None for a None config
        return "hybrid"
    if getattr(speculative_config, "method", None) == "custom_class" and \
            getattr(speculative_config, "model", None) == PROPOSER_CLASS:
        return "custom_class drafter"
    return None


def _v2_forced_by(config: Any) -> str | None:
    """What makes vLLM 0.32 use Model Runner V2 whatever else is configured (its
    ``use_v2_model_runner`` rules before the Triton check), or None."""
    import vllm.envs as envs

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        return "VLLM_USE_V2_MODEL_RUNNER=1"
    if getattr(getattr(config, "attention_config", None), "hisparse_config", None) is not None:
        return "HiSparse attention, which only Model Runner V2 runs"
    if getattr(config, "watermark_config", None) is not None:
        return "watermarking, which only Model Runner V2 runs"
    return None


def _wrap_use_v2(prop: property) -> property:
    fget = prop.fget

    @functools.wraps(fget)
    def use_v2_model_runner(self: Any) -> bool:
        v2 = fget(self)
        what = saspec_drafter(getattr(self, "speculative_config", None)) if v2 else None
        if what is None:
            return v2
        forced = _v2_forced_by(self)
        if forced is not None:
            raise ValueError(
                f"saspec's {what} runs only in vLLM's V1 model runner (vllm/v1/worker/gpu_model_runner.py, the one "
                f"saspec's plugin patches), but {forced} selects Model Runner V2, where saspec would not draft. "
                "Unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0) and drop the V2-only feature, or run without saspec")
        if what not in _LOGGED_V1:  # the property is read many times per configuration
            _LOGGED_V1.add(what)
            logger.info("saspec: the %s runs in vLLM's V1 model runner (Model Runner V2 would leave it out)", what)
        return False

    return property(use_v2_model_runner)


def _wrap_post_init(post_init: Any) -> Any:
    @functools.wraps(post_init)
    def __post_init__(self: Any) -> None:
        if hybrid_settings(self.speculative_config) is not None:
            if self.scheduler_config.async_scheduling:
                raise ValueError("saspec's hybrid needs async scheduling off (SA drafts vary in length per row); "
                                 "leave async_scheduling unset or False")
            self.scheduler_config.async_scheduling = False
        post_init(self)

    return __post_init__


def _drafter(runner: Any) -> Any:
    """The runner's saspec drafter (made on first use), or None where saspec does not draft."""
    if _STATE in runner.__dict__:
        return runner.__dict__[_STATE]
    spec = runner.speculative_config
    drafter = None
    settings = hybrid_settings(spec)
    if settings is not None:
        from .hybrid import HybridDrafter

        capacity = getattr(runner.drafter, "max_num_tokens", None) \
            if settings.method == "draft_model" and settings.catch_up else None
        drafter = HybridDrafter(settings, runner.max_model_len, tensor_parallel_ranks(runner),
                                catch_up_capacity=capacity)
        if drafter.catch_up is not None:
            runner.drafter.propose = _catch_up_propose(runner.drafter, drafter)
    elif getattr(spec, "method", None) == "custom_class" and hasattr(getattr(runner, "drafter", None), "name_rows"):
        drafter = runner.drafter
    runner.__dict__[_STATE] = drafter
    return drafter


def _wrap_validate_params(validate: Any) -> Any:
    @functools.wraps(validate)
    def _validate_params(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        out = validate(self, params, *args, **kwargs)
        extra = getattr(params, "extra_args", None)
        if extra and saspec_drafter(getattr(self, "speculative_config", None)) is not None:
            from ...options import options_from_fields  # numpy only: the front end loads no numba

            try:
                options_from_fields(extra)
            except (TypeError, ValueError) as e:
                # vLLM's error for a request it refuses: HTTP 400 from the OpenAI server (a bare ValueError
                # is an internal error there, HTTP 500 without the message, which names the options)
                from vllm.exceptions import VLLMValidationError

                raise VLLMValidationError(str(e), parameter="extra_args") from None
        return out

    return _validate_params


def _wrap_update_states(update_states: Any) -> Any:
    @functools.wraps(update_states)
    def _update_states(self: Any, scheduler_output: Any) -> Any:
        out = update_states(self, scheduler_output)
        drafter = _drafter(self)
        if drafter is not None:
            new = [(r.req_id, r.prompt_token_ids, getattr(r.sampling_params, "max_tokens", None),
                    getattr(r.sampling_params, "extra_args", None))
                   for r in scheduler_output.scheduled_new_reqs if r.prompt_token_ids is not None]
            drafter.schedule(new, scheduler_output.finished_req_ids,
                             getattr(scheduler_output.scheduled_cached_reqs, "resumed_req_ids", ()))
        return out

    return _update_states


def _wrap_propose(propose: Any) -> Any:
    @functools.wraps(propose)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any,
                                **kwargs: Any) -> Any:
        drafter = _drafter(self)
        if drafter is None:
            return propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        if drafter is self.drafter:  # custom_class: name the rows, vLLM calls the drafter as usual
            # the forward just run processed these tokens, prefill chunks included: the policy times it at that
            drafter.name_rows(self.input_batch.req_ids, getattr(scheduler_output, "total_num_scheduled_tokens", 0))
            return propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        return _propose_hybrid(self, drafter, propose, scheduler_output, sampled_token_ids, args, kwargs)

    return propose_draft_token_ids


def _propose_hybrid(runner: Any, hybrid: Any, propose: Any, scheduler_output: Any, sampled_token_ids: Any,
                    args: tuple, kwargs: dict) -> list[list[int]]:
    import numpy as np

    batch = runner.input_batch
    b = batch.num_reqs
    sampled = _as_numpy(sampled_token_ids, b)
    discard = runner.discard_request_mask.np[:b]
    prefill_end = None
    if hybrid.catch_up is not None and discard.any():  # a prefill chunk's draft forward ends where the chunk ends
        scheduled_tokens = scheduler_output.num_scheduled_tokens
        prefill_end = batch.num_computed_tokens_cpu[:b] + np.fromiter(
            (scheduled_tokens.get(r, 0) for r in batch.req_ids[:b]), np.int64, b)
    count, draft, k = hybrid.sa_step(batch.req_ids[:b], sampled, discard, batch.num_tokens_no_spec[:b],
                                     batch.token_ids_cpu, prefill_end,
                                     getattr(scheduler_output, "total_num_scheduled_tokens", 0))
    scheduled = scheduler_output.num_spec_tokens_to_schedule
    scheduler_output.num_spec_tokens_to_schedule = min(scheduled, k)  # the neural drafter's K, or 0
    t0 = time.perf_counter()
    try:
        neural = propose(runner, scheduler_output, sampled_token_ids, *args, **kwargs)
    finally:
        scheduler_output.num_spec_tokens_to_schedule = scheduled
    hybrid.time_neural(k, time.perf_counter() - t0)
    if np.any(count) and runner._draft_probs is not None:  # sampled neural drafts with their probabilities:
        count = hybrid.as_point_proposals(runner._draft_probs, count, draft)  # SA rows get one-hot ones
    neural_rows = neural.tolist() if hasattr(neural, "tolist") else list(neural)
    return hybrid.merge(batch.req_ids[:b], count, draft, neural_rows)


def _catch_up_propose(proposer: Any, hybrid: Any) -> Any:
    """The draft-model proposer's ``propose`` for the hybrid: no forward where the hybrid's
    ``plan`` is None, else its first forward over the plan's spans (``catch_up``)."""
    from .catch_up import forward_inputs

    original = proposer.propose

    @functools.wraps(original)
    def propose(**kwargs: Any) -> Any:
        import torch

        plan = hybrid.plan
        if plan is None:
            proposer._last_draft_probs = None  # nothing drafted: no probabilities either
            rows = kwargs["common_attn_metadata"].batch_size()
            return torch.empty(rows, 0, dtype=torch.int64, device=kwargs["next_token_ids"].device)
        kwargs.update(forward_inputs(plan, kwargs["common_attn_metadata"], proposer.block_size))
        out = original(**kwargs)
        hybrid.catch_up.commit(plan)
        return out

    return propose


def _as_numpy(sampled: Any, rows: int) -> Any:
    """The sampled tokens as an int32 numpy array [rows, W], -1 after each row's tokens."""
    import numpy as np

    if hasattr(sampled, "cpu"):
        return sampled[:rows].cpu().numpy().astype(np.int32, copy=False)
    width = max((len(r) for r in sampled[:rows]), default=0)
    out = np.full((rows, max(width, 1)), -1, np.int32)
    for i, r in enumerate(sampled[:rows]):
        out[i, : len(r)] = r
    return out
