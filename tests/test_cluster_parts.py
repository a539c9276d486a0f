"""The cluster package's plain parts, without Ray or a model: the wire format, the fleet board,
per-class signals, the autoscaling decision, the router's local load, the /metrics merge, the
RemoteEngine's retry rules (against fake replica streams), and the request router's ranking
glue (against fake replicas)."""

import asyncio
import dataclasses
import json
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tierserve.cli import build_parser
from tierserve.cli.serve import build_configs, merged_options
from tierserve.clock import ManualClock
from tierserve.cluster import wire
from tierserve.cluster.autoscale import ClassAutoscalingPolicy, ScaleConfig, desired_replicas
from tierserve.cluster.fleet import FleetBoard, FleetView, ReplicaLoad
from tierserve.cluster.launch import ClusterOptions, cluster_options
from tierserve.cluster.local_load import LocalLoad
from tierserve.cluster.observe import IngressMetrics
from tierserve.cluster.remote_engine import RemoteEngine
from tierserve.cluster.signals import ClassWindow
from tierserve.core.limits import RequestLimits
from tierserve.engine.async_engine import StreamDelta
from tierserve.grammar import GrammarSpec
from tierserve.priority import Priority
from tierserve.request import EngineRequest
from tierserve.routing import ReplicaStats, RouteRequest
from tierserve.sampling_params import SamplingParams

# -- wire ----------------------------------------------------------------------------------------


def make_request(rid="r-1", priority=Priority.P1, prompt=(5, 6, 7), **sp) -> EngineRequest:
    params = SamplingParams(max_tokens=8, stop=("x",), seed=3, **sp)
    return EngineRequest(rid, prompt, params, priority=priority, tenant="acme", cache_salt="acme")


def test_payload_round_trip_rebases_times_on_the_replica_clock():
    req = dataclasses.replace(
        make_request(), arrival_time=100.0, deadline=100.5, eos_token_id=2, predicted_ttft=0.25
    )
    route = RouteRequest.of(list(range(40)), Priority.P1, 16, "acme")
    p = json.loads(json.dumps(wire.request_payload(req, route, avoid=("dead",))))
    back = wire.request_from_payload(p, now=7.0)
    # the frozen request, field for field, arriving at the replica's clock
    assert back == dataclasses.replace(req, arrival_time=7.0, deadline=7.5)
    # sent after 1.25 s at the ingress (held, or a first try at a replica that died): the
    # replica counts that wait, its deadline as near as it was
    late = json.loads(json.dumps(wire.request_payload(req, route, now=101.25)))
    back = wire.request_from_payload(late, now=7.0)
    assert (back.arrival_time, back.deadline) == (5.75, 6.25)
    r, avoid, pin = wire.route_of(p)
    assert r == route and avoid == {"dead"} and pin is None


def test_every_sampling_feature_crosses_the_wire():
    req = make_request(
        presence_penalty=0.5, repetition_penalty=1.2, logit_bias={7: -3.0, 2: 1.5},
        stop_token_ids=(9,), top_logprobs=3, prompt_logprobs=1,
        skip_special_tokens=False, grammar=GrammarSpec.json_schema({"type": "object"}),
    )  # fmt: skip
    payload = json.loads(json.dumps(wire.request_payload(req, RouteRequest(Priority.P1, 3))))
    back = wire.request_from_payload(payload, now=0.0).sampling_params
    assert back == req.sampling_params
    assert back.processed and back.uses_penalties  # derived again on the replica


def test_the_replica_finds_its_reason_in_the_router_ranking():
    p = wire.request_payload(make_request(), RouteRequest(Priority.P0, 3))
    assert wire.chosen_reason(p, "a") == (wire.UNRANKED, -1)
    wire.annotate(p, [("b", "p0-preempt"), ("a", "p0-wait")])
    assert wire.chosen_reason(p, "b") == ("p0-preempt", 0)
    assert wire.chosen_reason(p, "a") == ("p0-wait", 1)


def test_delta_chunks_round_trip():
    d = StreamDelta("hi", [1, 2], [-0.1, -0.2], True, "stop", None, 3, 2)
    assert wire.chunk_delta(wire.delta_chunk(d)) == d
    lp = StreamDelta(
        "a", [1], [-0.1], top_logprobs=[((1, 4), (-0.1, -2.5))], prompt_logprobs=[(-1.0, None)]
    )
    back = wire.chunk_delta(json.loads(json.dumps(wire.delta_chunk(lp))))
    assert back.top_logprobs == [[[1, 4], [-0.1, -2.5]]]  # JSON's lists, read as pairs alike
    assert back.prompt_logprobs == [[-1.0, None]]


