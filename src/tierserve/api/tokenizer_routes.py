"""vLLM's `/tokenize` and `/detokenize` (same request and response shapes), and `/version`.

`/tokenize` takes a `prompt` (special tokens added by default, as for a completion) or chat
`messages` (rendered through the chat template exactly as for a chat completion; no special
tokens added by default, the template places them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from pydantic import BaseModel, Field, model_validator

import tierserve
from tierserve.api.auth import authenticated
from tierserve.api.chat_protocol import MAX_MESSAGES, ChatMessage, TemplateInputs
from tierserve.api.chat_routes import chat_prompt_ids
from tierserve.api.errors import APIError
from tierserve.api.generation import server_state
from tierserve.api.openapi import TOKENIZER_RESPONSES
from tierserve.api.prompts import OffLoopRoute, off_loop
from tierserve.api.protocol import BODY, NonNegative
from tierserve.api.state import check_model

router = APIRouter(dependencies=[Depends(authenticated)], route_class=OffLoopRoute)
open_router = APIRouter()


class TokenizeRequest(TemplateInputs):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None
    )
    add_special_tokens: bool | None = Field(
        None, description="default: true for a prompt, false for messages"
    )
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        chat_only = {
            "tools",
            "documents",
            "chat_template_kwargs",
            "continue_final_message",
            "add_generation_prompt",
        }
        given = sorted(chat_only & self.model_fields_set)
        if self.prompt is not None and given:
            raise ValueError(f"{', '.join(given)}: only with messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = BODY

    model: str | None = None
    tokens: list[NonNegative]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


@router.post("/tokenize", responses=TOKENIZER_RESPONSES)
async def tokenize(body: TokenizeRequest, http: HTTPRequest) -> TokenizeResponse:
    state = server_state(http)
    check_model(state, body.model)
    if body.messages is not None:
        ids = await chat_prompt_ids(state, body, add_special_tokens=bool(body.add_special_tokens))
    else:
        add = body.add_special_tokens is not False
        state.bounds.check_chars(len(body.prompt), "the prompt", "prompt")
        ids = await off_loop(state.tokenizer.encode, body.prompt, add)
    strs = [state.tokenizer.tokenizer.id_to_token(t) for t in ids]
    return TokenizeResponse(
        count=len(ids),
        max_model_len=state.max_model_len,
        tokens=ids,
        token_strs=strs if body.return_token_strs else None,
    )


@router.post("/detokenize", responses=TOKENIZER_RESPONSES)
async def detokenize(body: DetokenizeRequest, http: HTTPRequest) -> DetokenizeResponse:
    state = server_state(http)
    check_model(state, body.model)
    vocab = state.tokenizer.vocab_size
    if any(t >= vocab for t in body.tokens):
        raise APIError(400, f"token ids must lie in [0, {vocab})", param="tokens")
    return DetokenizeResponse(prompt=state.tokenizer.decode(body.tokens, skip_special_tokens=False))


@open_router.get("/version")
async def version() -> VersionResponse:
    return VersionResponse(version=tierserve.__version__)
