"""The simulated fleet's ingress: the cluster ingress's admission and late binding, with the
same code on a virtual clock.

* **Admission** is the real ``AdmissionController`` (token buckets, queue limits and, with
  ``sla_admission``, ``SlaGate`` on a ``FleetLoad``: the request is judged on the replica where
  it would start soonest) over ``FleetQueueView``, this fleet's version of the cluster's
  ``RemoteEngine`` queue view: queue depth by ``fleet_queue_depth``, each routable replica's
  ``Load`` by ``measure_load`` (the code the single server and the replicas publish with),
  requests held at the ingress counted as waiting on every replica (a cluster ingress counts
  its unacknowledged requests so). Unlike the cluster's, the view is exact: no report lag.
* **Late binding** is ``routing/late_binding.py``'s ``WaitQueue``, ``class_room`` (by seats)
  and ``batch_room`` (held P2/P3 by step budget), as the cluster's ``IngressQueue`` uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tierserve.admission.controller import Decision
from tierserve.admission.fleet_load import FleetLoad, fleet_queue_depth
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request
from tierserve.routing.late_binding import WaitQueue

if TYPE_CHECKING:
    from tierserve.sim.fleet.drive import Replica


@dataclass(eq=False)
class Held:
    """A request waiting at the ingress (admitted; bound to no replica yet)."""

    req: Request
    attempt: int
    decision: Decision | None


class Fleet(Protocol):
    replicas: list[Replica]  # every replica ever started (their served counts stay)
    held: WaitQueue[Held]

    def routable(self) -> list[Replica]: ...


class FleetQueueView:
    """Admission's ``QueueView`` of a simulated fleet (see the module docstring)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.held_tokens = [0] * NUM_PRIORITIES

    def hold(self, h: Held) -> None:
        self.fleet.held.push(h.req.priority, h.req.tenant, h)
        self.held_tokens[h.req.priority] += h.req.num_prompt_tokens

    def released(self, h: Held) -> None:
        self.held_tokens[h.req.priority] -= h.req.num_prompt_tokens

    def queue_depth(self, priority: Priority) -> int:
        reps, held = self.fleet.routable(), self.fleet.held
        waiting = tuple(
            sum(r.engine.scheduler.queue_depth(Priority(c)) for r in reps) + held.depth(Priority(c))
            for c in range(NUM_PRIORITIES)
        )
        stats = [r.stats() for r in reps]
        running = tuple(sum(s.running[c] for s in stats) for c in range(NUM_PRIORITIES))
        return fleet_queue_depth(waiting, running, sum(s.max_seats for s in stats), priority)

    def queued_tokens(self, priority: Priority) -> int:
        reps = self.fleet.routable()
        return (
            sum(r.engine.scheduler.queued_tokens(priority) for r in reps)
            + self.held_tokens[priority]
        )

    def can_shed(self, below: Priority) -> bool:
        return False  # as a cluster ingress: shedding is a per-engine command

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        got = [r.engine.scheduler.dequeued(priority) for r in self.fleet.replicas]
        return sum(n for n, _ in got), sum(t for _, t in got)

    def load(self) -> FleetLoad:
        held = [h for c in range(NUM_PRIORITIES) for h in self.fleet.held.items(Priority(c))]
        loads = []
        for r in self.fleet.routable():
            load = r.load()
            for h in held:
                load = load.with_waiting(h.req.priority, h.req.num_prompt_tokens, h.req.tenant)
            loads.append((r.replica_id, load))
        return FleetLoad(tuple(loads))
