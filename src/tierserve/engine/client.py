"""EngineClient: what the API layer holds, whichever engine serves it.

Two implementations: ``AsyncEngine`` (engine/async_engine.py: the engine thread in this process)
and ``RemoteEngine`` (cluster/remote_engine.py: a cluster ingress streaming from engine replicas).
The API (``api/``) and the drain on shutdown call only what the protocol names;
``tests/test_engine_events.py`` checks that both classes implement all of it.

A submitted request is read through its ``Stream``, on the event loop that submitted it. One
generator, ``Stream.deltas``, serves both engines; each engine only says how to cancel its own
kind of stream. A stream's lifetime is scoped, not left to the garbage collector: a handler wraps
its reading in ``async with stream`` (or ``async with`` a ``Prepared`` request, api/state.py),
whose exit cancels a request that has not ended -- the engine aborts it and frees its KV blocks at
once, however the reader left (returned, broke out, raised, was cancelled). Leaving it to the
generator's own ``finally`` would not do: an abandoned async generator runs it only when it is
garbage-collected, and a generator that wraps another closes the inner one only then too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from tierserve.clock import Clock
from tierserve.core.limits import RequestLimits
from tierserve.engine.events import ErrorKind, StreamDelta
from tierserve.priority import Priority
from tierserve.request import EngineRequest


class EngineDeadError(RuntimeError):
    """The engine is not running: nothing can be submitted."""


class Stream:
    """One submitted request's deltas, read on the event loop (one reader). The engine puts
    deltas in ``queue`` and sets ``done`` with the terminal one; subclasses say how to cancel."""

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.queue: asyncio.Queue[StreamDelta] = asyncio.Queue()
        self.done = False  # the terminal delta has arrived
        self._closed = False

    def _cancel(self, reason: str) -> None:
        """Stop the request in its engine and free what it holds (it still ends its stream)."""
        raise NotImplementedError

    def close(self, reason: str = "client disconnected") -> None:
        """Cancel the request unless it has ended; idempotent."""
        if not self.done and not self._closed:
            self._closed = True
            self._cancel(reason)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    async def deltas(self) -> AsyncIterator[StreamDelta]:
        """The request's deltas until the terminal one. A reader cancelled while it waits here
        cancels the request at once; one that leaves otherwise relies on ``async with``."""
        try:
            while True:
                delta = await self.queue.get()
                yield delta
                if delta.finished:
                    return
        finally:
            self.close()


@runtime_checkable
class EngineClient(Protocol):
    limits: RequestLimits  # immutable: what a request must fit (checked before submitting)
    clock: Clock  # the engine's clock: arrivals and deadlines are stamped with it
    heartbeat: float  # time.monotonic() of the engine's last sign of life
    error: BaseException | None  # why the engine stopped, if it did

    def start(self) -> None: ...

    def is_alive(self) -> bool: ...

    def shutdown(self, timeout: float = 5.0) -> None: ...

    def num_in_flight(self) -> int:
        """Streams submitted whose terminal delta has not arrived."""
        ...

    def in_flight_ids(self) -> list[str]: ...

    def submit(self, request: EngineRequest) -> Stream:
        """Hand `request` to the engine now; raises EngineDeadError if it cannot run."""
        ...

    def abort(self, request_id: str, reason: str = "aborted") -> None: ...

    def fail(self, request_id: str, kind: ErrorKind, reason: str) -> None:
        """End a request with an error; its client is told `reason`."""
        ...

    def shed(self, below: Priority, reason: str) -> None:
        """End the waiting request to shed first among classes less urgent than `below`."""
        ...
