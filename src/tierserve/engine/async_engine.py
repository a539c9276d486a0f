"""AsyncEngine: runs EngineCore in its own thread beside the asyncio event loop; the local
``EngineClient`` (engine/client.py).

The two threads share no live mutable state. The event loop sends typed commands
(engine/commands.py: add, abort, fail, shed) through a queue and reads two things: each request's
``Stream`` of deltas, filled with ``loop.call_soon_threadsafe``, and the latest
``EngineSnapshot``, which the engine thread publishes after every step, every batch of commands
and every idle tick (admission control reads it through ``view``, engine/queue_view.py). A
request crosses as a frozen ``EngineRequest``; the engine thread builds its own ``Request`` and
owns it, with the scheduler, the output processor (detokenizer, stop strings) and its table of
live requests. The event loop owns its own counters (submitted requests, streams still open).
Observers run on the engine thread and receive typed events (engine/events.py).

So ``/health`` and ``/metrics`` answer promptly while the engine is saturated, an abort (client
gone) takes effect before the next step, and admission control never iterates a dict that the
engine thread is changing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable

from tierserve.core.limits import RequestLimits
from tierserve.engine.client import EngineDeadError
from tierserve.engine.commands import Abort, Add, Command, Fail, Shed
from tierserve.engine.core import EngineCore, StepStats
from tierserve.engine.events import (
    Added,
    EndedLate,
    EngineEvent,
    ErrorKind,
    Finished,
    FirstToken,
    RequestInfo,
    StreamDelta,
    Tokens,
)
from tierserve.engine.load import LateRequestCheck
from tierserve.engine.output_processor import OutputProcessor
from tierserve.engine.queue_view import SnapshotQueueView
from tierserve.engine.snapshot import EngineSnapshot, take_snapshot
from tierserve.engine.streams import LiveRequest, LocalStream, Outbox
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import EngineRequest, Request

__all__ = ["AsyncEngine", "EngineDeadError", "LocalStream", "StreamDelta"]

log = logging.getLogger("tierserve.engine")

IDLE_TICK_S = 0.1


class AsyncEngine:
    def __init__(
        self,
        core: EngineCore,
        tokenizer: ChatTokenizer,
        on_event: Callable[[EngineEvent], None] | None = None,
        on_step: Callable[[StepStats], None] | None = None,
        on_snapshot: Callable[[EngineSnapshot], None] | None = None,
    ) -> None:
        self.core = core
        self.clock = core.clock
        self.tokenizer = tokenizer
        self.limits: RequestLimits = core.scheduler.limits  # immutable
        self._proc = OutputProcessor(tokenizer)
        self._cmds: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Set by submit() for a P0 request: read between two layers of a step in flight, where
        # the engine thread may run a cut-in step for it (core/cut_in.py).
        self._urgent = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierserve-engine", daemon=True)
        self.set_observers(on_event, on_step, on_snapshot)
        # Set before start: the SLA re-check of waiting requests, run on the engine thread, and
        # whether snapshots carry the TTFT predictor's load (O(waiting) each: SLA admission).
        self.recheck: LateRequestCheck | None = None
        self.publish_load = True
        self.on_thread_start: Callable[[], None] | None = None  # first, on the engine thread
        self.on_thread_stop: Callable[[], None] | None = None  # last, when stopped (not crashed)
        self.heartbeat = time.monotonic()
        self.error: BaseException | None = None
        # Hand-over between submit() and a crashing engine thread: a request is either queued
        # before the engine is marked dead (and failed by the crash handler) or refused.
        self._handover = threading.Lock()
        # Engine thread only.
        self._live: dict[str, LiveRequest] = {}
        self._outbox = Outbox(self._deliver)
        self._intake = [0] * NUM_PRIORITIES
        self._intake_tokens = [0] * NUM_PRIORITIES
        self._sheds = 0
        self._seq = 0
        self._deferred: list[Command] = []  # commands a cut-in left for after the step
        # Event loop only: admission's QueueView (snapshot + submitted counters), open streams.
        self.view = SnapshotQueueView(lambda: self.snapshot)
        self._open: set[str] = set()
        self.snapshot: EngineSnapshot = take_snapshot(core, 0)
        watch = getattr(core.executor, "watch", None)
        if watch is not None:  # a tensor-parallel worker that ends wakes the engine to stop
            watch(lambda _why: self._wake.set())

    def set_observers(
        self,
        on_event: Callable[[EngineEvent], None] | None,
        on_step: Callable[[StepStats], None] | None,
        on_snapshot: Callable[[EngineSnapshot], None] | None = None,
    ) -> None:
        """Install callbacks (before start); they run on the engine thread. `on_event` hears
        every request event (engine/events.py), `on_step` each step that ran something."""
        self._on_event = on_event or (lambda event: None)
        self._on_step = on_step or (lambda stats: None)
        self._on_snapshot = on_snapshot or (lambda snap: None)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def num_in_flight(self) -> int:
        """Streams submitted whose terminal delta has not reached the event loop yet."""
        return len(self._open)

    def p0_prompts_waiting(self) -> bool:
        """Whether P0 requests wait for their prompt to be taken into a step (the published
        snapshot and the command queue; event loop): the door holds less urgent door work
        meanwhile (api/door.py), as it shares this process's cores with the engine thread."""
        return self.view.prompts_waiting(Priority.P0) > 0

    def in_flight_ids(self) -> list[str]:
        """Their request ids, sorted (event loop only)."""
        return sorted(self._open)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Abort whatever is still in flight and stop the engine thread (it drains these
        aborts before it exits)."""
        for rid in list(self._open):
            self.abort(rid, "server shutting down")
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif self.error is None:  # never started: nobody else will drain the queue
            self._drain_commands()

    # -- requests (called on the event loop) ------------------------------------------------
    def submit(self, request: EngineRequest) -> LocalStream:
        """Hand `request` to the engine now (counted by admission control from this moment);
        read its deltas from the stream. Raises EngineDeadError if the engine has stopped."""
        if not isinstance(request, EngineRequest):  # a live Request must not cross the thread
            raise TypeError(f"submit takes an EngineRequest, not {type(request).__name__}")
        stream = LocalStream(self, request)
        with self._handover:
            if self.error is not None:
                raise EngineDeadError(f"the engine has stopped: {self.error!r}")
            self.view.on_submit(request)
            self._open.add(request.request_id)
            self._send(Add(stream))
            if request.priority == Priority.P0:
                self._urgent.set()
        return stream

    def generate(self, request: EngineRequest) -> AsyncIterator[StreamDelta]:
        """``submit`` and the stream's deltas (no wrapper: closing them closes the stream's)."""
        return self.submit(request).deltas()

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        self._send(Abort(request_id, reason))

    def fail(self, request_id: str, kind: ErrorKind, reason: str) -> None:
        """End a request with an error; its client is told why."""
        self._send(Fail(request_id, kind, reason))

    def shed(self, below: Priority, reason: str) -> None:
        """Fail the waiting request to shed first among classes less urgent than `below`
        (admission made room for a more urgent request)."""
        self.view.on_shed()
        self._send(Shed(below, reason))

    def _send(self, cmd: Command) -> None:
        self._cmds.put(cmd)
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.on_thread_start is not None:
                self.on_thread_start()
            if self.core.scheduler.config.p0_cut_in:
                self.core.set_layer_hook(self._between_layers)
            while True:
                self.heartbeat = time.monotonic()
                self.core.check_executor()
                news = self._drain_commands()
                if self._stop.is_set():
                    self.core.set_layer_hook(None)
                    self._publish()
                    if self.on_thread_stop is not None:
                        self.on_thread_stop()
                    return
                news = self._end_late() or news
                if self.core.has_unfinished():
                    changed = self.core.step()
                    if self.core.last_stats is not None:
                        self._on_step(self.core.last_stats)
                    self._dispatch(changed)
                    self._publish()
                    if self.core.last_stats is None and not changed:
                        self._idle()  # nothing could run: wait for news, do not spin
                else:
                    if news:
                        self._publish()
                    self._idle()
        except BaseException as exc:  # the engine is broken: fail everyone, loudly
            log.exception("engine thread crashed")
            with self._handover:
                self.error = exc
            why = f"engine error: {exc!r}"
            self._drain_commands(failing=why)
            for rid in list(self._live):
                self._finish_stream(rid, "error", why, ErrorKind.ENGINE)
            self._outbox.flush()

    def _between_layers(self) -> None:
        """Between two decoder layers of a step in flight, on the engine thread: when a P0
        request was submitted, take in the queued requests (other commands wait for the step's
        end: an abort must not free blocks the stopped step writes) and run a cut-in step for
        the waiting P0 requests; their tokens go out at once."""
        if not self._urgent.is_set():  # (never called inside a cut-in: EngineCore's guard)
            return
        self._urgent.clear()
        self._drain_commands(adds_only=True)
        changed, stats = self.core.cut_in()
        if stats is not None:
            self._on_step(stats)
        if changed:
            self._dispatch(changed)

    def _end_late(self) -> bool:
        """End the waiting requests the SLA re-check finds late (events EndedLate, then
        Finished); the re-check paces itself."""
        late = self.recheck.poll(self.core) if self.recheck else []
        for req, late_s, message in late:
            if self.core.fail_request(req.request_id, message) is not None:
                self._on_event(EndedLate(RequestInfo.of(req), late_s))
                self._on_event(Finished(RequestInfo.of(req)))
                kind = ErrorKind.SLA_UNREACHABLE
                self._finish_stream(req.request_id, "error", message, kind, retry_after_s=late_s)
        return bool(late)

    def _idle(self) -> None:
        if not self._wake.wait(IDLE_TICK_S):
            self._publish()  # the idle tick: gauges stay fresh while nothing happens
        self._wake.clear()

    def _publish(self) -> None:
        self._seq += 1
        snap = take_snapshot(
            self.core,
            self._seq,
            tuple(self._intake),
            tuple(self._intake_tokens),
            self._sheds,
            with_load=self.publish_load,
        )
        self.snapshot = snap  # one reference swap: readers see the old or the new, whole
        self._on_snapshot(snap)

    def _drain_commands(self, failing: str | None = None, adds_only: bool = False) -> bool:
        """Carry out queued commands; with `failing`, refuse every queued request instead
        (the engine is dead); with `adds_only` (inside a step), keep the others for later, in
        order. Returns whether there were any."""
        news = False
        if not adds_only and self._deferred:
            deferred, self._deferred = self._deferred, []
            for cmd in deferred:
                self._carry_out(cmd, failing)
            news = True
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                self._outbox.flush()
                return news
            news = True
            if adds_only and not isinstance(cmd, Add):
                self._deferred.append(cmd)
            else:
                self._carry_out(cmd, failing)

    def _carry_out(self, cmd: Command, failing: str | None) -> None:
        core = self.core
        match cmd:
            case Add(stream):
                self._add(stream, failing)
            case Abort(rid, reason):
                self._ended(core.abort_request(rid, reason))
                self._finish_stream(rid, "abort", reason)
            case Fail(rid, kind, reason):
                self._ended(core.fail_request(rid, reason))
                self._finish_stream(rid, "error", reason, kind)
            case Shed(below, reason):
                self._sheds += 1
                req = core.shed_lowest(below, reason)
                self._ended(req)
                if req is not None:
                    self._finish_stream(req.request_id, "error", reason, ErrorKind.SHED)
            case _:
                raise TypeError(f"unknown engine command {cmd!r}")

    def _ended(self, req: Request | None) -> None:
        if req is not None:
            self._on_event(Finished(RequestInfo.of(req)))

    def _add(self, stream: LocalStream, failing: str | None) -> None:
        req = stream.request.to_request()
        rid = req.request_id
        self._live[rid] = LiveRequest(stream, req)
        self._intake[req.priority] += 1
        self._intake_tokens[req.priority] += req.num_prompt_tokens
        if failing is not None:
            self._finish_stream(rid, "error", failing, ErrorKind.ENGINE)
            return
        try:
            self.core.add_request(req)
        except ValueError as exc:
            self._finish_stream(rid, "error", str(exc), ErrorKind.INVALID)
            return
        self._proc.add(req)
        self._on_event(Added(RequestInfo.of(req)))

    def _dispatch(self, changed: list[Request]) -> None:
        now = self.core.clock.now()
        for req in changed:
            live = self._live.get(req.request_id)
            if live is None:
                continue
            new = live.new_tokens()
            if new:
                info = RequestInfo.of(req)
                first = live.sent_tokens == 0
                self._on_event(FirstToken(info, now) if first else Tokens(info, len(new), now))
            text, stopped = self._proc.process(req, new, req.is_finished)
            if stopped and not req.is_finished:
                self.core.finish_request(req.request_id, "stop")
            if stopped:  # tokens after the one that completed the stop string (several came
                # in one step: speculative decoding) are not output
                req.truncate_output(self._proc.consumed(req.request_id))
            delta = live.delta(text)
            if delta.finished:
                self._on_event(Finished(RequestInfo.of(req)))
                self._close(req.request_id)
            self._outbox.put(live.stream, delta)
        self._outbox.flush()

    def _finish_stream(
        self,
        rid: str,
        reason: str,
        error: str | None,
        kind: ErrorKind | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        live = self._live.get(rid)
        if live is not None:
            self._close(rid)
            self._outbox.put(live.stream, live.last_delta(reason, error, kind, retry_after_s))

    def _close(self, rid: str) -> None:
        self._live.pop(rid, None)
        self._proc.remove(rid)

    def _deliver(self, items: list[tuple[LocalStream, StreamDelta]]) -> None:
        """On the event loop: hand deltas to their readers; a terminal one closes its stream."""
        for stream, delta in items:
            stream.queue.put_nowait(delta)
            if delta.finished:
                stream.done = True
                self._open.discard(stream.request.request_id)
