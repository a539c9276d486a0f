"""The ingress's priority queue (issue 24.3, cluster/ingress_queue.py): late binding without Ray.
Fleet views as the board gives them; the ingress's RemoteEngine with a fake replica stream that
records what was sent. The held backlog's way to the autoscaling policy, through the fleet
board."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from tierserve.admission import AdmissionController
from tierserve.clock import ManualClock
from tierserve.cluster import wire
from tierserve.cluster.autoscale import ClassAutoscalingPolicy
from tierserve.cluster.board import Board
from tierserve.cluster.fleet import FleetBoard, FleetView, ReplicaLoad
from tierserve.cluster.ingress_queue import IngressQueue
from tierserve.cluster.remote_engine import RemoteEngine
from tierserve.cluster.signals import ClassWindow, with_held
from tierserve.config import AdmissionConfig, PriorityConfig
from tierserve.core.limits import RequestLimits
from tierserve.engine.events import StreamDelta
from tierserve.priority import Priority
from tierserve.request import EngineRequest
from tierserve.sampling_params import SamplingParams

P0, P1, P2, P3 = Priority


def view(*busy: tuple[int, int], at: float = 0.0) -> FleetView:
    """One replica per (seats, requests running or waiting), reported at `at`."""
    loads = {
        f"r{i}": ReplicaLoad(running=(0, n, 0, 0), max_num_seqs=seats)
        for i, (seats, n) in enumerate(busy)
    }
    return FleetView(loads=loads, reported_at=dict.fromkeys(loads, at))


class Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        return self.t


def test_a_held_request_goes_with_the_replicas_whose_room_let_it_go():
    # The router's stats can be older than the board's view: a request let go for a seat
    # that just freed on r1 names r1, so the router ranks it first (not r0, still full).
    async def run():
        clock = Clock()
        q = IngressQueue(clock)
        q.set_view(view((2, 2), (2, 2)))
        p3 = asyncio.create_task(q.wait_turn(P3, "t", 450))
        await asyncio.sleep(0)
        assert not p3.done()
        clock.t = 20.5
        q.set_view(view((2, 2), (2, 0), at=20.0))  # r1's streams ended
        assert await asyncio.wait_for(p3, 0.1) == ("r1",)
        assert await asyncio.wait_for(q.wait_turn(P1, "t"), 0.1) == ("r1",)  # at once, too

    asyncio.run(run())


def test_p0_never_waits_and_the_others_wait_for_a_free_seat():
    async def run():
        clock = Clock()
        q = IngressQueue(clock)
        q.set_view(view((2, 2), (2, 2)))  # every seat taken
        assert q.free_seats() == 0
        await asyncio.wait_for(q.wait_turn(P0, "t"), 0.1)  # at once
        p1 = asyncio.create_task(q.wait_turn(P1, "t"))
        await asyncio.sleep(0)
        assert not p1.done() and q.depth(P1) == 1
        clock.t = 20.5
        q.set_view(view((2, 2), (2, 1), at=20.0))  # a seat frees on r1 (the P0 is in it)
        await asyncio.sleep(0)
        assert p1.done() and q.depth() == 0
        assert q.free_seats() == 0  # the seat is taken by the request just sent

    asyncio.run(run())


def test_a_seat_held_by_a_less_urgent_class_is_room_for_a_more_urgent_one():
    """Every seat runs P3: the engine preempts one for a P1 or P2 request, so neither waits
    here (holding it would only delay it); a P3 request waits for a free seat. With the seats
    running P1, P2 waits too."""

    async def run():
        q = IngressQueue(Clock())
        busy_p3 = ReplicaLoad(running=(0, 0, 0, 2), max_num_seqs=2)
        q.set_view(FleetView(loads={"r0": busy_p3}, reported_at={"r0": 0.0}))
        assert (q.room(P1), q.room(P2), q.room(P3)) == (2, 2, 0)
        await asyncio.wait_for(q.wait_turn(P1, "t"), 0.1)
        await asyncio.wait_for(q.wait_turn(P2, "t"), 0.1)
        assert q.room(P2) == 0  # both preemptible seats are taken by what was just sent
        p3 = asyncio.create_task(q.wait_turn(P3, "t"))
        await asyncio.sleep(0)
        assert not p3.done()
        q.set_view(view((2, 2)))  # seats running P1
        p2 = asyncio.create_task(q.wait_turn(P2, "t"))
        await asyncio.sleep(0)
        assert not p2.done() and q.depth() == 2
        p2.cancel()
        p3.cancel()

    asyncio.run(run())


def test_waiters_leave_in_class_order_and_by_tenant_in_turn():
    async def run():
        clock = Clock()
        q = IngressQueue(clock)
        q.set_view(view((1, 1)))
        order: list[str] = []

        async def one(name: str, p: Priority, tenant: str) -> None:
            await q.wait_turn(p, tenant)
            order.append(name)

        names = [("p3", P3, "a"), ("p2", P2, "a"), ("a1", P1, "a"), ("a2", P1, "a")]
        names += [("a3", P1, "a"), ("b1", P1, "b")]
        tasks = [asyncio.create_task(one(*n)) for n in names]
        await asyncio.sleep(0)
        assert q.depth() == 6
        for _ in names:  # one seat frees at a time: a stream of ours ends
            clock.t += 1
            q.on_stream_end(P1, started=True)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["a1", "b1", "a2", "a3", "p2", "p3"]


def test_a_stream_that_never_started_frees_no_seat():
    async def run():
        q = IngressQueue(Clock())
        q.set_view(view((1, 1)))
        t = asyncio.create_task(q.wait_turn(P1, "t"))
        await asyncio.sleep(0)
        q.on_stream_end(P1, started=False)  # it was waiting on its replica: no seat freed
        await asyncio.sleep(0)
        assert not t.done()
        t.cancel()

    asyncio.run(run())


# -- through the ingress's RemoteEngine ------------------------------------------------------------


class Replica:
    """Records each payload sent; its stream says hello, one token, and holds until released."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.release = asyncio.Event()

    def open(self, payload):
        self.sent.append(payload["request_id"])
        return _Stream(self.release)


