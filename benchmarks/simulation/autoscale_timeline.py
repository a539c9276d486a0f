"""The fleet-ingress scenario's autoscaling run (4:16 replicas, ingress queue on; sim/scenarios.py)
second by second: what the class autoscaler read and decided, and which P1/P2 arrivals were
served on time, by 5 s of arrival (docs/scale-out.md, "The issue's simulated targets").

    PYTHONPATH=src nice -n 10 .venv/bin/python benchmarks/simulation/autoscale_timeline.py       #
    ~1 min
    ... --start-s 5             # a replica serves 5 s after it is asked for (default 20)
    ... --drain-time-at-risk    # a prototype rule (below), not the cluster's

``--drain-time-at-risk``: a class with requests held at the ingress is also at risk when the
held backlog would take 0.8 x its SLA (0.5 x for P0) to drain at the fleet's served rate of the
class (Little's law: about what a request arriving now would wait); otherwise the cluster's
rule. It needs the classes' SLAs, which the cluster's policy does not have.

Simulated figures (virtual clock, cost model): no CPU dependence except wall time.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace

from tierserve.cluster import autoscale
from tierserve.sim.engine.stats import run_stats
from tierserve.sim.fleet.drive import FleetDriver
from tierserve.sim.fleet.model import build_fleet, fleet_options, fleet_router, replica_seconds
from tierserve.sim.fleet.scale import Scaler
from tierserve.sim.report.fleet_ingress import AUTOSCALE_LABEL
from tierserve.sim.scenarios import fleet_ingress_configs
from tierserve.workloads import make_workload

CLASSES = (("p0", 0), ("p1", 1))


def drain_time_rule(slas):
    """The cluster's rule, plus: held P0/P1 at risk by their drain time (module docstring)."""

    def decide(per_replica, current, cfg):
        ms = list(per_replica.values())
        for (k, p), ratio in zip(CLASSES, (cfg.p0_wait_ratio, cfg.p1_wait_ratio), strict=True):
            held, _ = autoscale.held(ms, k)
            rate = sum(m.get(f"{k}_served_per_s", 0.0) for m in ms)
            if held > 0 and slas[p] and (rate <= 0 or held / rate >= ratio * slas[p]):
                return current + autoscale.scale_out_by(ms, k, current, cfg), f"{k}-at-risk"
        return autoscale.desired_replicas(per_replica, current, cfg)

    return decide


class LoggedScaler(Scaler):
    """The simulated autoscaler, keeping what its policy read and returned at each tick."""

    def __init__(self, cfg, decide) -> None:
        super().__init__(cfg, decide)
        self.rows: list[tuple] = []

    def tick(self, now, metrics, current):
        ms = list(metrics.values())
        wanted, why = self.decide(metrics, current, self.cfg.rule)  # pure: as tick decides
        p1_held, p1_ratio = autoscale.held(ms, "p1")
        waiting = sum(m.get("p1_waiting", 0.0) for m in ms)
        ratio = max((m.get("p1_wait_ratio", 0.0) for m in ms), default=0.0)
        served = sum(m.get("p1_served_per_s", 0.0) for m in ms)
        row = (now, current, len(ms), p1_held, p1_ratio, waiting, ratio, served)
        self.rows.append((*row, autoscale.held(ms, "p2")[0], wanted, why))
        return super().tick(now, metrics, current)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start-s", type=float, default=None, help="replica start (default 20)")
    ap.add_argument("--drain-time-at-risk", action="store_true", help="the prototype rule")
    ap.add_argument("--duration", type=float, default=None, help="seconds of arrivals (80)")
    args = ap.parse_args()
    (cfg,) = [c for c in fleet_ingress_configs() if c.name == AUTOSCALE_LABEL]
    if args.start_s is not None:
        cfg = replace(cfg, autoscale=replace(cfg.autoscale, start_s=args.start_s))
    if args.duration is not None:
        cfg = replace(
            cfg, sim=replace(cfg.sim, workload=replace(cfg.sim.workload, duration_s=args.duration))
        )
    sim, w = cfg.sim, cfg.sim.workload
    slas = sim.priorities.ttft_sla_s
    replicas = build_fleet(cfg)
    wl = make_workload(w)
    for r in replicas:
        r.executor.output_lengths = wl.output_lengths
    options = fleet_options(cfg, wl.output_lengths)
    driver = FleetDriver(replicas, wl, fleet_router(cfg.router), sim.block_size, options)
    decide = drain_time_rule(slas) if args.drain_time_at_risk else autoscale.desired_replicas
    scaler = driver.scaler = driver.result.scaler = LoggedScaler(cfg.autoscale, decide)
    result = driver.run()

    print("arrivals | P1: requests, on time, median TTFT | P2: requests, on time, median TTFT")
    bins: dict = defaultdict(lambda: defaultdict(list))
    for rec in result.records:
        if rec.outcome != "rejected":
            ttft = None if rec.first_token is None else rec.first_token - rec.arrival
            bins[int(rec.arrival // 5) * 5][int(rec.priority)].append(ttft)
    for b in sorted(bins):
        cells = [f"{b:3d}-{b + 5:<3d}s"]
        for p in (1, 2):
            ts = bins[b][p]
            done = sorted(t for t in ts if t is not None)
            ok = sum(1 for t in done if t <= slas[p])
            med = f"{done[len(done) // 2]:6.2f} s" if done else "     –  "
            cells.append(f"{len(ts):4d} {100 * ok / max(1, len(ts)):5.1f}% {med}")
        print(" | ".join(cells))
    print()
    print("tick | replicas (serving) | P1 held, its wait ratio | P1 waiting at the replicas, "
          "their largest wait ratio | P1 served/s (fleet) | P2 held -> wanted (why)")  # fmt: skip
    for t, cur, n, held, ratio, waiting, rratio, served, p2, wanted, why in scaler.rows:
        if round(t) % 2 == 0 or why != "steady":
            print(
                f"{t:4.0f} s | {cur:2d} ({n:2d}) | {held:5.0f} {ratio:5.2f} | {waiting:4.0f} "
                f"{rratio:5.2f} | {served:6.1f} | {p2:5.0f} -> {wanted} ({why})"
            )
    lo, hi = w.warmup_s, w.duration_s
    out = run_stats(result, lo, hi, sim.priorities)
    on_time = sum(out["classes"][c]["goodput_requests_per_s"] * (hi - lo) for c in ("P0", "P1"))
    rs = replica_seconds(result, lo, hi)
    print()
    for d in result.scaler.decisions:
        print(f"decision at {d.time:.0f} s: {d.current} -> {d.wanted} ({d.reason})")
    print(f"replica-seconds {rs:.0f}, on-time P0/P1 {on_time:.0f}, per on-time: "
          f"{rs / on_time if on_time else float('nan'):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
