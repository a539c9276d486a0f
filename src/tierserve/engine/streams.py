"""The local engine's side of its streams: the event loop's ``LocalStream`` handle, the engine
thread's ``LiveRequest`` (its own ``Request`` and what its stream has been sent), and the
``Outbox`` that hands a step's deltas to the event loop(s) in one wake-up per loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.engine.client import Stream
from tierserve.engine.events import ErrorKind, StreamDelta
from tierserve.request import EngineRequest, Request

if TYPE_CHECKING:
    from tierserve.engine.async_engine import AsyncEngine


class LocalStream(Stream):
    """A stream of this process's engine (event loop only); cancelling it sends an abort."""

    def __init__(self, engine: AsyncEngine, request: EngineRequest) -> None:
        super().__init__(request)
        self.loop = asyncio.get_running_loop()
        self._engine = engine

    def _cancel(self, reason: str) -> None:
        self._engine.abort(self.request.request_id, reason)


@dataclass
class LiveRequest:
    """A request in the engine (engine thread only): its own Request and its stream."""

    stream: LocalStream
    request: Request
    sent_tokens: int = 0
    sent_prompt_logprobs: bool = False

    def new_tokens(self) -> list[int]:
        return self.request.output_token_ids[self.sent_tokens :]

    def delta(self, text: str) -> StreamDelta:
        """The delta of what the request gained since the last one (now counted as sent),
        terminal if it has finished."""
        req, sent = self.request, self.sent_tokens
        self.sent_tokens = req.num_output_tokens
        delta = StreamDelta(
            text=text,
            token_ids=req.output_token_ids[sent:],
            logprobs=req.output_logprobs[sent:],
            top_logprobs=req.output_top_logprobs[sent:],
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
            num_draft_tokens=req.num_draft_tokens,
            num_accepted_tokens=req.num_accepted_tokens,
        )
        wants = req.sampling_params.prompt_logprobs is not None
        if wants and not self.sent_prompt_logprobs and req.prompt_logprobs_done:
            delta.prompt_logprobs = list(req.prompt_logprobs)
            self.sent_prompt_logprobs = True
        if req.is_finished:
            delta.finished = True
            delta.finish_reason = req.finish_reason.value if req.finish_reason else None
            delta.error = req.error
            if req.error is not None:  # failed in a step (the executor)
                delta.error_kind = ErrorKind.ENGINE
        return delta

    def last_delta(
        self, reason: str, error: str | None, kind: ErrorKind | None, retry_after_s: float | None
    ) -> StreamDelta:
        """The terminal delta of a request ended outside a step (abort, fail, shed, crash)."""
        return StreamDelta(
            finished=True,
            finish_reason=reason,
            error=error,
            num_prompt_tokens=self.request.num_prompt_tokens,
            num_output_tokens=self.request.num_output_tokens,
            retry_after_s=retry_after_s,
            error_kind=kind,
        )


class Outbox:
    """Deltas collected on the engine thread, handed over by ``flush``: one
    ``call_soon_threadsafe`` per event loop for the whole step, not one per request."""

    def __init__(self, deliver: Callable[[list[tuple[LocalStream, StreamDelta]]], None]) -> None:
        self._deliver = deliver
        self._items: dict[asyncio.AbstractEventLoop, list] = {}

    def put(self, stream: LocalStream, delta: StreamDelta) -> None:
        self._items.setdefault(stream.loop, []).append((stream, delta))

    def flush(self) -> None:
        items, self._items = self._items, {}
        for loop, batch in items.items():
            # A closed event loop raises RuntimeError: nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._deliver, batch)
