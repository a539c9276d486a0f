"""The executor's grammar matchers, one per running request with a grammar.

A matcher is made when the executor learns of the request and fed the request's output tokens
so far: a request back from preemption (recompute or swap) replays what it had accepted and
continues where it stopped. Each step, `bitmask` fills one int32 row per grammar row that samples
(the other rows have none), and `accept` advances the matchers with the sampled tokens; both run
on the engine thread, between model steps, a few microseconds per row (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tierserve.grammar.engine import GrammarEngine, GrammarError
from tierserve.grammar.spec import GrammarSpec


class GrammarMatchers:
    def __init__(self, make_engine: Callable[[], GrammarEngine] | None) -> None:
        self._make_engine = make_engine
        self._engine: GrammarEngine | None = None
        self._matchers: dict = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self._matchers

    def __len__(self) -> int:
        return len(self._matchers)

    def add(self, rid: str, spec: GrammarSpec, output: list[int]) -> str | None:
        """Make `rid`'s matcher and replay `output`; an error message if that fails."""
        if self._engine is None:
            if self._make_engine is None:
                return "structured output needs the model's tokenizer, which this engine lacks"
            self._engine = self._make_engine()
        try:
            m = self._engine.matcher(spec)
        except GrammarError as exc:
            return f"grammar: {exc}"
        if output and not m.consume_tokens(output):
            return f"grammar: the output so far does not match: {_reason(m)}"
        self._matchers[rid] = m
        return None

    def drop(self, rid: str) -> None:
        self._matchers.pop(rid, None)

    def bitmask(self, rids: list[str]) -> torch.Tensor:
        """int32 ``[len(rids), ceil(V / 32)]``: the tokens each request's grammar allows next."""
        words = self._engine.words
        out = torch.empty(len(rids), words, dtype=torch.int32)
        for g, rid in enumerate(rids):
            self._matchers[rid].unsafe_compute_mask_ptr(out[g].data_ptr(), 4 * words)
        return out

    def accept(self, rid: str, token: int) -> str | None:
        """Advance `rid`'s matcher by `token`; an error message if the grammar refuses it."""
        m = self._matchers[rid]
        if m.consume_token(token):
            return None
        return f"grammar: the answer could not continue under the requested format: {_reason(m)}"


def _reason(m) -> str:
    """The engine's one-line reason (its first line: no parser state, no grammar text)."""
    lines = (m.get_error() or "").strip().splitlines()
    return lines[0] if lines else "the grammar engine stopped"
