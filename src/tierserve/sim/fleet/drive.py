"""The fleet's event loop: arrivals, replica steps, the ingress and the autoscaler on one
virtual timeline (sim/fleet.py describes the timeline; fleet_ingress.py and fleet_scale.py the
pieces the cluster shares).

At equal times: a replica becoming ready, then arrivals, then the autoscaler's tick, then the
earliest step start. With no ingress admission, queue or autoscaler this is exactly the loop
``drive_fleet`` always ran. A refused closed-loop client sends the same request again after its
Retry-After (at most ``max_retries`` times), as with one engine (driver.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tierserve.admission import AdmissionController
from tierserve.admission.ttft import Load
from tierserve.clock import ManualClock
from tierserve.cluster.fleet import ReplicaLoad
from tierserve.cluster.signals import ClassWindow, held_metrics, with_held
from tierserve.config import AdmissionConfig, PriorityConfig
from tierserve.engine.core import EngineCore
from tierserve.engine.load import measure_load
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.routing import ReplicaStats, Router, RouteRequest, replica_stats
from tierserve.routing.late_binding import (
    BATCH_CLASSES,
    WaitQueue,
    batch_room,
    class_room,
    could_batch,
)
from tierserve.sim.engine.driver import DriveResult, EngineFeed, SlaClients, first_arrivals, resend
from tierserve.sim.engine.events import EventKind, EventQueue
from tierserve.sim.engine.executor import SimExecutor
from tierserve.sim.fleet.ingress import FleetQueueView, Held
from tierserve.sim.fleet.scale import AutoscaleConfig, Scaler
from tierserve.workloads.synthetic import Workload


@dataclass
class Replica:
    replica_id: str
    engine: EngineCore
    admission: AdmissionController
    executor: SimExecutor
    window: ClassWindow | None = None  # autoscaling signals (cluster/signals.py)
    version: int = 0  # bumped whenever the engine may have changed; keys the cached stats
    state: str = "serving"  # starting | serving | draining | gone
    asked_at: float = 0.0  # when it was asked for (it costs from then)
    ready_at: float = 0.0
    gone_at: float | None = None
    _cached: tuple[int, ReplicaStats] | None = None
    _load: tuple[int, Load] | None = None

    def stats(self) -> ReplicaStats:
        if self._cached is None or self._cached[0] != self.version:
            self._cached = (
                self.version,
                replica_stats(self.engine.scheduler.make_stats(), self.replica_id),
            )
        return self._cached[1]

    def load(self) -> Load:
        """The TTFT predictor's inputs, as a replica publishes them (engine/load.py)."""
        if self._load is None or self._load[0] != self.version:
            self._load = (self.version, measure_load(self.engine))
        return self._load[1]

    def seats(self) -> ReplicaLoad:
        s = self.stats()
        return ReplicaLoad(
            running=s.running,
            waiting=s.waiting,
            waiting_tokens=s.waiting_tokens,
            max_num_seqs=s.max_seats,
            max_step_tokens=s.max_step_tokens,
            prefill_tokens=s.prefill_tokens,
            headroom=s.headroom,
            block_size=s.block_size,
        )


@dataclass
class FleetResult(DriveResult):
    decisions: Counter = field(default_factory=Counter)  # reason of each routing choice
    routed: Counter = field(default_factory=Counter)  # requests per replica id
    replicas: list[Replica] = field(default_factory=list)  # every replica that ever served
    scaler: Scaler | None = None
    held_max: int = 0  # the ingress queue's deepest


@dataclass(frozen=True)
class FleetOptions:
    admission: AdmissionConfig | None = None  # the ingress's (None: each replica's own)
    priorities: PriorityConfig = field(default_factory=PriorityConfig)
    ingress_queue: bool = False
    autoscale: AutoscaleConfig | None = None
    new_replica: Callable[[str], Replica] | None = None  # autoscaling builds replicas
    rate_profile: tuple[tuple[float, float], ...] = ()  # open loop: (from time, rate factor)
    max_retries: int = 0
    sla: SlaClients | None = None


