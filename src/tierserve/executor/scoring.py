"""Prompt logprobs of a step's chunks, for the requests that ask (scoring, `echo`): the model
returned the final hidden states of their prompt positions (`Batch.score_spans`); the head runs
over them in chunks (`model/logprobs.py`) and each request gets its span back as plain data."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tierserve.executor.batch import Batch
from tierserve.logprobs import PromptLogprobs
from tierserve.model.logprobs import score_positions


def prompt_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, batch: Batch
) -> dict[str, PromptLogprobs]:
    k = max(s.k for s in batch.score_spans)
    targets = torch.tensor(batch.score_targets, dtype=torch.long)
    lps, top_ids, top_lps = score_positions(head, hidden, targets, k)
    out, at = {}, 0
    for span in batch.score_spans:
        n = len(span.rows)
        top = None
        if span.k:
            top = [
                (tuple(ids[: span.k]), tuple(vals[: span.k]))
                for ids, vals in zip(top_ids[at : at + n], top_lps[at : at + n], strict=True)
            ]
        out[span.request_id] = PromptLogprobs(span.start, lps[at : at + n], top)
        at += n
    return out
