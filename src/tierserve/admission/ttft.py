"""The TTFT predictor: when would a request's first token come, given the work ahead of it?

A request's first token comes when every prefill token served before its own, and its own
prompt, have been computed, plus the step that samples it. In the policy's order (``Load.order``,
declared by the policy, see policies/order.py) the work ahead of a request of class ``c`` is:

* the waiting tokens of the classes served before ``c`` (``before[c]``), and, while it waits,
  the tokens those classes keep receiving (their measured arrival rate ``λ``): they too go first;
* the tokens of its own class queued ahead of it (a new request: the whole queue), plus its own;
  with tenant-fair classes, its tenant's queue ahead of it plus its own, and what every other
  backlogged tenant is served until its virtual counter catches up with this tenant's then;
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

from tierserve.admission.engine_rate import EngineShape
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
    rate: float = 0.0  # tokens per second it sends into the class
    counter: float = 0.0  # its virtual token counter: a lower one is served first


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
    # Classes sharing by weight (SFQ): each class's start tag for its next service (None: the
    # policy keeps none; the predictor assumes GPS shares).
    class_tags: tuple[float, ...] | None = None
    # The engine's step-time model and decodes (None: the measured rate alone is used).
    engine: EngineShape | None = None
    # Of a prompt's tokens, the share the engine computes (the rest is found in the prefix
    # cache; admission/load_meter.py): queues count prompt tokens, rates computed ones.
    computed_share: float = 1.0

    def with_waiting(self, priority: Priority, extra: int, tenant: str | None = None) -> Load:
        """The load with `extra` more tokens of `tenant` waiting in class `priority`."""
        c = int(priority)
        w = list(self.waiting_tokens)
        w[c] += extra
        tenants = self.tenants
        if tenant is not None and self.order.tenant_fair:
            mine = {b.tenant: b for b in tenants[c]}
            b = mine.get(tenant, TenantBacklog(tenant, 0, 0))
            mine[tenant] = replace(b, own=b.own + extra, total=b.total + extra)
            tenants = (*tenants[:c], tuple(mine.values()), *tenants[c + 1 :])
        engine = self.engine.with_waiting(c, 1, extra) if self.engine else None
        return replace(self, waiting_tokens=tuple(w), tenants=tenants, engine=engine)

    def only_classes_upto(self, priority: Priority) -> Load:
        """The load with every less urgent class's work gone (as if shed)."""
        keep = int(priority) + 1
        return replace(
            self,
            waiting_tokens=self.waiting_tokens[:keep] + _ZERO[keep:],
            promoted_tokens=self.promoted_tokens[:keep] + _ZERO[keep:],
            tenants=self.tenants[:keep] + ((),) * (NUM_PRIORITIES - keep),
            running_prefill=self.running_prefill[:keep] + _ZERO[keep:],
            engine=self.engine.only_classes_upto(keep) if self.engine else None,
        )

    def idle(self) -> Load:
        """An engine with nothing waiting or running, at the same speed."""
        engine = self.engine.idle() if self.engine else None
        return Load(
            prefill_rate=self.prefill_rate,
            step_s=self.step_s,
            engine=engine,
            computed_share=self.computed_share,
        )


def class_work(
    load: Load, c: int, own: int, ahead: int | None, tenant: str | None, horizon: float | None
) -> float:
    """Tokens of class `c` served before `own` tokens of a request of `tenant` are done, with
    `ahead` tokens queued before it (None: a new request, behind all of its class's own).

    Tenant-fair (virtual token counters: the backlogged tenant with the lowest is served next;
    one that starts waiting is lifted to the lowest backlogged counter): the request is done
    when its tenant's counter has grown by its tokens ahead and its own, to ``done``; until
    then every other backlogged tenant is served up to ``done - its counter``, bounded by its
    backlog plus its arrivals over `horizon` seconds (None: not bounded, the GPS worst case).
    Counters count a request's cost (prompt + expected output): as tokens, this over-counts
    the others a little."""
    if not load.order.tenant_fair or tenant is None:
        queue = load.waiting_tokens[c] - load.promoted_tokens[c] if ahead is None else ahead
        return queue + own
    tenants = load.tenants[c]
    backlogged = [b for b in tenants if b.total > 0]
    me = next((b for b in tenants if b.tenant == tenant), None)
    mine = (me.own if me else 0) if ahead is None else ahead
    counter = me.counter if me else 0.0
    if ahead is None and (me is None or me.total == 0) and backlogged:  # it starts waiting
        counter = max(counter, min(b.counter for b in backlogged))
    done = counter + mine + own
    work = float(mine + own)
    for b in backlogged:
        if b.tenant != tenant:
            credit = max(0.0, done - b.counter)
            work += credit if horizon is None else min(credit, b.total + b.rate * horizon)
    return work


