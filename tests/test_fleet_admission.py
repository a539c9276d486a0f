"""Fleet-wide SLA admission at a cluster ingress (issue 24.2), without Ray: real engines (the
fluid executor of test_sla_admission.py: it serves work at exactly the rate the predictor is
told) publish real snapshots; their reports go through the fleet board as the replicas send
them; the ingress's ``RemoteEngine`` reads the board's view, and the same
``AdmissionController`` the single server runs decides on it.

* A fleet of one replica decides exactly as the single server does on the same engine.
* A request is judged on the replica where it would start soonest: admitted while any replica
  can serve it in time, refused (503, ``sla_unreachable``, Retry-After) when none can; P0 only
  on its own class's work.
* Work the ingress sent after a replica's last report counts on that replica (acknowledged) or
  on every replica (not yet): a burst between two reports is not admitted blind.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from types import SimpleNamespace

from tests.test_sla_admission import fluid_engine, request
from tierserve.admission import AdmissionController
from tierserve.clock import ManualClock
from tierserve.cluster import wire
from tierserve.cluster.fleet import FleetBoard, FleetView, ReplicaLoad
from tierserve.cluster.remote_engine import RemoteEngine
from tierserve.config import AdmissionConfig
from tierserve.engine.load import CoreQueueView
from tierserve.engine.snapshot import take_snapshot
from tierserve.priority import Priority
from tierserve.request import EngineRequest

P0, P1, P2, P3 = Priority
RATE = 2000.0  # prompt tokens per second, each engine
CFG = AdmissionConfig(sla_admission=True, sla_margin=0.8)


def engine(clock: ManualClock, backlog: list[tuple[Priority, int]]):
    """A fluid engine with `backlog` waiting ((class, prompt tokens) each), stepped once so
    that its prefill rate is measured."""
    core = fluid_engine(RATE, 256, clock)
    for i, (prio, n) in enumerate(backlog):
        core.add_request(request(f"b{id(core)}-{i}", prio, n, "t", clock.now()))
    core.step()
    return core


def report(core, published: bool = True) -> dict:
    """What a replica pushes to the board (engine_replica.py: ``ReplicaLoad.of``)."""
    return ReplicaLoad.of(
        take_snapshot(core, 1, with_load=published), with_ttft=published
    ).to_dict()


def ingress(cores: dict, clock: ManualClock, published: bool = True, open_stream=None):
    """The ingress's RemoteEngine over `cores` ({replica id: engine}), its view pulled from a
    fleet board the cores reported to, and its admission controller."""
    remote = RemoteEngine(
        open_stream or (lambda payload: None),
        next(iter(cores.values())).scheduler.limits,
        clock,
        SimpleNamespace(on_routed=lambda *a: None, on_replica_failure=lambda *a: None),
        lambda exc: False,
    )
    refresh(remote, cores, published)
    return remote, AdmissionController(CFG, remote, clock)


def refresh(remote: RemoteEngine, cores: dict, published: bool = True, at: float = 0.0) -> None:
    """The replicas report and the ingress pulls the board's view (as the ingress polls); the
    reports were made at `at` on the ingress's monotonic clock."""
    board = FleetBoard()
    for rid, core in cores.items():
        board.report(rid, report(core, published), None, now=0.0)
    remote.set_view(FleetView.from_dict(board.view(now=0.0), now=at))


def test_a_fleet_of_one_decides_exactly_as_the_single_server():
    clock = ManualClock()
    core = engine(clock, [(P1, 900)] * 8 + [(P2, 600)] * 4 + [(P0, 300)])
    single = AdmissionController(CFG, CoreQueueView(core), clock)
    remote, fleet = ingress({"r1": core}, clock)
    seen = set()
    for prio, n in [(P1, 400), (P1, 400), (P2, 900), (P0, 200), (P1, 50), (P3, 100)] * 2:
        refresh(remote, {"r1": core})
        a, b = single.decide(prio, "t", n + 16, n), fleet.decide(prio, "t", n + 16, n)
        # (The ingress's queue depth leaves out requests a free seat would take at once.)
        assert replace(a, queue_depth=0) == replace(b, queue_depth=0)
        seen.add(a.admitted)
        clock.advance(0.1)
    assert seen == {True, False}  # both outcomes were compared
    assert single.rejections == fleet.rejections


