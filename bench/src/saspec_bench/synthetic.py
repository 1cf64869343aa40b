"""Synthetic token streams for the host benchmarks: random ids and code-like text
(a block repeated with a few ids changed per copy), as int32 arrays."""

from __future__ import annotations

import numpy as np

VOCAB = 151_936


def random_prompt(n: int, seed: int = 0) -> np.ndarray:
    """int32 [n], ids uniform in [0, VOCAB)."""
    return np.random.default_rng(seed).integers(0, VOCAB, n, dtype=np.int32)


def code_like_prompt(n: int, seed: int = 0, block: int = 2000, vocab: int = 5000, mutate: float = 0.01) -> np.ndarray:
    """int32 [n]: a base block of ``block`` tokens repeated, each copy with a
    fraction ``mutate`` of its positions replaced by random ids."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, vocab, block, dtype=np.int32)
    copies = []
    for _ in range(-(-n // block)):
        b = base.copy()
        idx = rng.integers(0, block, max(1, int(block * mutate)))
        b[idx] = rng.integers(0, vocab, idx.size)
        copies.append(b)
    return np.concatenate(copies)[:n]