class _Stream:
    def __init__(self, release: asyncio.Event) -> None:
        self.release = release

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        yield wire.hello("r0", "least-queued", 0)
        yield wire.delta_chunk(StreamDelta(token_ids=[5]))
        await self.release.wait()
        yield wire.delta_chunk(StreamDelta(token_ids=[6], finished=True, finish_reason="length"))

    def cancel(self) -> None:
        pass


def req(rid: str, p: Priority, tenant: str = "t") -> EngineRequest:
    return EngineRequest(rid, (1, 2, 3, 4), SamplingParams(max_tokens=2), priority=p, tenant=tenant)


def remote(replica: Replica, queue: IngressQueue | None) -> RemoteEngine:
    metrics = SimpleNamespace(on_routed=lambda *a: None, on_replica_failure=lambda *a: None)
    limits = RequestLimits(max_model_len=4096, block_size=16, capacity=(4096,) * 4)
    return RemoteEngine(replica.open, limits, ManualClock(), metrics, lambda e: False, queue=queue)


def test_late_binding_sends_nothing_until_a_seat_frees_and_never_sends_dead_work():
    async def run():
        replica = Replica()
        eng = remote(replica, IngressQueue())
        eng.set_view(view((1, 0)))  # one free seat
        first = eng.submit(req("first", P1))
        await asyncio.sleep(0.01)
        assert replica.sent == ["first"]
        gone = eng.submit(req("gone", P1))
        kept = eng.submit(req("kept", P2))
        urgent = eng.submit(req("urgent", P0))
        await asyncio.sleep(0.01)
        assert replica.sent == ["first", "urgent"]  # P0 never waits; the others hold here
        assert eng.queue_depth(P1) == 1 and eng.queue_depth(P2) == 1  # counted as queued
        eng.abort("gone", "client disconnected")  # its client leaves: out of the queue
        await asyncio.sleep(0.01)
        assert eng.queue.depth() == 1 and gone.done
        await asyncio.sleep(0.15)  # the next reports (after the margin) show what was sent
        eng.set_view(view((1, 1), at=time.monotonic()))  # a replica that died: gone from the view
        eng.set_view(view((1, 1), (2, 2), at=time.monotonic()))  # ...and its replacement, busy
        await asyncio.sleep(0.01)
        assert replica.sent == ["first", "urgent"]
        replica.release.set()  # the running streams end: their seats free
        await asyncio.sleep(0.05)
        assert replica.sent == ["first", "urgent", "kept"]  # never "gone"
        for s in (first, urgent, kept):
            deltas = [d async for d in s.deltas()]
            assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        eng.shutdown()

    asyncio.run(run())


def test_without_the_queue_every_request_is_sent_at_once():
    async def run():
        replica = Replica()
        eng = remote(replica, None)
        eng.set_view(view((1, 1)))
        for i in range(3):
            eng.submit(req(f"r{i}", P1))
        await asyncio.sleep(0.01)
        assert replica.sent == ["r0", "r1", "r2"]
        eng.shutdown()

    asyncio.run(run())


