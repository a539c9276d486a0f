"""The class autoscaler scales out by the size of the backlog (issue 24): a P1 backlog of N
drain units (what one replica serves of P1 in ``drain_s``) asks for N replicas in one decision,
the cluster's rule (``cluster/autoscale.py``) and the simulated fleet's alike. The backlog
includes the requests held at the ingress (late binding), which no replica's signals see. A
quiet fleet scales in the same way, to the replicas its load needs (by seats held), at most
half of it a decision and never below the minimum."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.test_sim_fleet_ingress import FAST_SLAS
from tierserve.cluster.autoscale import ScaleConfig, desired_replicas
from tierserve.cluster.signals import ClassWindow, held_metrics, merge_held
from tierserve.priority import Priority
from tierserve.routing.late_binding import WaitQueue
from tierserve.sim.fleet.model import FleetConfig, run_fleet
from tierserve.sim.fleet.scale import AutoscaleConfig, Scaler


def p1_late(waiting: float, served_per_s: float) -> dict[str, float]:
    """A replica whose P1 requests wait past 0.8 x their SLA."""
    return {"p1_wait_ratio": 1.2, "p1_waiting": waiting, "p1_served_per_s": served_per_s}


def test_a_backlog_of_n_drain_units_asks_for_n_more_replicas_in_one_decision():
    cfg = ScaleConfig(drain_s=5.0)
    # Two replicas each serve 2 P1 requests a second: 10 in 5 s is one drain unit. 60 wait.
    fleet = {"a": p1_late(30, 2.0), "b": p1_late(30, 2.0)}
    assert desired_replicas(fleet, 2, cfg) == (8, "p1-at-risk")
    # Replicas already starting count: 3 of the 6 are on their way.
    assert desired_replicas(fleet, 5, cfg) == (8, "p1-at-risk")
    # ... and once they all are, one more (still at risk): never fewer than `step`.
    assert desired_replicas(fleet, 8, cfg) == (9, "p1-at-risk")
    # A backlog under one drain unit: one more, as before.
    assert desired_replicas({"a": p1_late(3, 2.0), "b": p1_late(2, 2.0)}, 2, cfg)[0] == 3
    # Without a served rate (no first token in the window) the size is unknown: `step`.
    assert desired_replicas({"a": p1_late(30, 0.0), "b": p1_late(30, 0.0)}, 2, cfg)[0] == 3
    assert desired_replicas(fleet, 2, replace(cfg, step=7))[0] == 9


def test_a_backlog_scale_out_keeps_the_rules_who_and_when():
    cfg = ScaleConfig()
    # One hot replica is still the router's job, however deep its backlog.
    assert desired_replicas({"a": p1_late(500, 1.0), "b": {}}, 2, cfg) == (2, "steady")
    # A P3 backlog alone never scales out.
    p3 = {"p3_waiting": 500.0, "p3_served_per_s": 0.1, "p3_wait_ratio": 9.0}
    assert desired_replicas({"a": p3, "b": p3}, 2, cfg)[0] <= 2
    # Young P1 waiters (below 0.8 x the SLA) are not at risk, whatever their number.
    young = {"p1_wait_ratio": 0.3, "p1_waiting": 500.0, "p1_served_per_s": 1.0}
    assert desired_replicas({"a": young, "b": young}, 2, cfg) == (2, "steady")
    # P0 at risk on one replica: sized by its P0 backlog.
    p0 = {"p0_wait_ratio": 0.9, "p0_waiting": 20.0, "p0_served_per_s": 1.0}
    assert desired_replicas({"a": p0, "b": {}}, 2, cfg) == (6, "p0-at-risk")
    with pytest.raises(ValueError, match="drain_s"):
        ScaleConfig(drain_s=0.0)


def test_the_class_window_reports_first_tokens_per_second():
    w = ClassWindow((0.5, 5.0, 60.0, None), window_s=10.0)
    for i in range(8):
        w.on_added(f"r{i}", Priority.P1, 0.0)
    for i in range(6):  # first tokens at 0.5, 1.0, ... 3.0 s
        w.on_first_token(f"r{i}", Priority.P1, 0.5 * (i + 1), 0.5 * (i + 1))
    s = w.summary(4.0)  # a window 4 s old (its first request came at 0): 6 first tokens
    assert s.served_per_s[1] == pytest.approx(6 / 4.0)
    assert s.served_per_s[0] == 0.0 and s.waiting[1] == 2
    assert s.autoscaling_metrics()["p1_served_per_s"] == pytest.approx(1.5)
    assert w.summary(12.0).served_per_s[1] == pytest.approx(3 / 10.0)  # 3 left the window
    assert w.summary(30.0).served_per_s[1] == 0.0


def test_the_simulated_fleet_adds_several_replicas_at_once_under_a_deep_p1_backlog():
    w = replace(FAST_SLAS.workload, mix=(0.0, 1.0, 0.0, 0.0), rate=120.0, duration_s=8.0)
    auto = AutoscaleConfig(1, 8, start_s=1.0, upscale_delay_s=1.0, window_s=3.0)
    r = run_fleet(FleetConfig(replace(FAST_SLAS, workload=w), 1, autoscale=auto))
    ups = [d for d in r["scale_decisions"] if d["wanted"] > d["current"]]
    assert ups and ups[0]["reason"] == "p1-at-risk"
    assert ups[0]["wanted"] - ups[0]["current"] > 1  # one decision, several replicas
    assert r["replicas_used"] >= 1 + ups[0]["wanted"] - ups[0]["current"]


# -- the ingress's held backlog (late binding: requests wait at the ingress, bound to no replica)


def held(p1: float, ratio: float) -> dict[str, float]:
    """The ingress's held backlog as every replica exports it (signals.held_metrics)."""
    return {"p1_held": p1, "p1_held_wait_ratio": ratio}


