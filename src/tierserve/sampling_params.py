"""Per-request sampling parameters (validated, immutable)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tierserve.grammar.spec import GrammarSpec

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256  # 0: the prompt only (scoring with prompt_logprobs); no token sampled
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # The k most likely alternatives of each output token (the chosen token's logprob is always
    # reported); prompt_logprobs: each prompt token's logprob and its k alternatives (None: no).
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    # EOS and stop_token_ids cannot be sampled before min_tokens output tokens.
    min_tokens: int = 0
    # vLLM's semantics: presence and frequency over the output tokens, repetition over prompt
    # and output (divides positive logits, multiplies negative ones).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); a dict is accepted
    skip_special_tokens: bool = True
    grammar: GrammarSpec | None = None
    # False: never speculate for this request (the engine's speculative decoding is off for it).
    speculative: bool = True
    # Derived once: does the row need the per-row logits processing of the sampler?
    uses_penalties: bool = field(default=False, init=False, compare=False, repr=False)
    processed: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            bad(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 0:
            bad(f"max_tokens must be at least 0, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            bad(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            bad(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0 <= self.min_p <= 1):
            bad(f"min_p must lie in [0, 1], got {self.min_p}")
        if self.min_tokens < 0:
            bad(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.min_tokens > self.max_tokens:
            bad(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(f"{name} must lie in [-2, 2], got {getattr(self, name)}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            bad(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            bad(f"top_logprobs must lie in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if self.prompt_logprobs is not None and not (0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS):
            bad(f"prompt_logprobs must lie in [0, {MAX_TOP_LOGPROBS}], got {self.prompt_logprobs}")
        set_ = object.__setattr__
        set_(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            bad("stop must be a list of non-empty strings")
        set_(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if any(t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be token ids (>= 0)")
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, dict) else bias
        set_(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in pairs)))
        for t, b in self.logit_bias:
            if t < 0 or not -100.0 <= b <= 100.0:
                bad(f"logit_bias: token {t} -> {b}: ids are >= 0, biases in [-100, 100]")
        if self.grammar is not None and self.ignore_eos:
            bad("ignore_eos cannot be combined with structured output (the grammar ends it)")
        if self.grammar is not None and self.min_tokens:
            bad("min_tokens cannot be combined with structured output (the grammar ends it)")
        penal = (self.presence_penalty, self.frequency_penalty, self.repetition_penalty)
        set_(self, "uses_penalties", penal != (0.0, 0.0, 1.0))
        set_(self, "processed", self.uses_penalties or bool(self.logit_bias) or self.min_tokens > 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams(temperature=0.0)


@dataclass
class CompletionOutput:
    """What the engine reports about one request after a step (a delta)."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
