"""Queue building blocks shared by the policies: an indexed heap with O(log n) push/pop and O(1)
removal (lazy deletion), and a per-class queue with a head lane for preempted requests and an
optional per-tenant fair lane (virtual token counters, as in VTC, OSDI'24)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from tierserve.request import Request

_seq = itertools.count()
_HEAD = object()  # lane markers in ClassQueue._lane; any other value is a tenant name
_MAIN = object()


class RequestHeap:
    """Min-heap of requests by a key; removal marks the entry dead and skips it later."""

    __slots__ = ("_entries", "_heap")

    def __init__(self) -> None:
        self._heap: list[list] = []
        self._entries: dict[str, list] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def push(self, request: Request, key: tuple) -> None:
        if request.request_id in self._entries:
            raise ValueError(f"request {request.request_id} is already queued")
        entry = [key, next(_seq), request, True]
        self._entries[request.request_id] = entry
        heapq.heappush(self._heap, entry)

    def remove(self, request_id: str) -> bool:
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return False
        entry[3] = False
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._entries):
            self._heap = [e for e in self._heap if e[3]]
            heapq.heapify(self._heap)
        return True

    def peek(self) -> Request | None:
        heap = self._heap
        while heap and not heap[0][3]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self) -> Request | None:
        req = self.peek()
        if req is not None:
            heapq.heappop(self._heap)
            del self._entries[req.request_id]
        return req

    def requests(self) -> list[Request]:
        return [e[2] for e in self._entries.values()]


class ClassQueue:
    """The waiting requests of one priority class.

    * ``head`` lane: preempted requests put back; always served first, oldest key first.
    * main lane: ordered by the policy's key (arrival, or deadline then arrival). With
      ``tenant_fair`` the main lane is one heap per tenant, and the tenant with the smallest
      virtual counter is served next; a tenant that becomes backlogged has its counter lifted to
      the smallest backlogged counter, or, when no tenant is waiting, to the counter of the
      tenant served last (VTC's lift): idle time is not banked as credit, and a newcomer does
      not get the service others had while it was away as a windfall.
    """

    def __init__(self, tenant_fair: bool = False) -> None:
        self.tenant_fair = tenant_fair
        self.head = RequestHeap()
        self._main = RequestHeap()  # when not tenant_fair
        self._tenants: dict[str, RequestHeap] = {}
        self.counters: dict[str, float] = {}
        self._theap: list[tuple[float, int, str]] = []  # lazy (counter, seq, tenant)
        self._lane: dict[str, object] = {}  # request id -> _HEAD | _MAIN | tenant name
        self.last_served: float | None = None  # the counter of the tenant served last

    def __len__(self) -> int:
        return len(self._lane)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._lane

    def push(self, request: Request, key: tuple) -> None:
        if not self.tenant_fair:
            self._main.push(request, key)
            self._lane[request.request_id] = _MAIN
            return
        t = request.tenant
        q = self._tenants.get(t)
        if q is None:
            q = self._tenants[t] = RequestHeap()
        if len(q) == 0:
            floor = self._min_backlogged_counter()
            if floor is None:  # nobody waits: the last one served sets the level
                floor = self.last_served
            c = self.counters.get(t, 0.0)
            if floor is not None and c < floor:
                c = floor
            self.counters[t] = c
            heapq.heappush(self._theap, (c, next(_seq), t))
        q.push(request, key)
        self._lane[request.request_id] = t

    def push_head(self, request: Request, key: tuple) -> None:
        self.head.push(request, key)
        self._lane[request.request_id] = _HEAD

    def remove(self, request_id: str) -> bool:
        lane = self._lane.pop(request_id, None)
        if lane is None:
            return False
        if lane is _HEAD:
            self.head.remove(request_id)
        elif lane is _MAIN:
            self._main.remove(request_id)
        else:
            self._tenants[lane].remove(request_id)
        return True

    def _min_backlogged_counter(self) -> float | None:
        th = self._theap
        while th:
            c, _, t = th[0]
            q = self._tenants.get(t)
            if q is not None and len(q) > 0 and self.counters.get(t) == c:
                return c
            heapq.heappop(th)
        return None

    def _fair_tenant(self) -> str | None:
        return self._theap[0][2] if self._min_backlogged_counter() is not None else None

    def peek(self) -> Request | None:
        req = self.head.peek()
        if req is not None:
            return req
        if not self.tenant_fair:
            return self._main.peek()
        t = self._fair_tenant()
        return self._tenants[t].peek() if t is not None else None

    def pop(self, cost: Callable[[Request], float]) -> Request | None:
        """Remove and return the next request; charge its tenant `cost(request)` when fair."""
        req = self.head.pop()
        if req is not None:
            del self._lane[req.request_id]
            return req
        if not self.tenant_fair:
            req = self._main.pop()
        else:
            t = self._fair_tenant()
            if t is None:
                return None
            heapq.heappop(self._theap)
            req = self._tenants[t].pop()
            self.counters[t] += cost(req)
            self.last_served = self.counters[t]
            if len(self._tenants[t]) > 0:
                heapq.heappush(self._theap, (self.counters[t], next(_seq), t))
        if req is not None:
            del self._lane[req.request_id]
        return req

    def requests(self) -> list[Request]:
        out = self.head.requests() + self._main.requests()
        for q in self._tenants.values():
            out.extend(q.requests())
        return out