def test_a_p1_backlog_held_at_the_ingress_puts_p1_at_risk_and_sizes_the_scale_out():
    cfg = ScaleConfig(drain_s=5.0)
    # Two replicas serve 2 P1 requests a second each, none waits at them (late binding keeps
    # the backlog at the ingress): 60 held, the oldest at 0.9 x the SLA. 60 / (2 x 5) = 6.
    calm = {"p1_wait_ratio": 0.1, "p1_waiting": 0.0, "p1_served_per_s": 2.0}
    fleet = {"a": {**calm, **held(60, 0.9)}, "b": {**calm, **held(60, 0.9)}}
    assert desired_replicas(fleet, 2, cfg) == (8, "p1-at-risk")
    # Held and waiting at the replicas add up: 10 + 50 is the same backlog.
    mixed = {"a": {**p1_late(10, 2.0), **held(50, 0.9)}, "b": {**calm, **held(50, 0.9)}}
    assert desired_replicas(mixed, 2, cfg) == (8, "p1-at-risk")
    # Replicas report the same fleet-wide figures at slightly different times: the largest.
    assert desired_replicas({"a": {**calm, **held(60, 0.9)}, "b": calm}, 2, cfg)[0] == 8
    # Young held requests are not at risk, however many; nor does a held P3 backlog scale out.
    young = {"a": {**calm, **held(500, 0.5)}, "b": {**calm, **held(500, 0.5)}}
    assert desired_replicas(young, 2, cfg) == (2, "steady")
    p3 = {"p3_held": 500.0, "p3_held_wait_ratio": 0.0}
    assert desired_replicas({"a": {**calm, **p3}, "b": {**calm, **p3}}, 2, cfg)[1] != "p1-at-risk"
    # A fleet with P1 held is not quiet, however calm its replicas.
    idle = {"p1_wait_ratio": 0.0, "p1_waiting": 0.0}
    assert desired_replicas({"a": idle, "b": idle}, 2, cfg) == (1, "quiet")
    assert desired_replicas({"a": {**idle, **held(1, 0.01)}, "b": idle}, 2, cfg) == (2, "steady")


