"""Late binding's decisions, free of any event loop: who may be sent now, who waits, and who
leaves the wait next. The cluster's ingress queue (``cluster/ingress_queue.py``, asyncio) and
the simulated fleet's (``sim/fleet_ingress.py``, virtual clock) both decide with this code.

* ``class_room``: requests of a class the fleet could start now -- on each replica, the seats
  not held or claimed (running or waiting) by that class or a more urgent one. A seat held by a
  less urgent class counts: the engine preempts it for the more urgent request.
* ``batch_room``: prompt tokens of a class the fleet's next steps could still take in -- on
  each replica with the step budget its running and waiting requests leave
  (``free_step_tokens``) and the KV blocks free for the class (``headroom``) for the prompt.
* ``WaitQueue``: the waiting requests, by class (P1 before P2 before P3), and within a class by
  tenant in turn (each backlogged tenant one request per round), first come first served within
  a tenant. P0 never waits (``may_go_now``): its replica starts it at once, preempting if it
  must, so holding it could only delay it. ``release`` sends by seats, in class order;
  ``release_to_batch`` then sends held P2 and P3 requests by step budget: a replica whose next
  step has the budget and the KV blocks for one takes it into its own queue even when every
  seat is held or kept for the more urgent classes, so its policy can start it the moment a
  seat frees (and batch its prefill with the decodes) instead of it waiting here for a seat
  the ingress counts. P1 is sent by seats only, and while a P1 request waits here nothing
  leaves by budget: the more urgent classes keep their order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from tierserve.priority import NUM_PRIORITIES, Priority

T = TypeVar("T")


class SeatLoad(Protocol):
    """A replica's seats by class (``cluster.fleet.ReplicaLoad`` has these fields)."""

    running: tuple[int, ...]
    waiting: tuple[int, ...]
    max_num_seqs: int


class StepLoad(Protocol):
    """What a replica's next step could still take in (``ReplicaStats`` and
    ``cluster.fleet.ReplicaLoad`` have these fields)."""

    max_step_tokens: int
    running: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    waiting_tokens: tuple[int, ...]
    headroom: tuple[int, ...]
    block_size: int


def free_step_tokens(s: StepLoad) -> int:
    """Tokens the replica's next step has left once its running requests decode (one each),
    their prompts' rest is prefilled and its waiting requests' prompts are taken in."""
    return s.max_step_tokens - sum(s.running) - sum(s.prefill_tokens) - sum(s.waiting_tokens)


def could_batch(s: StepLoad, priority: Priority, prompt_tokens: int) -> bool:
    """Whether the replica's next step has the budget for a class-`priority` prompt of
    `prompt_tokens`, and its KV cache the blocks for it without preempting anyone."""
    return batch_room([s], priority, prompt_tokens) >= prompt_tokens


BATCH_CLASSES = (Priority.P2, Priority.P3)  # sent by step budget as well as by seats


