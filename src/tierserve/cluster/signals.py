"""Per-class service signals a replica exports for autoscaling: how long each class waits for
its first token, relative to its TTFT SLA, and how often it meets the SLA, over a recent window.

``ClassWindow`` is fed from the engine thread's events (added, first token, finished) and read
on the same thread when a snapshot is published; what it returns is immutable. Two waits count:
the TTFTs of requests that got their first token within the window, and the age of requests that
are still waiting for one -- a starved P0 queue produces no TTFT samples at all, but its age
grows. A request counts as waiting from ``Added`` until its ``FirstToken``, never while it
decodes: a long stream is not a request at risk. A class's *wait ratio* is the larger of its
P95 TTFT and its oldest waiter's age, over its SLA; its *attainment* is the fraction of the
window's verdicts that met the SLA (1.0 with none). A verdict is a first token (met if within
the SLA), or a request that ended without one after its SLA had passed (ended early by the SLA
re-check, failed, or its client gave up): a miss. A request that ends without a token before its
SLA passed gives no verdict. A class's *served rate* is its first tokens per second over the
window (over the replica's life while that is shorter, at least 1 s): what the replica drains
of that class's queue, which the autoscaler sizes a scale-out by (autoscale.py).

A replica's *seats in use* size a scale-in: the requests it holds (from ``Added`` to
``Finished``, waiting or decoding, every class), now (``in_flight``) and averaged over the
window by time (``in_flight_mean``; over the replica's life while that is shorter), against its
``seats`` (``max_num_seqs``; 0 where the window was not told). The metrics carry no capacity in
requests per second (a replica's served rate is what it was asked for, not what it could
serve), so the autoscaler reads the load as seats held over seats there are (autoscale.py).

The ingress's *held backlog* (``--ingress-queue on``: requests that found no room anywhere in
the fleet and wait at the ingress, bound to no replica) is invisible to every replica's window.
``held_metrics`` turns it into the same kind of flat floats: per class, the requests held and
the oldest one's wait over the class's SLA. The ingress pushes them to the fleet board; the
board hands the fleet's sum (``merge_held``: over ingress replicas) back to every engine replica
with its report's reply, and each replica exports them with its own signals, so the
autoscaling policy reads both in one context (autoscale.py). The simulated fleet adds the same
figures to every replica's metrics.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tierserve.priority import NUM_PRIORITIES, Priority

WINDOW_S = 30.0


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(0.95 * len(s)))]


@dataclass(frozen=True)
class ClassSignals:
    wait_ratio: tuple[float, ...]  # max(P95 TTFT, oldest waiter's age) / SLA; 0 without an SLA
    attainment: tuple[float, ...]  # verdicts that met the SLA / verdicts, 1.0 without any
    samples: tuple[int, ...]  # verdicts in the window
    waiting: tuple[int, ...]  # requests still without a first token
    served_per_s: tuple[float, ...] = (0.0,) * NUM_PRIORITIES  # first tokens per second
    in_flight: int = 0  # requests held now (added, not finished), every class
    in_flight_mean: float = 0.0  # the same, averaged by time over the window
    seats: int = 0  # the replica's max_num_seqs; 0: unknown

    def autoscaling_metrics(self) -> dict[str, float]:
        """Flat floats for Ray Serve's ``record_autoscaling_stats``."""
        out: dict[str, float] = {}
        for p in Priority:
            k = p.label.lower()
            out[f"{k}_wait_ratio"] = float(self.wait_ratio[p])
            out[f"{k}_sla_attainment"] = float(self.attainment[p])
            out[f"{k}_waiting"] = float(self.waiting[p])
            out[f"{k}_served_per_s"] = float(self.served_per_s[p])
        out["in_flight"] = float(self.in_flight)
        out["in_flight_mean"] = float(self.in_flight_mean)
        out["seats"] = float(self.seats)
        return out


def held_metrics(
    held: Sequence[int], oldest_s: Sequence[float], slas: Sequence[float | None]
) -> dict[str, float]:
    """The ingress's held backlog as autoscaling metrics (see the module docstring): per class
    ``pN_held`` (requests held) and ``pN_held_wait_ratio`` (the oldest one's wait / the class's
    TTFT SLA; 0 without an SLA). `held`, `oldest_s`: ``WaitQueue.backlog``'s two tuples."""
    out: dict[str, float] = {}
    for p in Priority:
        k, sla = p.label.lower(), slas[p]
        out[f"{k}_held"] = float(held[p])
        out[f"{k}_held_wait_ratio"] = max(0.0, oldest_s[p]) / sla if sla and held[p] else 0.0
    return out