class FleetDriver:
    def __init__(
        self,
        replicas: list[Replica],
        workload: Workload,
        router: Router,
        block_size: int,
        options: FleetOptions | None = None,
        view: FleetQueueView | None = None,
    ) -> None:
        self.replicas = list(replicas)
        self.workload, self.router, self.block_size = workload, router, block_size
        self.opt = options or FleetOptions()
        self.held: WaitQueue[Held] = WaitQueue()
        self.view = view or FleetQueueView(self)
        self.clock = ManualClock()  # the ingress's: the time of the event at hand
        adm = self.opt.admission
        self.admission = (
            None
            if adm is None
            else AdmissionController(adm, self.view, self.clock, self.opt.priorities)
        )
        self.events = EventQueue()
        self.result = FleetResult(replicas=self.replicas)
        self.feeds = {r.replica_id: self._feed(r) for r in self.replicas}
        a = self.opt.autoscale
        self.scaler = Scaler(a) if a else None
        self.result.scaler = self.scaler
        self.next_tick = a.period_s if a else math.inf

    def _feed(self, r: Replica) -> EngineFeed:
        return EngineFeed(
            r.engine, r.admission, self.result, self._on_finish, self.opt.sla, r.window
        )

    def _on_finish(self, when: float) -> None:
        if self.workload.cfg.arrival == "closed":
            self.events.push(when, EventKind.COMPLETION)

    def routable(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == "serving"]

    # -- the ingress ----------------------------------------------------------------------
    def arrive(self, t: float, again: tuple[Request, int] | None) -> None:
        cfg = self.workload.cfg
        req, attempt = (self.workload.make(t), 0) if again is None else again
        if again is not None:
            req = resend(req, t, attempt)
        if cfg.arrival != "closed":
            self.events.push(t + self._gap(t), EventKind.ARRIVAL)
        decision = None
        if self.admission is not None:
            self.clock.set(max(t, self.clock.now()))
            cost = req.num_prompt_tokens + req.sampling_params.max_tokens
            demote = req.tenant in (self.opt.sla or SlaClients()).demote_tenants
            decision = self.admission.decide(
                req.priority, req.tenant, cost, req.num_prompt_tokens, demote
            )
            if not decision.admitted:
                feed = next(iter(self.feeds.values()))
                self._refused(feed.submit(req, t, attempt, decision), req, attempt)
                return
        if self.opt.ingress_queue:
            room = 1 if req.priority == Priority.P0 else self.room(req.priority)
            if not self.held.may_go_now(req.priority, room):
                self.view.hold(Held(req, attempt, decision))
                self.result.held_max = max(self.result.held_max, self.held.depth())
                if req.priority in BATCH_CLASSES:
                    self.release(t)  # a replica may batch it now (as IngressQueue.wait_turn)
                return
        self.dispatch(req, t, attempt, decision)

    def _refused(self, retry: float | None, req: Request, attempt: int) -> None:
        if retry is None or self.workload.cfg.arrival != "closed":
            return
        give_up = attempt >= self.opt.max_retries
        self.events.push(retry, EventKind.ARRIVAL, None if give_up else (req, attempt + 1))

    def _gap(self, t: float) -> float:
        factor = 1.0
        for start, f in self.opt.rate_profile:
            if t >= start:
                factor = f
        return self.workload.gap() / max(factor, 1e-9)

    def room(self, priority: Priority) -> int:
        return class_room((r.seats() for r in self.routable()), priority)

    def dispatch(
        self, req: Request, t: float, attempt: int, decision, by_batch: bool = False
    ) -> None:
        """Bind `req` to a replica: the router's first; with the ingress queue on, the first
        ranked with a seat for its class (`by_batch`: that could batch its prompt now)."""
        reps = self.routable()
        ask = RouteRequest.of(req.prompt_token_ids, req.priority, self.block_size, req.cache_salt)
        ranked = self.router(ask, [r.stats() for r in reps])
        rid, reason = ranked[0]
        if self.opt.ingress_queue:  # late binding: the first ranked replica with room
            by_id, p, n = {r.replica_id: r for r in reps}, req.priority, req.num_prompt_tokens

            def fits(i: str) -> bool:
                r = by_id[i]
                load = r.seats()
                return could_batch(load, p, n) if by_batch else class_room([load], p) > 0

            rid, reason = next(((i, why) for i, why in ranked if fits(i)), ranked[0])
        self.result.decisions[reason] += 1
        self.result.routed[rid] += 1
        rep = next(r for r in reps if r.replica_id == rid)
        clock = rep.engine.clock
        if not rep.engine.has_unfinished() and clock.now() < t:
            clock.set(t)  # an idle replica wakes up at the arrival
        retry = self.feeds[rid].submit(req, max(t, clock.now()), attempt, decision)
        rep.version += 1
        self._refused(retry, req, attempt)

    def release(self, t: float) -> None:
        """Send held requests while their class has room, then held P2/P3 while a replica
        could batch them (routing/late_binding.py)."""
        if not self.held.depth():
            return

        def send(c: Priority, h: Held) -> None:
            self.view.released(h)
            self.dispatch(h.req, t, h.attempt, h.decision, by_batch=self.room(c) <= 0)

        self.held.release(self.room, send)  # by seats, then held P2/P3 by step budget
        self.held.release_to_batch(self.batch_room, lambda h: h.req.num_prompt_tokens, send)

    def batch_room(self, priority: Priority, prompt_tokens: int) -> int:
        return batch_room((r.seats() for r in self.routable()), priority, prompt_tokens)

    # -- the autoscaler -------------------------------------------------------------------
    def tick(self, t: float) -> None:
        a, scaler = self.opt.autoscale, self.scaler
        assert a is not None and scaler is not None
        self.next_tick = t + a.period_s
        for r in self.replicas:
            if r.state == "draining" and not r.engine.has_unfinished():
                r.state, r.gone_at = "gone", max(t, r.engine.clock.now())
        serving = self.routable()
        current = len(serving) + sum(r.state == "starting" for r in self.replicas)
        # Every replica also carries the ingress's held backlog, as a cluster replica learns
        # it from the fleet board (cluster/signals.py).
        slas = self.opt.priorities.ttft_sla_s
        held = held_metrics(*self.held.backlog(lambda h: h.req.arrival_time, t), slas)
        metrics = {
            r.replica_id: with_held(r.window.summary(t), held)
            for r in serving
            if r.window is not None
        }
        change = scaler.tick(t, metrics, current)
        for _ in range(max(0, change)):
            assert self.opt.new_replica is not None
            r = self.opt.new_replica(f"r{len(self.replicas):02d}")
            r.state, r.asked_at, r.ready_at = "starting", t, t + a.start_s
            r.engine.clock.set(r.ready_at)
            self.replicas.append(r)
            self.feeds[r.replica_id] = self._feed(r)
        for r in sorted(serving, key=lambda r: (r.stats().outstanding_tokens, r.asked_at))[
            : max(0, -change)
        ]:
            r.state = "draining"  # routed nothing more; gone once idle

    # -- the loop -------------------------------------------------------------------------
    def _next_ready(self) -> Replica | None:
        starting = [r for r in self.replicas if r.state == "starting"]
        return min(starting, key=lambda r: r.ready_at) if starting else None

    def run(self, progress: Callable[[float], None] | None = None) -> FleetResult:
        cfg, events = self.workload.cfg, self.events
        first_arrivals(self.workload, events, 0.0)
        while True:
            t_arr = events.peek_time()
            busy = [
                (r.engine.clock.now(), i)
                for i, r in enumerate(self.replicas)
                if r.state in ("serving", "draining") and r.engine.has_unfinished()
            ]
            first = min(busy) if busy else None
            live = t_arr is not None or first is not None or self.held.depth() > 0
            ready = self._next_ready()
            t_step = first[0] if first else math.inf
            t_next = min(t_arr if t_arr is not None else math.inf, t_step)
            if ready is not None and live and ready.ready_at <= t_next:
                ready.state = "serving"
                self.release(ready.ready_at)
                continue
            if t_arr is not None and t_arr <= t_step and t_arr <= self.next_tick:
                for t, _kind, again in events.pop_due(t_arr):
                    if t < cfg.duration_s:  # arrivals stop; a closed-loop client retires
                        self.arrive(t, again)
                continue
            if self.scaler is not None and live and self.next_tick <= t_step:
                self.tick(self.next_tick)
                continue
            if first is None:
                break
            self._step(first[1], t_arr)
            if progress:
                progress(first[0])
        self.result.end_time = max(r.engine.clock.now() for r in self.replicas)
        for r in self.replicas:
            if r.gone_at is None and r.state != "starting":
                r.gone_at = self.result.end_time
        return self.result

    def _step(self, i: int, t_arr: float | None) -> None:
        rep = self.replicas[i]
        progressed = self.feeds[rep.replica_id].step()
        rep.version += 1
        if not progressed:  # nothing could be scheduled: wait for the next event
            if t_arr is None:
                raise RuntimeError(f"{rep.replica_id} has work it cannot schedule; none arrives")
            rep.engine.clock.set(t_arr)
        self.release(rep.engine.clock.now())