# -- fleet board ---------------------------------------------------------------------------------


def load(served=(0, 0, 0, 0), **kw) -> dict:
    return ReplicaLoad(served=served, served_tokens=served, **kw).to_dict()


def test_board_sums_live_replicas_and_keeps_served_counts_when_one_goes():
    b = FleetBoard(expire_s=3.0)
    b.report("a", load((5, 1, 0, 0), waiting=(1, 0, 0, 2), max_num_seqs=4), "text-a", now=0.0)
    b.report("b", load((2, 0, 0, 0), running=(0, 3, 0, 0), max_num_seqs=4), None, now=1.0)
    v = FleetView.from_dict(b.view(now=1.0))
    assert v.num_replicas == 2 and v.seats == 8
    assert v.waiting == (1, 0, 0, 2) and v.running == (0, 3, 0, 0)
    assert v.served(0) == (7, 7) and v.metrics == {"a": "text-a", "b": ""}
    b.report("a", load((6, 1, 0, 0)), None, now=1.5)  # metrics text kept from the last one
    assert FleetView.from_dict(b.view(now=1.5)).metrics["a"] == "text-a"
    v = FleetView.from_dict(b.view(now=4.2))  # b silent for 3.2 s: gone, its counts retired
    assert list(v.loads) == ["a"] and v.served(0) == (8, 8)
    b.report("c", load((1, 0, 0, 0)), None, now=4.3)  # a replacement starts at zero
    assert FleetView.from_dict(b.view(now=4.3)).served(0) == (9, 9)


def test_an_empty_view_is_an_idle_cluster():
    v = FleetView()
    assert v.num_replicas == 0 and v.waiting == (0, 0, 0, 0) and v.served(2) == (0, 0)


# -- signals and autoscaling ----------------------------------------------------------------------


def test_class_window_wait_ratio_counts_starved_waiters():
    w = ClassWindow((0.5, 5.0, 60.0, None), window_s=10.0)
    w.on_added("a", Priority.P0, 0.0)
    w.on_first_token("a", Priority.P0, 0.2, 0.2)
    w.on_added("b", Priority.P0, 1.0)  # still waiting at t=2: age 1.0 s = 2x the P0 SLA
    w.on_added("c", Priority.P3, 0.0)
    s = w.summary(2.0)
    assert s.wait_ratio[0] == pytest.approx(2.0) and s.waiting[0] == 1
    assert s.attainment[0] == 1.0 and s.samples[0] == 1
    assert s.wait_ratio[3] == 0.0  # no SLA
    w.on_first_token("b", Priority.P0, 1.5, 2.5)
    s = w.summary(2.5)
    assert s.attainment[0] == 0.5 and s.waiting[0] == 0
    assert w.summary(20.0).samples[0] == 0  # out of the window
    m = s.autoscaling_metrics()
    assert m["p0_sla_attainment"] == 0.5 and m["p3_waiting"] == 1.0


def metrics(p0=(0.0, 1.0, 0), p1=(0.0, 1.0, 0)) -> dict:
    return {
        "p0_wait_ratio": p0[0],
        "p0_sla_attainment": p0[1],
        "p0_waiting": p0[2],
        "p1_wait_ratio": p1[0],
        "p1_sla_attainment": p1[1],
        "p1_waiting": p1[2],
    }


