"""/v1/completions: one prompt or a list of them (texts or token ids), `n` choices each; prompt
i's choice j has index i * n + j, as in OpenAI's API."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from tierserve.api.auth import authenticated
from tierserve.api.errors import APIError
from tierserve.api.generation import (
    collect,
    response_base,
    server_state,
    stream,
    token_text,
    usage,
)
from tierserve.api.openapi import COMPLETION_RESPONSES
from tierserve.api.protocol import CompletionRequest
from tierserve.api.state import ServerState, prepare
from tierserve.api.unsupported import refuse_unsupported
from tierserve.engine.async_engine import StreamDelta

router = APIRouter(dependencies=[Depends(authenticated)])


def _prompt_ids(state: ServerState, prompt: str | list[int], i: int, many: bool) -> list[int]:
    which = f"prompt {i}" if many else "the prompt"
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)
        if not ids:
            raise APIError(400, f"{which} encodes to no tokens", param="prompt")
        return ids
    vocab = state.tokenizer.vocab_size
    if any(t >= vocab for t in prompt):
        raise APIError(400, f"{which}: token ids must lie in [0, {vocab})", param="prompt")
    return list(prompt)


def _logprobs(state: ServerState, tokens, lps, offset: int) -> dict:
    texts = [token_text(state, t) for t in tokens]
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
    state = server_state(http)
    refuse_unsupported(body, "completions")
    texts = body.prompts()
    prompts = [_prompt_ids(state, p, i, len(texts) > 1) for i, p in enumerate(texts)]
    prep = prepare(state, http, body, prompts, body.max_tokens, "cmpl", param="prompt")
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
    if body.stream:

        def text_choice(k: int, d: StreamDelta, first: bool) -> dict:
            echo = echoes[k // n] if first else ""
            choice = {
                "index": k,
                "text": echo + d.text,
                "logprobs": None,
                "finish_reason": d.finish_reason if d.finished else None,
            }
            if body.logprobs is not None and d.token_ids:
                choice["logprobs"] = _logprobs(state, d.token_ids, d.logprobs, 0)
            return choice

        return stream(state, prep, base, body, n_prompt, text_choice)
    choices = await collect(state, http, prep)
    out = []
    for k, c in enumerate(choices):
        echo = echoes[k // n]
        item = {
            "index": k,
            "text": echo + c.text,
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        if body.logprobs is not None:
            item["logprobs"] = _logprobs(state, c.tokens, c.logprobs, len(echo))
        out.append(item)
    total = usage(n_prompt, sum(c.completion_tokens for c in choices))
    return JSONResponse({**base, "choices": out, "usage": total}, headers=prep.headers)
