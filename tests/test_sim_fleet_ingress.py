"""The simulated fleet runs the cluster ingress's pieces (issue 24.4): the ingress queue (late
binding, class order), fleet SLA admission, and the class autoscaling rule on simulated time --
with the cluster's own decision code (the last tests compare them on the same inputs)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.test_fleet_admission import CFG, engine, ingress, refresh
from tierserve.admission import AdmissionController
from tierserve.clock import ManualClock
from tierserve.cluster import autoscale
from tierserve.cluster.fleet import FleetView
from tierserve.cluster.ingress_queue import IngressQueue
from tierserve.config import PriorityConfig
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.routing.late_binding import WaitQueue, class_room
from tierserve.sampling_params import SamplingParams
from tierserve.sim.engine.runner import SimConfig
from tierserve.sim.fleet import scale as fleet_scale
from tierserve.sim.fleet.drive import FleetDriver, Replica
from tierserve.sim.fleet.ingress import FleetQueueView
from tierserve.sim.fleet.model import (
    FleetConfig,
    build_fleet,
    fleet_options,
    fleet_router,
    run_fleet,
)
from tierserve.sim.fleet.scale import AutoscaleConfig, Scaler, parse_autoscale
from tierserve.workloads.synthetic import ClassSpec, LengthDist, Workload, WorkloadConfig

P0, P1, P2, P3 = Priority

SMALL = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    max_num_seqs=2,
    max_num_batched_tokens=1024,
    workload=WorkloadConfig(arrival="poisson", duration_s=30.0, warmup_s=0.0, seed=1),
)


class Scripted(Workload):
    """Open-loop arrivals from a script: (gap before it, class, prompt tokens, max tokens)."""

    def __init__(self, cfg: WorkloadConfig, script: list[tuple[float, Priority, int, int]]):
        super().__init__(cfg)
        self.script = list(script)
        self.gaps = [g for g, *_ in script] + [math.inf]
        self.n = 0  # requests made so far

    def make(self, now: float) -> Request:
        _gap, prio, prompt, out = self.script[self.n]
        self.n += 1
        return Request(
            f"s{self.n}",
            [500 + self.n] * prompt,
            SamplingParams(max_tokens=out, ignore_eos=True),
            priority=prio,
            tenant="t",
            arrival_time=now,
        )

    def gap(self) -> float:
        return self.gaps[self.n]


def run_script(cfg: FleetConfig, script):
    replicas = build_fleet(cfg)
    wl = Scripted(replace(cfg.sim.workload, duration_s=100.0), script)
    driver = FleetDriver(
        replicas, wl, fleet_router(cfg.router), 16, fleet_options(cfg, wl.output_lengths)
    )
    return driver, driver.run()


# -- the ingress queue -------------------------------------------------------------------------

# Two P1 streams take both seats of the one replica (a short one and a long one); then a P2, a
# P3 and a P1 arrive in that order, with no seat for any of them.
BUSY = [
    (0.0, P1, 64, 20),
    (0.0, P1, 64, 400),
    (0.01, P2, 64, 4),
    (0.0, P3, 64, 4),
    (0.0, P1, 64, 4),
]
# The same with P2 and P3 prompts longer than a step's budget: no replica could batch them
# (tests/test_fleet_ingress_batch.py has BUSY's), so they wait here for a seat.
BUSY_UNBATCHABLE = [(g, p, 1100 if p in (P2, P3) else n, m) for g, p, n, m in BUSY]


def test_the_ingress_queue_holds_requests_and_sends_them_late_in_class_order():
    on = FleetConfig(SMALL, 1, ingress_queue=True)
    _, result = run_script(on, BUSY_UNBATCHABLE)
    order = [r.request_id for r in result.records]
    assert result.held_max == 3  # all three waited at the ingress
    assert order == ["s1", "s2", "s5", "s3", "s4"]  # sent P1, P2, P3 as seats freed
    late = {r.request_id: r for r in result.records}
    short = late["s1"]
    assert late["s5"].first_token > short.finish  # bound only once the short stream ended
    assert all(r.outcome == "completed" for r in result.records)
    # Without the queue each is bound to the replica as it arrives, in arrival order.
    _, plain = run_script(FleetConfig(SMALL, 1), BUSY_UNBATCHABLE)
    assert [r.request_id for r in plain.records] == ["s1", "s2", "s3", "s4", "s5"]
    assert plain.held_max == 0


def test_a_held_request_goes_to_the_first_replica_with_room():
    # r00 and r01 one seat each: a long P1 on one, a short P1 on the other, then a P1 waits.
    one_seat = replace(SMALL, max_num_seqs=1)
    script = [(0.0, P1, 64, 400), (0.0, P1, 64, 10), (0.01, P1, 64, 4)]
    _, result = run_script(FleetConfig(one_seat, 2, ingress_queue=True), script)
    recs = {r.request_id: r for r in result.records}
    assert result.held_max == 1
    assert result.routed == {"r00": 1, "r01": 2} or result.routed == {"r00": 2, "r01": 1}
    assert recs["s3"].first_token < recs["s1"].finish  # not behind the long stream
    assert recs["s3"].first_token > recs["s2"].finish


def test_p0_never_waits_at_the_ingress():
    script = [(0.0, P1, 64, 400), (0.0, P1, 64, 400), (0.01, P1, 64, 4), (0.0, P0, 64, 4)]
    _, result = run_script(FleetConfig(SMALL, 1, ingress_queue=True), script)
    recs = {r.request_id: r for r in result.records}
    assert result.held_max == 1  # the P1 only
    assert recs["s4"].first_token - recs["s4"].arrival < 0.5  # P0 preempted its way in
    assert [r.request_id for r in result.records][:3] == ["s1", "s2", "s4"]


# -- fleet SLA admission -----------------------------------------------------------------------


def flood(n: int, prio: Priority = P1, prompt: int = 8000):
    return [(0.0, prio, prompt, 4)] * n


def test_fleet_sla_admission_refuses_when_saturated_and_admits_when_idle():
    cfg = FleetConfig(replace(SMALL, max_num_seqs=8), 2, sla_admission=True)
    # An idle fleet admits; then a flood of long P1 prompts at one instant fills every
    # replica's queue past the P1 SLA, and the rest are refused with a Retry-After.
    _, result = run_script(cfg, [(0.0, P1, 64, 4), *flood(100), (0.0, P0, 200, 4)])
    outcome = [r.outcome for r in result.records]
    assert outcome[0] == "completed"
    refused = [r for r in result.records if r.outcome == "rejected"]
    assert 0 < len(refused) < 100 and refused[0].priority == P1
    assert all(r.outcome == "completed" for r in result.records if r.outcome != "rejected")
    # P0 is judged on its own class's work: admitted through the P1 flood, served in time.
    p0 = result.records[-1]
    assert p0.priority == P0 and p0.outcome == "completed"
    assert p0.first_token - p0.arrival <= 0.5
    # Without admission at the ingress nothing is refused.
    admitted = sum(r.outcome != "rejected" for r in result.records)
    _, plain = run_script(replace(cfg, sla_admission=False), flood(admitted + 10))
    assert all(r.outcome == "completed" for r in plain.records)


def test_the_simulated_ingress_admits_exactly_as_a_cluster_ingress_on_the_same_replicas():
    """The same engines seen by a cluster ingress (RemoteEngine over the fleet board) and by
    the simulated fleet's ingress (FleetQueueView): the same decisions, Retry-After included."""
    clock = ManualClock()
    cores = {
        "a-hot": engine(clock, [(P1, 900)] * 12 + [(P0, 300)]),
        "b-warm": engine(clock, [(P1, 900)] * 9 + [(P2, 600)] * 3),
    }
    remote, cluster = ingress(cores, clock)

    class Fleet:
        def __init__(self) -> None:
            self.replicas = [Replica(rid, core, None, None) for rid, core in cores.items()]  # type: ignore[arg-type]
            self.held: WaitQueue = WaitQueue()

        def routable(self):
            return self.replicas

    sim = AdmissionController(CFG, FleetQueueView(Fleet()), clock)
    seen = set()
    for prio, n in [(P1, 400), (P1, 900), (P2, 900), (P0, 200), (P1, 50), (P3, 100)] * 2:
        refresh(remote, cores)
        a, b = cluster.decide(prio, "t", n + 16, n), sim.decide(prio, "t", n + 16, n)
        assert a == b
        seen.add(a.admitted)
    # (At one instant: a replica's report is its engine as of its last step, and these
    # engines do not step, so a later decision would read older arrival rates than the
    # simulator's live view.)
    assert seen == {True, False}
    assert cluster.rejections == sim.rejections


