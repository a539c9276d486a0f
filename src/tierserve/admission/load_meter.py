"""LoadMeter: the rates the TTFT predictor divides by, measured online by the thread that steps
the engine (in the simulator, on the virtual clock: there it measures the cost model).

* Prefill rate ``R``: prefill tokens computed per second over the steps taken while a backlog
  existed (requests still waiting after the step), so it is the rate at which queued work is
  served, decode traffic and seat or memory limits included. Both sums decay with the measured
  time (``tau_s``), so ``R`` follows the last few seconds of backlog and keeps its value through
  idle periods. Before any measurement it is the executor's measured prefill speed
  (``PreemptionCosts.prefill_tokens_per_s``), weighted as one second of measurement.
* Step time: the same decaying average over every step.
* Seat rate: requests leaving the running batch per second, decayed over ``SEAT_TAU_S``: how
  fast a queue waiting for seats (every one taken) moves.
* Computed share: of the prompt tokens of requests starting their prefill, the share not found
  in the prefix cache, over the last ~``SHARE_TOKENS``. Queues and prompts are counted in
  prompt tokens, rates in computed ones: a request's prompt costs ``share x`` its tokens (a
  chat template's system prompt is cached: on the embedded model, about two thirds of a short
  chat prompt).
* Arrival rate per class, and per tenant in each class: prompt tokens entering the queue per
  second, the sum of arrivals decayed with ``arrival_tau_s`` over ``arrival_tau_s`` (a burst
  counts as spread over that time; in the first seconds after start the rate is understated).

A step's interval runs from the end of the previous step when that one left a backlog (from
then on the queue waited, whatever the engine did: detokenizing, publishing, waiting for the
GIL or for memory), else from its own start (the engine may have idled).

**Recovery.** The measured rate describes the backlog of the last seconds: an overload that
filled every seat measures a low one. Once no backlog is left it says nothing about the engine
now, so ``prefill_rate_at`` fades it toward the rate the engine's step-time model gives for its
current state (``nominal``, admission/engine_rate.py), with time constant ``recover_s`` from the
end of the last backlogged step: a few seconds after a burst ends, a new request is judged on
what the engine can do, not on the burst (it used to keep the burst's rate, with nothing to
measure a new one: every P1 refused by an idle engine).
"""

from __future__ import annotations

import math

from tierserve.priority import NUM_PRIORITIES, Priority

SEED_WEIGHT_S = 1.0
MAX_TENANTS = 1024  # tenant rates kept per class before the faded ones are dropped
SEAT_TAU_S = 3.0  # seats freed are counted over about this long
SHARE_TOKENS = 4096.0  # the computed share of prompts is measured over about this many tokens
MIN_SHARE = 0.05  # a prompt is never priced below this share of its tokens


