"""AsyncEngine: runs EngineCore in its own thread beside the asyncio event loop.

The event loop never waits on the model: handlers put commands (add, abort, fail) on a queue and
read per-request ``asyncio.Queue`` streams; the engine thread drains commands between steps,
steps, detokenizes, applies stop strings, and hands deltas back with
``loop.call_soon_threadsafe``. So ``/health`` and ``/metrics`` answer promptly while the engine is
saturated, and an abort (client gone) takes effect before the next step.
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

from tierserve.engine.core import EngineCore, StepStats
from tierserve.engine.output_processor import OutputProcessor
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import Request

log = logging.getLogger("tierserve.engine")


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


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    request: Request
    sent_tokens: int = 0


class AsyncEngine:
    def __init__(
        self,
        core: EngineCore,
        tokenizer: ChatTokenizer,
        on_event: Callable[[str, Request], None] | None = None,
        on_step: Callable[[StepStats], None] | None = None,
    ) -> None:
        self.core = core
        self.tokenizer = tokenizer
        self._proc = OutputProcessor(tokenizer)
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierserve-engine", daemon=True)
        self._on_event = on_event or (lambda kind, req: None)
        self._on_step = on_step or (lambda stats: None)
        self.heartbeat = 0.0
        self.error: BaseException | None = None
        # Submitted but not yet handed to the scheduler, by submitted class: admission control
        # must count these, or a burst slips past the queue limits between two steps.
        self._pending = [0] * NUM_PRIORITIES
        self._pending_tokens = [0] * NUM_PRIORITIES

    # -- queue view for admission control (event loop side) ------------------------------
    def queue_depth(self, priority: Priority) -> int:
        """Requests of `priority` that will have to wait: queued or just submitted, minus the
        running seats still free for them (a burst into an idle server is not a queue)."""
        sched = self.core.scheduler
        own = sched.queue_depth(priority) + self._pending[priority]
        everyone = sum(sched.queue_depth(p) for p in range(NUM_PRIORITIES)) + sum(self._pending)
        free = max(0, sched.config.max_num_seqs - len(sched.running) - (everyone - own))
        return max(0, own - free)

    def queued_tokens(self, priority: Priority) -> int:
        return self.core.scheduler.queued_tokens(priority) + self._pending_tokens[priority]

    def lowest_waiting(self, below: Priority) -> str | None:
        return self.core.scheduler.lowest_waiting(below)

    def set_observers(
        self,
        on_event: Callable[[str, Request], None] | None,
        on_step: Callable[[StepStats], None] | None,
    ) -> None:
        """Install callbacks (before start): request events and per-step stats."""
        self._on_event = on_event or (lambda kind, req: None)
        self._on_step = on_step or (lambda stats: None)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def num_in_flight(self) -> int:
        return len(self._streams)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Abort whatever is still in flight and stop the engine thread (it drains these
        aborts before it exits)."""
        for rid in list(self._streams):
            self.abort(rid, "server shutting down")
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:  # never started: nobody else will drain the queue
            self._drain_commands()

    # -- requests (called on the event loop) ------------------------------------------------
    def submit(self, request: Request) -> _Stream:
        """Hand `request` to the engine now (counted by admission control from this moment);
        read its deltas with ``deltas``. Call from the event loop."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), request)
        self._streams[request.request_id] = stream
        self._pending[request.priority] += 1
        self._pending_tokens[request.priority] += request.num_prompt_tokens
        self._send(("add", request))
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
        """End a request with an error (e.g. shed under overload); its client is told why."""
        self._send(("fail", request_id, reason))

    def _send(self, cmd: tuple) -> None:
        self._cmds.put(cmd)
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self.heartbeat = time.monotonic()
                self._drain_commands()
                if self._stop.is_set():
                    return
                if self.core.has_unfinished():
                    changed = self.core.step()
                    if self.core.last_stats is not None:
                        self._on_step(self.core.last_stats)
                    self._dispatch(changed)
                else:
                    self._wake.wait(0.1)
                    self._wake.clear()
        except BaseException as exc:  # the engine is broken: fail everyone, loudly
            log.exception("engine thread crashed")
            self.error = exc
            for rid in list(self._streams):
                self._finish_stream(rid, "error", f"engine error: {exc!r}")

    def _drain_commands(self) -> None:
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            kind = cmd[0]
            if kind == "add":
                req = cmd[1]
                # From here on the scheduler counts it (or it is refused).
                self._pending[req.priority] -= 1
                self._pending_tokens[req.priority] -= req.num_prompt_tokens
                try:
                    self.core.add_request(req)
                except ValueError as exc:
                    self._finish_stream(req.request_id, "error", str(exc))
                    continue
                self._proc.add(req)
                self._on_event("added", req)
            elif kind in ("abort", "fail"):
                rid, reason = cmd[1], cmd[2]
                end = self.core.abort_request if kind == "abort" else self.core.fail_request
                req = end(rid, reason)
                if req is not None:
                    self._on_event("finished", req)
                self._finish_stream(rid, "abort" if kind == "abort" else "error", reason)

    def _dispatch(self, changed: list[Request]) -> None:
        for req in changed:
            stream = self._streams.get(req.request_id)
            if stream is None:
                continue
            new = req.output_token_ids[stream.sent_tokens :]
            new_lp = req.output_logprobs[stream.sent_tokens :]
            if new and stream.sent_tokens == 0:
                self._on_event("first_token", req)
            stream.sent_tokens = req.num_output_tokens
            text, stopped = self._proc.process(req, new, req.is_finished)
            if stopped and not req.is_finished:
                self.core.finish_request(req.request_id, "stop")
            delta = StreamDelta(
                text=text,
                token_ids=list(new),
                logprobs=list(new_lp),
                num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=req.num_output_tokens,
            )
            if req.is_finished:
                self._on_event("finished", req)
                delta.finished = True
                delta.finish_reason = req.finish_reason.value if req.finish_reason else None
                delta.error = req.error
                self._close(req.request_id)
            self._put(stream, delta)

    def _finish_stream(self, rid: str, reason: str, error: str | None) -> None:
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
            ),
        )

    def _close(self, rid: str) -> None:
        self._streams.pop(rid, None)
        self._proc.remove(rid)

    @staticmethod
    def _put(stream: _Stream, delta: StreamDelta) -> None:
        # A closed event loop raises RuntimeError: nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, delta)