def test_the_ingress_queue_counts_room_as_the_cluster_s_does():
    """The room the simulated fleet dispatches by equals the cluster IngressQueue's on the
    same replicas' loads; and both order waiters with the same WaitQueue."""
    cfg = FleetConfig(replace(SMALL, max_num_seqs=3), 2, ingress_queue=True)
    driver, _ = run_script(cfg, [(0.0, P2, 64, 400), (0.0, P3, 64, 400), (0.0, P1, 64, 400)])
    loads = {r.replica_id: r.seats() for r in driver.replicas}
    queue = IngressQueue(now=lambda: 0.0)
    queue.view = FleetView(loads=loads, reported_at={rid: 1.0 for rid in loads})
    for p in Priority:
        assert queue.room(p) == driver.room(p) == class_room(loads.values(), p)
    assert isinstance(queue._waiting, WaitQueue) and isinstance(driver.held, WaitQueue)


# -- autoscaling -------------------------------------------------------------------------------

# Short requests of every class (a backlog forms from the 4 seats), SLAs 0.5 / 1 / 60 s.
SHORT = ClassSpec(LengthDist(128, 0.3, 32, 256), LengthDist(12, 0.3, 4, 24))
FAST_SLAS = replace(
    SMALL,
    max_num_seqs=4,
    priorities=PriorityConfig((0.5, 1.0, 60.0, None)),
    workload=replace(SMALL.workload, classes=dict.fromkeys(Priority, SHORT)),
)
SCALE = AutoscaleConfig(1, 3, start_s=1.0, upscale_delay_s=1.0, downscale_delay_s=2.0, window_s=3.0)