def test_autoscaling_scales_out_for_p0_on_any_replica_and_p1_on_most():
    cfg = ScaleConfig()
    busy_p3 = metrics()
    busy_p3["p3_waiting"] = 500.0  # background work alone never scales out
    assert desired_replicas({"a": busy_p3, "b": metrics(p1=(0.3, 1.0, 2))}, 2, cfg) == (
        2,
        "steady",
    )
    assert desired_replicas({"a": metrics(p0=(0.6, 1.0, 1)), "b": metrics()}, 2, cfg) == (
        3,
        "p0-at-risk",
    )
    assert desired_replicas({"a": metrics(p0=(0.1, 0.9, 0)), "b": metrics()}, 2, cfg)[1] == (
        "p0-at-risk"
    )
    one_p1 = {"a": metrics(p1=(1.0, 1.0, 3)), "b": metrics(p1=(0.2, 1.0, 1))}
    assert desired_replicas(one_p1, 2, cfg) == (2, "steady")  # one hot replica: the router's job
    both_p1 = {"a": metrics(p1=(1.0, 1.0, 3)), "b": metrics(p1=(0.5, 0.8, 1))}
    assert desired_replicas(both_p1, 2, cfg) == (3, "p1-at-risk")
    assert desired_replicas({"a": metrics(), "b": metrics()}, 2, cfg) == (1, "quiet")
    # A steady light flow: a request or two always a few ms from its first token, TTFTs far
    # inside the SLA: quiet (a fleet under any load used to stay at its peak size).
    light = metrics(p0=(0.15, 1.0, 1), p1=(0.05, 1.0, 2))
    assert desired_replicas({"a": light, "b": light}, 2, cfg) == (1, "quiet")
    slowish = {"a": light, "b": metrics(p0=(0.3, 1.0, 1))}  # P0 waits 0.3 x its SLA
    assert desired_replicas(slowish, 2, cfg) == (2, "steady")
    assert desired_replicas({"a": metrics()}, 1, cfg) == (1, "steady")
    assert desired_replicas({}, 2, cfg) == (2, "no-metrics")


def test_the_ray_policy_reads_the_context_ray_serve_gives_it():
    ctx = SimpleNamespace(
        aggregated_metrics={"p0_wait_ratio": {"r1": 0.9, "r2": 0.0}},
        current_num_replicas=2,
        policy_state={"kept": 1},
    )
    n, state = ClassAutoscalingPolicy(p0_wait_ratio=0.8)(ctx)
    assert n == 3 and state == {"kept": 1, "tierserve_last_decision": "p0-at-risk"}
    with pytest.raises(ValueError, match="p0_min_attainment"):
        ClassAutoscalingPolicy(p0_min_attainment=2.0)


# -- the router's local load and ranking glue -----------------------------------------------------


def stats(rid, **kw) -> ReplicaStats:
    base = dict(
        replica_id=rid,
        block_size=16,
        num_blocks=100,
        free_blocks=100,
        partition_free=(10, 20, 70),
        headroom=(100, 90, 70, 70),
        used_blocks=(0, 0, 0, 0),
        p0_room=60,
        waiting=(0, 0, 0, 0),
        waiting_tokens=(0, 0, 0, 0),
        prefill_tokens=(0, 0, 0, 0),
        running=(0, 0, 0, 0),
        max_seats=4,
        outstanding_tokens=0,
    )
    if "max_step_tokens" in {f.name for f in dataclasses.fields(ReplicaStats)}:
        base["max_step_tokens"] = 512  # a field the routing branch adds
    base.update(kw)
    return ReplicaStats(**base)


def test_local_load_counts_what_was_sent_until_the_hold_expires():
    ll = LocalLoad(hold_s=1.0)
    ll.sent("a", 100, Priority.P1, now=0.0)
    ll.sent("a", 20, Priority.P0, now=0.5)
    s = ll.adjust(stats("a", waiting_tokens=(0, 7, 0, 0), outstanding_tokens=7), now=0.9)
    assert s.waiting == (1, 1, 0, 0) and s.waiting_tokens == (20, 107, 0, 0)
    assert s.outstanding_tokens == 127
    assert ll.adjust(stats("a"), now=1.2).waiting == (1, 0, 0, 0)
    assert ll.adjust(stats("b"), now=0.9) == stats("b")
    ll.forget_except({"b"})
    assert ll.adjust(stats("a"), now=0.9) == stats("a")


class FakeReplica:
    def __init__(self, rid, routing_stats):
        self.replica_id = SimpleNamespace(unique_id=rid)
        self.routing_stats = routing_stats


def route_request(pin=None, avoid=(), priority=Priority.P0, prompt=32):
    req = make_request(priority=priority, prompt=range(prompt))
    p = wire.request_payload(req, RouteRequest(priority, prompt), tuple(avoid), pin)
    return SimpleNamespace(args=[p], kwargs={}), p


def make_router(name="priority-aware"):
    pytest.importorskip("ray")
    from tierserve.cluster.router import TierRequestRouter

    router = TierRequestRouter.__new__(TierRequestRouter)  # Serve builds it with its own args
    router.initialize_state(router=name, hold_s=0.0)
    return router


