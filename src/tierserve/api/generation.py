"""Running admitted requests to their answers, shared by chat and completions: all choices'
deltas merged as they come, a non-streamed answer collected, a streamed one as server-sent
events.

A streamed response is an async generator over the engine's deltas; when the client goes away,
Starlette stops iterating it and the engine aborts the request at once, freeing its KV blocks.
A non-streamed response watches for the disconnect itself, to the same end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse

from tierserve.admission.ttft import SLA_UNREACHABLE
from tierserve.api.drain import SHUTDOWN_ERROR
from tierserve.api.errors import APIError
from tierserve.api.state import Prepared, ServerState
from tierserve.api.tenancy import SERVED_TIER
from tierserve.engine.async_engine import AsyncEngine, StreamDelta

log = logging.getLogger("tierserve.api")


def server_state(http: HTTPRequest) -> ServerState:
    return http.app.state.tierserve


def response_base(state: ServerState, prep: Prepared, model: str | None) -> dict:
    return {
        "id": prep.request_id,
        "created": int(time.time()),
        "model": model or state.settings.served_model_names[0],
        "service_tier": SERVED_TIER[prep.resolution.priority],
    }


async def merged(engine: AsyncEngine, prep: Prepared) -> AsyncIterator[tuple[int, StreamDelta]]:
    """Deltas of all choices, tagged with their index, as they come."""
    if len(prep.streams) == 1:
        async for d in engine.deltas(prep.streams[0]):
            yield 0, d
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        async for d in engine.deltas(stream):
            await q.put((i, d))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(prep.streams)]
    try:
        done = 0
        while done < len(tasks):
            i, d = await q.get()
            done += d.finished
            yield i, d
    finally:
        for t in tasks:
            t.cancel()


def usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error_status(error: str | None, reason: str | None) -> int:
    if error and (error.startswith(("shed", SLA_UNREACHABLE)) or error == SHUTDOWN_ERROR):
        return 503  # with Retry-After
    return 400 if reason == "error" and error and "context" in error else 500


def _error_kind(error: str | None) -> tuple[str, str | None]:
    """(OpenAI error type, code) of a request the engine ended with `error`."""
    if error and error.startswith(SLA_UNREACHABLE):  # ended early: its SLA became unreachable
        return "resource_exhausted", SLA_UNREACHABLE
    if error and error.startswith("shed"):
        return "resource_exhausted", None
    return "server_error", None


class Choice:
    def __init__(self) -> None:
        self.text, self.tokens, self.logprobs, self.top_logprobs = "", [], [], []
        self.prompt_logprobs: list | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.retry_after_s: float | None = None
        self.completion_tokens = 0


async def collect(state: ServerState, http: HTTPRequest, prep: Prepared) -> list[Choice]:
    """Run a non-streamed request to the end, aborting it if the client disconnects."""
    choices = [Choice() for _ in prep.requests]

    async def run():
        async for i, d in merged(state.engine, prep):
            c = choices[i]
            c.text += d.text
            c.tokens += d.token_ids
            c.logprobs += d.logprobs
            c.top_logprobs += d.top_logprobs
            if d.prompt_logprobs is not None:
                c.prompt_logprobs = d.prompt_logprobs
            c.completion_tokens = d.num_output_tokens
            if d.finished:
                c.finish_reason, c.error, c.retry_after_s = (
                    d.finish_reason,
                    d.error,
                    d.retry_after_s,
                )

    task = asyncio.create_task(run())
    while not task.done():
        await asyncio.wait({task}, timeout=0.5)
        if not task.done() and await http.is_disconnected():
            task.cancel()
            raise APIError(499, "client disconnected")
    await task
    for c in choices:
        if c.error and c.finish_reason == "error":
            kind, code = _error_kind(c.error)
            raise APIError(
                _error_status(c.error, c.finish_reason),
                c.error,
                kind,
                code=code,
                retry_after_s=c.retry_after_s,
            )
    return choices


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


# make_choice(index, delta, first) -> the chunk's choice, or None to send nothing for it now.
MakeChoice = Callable[[int, StreamDelta, bool], "dict | None"]


def stream(state, prep: Prepared, chunk: dict, body, n_prompt: int, make_choice: MakeChoice):
    """Server-sent events: one chunk per delta (built by `make_choice`), an error event if a
    choice fails, the usage chunk when asked for, then [DONE]."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events():
        started, totals = set(), {}
        try:
            async for i, d in merged(state.engine, prep):
                if d.finished and d.finish_reason == "error":
                    kind, code = _error_kind(d.error)
                    err = {"message": d.error, "type": kind}
                    yield _sse({"error": err | ({"code": code} if code else {})})
                    break
                totals[i] = d.num_output_tokens
                choice = make_choice(i, d, i not in started)
                if choice is not None:
                    yield _sse({**chunk, "choices": [choice]})
                    started.add(i)
            if include_usage:
                yield _sse({**chunk, "choices": [], "usage": usage(n_prompt, sum(totals.values()))})
        except Exception:  # the status line is sent: end the stream with an error event
            log.exception("stream %s failed", prep.request_id)
            msg = f"internal server error (request id {prep.request_id})"
            yield _sse({"error": {"message": msg, "type": "server_error"}})
        yield _sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream", headers=prep.headers)
