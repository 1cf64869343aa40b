"""Single: one sequence on a CPU ``SpecEngine``, fed as many tokens per step as it accepted.

A loop over one sequence (transformers' assisted decoding, the reference loop
in ``evidence.generate``) appends whatever the target accepted this step, any
number of tokens, while ``SpecEngine.extend`` takes at most ``K + 1`` per row
and call. ``SingleSequence`` feeds them in chunks and reads the match and the
draft after the last one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from . import build
from .engine import SpecEngine
from .validate import as_tokens, check_count, is_torch


class SingleSequence:
    """One request of ``engine`` (a CPU ``SpecEngine``), from construction to :meth:`close`.

    Args:
        engine: the engine that holds the automaton; it may serve other
            requests too (each :meth:`extend` makes this request the batch).
        prompt: the prompt's token ids (1-D, see ``SpecEngine.add_request``).
        k: draft tokens per step (>= 1).
        expected_new_tokens: passed to ``add_request`` (room reserved up front).

    Raises:
        ValueError, TypeError, KeyError: as ``SpecEngine.add_request`` does.
    """

    def __init__(self, engine: SpecEngine, prompt: Any, k: int, expected_new_tokens: int | None = None) -> None:
        self.k = check_count(k, "k")
        self.engine = engine
        self.request_id: Hashable | None = object()
        engine.add_request(self.request_id, prompt, expected_new_tokens=expected_new_tokens)
        engine.prepare([self.request_id])
        self._acc = np.zeros((1, self.k + 1), np.int32)
        self._lens = np.zeros(1, np.int32)
        self._match = np.zeros(1, np.int32)
        self._draft = np.full((1, self.k), -1, np.int32)
        self._src = np.zeros(1, np.int32) if engine.request_pool is not None else None
        self._branch = np.zeros(1, np.int32)
        self.from_pool = False  # the last extend's match and draft came from the engine's pool
        self.branched = False  # the last extend's match went on with several tokens earlier (see SpecEngine.extend)

    def extend(self, tokens: Sequence[int]) -> tuple[int, list[int]]:
        """Append ``tokens`` (any number, possibly none); return the match
        length in tokens and the draft, up to ``k`` tokens (empty without a match).

        ``tokens``: a sequence of ints, or a 1-D numpy array or CPU tensor of an
        integer dtype, with values in [0, 2**31) (``validate.as_tokens``: floats,
        strings and bools are rejected, not converted). All of them are checked
        before any is appended, and so is the request's length limit
        (``build.MAX_REQUEST_TOKENS``).

        Threads: one thread at a time per sequence (its output buffers are its
        own); sequences sharing an engine may be driven from different threads,
        each step taking the engine's lock once per ``k + 1`` tokens
        (``SpecEngine.step``).

        Raises:
            RuntimeError: the sequence is closed.
            TypeError, ValueError: ``tokens`` are not token ids, or would take the
                request past ``build.MAX_REQUEST_TOKENS``; nothing is appended.
        """
        if self.request_id is None:
            raise RuntimeError("the sequence is closed")
        arr = as_tokens(tokens if isinstance(tokens, np.ndarray) or is_torch(tokens) else list(tokens), "tokens")
        k1 = self.k + 1
        if arr.size > k1:  # one chunk is checked whole by the engine; several must not stop half way
            build.check_request_tokens(self.engine.automaton_len(self.request_id) + arr.size, "the sequence")
        rows = [self.request_id]
        start = 0
        while True:
            chunk = arr[start: start + k1]
            start += k1
            self._acc[0, : chunk.size] = chunk
            self._lens[0] = chunk.size
            self.engine.step(rows, self._acc, self._lens, self._match, self._draft, self._src, self._branch)
            if start >= arr.size:
                break
        self.from_pool = self._src is not None and bool(self._src[0])
        self.branched = bool(self._branch[0])
        d = self._draft[0]
        n = int(np.argmax(d < 0)) if (d < 0).any() else self.k
        return int(self._match[0]), d[:n].tolist()

    def close(self) -> None:
        """Free the request's automaton (idempotent)."""
        if self.request_id is not None:
            self.engine.remove_request(self.request_id)
            self.request_id = None
