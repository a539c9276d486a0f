"""The TTFT predictor's view of a fleet: one ``Load`` per engine replica.

A cluster ingress admits for every replica behind it. Each replica publishes its own predictor
inputs (engine/load.py: its queues, its measured prefill rate and step time, its step-time
model), built by the same code as the single server's; the ingress adds the work it sent that
a replica's last report does not show yet. ``FleetLoad.best`` is the replica on which a request
would get its first token soonest -- judged exactly as ``SlaGate.check`` judges it (P0 on its
own class's work, the others on everything served before them) -- and SLA admission then
decides on that replica's load alone, with the single engine's predictor, limits and
Retry-After. So a request is refused only when no replica could serve it in time.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.admission.ttft import Load, predict_ttft
from tierserve.priority import Priority


def fleet_queue_depth(
    waiting: tuple[int, ...], running: tuple[int, ...], seats: int, priority: Priority
) -> int:
    """Admission's queue depth of class `priority` over a fleet: the requests of that class
    waiting anywhere (on a replica, or at the ingress: `waiting`) less the seats that would
    still be free for them once every other class's waiters had one (`seats` in all,
    `running` held). A cluster ingress (cluster/remote_engine.py) and the simulated fleet's
    (sim/fleet_ingress.py) both count with it."""
    own = waiting[priority]
    free = max(0, seats - sum(running) - (sum(waiting) - own))
    return max(0, own - free)


def judged_load(load: Load, priority: Priority) -> Load:
    """The work SLA admission judges a class-`priority` request on: for P0 its own class only
    (what shedding every lower class would leave), for the others everything."""
    return load.only_classes_upto(priority if priority == Priority.P0 else Priority.P3)


@dataclass(frozen=True)
class FleetLoad:
    """One ``Load`` per replica (replica id, load), in a fixed order (ties go to the first)."""

    replicas: tuple[tuple[str, Load], ...] = ()

    def best(self, priority: Priority, prompt_tokens: int, tenant: str | None = None) -> Load:
        """The load of the replica where a class-`priority` request of `tenant` with
        `prompt_tokens` to prefill is predicted to get its first token soonest. A replica
        without a measured rate yet (just started: nothing to predict from) counts as the
        soonest, as a single engine without one admits. An empty fleet: an unknown engine."""
        return self.best_replica(priority, prompt_tokens, tenant)[1]

    def best_replica(
        self, priority: Priority, prompt_tokens: int, tenant: str | None = None
    ) -> tuple[str | None, Load]:
        best: tuple[float, str | None, Load] | None = None
        for rid, load in self.replicas:
            t = predict_ttft(judged_load(load, priority), priority, prompt_tokens, tenant=tenant)
            t = 0.0 if t is None else t
            if best is None or t < best[0]:
                best = (t, rid, load)
        return (None, Load()) if best is None else (best[1], best[2])
