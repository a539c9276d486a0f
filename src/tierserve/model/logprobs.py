"""Logprobs beyond the chosen token's: the top-k alternatives of sampled tokens, and the
logprobs of prompt tokens (scoring, `echo`).

Every figure is a logprob under the model's raw distribution, ``log_softmax(logits)``, as in
vLLM's default ``logprobs_mode="raw_logprobs"``: before penalties, `logit_bias`, temperature and
top-k/top-p/min-p, but after a grammar's token mask (vLLM applies the mask to the logits the
sampler receives). A token the mask excludes has logprob -inf.

Prompt logprobs need the head's logits at every prompt position of the requests that ask for
them; the model returns those positions' final hidden states instead, and the head runs here in
chunks of `CHUNK_ROWS` rows, so a long prompt never holds a ``[prompt, V]`` logits tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tierserve.logprobs import TopLogprobs

if TYPE_CHECKING:
    from tierserve.model.sampler import SampleRow

CHUNK_ROWS = 256


@dataclass(frozen=True)
class TopRows:
    """The top-k of the rows that ask for it, still on the device: `ids` and `logprobs` are
    [R, K] (K the largest k asked); `want` is (row index, its k) per row."""

    want: tuple[tuple[int, int], ...]
    ids: torch.Tensor
    logprobs: torch.Tensor

    def unpack(self, flat: list[float]) -> dict[int, TopLogprobs]:
        """{row index: its top tokens and logprobs}, from `ids` then `logprobs` read back flat."""
        width = self.ids.shape[1] if self.ids.dim() == 2 else 0
        half = len(self.want) * width
        ids, lps = flat[:half], flat[half:]
        out: dict[int, TopLogprobs] = {}
        for j, (i, k) in enumerate(self.want):
            row = slice(j * width, j * width + k)
            out[i] = (tuple(int(t) for t in ids[row]), tuple(lps[row]))
        return out


def top_logprobs(logits: torch.Tensor, lse: torch.Tensor, rows: list[SampleRow]) -> TopRows | None:
    """The `top_logprobs` most likely tokens of the rows that ask (None: no row asks)."""
    want = tuple((i, r.params.top_logprobs) for i, r in enumerate(rows) if r.params.top_logprobs)
    if not want:
        return None
    idx = torch.tensor([i for i, _ in want], device=logits.device)
    vals, ids = torch.topk(logits[idx], max(k for _, k in want), dim=-1)
    return TopRows(want, ids, vals - lse[idx, None])


def score_positions(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    k: int,
) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """For hidden states ``[H, D]`` and the token that follows each position (``[H]``): each
    target's logprob, and the `k` most likely tokens with their logprobs (empty lists if k=0)."""
    lps: list[float] = []
    top_ids: list[list[int]] = []
    top_lps: list[list[float]] = []
    for s in range(0, hidden.shape[0], CHUNK_ROWS):
        logits = head(hidden[s : s + CHUNK_ROWS])
        lse = torch.logsumexp(logits, dim=-1)
        t = targets[s : s + CHUNK_ROWS].to(logits.device)
        lps += (logits.gather(1, t[:, None]).squeeze(1) - lse).tolist()
        if k:
            vals, ids = torch.topk(logits, k, dim=-1)
            top_ids += ids.tolist()
            top_lps += (vals - lse[:, None]).tolist()
        else:
            top_ids += [[] for _ in range(t.shape[0])]
            top_lps += [[] for _ in range(t.shape[0])]
    return lps, top_ids, top_lps