def test_router_ranks_with_the_shared_rule_and_annotates_the_payload():
    router = make_router()
    p3_full = FakeReplica(
        "b", stats("b", running=(0, 0, 0, 4), used_blocks=(0, 0, 0, 40)).to_dict()
    )
    p1_full = FakeReplica(
        "a", stats("a", running=(0, 4, 0, 0), used_blocks=(0, 40, 0, 0)).to_dict()
    )
    fresh = FakeReplica("c", {})  # no stats yet
    pending, p = route_request()
    ranks = asyncio.run(router.choose_replicas([p1_full, p3_full, fresh], pending))
    assert [[r.replica_id.unique_id for r in rank] for rank in ranks] == [["b"], ["a"], ["c"]]
    assert p["route"]["ranking"] == [["b", "p0-preempt"], ["a", "p0-preempt"], ["c", "unranked"]]


def test_router_puts_the_replicas_the_ingress_saw_room_in_first():
    # b looks full in its (older) stats, a idle; the ingress released the request for a seat
    # it saw free on b: b first, then the ranking's order; an avoided preferred one stays last.
    router = make_router()
    a = FakeReplica("a", stats("a").to_dict())
    b = FakeReplica("b", stats("b", running=(0, 4, 0, 0), used_blocks=(0, 40, 0, 0)).to_dict())
    pending, p = route_request(priority=Priority.P3)
    assert asyncio.run(router.choose_replicas([a, b], pending)) == [[a], [b]]
    pending, p = route_request(priority=Priority.P3)
    p["route"]["prefer"] = ["b"]
    assert asyncio.run(router.choose_replicas([a, b], pending)) == [[b], [a]]
    assert [rid for rid, _ in p["route"]["ranking"]] == ["b", "a"]
    pending, p = route_request(priority=Priority.P3, avoid=("b",))
    p["route"]["prefer"] = ["b"]
    assert asyncio.run(router.choose_replicas([a, b], pending)) == [[a], [b]]


def test_router_honours_pins_and_puts_avoided_replicas_last():
    router = make_router()
    a, b = FakeReplica("a", stats("a").to_dict()), FakeReplica("b", stats("b").to_dict())
    pending, p = route_request(pin="b")
    assert asyncio.run(router.choose_replicas([a, b], pending)) == [[b]]
    assert p["route"]["ranking"] == [["b", wire.PINNED]]
    pending, _ = route_request(pin="gone")
    assert asyncio.run(router.choose_replicas([a, b], pending)) == []  # wait for it
    pending, p = route_request(avoid=("a",))
    assert asyncio.run(router.choose_replicas([a, b], pending)) == [[b], [a]]
    assert p["route"]["ranking"][-1] == ["a", "avoided"]
    other = SimpleNamespace(args=[], kwargs={})  # not a generate call: any replica
    assert asyncio.run(router.choose_replicas([a, b], other)) == [[a], [b]]


# -- /metrics --------------------------------------------------------------------------------------

REPLICA_TEXT = """# HELP llm_requests_total Ended requests
# TYPE llm_requests_total counter
llm_requests_total{finish_reason="stop",priority="P0"} 3.0
# HELP llm_admission_rejections_total Requests refused before the queue
# TYPE llm_admission_rejections_total counter
llm_admission_rejections_total{priority="P0",reason="rate_limited"} 0.0
"""