def test_the_queue_is_bounded_by_admission_s_queue_limits():
    """Requests held at the ingress are queued requests: past the class's limit, 503 with
    Retry-After, as the single server answers a full queue."""

    async def run():
        replica = Replica()
        eng = remote(replica, IngressQueue())
        eng.set_view(view((1, 1)))
        limits = (8, 2, 8, 8)
        ac = AdmissionController(AdmissionConfig(max_queued_requests=limits), eng, eng.clock)
        for i in range(2):
            assert ac.decide(P1, "t", 10).admitted
            eng.submit(req(f"q{i}", P1))
        await asyncio.sleep(0.01)
        d = ac.decide(P1, "t", 10)
        assert (d.admitted, d.status, d.error_type) == (False, 503, "resource_exhausted")
        assert d.retry_after_s is not None and d.retry_after_s > 0
        assert replica.sent == [] and eng.queue.depth(P1) == 2
        eng.shutdown()

    asyncio.run(run())


def test_the_held_backlog_reaches_the_autoscaling_policy_through_the_board():
    """What the ingress pushes (``IngressQueue.held_metrics``, as ``Ingress._refresh`` sends
    it), the board's reply to each engine replica's report (``Board.report``, as the board
    deployment runs it), each replica's exported metrics (``with_held``, as
    ``EngineReplica.record_autoscaling_stats`` returns them) and the policy on them the way
    Ray Serve aggregates them: 30 P1 requests held past 0.8 x the SLA ask for 3 more replicas
    (each replica serves 2 P1 requests a second: 30 / (2 x 5 s))."""
    slas = PriorityConfig().ttft_sla_s  # P1: 5 s

    async def run():
        clock = Clock()
        q = IngressQueue(clock)
        q.set_view(view((2, 2), (2, 2)))  # every seat runs P1: no room for P1
        waiters = [asyncio.create_task(q.wait_turn(P1, f"t{i % 3}")) for i in range(30)]
        await asyncio.sleep(0)
        board = Board()

        def window(now: float) -> ClassWindow:
            """A replica that served 20 P1 first tokens in its last 10 s."""
            w = ClassWindow(slas, window_s=10.0)
            for i in range(20):
                w.on_added(f"r{i}", P1, now - 10.0)
                w.on_first_token(f"r{i}", P1, 0.2, now - 10.0 + 0.5 * i)
            return w

        async def decide(age: float) -> tuple[int, str]:
            clock.t += age
            await board.report_held("ingress-1", q.held_metrics(slas))
            per_metric: dict[str, dict[str, float]] = {}
            for rid in ("r0", "r1"):
                reply = await board.report(rid, ReplicaLoad().to_dict(), None)
                for name, v in with_held(window(clock.t).summary(clock.t), reply).items():
                    per_metric.setdefault(name, {})[rid] = v
            ctx = SimpleNamespace(
                aggregated_metrics=per_metric, current_num_replicas=2, policy_state={}
            )
            n, state = ClassAutoscalingPolicy()(ctx)
            assert per_metric["p1_held"] == {"r0": 30.0, "r1": 30.0}
            return n, state["tierserve_last_decision"]

        assert await decide(2.0) == (2, "steady")  # held 2 s: 0.4 x the SLA
        assert await decide(2.5) == (5, "p1-at-risk")  # held 4.5 s: 0.9 x the SLA
        for t in waiters:
            t.cancel()
        await asyncio.sleep(0)
        await board.report_held("ingress-1", q.held_metrics(slas))
        reply = await board.report("r0", ReplicaLoad().to_dict(), None)
        assert reply["p1_held"] == 0.0 and reply["p1_held_wait_ratio"] == 0.0

    asyncio.run(run())


def test_the_board_merges_ingress_replicas_held_backlogs_and_forgets_a_silent_one():
    b = FleetBoard(expire_s=3.0)
    assert b.held(now=0.0)["p1_held"] == 0.0  # every key, with no ingress reporting
    b.report_held("i1", {"p1_held": 4.0, "p1_held_wait_ratio": 0.5}, now=0.0)
    b.report_held("i2", {"p1_held": 2.0, "p1_held_wait_ratio": 0.9}, now=2.0)
    h = b.held(now=2.0)
    assert (h["p1_held"], h["p1_held_wait_ratio"]) == (6.0, 0.9)
    assert b.view(now=2.0)["held"] == h  # operators see it too
    h = b.held(now=4.0)  # i1 silent for 4 s: gone
    assert (h["p1_held"], h["p1_held_wait_ratio"]) == (2.0, 0.9)
