"""Calm steps: while realtime traffic is about, background decodes are paced so that a P0
arriving mid-step waits for a short step.

A P0 request that arrives while a step runs waits for that step, then gets an express step. A
step's decodes are never cut by the time bound (core/step_time.py), so a batch of background
decodes (a Batch API window of 32 lines: ~0.1 s a step on a 2-core CPU) sets P0's wait. While a
P0 arrived within the last `recent_s`, the decodes of classes P2 and P3 are limited to those
predicted to fit, with the more urgent classes' decodes, within `fraction` x P0's TTFT SLA; the
ones held sit the step out (they keep their seat and memory) and go first next time (the least
recently served first), and at least one background decode runs every step, so they all
progress. Inactive before the step-time model is calibrated, without a P0 SLA, and under a
policy that does not serve P0 first.

Two settings: `--p0-calm-fraction` (off by default) paces every P2/P3 decode; the batch
fraction (`SchedulerConfig.batch_calm_fraction`, 0.1 by default) paces only the lines of Batch
API batches (a batch steps aside for realtime traffic; interactive P2/P3 are untouched). With
both, the tighter bound applies to batch lines."""

from __future__ import annotations

from tierserve.core.step_time import StepCoefficients, StepWork
from tierserve.priority import Priority
from tierserve.request import Request


class CalmSteps:
    def __init__(
        self,
        fraction: float | None,
        recent_s: float,
        p0_sla: float | None,
        batch_fraction: float | None = None,
    ) -> None:
        def bound(f: float | None) -> float | None:
            return f * p0_sla if f is not None and p0_sla is not None else None

        self.bound = bound(fraction)  # every background decode
        self.batch_bound = bound(batch_fraction)  # Batch API lines only
        self.recent_s = recent_s
        self.last_p0 = float("-inf")
        self._turn: dict[str, int] = {}  # background request -> step it last decoded in
        self._step = 0
        self.held_total = 0  # decodes held back since the start

    def on_arrival(self, req: Request, now: float) -> None:
        if req.priority == Priority.P0:
            self.last_p0 = now

    def forget(self, request_id: str) -> None:
        self._turn.pop(request_id, None)

    def hold(self, decodes: list[Request], coef: StepCoefficients, now: float) -> set[str]:
        """Of this step's decodes (rank order), the background ones to hold back."""
        self._step += 1
        if self.bound is None and self.batch_bound is None:
            return set()
        if not coef.calibrated or now - self.last_p0 > self.recent_s:
            return set()
        if self.bound is not None:  # every background decode is paced
            bound = min(self.bound, self.batch_bound or self.bound)

            def paced(r: Request) -> bool:
                return r.priority >= Priority.P2
        else:  # only the batch lines
            bound = self.batch_bound

            def paced(r: Request) -> bool:
                return r.priority >= Priority.P2 and r.batch_line

        urgent = [r for r in decodes if not paced(r)]
        background = [r for r in decodes if paced(r)]
        if len(background) <= 1:
            return set()
        n = len(urgent)
        ctx = sum(r.num_tokens for r in urgent)
        background.sort(key=lambda r: self._turn.get(r.request_id, -1))
        kept = 0
        for r in background:
            c = ctx + r.num_tokens
            if kept and coef.seconds(StepWork(n + 1, n + 1, c, c, n + 1)) > bound:
                break
            n, ctx, kept = n + 1, c, kept + 1
            self._turn[r.request_id] = self._step
        held = {r.request_id for r in background[kept:]}
        self.held_total += len(held)
        return held