def test_held_metrics_give_the_held_count_and_the_oldest_wait_over_the_sla():
    slas = (0.5, 5.0, 60.0, None)
    m = held_metrics((0, 3, 1, 2), (0.0, 4.0, 6.0, 9.0), slas)
    assert m["p1_held"] == 3.0 and m["p1_held_wait_ratio"] == pytest.approx(0.8)
    assert m["p2_held_wait_ratio"] == pytest.approx(0.1)
    assert m["p3_held"] == 2.0 and m["p3_held_wait_ratio"] == 0.0  # no SLA
    assert m["p0_held"] == 0.0 and m["p0_held_wait_ratio"] == 0.0
    # Two ingress replicas: the fleet holds the sum; its oldest wait is the larger.
    other = held_metrics((0, 2, 0, 0), (0.0, 4.5, 0.0, 0.0), slas)
    both = merge_held([m, other])
    assert both["p1_held"] == 5.0 and both["p1_held_wait_ratio"] == pytest.approx(0.9)
    assert merge_held([]) == held_metrics((0,) * 4, (0.0,) * 4, slas)  # every key, at zero


def test_the_wait_queue_reports_its_backlog_per_class():
    q: WaitQueue[tuple[str, float]] = WaitQueue()
    q.push(Priority.P1, "t1", ("a", 2.0))
    q.push(Priority.P1, "t2", ("b", 1.0))
    q.push(Priority.P3, "t1", ("c", 3.0))
    counts, oldest = q.backlog(lambda x: x[1], now=5.0)
    assert counts == (0, 2, 0, 1) and oldest == (0.0, 4.0, 0.0, 2.0)


def test_the_simulated_fleet_sizes_a_scale_out_by_the_backlog_held_at_its_ingress():
    """With late binding the P1 backlog waits at the ingress: the replicas' own queues stay
    short, so only the held backlog can show the fleet short of room and size the step."""
    w = replace(FAST_SLAS.workload, mix=(0.0, 1.0, 0.0, 0.0), rate=120.0, duration_s=8.0)
    auto = AutoscaleConfig(1, 8, start_s=1.0, upscale_delay_s=1.0, window_s=3.0)
    cfg = FleetConfig(replace(FAST_SLAS, workload=w), 1, ingress_queue=True, autoscale=auto)
    r = run_fleet(cfg)
    assert r["ingress_held_max"] > 20  # a real backlog, held at the ingress
    ups = [d for d in r["scale_decisions"] if d["wanted"] > d["current"]]
    assert ups and ups[0]["reason"] == "p1-at-risk"
    assert ups[0]["wanted"] - ups[0]["current"] > 1  # one decision, several replicas


def test_the_scaler_scales_a_quiet_fleet_in_by_halves_down_to_its_minimum():
    """Serve's part as the simulator models it: a quiet fleet of 16 whose load 2 replicas carry
    goes 16 -> 8 -> 4 (at most half a decision), and stops at min_replicas (4)."""
    scaler = Scaler(AutoscaleConfig(4, 16, downscale_delay_s=0.0))
    quiet = {"in_flight": 1.0, "in_flight_mean": 1.0, "seats": 64.0}
    current, path = 16, [16]
    for t in range(4):
        current += scaler.tick(float(t), {f"r{i}": quiet for i in range(current)}, current)
        path.append(current)
    assert path == [16, 8, 4, 4, 4]
    assert [d.reason for d in scaler.decisions] == ["quiet", "quiet"]


def test_the_simulated_fleet_scales_in_to_what_its_load_needs():
    """A fleet of 8 under a light steady load (a replica's worth) scales in to its minimum,
    2, in two decisions (8 -> 4 -> 2), not six."""
    w = replace(FAST_SLAS.workload, mix=(0.0, 1.0, 0.0, 0.0), rate=2.0, duration_s=10.0)
    auto = AutoscaleConfig(2, 8, start_s=1.0, downscale_delay_s=2.0, window_s=3.0)
    r = run_fleet(FleetConfig(replace(FAST_SLAS, workload=w), 8, autoscale=auto))
    downs = [(d["current"], d["wanted"]) for d in r["scale_decisions"]]
    assert downs == [(8, 4), (4, 2)]
    assert r["classes"]["P1"]["sla_attainment"] == 1.0
