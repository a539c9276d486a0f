"""Prompt lookup: the continuation of the latest earlier occurrence of the sequence's last n
tokens, for the longest n in [n_min, n_max] that occurs. No model, no state: summaries, edits,
extraction and code rewrites copy spans of their input, so the input predicts the output."""

from __future__ import annotations

import numpy as np


def propose_ngram(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to `k` draft tokens following the latest earlier match of the last n tokens."""
    size = len(tokens)
    if k <= 0 or size <= n_min:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = arr[size - n :]
        # every earlier window of n tokens (the suffix itself excluded), compared at once
        starts = np.flatnonzero(arr[: size - n] == suffix[0])
        if starts.size == 0:
            continue
        windows = arr[starts[:, None] + np.arange(n)]
        hits = starts[(windows == suffix).all(axis=1)]
        if hits.size:
            start = int(hits[-1]) + n  # the latest match: the freshest context
            return arr[start : start + k].tolist()
    return []
