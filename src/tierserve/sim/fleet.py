"""A simulated fleet: M replicas, each the real scheduler + KV manager + policy around its own
SimExecutor and virtual clock (as runner.build makes one), fed by one workload through a router.

One timeline for all: every replica's clock is the time its next step may start. The loop takes
whichever comes first, the next arrival or the earliest step start among busy replicas
(arrivals first at equal times, as the single-replica driver admits what is due before
stepping). A step runs whole when it starts; its tokens and finishes are stamped with its end.
An arrival is routed on stats computed from each replica at that moment (``replica_stats``,
recomputed only for replicas that changed since); a replica that is mid-step is seen as it will
be after that step, at most one step early. A request routed to an idle replica starts that
replica's clock at the arrival time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tierserve.admission import AdmissionController
from tierserve.engine.core import EngineCore
from tierserve.priority import Priority
from tierserve.routing import (
    ROUTER_NAMES,
    ReplicaStats,
    Router,
    RouteRequest,
    make_router,
    rank_replicas,
    replica_stats,
)
from tierserve.routing.rank import DEFAULT_ROUTING, Choice, RoutingConfig, p0_start_cost
from tierserve.sim.driver import DriveResult, EngineFeed, first_arrivals
from tierserve.sim.events import EventKind, EventQueue
from tierserve.sim.executor import SimExecutor
from tierserve.sim.runner import SimConfig, build
from tierserve.sim.stats import run_stats
from tierserve.sim.workload import Workload, make_workload


@dataclass(frozen=True)
class FleetConfig:
    sim: SimConfig  # one replica's hardware, model, engine settings; the fleet's workload
    replicas: int = 16
    router: str = "priority-aware"
    routing: RoutingConfig = DEFAULT_ROUTING

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        fleet_router(self.router, self.routing)  # a clear error for an unknown name


def step_oracle(request: RouteRequest, stats: list[ReplicaStats]) -> list[Choice]:
    """A reference no real router can implement: P0 goes, among the replicas where it can start
    now, to the one whose step in flight ends first (in this simulator a replica's stats are
    taken at the end of its step in flight, so ``ReplicaStats.time`` is that moment). Other
    classes as priority-aware. It bounds what step-level knowledge could give P0."""
    if request.priority != Priority.P0:
        return rank_replicas(request, stats)
    order = sorted(
        stats,
        key=lambda s: (not p0_start_cost(request, s, DEFAULT_ROUTING)[0], s.time, s.replica_id),
    )
    return [(s.replica_id, "step-oracle") for s in order]


FLEET_ROUTERS = (*ROUTER_NAMES, "step-oracle")


def fleet_router(name: str, routing: RoutingConfig = DEFAULT_ROUTING) -> Router:
    return step_oracle if name == "step-oracle" else make_router(name, routing)


@dataclass
class Replica:
    replica_id: str
    engine: EngineCore
    admission: AdmissionController
    executor: SimExecutor
    version: int = 0  # bumped whenever the engine may have changed; keys the cached stats
    _cached: tuple[int, ReplicaStats] | None = None

    def stats(self) -> ReplicaStats:
        if self._cached is None or self._cached[0] != self.version:
            self._cached = (
                self.version,
                replica_stats(self.engine.scheduler.make_stats(), self.replica_id),
            )
        return self._cached[1]


@dataclass
class FleetResult(DriveResult):
    decisions: Counter = field(default_factory=Counter)  # reason of each routing choice
    routed: Counter = field(default_factory=Counter)  # requests per replica id


def drive_fleet(
    replicas: list[Replica],
    workload: Workload,
    router: Router,
    block_size: int,
    progress: Callable[[float], None] | None = None,
) -> FleetResult:
    cfg = workload.cfg
    events = EventQueue()
    result = FleetResult()
    first_arrivals(workload, events, 0.0)

    def on_finish(when: float) -> None:
        if cfg.arrival == "closed":
            events.push(when, EventKind.COMPLETION)

    feeds = [EngineFeed(r.engine, r.admission, result, on_finish) for r in replicas]
    index = {r.replica_id: i for i, r in enumerate(replicas)}

    def arrive(t: float) -> None:
        req = workload.make(t)
        ask = RouteRequest.of(req.prompt_token_ids, req.priority, block_size, req.cache_salt)
        rid, reason = router(ask, [r.stats() for r in replicas])[0]
        result.decisions[reason] += 1
        result.routed[rid] += 1
        rep, feed = replicas[index[rid]], feeds[index[rid]]
        clock = rep.engine.clock
        if not rep.engine.has_unfinished() and clock.now() < t:
            clock.set(t)  # an idle replica wakes up at the arrival
        retry = feed.submit(req, max(t, clock.now()))
        rep.version += 1
        if retry is not None and cfg.arrival == "closed":
            events.push(retry, EventKind.ARRIVAL)
        if cfg.arrival != "closed":
            events.push(t + workload.gap(), EventKind.ARRIVAL)

    while True:
        t_arr = events.peek_time()
        busy = [
            (r.engine.clock.now(), i) for i, r in enumerate(replicas) if r.engine.has_unfinished()
        ]
        first = min(busy) if busy else None
        if t_arr is not None and (first is None or t_arr <= first[0]):
            for t, _kind, _ in events.pop_due(t_arr):
                if t < cfg.duration_s:  # arrivals stop; a closed-loop client retires
                    arrive(t)
            continue
        if first is None:
            break
        rep = replicas[first[1]]
        progressed = feeds[first[1]].step()
        rep.version += 1
        if not progressed:  # nothing could be scheduled: wait for the next event
            if t_arr is None:
                raise RuntimeError(f"{rep.replica_id} has work it cannot schedule; none arrives")
            rep.engine.clock.set(t_arr)
        if progress:
            progress(first[0])
    result.end_time = max(r.engine.clock.now() for r in replicas)
    return result


def build_fleet(cfg: FleetConfig) -> list[Replica]:
    out = []
    for i in range(cfg.replicas):
        engine, ex, _cost = build(cfg.sim)
        adm = AdmissionController(
            cfg.sim.admission, engine.scheduler, engine.clock, cfg.sim.priorities
        )
        out.append(Replica(f"r{i:02d}", engine, adm, ex))
    return out


def run_fleet(cfg: FleetConfig) -> dict:
    """Run the fleet under `cfg.router` and summarise it like ``run_simulation`` does."""
    t0 = time.perf_counter()
    sim, w = cfg.sim, cfg.sim.workload
    replicas = build_fleet(cfg)
    wl = make_workload(w)
    for r in replicas:
        r.executor.output_lengths = wl.output_lengths
    result = drive_fleet(replicas, wl, fleet_router(cfg.router, cfg.routing), sim.block_size)
    lo, hi = w.warmup_s, w.duration_s
    out = run_stats(result, lo, hi, sim.priorities)
    # Busy time inside the window, each step clipped to it.
    busy = sum(max(0.0, min(hi, s.time) - max(lo, s.time - s.duration)) for s in result.samples)
    pre = [r.engine.scheduler.preemptions for r in replicas]
    routed = [result.routed[r.replica_id] for r in replicas]
    for r in replicas:
        r.engine.scheduler.check_invariants()
    out.update(
        router=cfg.router,
        replicas=cfg.replicas,
        policy=sim.policy,
        hardware=sim.hardware,
        model=sim.model,
        tp=sim.tp,
        arrival=w.arrival,
        concurrency=w.concurrency if w.arrival == "closed" else None,
        rate=w.rate if w.arrival != "closed" else None,
        utilization=busy / (hi - lo) / cfg.replicas,
        decisions=dict(sorted(result.decisions.items())),
        routed_min=min(routed),
        routed_max=max(routed),
        preemptions={"swap": sum(p.swap for p in pre), "recompute": sum(p.recompute for p in pre)},
        preempted_by_class={
            f"P{c}": sum(p.by_victim_class[c] for p in pre)
            for c in range(len(pre[0].by_victim_class))
        },
        steps=sum(r.executor.totals.steps for r in replicas),
        simulated_s=result.end_time,
        wall_s=time.perf_counter() - t0,
        config={
            "workload": {k: v for k, v in asdict(w).items() if k != "classes"},
            "max_num_seqs": sim.max_num_seqs,
            "max_num_batched_tokens": sim.max_num_batched_tokens,
            "p0_express": sim.p0_express,
            "routing": asdict(cfg.routing),
        },
    )
    return out
