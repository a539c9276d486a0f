"""The OpenAPI schema tells the truth: the error bodies and statuses the server really answers
(400, never FastAPI's default 422), the headers that come with them, and the limits it enforces
that are only known at start (body size, context length, vocabulary size)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

from tierserve.api.unsupported import pending_fields


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape."""

    error: ErrorBody


class OverloadBody(ErrorBody):
    retry_after: float | None = None
    current_queue_depth: int | None = None
    priority: str | None = None


class OverloadResponse(BaseModel):
    """OpenAI's error shape; admission refusals add the queue state."""

    error: OverloadBody


_RETRY_AFTER = {
    "Retry-After": {
        "description": "whole seconds to wait before retrying (at least 1)",
        "schema": {"type": "integer", "minimum": 1},
    }
}


# One server-sent event of a streamed completion.
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "description": 'a completion chunk (JSON), an `{"error": ...}` object, or `[DONE]`',
        }
    },
}


def _err(description: str, model=ErrorResponse, retry: bool = False) -> dict:
    out: dict[str, Any] = {"model": model, "description": description}
    if retry:
        out["headers"] = _RETRY_AFTER
    return out


# For the completion routes (FastAPI `responses=`); the 413 text gets the limit at start.
COMPLETION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion; with `stream: true`, server-sent events ending with "
        "`data: [DONE]`",
        "content": {"application/json": {}, "text/event-stream": {"schema": _SSE_EVENT}},
    },
    400: _err(
        "invalid request: malformed JSON or UTF-8, a wrong type (booleans are true/false, "
        "numbers are numbers), a value out of range, an unknown field, a feature not "
        "supported yet, messages the chat template refuses, or a prompt + max_tokens beyond "
        "the context; the message names the field"
    ),
    401: _err("missing or unknown API key (when keys are configured)"),
    404: _err("unknown model"),
    413: _err("request body too large"),
    429: _err("rate limited: the tenant's or the global token bucket", OverloadResponse, True),
    500: _err("internal error; the message carries a request id that the server log names"),
    503: _err(
        "the class's queue is full, the request was shed for a realtime one, its class's TTFT "
        "SLA cannot be met (SLA admission: code `sla_unreachable`, also when a waiting request "
        "is ended early), or the server is draining",
        OverloadResponse,
        True,
    ),
}
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _err("missing or unknown API key (when keys are configured)"),
}
TOKENIZER_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _err(
        "invalid request: a wrong type or value, an unknown field, token ids beyond the "
        "vocabulary, or messages the chat template refuses; the message names the field"
    ),
    401: AUTH_RESPONSES[401],
    404: _err("unknown model"),
    413: _err("request body too large"),
}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "the engine thread has stopped (crashed): restart the server",
        "headers": _RETRY_AFTER,
    }
}
READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "not ready: draining or the engine is not stepping",
        "headers": _RETRY_AFTER,
    }
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


def _bound(alt: dict, bounds: dict) -> None:
    """Add `bounds` to an integer schema, or to the integers inside arrays of them."""
    if alt.get("type") == "integer":
        alt.update(bounds)
    elif alt.get("type") == "array":
        _bound(alt["items"], bounds)


def _limit(schema: dict, model: str, field: str, **bounds) -> None:
    """Add bounds to `model.field`, also inside an `anyOf` (optional fields)."""
    prop = schema["components"]["schemas"][model]["properties"][field]
    for alt in prop.get("anyOf", [prop]):
        _bound(alt, bounds)


def _describe_pending(schema: dict, model: str, route: str) -> None:
    """Each field on the not-supported-yet list says so in its description."""
    props = schema["components"]["schemas"][model]["properties"]
    for name, what in pending_fields(route).items():
        note = f"Not supported yet: {what} is answered 400."
        old = props[name].get("description")
        props[name]["description"] = f"{old} {note}" if old else note


def install_openapi(app: FastAPI, max_request_bytes: int, max_model_len: int, vocab: int) -> None:
    def build() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schema["info"]["description"] = (
            f"Request bodies are limited to {max_request_bytes} bytes (413 beyond). "
            f"Prompt + max_tokens must fit the context of {max_model_len} tokens."
        )
        schema["info"]["x-max-request-bytes"] = max_request_bytes
        for ops in schema["paths"].values():
            for op in ops.values():
                op["responses"].pop("422", None)  # validation errors are answered 400
                if "413" in op["responses"]:
                    op["responses"]["413"]["description"] += f" (over {max_request_bytes} bytes)"
        comps = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            comps.pop(name, None)
        for model in ("ChatCompletionRequest", "CompletionRequest"):
            _limit(schema, model, "max_tokens", maximum=max_model_len - 1)
        _limit(schema, "ChatCompletionRequest", "max_completion_tokens", maximum=max_model_len - 1)
        _limit(schema, "CompletionRequest", "prompt", maximum=vocab - 1)
        for model in ("ChatCompletionRequest", "CompletionRequest"):
            _limit(schema, model, "stop_token_ids", maximum=vocab - 1)
        _limit(schema, "DetokenizeRequest", "tokens", maximum=vocab - 1)
        for model, route in (
            ("ChatCompletionRequest", "chat"),
            ("CompletionRequest", "completions"),
        ):
            _describe_pending(schema, model, route)
        app.openapi_schema = schema
        return schema

    app.openapi = build