def scaled(mix, rate: float, replicas: int = 1, duration: float = 8.0) -> dict:
    w = replace(FAST_SLAS.workload, mix=mix, rate=rate, duration_s=duration)
    return run_fleet(FleetConfig(replace(FAST_SLAS, workload=w), replicas, autoscale=SCALE))


def test_the_autoscaler_adds_a_replica_under_a_p1_backlog_past_its_sla():
    r = scaled((0.0, 1.0, 0.0, 0.0), rate=60.0)
    ups = [d for d in r["scale_decisions"] if d["wanted"] > d["current"]]
    assert ups and ups[0]["reason"] == "p1-at-risk"
    assert r["replicas_used"] > 1
    assert r["replica_seconds"] > 8.0  # the new replicas cost from when asked for


def test_the_autoscaler_never_scales_out_for_a_p3_backlog_alone():
    r = scaled((0.0, 0.0, 0.0, 1.0), rate=60.0)
    assert r["classes"]["P3"]["ttft_p95_s"] > 2.0  # a real backlog, past the P1 SLA
    assert r["scale_decisions"] == [] and r["replicas_used"] == 1


def test_the_autoscaler_scales_in_when_idle():
    r = scaled((0.0, 1.0, 0.0, 0.0), rate=0.5, replicas=3)
    downs = [d for d in r["scale_decisions"] if d["wanted"] < d["current"]]
    assert [d["reason"] for d in downs] == ["quiet", "quiet"]  # 3 -> 2 -> 1, never below min
    assert r["replica_seconds"] < 3 * 8.0


