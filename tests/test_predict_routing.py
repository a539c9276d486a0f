"""Predictive routing (`--predictive routing`): a replica's report carries the KV and work its
length predictor expects, and the cluster's ranking prefers the replica with less predicted work
where queued tokens tie, and the one not predicted to run out of KV. Through the real scheduler,
its record, the replica report's JSON and the Ray Serve router."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from types import SimpleNamespace

import pytest

from tests.helpers import make_request
from tests.test_predict_scheduler import build, drain
from tierserve.cluster.local_load import LocalLoad
from tierserve.core.predict import LengthPredictor
from tierserve.priority import Priority
from tierserve.routing import ReplicaStats, RouteRequest, rank_replicas, replica_stats
from tierserve.routing.rank import LEAST_QUEUED, predicted_shortfall


def stats(rid: str, **kw) -> ReplicaStats:
    base = dict(
        replica_id=rid, block_size=16, num_blocks=1000, free_blocks=1000,
        partition_free=(0, 0, 1000), headroom=(1000,) * 4, used_blocks=(0,) * 4, p0_room=1000,
        waiting=(0,) * 4, waiting_tokens=(0,) * 4, prefill_tokens=(0,) * 4, running=(0,) * 4,
        max_seats=64, max_step_tokens=512, outstanding_tokens=0,
    )  # fmt: skip
    base.update(kw)
    return ReplicaStats(**base)


P1 = RouteRequest(Priority.P1, 100)


def test_less_predicted_work_wins_where_queued_tokens_tie():
    # `a` counts less by max_tokens (outstanding), `b` is predicted to finish far sooner.
    a = stats("a", outstanding_tokens=1000, predicted_blocks=(0, 40, 0, 0), predicted_tokens=900)
    b = stats("b", outstanding_tokens=5000, predicted_blocks=(0, 40, 0, 0), predicted_tokens=100)
    assert [r for r, _ in rank_replicas(P1, [a, b])] == ["b", "a"]
    plain = [dataclasses.replace(s, predicted_blocks=None, predicted_tokens=None) for s in (a, b)]
    assert [r for r, _ in rank_replicas(P1, plain)] == ["a", "b"]  # off: max_tokens decides
    # one replica without predictions: nobody's are used (the figures would not compare)
    assert [r for r, _ in rank_replicas(P1, [a, plain[1]])] == ["a", "b"]


def test_a_replica_predicted_to_run_out_of_kv_ranks_after_one_that_is_not():
    # `a` has less queued but its requests are predicted to outgrow its 1,000 blocks.
    a = stats("a", waiting_tokens=(0, 200, 0, 0), predicted_blocks=(0, 1100, 0, 0),
              predicted_tokens=5000)  # fmt: skip
    b = stats("b", waiting_tokens=(0, 900, 0, 0), predicted_blocks=(0, 300, 0, 0),
              predicted_tokens=5000)  # fmt: skip
    assert predicted_shortfall(P1, a) == (1100 + 7 - 1000) * 16
    assert predicted_shortfall(P1, b) == 0
    assert rank_replicas(P1, [a, b]) == [("b", LEAST_QUEUED), ("a", LEAST_QUEUED)]
    # a less urgent class's predicted KV does not count against P1 (P1 preempts it)
    a_p3 = dataclasses.replace(a, predicted_blocks=(0, 0, 0, 1100))
    assert [r for r, _ in rank_replicas(P1, [a_p3, b])] == ["a", "b"]
    # P0 keeps its own rule: it starts where it can, whatever is predicted
    p0 = RouteRequest(Priority.P0, 100)
    assert [r for r, _ in rank_replicas(p0, [a, b])] == ["a", "b"]


def test_bad_predicted_fields_are_named():
    with pytest.raises(ValueError, match="come together"):
        stats("a", predicted_blocks=(0, 0, 0, 0))
    with pytest.raises(ValueError, match="predicted_blocks must be 4"):
        stats("a", predicted_blocks=(1, 2), predicted_tokens=3)
    with pytest.raises(ValueError, match="predicted_tokens must be"):
        stats("a", predicted_blocks=(0, 0, 0, 0), predicted_tokens=-1)
    old = stats("a").to_dict()  # a report without them still reads (older replicas)
    del old["predicted_blocks"], old["predicted_tokens"]
    assert not ReplicaStats.from_dict(old).predicted


def taught(long: bool) -> LengthPredictor:
    """A predictor that learned tenant `t`'s 8-token prompts end at 4 or 60 tokens."""
    eng, clock = build(seqs=64)
    for _ in range(12):
        eng.add_request(make_request(8, Priority.P1, max_tokens=60 if long else 4, tenant="t"))
    drain(eng, clock)
    return eng.scheduler.predictor