def predict_ttft(
    load: Load, priority: Priority, own: int, ahead: int | None = None, tenant: str | None = None
) -> float | None:
    """Seconds until the first token of a class-`priority` request of `tenant` whose prompt
    still needs `own` tokens, with `ahead` tokens queued before it (see ``class_work``). None
    while no prefill rate is known; inf when the classes before it alone fill the engine (they
    have work waiting and keep arriving faster than the engine serves them)."""
    c, order, waiting = int(priority), load.order, load.waiting_tokens
    rate = service_rate(load, c, ahead)
    if rate is None or rate <= 0:
        return None
    if not order.class_aware:  # one queue in arrival order
        queue = sum(waiting) if ahead is None else ahead
        return (queue + own + sum(load.running_prefill)) / rate + load.step_s
    lam = sum(load.arrival_rate[k] for k in order.before[c])
    busy = any(waiting[k] or load.running_prefill[k] for k in order.before[c])
    if not busy:  # served as they come, they do not fill the engine (a rate measured in a
        lam = min(lam, rate / 2)  # burst that has ended): never an infinite wait for nothing
    capacity = rate - lam
    if capacity <= 0:
        return math.inf
    fixed = sum(waiting[k] for k in order.before[c])
    fixed += sum(n for k, n in enumerate(load.running_prefill) if c not in order.yields_to[k])
    # First the bound where every backlogged tenant and sharing class is served its full share
    # for the whole wait; then each share is cut to what it has plus what arrives in that time.
    upper = fixed + class_work(load, c, own, ahead, tenant, None)
    upper = (upper + shares(load, c, upper - fixed, None)) / capacity
    mine = class_work(load, c, own, ahead, tenant, upper)
    # The step in flight ends first. A class served first gets the next step (express steps,
    # budget left by every running chunk): it waits half a step on average; the others wait
    # behind the step that samples their token, a whole one.
    first = served_first(load.order, c)
    step = load.step_s / 2 if first else load.step_s
    if first and load.engine is not None:  # its prompts go first, step by step
        reqs = requests_ahead(load, c, ahead)
        tokens = fixed + (waiting[c] - load.promoted_tokens[c] if ahead is None else ahead)
        walk = load.engine.express_seconds(reqs, tokens, own, load.computed_share)
        if walk is not None:
            return walk + step
    ttft = (fixed + mine + shares(load, c, mine, upper)) / capacity + step
    if load.engine is not None and not first:  # every seat taken: it waits for one (a class
        # served first takes one from a less urgent class), then for its prompt
        seat = load.engine.seat_wait(requests_ahead(load, c, ahead))
        if seat > 0:
            ttft = max(ttft, seat + own / rate + step)
    return ttft


def served_first(order: ServiceOrder, c: int) -> bool:
    """Whether class `c` is served before everyone: nothing is ordered before it and every
    other class's running prefill leaves it budget (P0 under hybrid and strict)."""
    others = (k for k in range(NUM_PRIORITIES) if k != c)
    return (
        order.class_aware and not order.before[c] and all(c in order.yields_to[k] for k in others)
    )


def requests_ahead(load: Load, c: int, ahead: int | None) -> int:
    """Requests waiting before a class-`c` request with `ahead` tokens of its class before it
    (None: a new one, behind its whole class)."""
    reqs = load.engine.waiting_requests if load.engine else (0,) * NUM_PRIORITIES
    order = load.order
    if not order.class_aware:
        return sum(reqs)
    n = sum(reqs[k] for k in order.before[c])
    mine = load.waiting_tokens[c]
    return n + (reqs[c] if ahead is None or mine <= 0 else round(reqs[c] * min(1, ahead / mine)))


def service_rate(load: Load, c: int, ahead: int | None) -> float | None:
    """Prompt tokens per second: the computed rate (``computed_rate``) over the share of a
    prompt the engine computes (the rest comes from the prefix cache)."""
    rate = computed_rate(load, c, ahead)
    return None if rate is None else rate / load.computed_share


def computed_rate(load: Load, c: int, ahead: int | None) -> float | None:
    """Computed prefill tokens per second a class-`c` request's wait is served at: the measured rate
    (admission/load_meter.py), but no faster than the engine's step-time model says it can go
    with the decodes it will run by then (admission/engine_rate.py: the requests ahead of it
    join them). A class served first (``served_first``: P0 under hybrid) gets the rate of an
    engine running its work alone: its work goes first, in steps built for it (express steps
    run P0 work only on a CPU; on a GPU the others' decodes add little), whatever rate the
    queue behind it drains at."""
    measured, engine, order = load.prefill_rate, load.engine, load.order
    if engine is None:
        return measured
    if served_first(order, c):
        reqs = engine.waiting_requests[c]
        alone = engine.idle().rate(reqs)
        return measured if alone is None else alone
    model = engine.rate(requests_ahead(load, c, ahead))
    if model is None:
        return measured
    if measured is None:
        return model
    return min(measured, model)


def shares(load: Load, c: int, mine: float, horizon: float | None) -> float:
    """Tokens of the classes sharing capacity with class `c` by weight, served while `mine`
    tokens of class `c` are. With the policy's start tags (SFQ: the class with the lowest is
    served next, and a class's tag grows by cost / weight with each service), class `k` is
    served until its tag passes class `c`'s once `mine` is done: ``(tag_c + mine / w_c -
    tag_k) x w_k``; without them, its GPS share ``mine x w_k / w_c``. Either is bounded by its
    backlog plus its arrivals over `horizon` seconds (None: not bounded)."""
    order, tags, total = load.order, load.class_tags, 0.0
    for k in range(NUM_PRIORITIES):
        if not order.shares_with(c, k):
            continue
        wc, wk = order.weights[c], order.weights[k]
        share = mine * wk / wc if tags is None else max(0.0, tags[c] + mine / wc - tags[k]) * wk
        if horizon is not None:
            share = min(share, load.waiting_tokens[k] + load.arrival_rate[k] * horizon)
        total += share
    return total
