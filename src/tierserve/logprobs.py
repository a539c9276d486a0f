"""Logprob types shared by the request, the scheduler's outputs, the model and the API."""

from __future__ import annotations

from dataclasses import dataclass

# (token ids, logprobs) of one position's most likely tokens, most likely first.
TopLogprobs = tuple[tuple[int, ...], tuple[float, ...]]


@dataclass
class PromptLogprobs:
    """Logprobs of prompt tokens `start`, `start + 1`, ... (token 0 has none), from one chunk."""

    start: int
    logprobs: list[float]
    top: list[TopLogprobs] | None = None  # with prompt_logprobs > 0
