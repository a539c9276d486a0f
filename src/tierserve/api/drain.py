"""Draining on SIGTERM.

uvicorn's graceful shutdown closes the listener, waits up to its own timeout for open
connections to finish, then cancels what is left (a cut stream gets neither an error event nor
`[DONE]`, and the log gets CancelledError tracebacks). So the server runs `drain` beside it and
ends the stragglers itself at the grace deadline: each request still in flight is failed through
the engine, which sends its terminal delta, and its handler answers it properly (a stream: an
error event then `[DONE]`; a plain request: 503 with Retry-After). uvicorn's own timeout is set
FLUSH_S later, so those last events are written before anything is cancelled."""

from __future__ import annotations

import asyncio
import logging
import time

from tierserve.api.state import ServerState
from tierserve.engine.events import ErrorKind

log = logging.getLogger("tierserve.server")

FLUSH_S = 5.0  # after the grace deadline: time for failed requests to write their last event
SHUTDOWN_ERROR = "server shutting down: the grace period ended before the request did"


async def drain(state: ServerState, grace_s: float, poll_s: float = 0.05) -> int:
    """Wait up to `grace_s` for in-flight requests, then fail the rest; return how many were
    cut (0 = a clean drain)."""
    state.draining = True
    deadline = time.monotonic() + grace_s
    while state.engine.num_in_flight() and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
    cut = state.engine.num_in_flight()
    if cut:
        log.warning("grace period of %g s ended: failing %d request(s) in flight", grace_s, cut)
        for rid in state.engine.in_flight_ids():
            state.engine.fail(rid, ErrorKind.SHUTDOWN, SHUTDOWN_ERROR)
    return cut
