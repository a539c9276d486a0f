"""The fleet simulator: many replicas on one virtual timeline, routed by the routing rule, and
ReplicaStats taken from a live engine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tierserve.admission import AdmissionController
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.routing import RouteRequest, make_router, replica_stats
from tierserve.routing.types import hash_key
from tierserve.sampling_params import SamplingParams
from tierserve.sim.engine.driver import drive
from tierserve.sim.engine.runner import SimConfig, build
from tierserve.sim.fleet.model import FleetConfig, build_fleet, drive_fleet, run_fleet
from tierserve.workloads.synthetic import Workload, WorkloadConfig

SMALL = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    max_num_seqs=64,
    max_num_batched_tokens=1024,
    workload=WorkloadConfig(concurrency=24, duration_s=30.0, warmup_s=5.0, seed=3),
)


def _req(rid: str, prompt: int, max_tokens: int, prio: Priority, first: int = 7) -> Request:
    tokens = [first] * 16 + [1000 + len(rid) + i for i in range(prompt - 16)]
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), prio)


# -- ReplicaStats from an engine ---------------------------------------------------------------


def _small_engine(seats: int = 2, budget: int = 2048):
    cfg = replace(SMALL, num_kv_blocks=64, max_num_seqs=seats, max_num_batched_tokens=budget)
    engine, _, _ = build(cfg)
    return engine


def test_replica_stats_read_a_live_engine_exactly_and_change_nothing():
    engine = _small_engine(seats=2)
    a = _req("a", 40, 5, Priority.P1)
    b = _req("b", 20, 3, Priority.P3, first=9)
    c = _req("c", 30, 4, Priority.P2)
    engine.add_request(a)
    engine.add_request(b)
    engine.step()  # a and b prefill whole and sample a token
    engine.add_request(c)  # no seat left: it waits
    s = replica_stats(engine.scheduler.make_stats(), "r7")
    assert s.replica_id == "r7" and s.max_seats == 2 and s.block_size == 16
    assert s.max_step_tokens == 2048
    assert s.running == (0, 1, 0, 1) and s.free_seats == 0
    assert s.waiting == (0, 0, 1, 0) and s.waiting_tokens == (0, 0, 30, 0)
    assert s.prefill_tokens == (0, 0, 0, 0)
    # c: 30 to prefill (its outputs are not counted while it waits); a: 1 known token to
    # compute + 4 more outputs; b: 1 + 2.
    assert s.outstanding_tokens == 30 + 5 + 3
    kv = engine.scheduler.kv
    assert s.used_blocks == (0, 3, 0, 2)  # 41 tokens -> 3 blocks, 21 -> 2
    assert s.headroom == tuple(kv.headroom(p) for p in Priority)
    assert s.free_blocks == kv.pool.num_free == 64 - 5
    assert s.p0_room == kv.ledger.ceiling
    # a computed two full blocks, b one: those are cached and advertised.
    assert s.prefix_hashes == {hash_key(h) for h in a.block_hashes[:2] + b.block_hashes[:1]}
    assert s.prefix_match(RouteRequest.of(a.prompt_token_ids, Priority.P0, 16)) == 2
    assert s.prefix_match(RouteRequest.of(b.prompt_token_ids, Priority.P0, 16)) == 1
    assert s.time == engine.clock.now()
    # Reading twice gives the same and touches nothing.
    assert replica_stats(engine.scheduler.make_stats(), "r7") == s
    engine.scheduler.check_invariants()
    assert json.loads(json.dumps(s.to_dict()))["running"] == [0, 1, 0, 1]


def test_replica_stats_count_chunked_prefill_and_forget_finished_prefixes():
    engine = _small_engine(seats=2, budget=32)
    a = _req("a", 50, 2, Priority.P1)
    engine.add_request(a)
    engine.step()  # 32 of 50 prompt tokens
    s = replica_stats(engine.scheduler.make_stats(), "r0")
    assert s.prefill_tokens == (0, 18, 0, 0) and s.outstanding_tokens == 18 + 2
    assert s.prefix_hashes == {hash_key(h) for h in a.block_hashes[:2]}
    while engine.has_unfinished():
        engine.step()
    s = replica_stats(engine.scheduler.make_stats(), "r0")
    assert s.running == (0, 0, 0, 0) and s.outstanding_tokens == 0
    assert s.prefix_hashes == frozenset()  # still cached, no longer advertised


# -- the fleet driver -------------------------------------------------------------------------


def test_a_fleet_of_one_replays_the_single_replica_driver_exactly():
    engine, _, _ = build(SMALL)
    adm = AdmissionController(SMALL.admission, engine.scheduler, engine.clock, SMALL.priorities)
    single = drive(engine, Workload(SMALL.workload), adm, engine.clock.set)
    fleet = drive_fleet(
        build_fleet(FleetConfig(SMALL, 1, "least-loaded")),
        Workload(SMALL.workload),
        make_router("least-loaded"),
        SMALL.block_size,
    )
    assert len(single.records) > 100
    assert fleet.records == single.records
    assert fleet.samples == single.samples
    assert fleet.end_time == single.end_time


def test_every_request_lands_on_the_replica_the_router_picks():
    cfg = FleetConfig(SMALL, 3, "least-loaded")
    reps = build_fleet(cfg)

    def always_r01(request, stats):
        assert sorted(s.replica_id for s in stats) == ["r00", "r01", "r02"]
        return [("r01", "test")]

    res = drive_fleet(reps, Workload(SMALL.workload), always_r01, SMALL.block_size)
    assert res.routed == {"r01": len(res.records)} and res.decisions == {"test": len(res.records)}
    assert reps[0].executor.totals.steps == reps[2].executor.totals.steps == 0
    assert reps[1].executor.totals.steps > 0
    assert all(r.outcome == "completed" for r in res.records)


def test_a_fleet_run_is_reproducible_and_loses_nothing():
    cfg = FleetConfig(replace(SMALL, workload=replace(SMALL.workload, concurrency=96)), 4)
    a, b = run_fleet(cfg), run_fleet(cfg)
    strip = lambda r: {k: v for k, v in r.items() if k != "wall_s"}  # noqa: E731
    assert strip(a) == strip(b)
    assert a["failed"] == a["unfinished"] == a["rejected"] == 0
    assert a["routed_min"] > 0  # every replica got work
    assert 0.5 < a["utilization"] <= 1 + 1e-9
    assert set(a["decisions"]) <= {"p0-free", "p0-preempt", "p0-wait", "least-queued", "prefix"}


def test_fleet_config_refuses_bad_input():
    with pytest.raises(ValueError, match="replicas"):
        FleetConfig(SMALL, 0)
    with pytest.raises(ValueError, match="unknown router"):
        FleetConfig(SMALL, 2, "random")


def test_the_step_oracle_sends_p0_where_the_step_in_flight_ends_first():
    from tierserve.routing.rank import rank_replicas
    from tierserve.sim.fleet.model import step_oracle

    engine_a, engine_b = _small_engine(), _small_engine()
    engine_b.clock.set(0.5)  # b's step in flight ends later
    a = replica_stats(engine_a.scheduler.make_stats(), "a")
    b = replica_stats(engine_b.scheduler.make_stats(), "b")
    p0 = RouteRequest(Priority.P0, 32)
    assert step_oracle(p0, [b, a])[0] == ("a", "step-oracle")
    p1 = RouteRequest(Priority.P1, 32)
    assert step_oracle(p1, [b, a]) == rank_replicas(p1, [b, a])


def test_the_simulate_command_offers_every_fleet_router():
    from tierserve.cli import build_parser
    from tierserve.sim.fleet.model import FLEET_ROUTERS

    sim = build_parser()._subparsers._group_actions[0].choices["simulate"]
    router = next(a for a in sim._actions if a.dest == "router")
    assert tuple(router.choices) == FLEET_ROUTERS
