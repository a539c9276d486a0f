"""The ingress's priority queue (``--ingress-queue on``): late binding to a replica.

Without it, a request is bound to a replica when it arrives: with every seat of the fleet busy,
a P1 request waits in one replica's queue while another replica may free a seat first, and the
router chose on a view about 0.2 s old. With it, a request that finds no seat for it in the fleet
(free, or held by a less urgent class) waits here instead, and is sent -- to the replica the
router then picks -- as soon as there is one. Waiting requests leave in class order (P1
before P2 before P3), and within a class in turn by tenant (each backlogged tenant one request
per round: a fair share of the seats by request), first come first served within a tenant.

* **P0 never waits here**: it is sent at once; its replica starts it at once by preempting a
  lower class's seat if it must (the engine's policy), so holding it could only delay it.
* **Room** for a class is counted from the fleet board's last view: on each replica, the seats
  not held or claimed (running or waiting) by that class or a more urgent one -- a seat held by
  a less urgent class counts, since the engine preempts it for a more urgent request (holding a
  P1 request here while a replica runs P3 would only delay it) -- minus what this ingress sent
  of those classes after (about) each replica's report, plus the seats its own streams of those
  classes gave back since (a stream that had started, ended): a seat freed is used at once,
  not one report later.
* **Held P2 and P3 also leave by step budget** (``WaitQueue.release_to_batch``): once the
  seats are given out in class order, and while no P1 request waits here, a held P2 (then P3)
  request is sent while some replica's last report shows its next step with the budget and
  the KV blocks for its prompt (``batch_room``), minus the prompt tokens this ingress sent
  since the reports. It then waits in that replica's own queue, whose policy starts it as
  soon as a seat frees there, instead of waiting here for a seat the ingress counts as kept;
  P1 is sent by seats only. The router picks the replica, as for
  every request (the simulator sends it to the first ranked that could batch it).
* **Bounded** by admission's queue limits: a request held here is one no replica has
  acknowledged, which the ingress's queue view counts as waiting (``RemoteEngine``), so a
  full class is refused with 503 and Retry-After before it gets here.
* **Seen by the autoscaler**: ``held_metrics`` (per class, how many wait here and the
  oldest's wait over the class's SLA), which the ingress pushes to the fleet board for the
  engine replicas to export with their own autoscaling signals (cluster/signals.py).
* **A client that leaves** cancels its stream's task, which takes its entry out at once: no
  dead work is ever sent. A replica that dies changes nothing for requests waiting here (they
  are bound to none); its seats leave the view with it.

Runs on the ingress's event loop only (no locks); plain asyncio, no Ray. The decisions (room,
order) are ``routing/late_binding.py``'s, which the simulated fleet uses too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tierserve.cluster.fleet import FleetView
from tierserve.cluster.signals import held_metrics
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.routing.late_binding import (
    BATCH_CLASSES,
    WaitQueue,
    batch_room,
    class_room,
    could_batch,
    seat_room,
)

# A replica's report shows its engine up to a snapshot period before it was sent (as
# remote_engine.ACK_MARGIN_S): a request sent that little before a report counts as not in it.
SENT_MARGIN_S = 0.1


@dataclass
class _Entry:
    tenant: str
    turn: asyncio.Future = field(repr=False)
    prompt_tokens: int = 0
    since: float = 0.0  # when it began to wait here


class IngressQueue:
    def __init__(self, now=time.monotonic) -> None:
        self._now = now
        self.view = FleetView()
        self._waiting: WaitQueue[_Entry] = WaitQueue()  # the order: routing/late_binding.py
        # Per class: when each request was sent, and when each started stream of ours ended
        # (the recent ones: the reports do not show them yet).
        self._sent: list[deque[float]] = [deque() for _ in range(NUM_PRIORITIES)]
        self._freed: list[deque[float]] = [deque() for _ in range(NUM_PRIORITIES)]
        self._sent_tokens: deque[tuple[float, int]] = deque()  # (when, prompt tokens) sent

    # -- state --------------------------------------------------------------------------------
    def depth(self, priority: Priority | None = None) -> int:
        """Requests waiting here (of `priority`, or all)."""
        return self._waiting.depth(priority)

    def held_metrics(self, slas: Sequence[float | None]) -> dict[str, float]:
        """What waits here, as the autoscaler reads it (signals.py ``held_metrics``): per
        class, the requests and the oldest one's wait over its class's SLA (`slas`)."""
        return held_metrics(*self._waiting.backlog(lambda e: e.since, self._now()), slas)

    def room(self, priority: Priority) -> int:
        """Requests of `priority` the fleet could start now, as far as this ingress can tell:
        ``class_room`` of the board's view (the seats not held or claimed by its class or a
        more urgent one), minus what this ingress sent of those classes after (about) each
        report, plus the seats its own streams of those classes gave back since."""
        self._forget_reported()
        c = int(priority) + 1
        seats = class_room(self.view.loads.values(), priority)
        return seats - sum(map(len, self._sent[:c])) + sum(map(len, self._freed[:c]))

    def batch_room(self, priority: Priority, prompt_tokens: int) -> int:
        """Prompt tokens of `priority` the replicas' next steps could take in, as far as this
        ingress can tell: ``batch_room`` of the board's view, minus the prompt tokens this
        ingress sent after (about) each report."""
        self._forget_reported()
        sent = sum(n for _, n in self._sent_tokens)
        return batch_room(self.view.loads.values(), priority, prompt_tokens) - sent

    def _forget_reported(self) -> None:
        """Drop the sends and stream ends every report already shows."""
        since = min(self.view.reported_at.values(), default=-math.inf) - SENT_MARGIN_S
        for times in (*self._sent, *self._freed):
            while times and times[0] < since:
                times.popleft()
        while self._sent_tokens and self._sent_tokens[0][0] < since:
            self._sent_tokens.popleft()

    def free_seats(self) -> int:
        """Seats no one holds or waits for (the room of the least urgent class)."""
        return self.room(Priority(NUM_PRIORITIES - 1))

    # -- the event loop ------------------------------------------------------------------------
    def set_view(self, view: FleetView) -> None:
        self.view = view
        self._dispatch()

    def on_stream_end(self, priority: Priority, started: bool) -> None:
        """A stream of ours ended; `started`: it had streamed a token (it held a seat)."""
        if started:
            self._freed[priority].append(self._now())
            self._dispatch()

    async def wait_turn(
        self, priority: Priority, tenant: str, prompt_tokens: int = 0
    ) -> tuple[str, ...]:
        """Return when a request of `priority` from `tenant` with a prompt of `prompt_tokens`
        may be sent (at once for P0; with room for its class and no one of its class or a
        more urgent one waiting before it; or, P2 and P3, when a replica could batch it).
        Returns the replicas whose room let it go, as the board shows them (empty: no
        preference): the router's own stats may be older than the board's view, and a request
        released for a seat that just freed must not be ranked onto a replica still full.
        Cancelled while waiting: its entry is gone."""
        room = 1 if priority == Priority.P0 else self.room(priority)
        if self._waiting.may_go_now(priority, room):
            self._note_sent(priority, prompt_tokens)
            return () if priority == Priority.P0 else self._with_seats(priority)
        turn = asyncio.get_running_loop().create_future()
        entry = _Entry(tenant, turn, prompt_tokens, self._now())
        self._waiting.push(priority, tenant, entry)
        if priority in BATCH_CLASSES:
            self._dispatch()  # a replica may batch it now
        try:
            return await entry.turn
        except asyncio.CancelledError:  # the client left while it waited: out of the queue
            # (its turn may have come in the same loop turn: then the seat stays counted as
            # taken until the next report)
            self._waiting.remove(priority, tenant, entry)
            raise

    # -- internals -----------------------------------------------------------------------------
    def _note_sent(self, c: Priority, prompt_tokens: int) -> None:
        now = self._now()
        self._sent[c].append(now)
        self._sent_tokens.append((now, prompt_tokens))

    def _with_seats(self, c: Priority) -> tuple[str, ...]:
        """The replicas the board shows with a seat for class `c`."""
        return tuple(sorted(r for r, x in self.view.loads.items() if seat_room(x, c) > 0))

    def _send(self, c: Priority, entry: _Entry, where: tuple[str, ...]) -> None:
        if not entry.turn.done():  # (one cancelled in this loop turn is skipped)
            self._note_sent(c, entry.prompt_tokens)
            entry.turn.set_result(where)

    def _send_by_seat(self, c: Priority, entry: _Entry) -> None:
        self._send(c, entry, self._with_seats(c))

    def _send_by_budget(self, c: Priority, entry: _Entry) -> None:
        loads = self.view.loads.items()
        self._send(
            c, entry, tuple(sorted(r for r, x in loads if could_batch(x, c, entry.prompt_tokens)))
        )

    def _dispatch(self) -> None:
        """Send waiting requests in class order while their class has room; then held P2
        and P3 while a replica could batch them."""
        self._waiting.release(self.room, self._send_by_seat)
        self._waiting.release_to_batch(
            self.batch_room, lambda e: e.prompt_tokens, self._send_by_budget
        )