def test_ingress_metrics_label_every_replica_sample_and_own_admission():
    m = IngressMetrics(lambda: {"r1": REPLICA_TEXT, "r2": REPLICA_TEXT.replace("3.0", "4.0")})
    m.on_rejected("rate_limited", Priority.P0)
    m.on_routed("r1", "p0-free")
    m.on_replica_failure(retried=True)
    fams = {f.name: f for f in text_string_to_metric_families(m.render().decode())}
    done = {s.labels["replica"]: s.value for s in fams["llm_requests"].samples}
    assert done == {"r1": 3.0, "r2": 4.0}
    rejected = [s for s in fams["llm_admission_rejections"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in rejected] == [
        ({"reason": "rate_limited", "priority": "P0"}, 1.0)
    ]
    routed = [s for s in fams["tierserve_routed_requests"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in routed] == [({"replica": "r1", "reason": "p0-free"}, 1.0)]


# -- RemoteEngine ----------------------------------------------------------------------------------


class Died(Exception):
    pass


class FakeStream:
    """A replica's chunk stream: a hello, `tokens` deltas, then finished or `fail`."""

    def __init__(self, replica, tokens, fail=None, finish=True):
        self.replica, self.tokens, self.fail, self.finish = replica, tokens, fail, finish
        self.cancelled = False

    async def _gen(self):
        yield wire.hello(self.replica, "least-queued", 0)
        for i in range(self.tokens):
            await asyncio.sleep(0)
            yield wire.delta_chunk(StreamDelta(text=f"t{i}", token_ids=[i]))
        if self.fail:
            raise self.fail
        if self.finish:
            yield wire.delta_chunk(StreamDelta(finished=True, finish_reason="length"))

    def __aiter__(self):
        return self._gen()

    def cancel(self):
        self.cancelled = True


def remote(streams, max_retries=2):
    sent = []
    queue = list(streams)

    def open_stream(payload):
        sent.append(payload)
        return queue.pop(0)

    m = IngressMetrics(dict)
    eng = RemoteEngine(
        open_stream,
        RequestLimits(2048, 16, (100, 100, 100, 100)),
        ManualClock(),
        m,
        lambda e: isinstance(e, Died),
        max_retries,
    )
    return eng, sent, m


async def collect(eng, req):
    async with eng.submit(req) as stream:
        return [d async for d in stream.deltas()]


def failures(m, outcome):
    return m.failures.labels(outcome)._value.get()


def test_a_stream_that_broke_before_its_first_token_is_retried_elsewhere():
    eng, sent, m = remote([FakeStream("a", 0, Died()), FakeStream("b", 3)])
    out = asyncio.run(collect(eng, make_request()))
    assert [d.text for d in out] == ["t0", "t1", "t2", ""] and out[-1].finish_reason == "length"
    assert sent[1]["route"]["avoid"] == ["a"]
    assert failures(m, "retried") == 1 and failures(m, "ended") == 0
    assert eng.num_in_flight() == 0 and eng.queue_depth(Priority.P1) == 0


def test_a_stream_that_broke_after_tokens_ends_with_an_error():
    eng, sent, m = remote([FakeStream("a", 2, Died())])
    out = asyncio.run(collect(eng, make_request()))
    assert [d.text for d in out[:2]] == ["t0", "t1"]
    last = out[-1]
    assert last.finished and last.finish_reason == "error"
    assert "replica a failed after streaming 2 tokens" in last.error
    assert len(sent) == 1 and failures(m, "ended") == 1 and eng.num_in_flight() == 0


def test_retries_are_bounded_and_other_errors_end_the_stream():
    eng, sent, m = remote([FakeStream(r, 0, Died()) for r in "abc"], max_retries=2)
    out = asyncio.run(collect(eng, make_request()))
    assert out[-1].finish_reason == "error" and len(sent) == 3
    assert sent[2]["route"]["avoid"] == ["a", "b"]
    eng, sent, m = remote([FakeStream("a", 1, ValueError("boom"))])
    out = asyncio.run(collect(eng, make_request()))
    assert out[-1].finish_reason == "error" and "boom" in out[-1].error and len(sent) == 1
    eng, sent, m = remote([FakeStream("a", 1, finish=False), FakeStream("b", 0)])
    out = asyncio.run(collect(eng, make_request()))  # ended unfinished after a token: no retry
    assert out[-1].finish_reason == "error" and len(sent) == 1 and failures(m, "ended") == 1


def test_leaving_early_cancels_the_remote_stream():
    stream = FakeStream("a", 50)
    eng, _, _ = remote([stream])

    async def main():
        gen = eng.submit(make_request()).deltas()
        await gen.__anext__()
        await gen.aclose()
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert stream.cancelled and eng.num_in_flight() == 0


class HeldStream(FakeStream):
    """A stream whose hello waits for `go`: the request is in flight, unacknowledged."""

    def __init__(self, go):
        super().__init__("a", 1)
        self.go = go

    async def _gen(self):
        await self.go.wait()
        async for c in super()._gen():
            yield c


def test_queue_view_counts_requests_no_replica_has_acknowledged():
    async def main():
        go = asyncio.Event()
        eng, _, _ = remote([HeldStream(go)])
        loads = {"a": ReplicaLoad(running=(0, 2, 0, 0), waiting=(0, 1, 0, 0), max_num_seqs=2)}
        eng.set_view(FleetView(loads=loads, retired=((0, 5, 0, 0), (0, 50, 0, 0))))
        assert eng.queue_depth(Priority.P1) == 1 and eng.queued_tokens(Priority.P1) == 0
        gen = eng.submit(make_request()).deltas()  # 3 prompt tokens, not acknowledged yet
        assert eng.queue_depth(Priority.P1) == 2 and eng.queued_tokens(Priority.P1) == 3
        go.set()
        out = [d async for d in gen]
        assert out[-1].finished and eng.queue_depth(Priority.P1) == 1
        assert not eng.can_shed(Priority.P0) and eng.dequeued(Priority.P1) == (5, 50)

    asyncio.run(main())


# -- options ---------------------------------------------------------------------------------------


def test_cluster_options_from_serve_flags():
    assert cluster_options({}) is None
    assert cluster_options({"replicas": 3}) == ClusterOptions(replicas=3)
    assert cluster_options({"ray_address": "auto"}).replicas == 1
    with pytest.raises(ValueError, match="at least 1"):
        cluster_options({"replicas": 0})
    with pytest.raises(ValueError, match="max-replicas"):
        cluster_options({"replicas": 3, "max_replicas": 2})
    with pytest.raises(ValueError, match="unknown router"):
        cluster_options({"replicas": 2, "router": "random"})
    with pytest.raises(ValueError, match="prefix-margin-tokens"):
        cluster_options({"replicas": 2, "prefix_margin_tokens": -1})
    argv = ["serve", "--replicas", "2", "--max-replicas", "4", "--router", "least-loaded"]
    argv += ["--prefix-margin-tokens", "256", "--max-num-seqs", "8"]
    opts = merged_options(build_parser().parse_args(argv))
    assert cluster_options(opts) == ClusterOptions(
        replicas=2, max_replicas=4, router="least-loaded", prefix_margin_tokens=256
    )
    assert build_configs(opts)[0].max_num_seqs == 8  # engine flags still reach every replica


def test_max_replicas_deploys_the_class_policy_through_ray_serves_hook():
    pytest.importorskip("ray")
    from tierserve.cluster.launch import _scaling

    assert _scaling(ClusterOptions(replicas=2)) == {"num_replicas": 2}
    cfg = _scaling(ClusterOptions(replicas=1, max_replicas=3))["autoscaling_config"]
    assert (cfg.min_replicas, cfg.initial_replicas, cfg.max_replicas) == (1, 1, 3)
    policy_cls = cfg.policy.get_policy()  # what Serve's controller unpickles and instantiates
    policy = policy_cls(**cfg.policy.policy_kwargs)
    ctx = SimpleNamespace(
        aggregated_metrics={"p0_sla_attainment": {"r1": 0.5}},
        current_num_replicas=1,
        policy_state={},
    )
    assert policy(ctx)[0] == 2


def test_each_of_k_ingress_replicas_holds_a_kth_of_every_bucket():
    pytest.importorskip("ray")
    from tierserve.cluster.ingress import split_admission, split_bucket
    from tierserve.config import AdmissionConfig, BucketConfig

    cfg = AdmissionConfig(global_bucket=BucketConfig(1000, 4000), tenant_bucket=None)
    share = split_admission(cfg, 4)
    assert share.global_bucket == BucketConfig(250, 1000) and share.tenant_bucket is None
    assert share.max_queued_requests == cfg.max_queued_requests  # queue limits are cluster-wide
    assert split_bucket(BucketConfig(10, 20), 1) == BucketConfig(10, 20)


def test_sla_admission_with_replicas_is_accepted():
    """The ingress judges a request on its best replica (admission/fleet_load.py); the
    replicas publish their predictor inputs when the engine arguments ask for SLA admission."""
    from tierserve.cluster.launch import cluster_options

    assert cluster_options({"replicas": 2, "sla_admission": True}).replicas == 2
    assert cluster_options({"replicas": 2, "sla_admission": False}).replicas == 2


def test_class_window_counts_a_request_ended_late_without_a_first_token_as_a_miss():
    """A request that ends before its first token (the SLA re-check ended it, it failed, its
    client left) after its class's SLA had passed missed the SLA: attainment falls. One that
    ends in time without a token (a client leaving at once) is no sample either way."""
    w = ClassWindow((0.5, 5.0, 60.0, None), window_s=10.0)
    w.on_added("ok", Priority.P1, 0.0)
    w.on_first_token("ok", Priority.P1, 1.0, 1.0)
    w.on_added("late", Priority.P1, 0.0)
    w.on_added("quick", Priority.P1, 5.5)
    w.on_finished("late", 6.0)  # 6 s without a first token: 1 s past the 5 s SLA
    w.on_finished("quick", 6.0)  # 0.5 s: left in time, no verdict
    s = w.summary(6.0)
    assert s.waiting[1] == 0 and s.samples[1] == 2
    assert s.attainment[1] == 0.5
    assert s.wait_ratio[1] == pytest.approx(6.0 / 5.0)
    w.on_added("bg", Priority.P3, 0.0)
    w.on_finished("bg", 100.0)  # no SLA: never a miss
    assert w.summary(100.0).samples[3] == 0


def seats_held(in_flight: float, mean: float | None = None, seats: float = 64.0) -> dict:
    """A quiet replica holding `in_flight` requests (`mean` over its window) of `seats`."""
    return {**metrics(), "in_flight": in_flight, "in_flight_mean": in_flight if mean is None
            else mean, "seats": seats}  # fmt: skip


def test_a_quiet_fleet_scales_in_to_the_replicas_its_load_needs_in_one_decision():
    cfg = ScaleConfig()  # the load fills at most 0.6 of the kept replicas' seats
    # 16 replicas of 64 seats hold 9 requests each: 144 seats' load, 3.75 replicas at 0.6.
    fleet = {f"r{i}": seats_held(9.0) for i in range(16)}
    assert desired_replicas(fleet, 16, cfg) == (8, "quiet")  # at most half the fleet a decision
    assert desired_replicas(fleet, 16, ScaleConfig(scale_in_max_fraction=1.0)) == (4, "quiet")
    # 8 left hold the same load, 18 each: the next decision takes it to 4.
    assert desired_replicas({f"r{i}": seats_held(18.0) for i in range(8)}, 8, cfg) == (4, "quiet")
    # The window's mean remembers a busier spell; the count now sees load just moved here.
    assert desired_replicas({f"r{i}": seats_held(2.0, 30.0) for i in range(8)}, 8, cfg)[0] == 7
    assert desired_replicas({f"r{i}": seats_held(30.0, 2.0) for i in range(8)}, 8, cfg)[0] == 7
    # A quiet fleet whose load needs every replica (0.6 of 64 seats: 38.4 each) stays.
    assert desired_replicas({f"r{i}": seats_held(40.0) for i in range(4)}, 4, cfg) == (
        4,
        "steady",
    )
    # Starting replicas count in `current`: 12 report, 4 more start; 16 -> 8 at most.
    assert desired_replicas({f"r{i}": seats_held(1.0) for i in range(12)}, 16, cfg)[0] == 8
    # An idle fleet: never below one replica (Serve and the simulator clamp to min_replicas).
    assert desired_replicas({"a": seats_held(0.0), "b": seats_held(0.0)}, 2, cfg) == (1, "quiet")
    # Without the seat figures (a replica that does not export them): in by one, as before.
    assert desired_replicas({"a": seats_held(0.0, seats=0.0), "b": metrics()}, 4, cfg)[0] == 3
    with pytest.raises(ValueError, match="scale_in_utilisation"):
        ScaleConfig(scale_in_utilisation=0.0)


def test_class_window_averages_the_seats_held_over_the_window():
    w = ClassWindow((0.5, 5.0, 60.0, None), window_s=10.0, seats=8)
    w.on_added("a", Priority.P1, 0.0)
    w.on_added("b", Priority.P3, 0.0)
    w.on_first_token("a", Priority.P1, 0.1, 0.1)  # decoding: still held
    w.on_finished("b", 5.0)
    m = w.summary(10.0).autoscaling_metrics()
    # 2 held for 5 s, then 1 for 5 s: 1.5 on average; 1 now
    assert m["in_flight"] == 1.0 and m["in_flight_mean"] == pytest.approx(1.5)
    assert m["seats"] == 8.0
    w.on_finished("a", 12.0)
    w.on_finished("zz", 12.0)  # never added: no change
    s = w.summary(20.0)  # the window 10-20 s: 1 held for 2 s
    assert s.in_flight == 0 and s.in_flight_mean == pytest.approx(0.2)
    assert w.summary(40.0).in_flight_mean == 0.0
