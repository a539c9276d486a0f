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
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from tierserve.admission import AdmissionController
from tierserve.cluster.signals import ClassWindow
from tierserve.engine.load import LateRequestCheck
from tierserve.priority import Priority
from tierserve.routing import (
    ROUTER_NAMES,
    ReplicaStats,
    Router,
    RouteRequest,
    make_router,
    rank_replicas,
)
from tierserve.routing.rank import DEFAULT_ROUTING, Choice, RoutingConfig, p0_start_cost
from tierserve.sim.engine.driver import SlaClients
from tierserve.sim.engine.runner import SimConfig, build
from tierserve.sim.engine.stats import run_stats
from tierserve.sim.fleet.drive import FleetDriver, FleetOptions, FleetResult, Replica
from tierserve.sim.fleet.scale import AutoscaleConfig
from tierserve.workloads import make_workload
from tierserve.workloads.synthetic import Workload


@dataclass(frozen=True)
class FleetConfig:
    sim: SimConfig  # one replica's hardware, model, engine settings; the fleet's workload
    replicas: int = 16  # at the start (with autoscaling: then between its bounds)
    router: str = "priority-aware"
    routing: RoutingConfig = DEFAULT_ROUTING
    # The cluster ingress's pieces (docs/scale-out.md, "Simulated fleet"): fleet SLA
    # admission, the ingress queue (late binding), and the class autoscaler.
    sla_admission: bool = False
    ingress_queue: bool = False
    # Queue limits the ingress admits by (requests per class; None: the replicas' config's).
    ingress_max_queued: tuple[int, ...] | None = None
    autoscale: AutoscaleConfig | None = None
    # Open loop: (from simulated time, factor on the arrival rate), e.g. a peak.
    rate_profile: tuple[tuple[float, float], ...] = ()
    label: str = ""  # how reports name the run (default: the router and switches)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        fleet_router(self.router, self.routing)  # a clear error for an unknown name
        a = self.autoscale
        if a is not None and not a.min_replicas <= self.replicas <= a.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) must lie within autoscaling's "
                f"{a.min_replicas}:{a.max_replicas}"
            )
        if any(f <= 0 for _, f in self.rate_profile):
            raise ValueError(f"rate factors must be positive, got {self.rate_profile}")

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        parts = [self.router]
        parts += ["sla-admission"] if self.sla_admission else []
        parts += ["ingress-queue"] if self.ingress_queue else []
        a = self.autoscale
        parts += [f"autoscale {a.min_replicas}:{a.max_replicas}"] if a else []
        return " + ".join(parts)

    def replica_sim(self) -> SimConfig:
        """One replica's config: with fleet SLA admission its policy is SLA admission's."""
        return with_sla(self.sim, self.sla_admission)


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


def drive_fleet(
    replicas: list[Replica],
    workload: Workload,
    router: Router,
    block_size: int,
    progress: Callable[[float], None] | None = None,
    options: FleetOptions | None = None,
) -> FleetResult:
    """Run `workload` over `replicas` (sim/fleet_drive.py; `options`: the ingress's admission
    and queue, the autoscaler)."""
    return FleetDriver(replicas, workload, router, block_size, options).run(progress)


def with_sla(sim: SimConfig, on: bool) -> SimConfig:
    return replace(sim, admission=replace(sim.admission, sla_admission=on)) if on else sim


def new_replica(cfg: FleetConfig, replica_id: str) -> Replica:
    sim = cfg.replica_sim()
    engine, ex, _cost = build(sim)
    adm = AdmissionController(sim.admission, engine.scheduler, engine.clock, sim.priorities)
    window = None
    if cfg.autoscale is not None:
        slas = tuple(sim.priorities.sla(p) for p in Priority)
        window = ClassWindow(slas, cfg.autoscale.window_s, seats=sim.max_num_seqs)
    return Replica(replica_id, engine, adm, ex, window)


def build_fleet(cfg: FleetConfig) -> list[Replica]:
    return [new_replica(cfg, f"r{i:02d}") for i in range(cfg.replicas)]


