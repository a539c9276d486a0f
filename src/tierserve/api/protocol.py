"""OpenAI-compatible request bodies (pydantic), plus tierserve's extensions: `priority`
(vLLM-compatible integer, lower = more urgent) and `sla_latency_ms`.

Validation is strict: a boolean is `true` or `false` (not "yes", not 1), a number is a JSON
number (not a string), an integer is a whole number (`8` or, as JSON Schema has it, `8.0`; not
`8.5`, not `"8"`), NaN and infinities are refused. Unknown fields are accepted and ignored,
as OpenAI clients send many. Every limit checked here appears in the OpenAPI schema."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

MAX_N = 8
SEED_MAX = 2**63 - 1
_STRICT = ConfigDict(strict=True, allow_inf_nan=False)
_Text = Annotated[str, Field(min_length=1)]


def _whole(v):
    """JSON Schema counts 8.0 as an integer: take it as 8 (anything else is left to strict
    validation, which refuses it)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _int(**bounds):
    """A strict integer within `bounds` (the bounds go first, so the schema shows them)."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole)]


_AtLeast1 = _int(ge=1)
_N = _int(ge=1, le=MAX_N)
_NonNegative = _int(ge=0)
_Seed = _int(ge=-SEED_MAX, le=SEED_MAX)
_Priority = _int(ge=0, le=3)
_TopLogprobs = _int(ge=0, le=20)
_Logprobs = _int(ge=0, le=5)

# The prompt's three forms, with the limits the validator below enforces.
PROMPT_SCHEMA = {
    "title": "Prompt",
    "description": "text, a list of one text, or token ids (each below the vocabulary size)",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": 1,
        },
    ],
}


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", **_STRICT)

    model: str | None = None
    max_tokens: _AtLeast1 | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: _NonNegative = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    n: _N = 1
    seed: _Seed | None = None
    stop: _Text | list[_Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    # tierserve extensions
    priority: _Priority | None = None
    sla_latency_ms: Annotated[float, Field(gt=0)] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_nonempty(cls, v):
        if isinstance(v, str):
            v = [v]
        if v is not None and any(not s for s in v):
            raise ValueError("stop strings must not be empty")
        return v

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_int(cls, v):
        v = _whole(v)
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("priority must be an integer 0..3 (0 = most urgent)")
        if not 0 <= v <= 3:
            raise ValueError(f"priority must be an integer 0..3 (0 = most urgent), got {v}")
        return v


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", **_STRICT)

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", **_STRICT)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: _AtLeast1 | None = None
    logprobs: bool = False
    top_logprobs: _TopLogprobs | None = None


class CompletionRequest(_Common):
    prompt: Annotated[str | list[_NonNegative] | list[str], WithJsonSchema(PROMPT_SCHEMA)]
    logprobs: _Logprobs | None = None
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("one prompt per request is supported; send a list of one")
            v = v[0]
        if len(v) == 0:
            raise ValueError("prompt must not be empty")
        return v
