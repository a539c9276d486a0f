"""First come, first served: arrival order, priority ignored. The "no priority" baseline."""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.policies.base import Policy, SchedulerState, arrival_key
from tierserve.policies.queues import RequestHeap
from tierserve.policies.registry import register_policy
from tierserve.policies.traits import PolicySettings
from tierserve.priority import NUM_PRIORITIES
from tierserve.request import Request, RequestStatus


@dataclass(frozen=True)
class FCFSConfig(PolicySettings):
    pass


@register_policy("fcfs")
class FCFSPolicy(Policy):
    config_class = FCFSConfig
    class_aware = False

    def __init__(self, config, priorities=None) -> None:
        super().__init__(config, priorities)
        self._heap = RequestHeap()
        self._counts = [0] * NUM_PRIORITIES

    def add(self, request: Request) -> None:
        self._heap.push(request, (1, *arrival_key(request)))
        self._counts[request.priority] += 1

    def requeue_preempted(self, request: Request) -> None:
        self._heap.push(request, (0, *arrival_key(request)))
        self._counts[request.priority] += 1

    def peek(self, state: SchedulerState) -> Request | None:
        return self._heap.peek()

    def commit(self, request: Request) -> None:
        if not self._heap.remove(request.request_id):
            raise ValueError(f"commit of {request.request_id}, which is not waiting")
        self._counts[request.priority] -= 1

    def remove(self, request: Request) -> bool:
        if self._heap.remove(request.request_id):
            self._counts[request.priority] -= 1
            return True
        return False

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._heap

    def waiting_by_class(self) -> tuple[int, ...]:
        return tuple(self._counts)

    def requests(self) -> list[Request]:
        return self._heap.requests()

    def select_victims(self, candidates, for_request, blocks_needed):
        # The KV reclaim order ranks by class; arrival order alone decides here: latest first.
        latest_first = sorted(candidates, key=lambda c: arrival_key(c.request), reverse=True)
        return super().select_victims(latest_first, for_request, blocks_needed)

    def may_preempt(self, for_request: Request, victim: Request) -> bool:
        # No priorities: only a running request that cannot grow pushes out later arrivals.
        return for_request.status == RequestStatus.RUNNING and arrival_key(victim) > arrival_key(
            for_request
        )
