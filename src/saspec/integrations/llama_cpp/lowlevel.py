"""One sequence of a ``llama_cpp.Llama``'s context through llama.cpp's C API.

:class:`Context` decodes token batches with logits only where the caller asks
(``llama_batch_init`` / ``llama_decode`` / ``llama_get_logits_ith``) and removes
positions from the KV cache (``llama_memory_seq_rm``), keeping the ``Llama``
object's own record of its context (``n_tokens``, ``input_ids``) in step, so that
the ``Llama``'s methods (``create_completion``, ``generate``) and saspec's loop can
take turns on one model and reuse each other's cached prefix.

llama-cpp-python internals used (tested with 0.3.36): ``Llama.ctx``, ``Llama.n_batch``,
``Llama.n_tokens``, ``Llama.input_ids`` and ``Llama._requires_eval`` (set so that the
``Llama``'s own ``generate`` re-decodes the last token instead of sampling from logits
this class overwrote).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class Context:
    """Sequence 0 of ``llama``'s context.

    Args:
        llama: a ``llama_cpp.Llama`` (a causal model with a KV cache).

    Raises:
        TypeError: ``llama`` has no llama.cpp context.
        RuntimeError: the model's memory cannot remove positions (recurrent models).
    """

    def __init__(self, llama: Any) -> None:
        import llama_cpp

        if getattr(llama, "ctx", None) is None or not hasattr(llama, "n_tokens"):
            raise TypeError(f"expected a llama_cpp.Llama, got {type(llama).__name__}")
        self.api = llama_cpp
        self.llama = llama
        self.ctx = llama.ctx
        self.n_ctx = int(llama.n_ctx())
        self.n_vocab = int(llama.n_vocab())
        self.n_batch = int(llama.n_batch)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        if self.memory is None:
            raise RuntimeError("the model's context has no memory (KV cache) to speculate over")
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        b = self._batch
        self._token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        n_seq = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        n_seq[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._vocab = vocab

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache (positions 0..n_past-1 of ``llama.input_ids``)."""
        return int(self.llama.n_tokens)

    def tokens(self) -> np.ndarray:
        """The tokens in the KV cache (a view, int32 [n_past])."""
        return self.llama.input_ids[: self.n_past]

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...)."""
        return bool(self.api.llama_vocab_is_eog(self._vocab, int(token)))

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of the KV cache equal ``tokens``."""
        have = self.tokens()
        n = min(len(have), len(tokens))
        if n == 0:
            return 0
        neq = np.flatnonzero(have[:n] != np.asarray(tokens[:n], dtype=np.int32))
        return int(neq[0]) if neq.size else n

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the KV cache (0 <= n <= n_past)."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot keep {n} of {self.n_past} cached tokens")
        # Always removed, as Llama.eval does: Llama.reset() zeroes n_tokens but leaves the cache's cells.
        if not self.api.llama_memory_seq_rm(self.memory, 0, n, -1):
            raise RuntimeError("llama_memory_seq_rm failed: the model cannot remove cached positions")
        self.llama.n_tokens = n
        self.llama._requires_eval = True

    def decode(self, tokens: Sequence[int], *, want_last: bool = False, want_from: int | None = None) -> np.ndarray:
        """Append ``tokens`` to the KV cache; return the logits asked for.

        Args:
            tokens: token ids to decode at positions n_past.. (any number;
                chunks of ``n_batch``).
            want_last: return the last token's logits, float32 [n_vocab].
            want_from: return the logits of ``tokens[want_from:]``, float32
                [len(tokens) - want_from, n_vocab] (they must fit one chunk).

        Returns:
            a read-only view of llama.cpp's logits buffer, valid until this
            context's next ``decode`` (copy it to keep it).

        Raises:
            ValueError: the tokens do not fit the context, or a bad ``want_from``.
            RuntimeError: ``llama_decode`` failed.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("nothing to decode")
        if self.n_past + n > self.n_ctx:
            raise ValueError(f"{self.n_past} cached + {n} new tokens exceed the context ({self.n_ctx})")
        if want_from is not None and not (0 <= want_from < n and n - want_from <= self.n_batch):
            raise ValueError(f"want_from must be in [0, {n}) with at most n_batch rows after it, got {want_from}")
        first_out = n - 1 if want_from is None else want_from
        toks = np.asarray(tokens, dtype=np.int32)
        # Cells past n_past may be stale (Llama.reset() leaves them): cleared first, as Llama.eval does.
        self.api.llama_memory_seq_rm(self.memory, 0, self.n_past, -1)
        # Chunks of at most n_batch; the last one, [tail, n), holds every row asked for.
        tail = max(0, n - self.n_batch)
        bounds = list(range(0, tail, self.n_batch)) + [tail, n]
        out = None
        for start, end in zip(bounds[:-1], bounds[1:]):
            if end <= start:
                continue
            c = end - start
            p0 = self.n_past
            self._token[:c] = toks[start:end]
            self._pos[:c] = np.arange(p0, p0 + c, dtype=np.int32)
            self._logits[:c] = 0
            if end == n:
                self._logits[first_out - start: c] = 1
            self._batch.n_tokens = c
            rc = self.api.llama_decode(self.ctx, self._batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            self.llama.input_ids[p0: p0 + c] = toks[start:end]
            self.llama.n_tokens = p0 + c
            if end == n:
                out = self._rows(first_out - start, c)
        self.llama._requires_eval = True
        return out if want_from is not None and not want_last else out[-1]

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        """The logits of batch rows lo..hi-1 (every row with an output), float32 [hi - lo, n_vocab]: a
        view of llama.cpp's output buffer, which holds the outputs contiguously in batch order."""
        p = self.api.llama_get_logits_ith(self.ctx, lo)
        rows = np.ctypeslib.as_array(p, shape=(hi - lo, self.n_vocab))
        rows.flags.writeable = False
        return rows

    def close(self) -> None:
        """Free the batch (idempotent)."""
        if self._batch is not None:
            self.api.llama_batch_free(self._batch)
            self._batch = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