def fleet_options(cfg: FleetConfig, output_lengths: dict) -> FleetOptions:
    """The driver's options for `cfg`: the ingress admits (by its own queue limits, and with
    SLA admission on) when admission or the queue is on."""
    sim = cfg.replica_sim()
    admission = None
    if cfg.sla_admission or cfg.ingress_queue:
        admission = replace(sim.admission, sla_admission=cfg.sla_admission)
        if cfg.ingress_max_queued is not None:
            admission = replace(admission, max_queued_requests=cfg.ingress_max_queued)
    recheck = None
    if cfg.sla_admission:
        a = sim.admission
        recheck = LateRequestCheck(sim.priorities, a.sla_margin, a.sla_recheck_s)
    sla = SlaClients(frozenset(sim.demote_tenants), frozenset(sim.end_early_tenants), recheck)

    def make(replica_id: str) -> Replica:
        r = new_replica(cfg, replica_id)
        r.executor.output_lengths = output_lengths
        return r

    return FleetOptions(
        admission, sim.priorities, cfg.ingress_queue, cfg.autoscale, make, cfg.rate_profile,
        sim.max_retries, sla,
    )  # fmt: skip


def replica_seconds(result: FleetResult, lo: float, hi: float) -> float:
    """Replica-seconds spent inside [lo, hi): each replica from when it was asked for (0 for
    the first ones) until it left (or the run ended)."""
    end = result.end_time
    return sum(
        max(0.0, min(hi, r.gone_at if r.gone_at is not None else end) - max(lo, r.asked_at))
        for r in result.replicas
    )


def run_fleet(cfg: FleetConfig) -> dict:
    """Run the fleet under `cfg.router` and summarise it like ``run_simulation`` does."""
    t0 = time.perf_counter()
    sim, w = cfg.sim, cfg.sim.workload
    replicas = build_fleet(cfg)
    wl = make_workload(w)
    for r in replicas:
        r.executor.output_lengths = wl.output_lengths
    router = fleet_router(cfg.router, cfg.routing)
    options = fleet_options(cfg, wl.output_lengths)
    result = FleetDriver(replicas, wl, router, sim.block_size, options).run()
    replicas = result.replicas
    lo, hi = w.warmup_s, w.duration_s
    out = run_stats(result, lo, hi, sim.priorities)
    # Busy time inside the window, each step clipped to it.
    busy = sum(max(0.0, min(hi, s.time) - max(lo, s.time - s.duration)) for s in result.samples)
    rs = replica_seconds(result, lo, hi)
    pre = [r.engine.scheduler.preemptions for r in replicas]
    routed = [result.routed[r.replica_id] for r in replicas if result.routed[r.replica_id]]
    for r in replicas:
        r.engine.scheduler.check_invariants()
    on_time = sum(out["classes"][c]["goodput_requests_per_s"] * (hi - lo) for c in ("P0", "P1"))
    out.update(
        router=cfg.router,
        run=cfg.name,
        replicas=cfg.replicas,
        sla_admission=cfg.sla_admission,
        ingress_queue=cfg.ingress_queue,
        autoscale=asdict(cfg.autoscale) if cfg.autoscale else None,
        replicas_used=len(replicas),
        replica_seconds=rs,
        replica_seconds_per_on_time_p0_p1=rs / on_time if on_time else None,
        scale_decisions=[asdict(d) for d in result.scaler.decisions] if result.scaler else [],
        ingress_held_max=result.held_max,
        policy=sim.policy,
        hardware=sim.hardware,
        model=sim.model,
        tp=sim.tp,
        arrival=w.arrival,
        concurrency=w.concurrency if w.arrival == "closed" else None,
        rate=w.rate if w.arrival != "closed" else None,
        utilization=busy / max(rs, 1e-9),
        decisions=dict(sorted(result.decisions.items())),
        routed_min=min(routed, default=0),
        routed_max=max(routed, default=0),
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
            "rate_profile": [list(x) for x in cfg.rate_profile],
            "ingress_max_queued": cfg.ingress_max_queued,
            "predictive_routing": sim.predictive_routing,
        },
    )
    return out
