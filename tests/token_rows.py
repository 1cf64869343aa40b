"""Token rows as the engines hand them over, for the catch-up tests: texts padded with 0 (vLLM's token table) and
new tokens padded with -1."""

from __future__ import annotations

import numpy as np


def table(texts: list[list[int]], width: int = 1024) -> np.ndarray:
    out = np.zeros((len(texts), width), np.int32)
    for b, t in enumerate(texts):
        out[b, : len(t)] = t
    return out


def new_tokens(rows: list[list[int]], width: int = 20) -> np.ndarray:
    out = np.full((len(rows), width), -1, np.int32)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out