def test_the_simulated_autoscaler_decides_as_the_cluster_s_policy():
    """Scaler (simulated time) runs the cluster's desired_replicas: with no delays and within
    its bounds, it asks for exactly what the Ray Serve policy returns on the same metrics."""
    assert fleet_scale.desired_replicas is autoscale.desired_replicas
    policy = autoscale.ClassAutoscalingPolicy()
    cases = [
        {"r1": {"p0_wait_ratio": 0.6}, "r2": {"p0_wait_ratio": 0.0}},
        {"r1": {"p1_wait_ratio": 0.9}, "r2": {"p1_sla_attainment": 0.5}},
        {"r1": {"p1_wait_ratio": 0.9}, "r2": {"p1_wait_ratio": 0.0}},
        {"r1": {"p3_wait_ratio": 9.0, "p3_waiting": 40.0}, "r2": {"p3_waiting": 0.0}},
        {"r1": {"p0_waiting": 0.0}, "r2": {"p1_wait_ratio": 0.01}},
    ]
    for per_replica in cases:
        aggregated: dict = {}
        for rid, m in per_replica.items():
            for k, v in m.items():
                aggregated.setdefault(k, {})[rid] = v
        ctx = type("Ctx", (), {})()
        ctx.aggregated_metrics, ctx.current_num_replicas, ctx.policy_state = aggregated, 2, {}
        want, _ = policy(ctx)
        metrics = {rid: {k: v for k, v in m.items()} for rid, m in per_replica.items()}
        scaler = Scaler(AutoscaleConfig(1, 9, upscale_delay_s=0.0, downscale_delay_s=0.0))
        assert 2 + scaler.tick(0.0, metrics, 2) == want


def test_autoscale_and_fleet_switches_name_bad_values():
    assert parse_autoscale("4:16") == (4, 16)
    for bad in ("4", "a:b", "5:2", "0:3"):
        with pytest.raises(ValueError, match="autoscal"):
            parse_autoscale(bad)
    with pytest.raises(ValueError, match="within autoscaling"):
        FleetConfig(SMALL, 1, autoscale=AutoscaleConfig(2, 4))
    with pytest.raises(ValueError, match="rate factors"):
        FleetConfig(SMALL, 1, rate_profile=((0.0, 0.0),))


def test_the_simulate_command_takes_the_fleet_ingress_switches(tmp_path, capsys):
    from tierserve.cli import main

    argv = ["simulate", "--hardware", "h100-80gb", "--model", "llama-3.1-8b", "--tp", "1"]
    argv += ["--max-num-seqs", "4", "--arrival", "poisson", "--rate", "3", "--duration", "2"]
    argv += ["--warmup", "1", "--replicas", "2", "--sla-admission", "on"]
    argv += ["--ingress-queue", "on", "--autoscale", "1:3", "--policy", "hybrid"]
    argv += ["--rate-profile", "0:1,2:2", "--workers", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    import json

    (r,) = json.loads((tmp_path / "results.json").read_text())
    assert r["sla_admission"] and r["ingress_queue"] and r["autoscale"]["max_replicas"] == 3
    assert r["config"]["rate_profile"] == [[0.0, 1.0], [2.0, 2.0]]
    assert main([*argv[:-2], "--autoscale", "3:1", "--out", str(tmp_path)]) == 2
    assert "autoscaling needs 1 <= min <= max" in capsys.readouterr().err


def test_the_fleet_ingress_scenario_runs_one_experiment_on_request(capsys):
    from tierserve.cli import main
    from tierserve.sim.scenarios import fleet_ingress_configs

    runs = fleet_ingress_configs(experiments=("autoscale",))
    assert [c.name for c in runs] == ["autoscale: fixed 16, queue on", "autoscale: 4:16, queue on"]
    assert all(c.ingress_queue for c in runs)  # a fair comparison: late binding in both
    assert len(fleet_ingress_configs()) == 6
    argv = ["simulate", "--scenario", "seed-table", "--experiment", "autoscale"]
    assert main(argv) == 2
    assert "--experiment needs --scenario fleet-ingress" in capsys.readouterr().err