class LoadMeter:
    def __init__(
        self,
        seed_prefill_rate: float | None = None,
        tau_s: float = 5.0,
        arrival_tau_s=10.0,
        recover_s: float = 1.0,
    ) -> None:
        self.tau_s = tau_s
        self.recover_s = recover_s
        self._backlog_end: float | None = None  # end of the last step that left a backlog
        self.arrival_tau_s = arrival_tau_s
        seeded = seed_prefill_rate is not None and seed_prefill_rate > 0
        self._tokens = seed_prefill_rate * SEED_WEIGHT_S if seeded else 0.0
        self._time = SEED_WEIGHT_S if seeded else 0.0
        self._step_s: float | None = None
        self._prev_end: float | None = None  # end of the previous step, if it left a backlog
        self._arrivals = [0.0] * NUM_PRIORITIES
        self._arrivals_at: float | None = None
        # Per class: tenant -> [decayed tokens, when last decayed] (decayed when read).
        self._tenants: list[dict[str, list[float]]] = [{} for _ in range(NUM_PRIORITIES)]
        # Seats freed (requests leaving the running batch), decayed like arrivals.
        self._freed_seen = 0
        self._freed = [0.0, None]  # [decayed count, when last decayed]
        self._share_seen = (0, 0)  # the engine's (started, cached) prompt tokens, last read
        self._started = self._cached = 0.0  # decayed sums of the same

    def computed_share(self, started_total: int, cached_total: int) -> float:
        """The share of prompt tokens computed (not found in the prefix cache), over the last
        ~``SHARE_TOKENS`` prompt tokens started; `started_total` and `cached_total` are the
        engine's counts since the start. 1 before any prompt started."""
        started = started_total - self._share_seen[0]
        if started > 0:
            keep = math.exp(-started / SHARE_TOKENS)
            self._started = keep * self._started + started
            self._cached = keep * self._cached + (cached_total - self._share_seen[1])
        self._share_seen = (started_total, cached_total)
        if self._started <= 0:
            return 1.0
        return max(MIN_SHARE, 1.0 - self._cached / self._started)

    # -- steps -----------------------------------------------------------------------------
    def on_step(self, start: float, end: float, prefill_tokens: int, backlog: bool) -> None:
        prev = self._prev_end
        interval = end - (prev if prev is not None and prev <= start else start)
        self._prev_end = end if backlog else None
        if backlog:
            self._backlog_end = end
        if interval <= 0:
            return
        keep = math.exp(-interval / self.tau_s)
        old = self._step_s
        self._step_s = interval if old is None else keep * old + (1 - keep) * interval
        if backlog:
            self._tokens = keep * self._tokens + prefill_tokens
            self._time = keep * self._time + interval

    @property
    def prefill_rate(self) -> float | None:
        return self._tokens / self._time if self._time > 0 else None

    def prefill_rate_at(self, now: float, nominal: float | None) -> float | None:
        """The measured rate, faded toward `nominal` (the rate the engine's model gives for its
        state now) with the time since the last step that left a backlog: unchanged while a
        backlog waits, `nominal` a few `recover_s` after the last one drained."""
        measured = self.prefill_rate
        if nominal is None or measured is None:
            return measured if nominal is None else nominal
        if self._prev_end is not None:  # the last step left a backlog: it is being measured
            return measured
        idle = now - self._backlog_end if self._backlog_end is not None else math.inf
        keep = math.exp(-max(0.0, idle) / self.recover_s)
        return keep * measured + (1.0 - keep) * nominal

    @property
    def step_s(self) -> float:
        return self._step_s or 0.0

    # -- arrivals --------------------------------------------------------------------------
    def on_add(self, priority: Priority, tokens: int, now: float, tenant: str = "") -> None:
        self._decay(now)
        self._arrivals[priority] += tokens
        mine = self._tenants[priority]
        entry = mine.setdefault(tenant, [0.0, now])
        entry[0] = self._faded(entry, now) + tokens
        entry[1] = now
        if len(mine) > MAX_TENANTS:
            for t in [t for t, e in mine.items() if self._faded(e, now) < 1.0]:
                del mine[t]

    def _faded(self, entry: list[float], now: float) -> float:
        return entry[0] * math.exp(-max(0.0, now - entry[1]) / self.arrival_tau_s)

    def tenant_rate(self, priority: Priority, tenant: str, now: float) -> float:
        """Tokens per second `tenant` sends into class `priority` (as ``arrival_rates``)."""
        entry = self._tenants[priority].get(tenant)
        return 0.0 if entry is None else self._faded(entry, now) / self.arrival_tau_s

    def arrival_rates(self, now: float) -> tuple[float, ...]:
        """Tokens per second entering each class's queue, over the last ~`arrival_tau_s`."""
        self._decay(now)
        return tuple(a / self.arrival_tau_s for a in self._arrivals)

    def seat_rate(self, now: float, freed_total: int) -> float:
        """Requests leaving the running batch per second (finished, failed or preempted), over
        the last ~``SEAT_TAU_S``; `freed_total` is the engine's count since the start."""
        count, when = self._freed
        if when is not None:
            count *= math.exp(-max(0.0, now - when) / SEAT_TAU_S)
        count += max(0, freed_total - self._freed_seen)
        self._freed_seen = freed_total
        self._freed = [count, now]
        return count / SEAT_TAU_S

    def _decay(self, now: float) -> None:
        if self._arrivals_at is not None and now > self._arrivals_at:
            keep = math.exp(-(now - self._arrivals_at) / self.arrival_tau_s)
            self._arrivals = [a * keep for a in self._arrivals]
        self._arrivals_at = now if self._arrivals_at is None else max(now, self._arrivals_at)