def test_a_request_is_judged_on_the_replica_where_it_starts_soonest():
    clock = ManualClock()
    hot = [(P1, 900)] * 12  # 10800 tokens: 5.4 s of P1 work, past 0.8 x 5 s
    cores = {"a-hot": engine(clock, hot), "b-idle": engine(clock, [(P3, 64)])}
    _remote, ac = ingress(cores, clock)
    d = ac.decide(P1, "t", 216, 200)
    assert d.admitted and d.predicted_ttft_s is not None and d.predicted_ttft_s < 0.5

    cores = {"a-hot": engine(clock, hot), "b-hot": engine(clock, hot)}
    _remote, ac = ingress(cores, clock)
    d = ac.decide(P1, "t", 216, 200)
    assert (d.admitted, d.status, d.error_type, d.code) == (
        False,
        503,
        "resource_exhausted",
        "sla_unreachable",
    )
    assert d.retry_after_s is not None and d.retry_after_s > 0
    assert "online (P1) TTFT SLA of 5 s cannot be met" in d.reason
    assert ac.decide(P0, "t", 216, 200).admitted  # judged on P0's own work: none
    assert ac.decide(P3, "t", 216, 200).admitted  # no SLA
    assert ac.rejections == {("sla_unreachable", P1): 1}


def test_replicas_that_publish_no_predictor_inputs_admit_as_an_unknown_engine_does():
    clock = ManualClock()
    hot = [(P1, 900)] * 12
    _remote, ac = ingress({"a": engine(clock, hot)}, clock, published=False)
    assert ac.decide(P1, "t", 216, 200).admitted


class Held:
    """A replica's stream that says hello when `ack` is set, then streams nothing."""

    def __init__(self, replica: str, ack: asyncio.Event) -> None:
        self.replica, self.ack = replica, ack

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        await self.ack.wait()
        yield wire.hello(self.replica, "least-queued", 0)
        await asyncio.Event().wait()

    def cancel(self) -> None:
        pass


def test_work_sent_since_the_last_report_counts_on_its_replica():
    """One idle replica, reported before the burst: each admitted request submitted adds its
    prompt to the predicted wait -- not yet acknowledged, then acknowledged after the report --
    until the next P1 would be late. Without that count the stale report admits them all."""
    clock = ManualClock()
    core = engine(clock, [(P3, 64)])
    ack = asyncio.Event()

    async def run() -> tuple[int, int]:
        remote, ac = ingress({"r": core}, clock, open_stream=lambda p: Held("r", ack))
        admitted = 0
        for i in range(40):
            d = ac.decide(P1, "t", 1016, 1000)
            if not d.admitted:
                break
            admitted += 1
            req = request(f"burst-{i}", P1, 1000, "t", clock.now())
            remote.submit(
                EngineRequest(
                    req.request_id,
                    tuple(req.prompt_token_ids),
                    req.sampling_params,
                    priority=P1,
                    tenant="t",
                )
            )
            if i == 2:  # the first ones are acknowledged by their replica (after its report)
                ack.set()
                await asyncio.sleep(0.01)
                assert all(s.acked for s in remote._open.values())
        unacked_then_acked = admitted
        ahead = remote.load().replicas[0][1].waiting_tokens[P1]
        assert ahead == admitted * 1000
        await asyncio.sleep(0.01)  # every one acknowledged now...
        assert all(s.acked for s in remote._open.values())
        refresh(remote, {"r": core}, at=time.monotonic() + 1.0)  # ...and a report after that
        assert remote.load().replicas[0][1].waiting_tokens[P1] == 0  # not counted twice
        remote.shutdown()
        return unacked_then_acked, d.status

    admitted, status = asyncio.run(run())
    # 0.8 x 5 s at 2000 tokens/s: about 8000 tokens ahead, so about 8 prompts of 1000 get in.
    assert 6 <= admitted <= 9 and status == 503
    _remote, blind = ingress({"r": core}, clock)
    assert all(blind.decide(P1, "t", 1016, 1000).admitted for _ in range(12))
