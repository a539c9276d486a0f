"""SLA-feasibility admission: admit a request only if its first token is predicted in time.

``SlaGate.check`` compares the predicted TTFT (admission/ttft.py) with ``margin x SLA``:

* P0 is judged on the work of its own class only (the running P0 prefills, the P0 queue): that
  is what would still be ahead of it after shedding every lower class. So a P0 request is
  refused only when realtime traffic alone already exceeds its SLA, never because lower classes
  wait; and against its SLA itself (a margin below 1 does not apply to P0).
* P1 and P2 are judged on everything the policy serves before them; the caller refuses them
  (503) or, for a tenant that opted in, demotes them to best effort.
* P3 has no SLA: always feasible (queue limits still apply).
* A request whose own prompt alone would take longer than the limit on an idle engine is judged
  against that time instead: refusing it would refuse it on every retry.

**Retry-After from the predicted drain.** A refused request is told when a request of its class
would be predicted in time if nothing new arrived: ``predicted - limit`` (the work ahead drains at
``R - λ``, so the prediction falls one second per second). The requests refused before it, which
will come back first, are counted ahead of it: each refusal *promises* its prompt tokens to its
class until its Retry-After has passed, so a burst of refusals is told to come back spread over
the drain, not all at once (no retry storm of synchronised clients).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

from tierserve.admission.fleet_load import FleetLoad, judged_load
from tierserve.admission.ttft import Load, predict_ttft
from tierserve.config import PolicyConfig, PriorityConfig
from tierserve.priority import NUM_PRIORITIES, Priority

MAX_RETRY_AFTER_S = 60.0


def policy_for_sla_admission(policy: PolicyConfig) -> PolicyConfig:
    """The policy settings SLA admission runs with: hybrid's SLA urgency only for heads that are
    already late (fraction 1.0), so P1 and P2 share by their SFQ weights. With the default
    fraction (1/5) a P1 head older than 1 s goes before every P2 request, and a P2 request's
    wait then depends on how much P1 traffic is still to come, which no queue state predicts;
    with admission keeping P1 within its SLA, the urgency is not needed to protect it (measured
    in the simulator: docs/scheduling.md)."""
    return replace(policy, sla_urgency_fraction=1.0)


def retry_after_seconds(seconds: float | None) -> int:
    """What a `Retry-After` header says for `seconds` (whole seconds, at least 1): also what a
    simulated client waits, so that it obeys exactly what a real one would be told."""
    return max(1, math.ceil(seconds or 1.0))


@dataclass(frozen=True)
class Verdict:
    predicted_s: float | None  # None: no prefill rate known yet (admitted)
    limit_s: float | None  # margin x SLA; None: the class has no SLA
    retry_after_s: float | None = None  # set when the request is late

    @property
    def late(self) -> bool:
        return self.retry_after_s is not None


def _plus(predicted: float | None, waited: float) -> float | None:
    return None if predicted is None else predicted + waited


class SlaGate:
    def __init__(self, priorities: PriorityConfig, margin: float) -> None:
        self.priorities = priorities
        self.margin = margin
        # Per class: a heap of (when the refused client is due back, its tokens, its tenant),
        # and the tokens not yet due back by tenant.
        self._promised: list[list[tuple[float, int, str]]] = [[] for _ in range(NUM_PRIORITIES)]
        self._by_tenant: list[dict[str, int]] = [{} for _ in range(NUM_PRIORITIES)]

    def check(
        self,
        load: Load | FleetLoad,
        priority: Priority,
        prompt_tokens: int,
        now: float,
        tenant: str,
        waited_s: float = 0.0,
    ) -> Verdict:
        """Whether a class-`priority` request of `tenant` with `prompt_tokens` to prefill would
        get its first token within margin x SLA; if not, when to retry (and the retry is
        promised). A fleet (a cluster ingress) is judged on its best replica
        (admission/fleet_load.py). `waited_s`: the time it already spent at the server (at
        the door): its first token comes that much later after its arrival."""
        if isinstance(load, FleetLoad):
            load = load.best(priority, prompt_tokens, tenant)
        # What the client will see, and what the decision is judged on: for P0 only the work
        # that shedding every lower class would leave (the same under a class-aware policy).
        waited = max(0.0, waited_s)
        predicted = _plus(predict_ttft(load, priority, prompt_tokens, tenant=tenant), waited)
        upto = priority if priority == Priority.P0 else Priority.P3
        load = judged_load(load, priority)
        judged = _plus(predict_ttft(load, priority, prompt_tokens, tenant=tenant), waited)
        limit = self.limit(priority, prompt_tokens, load)
        if limit is None or judged is None or judged <= limit:
            return Verdict(predicted, limit)
        for c in range(int(upto) + 1):
            for who, tokens in self.promised(Priority(c), now).items():
                load = load.with_waiting(Priority(c), tokens, who)
        drained = _plus(predict_ttft(load, priority, prompt_tokens, tenant=tenant), waited)
        retry = MAX_RETRY_AFTER_S if drained is None else min(MAX_RETRY_AFTER_S, drained - limit)
        retry = max(0.0, retry)
        due = now + retry_after_seconds(retry)
        heapq.heappush(self._promised[priority], (due, prompt_tokens, tenant))
        mine = self._by_tenant[priority]
        mine[tenant] = mine.get(tenant, 0) + prompt_tokens
        return Verdict(predicted, limit, retry)

    def limit(self, priority: Priority, prompt_tokens: int, load: Load) -> float | None:
        """The latest predicted TTFT admitted: margin x SLA (for P0 never below its SLA: P0 is
        refused only when it cannot be served in time), and never below what the request's own
        prompt takes on an idle engine (refusing that would refuse it on every retry: it is
        admitted and served as soon as it can be). None: the class has no SLA."""
        sla = self.priorities.sla(priority)
        if sla is None:
            return None
        factor = max(1.0, self.margin) if priority == Priority.P0 else self.margin
        alone = predict_ttft(load.idle(), priority, prompt_tokens) or 0.0
        return max(factor * sla, alone)

    def promised(self, priority: Priority, now: float) -> dict[str, int]:
        """Prompt tokens of refused class-`priority` requests not yet due back, by tenant."""
        heap, mine = self._promised[priority], self._by_tenant[priority]
        while heap and heap[0][0] <= now:
            _, tokens, who = heapq.heappop(heap)
            mine[who] -= tokens
            if mine[who] <= 0:
                del mine[who]
        return mine
