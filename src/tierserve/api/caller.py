"""Who asks for a completion: what the chat and completion handlers need of their caller.

An HTTP request (`from_http`) and a Batch API line (batch/dispatch.py) both become a `Caller`,
so the batch feeder runs a line through the same handler as the HTTP route, by a typed call
rather than through a made-up HTTP request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request as HTTPRequest

from tierserve.api.auth import request_tenant
from tierserve.api.door import Ticket
from tierserve.api.tenancy import Tenant


@dataclass(frozen=True)
class Caller:
    tenant: Tenant
    tier: str | None  # the `x-request-tier` header's value, if any
    disconnected: Callable[[], Awaitable[bool]]  # True once the caller went away
    # When its first byte came, on the engine's clock (api/door.py; None: now, a batch line)
    arrived: float | None = None
    door: Ticket | None = None  # its seat at the door, left once it is admitted or refused
    trace_parent: str | None = None  # its W3C `traceparent` header (request tracing)

    @classmethod
    def from_http(cls, state, http: HTTPRequest) -> Caller:
        """The HTTP request's caller (the route's `authenticated` dependency has run)."""
        seen = http.scope.get("state") or {}
        return cls(
            request_tenant(state, http),
            http.headers.get("x-request-tier"),
            http.is_disconnected,
            seen.get("arrived"),
            seen.get("door"),
            http.headers.get("traceparent"),
        )

    def leave_door(self) -> None:
        """Its door work is done (admitted or refused): the next request may start its own."""
        if self.door is not None:
            self.door.leave()
