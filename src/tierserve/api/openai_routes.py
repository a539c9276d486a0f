"""/v1/chat/completions and /v1/completions, streamed (server-sent events) or not.

A streamed response is an async generator over the engine's deltas; when the client goes away,
Starlette stops iterating it and the engine aborts the request at once, freeing its KV blocks.
A non-streamed response watches for the disconnect itself, to the same end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse

from tierserve.admission.ttft import SLA_UNREACHABLE
from tierserve.api.drain import SHUTDOWN_ERROR
from tierserve.api.errors import APIError
from tierserve.api.openapi import COMPLETION_RESPONSES
from tierserve.api.protocol import ChatCompletionRequest, CompletionRequest
from tierserve.api.state import Prepared, ServerState, prepare
from tierserve.engine.async_engine import AsyncEngine, StreamDelta

log = logging.getLogger("tierserve.api")
router = APIRouter()


async def _merged(engine: AsyncEngine, prep: Prepared) -> AsyncIterator[tuple[int, StreamDelta]]:
    """Deltas of all n choices, tagged with their index, as they come."""
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


def _usage(prompt: int, completion: int) -> dict:
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


class _Choice:
    def __init__(self) -> None:
        self.text, self.tokens, self.logprobs = "", [], []
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.retry_after_s: float | None = None
        self.completion_tokens = 0


async def _collect(state: ServerState, http: HTTPRequest, prep: Prepared) -> tuple[list, int]:
    """Run a non-streamed request to the end, aborting it if the client disconnects."""
    choices = [_Choice() for _ in prep.requests]
    prompt_tokens = len(prep.requests[0].prompt_token_ids)

    async def run():
        async for i, d in _merged(state.engine, prep):
            c = choices[i]
            c.text += d.text
            c.tokens += d.token_ids
            c.logprobs += d.logprobs
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
    return choices, prompt_tokens


def _token_text(state: ServerState, tok: int) -> str:
    return state.tokenizer.decode([tok], skip_special_tokens=False)


def _chat_logprobs(state: ServerState, tokens: list[int], lps: list[float]) -> dict:
    content = []
    for t, lp in zip(tokens, lps, strict=False):
        s = _token_text(state, t)
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []})
    return {"content": content}


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def _stream(state, prep: Prepared, chunk: dict, body, n_prompt: int, make_choice):
    """Server-sent events: one chunk per delta (built by `make_choice(index, delta, first)`),
    an error event if a choice fails, the usage chunk when asked for, then [DONE]."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def events():
        started, totals = set(), {}
        try:
            async for i, d in _merged(state.engine, prep):
                if d.finished and d.finish_reason == "error":
                    kind, code = _error_kind(d.error)
                    err = {"message": d.error, "type": kind}
                    yield _sse({"error": err | ({"code": code} if code else {})})
                    break
                yield _sse({**chunk, "choices": [make_choice(i, d, i not in started)]})
                started.add(i)
                totals[i] = d.num_output_tokens
            if include_usage:
                usage = _usage(n_prompt, sum(totals.values()))
                yield _sse({**chunk, "choices": [], "usage": usage})
        except Exception:  # the status line is sent: end the stream with an error event
            log.exception("stream %s failed", prep.request_id)
            msg = f"internal server error (request id {prep.request_id})"
            yield _sse({"error": {"message": msg, "type": "server_error"}})
        yield _sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream", headers=prep.headers)


def _state(http: HTTPRequest) -> ServerState:
    return http.app.state.tierserve


@router.post("/v1/chat/completions", responses=COMPLETION_RESPONSES)
async def chat_completions(body: ChatCompletionRequest, http: HTTPRequest):
    state = _state(http)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        prompt_ids = state.tokenizer.encode_chat(messages)
    except ValueError as exc:
        raise APIError(400, f"cannot apply the chat template: {exc}") from None
    prep = prepare(
        state, http, body, prompt_ids, body.max_completion_tokens or body.max_tokens, "chatcmpl"
    )
    if isinstance(prep, JSONResponse):
        return prep
    created, model = int(time.time()), body.model or state.settings.served_model_names[0]
    base = {"id": prep.request_id, "created": created, "model": model}
    if body.stream:

        def chat_choice(i: int, d: StreamDelta, first: bool) -> dict:
            delta = {"role": "assistant"} if first else {}
            if d.text:
                delta["content"] = d.text
            choice = {
                "index": i,
                "delta": delta,
                "logprobs": None,
                "finish_reason": d.finish_reason if d.finished else None,
            }
            if body.logprobs and d.token_ids:
                choice["logprobs"] = _chat_logprobs(state, d.token_ids, d.logprobs)
            return choice

        chunk = {**base, "object": "chat.completion.chunk"}
        return _stream(state, prep, chunk, body, len(prompt_ids), chat_choice)
    choices, n_prompt = await _collect(state, http, prep)
    out = []
    for i, c in enumerate(choices):
        item = {
            "index": i,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        if body.logprobs:
            item["logprobs"] = _chat_logprobs(state, c.tokens, c.logprobs)
        out.append(item)
    usage = _usage(n_prompt, sum(c.completion_tokens for c in choices))
    return JSONResponse(
        {**base, "object": "chat.completion", "choices": out, "usage": usage}, headers=prep.headers
    )


def _completion_logprobs(state: ServerState, tokens, lps, offset: int) -> dict:
    texts = [_token_text(state, t) for t in tokens]
    offsets, pos = [], offset
    for s in texts:
        offsets.append(pos)
        pos += len(s)
    return {
        "tokens": texts,
        "token_logprobs": list(lps),
        "top_logprobs": None,
        "text_offset": offsets,
    }


@router.post("/v1/completions", responses=COMPLETION_RESPONSES)
async def completions(body: CompletionRequest, http: HTTPRequest):
    state = _state(http)
    prompt = body.prompt
    prompt_ids = state.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not prompt_ids:
        raise APIError(400, "the prompt encodes to no tokens", param="prompt")
    if not isinstance(prompt, str) and any(
        t < 0 or t >= state.tokenizer.vocab_size for t in prompt
    ):
        raise APIError(
            400, f"prompt token ids must lie in [0, {state.tokenizer.vocab_size})", param="prompt"
        )
    prep = prepare(state, http, body, prompt_ids, body.max_tokens, "cmpl")
    if isinstance(prep, JSONResponse):
        return prep
    created, model = int(time.time()), body.model or state.settings.served_model_names[0]
    base = {"id": prep.request_id, "object": "text_completion", "created": created, "model": model}
    echo = prompt if (body.echo and isinstance(prompt, str)) else ""
    if body.stream:

        def text_choice(i: int, d: StreamDelta, first: bool) -> dict:
            choice = {
                "index": i,
                "text": (echo if first else "") + d.text,
                "logprobs": None,
                "finish_reason": d.finish_reason if d.finished else None,
            }
            if body.logprobs is not None and d.token_ids:
                choice["logprobs"] = _completion_logprobs(state, d.token_ids, d.logprobs, 0)
            return choice

        return _stream(state, prep, base, body, len(prompt_ids), text_choice)
    choices, n_prompt = await _collect(state, http, prep)
    out = []
    for i, c in enumerate(choices):
        item = {
            "index": i,
            "text": echo + c.text,
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        if body.logprobs is not None:
            item["logprobs"] = _completion_logprobs(state, c.tokens, c.logprobs, len(echo))
        out.append(item)
    usage = _usage(n_prompt, sum(c.completion_tokens for c in choices))
    return JSONResponse({**base, "choices": out, "usage": usage}, headers=prep.headers)
