"""Held P2/P3 requests leave the ingress by step budget as well as by seats (issue 24): a
replica whose next step has the budget and the KV blocks for a held P2 or P3 prompt takes it
into its own queue even though every seat is held or kept for the more urgent classes; P0 never
waits and P1 keeps its order. The rule is ``routing/late_binding.py``'s, which the cluster's
``IngressQueue`` and the simulated fleet both use."""

from __future__ import annotations

import asyncio

from tests.test_sim_fleet_ingress import BUSY, SMALL, run_script
from tierserve.cluster.fleet import FleetView, ReplicaLoad
from tierserve.cluster.ingress_queue import IngressQueue
from tierserve.priority import Priority
from tierserve.routing.late_binding import WaitQueue, batch_room, class_room, free_step_tokens
from tierserve.sim.fleet.model import FleetConfig

P0, P1, P2, P3 = Priority


def kept(budget: int = 2048, prefill: int = 0, headroom: int = 1000) -> ReplicaLoad:
    """Both seats run P1 (no room for P1, P2 or P3 by seats); `budget` tokens a step."""
    return ReplicaLoad(
        running=(0, 2, 0, 0),
        max_num_seqs=2,
        max_step_tokens=budget,
        prefill_tokens=(0, prefill, 0, 0),
        headroom=(headroom,) * 4,
        block_size=16,
    )


def test_batch_room_is_the_step_budget_of_replicas_that_could_take_the_prompt_whole():
    loads = [kept(), kept(prefill=1500), kept(headroom=10)]
    assert [class_room(loads, p) for p in (P1, P2, P3)] == [0, 0, 0]  # seats all kept
    assert free_step_tokens(loads[0]) == 2048 - 2  # two decodes
    assert free_step_tokens(loads[1]) == 2048 - 2 - 1500
    # An 800-token prompt: only r0 has the budget and the blocks (50) for it.
    assert batch_room(loads, P2, 800) == 2046
    # A 100-token prompt (7 blocks): all three could batch it.
    assert batch_room(loads, P2, 100) == 2046 + 546 + 2046
    assert batch_room(loads, P2, 3000) == 0


def test_a_held_p2_leaves_by_step_budget_once_no_p1_waits_in_class_order():
    q: WaitQueue[str] = WaitQueue()
    for prio, name in [(P3, "p3"), (P2, "p2-big"), (P2, "p2"), (P1, "p1")]:
        q.push(prio, "t", name)
    cost = {"p1": 100, "p2-big": 1500, "p2": 100, "p3": 100}
    budget = [5000]
    sent: list[str] = []

    def send(_c: Priority, item: str) -> None:
        sent.append(item)
        budget[0] -= cost[item]

    def room(_p: Priority, _n: int) -> int:
        return budget[0]

    # No seat for anyone: P1 waits, and while it does nothing leaves by budget.
    assert q.release(lambda _p: 0, send) == 0
    assert q.release_to_batch(room, cost.get, send) == 0
    assert q.release(lambda p: 1 if p == P1 else 0, send) == 1 and sent == ["p1"]
    # P2's next (the big one) does not fit the budget left: it holds P2 and P3.
    budget[0] = 1000
    assert q.release_to_batch(room, cost.get, send) == 0
    budget[0] = 1800
    assert q.release_to_batch(room, cost.get, send) == 3
    assert sent == ["p1", "p2-big", "p2", "p3"] and q.depth() == 0


def test_the_cluster_ingress_sends_a_held_p2_to_a_replica_with_step_budget():
    async def run():
        q = IngressQueue(lambda: 10.0)
        q.set_view(FleetView(loads={"r0": kept(budget=1000)}, reported_at={"r0": 10.0}))
        assert q.room(P2) == 0  # every seat held by P1
        await asyncio.wait_for(q.wait_turn(P2, "t", 600), 0.1)  # the step has 998 tokens free
        p2 = asyncio.create_task(q.wait_turn(P2, "t", 600))  # 398 left until the next report
        p0 = asyncio.create_task(q.wait_turn(P0, "t", 5000))
        await asyncio.sleep(0)
        assert p0.done() and not p2.done() and q.depth(P2) == 1
        q.set_view(FleetView(loads={"r0": kept(budget=1000)}, reported_at={"r0": 11.0}))
        await asyncio.sleep(0)
        assert p2.done()  # a new report: budget again
        # A P1 request waits for a seat: then a P2 waits too, budget or not.
        p1 = asyncio.create_task(q.wait_turn(P1, "t", 100))
        later = asyncio.create_task(q.wait_turn(P2, "t", 10))
        q.set_view(FleetView(loads={"r0": kept(budget=1000)}, reported_at={"r0": 12.0}))
        await asyncio.sleep(0)
        assert not p1.done() and not later.done() and q.depth() == 2
        free = ReplicaLoad(**{**vars(kept(budget=1000)), "running": (0, 1, 0, 0)})
        q.set_view(FleetView(loads={"r0": free}, reported_at={"r0": 13.0}))  # a seat frees
        await asyncio.sleep(0)
        assert p1.done() and later.done()  # P1 to the seat, then the P2 by budget
        # A replica reporting no step fields (an older one) never takes held work by budget.
        q2 = IngressQueue(lambda: 0.0)
        old = ReplicaLoad(running=(0, 2, 0, 0), max_num_seqs=2)
        q2.set_view(FleetView(loads={"r0": old}, reported_at={"r0": 0.0}))
        assert q2.batch_room(P2, 1) <= 0

    asyncio.run(run())


def test_the_simulated_fleet_sends_held_p2_p3_to_a_replica_queue_and_p1_still_goes_first():
    # Two P1 streams hold both seats; a P2, a P3 and a P1 arrive with no seat for any of them.
    _, result = run_script(FleetConfig(SMALL, 1, ingress_queue=True), BUSY)
    recs = {r.request_id: r for r in result.records}
    order = [r.request_id for r in result.records]
    # P2 and P3 went to the replica's queue while the seats were still held (before the
    # short P1 stream ended); the P1 waited at the ingress for that seat.
    assert order == ["s1", "s2", "s3", "s4", "s5"]
    short = recs["s1"]
    assert recs["s5"].first_token > short.finish
    # P1 first, then P2, then P3 (the replica's policy), all once the seat freed.
    assert short.finish < recs["s5"].first_token < recs["s3"].first_token < recs["s4"].first_token
    assert all(r.outcome == "completed" for r in result.records)
