"""Token counts for presence, frequency and repetition penalties, kept per request and updated
incrementally, and the penalties applied to a batch of rows in a few tensor operations.

`TokenCounts` holds one slot per running request that uses a penalty (requests without one hold
none and cost nothing): a float32 ``[slots, V]`` count of each token in the output and a bool
``[slots, V]`` mark of the prompt's tokens. A slot is filled when the executor learns of the
request (new, or back after preemption: built from all its tokens, so recompute restores it),
bumped with one ``index_put_`` per step for all the step's sampled tokens, and released when
the executor forgets the request. Buffers grow by doubling.
"""

from __future__ import annotations

import torch


class TokenCounts:
    def __init__(self, vocab: int, device: torch.device, capacity: int = 4) -> None:
        self.vocab = vocab
        self.device = device
        self.counts = torch.zeros(capacity, vocab, dtype=torch.float32, device=device)
        self.in_prompt = torch.zeros(capacity, vocab, dtype=torch.bool, device=device)
        self._free = list(range(capacity - 1, -1, -1))

    def __len__(self) -> int:
        return self.counts.shape[0] - len(self._free)

    def _grow(self) -> None:
        cap = self.counts.shape[0]
        self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
        self.in_prompt = torch.cat([self.in_prompt, torch.zeros_like(self.in_prompt)])
        self._free = list(range(2 * cap - 1, cap - 1, -1)) + self._free

    def add(self, prompt: list[int], output: list[int]) -> int:
        """A slot holding `prompt`'s tokens and `output`'s counts."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.counts[slot].zero_()
        self.in_prompt[slot].zero_()
        dev = self.device
        self.in_prompt[slot, torch.tensor(prompt, dtype=torch.long, device=dev)] = True
        if output:
            ids = torch.tensor(output, dtype=torch.long, device=dev)
            self.counts[slot].index_add_(0, ids, torch.ones(len(output), device=dev))
        return slot

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def append(self, slots: list[int], tokens: list[int]) -> None:
        """Count one new output token for each slot (one op for the whole step)."""
        if not slots:
            return
        dev = self.device
        s = torch.tensor(slots, dtype=torch.long, device=dev)
        t = torch.tensor(tokens, dtype=torch.long, device=dev)
        self.counts.index_put_((s, t), torch.ones(len(slots), device=dev), accumulate=True)


def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    in_prompt: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties on ``[P, V]`` logits (new tensor), each row with its own values
    (neutral values change nothing): repetition divides the positive logits and multiplies the
    negative ones of tokens seen in the prompt or the output, then ``frequency x count`` and
    ``presence x (count > 0)`` are subtracted, counting output tokens only."""
    seen_out = counts > 0
    rep = repetition[:, None]
    repeated = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen_out | in_prompt, repeated, logits)
    return logits - frequency[:, None] * counts - presence[:, None] * seen_out
