"""What the executor keeps per request for sampling besides its parameters: penalty token counts
(`model/penalties.py`) and grammar matchers (`grammar/matchers.py`). Both are built from the
request's tokens whenever it enters the batch (new, or back after preemption), so recompute and
swap-in restore them, and dropped when the executor forgets the request. A request that uses
neither holds nothing here, and a step without such requests does no work here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from tierserve.grammar.matchers import GrammarMatchers
from tierserve.model.penalties import TokenCounts
from tierserve.model.sampler import GrammarMasks

if TYPE_CHECKING:
    from tierserve.executor.state import RequestState
    from tierserve.grammar.engine import GrammarEngine


class SamplingState:
    def __init__(
        self,
        vocab: int,
        device: torch.device,
        make_grammar_engine: Callable[[], GrammarEngine] | None = None,
    ) -> None:
        self.vocab = vocab
        self.device = device
        self.counts: TokenCounts | None = None  # made on the first request with a penalty
        self.grammars = GrammarMatchers(make_grammar_engine)

    def add(self, rid: str, st: RequestState) -> str | None:
        """Set up `rid`'s counts and matcher; an error message if the request cannot be served."""
        p = st.params
        ids = [t for t, _ in p.logit_bias] + list(p.stop_token_ids)
        if ids and max(ids) >= self.vocab:
            return (
                f"token id {max(ids)} in logit_bias or stop_token_ids is not below the "
                f"vocabulary size {self.vocab}"
            )
        output = st.tokens[st.num_prompt :]
        if p.uses_penalties:
            if self.counts is None:
                self.counts = TokenCounts(self.vocab, self.device)
            st.slot = self.counts.add(st.tokens[: st.num_prompt], output)
        if p.grammar is not None:
            return self.grammars.add(rid, p.grammar, output)
        return None

    def drop(self, rid: str, st: RequestState) -> None:
        if st.slot >= 0 and self.counts is not None:
            self.counts.release(st.slot)
            st.slot = -1
        self.grammars.drop(rid)

    def masks(self, sample_ids: list[str]) -> GrammarMasks | None:
        """This step's bitmasks, for the sampling rows that have a grammar."""
        if not len(self.grammars):
            return None
        rows = [i for i, rid in enumerate(sample_ids) if rid in self.grammars]
        if not rows:
            return None
        return GrammarMasks(rows, self.grammars.bitmask([sample_ids[i] for i in rows]))

    def accept(self, rid: str, st: RequestState, token: int, slots: list, toks: list) -> str | None:
        """Note `token`, sampled for `rid`: its matcher advances now; its count is queued in
        (`slots`, `toks`) for one batched update (`flush`)."""
        if st.slot >= 0:
            slots.append(st.slot)
            toks.append(token)
        if rid in self.grammars:
            return self.grammars.accept(rid, token)
        return None

    def flush(self, slots: list[int], toks: list[int]) -> None:
        if slots and self.counts is not None:
            self.counts.append(slots, toks)
