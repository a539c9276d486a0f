"""/v1/chat/completions: messages through the chat template, the answer as a message, with the
tool calls found in it (`tool_choice` auto; chat/tool_parser.py) as OpenAI's `tool_calls`."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from tierserve.api.auth import authenticated
from tierserve.api.caller import Caller
from tierserve.api.chat_protocol import ChatCompletionRequest
from tierserve.api.errors import APIError
from tierserve.api.generation import (
    MakeChoice,
    collect,
    response_base,
    server_state,
    spec_usage,
    stream,
    usage,
)
from tierserve.api.logprobs import chat_logprobs
from tierserve.api.openapi import COMPLETION_RESPONSES
from tierserve.api.prompts import OffLoopRoute, off_loop
from tierserve.api.sampling import chat_grammar
from tierserve.api.state import ServerState, prepare
from tierserve.api.unsupported import refuse_unsupported
from tierserve.chat.template import ChatTemplateError
from tierserve.chat.tool_parser import ParsedCall, ToolCallParser, parse_tool_calls
from tierserve.engine.async_engine import StreamDelta

router = APIRouter(dependencies=[Depends(authenticated)], route_class=OffLoopRoute)


def render_messages(state: ServerState, body, add_generation_prompt: bool) -> str:
    """The chat template over `body`'s messages (and tools, documents, template kwargs)."""
    try:
        return state.chat.render(
            [m.for_template() for m in body.messages],
            tools=body.template_tools(),
            documents=getattr(body, "documents", None),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=body.continue_final_message,
            kwargs=body.chat_template_kwargs,
        )
    except ChatTemplateError as exc:
        raise APIError(400, f"cannot apply the chat template: {exc}", param="messages") from None


async def chat_prompt_ids(state: ServerState, body, add_special_tokens: bool = False) -> list[int]:
    """The conversation's prompt token ids: bounded first (api/prompts.py), then rendered and
    tokenized off the event loop."""
    state.bounds.check_messages(body.messages)

    def work() -> list[int]:
        text = render_messages(state, body, body.add_generation_prompt)
        state.bounds.check_chars(len(text), "the rendered conversation", "messages")
        if add_special_tokens:
            return state.tokenizer.encode(text, add_special_tokens=True)
        return state.chat.encode(text)

    return await off_loop(work)


def _tool_call(call: ParsedCall) -> dict:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _finish(reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and reason == "stop" else reason


def _streamer(state: ServerState, body: ChatCompletionRequest, tools: list[str]) -> MakeChoice:
    parsers: dict[int, ToolCallParser] = {}
    max_calls = None if body.parallel_tool_calls else 1

    def choice(i: int, d: StreamDelta, first: bool) -> dict | None:
        delta: dict = {"role": "assistant"} if first else {}
        content, calls = d.text, []
        if tools:
            p = parsers.setdefault(i, ToolCallParser(tools))
            before = p.num_calls
            events = p.feed(d.text) + (p.finish() if d.finished else [])
            content = "".join(e for kind, e in events if kind == "content")
            calls = [e for kind, e in events if kind == "call"]
            if max_calls is not None:
                calls = calls[: max(0, max_calls - before)]
            if calls:
                delta["tool_calls"] = [
                    {"index": before + k, **_tool_call(c)} for k, c in enumerate(calls)
                ]
        if content:
            delta["content"] = content
        out = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
        if d.finished:
            called = bool(tools) and parsers[i].num_calls > 0
            out["finish_reason"] = _finish(d.finish_reason, called)
        if body.logprobs and d.token_ids:
            out["logprobs"] = chat_logprobs(
                state.tokenizer, d.token_ids, d.logprobs, d.top_logprobs
            )
        if not (first or delta or d.finished or out["logprobs"]):
            return None  # text held back by the tool parser: nothing to say yet
        return out

    return choice


@router.post("/v1/chat/completions", responses=COMPLETION_RESPONSES)
async def chat_completions(body: ChatCompletionRequest, http: HTTPRequest):
    state = server_state(http)
    return await chat_answer(state, body, Caller.from_http(state, http))


async def chat_answer(state: ServerState, body: ChatCompletionRequest, caller: Caller):
    """A chat completion for `caller`: an HTTP request, or a Batch API line."""
    refuse_unsupported(body, "chat")
    template = state.chat.template
    grammar = chat_grammar(body, template.source if template else None)
    prompt_ids = await chat_prompt_ids(state, body)
    if not prompt_ids:
        raise APIError(
            400, "the chat template renders these messages as no tokens", param="messages"
        )
    limit = body.max_completion_tokens or body.max_tokens
    prep = prepare(state, caller, body, [prompt_ids], limit, "chatcmpl", grammar=grammar)
    if isinstance(prep, JSONResponse):
        return prep
    base = response_base(state, prep, body.model)
    tools = body.parse_tools()
    if body.stream:
        chunk = {**base, "object": "chat.completion.chunk"}
        return stream(state, prep, chunk, body, len(prompt_ids), _streamer(state, body, tools))
    out = []
    choices = await collect(state, caller, prep)
    for i, c in enumerate(choices):
        content, calls = parse_tool_calls(c.text, tools) if tools else (c.text, [])
        message: dict = {"role": "assistant", "content": content}
        if calls:
            calls = calls if body.parallel_tool_calls else calls[:1]
            message["tool_calls"] = [_tool_call(call) for call in calls]
        item = {
            "index": i,
            "message": message,
            "logprobs": chat_logprobs(state.tokenizer, c.tokens, c.logprobs, c.top_logprobs)
            if body.logprobs
            else None,
            "finish_reason": _finish(c.finish_reason, bool(calls)),
        }
        out.append(item)
    total = usage(len(prompt_ids), sum(c.completion_tokens for c in choices), *spec_usage(choices))
    return JSONResponse(
        {**base, "object": "chat.completion", "choices": out, "usage": total},
        headers=prep.headers,
    )
