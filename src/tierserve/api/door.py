"""The door: a generation request's clock starts at its first byte, and the costly work before
admission (body parsing, chat template, tokenization, the admission decision) is done in
priority order.

A burst of hundreds of requests used to be read, templated, tokenized and admitted in arrival
order: a P0 request behind 200 background ones waited at the door for most of a second before
admission even saw it, and neither the server's TTFT nor the predictor counted that time. Now:

* ``Door`` (pure ASGI middleware) stamps each generation request with the engine clock when its
  headers arrive (``scope["state"]["arrived"]``); the engine request's ``arrival_time``, the
  TTFT metrics and SLA admission (which adds the time already spent to its prediction) all start
  from there.
* Before its body is parsed it classifies the request by its key and ``x-request-tier`` header
  alone (the tenant's entitlement applied, as ``TenantRegistry.resolve`` does; a priority given
  only in the body is learnt later, so such a request enters at its tenant's default class,
  and is never held: see below) and, once its body is received (a slow upload holds no seat),
  waits for a seat in the ``PriorityGate``: at most ``seats`` requests do their costly work at
  once, and a freed seat goes to the most urgent request waiting (earliest arrival among
  equals). The seat is left as soon as the request is admitted or refused (``Caller.leave_door``
  from ``prepare``), so streaming never holds one; whatever happens, the middleware leaves it
  when the request ends.
* During a burst at the door (as many waiting as there are seats), while P0 prompts wait for
  the engine (``busy``: the engine's queue or the command queue holds one), a less urgent
  request is held at the door for up to ``HOLD_S``: on two cores its door
  work would slow the engine prefilling them (one interpreter lock, and the tokenizer's threads
  on the other core). Measured with benchmarks/served/sla_burst.py.

So under a mixed burst, P0 is admitted or refused before lower classes are parsed, and a
refusal costs one admission decision, not a wait behind everybody's tokenization.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from tierserve.api.tenancy import AuthError, BadPriority, TenantRegistry
from tierserve.priority import Priority

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
DEFAULT_SEATS = 4  # requests doing their door work at once (one on the loop, the rest in threads)
HOLD_S = 0.5  # the longest a less urgent request is held while P0 prompts wait (P0's SLA)
RETRY_S = 0.005  # how often a held request's door is tried again


class PriorityGate:
    """At most `seats` holders; waiters are let in by (priority, arrival order). During a burst
    (at least `seats` waiting) while `busy()` (P0 prompts wait for the engine), a less urgent
    waiter is held back, up to `hold_s` after it came: its door work (parsing, templates,
    tokenization) would take the cores and the interpreter lock from the engine prefilling
    them. Event loop only."""

    def __init__(
        self,
        seats: int = DEFAULT_SEATS,
        busy: Callable[[], bool] | None = None,
        hold_s: float = HOLD_S,
    ) -> None:
        if seats < 1:
            raise ValueError(f"the door needs at least one seat, got {seats}")
        self.seats = seats
        self.inside = 0
        self.busy, self.hold_s = busy, hold_s
        self._waiting: list[tuple[int, int, bool, float, asyncio.Future]] = []
        self._order = itertools.count()
        self._retry: asyncio.TimerHandle | None = None
        self.admitted_by_class = [0] * len(Priority)  # let in since the start, per class

    @property
    def num_waiting(self) -> int:
        return sum(1 for *_, f in self._waiting if not f.done())

    def _held(self, priority: int, known: bool, since: float, now: float) -> bool:
        return (
            known  # a class learnt from the body only may be P0: never held
            and priority > Priority.P0
            and self.busy is not None
            and self.inside + len(self._waiting) >= self.seats  # a burst fills the door
            and now - since < self.hold_s
            and self.busy()
        )

    async def enter(self, priority: Priority, known: bool = True) -> Ticket:
        """Wait for a seat (at once while one is free, nobody waits and it is not held);
        `known`: the class is the request's own (from its tier header), not a guess."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        free = self.inside < self.seats and not self._waiting
        if free and not self._held(priority, known, now, now):
            self.inside += 1
        else:
            fut = loop.create_future()
            heapq.heappush(self._waiting, (int(priority), next(self._order), known, now, fut))
            self._pass_on()
            try:
                await fut  # set by _pass_on, which took the seat for us
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # the seat was ours: hand it on
                    self._leave()
                raise
        self.admitted_by_class[int(priority)] += 1
        return Ticket(self)

    def _leave(self) -> None:
        self.inside -= 1
        self._pass_on()

    def _pass_on(self) -> None:
        self._retry = None
        now = asyncio.get_running_loop().time()
        while self._waiting and self.inside < self.seats:
            prio, _, known, since, fut = self._waiting[0]
            if fut.done():  # its waiter was cancelled (the client went away)
                heapq.heappop(self._waiting)
                continue
            if self._held(prio, known, since, now):
                # The most urgent waiting is held, and so is every known class after it; a
                # request whose class is a guess (learnt from its body later) may still go.
                if self._retry is None:
                    self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._pass_on)
                guess = next((w for w in sorted(self._waiting) if not w[2]), None)
                if guess is None:
                    return
                self._waiting.remove(guess)
                heapq.heapify(self._waiting)
                fut = guess[4]
                if fut.done():
                    continue
            else:
                heapq.heappop(self._waiting)
            self.inside += 1
            fut.set_result(None)


class Ticket:
    """A seat at the door; `leave` is idempotent."""

    def __init__(self, gate: PriorityGate) -> None:
        self._gate: PriorityGate | None = gate

    def leave(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._leave()


def header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1")
    return None


class Door:
    """Pure ASGI middleware; `now` is the engine's clock and `classify(authorization,
    tenant_id, tier)` the class a request enters at (see the module's docstring)."""

    def __init__(
        self,
        app,
        now: Callable[[], float],
        classify: Callable[[str | None, str | None, str | None], tuple[Priority, bool]],
        seats: int = DEFAULT_SEATS,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        self.app, self.now, self.classify = app, now, classify
        self.gate = PriorityGate(seats, busy)

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in GENERATION_PATHS
        ):
            return await self.app(scope, receive, send)
        arrived = self.now()
        prio, known = self.classify(
            header(scope, b"authorization"),
            header(scope, b"x-tenant-id"),
            header(scope, b"x-request-tier"),
        )
        # The body is received before the seat is taken (a slow upload holds no seat); it is
        # only parsed inside.
        received = []
        while True:
            msg = await receive()
            received.append(msg)
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                break

        async def replay():
            return received.pop(0) if received else await receive()

        ticket = await self.gate.enter(prio, known)
        state = scope.setdefault("state", {})
        state["arrived"], state["door"] = arrived, ticket
        try:
            await self.app(scope, replay, send)
        finally:
            ticket.leave()


def door_class(tenants) -> Callable[[str | None, str | None, str | None], tuple[Priority, bool]]:
    """The class a request enters the door at, and whether it is known: its tenant's (from the
    key) resolution of the tier header; without the header, the tenant's default class, not
    known (the body may ask for another). A request that will be refused (bad key, bad tier)
    enters first: its refusal is cheap and should be quick."""

    def classify(
        authorization: str | None, tenant_id: str | None, tier: str | None
    ) -> tuple[Priority, bool]:
        try:
            tenant = tenants.authenticate(authorization, tenant_id)
            return TenantRegistry.resolve(tenant, tier, None).priority, tier is not None
        except (AuthError, BadPriority):
            return Priority.P0, True

    return classify