def replica(long: bool, routing: bool = True):
    """A scheduler running four of tenant `t`'s requests (max_tokens 64), prefilled."""
    eng, clock = build(seqs=64, predictor=taught(long))
    eng.scheduler.config = dataclasses.replace(eng.scheduler.config, predictive_routing=routing)
    for _ in range(4):
        eng.add_request(make_request(8, Priority.P1, max_tokens=64, tenant="t", ignore_eos=False))
    eng.step()
    clock.advance(0.01)
    return eng


def test_the_scheduler_record_carries_what_its_predictor_expects():
    short, long = replica(long=False), replica(long=True)
    s, lo = short.scheduler.make_stats().predicted, long.scheduler.make_stats().predicted
    assert s.blocks[Priority.P1] == 4 * -(-(8 + 4) // 4)  # prompt + P50 output, 4-token blocks
    assert lo.blocks[Priority.P1] > 2 * s.blocks[Priority.P1]
    assert 4 * 2 <= s.tokens < lo.tokens
    assert replica(False, routing=False).scheduler.make_stats().predicted is None


def test_through_the_replica_report_and_the_router():
    """Record -> ReplicaStats -> the JSON Ray Serve carries -> the router's ranking."""
    pytest.importorskip("ray")
    from tierserve.cluster import wire
    from tierserve.cluster.router import TierRequestRouter

    reports = {
        "long": replica_stats(replica(long=True).scheduler.make_stats(), "long"),
        "short": replica_stats(replica(long=False).scheduler.make_stats(), "short"),
    }
    r = {k: v.to_dict() for k, v in reports.items()}
    assert r["long"]["waiting_tokens"] == r["short"]["waiting_tokens"]  # queued tokens tie
    assert r["long"]["outstanding_tokens"] == r["short"]["outstanding_tokens"]  # by max_tokens
    assert r["long"]["predicted_tokens"] > r["short"]["predicted_tokens"]
    router = TierRequestRouter.__new__(TierRequestRouter)
    router.initialize_state(router="priority-aware", hold_s=0.0)
    fakes = [
        SimpleNamespace(
            replica_id=SimpleNamespace(unique_id=k), routing_stats=json.loads(json.dumps(v))
        )
        for k, v in sorted(r.items())
    ]
    req = make_request(8, Priority.P1, tenant="t")
    payload = wire.request_payload(req, RouteRequest(Priority.P1, 8), (), None)
    pending = SimpleNamespace(args=[payload], kwargs={})
    ranks = asyncio.run(router.choose_replicas(fakes, pending))
    assert [x[0].replica_id.unique_id for x in ranks] == ["short", "long"]


def test_local_load_adds_sent_prompts_to_the_predicted_figures():
    ll = LocalLoad(hold_s=1.0)
    ll.sent("a", 100, Priority.P1, now=0.0)
    s = ll.adjust(stats("a", predicted_blocks=(0, 10, 0, 0), predicted_tokens=50), now=0.5)
    assert s.predicted_blocks == (0, 10 + 7, 0, 0) and s.predicted_tokens == 150
    assert not ll.adjust(stats("a"), now=0.5).predicted


def test_the_simulated_fleet_ranks_by_the_same_predicted_figures():
    """`SimConfig.predictive_routing`: the fleet's replicas report predictions through the same
    record and ranking code; routing changes, nothing is lost, runs repeat exactly."""
    from tierserve.sim.engine.runner import SimConfig
    from tierserve.sim.fleet.model import FleetConfig, build_fleet, run_fleet
    from tierserve.workloads.synthetic import WorkloadConfig

    sim = SimConfig(
        hardware="h100-80gb", model="llama-3.1-8b", tp=1, max_num_seqs=32,
        max_num_batched_tokens=1024, num_kv_blocks=1500,
        workload=WorkloadConfig(concurrency=32, duration_s=8.0, warmup_s=2.0, seed=4,
                                lengths="heavy_tail"),
    )  # fmt: skip
    on = dataclasses.replace(sim, predictive_routing=True)
    assert build_fleet(FleetConfig(on, 2))[0].stats().predicted
    assert not build_fleet(FleetConfig(sim, 2))[0].stats().predicted
    a, b, off = (
        run_fleet(FleetConfig(on, 3)),
        run_fleet(FleetConfig(on, 3)),
        run_fleet(FleetConfig(sim, 3)),
    )
    assert a["config"]["predictive_routing"] and not off["config"]["predictive_routing"]
    same = ("completed", "preemptions", "throughput_tokens_per_s", "routed_max", "classes")
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    assert a["classes"] != off["classes"]  # the ranking read the predictions
    assert a["failed"] == 0 == off["failed"]
