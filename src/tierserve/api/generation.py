"""Running admitted requests to their answers, shared by chat and completions: all choices'
deltas merged as they come, a non-streamed answer collected, a streamed one as server-sent
events.

Every reader runs inside ``async with prep`` (api/state.py ``Prepared``): however it leaves --
the client went away, a choice failed, an exception -- the exit cancels the choices still
running, and the engine aborts them at once, freeing their KV blocks. A streamed response also
closes them from Starlette's background task, which runs after the response even when the
client's disconnect cancelled it between two events. A non-streamed response watches for the
disconnect itself, to the same end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from tierserve.api.caller import Caller
from tierserve.api.errors import ENGINE_ERRORS, APIError, engine_error
from tierserve.api.state import Prepared, ServerState
from tierserve.api.tenancy import SERVED_TIER
from tierserve.engine.events import ErrorKind, StreamDelta

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


async def merged(prep: Prepared) -> AsyncIterator[tuple[int, StreamDelta]]:
    """Deltas of all choices, tagged with their index, as they come (read inside
    ``async with prep``)."""
    if len(prep.streams) == 1:
        async for d in prep.streams[0].deltas():
            yield 0, d
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        async for d in stream.deltas():
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


def usage(prompt: int, completion: int, drafted: int = 0, accepted: int = 0) -> dict:
    """OpenAI's usage; with speculative decoding, its predicted-output details too (draft
    tokens accepted and rejected)."""
    out = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if drafted:
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        }
    return out


def spec_usage(choices) -> tuple[int, int]:
    return sum(c.num_draft_tokens for c in choices), sum(c.num_accepted_tokens for c in choices)


def error_event(d: StreamDelta) -> dict:
    """The server-sent error event of a choice the engine ended with an error."""
    _status, typ, code = ENGINE_ERRORS[d.error_kind or ErrorKind.ENGINE]
    return {"error": {"message": d.error, "type": typ} | ({"code": code} if code else {})}


class Choice:
    def __init__(self) -> None:
        self.text, self.tokens, self.logprobs, self.top_logprobs = "", [], [], []
        self.prompt_logprobs: list | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.error_kind: ErrorKind | None = None
        self.retry_after_s: float | None = None
        self.completion_tokens = 0
        self.num_draft_tokens = self.num_accepted_tokens = 0


async def collect(state: ServerState, caller: Caller, prep: Prepared) -> list[Choice]:
    """Run a non-streamed request to the end, aborting it if the client disconnects."""
    choices = [Choice() for _ in prep.requests]

    async def run():
        async for i, d in merged(prep):
            c = choices[i]
            c.text += d.text
            c.tokens += d.token_ids
            c.logprobs += d.logprobs
            c.top_logprobs += d.top_logprobs
            if d.prompt_logprobs is not None:
                c.prompt_logprobs = d.prompt_logprobs
            c.completion_tokens = d.num_output_tokens
            c.num_draft_tokens, c.num_accepted_tokens = d.num_draft_tokens, d.num_accepted_tokens
            if d.finished:
                c.finish_reason, c.error, c.retry_after_s = (
                    d.finish_reason,
                    d.error,
                    d.retry_after_s,
                )
                c.error_kind = d.error_kind

    async with prep:
        task = asyncio.create_task(run())
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if not task.done() and await caller.disconnected():
                task.cancel()
                raise APIError(499, "client disconnected")
        await task
    for c in choices:
        if c.error and c.finish_reason == "error":
            raise engine_error(c.error_kind, c.error, c.retry_after_s)
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
        started, totals, spec = set(), {}, {}
        try:
            async with prep:  # a failed choice ends the response: the others are cancelled
                async for i, d in merged(prep):
                    if d.finished and d.finish_reason == "error":
                        yield _sse(error_event(d))
                        break
                    totals[i] = d.num_output_tokens
                    spec[i] = (d.num_draft_tokens, d.num_accepted_tokens)
                    choice = make_choice(i, d, i not in started)
                    if choice is not None:
                        yield _sse({**chunk, "choices": [choice]})
                        started.add(i)
            if include_usage:
                drafted = sum(v[0] for v in spec.values())
                accepted = sum(v[1] for v in spec.values())
                total = usage(n_prompt, sum(totals.values()), drafted, accepted)
                yield _sse({**chunk, "choices": [], "usage": total})
        except Exception:  # the status line is sent: end the stream with an error event
            log.exception("stream %s failed", prep.request_id)
            msg = f"internal server error (request id {prep.request_id})"
            yield _sse({"error": {"message": msg, "type": "server_error"}})
        yield _sse("[DONE]")

    async def close() -> None:  # after the response, however it ended (on the event loop)
        prep.close()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers=prep.headers,
        background=BackgroundTask(close),
    )