def with_held(signals: ClassSignals, held: Mapping[str, float]) -> dict[str, float]:
    """A replica's autoscaling metrics: its own class signals and the ingress's held backlog
    (the board's last reply; the simulated fleet's ingress queue)."""
    return {**signals.autoscaling_metrics(), **held}


def merge_held(reports: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Several ingress replicas' ``held_metrics`` as the fleet's: the held requests summed, the
    wait ratio the largest."""
    zero = (0,) * NUM_PRIORITIES
    out = held_metrics(zero, zero, (None,) * NUM_PRIORITIES)  # every key, with none held
    for r in reports:
        for name, v in r.items():
            if name in out:
                out[name] = out[name] + v if name.endswith("_held") else max(out[name], v)
    return out


class ClassWindow:
    def __init__(
        self, slas: tuple[float | None, ...], window_s: float = WINDOW_S, seats: int = 0
    ) -> None:
        if len(slas) != NUM_PRIORITIES:
            raise ValueError(f"need {NUM_PRIORITIES} SLAs (P0..P3), got {slas}")
        self.slas = slas
        self.window_s = window_s
        self.seats = seats
        self._live: set[str] = set()  # added, not finished: the seats in use
        # (time, requests held from then on, their integral over time up to then): every
        # change of `_live`, the window's and one before it (times made non-decreasing).
        self._marks: deque[tuple[float, int, float]] = deque()
        self._ttfts: list[deque[tuple[float, float]]] = [deque() for _ in range(NUM_PRIORITIES)]
        self._pending: dict[str, tuple[Priority, float]] = {}  # no first token yet
        self._served: list[deque[float]] = [deque() for _ in range(NUM_PRIORITIES)]  # when
        self._since: float | None = None  # the first request's arrival: the window's start

    def _held_area(self, t: float) -> float:
        """The integral of the requests held, from the first mark up to `t`."""
        if not self._marks:
            return 0.0
        t0, n, area = self._marks[-1]
        return area + n * max(0.0, t - t0)

    def _mark(self, t: float) -> None:
        if self._marks:
            t = max(t, self._marks[-1][0])
        self._marks.append((t, len(self._live), self._held_area(t)))
        while len(self._marks) > 2 and self._marks[1][0] <= t - 2 * self.window_s:
            self._marks.popleft()

    def _held_mean(self, start: float, end: float) -> float:
        """The requests held, averaged over [start, end] (the span at least 1 s)."""
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= start:
            marks.popleft()
        if not marks:
            return 0.0
        end = max(end, marks[-1][0])
        t0, n0, a0 = marks[0]
        return (self._held_area(end) - (a0 + n0 * max(0.0, start - t0))) / max(1.0, end - start)

    def on_added(self, request_id: str, priority: Priority, arrival: float) -> None:
        self._pending[request_id] = (priority, arrival)
        if self._since is None:
            self._since = arrival
        self._live.add(request_id)
        self._mark(arrival)

    def on_first_token(self, request_id: str, priority: Priority, ttft: float, now: float) -> None:
        self._pending.pop(request_id, None)
        self._ttfts[priority].append((now, ttft))
        self._served[priority].append(now)

    def on_finished(self, request_id: str, now: float) -> None:
        if request_id in self._live:
            self._live.discard(request_id)
            self._mark(now)
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        priority, arrival = pending
        sla = self.slas[priority]
        if sla is not None and now - arrival > sla:  # it never got a token in time: a miss
            self._ttfts[priority].append((now, now - arrival))

    def summary(self, now: float) -> ClassSignals:
        oldest = [0.0] * NUM_PRIORITIES
        waiting = [0] * NUM_PRIORITIES
        for p, arrival in self._pending.values():
            waiting[p] += 1
            oldest[p] = max(oldest[p], now - arrival)
        ratio, attain, n, rate = [], [], [], []
        life = min(self.window_s, now - (now if self._since is None else self._since))
        span = max(1.0, life)
        for p in Priority:
            served = self._served[p]
            while served and now - served[0] > self.window_s:
                served.popleft()
            rate.append(len(served) / span)
            q = self._ttfts[p]
            while q and now - q[0][0] > self.window_s:
                q.popleft()
            ttfts = [t for _, t in q]
            sla = self.slas[p]
            wait = max(_p95(ttfts), oldest[p])
            ratio.append(wait / sla if sla else 0.0)
            met = sum(1 for t in ttfts if sla is None or t <= sla)
            attain.append(met / len(ttfts) if ttfts else 1.0)
            n.append(len(ttfts))
        return ClassSignals(
            tuple(ratio),
            tuple(attain),
            tuple(n),
            tuple(waiting),
            tuple(rate),
            len(self._live),
            self._held_mean(now - life, now),
            self.seats,
        )
