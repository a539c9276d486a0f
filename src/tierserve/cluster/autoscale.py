"""Autoscaling by class: scale out when P0 (then P1) is at risk, not on total ongoing requests.

Every engine replica exports, through Ray Serve's ``record_autoscaling_stats``, its per-class
wait ratio and SLA attainment (``signals.py``), and, with the ingress queue on, the ingress's
held backlog (``held_metrics``: requests that wait at the ingress, bound to no replica, which
no replica's own signals can see; every replica carries the same fleet-wide figures, learned
from the fleet board). Ray Serve averages each metric per replica over ``look_back_period_s``
and calls the deployment's custom policy (``AutoscalingConfig.policy``, this module's
``ClassAutoscalingPolicy``) with them. The decision, ``desired_replicas``, is a pure function:

* **out** when any replica has P0 at risk: its wait ratio at or above ``p0_wait_ratio``
  (waiting for a first token longer than that fraction of the P0 SLA) or its attainment below
  ``p0_min_attainment``;
* otherwise **out** when P1 is at risk the same way (``p1_*`` thresholds) on *most* replicas
  (more than half): P1 is routed to the least-queued replica, so one hot replica is the
  router's job, not the autoscaler's;
* P0 (P1) **held** at the ingress is at risk too when the oldest held request of the class has
  waited ``p0_wait_ratio`` (``p1_wait_ratio``) of its SLA there: a request is held only while
  no replica has room for it, so that is the whole fleet short of room, never one hot replica;
* **how many out**: by the size of the class's backlog, not one at a time -- the requests
  waiting at the replicas plus those held at the ingress. One replica drains the class at its
  *served rate* (first tokens per second, ``signals.py``; the mean over the replicas that
  served any); the fleet asks for as many replicas beyond those serving as it takes to drain
  the backlog within ``drain_s`` at that rate -- replicas already starting count -- and never
  fewer than ``step`` more. Without a served rate (nothing got a first token in the window),
  ``step``;
* **in** when every replica is quiet: P0 and P1 wait ratios below ``quiet_ratio`` (the
  ratio already counts the oldest request still waiting for its first token, so a request
  waiting a few milliseconds, as one always is under a steady flow, does not keep the fleet
  up; an earlier rule also asked that none wait, and a fleet under any steady load never
  scaled in), and none held at the ingress;
* **how many in**: to the replicas the load needs, as a scale-out is sized by the backlog, not
  one at a time (a fleet of 16 after a peak took 12 decisions, minutes each under Serve's
  downscale delay, to come back down). The metrics carry no replica capacity in requests per
  second -- a replica's served rate is what it was asked for -- so the load is measured in
  seats: each replica's requests held (added, not yet finished; waiting or decoding, every
  class), the larger of now and its mean over the signal window (the mean remembers a busier
  spell just past; the count sees at once the load a scale-in just moved onto a replica),
  summed over the replicas; the capacity is their ``seats`` (``max_num_seqs``). The fleet keeps
  enough replicas that the load fills at most ``scale_in_utilisation`` of their seats, and
  sheds at most ``scale_in_max_fraction`` of itself per decision, so one quiet reading cannot
  collapse it; when the load needs every replica it stays. Without the seat figures (a replica
  that does not report them), in by one, as before;
* otherwise stay.

Ray Serve then applies its own bounds (min/max replicas) and delays (``upscale_delay_s``,
``downscale_delay_s``) to what the policy returns. Ray-free: the policy reads the context it
is given duck-typed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ScaleConfig:
    p0_wait_ratio: float = 0.5
    p0_min_attainment: float = 0.95
    p1_wait_ratio: float = 0.8
    p1_min_attainment: float = 0.90
    quiet_ratio: float = 0.25  # a P0 P95 TTFT of 0.125 s against a 0.5 s SLA
    step: int = 1  # the fewest replicas a scale-out adds
    drain_s: float = 5.0  # a scale-out sizes the fleet to drain the backlog within this
    # A scale-in keeps the replicas whose seats the load fills at most this much of ...
    scale_in_utilisation: float = 0.6
    # ... and removes at most this fraction of the fleet (at least one replica) per decision.
    scale_in_max_fraction: float = 0.5

    def __post_init__(self) -> None:
        for name in ("p0_wait_ratio", "p1_wait_ratio", "quiet_ratio", "drain_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("scale_in_utilisation", "scale_in_max_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)}")
        for name in ("p0_min_attainment", "p1_min_attainment"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.step < 1:
            raise ValueError(f"step must be >= 1, got {self.step}")


def _at_risk(m: Mapping[str, float], k: str, ratio: float, attainment: float) -> bool:
    return m.get(f"{k}_wait_ratio", 0.0) >= ratio or m.get(f"{k}_sla_attainment", 1.0) < attainment


def held(ms: list[Mapping[str, float]], k: str) -> tuple[float, float]:
    """Class `k`'s backlog held at the ingress: (requests, the oldest's wait ratio). Every
    replica exports the same fleet-wide figures, each from its last board reply (and averaged
    by Serve over its look-back): the largest of them, the freshest of a growing backlog."""
    count = max((m.get(f"{k}_held", 0.0) for m in ms), default=0.0)
    ratio = max((m.get(f"{k}_held_wait_ratio", 0.0) for m in ms), default=0.0)
    return count, ratio


def scale_out_by(ms: list[Mapping[str, float]], k: str, current: int, cfg: ScaleConfig) -> int:
    """Replicas to add for class `k` at risk (see the module docstring): enough that the
    replicas serving (`ms`) and the new ones drain its backlog -- waiting at the replicas and
    held at the ingress -- within ``drain_s``."""
    backlog = sum(m.get(f"{k}_waiting", 0.0) for m in ms) + held(ms, k)[0]
    rates = [r for m in ms if (r := m.get(f"{k}_served_per_s", 0.0)) > 0]
    if backlog <= 0 or not rates:
        return cfg.step
    per_replica = sum(rates) / len(rates)
    extra = math.ceil(backlog / (per_replica * cfg.drain_s))
    return max(cfg.step, len(ms) + extra - current)


def scale_in_to(ms: list[Mapping[str, float]], current: int, cfg: ScaleConfig) -> int:
    """The replicas a quiet fleet keeps (see the module docstring): enough that the load (seats
    held, summed over the replicas reporting, `ms`) fills at most ``scale_in_utilisation`` of
    their seats, at least 1, and no fewer than ``scale_in_max_fraction`` of `current` allows to
    shed (one at least). `current`: the replicas now, starting ones included."""
    seats = [m.get("seats", 0.0) for m in ms]
    if not ms or min(seats) <= 0:
        return current - 1  # no capacity figure: one at a time
    load = sum(max(m.get("in_flight", 0.0), m.get("in_flight_mean", 0.0)) for m in ms)
    per_replica = sum(seats) / len(seats)
    need = max(1, math.ceil(load / (cfg.scale_in_utilisation * per_replica)))
    floor = current - max(1, math.floor(cfg.scale_in_max_fraction * current))
    return min(current, max(need, floor))


def desired_replicas(
    per_replica: Mapping[str, Mapping[str, float]], current: int, cfg: ScaleConfig
) -> tuple[int, str]:
    """(replica count wanted, why) from each replica's metrics (see the module docstring)."""
    if not per_replica:
        return current, "no-metrics"
    ms = list(per_replica.values())
    p0 = any(_at_risk(m, "p0", cfg.p0_wait_ratio, cfg.p0_min_attainment) for m in ms)
    if p0 or held(ms, "p0")[1] >= cfg.p0_wait_ratio:
        return current + scale_out_by(ms, "p0", current, cfg), "p0-at-risk"
    p1 = sum(_at_risk(m, "p1", cfg.p1_wait_ratio, cfg.p1_min_attainment) for m in ms)
    if 2 * p1 > len(ms) or held(ms, "p1")[1] >= cfg.p1_wait_ratio:
        return current + scale_out_by(ms, "p1", current, cfg), "p1-at-risk"
    quiet = all(
        m.get(f"{k}_wait_ratio", 0.0) < cfg.quiet_ratio for m in ms for k in ("p0", "p1")
    ) and not any(held(ms, k)[0] for k in ("p0", "p1"))
    if quiet and current > 1 and (wanted := scale_in_to(ms, current, cfg)) < current:
        return wanted, "quiet"
    return current, "steady"


def by_replica(aggregated: Mapping[str, Mapping[Any, float]] | None) -> dict[str, dict[str, float]]:
    """Ray Serve's ``{metric: {replica: value}}`` turned into ``{replica: {metric: value}}``."""
    out: dict[str, dict[str, float]] = {}
    for name, values in (aggregated or {}).items():
        for rid, v in values.items():
            out.setdefault(str(rid), {})[name] = float(v)
    return out


class ClassAutoscalingPolicy:
    """The custom policy Ray Serve calls (``AutoscalingPolicy(policy_function=<this class>,
    policy_kwargs=<ScaleConfig fields>)``); it returns (replicas, policy state)."""

    def __init__(self, **kwargs: Any) -> None:
        self.config = ScaleConfig(**kwargs)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        n, why = desired_replicas(
            by_replica(ctx.aggregated_metrics), ctx.current_num_replicas, self.config
        )
        state = dict(ctx.policy_state or {})
        state["tierserve_last_decision"] = why
        return n, state
