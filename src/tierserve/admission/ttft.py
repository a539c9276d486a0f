"""The TTFT predictor: when would a request's first token come, given the work ahead of it?

A request's first token comes when every prefill token served before its own, and its own
prompt, have been computed, plus the step that samples it. In the policy's order (``Load.order``,
declared by the policy, see policies/order.py) the work ahead of a request of class ``c`` is:

* the waiting tokens of the classes served before ``c`` (``before[c]``), and, while it waits,
  the tokens those classes keep receiving (their measured arrival rate ``λ``): they too go first;
* the tokens of its own class queued ahead of it (a new request: the whole queue), plus its own;
  with tenant-fair classes, its tenant's queue ahead of it plus its own (``T``), and every other
  tenant's backlog up to ``T`` (tenants share the class equally);
* for a class that shares capacity by weight with another (wfq, drr), the other class's share
  of the service during that time (GPS): ``min(W_k, own x w_k / w_c)``;
* the prompt tokens running requests still have to prefill (a running chunk goes before the
  waiting queue, except where it leaves budget for ``c``: ``yields_to``).

    TTFT = work / (R - λ) + one step

``R`` is the prefill rate measured online while a backlog exists (admission/load_meter.py; in
the simulator the same meter runs on the virtual clock, so ``R`` is the cost model's rate). With
``λ >= R`` the more urgent classes alone fill the engine: the TTFT is unbounded.

The same function serves admission (a new request, at the end of its class) and the re-check of
waiting requests (``ahead`` = the tokens of its class queued before it), in the server and in the
simulator alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tierserve.policies.order import FLAT_ORDER, ServiceOrder
from tierserve.priority import NUM_PRIORITIES, Priority

_ZERO = (0,) * NUM_PRIORITIES
# The reason (metrics label, error code, message prefix) of a refusal or an early end because
# the class's TTFT SLA cannot be met.
SLA_UNREACHABLE = "sla_unreachable"
SLA_DEMOTED = "sla_demoted"


@dataclass(frozen=True)
class TenantBacklog:
    """One tenant's waiting tokens in one class: its own (submitted in that class) and all
    (with the requests aging promoted into the class, which wait behind its own)."""

    tenant: str
    own: int
    total: int


@dataclass(frozen=True)
class Load:
    """What the predictor knows about the engine: plain numbers, one entry per class. Built by
    ``engine.load.measure_load`` on the thread that owns the scheduler, published in the engine
    snapshot for the server's event loop."""

    # Tokens still to compute of the requests waiting in each class now (aging may have
    # promoted some into it: ``promoted_tokens``, served after the class's own).
    waiting_tokens: tuple[int, ...] = _ZERO
    promoted_tokens: tuple[int, ...] = _ZERO
    # Per class, every tenant with waiting requests (tenant-fair policies only).
    tenants: tuple[tuple[TenantBacklog, ...], ...] = ((),) * NUM_PRIORITIES
    running_prefill: tuple[int, ...] = _ZERO  # prompt tokens running requests still prefill
    arrival_rate: tuple[float, ...] = (0.0,) * NUM_PRIORITIES  # tokens/s entering each queue
    prefill_rate: float | None = None  # tokens/s while a backlog exists; None: unknown
    step_s: float = 0.0  # one engine step
    order: ServiceOrder = FLAT_ORDER

    def with_waiting(self, priority: Priority, extra: int, tenant: str | None = None) -> Load:
        """The load with `extra` more tokens of `tenant` waiting in class `priority`."""
        c = int(priority)
        w = list(self.waiting_tokens)
        w[c] += extra
        tenants = self.tenants
        if tenant is not None and self.order.tenant_fair:
            mine = {b.tenant: b for b in tenants[c]}
            b = mine.get(tenant, TenantBacklog(tenant, 0, 0))
            mine[tenant] = TenantBacklog(tenant, b.own + extra, b.total + extra)
            tenants = (*tenants[:c], tuple(mine.values()), *tenants[c + 1 :])
        return replace(self, waiting_tokens=tuple(w), tenants=tenants)

    def only_classes_upto(self, priority: Priority) -> Load:
        """The load with every less urgent class's work gone (as if shed)."""
        keep = int(priority) + 1
        return replace(
            self,
            waiting_tokens=self.waiting_tokens[:keep] + _ZERO[keep:],
            promoted_tokens=self.promoted_tokens[:keep] + _ZERO[keep:],
            tenants=self.tenants[:keep] + ((),) * (NUM_PRIORITIES - keep),
            running_prefill=self.running_prefill[:keep] + _ZERO[keep:],
        )


def class_work(
    load: Load, c: int, own: int, ahead: int | None, tenant: str | None, horizon: float | None
) -> float:
    """Tokens of class `c` served before `own` tokens of a request of `tenant` are done, with
    `ahead` tokens queued before it (None: a new request, behind all of its class's own).

    Tenant-fair: its tenant's tokens ahead plus its own (``mine``), and each other backlogged
    tenant's share while it waits: ``min(mine, backlog + arrivals)``, the class's arrivals over
    `horizon` seconds split among the backlogged tenants (None: every backlogged tenant keeps
    its full share, the GPS bound)."""
    if not load.order.tenant_fair or tenant is None:
        queue = load.waiting_tokens[c] - load.promoted_tokens[c] if ahead is None else ahead
        return queue + own
    backlog = load.tenants[c]
    me = next((b for b in backlog if b.tenant == tenant), None)
    mine = ((me.own if me else 0) if ahead is None else ahead) + own
    others = [b.total for b in backlog if b.tenant != tenant and b.total > 0]
    if horizon is None:
        return mine * (1 + len(others))
    more = load.arrival_rate[c] * horizon / max(1, len(others))
    return mine + sum(min(mine, w + more) for w in others)


def predict_ttft(
    load: Load, priority: Priority, own: int, ahead: int | None = None, tenant: str | None = None
) -> float | None:
    """Seconds until the first token of a class-`priority` request of `tenant` whose prompt
    still needs `own` tokens, with `ahead` tokens queued before it (see ``class_work``). None
    while no prefill rate is known; inf when the classes before it alone fill the engine."""
    rate = load.prefill_rate
    if rate is None or rate <= 0:
        return None
    c, order, waiting = int(priority), load.order, load.waiting_tokens
    if not order.class_aware:  # one queue in arrival order
        queue = sum(waiting) if ahead is None else ahead
        return (queue + own + sum(load.running_prefill)) / rate + load.step_s
    capacity = rate - sum(load.arrival_rate[k] for k in order.before[c])
    if capacity <= 0:
        return math.inf
    fixed = sum(waiting[k] for k in order.before[c])
    fixed += sum(n for k, n in enumerate(load.running_prefill) if c not in order.yields_to[k])
    sharers = [k for k in range(NUM_PRIORITIES) if order.shares_with(c, k)]
    ratio = sum(order.weights[k] for k in sharers) / order.weights[c] if sharers else 0.0
    # First the bound where every backlogged tenant and sharing class keeps its full share for
    # the whole wait; then each share is cut to what it has plus what arrives in that time.
    upper = (fixed + class_work(load, c, own, ahead, tenant, None) * (1 + ratio)) / capacity
    mine = class_work(load, c, own, ahead, tenant, upper)
    shared = sum(
        min(waiting[k] + load.arrival_rate[k] * upper, mine * order.weights[k] / order.weights[c])
        for k in sharers
    )
    return (fixed + mine + shared) / capacity + load.step_s
