"""/v1/completions: one prompt or a list of them (texts or token ids), `n` choices each; prompt
i's choice j has index i * n + j, as in OpenAI's API."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from tierserve.api.auth import authenticated
from tierserve.api.caller import Caller
from tierserve.api.errors import APIError
from tierserve.api.generation import (
    collect,
    response_base,
    server_state,
    spec_usage,
    stream,
    usage,
)
from tierserve.api.logprobs import completion_logprobs
from tierserve.api.openapi import COMPLETION_RESPONSES
from tierserve.api.prompts import OffLoopRoute, off_loop
from tierserve.api.protocol import CompletionRequest
from tierserve.api.state import ServerState, prepare
from tierserve.api.unsupported import refuse_unsupported
from tierserve.engine.async_engine import StreamDelta

router = APIRouter(dependencies=[Depends(authenticated)], route_class=OffLoopRoute)


def _prompt_ids(state: ServerState, prompt: str | list[int], i: int, many: bool) -> list[int]:
    which = f"prompt {i}" if many else "the prompt"
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)  # bounded by the caller, off the event loop
        if not ids:
            raise APIError(400, f"{which} encodes to no tokens", param="prompt")
        return ids
    vocab = state.tokenizer.vocab_size
    if any(t >= vocab for t in prompt):
        raise APIError(400, f"{which}: token ids must lie in [0, {vocab})", param="prompt")
    return list(prompt)


@router.post("/v1/completions", responses=COMPLETION_RESPONSES)
async def completions(body: CompletionRequest, http: HTTPRequest):
    state = server_state(http)
    return await completion_answer(state, body, Caller.from_http(state, http))


async def completion_answer(state: ServerState, body: CompletionRequest, caller: Caller):
    """A completion for `caller`: an HTTP request, or a Batch API line."""
    refuse_unsupported(body, "completions")
    texts = body.prompts()
    many = len(texts) > 1
    for i, p in enumerate(texts):  # before any tokenizing: no text past the context's bound
        if isinstance(p, str):
            state.bounds.check_chars(len(p), f"prompt {i}" if many else "the prompt", "prompt")
    prompts = await off_loop(lambda: [_prompt_ids(state, p, i, many) for i, p in enumerate(texts)])
    prep = prepare(state, caller, body, prompts, body.max_tokens, "cmpl", param="prompt")
    if isinstance(prep, JSONResponse):
        return prep
    base = {**response_base(state, prep, body.model), "object": "text_completion"}
    n, n_prompt = body.n, sum(len(ids) for ids in prompts)
    echoes = [""] * len(prompts)
    if body.echo:  # a token-id prompt is echoed as its text
        echoes = [
            t if isinstance(t, str) else state.tokenizer.decode(ids, skip_special_tokens=False)
            for t, ids in zip(texts, prompts, strict=True)
        ]
    k = body.logprobs or 0

    def logprobs(i: int, tokens, lps, tops, scored, offset: int) -> dict | None:
        """The choice's logprobs; with echo, the prompt's come first (once)."""
        if body.logprobs is None or not (tokens or scored is not None):
            return None
        prompt = (prompts[i // n], scored) if scored is not None else None
        return completion_logprobs(state.tokenizer, tokens, lps, tops, k, offset, prompt)

    if body.stream:
        sent = [0] * len(prep.requests)  # characters of each choice's text streamed so far

        def text_choice(i: int, d: StreamDelta, first: bool) -> dict:
            echo = echoes[i // n] if first else ""
            at = sent[i] + len(echo)
            lp = logprobs(i, d.token_ids, d.logprobs, d.top_logprobs, d.prompt_logprobs, at)
            sent[i] = at + len(d.text)
            return {
                "index": i,
                "text": echo + d.text,
                "logprobs": lp,
                "finish_reason": d.finish_reason if d.finished else None,
            }

        return stream(state, prep, base, body, n_prompt, text_choice)
    choices = await collect(state, caller, prep)
    out = []
    for i, c in enumerate(choices):
        echo = echoes[i // n]
        lp = logprobs(i, c.tokens, c.logprobs, c.top_logprobs, c.prompt_logprobs, len(echo))
        if lp is None and body.logprobs is not None:  # nothing generated, nothing scored
            lp = completion_logprobs(state.tokenizer, [], [], [], k)
        out.append(
            {"index": i, "text": echo + c.text, "logprobs": lp, "finish_reason": c.finish_reason}
        )
    total = usage(n_prompt, sum(c.completion_tokens for c in choices), *spec_usage(choices))
    return JSONResponse({**base, "choices": out, "usage": total}, headers=prep.headers)
