"""AsyncEngine: runs EngineCore in its own thread beside the asyncio event loop.

The two threads share no live mutable state. The event loop sends commands (add, abort, fail,
shed) through a queue and reads two things: each request's ``asyncio.Queue`` of deltas, filled
with ``loop.call_soon_threadsafe``, and the latest ``EngineSnapshot``, which the engine thread
publishes after every step, every batch of commands and every idle tick (admission control reads
it through ``view``, engine/queue_view.py). The engine thread owns
the scheduler, the output processor (detokenizer, stop strings) and its table of streams; the
event loop owns its own counters (submitted requests, streams still open).

So ``/health`` and ``/metrics`` answer promptly while the engine is saturated, an abort (client
gone) takes effect before the next step, and admission control never iterates a dict that the
engine thread is changing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tierserve.core.limits import RequestLimits
from tierserve.core.outputs import TopLogprobs
from tierserve.engine.core import EngineCore, StepStats
from tierserve.engine.load import LateRequestCheck
from tierserve.engine.output_processor import OutputProcessor
from tierserve.engine.queue_view import SnapshotQueueView
from tierserve.engine.snapshot import EngineSnapshot, take_snapshot
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request

log = logging.getLogger("tierserve.engine")

IDLE_TICK_S = 0.1


class EngineDeadError(RuntimeError):
    """The engine thread is not running: nothing can be submitted."""


@dataclass
class StreamDelta:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    retry_after_s: float | None = None  # an error the client may retry: when
    top_logprobs: list[TopLogprobs] = field(default_factory=list)  # with top_logprobs > 0
    # With prompt_logprobs: prompt tokens 1, 2, ... as (logprob, top or None), once, in the
    # first delta after the prompt is computed.
    prompt_logprobs: list | None = None


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    request: Request
    sent_tokens: int = 0  # engine thread only
    sent_prompt_logprobs: bool = False  # engine thread only


class AsyncEngine:
    def __init__(
        self,
        core: EngineCore,
        tokenizer: ChatTokenizer,
        on_event: Callable[[str, Request], None] | None = None,
        on_step: Callable[[StepStats], None] | None = None,
        on_snapshot: Callable[[EngineSnapshot], None] | None = None,
        on_tokens: Callable[[Request, int, float], None] | None = None,
    ) -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.limits: RequestLimits = core.scheduler.limits  # immutable
        self._proc = OutputProcessor(tokenizer)
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierserve-engine", daemon=True)
        self.set_observers(on_event, on_step, on_snapshot, on_tokens)
        # Set before start: the SLA re-check of waiting requests, run on the engine thread, and
        # whether snapshots carry the TTFT predictor's load (O(waiting) each: SLA admission).
        self.recheck: LateRequestCheck | None = None
        self.publish_load = True
        self.on_thread_start: Callable[[], None] | None = None  # first, on the engine thread
        self.heartbeat = time.monotonic()
        self.error: BaseException | None = None
        # Hand-over between submit() and a crashing engine thread: a request is either queued
        # before the engine is marked dead (and failed by the crash handler) or refused.
        self._handover = threading.Lock()
        # Engine thread only.
        self._streams: dict[str, _Stream] = {}
        self._outbox: dict[asyncio.AbstractEventLoop, list] = {}
        self._intake = [0] * NUM_PRIORITIES
        self._intake_tokens = [0] * NUM_PRIORITIES
        self._sheds = 0
        self._seq = 0
        # Event loop only: admission's QueueView (snapshot + submitted counters), open streams.
        self.view = SnapshotQueueView(lambda: self.snapshot)
        self._open: set[str] = set()
        self.snapshot: EngineSnapshot = take_snapshot(core, 0)

    def set_observers(
        self,
        on_event: Callable[[str, Request], None] | None,
        on_step: Callable[[StepStats], None] | None,
        on_snapshot: Callable[[EngineSnapshot], None] | None = None,
        on_tokens: Callable[[Request, int, float], None] | None = None,
    ) -> None:
        """Install callbacks (before start); they run on the engine thread. `on_event` hears
        "added" and "finished"; `on_tokens(request, n, now)` hears of new output tokens as
        they are handed to the request's stream."""
        self._on_event = on_event or (lambda kind, req: None)
        self._on_step = on_step or (lambda stats: None)
        self._on_snapshot = on_snapshot or (lambda snap: None)
        self._on_tokens = on_tokens or (lambda req, n, now: None)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def num_in_flight(self) -> int:
        """Streams submitted whose terminal delta has not reached the event loop yet."""
        return len(self._open)

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
    def submit(self, request: Request) -> _Stream:
        """Hand `request` to the engine now (counted by admission control from this moment);
        read its deltas with ``deltas``. Raises EngineDeadError if the engine has stopped."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), request)
        with self._handover:
            if self.error is not None:
                raise EngineDeadError(f"the engine has stopped: {self.error!r}")
            self.view.on_submit(request)
            self._open.add(request.request_id)
            self._send(("add", stream))
        return stream

    async def deltas(self, stream: _Stream) -> AsyncIterator[StreamDelta]:
        """Yield a submitted request's deltas until it ends. Leaving early (client gone, task
        cancelled) aborts the request and frees its KV."""
        done = False
        try:
            while True:
                delta: StreamDelta = await stream.queue.get()
                done = delta.finished
                yield delta
                if done:
                    return
        finally:
            if not done:
                self.abort(stream.request.request_id, "client disconnected")

    async def generate(self, request: Request) -> AsyncIterator[StreamDelta]:
        """``submit`` + ``deltas``."""
        async for d in self.deltas(self.submit(request)):
            yield d

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        self._send(("abort", request_id, reason))

    def fail(self, request_id: str, reason: str) -> None:
        """End a request with an error; its client is told why."""
        self._send(("fail", request_id, reason))

    def shed(self, below: Priority, reason: str) -> None:
        """Fail the waiting request to shed first among classes less urgent than `below`
        (admission made room for a more urgent request)."""
        self.view.on_shed()
        self._send(("shed", below, reason))

    def _send(self, cmd: tuple) -> None:
        self._cmds.put(cmd)
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.on_thread_start is not None:
                self.on_thread_start()
            while True:
                self.heartbeat = time.monotonic()
                news = self._drain_commands()
                if self._stop.is_set():
                    self._publish()
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
            self._drain_commands(failing=f"engine error: {exc!r}")
            for rid in list(self._streams):
                self._finish_stream(rid, "error", f"engine error: {exc!r}")
            self._flush()

    def _end_late(self) -> bool:
        """End the waiting requests the SLA re-check finds late (events "ended_late", then
        "finished"); the re-check paces itself."""
        late = self.recheck.poll(self.core) if self.recheck else []
        for req, late_s, message in late:
            if self.core.fail_request(req.request_id, message) is not None:
                self._on_event("ended_late", req)
                self._on_event("finished", req)
                self._finish_stream(req.request_id, "error", message, retry_after_s=late_s)
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

    def _drain_commands(self, failing: str | None = None) -> bool:
        """Carry out queued commands; with `failing`, refuse every queued request instead
        (the engine is dead). Returns whether there were any."""
        news = False
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                self._flush()
                return news
            news = True
            kind = cmd[0]
            if kind == "add":
                self._add(cmd[1], failing)
            elif kind in ("abort", "fail"):
                rid, reason = cmd[1], cmd[2]
                end = self.core.abort_request if kind == "abort" else self.core.fail_request
                req = end(rid, reason)
                if req is not None:
                    self._on_event("finished", req)
                self._finish_stream(rid, "abort" if kind == "abort" else "error", reason)
            elif kind == "shed":
                self._sheds += 1
                req = self.core.shed_lowest(cmd[1], cmd[2])
                if req is not None:
                    self._on_event("finished", req)
                    self._finish_stream(req.request_id, "error", cmd[2])

    def _add(self, stream: _Stream, failing: str | None) -> None:
        req = stream.request
        self._streams[req.request_id] = stream
        self._intake[req.priority] += 1
        self._intake_tokens[req.priority] += req.num_prompt_tokens
        if failing is not None:
            self._finish_stream(req.request_id, "error", failing)
            return
        try:
            self.core.add_request(req)
        except ValueError as exc:
            self._finish_stream(req.request_id, "error", str(exc))
            return
        self._proc.add(req)
        self._on_event("added", req)

    def _dispatch(self, changed: list[Request]) -> None:
        now = self.core.clock.now()
        for req in changed:
            stream = self._streams.get(req.request_id)
            if stream is None:
                continue
            new = req.output_token_ids[stream.sent_tokens :]
            new_lp = req.output_logprobs[stream.sent_tokens :]
            new_top = req.output_top_logprobs[stream.sent_tokens :]
            if new:
                self._on_tokens(req, len(new), now)
            stream.sent_tokens = req.num_output_tokens
            text, stopped = self._proc.process(req, new, req.is_finished)
            if stopped and not req.is_finished:
                self.core.finish_request(req.request_id, "stop")
            delta = StreamDelta(
                text=text,
                token_ids=list(new),
                logprobs=list(new_lp),
                top_logprobs=list(new_top),
                num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=req.num_output_tokens,
            )
            wants = req.sampling_params.prompt_logprobs is not None
            if wants and not stream.sent_prompt_logprobs and req.prompt_logprobs_done:
                delta.prompt_logprobs = list(req.prompt_logprobs)
                stream.sent_prompt_logprobs = True
            if req.is_finished:
                self._on_event("finished", req)
                delta.finished = True
                delta.finish_reason = req.finish_reason.value if req.finish_reason else None
                delta.error = req.error
                self._close(req.request_id)
            self._put(stream, delta)
        self._flush()

    def _finish_stream(
        self, rid: str, reason: str, error: str | None, retry_after_s: float | None = None
    ) -> None:
        stream = self._streams.get(rid)
        if stream is None:
            return
        self._close(rid)
        req = stream.request
        self._put(
            stream,
            StreamDelta(
                finished=True,
                finish_reason=reason,
                error=error,
                num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=req.num_output_tokens,
                retry_after_s=retry_after_s,
            ),
        )

    def _close(self, rid: str) -> None:
        self._streams.pop(rid, None)
        self._proc.remove(rid)

    def _put(self, stream: _Stream, delta: StreamDelta) -> None:
        self._outbox.setdefault(stream.loop, []).append((stream, delta))

    def _flush(self) -> None:
        """Hand the outbox to the event loop(s): one wake-up per loop for the whole step, not
        one per request."""
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            # A closed event loop raises RuntimeError: nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._deliver, items)

    def _deliver(self, items: list[tuple[_Stream, StreamDelta]]) -> None:
        """On the event loop: hand deltas to their readers; a terminal one closes its stream."""
        for stream, delta in items:
            stream.queue.put_nowait(delta)
            if delta.finished:
                self._open.discard(stream.request.request_id)
