"""vLLM settings are checked where they enter, with messages naming the setting as the user gave it:
``proposer_config`` and ``hybrid_config`` (arguments), and the worker's reading of
``$SASPEC_VLLM_HYBRID`` and ``$SASPEC_VLLM_*`` (environment). No vLLM needed: a stand-in module
and a stand-in config, as in ``test_vllm_hybrid.py``."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from saspec import build
from saspec.integrations.vllm import TESTED_VLLM, hybrid_config, proposer_config
from saspec.integrations.vllm.config import (HYBRID_ENV, MAX_POOL_TOKENS, POOL_ENV, HybridSettings, hybrid_settings,
                                             resolve_proposer_settings)

SPEC = SimpleNamespace(method="draft_model", num_speculative_tokens=32)  # what hybrid_config's defaults give vLLM
GOOD = asdict(HybridSettings(method="draft_model", k=4, sa_tokens=32, threshold=4, vllm_tokens=32,
                             pool_tokens=1 << 20, policy=True, catch_up=True))


@pytest.fixture
def clean_env(monkeypatch):
    """A stand-in ``vllm`` of a tested version; saspec's variables unset, and restored afterwards."""
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__=TESTED_VLLM[0]))
    for name in [n for n in os.environ if n.startswith("SASPEC_VLLM_")]:
        monkeypatch.delenv(name)
    for name in (POOL_ENV, HYBRID_ENV):  # the config functions write them: set and unset, monkeypatch restores them
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def vllm_config(k: int = 8) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           scheduler_config=SimpleNamespace(max_num_seqs=8))


def test_the_pool_bound_is_one_the_engine_takes():
    assert 2 <= MAX_POOL_TOKENS <= build.MAX_REQUEST_TOKENS


@pytest.mark.parametrize("pool", [2**70, MAX_POOL_TOKENS + 1, -1, 1, 2.0, True, "100"])
def test_proposer_config_refuses_a_pool_it_cannot_make_and_sets_nothing(clean_env, pool):
    with pytest.raises(ValueError, match=r"^pool_tokens must be 0 \(no pool\) or an int in \[2, "):
        proposer_config(pool_tokens=pool)
    assert POOL_ENV not in os.environ


@pytest.mark.parametrize("pool", [2**70, MAX_POOL_TOKENS + 1, 1, 1.5])
def test_hybrid_config_refuses_a_pool_it_cannot_make_and_sets_nothing(clean_env, pool):
    with pytest.raises(ValueError, match=r"^pool_tokens must be 0 \(no pool\) or an int in \[2, "):
        hybrid_config(pool_tokens=pool)
    assert HYBRID_ENV not in os.environ


@pytest.mark.parametrize("pool", [0, 2, MAX_POOL_TOKENS])
def test_the_pool_bounds_are_taken(clean_env, pool):
    proposer_config(pool_tokens=pool)
    assert int(os.environ[POOL_ENV]) == pool
    assert resolve_proposer_settings(vllm_config()).pool_tokens == pool
    hybrid_config(pool_tokens=pool)
    assert hybrid_settings(SPEC).pool_tokens == pool


@pytest.mark.parametrize("value", [str(2**70), "1", "-5"])
def test_the_worker_names_the_pool_variable(clean_env, value):
    clean_env.setenv(POOL_ENV, value)
    with pytest.raises(ValueError, match=rf"^\${POOL_ENV} must be 0 \(no pool\)"):
        resolve_proposer_settings(vllm_config())


@pytest.mark.parametrize("name, value", [("SASPEC_VLLM_MIN_MATCH", "0"), ("SASPEC_VLLM_MAX_DETACHED", "-1")])
def test_the_worker_names_each_variable_out_of_range(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^\${name} must be an int >= \d, got {value}"):
        resolve_proposer_settings(vllm_config())


@pytest.mark.parametrize("kwargs, message", [
    ({"min_match": 1.7}, "min_match must be an int >= 1, got 1.7"),
    ({"max_detached": -1}, "max_detached must be an int >= 0, got -1"),
    ({"pool_tokens": 2**70}, "pool_tokens must be 0"),
])
def test_proposer_arguments_are_named(clean_env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_proposer_settings(vllm_config(), **kwargs)


@pytest.mark.parametrize("key, value, message", [
    ("k", -3, "k must be an int >= 1, got -3"),
    ("k", 2.5, "k must be an int >= 1, got 2.5"),
    ("k", True, "k must be an int >= 1, got True"),
    ("sa_tokens", 0, "sa_tokens must be an int >= 1, got 0"),
    ("threshold", "4", "threshold must be an int >= 1, got '4'"),
    ("k", 64, r"sa_tokens \(32\) must be at least k \(64\)"),
    ("policy", "no", "policy must be a bool \\(true or false\\), got 'no'"),
    ("catch_up", 0, "catch_up must be a bool"),
    ("pool_tokens", 2**70, "pool_tokens must be 0 \\(no pool\\) or an int in"),
    ("pool_tokens", -1, "pool_tokens must be 0"),
    ("method", "ngram", "method must be one of"),
])
def test_the_worker_names_each_bad_hybrid_setting(clean_env, key, value, message):
    clean_env.setenv(HYBRID_ENV, json.dumps({**GOOD, key: value}))
    with pytest.raises(ValueError, match=rf"^\${HYBRID_ENV}: {message}"):
        hybrid_settings(SimpleNamespace(method=GOOD["method"] if key != "method" else value,
                                        num_speculative_tokens=32))


def test_the_worker_takes_what_hybrid_config_writes(clean_env):
    hybrid_config(num_speculative_tokens=4, sa_tokens=32, policy=False, catch_up=False, pool_tokens=0)
    s = hybrid_settings(SPEC)
    assert (s.k, s.sa_tokens, s.vllm_tokens, s.policy, s.catch_up, s.pool_tokens) == (4, 32, 32, False, False, 0)


def test_numpy_ints_are_taken_as_ints_by_both_configs(clean_env):
    """The worker takes numpy ints where it reads the settings; the configs that write them do too, and
    write plain ints (JSON cannot hold numpy's)."""
    import numpy as np

    assert proposer_config(np.int64(8), pool_tokens=np.int32(4096))["num_speculative_tokens"] == 8
    assert type(proposer_config(np.int64(8))["num_speculative_tokens"]) is int
    hybrid_config(num_speculative_tokens=np.int64(4), sa_tokens=np.int32(32), threshold=np.int64(3),
                  pool_tokens=np.int64(0))
    s = hybrid_settings(SPEC)
    assert (s.k, s.sa_tokens, s.threshold, s.pool_tokens) == (4, 32, 3, 0)
    with pytest.raises(ValueError, match=r"^sa_tokens \(2\) must be at least num_speculative_tokens \(4\)"):
        hybrid_config(num_speculative_tokens=np.int64(4), sa_tokens=np.int64(2))
