"""The prefill rate an engine will deliver, from its step-time model (core/step_time.py) and the
decodes it will be running: what the TTFT predictor divides by when it looks ahead.

The rate measured while a backlog waited (admission/load_meter.py) describes the last few
seconds. Under an open-loop burst it is too optimistic for the requests admitted now: every one
admitted ahead of a new request is prefilled before it, then decodes beside it, and each step
then spends longer on decodes and prefills no faster. So a new request's wait is priced at the
rate of an engine running the decodes it will find: those running now plus the requests ahead
of it, up to the seats there are::

    D = min(max_num_seqs, decodes now + requests ahead)
    P = prefill tokens in one step beside D decodes: the token budget left, within the time
        bound on a step (the scheduler's rule: prefill gets the bound's time)
    rate = P / (overhead + time of D decodes at their mean context + time of P prompt tokens)

Plain numbers in, plain numbers out: the engine thread measures the shape (engine/load.py), the
snapshot carries it, and the server's event loop and the simulator compute the same rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tierserve.core.step_time import PREFILL_SHARE, StepCoefficients, StepWork, TimeBudget
from tierserve.priority import NUM_PRIORITIES

_ZERO = (0,) * NUM_PRIORITIES


@dataclass(frozen=True)
class EngineShape:
    """What the rate depends on, read from the engine with the rest of the ``Load``."""

    coef: StepCoefficients
    bound_s: float | None  # the step-time bound (None: steps are sized by tokens only)
    token_budget: int
    max_num_seqs: int
    decodes: int  # running requests (each decodes once its prompt is in)
    decode_context: int  # their contexts (known tokens), summed
    waiting_requests: tuple[int, ...] = _ZERO  # per class, as ``Load.waiting_tokens``
    waiting_context: int = 0  # tokens of every waiting request (their contexts once decoding)
    seat_rate: float = 0.0  # requests leaving the running batch per second, measured
    remaining_output: int = 0  # output tokens the running requests may still generate, summed
    waiting_output: int = 0  # the waiting requests' max_tokens (predicted, with predictive_ttft)

    def with_waiting(self, priority: int, requests: int, tokens: int) -> EngineShape:
        w = list(self.waiting_requests)
        w[priority] += requests
        n = sum(self.waiting_requests)
        out = self.waiting_output + (round(self.waiting_output / n) * requests if n else 0)
        return replace(
            self,
            waiting_requests=tuple(w),
            waiting_context=self.waiting_context + tokens,
            waiting_output=out,
        )

    def only_classes_upto(self, keep: int) -> EngineShape:
        w = self.waiting_requests[:keep] + _ZERO[keep:]
        return replace(self, waiting_requests=w)

    def idle(self) -> EngineShape:
        return replace(
            self,
            decodes=0,
            decode_context=0,
            waiting_requests=_ZERO,
            waiting_context=0,
            remaining_output=0,
            waiting_output=0,
        )

    def seat_wait(self, ahead: int) -> float:
        """Seconds until a seat frees for a request with `ahead` requests before it that need
        one too (0 while enough are free). Seats free as running requests finish: at the rate
        measured over the last seconds, but no faster than the running ones' remaining outputs
        allow (each decodes its max_tokens at most, one token a step)."""
        need = self.decodes + ahead + 1 - self.max_num_seqs
        if need <= 0:
            return 0.0
        rate = self.seat_rate
        step = self.step_seconds(self.decodes)
        if self.coef.calibrated and self.decodes and step > 0:
            # Remaining outputs spread evenly up to twice their mean: one finishes every
            # 2 x mean / decodes steps, at most (max_tokens; an end-of-sequence comes sooner).
            mean_left = max(1.0, self.remaining_output / self.decodes)
            bound = self.decodes / (2 * mean_left * step)
            rate = bound if rate <= 0 else min(rate, bound)
        return need / rate if rate > 0 else math.inf

    def _prefill_tokens(self, decodes: int) -> int:
        """Prompt tokens one step takes beside `decodes` decodes: the scheduler's own rule
        (core/step_time.py ``TimeBudget``) applied to a fresh prompt."""
        room = max(1, self.token_budget - decodes)
        budget = TimeBudget(self.coef, self.bound_s, 1)
        budget.take(self._decodes(decodes), chunk=False)
        return max(1, budget.fit(room, 0, False))

    def _decodes(self, d: int) -> StepWork:
        n = self.decodes + sum(self.waiting_requests)
        mean_ctx = (self.decode_context + self.waiting_context) / n if n else 0.0
        return StepWork(d, d, int(d * (mean_ctx + 1)), d * (mean_ctx + 1), d)

    def step_seconds(self, decodes: int) -> float:
        """A step with `decodes` decodes and a full prefill chunk, as the scheduler builds it."""
        p = self._prefill_tokens(decodes)
        coef = self.coef
        return coef.seconds(self._decodes(decodes)) + coef.seconds(StepWork.chunk(p, 0, 1), False)

    def rate(self, ahead: int) -> float | None:
        """Prefill tokens per second while serving `ahead` more requests than run now: those of
        them prefilled within one decode lifetime of the wait's end still decode beside it (a
        request ahead with a long output keeps its seat for the rest of the wait; one with a
        short output has left). None before the model is calibrated."""
        if not self.coef.calibrated:
            return None
        now = self._prefill_tokens(self.decodes) / self.step_seconds(self.decodes)
        n = sum(self.waiting_requests)
        if n and ahead > 0:
            joining = now / max(1.0, self.waiting_context / n)  # requests prefilled a second
            lifetime = self.waiting_output / n * self.step_seconds(self.decodes)
            ahead = min(ahead, math.ceil(joining * lifetime))
        d = min(self.max_num_seqs, self.decodes + max(0, ahead))
        seconds = self.step_seconds(d)
        return self._prefill_tokens(d) / seconds if seconds > 0 else None

    def express_seconds(
        self, requests_ahead: int, tokens_ahead: int, own: int, share: float
    ) -> float | None:
        """Seconds of steps until the first token of a request of the class served first (P0
        under hybrid: its prompts go before every other class's, in express steps of their
        own), with `requests_ahead` of its class (`tokens_ahead` prompt tokens) before it and
        `own` prompt tokens, of which the engine computes `share` (the rest is in the prefix
        cache). The steps are walked as the scheduler builds them: each takes as many of the
        waiting prompts as fit its time bound (at least one) beside the decodes of those
        prefilled before, and a prompt's first token comes at the end of the step that
        finishes it, so a burst's first tokens come together, step after step. None before
        the step-time model is calibrated."""
        if not self.coef.calibrated:
            return None
        coef = self.coef
        mean = tokens_ahead / requests_ahead if requests_ahead > 0 else float(own)

        def prefill(prompt: float) -> tuple[float, int]:
            """One prompt's time in a step (no overhead) and its computed tokens."""
            m = max(1, round(share * prompt))
            c = max(0, round(prompt) - m)
            return coef.seconds(StepWork.chunk(m, c, 1), with_overhead=False), m

        each, each_tokens = prefill(mean)
        mine, _ = prefill(own)
        overhead = coef.coef[0]
        left, decodes, t = requests_ahead, 0, 0.0
        while True:
            ctx = decodes * (mean + 1)
            work = StepWork(decodes, decodes, int(ctx), ctx, decodes)
            dec = coef.seconds(work, with_overhead=False)
            fit = max(1, (self.token_budget - decodes) // max(1, each_tokens))
            if self.bound_s is not None and each > 0:
                room = max(PREFILL_SHARE * self.bound_s, self.bound_s - overhead - dec)
                fit = min(fit, max(1, int(room / each)))
            if left < fit:  # its own prompt goes in this step
                return t + overhead + dec + left * each + mine
            t += overhead + dec + fit * each
            left -= fit
            decodes = min(self.max_num_seqs, decodes + fit)
