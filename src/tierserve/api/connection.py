"""Connection limits under uvicorn's h11 protocol: a deadline for a request's headers, one for
its body, and a cap on open connections.

uvicorn closes an idle keep-alive connection (`timeout_keep_alive`) but waits for ever on a
client that sends its headers or its body a byte at a time, and accepts every connection: 3,000
such clients held 3,000 sockets open for as long as they liked. Here:

- the headers of each request must arrive within `header_timeout_s` of the connection opening
  (or of the previous response ending, on a kept-alive connection);
- its body within `body_timeout_s` of its headers;
- past either deadline the client gets `408 Request Timeout` (if no response has started) and
  the connection is closed: the handler sees a disconnect and frees what it holds;
- a connection beyond `max_connections` gets `503` with `Retry-After` and is closed at once.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

from tierserve.api.settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
)

log = logging.getLogger("tierserve.api")


def _raw_response(status: str, message: str, extra: str = "") -> bytes:
    body = f'{{"error": {{"message": "{message}", "type": "invalid_request_error"}}}}'.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


class _GuardedH11(H11Protocol):
    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s = DEFAULT_BODY_TIMEOUT_S
    max_connections = DEFAULT_MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._seen_scope = None
        if len(self.connections) >= self.max_connections:
            # Not counted, not parsed: the socket is refused before any work is done for it.
            retry = "retry-after: 1\r\n"
            transport.write(_raw_response("503 Service Unavailable", "too many connections", retry))
            transport.close()
            log.warning("connection refused: %d connections open", len(self.connections))
            return
        super().connection_made(transport)
        self._arm(self.header_timeout_s, "the request headers did not arrive in time")

    def _arm(self, seconds: float, why: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, why)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, why: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if self.scope is self._seen_scope else None
        if cycle is None or not cycle.response_started:
            self.transport.write(_raw_response("408 Request Timeout", why))
        if cycle is not None:
            cycle.keep_alive = False
        log.info("closing a slow connection from %s: %s", self.client, why)
        self.transport.close()  # connection_lost tells the handler the client is gone

    def data_received(self, data: bytes) -> None:
        if self.transport is None:  # refused in connection_made
            return
        super().data_received(data)
        self._track()

    def _track(self) -> None:
        """After parsing: new headers start the body deadline; a complete body clears it (the
        handler has all it will read; a response may take as long as it takes)."""
        if self.scope is not None and self.scope is not self._seen_scope:
            self._seen_scope = self.scope
            self._arm(self.body_timeout_s, "the request body did not arrive in time")
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and not cycle.response_complete:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # kept alive: the next request's headers are due
            self._arm(self.header_timeout_s, "the request headers did not arrive in time")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused in connection_made
            return
        self._disarm()
        super().connection_lost(exc)


def guarded_protocol(
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> type[H11Protocol]:
    """uvicorn's `http=` protocol class with these limits."""
    for name, v in (("header_timeout_s", header_timeout_s), ("body_timeout_s", body_timeout_s)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    return type(
        "GuardedH11Protocol",
        (_GuardedH11,),
        {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "max_connections": max_connections,
        },
    )
