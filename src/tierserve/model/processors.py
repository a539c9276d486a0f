"""Per-request changes to a row's logits before the draw, in vLLM's order: grammar token masks
(on the raw logits, before the logprobs are read), then `min_tokens`, `logit_bias` and the
penalties (on a gathered copy of the rows that use them, after the logprobs are read). Each
stage is one or two tensor operations over the rows that use it; rows that use none are never
touched."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tierserve.model.penalties import TokenCounts, apply_penalties

if TYPE_CHECKING:
    from tierserve.model.sampler import SampleRow

_BITS = None


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 ``[G, ceil(V / 32)]`` bitmasks (bit i of word w allows token 32 w + i, as
    llguidance and xgrammar write them) to bool ``[G, V]``."""
    global _BITS
    if _BITS is None or _BITS.device != bitmask.device:
        _BITS = torch.tensor([1 << i for i in range(32)], dtype=torch.int64).to(bitmask.device)
    bits = (bitmask.to(torch.int64)[:, :, None] & _BITS) != 0
    return bits.view(bitmask.shape[0], -1)[:, :vocab]


def apply_token_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """In place: tokens a row's grammar does not allow go to -inf."""
    if not rows:
        return
    idx = torch.tensor(rows, device=logits.device)
    allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[1])
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))


def needs_processing(row: SampleRow) -> bool:
    p = row.params
    return p.processed and (
        p.uses_penalties or bool(p.logit_bias) or row.output_index < p.min_tokens
    )


def process_logits(
    logits: torch.Tensor, rows: list[SampleRow], counts: TokenCounts | None
) -> torch.Tensor:
    """`min_tokens` masks, `logit_bias` and penalties on ``[R, V]`` logits (modified in place
    or replaced; the result is returned)."""
    dev = logits.device
    masked = [
        (j, t)
        for j, r in enumerate(rows)
        if r.output_index < r.params.min_tokens
        for t in r.stop_ids()
    ]
    if masked:
        j, t = torch.tensor(masked, device=dev).unbind(1)
        logits[j, t] = float("-inf")
    bias = [(j, t, b) for j, r in enumerate(rows) for t, b in r.params.logit_bias]
    if bias:
        j = torch.tensor([x[0] for x in bias], device=dev)
        t = torch.tensor([x[1] for x in bias], device=dev)
        b = torch.tensor([x[2] for x in bias], dtype=logits.dtype, device=dev)
        logits.index_put_((j, t), b, accumulate=True)
    pen = [j for j, r in enumerate(rows) if r.slot >= 0 and r.params.uses_penalties]
    if pen:
        if counts is None:
            raise ValueError("a row uses penalties but no token counts were given")
        ps = [rows[j].params for j in pen]
        slots = torch.tensor([rows[j].slot for j in pen], device=dev)
        vals = torch.tensor(
            [[p.presence_penalty, p.frequency_penalty, p.repetition_penalty] for p in ps],
            dtype=logits.dtype,
            device=dev,
        )
        idx = torch.tensor(pen, device=dev)
        logits[idx] = apply_penalties(
            logits[idx],
            counts.counts[slots],
            counts.in_prompt[slots],
            vals[:, 0],
            vals[:, 1],
            vals[:, 2],
        )
    return logits
