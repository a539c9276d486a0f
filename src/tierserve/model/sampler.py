"""Per-request sampling: greedy, temperature, top-k, top-p, min-p, seeds, chosen-token logprobs.

A seeded request draws its randomness for output token i from a generator seeded with
(seed, i), so the same seed gives the same text whatever else is in the batch and even when the
request was preempted and recomputed. Sampling uses the exponential race
(argmax p / E with E ~ Exp(1)), which draws from p exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tierserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleRow:
    params: SamplingParams
    output_index: int  # how many tokens the request has generated before this one


def _token_generator(seed: int, index: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + index * 7_919 + 1) % (2**63 - 1))
    return g


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p to one row of logits."""
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= p.top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, idx, drop), float("-inf"))
    if p.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    def __init__(self, device: torch.device, seed: int | None = None) -> None:
        self.device = device
        self._rng = torch.Generator(device=device)
        self._rng.seed() if seed is None else self._rng.manual_seed(seed)

    def sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> tuple[list[int], list[float]]:
        """logits: [S, V] float32. Returns token ids and their log-probabilities under the
        model's (unfiltered) distribution; a NaN logprob means the row was not finite."""
        lse = torch.logsumexp(logits, dim=-1)
        tokens = torch.argmax(logits, dim=-1)
        for i, row in enumerate(rows):
            p = row.params
            if p.temperature == 0.0:
                continue
            probs = _filter(logits[i], p).softmax(-1)
            g = (
                self._rng
                if p.seed is None
                else _token_generator(p.seed, row.output_index, logits.device)
            )
            noise = torch.empty_like(probs).exponential_(generator=g)
            tokens[i] = torch.argmax(probs / noise)
        chosen = logits.gather(1, tokens[:, None]).squeeze(1) - lse
        return tokens.tolist(), chosen.tolist()
