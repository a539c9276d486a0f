"""Keeping prompt work off the event loop, and bounded before it starts.

A 3.9 MB prompt (800k tokens) used to be tokenized on the event loop before the context check:
its 400 came after 2 s, and meanwhile `/health` and every other request waited. Now:

- **A bound before any work.** No token of the model covers more than its longest vocabulary
  entry (in characters, plus one for a separator a word-level tokenizer drops), so a text of
  `n` characters has at least `n / chars_per_token` tokens. A prompt (or the messages' text, or
  the rendered conversation) past `max_model_len x chars_per_token` characters, or more
  messages than the context has tokens, is refused at once, untokenized.
- **The rest off the loop.** Rendering the chat template and tokenizing run in a worker thread
  (`asyncio.to_thread`); the tokenizer's batch call releases the GIL while it works, so the
  event loop keeps answering.
- **Large bodies parsed off the loop.** The routes' JSON bodies over `OFF_LOOP_JSON_BYTES` are
  decoded in a worker thread too (`OffLoopRoute`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.routing import APIRoute

from tierserve.api.errors import APIError
from tierserve.model.tokenizer import ChatTokenizer

T = TypeVar("T")
OFF_LOOP_JSON_BYTES = 64 << 10


class PromptBounds:
    def __init__(self, tokenizer: ChatTokenizer, max_model_len: int) -> None:
        vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
        longest = max((len(t) for t in vocab), default=1)
        self.max_model_len = max_model_len
        self.chars_per_token = longest + 1
        self.max_chars = max_model_len * self.chars_per_token

    def check_chars(self, n_chars: int, what: str, param: str) -> None:
        """400 if `n_chars` characters cannot fit in the context, whatever their tokens."""
        if n_chars > self.max_chars:
            at_least = -(-n_chars // self.chars_per_token)
            raise APIError(
                400,
                f"{what} has {n_chars} characters, so at least {at_least} tokens; the model's "
                f"context is {self.max_model_len} tokens (prompt + completion)",
                param=param,
            )

    def check_messages(self, messages: list, param: str = "messages") -> None:
        """The messages' count and text, before the chat template runs."""
        if len(messages) > self.max_model_len:
            raise APIError(
                400,
                f"{len(messages)} messages cannot fit in the model's context of "
                f"{self.max_model_len} tokens",
                param=param,
            )
        chars = sum(len(m.text() or "") for m in messages)
        self.check_chars(chars, "the messages' text", param)


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread: the event loop keeps serving meanwhile."""
    return await asyncio.to_thread(fn, *args)


class _OffLoopJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) > OFF_LOOP_JSON_BYTES:
                self._json = await asyncio.to_thread(json.loads, body)
            else:
                self._json = json.loads(body)
        return self._json


class OffLoopRoute(APIRoute):
    """An APIRoute whose large JSON bodies are decoded in a worker thread (FastAPI's own
    parsing calls `request.json()`, which this request class overrides)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def off_loop_handler(request: Request):
            wrapped = _OffLoopJSONRequest(request.scope, request.receive, request._send)
            return await handler(wrapped)

        return off_loop_handler