def batch_room(loads: Iterable[StepLoad], priority: Priority, prompt_tokens: int = 1) -> int:
    """Prompt tokens of class `priority` the replicas in `loads` could batch in their next
    steps: the free step budget of each replica that could take a `prompt_tokens` prompt of
    that class whole (the budget for it, and the KV blocks without preempting anyone)."""
    free = ((free_step_tokens(s), s) for s in loads)
    return sum(
        f
        for f, s in free
        if f >= prompt_tokens and s.headroom[priority] >= -(-prompt_tokens // s.block_size)
    )


def seat_room(load: SeatLoad, priority: Priority) -> int:
    """Seats of one replica a class-`priority` request could take now."""
    c = int(priority) + 1
    return max(0, load.max_num_seqs - sum(load.running[:c]) - sum(load.waiting[:c]))


def class_room(loads: Iterable[SeatLoad], priority: Priority) -> int:
    """Seats of the replicas in `loads` a class-`priority` request could take now."""
    return sum(seat_room(x, priority) for x in loads)


class WaitQueue(Generic[T]):
    """Requests waiting for room, in class order, tenants in turn within a class."""

    def __init__(self) -> None:
        # Per class: tenant -> its waiting items (oldest first), and the tenants' turn order.
        self._queues: list[dict[str, deque[T]]] = [{} for _ in range(NUM_PRIORITIES)]
        self._turns: list[deque[str]] = [deque() for _ in range(NUM_PRIORITIES)]

    def depth(self, priority: Priority | None = None) -> int:
        """Items waiting (of `priority`, or all)."""
        classes = range(NUM_PRIORITIES) if priority is None else (int(priority),)
        return sum(len(q) for c in classes for q in self._queues[c].values())

    def items(self, priority: Priority) -> list[T]:
        """Class `priority`'s waiting items (tenant by tenant)."""
        return [x for q in self._queues[priority].values() for x in q]

    def backlog(
        self, since: Callable[[T], float], now: float
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Per class (P0..P3): items waiting, and how long the oldest has waited at `now`
        (`since(item)`: when it began to wait; 0.0 for a class with none). The autoscaler
        reads the held backlog so (cluster/signals.py ``held_metrics``)."""
        counts, oldest = [], []
        for c in map(Priority, range(NUM_PRIORITIES)):
            items = self.items(c)
            counts.append(len(items))
            oldest.append(max((now - since(x) for x in items), default=0.0))
        return tuple(counts), tuple(oldest)

    def nobody_before(self, priority: Priority) -> bool:
        """No request of `priority` or a more urgent class waits (P0 never does)."""
        return all(not self._queues[c] for c in range(1, int(priority) + 1))

    def may_go_now(self, priority: Priority, room: int) -> bool:
        """Whether a new class-`priority` request is sent at once: P0 always; the others when
        their class has `room` and nobody of their class or a more urgent one waits."""
        return priority == Priority.P0 or (self.nobody_before(priority) and room > 0)

    def push(self, priority: Priority, tenant: str, item: T) -> None:
        mine = self._queues[priority].setdefault(tenant, deque())
        if not mine:
            self._turns[priority].append(tenant)
        mine.append(item)

    def remove(self, priority: Priority, tenant: str, item: T) -> bool:
        """Take `item` out (its client left); False if it was not waiting."""
        queues = self._queues[priority]
        mine = queues.get(tenant)
        if mine is None or item not in mine:
            return False
        mine.remove(item)
        if not mine:
            del queues[tenant]
            self._turns[priority].remove(tenant)
        return True

    def peek(self, priority: Priority) -> T:
        """Class `priority`'s next item (as ``pop`` would return it), left in place."""
        return self._queues[priority][self._turns[priority][0]][0]

    def pop(self, priority: Priority) -> T:
        """Class `priority`'s next item: its next tenant in turn, that tenant's oldest."""
        turns, queues = self._turns[priority], self._queues[priority]
        tenant = turns.popleft()
        mine = queues[tenant]
        item = mine.popleft()
        if mine:
            turns.append(tenant)  # back of the round
        else:
            del queues[tenant]
        return item

    def release(self, room: Callable[[Priority], int], send: Callable[[Priority, T], None]) -> int:
        """Send waiting items in class order while their class has `room` (asked again after
        each send); a class without room holds every less urgent one too (their room is never
        larger). Returns how many were sent."""
        n = 0
        for c in map(Priority, range(1, NUM_PRIORITIES)):
            while self._queues[c]:
                if room(c) <= 0:
                    return n
                send(c, self.pop(c))
                n += 1
        return n

    def release_to_batch(
        self,
        room: Callable[[Priority, int], int],
        cost: Callable[[T], int],
        send: Callable[[Priority, T], None],
    ) -> int:
        """Send waiting P2, then P3, items while the fleet's next steps could batch them:
        `room(priority, prompt_tokens)` is ``batch_room`` (asked again after each send),
        `cost(item)` an item's prompt tokens. A class's next item that does not fit holds the
        rest of it and every less urgent class (P2 before P3); a waiting P1 holds them all
        (P1 leaves by seats, first). Returns how many were sent."""
        n = 0
        if self._queues[Priority.P1]:  # P1 keeps its priority: nothing jumps a waiting P1
            return n
        for c in BATCH_CLASSES:
            while self._queues[c]:
                need = max(1, cost(self.peek(c)))
                if room(c, need) < need:
                    return n
                send(c, self.pop(c))
                n += 1
        return n
