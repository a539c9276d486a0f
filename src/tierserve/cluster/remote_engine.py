"""RemoteEngine: the ingress's stand-in for ``AsyncEngine``, over the engine replicas.

The API layer (``api/``: auth, tenants, tiers, admission, SSE) runs unchanged on a cluster
ingress: this is the other ``EngineClient`` (engine/client.py), and admission reads its queue
view (``queue_depth``, ``queued_tokens``, ``can_shed``, ``dequeued``). Here a submitted
``EngineRequest`` is streamed from an engine replica chosen by the request router, through a
Ray Serve deployment handle (``open_stream``, injected so tests can fake it).

Faults. A stream that breaks because its replica died (``is_replica_failure``) is sent again,
to another replica (the dead one is named in ``avoid``), if it has not streamed a token yet;
after a token it ends with an error delta (the API turns that into an error chunk and
``[DONE]``). Any other exception also ends the stream with an error delta. Every stream ends
with exactly one terminal delta; closing a stream early (client gone; ``abort``, ``fail``)
cancels the remote generator, which aborts the request on its replica and frees its KV blocks.

SLA admission (``--sla-admission on``). ``load`` gives admission every replica's TTFT predictor
inputs, from their reports, plus what this ingress sent since; admission judges a request on
the replica where it would start soonest (admission/fleet_load.py), with the single engine's
predictor.

Late binding (``--ingress-queue on``, cluster/ingress_queue.py): a request waits at the ingress,
in class and tenant order, until the fleet has a free seat; its task is cancelled there if its
client leaves.

Queue view. The fleet board's latest ``FleetView`` (refreshed by the ingress a few times a
second; ``view`` is replaced whole, never mutated) plus what this ingress has sent that no
replica has acknowledged yet (a replica acknowledges with its ``hello`` chunk, once the request
is in its engine's command queue). Shedding a lower-class waiter for P0 is a per-engine command
no replica could be sent here, so ``can_shed`` is always False: a P0 request that finds the
cluster's P0 queue full is refused like the others (docs/scale-out.md).

All of this runs on the ingress's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from tierserve.admission.fleet_load import FleetLoad, fleet_queue_depth
from tierserve.clock import Clock
from tierserve.cluster import wire
from tierserve.cluster.fleet import FleetView
from tierserve.cluster.ingress_queue import IngressQueue
from tierserve.core.limits import RequestLimits
from tierserve.engine.client import EngineDeadError, Stream
from tierserve.engine.events import ErrorKind, StreamDelta
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import EngineRequest
from tierserve.routing import RouteRequest

log = logging.getLogger("tierserve.cluster")

MAX_RETRIES = 2
# A replica's report shows the engine's state up to a snapshot period before it was sent: a
# request acknowledged that little before the report may not be in it yet (counted twice).
ACK_MARGIN_S = 0.1


class ChunkStream(Protocol):
    """A remote generator of chunks (Ray Serve's ``DeploymentResponseGenerator``)."""

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    def cancel(self) -> None: ...


class StreamEnded(Exception):
    """A replica's stream stopped without a final chunk."""


class RemoteStream(Stream):
    def __init__(self, request: EngineRequest, route: RouteRequest) -> None:
        super().__init__(request)
        self.route = route
        self.task: asyncio.Task | None = None
        self.replica: str | None = None
        # Late binding: the replicas whose room released it (the router ranks them first).
        self.prefer: tuple[str, ...] = ()
        self.sent_tokens = 0
        self.acked = False
        self.acked_at = -float("inf")  # when its replica's hello came (monotonic)
        # Set by abort/fail: how the stream ends once its task is cancelled.
        self.end: tuple[str, str, ErrorKind | None] = ("abort", "client disconnected", None)

    def _cancel(self, reason: str) -> None:
        self.end = ("abort", reason, None)
        if self.task is not None:
            self.task.cancel()  # cancels the remote generator: the replica aborts the request


class RemoteEngine:
    def __init__(
        self,
        open_stream: Callable[[dict[str, Any]], ChunkStream],
        limits: RequestLimits,
        clock: Clock,
        metrics: Any,
        is_replica_failure: Callable[[BaseException], bool],
        max_retries: int = MAX_RETRIES,
        queue: IngressQueue | None = None,
    ) -> None:
        self._open_stream = open_stream
        self.limits = limits
        self.clock = clock
        self.metrics = metrics
        self._is_failure = is_replica_failure
        self.max_retries = max_retries
        self.queue = queue  # --ingress-queue on: requests wait here for a free seat
        self.view = FleetView()
        self.heartbeat = time.monotonic()
        self.error: BaseException | None = None  # the replicas' engines fail on their own
        self._closed = False
        self._open: dict[str, RemoteStream] = {}
        self._unacked = [0] * NUM_PRIORITIES
        self._unacked_tokens = [0] * NUM_PRIORITIES

    # -- lifecycle (as AsyncEngine) -----------------------------------------------------------
    def start(self) -> None:
        pass  # the replicas run the engines

    def is_alive(self) -> bool:
        return not self._closed

    def num_in_flight(self) -> int:
        return len(self._open)

    def in_flight_ids(self) -> list[str]:
        return sorted(self._open)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._closed = True
        for s in list(self._open.values()):
            s.close("server shutting down")

    def set_view(self, view: FleetView) -> None:
        self.view = view
        if view.num_replicas:
            self.heartbeat = time.monotonic()
        if self.queue is not None:
            self.queue.set_view(view)

    # -- queue view for admission control -----------------------------------------------------
    def queue_depth(self, priority: Priority) -> int:
        v = self.view
        waiting = tuple(w + u for w, u in zip(v.waiting, self._unacked, strict=True))
        return fleet_queue_depth(waiting, v.running, v.seats, priority)

    def queued_tokens(self, priority: Priority) -> int:
        return self.view.waiting_tokens[priority] + self._unacked_tokens[priority]

    def can_shed(self, below: Priority) -> bool:
        return False

    def shed(self, below: Priority, reason: str) -> None:
        raise RuntimeError("a cluster ingress never sheds (can_shed is False)")

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        return self.view.served(priority)

    def load(self) -> FleetLoad:
        """The TTFT predictor's inputs of every replica that publishes them (with
        ``--sla-admission on``), plus the work this ingress sent that its last report cannot
        show: each request its replica acknowledged after (about) that report, on that
        replica; each request not acknowledged yet, on every replica (it may land on any).
        Counted as waiting work: for the few tenths of a second until the next report."""
        v, unacked = self.view, []
        by_replica: dict[str, list[EngineRequest]] = {}
        for s in self._open.values():
            if not s.acked:
                unacked.append(s.request)
                continue
            reported = v.reported_at.get(s.replica or "", -math.inf)
            if s.acked_at >= reported - ACK_MARGIN_S:
                by_replica.setdefault(s.replica or "", []).append(s.request)
        loads = []
        for rid, rl in v.loads.items():
            if rl.ttft is None:
                continue
            load = rl.ttft
            for r in (*by_replica.get(rid, ()), *unacked):
                load = load.with_waiting(r.priority, r.num_prompt_tokens, r.tenant)
            loads.append((rid, load))
        return FleetLoad(tuple(loads))

    # -- requests -----------------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> RemoteStream:
        if self._closed:
            raise EngineDeadError("the ingress is shutting down")
        route = RouteRequest.of(
            request.prompt_token_ids, request.priority, self.limits.block_size, request.cache_salt
        )
        stream = RemoteStream(request, route)
        self._open[request.request_id] = stream
        self._count(stream, +1)
        stream.task = asyncio.create_task(self._pump(stream))
        stream.task.add_done_callback(lambda _task: self._settle(stream))
        return stream

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        stream = self._open.get(request_id)
        if stream is not None:
            stream.close(reason)

    def fail(self, request_id: str, kind: ErrorKind, reason: str) -> None:
        stream = self._open.get(request_id)
        if stream is not None and stream.task is not None:
            stream.end = ("error", reason, kind)
            stream.task.cancel()

    def _count(self, stream: RemoteStream, sign: int) -> None:
        p = stream.request.priority
        self._unacked[p] += sign
        self._unacked_tokens[p] += sign * stream.request.num_prompt_tokens
        stream.acked = sign < 0

    def _put(self, stream: RemoteStream, delta: StreamDelta) -> None:
        if not stream.done:
            stream.done = delta.finished
            stream.queue.put_nowait(delta)

    def _end(
        self, stream: RemoteStream, reason: str, error: str, kind: ErrorKind | None = None
    ) -> None:
        req = stream.request
        self._put(
            stream,
            StreamDelta(
                finished=True,
                finish_reason=reason,
                error=error,
                num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=stream.sent_tokens,
                error_kind=kind,
            ),
        )

    async def _pump(self, stream: RemoteStream) -> None:
        avoid: list[str] = []
        if self.queue is not None:  # late binding: sent once a seat is free (a client that
            # leaves meanwhile cancels this task, which takes its entry out of the queue)
            req = stream.request
            stream.prefer = await self.queue.wait_turn(
                req.priority, req.tenant, req.num_prompt_tokens
            )
        try:
            for attempt in range(self.max_retries + 1):
                err = await self._attempt(stream, avoid)
                if err is None:
                    return
                lost = stream.replica or "unknown"
                retry = stream.sent_tokens == 0 and attempt < self.max_retries
                self.metrics.on_replica_failure(retry and not self._closed)
                log.warning("replica %s failed under %s: %r", lost, stream.request.request_id, err)
                if not retry or self._closed:
                    self._end(
                        stream,
                        "error",
                        f"engine replica {lost} failed after streaming {stream.sent_tokens} "
                        f"tokens ({type(err).__name__}); the response is incomplete",
                        ErrorKind.REPLICA_LOST,
                    )
                    return
                if stream.replica:
                    avoid.append(stream.replica)
                stream.replica = None
                if stream.acked:
                    self._count(stream, +1)
        except Exception as exc:  # not a replica failure: end this stream, keep serving
            log.exception("stream %s failed", stream.request.request_id)
            self._end(stream, "error", f"engine error: {exc!r}", ErrorKind.ENGINE)

    def _settle(self, stream: RemoteStream) -> None:
        """However its task ended (even cancelled before it began): the stream has its one
        terminal delta (``stream.end`` if none was sent), and the counters let it go."""
        self._end(stream, *stream.end)
        if not stream.acked:
            self._count(stream, -1)
        self._open.pop(stream.request.request_id, None)
        if self.queue is not None:
            self.queue.on_stream_end(stream.request.priority, started=stream.sent_tokens > 0)

    async def _attempt(self, stream: RemoteStream, avoid: list[str]) -> BaseException | None:
        """Stream one try; None when it finished, the failure when its replica failed."""
        payload = wire.request_payload(
            stream.request, stream.route, tuple(avoid), now=self.clock.now(), prefer=stream.prefer
        )
        gen = self._open_stream(payload)
        try:
            async for chunk in gen:
                if chunk["kind"] == wire.HELLO:
                    stream.replica = chunk["replica"]
                    stream.acked_at = time.monotonic()
                    if not stream.acked:
                        self._count(stream, -1)
                    self.metrics.on_routed(chunk["replica"], chunk["reason"])
                    continue
                delta = wire.chunk_delta(chunk)
                stream.sent_tokens += len(delta.token_ids)
                self._put(stream, delta)
                if delta.finished:
                    return None
            return StreamEnded(f"the stream from replica {stream.replica} ended unfinished")
        except asyncio.CancelledError:
            gen.cancel()
            raise
        except Exception as exc:
            if self._is_failure(exc):
                return exc
            raise
