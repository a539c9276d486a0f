"""What the scheduler counts about its waiting queue, for admission control and observers:
requests and tokens waiting by submitted class, and what left the queue for the running batch
since the start (drain rates are measured from these). The engine thread reads them into each
snapshot; the simulator's admission reads them directly (engine/load.py ``CoreQueueView``)."""

from __future__ import annotations

from tierserve.policies import Policy
from tierserve.policies.base import arrival_key
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request


class QueueCounts:
    """Mixed into ``Scheduler``: it calls ``_enqueue`` / ``_dequeued`` / ``_served`` as requests
    enter and leave its policy's queue."""

    policy: Policy

    def _init_counts(self) -> None:
        self._waiting_count = [0] * NUM_PRIORITIES  # by submitted class
        self._waiting_tokens = [0] * NUM_PRIORITIES
        # Left the queue for the running batch since the start, by submitted class (requests,
        # prompt tokens): admission control measures drain rates from these.
        self.served = [0] * NUM_PRIORITIES
        self.served_tokens = [0] * NUM_PRIORITIES

    def _enqueue(self, request: Request, requeue: bool) -> None:
        (self.policy.requeue_preempted if requeue else self.policy.add)(request)
        self._waiting_count[request.base_priority] += 1
        self._waiting_tokens[request.base_priority] += request.num_tokens

    def _dequeued(self, request: Request) -> None:
        self._waiting_count[request.base_priority] -= 1
        self._waiting_tokens[request.base_priority] -= request.num_tokens

    def _served(self, request: Request) -> None:
        self.served[request.base_priority] += 1
        self.served_tokens[request.base_priority] += request.num_prompt_tokens

    def queue_depth(self, priority: Priority) -> int:
        return self._waiting_count[priority]

    def queued_tokens(self, priority: Priority) -> int:
        return self._waiting_tokens[priority]

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        return self.served[priority], self.served_tokens[priority]

    def can_shed(self, below: Priority) -> bool:
        return any(self._waiting_count[c] for c in range(int(below) + 1, NUM_PRIORITIES))

    def lowest_waiting(self, below: Priority) -> str | None:
        """The waiting request to shed first among classes less urgent than `below`: the
        latest arrival of the least urgent class. O(waiting); called only when shedding."""
        cands = [r for r in self.policy.requests() if r.base_priority > below]
        if not cands:
            return None
        return max(cands, key=lambda r: (r.base_priority, *arrival_key(r))).request_id

    def _strict_ahead(self) -> list[int]:
        """Tokens waiting, per class, in the classes the policy serves strictly before it."""
        strict = self.policy.traits.strict_before
        ahead = [0] * NUM_PRIORITIES
        for c in range(NUM_PRIORITIES):
            ahead[c] = sum(self._waiting_tokens[k] for k in strict[c])
        return ahead

    @property
    def num_waiting(self) -> int:
        return len(self.policy)
