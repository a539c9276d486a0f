"""OpenAI-compatible request bodies (pydantic), plus tierserve's extensions: `priority`
(vLLM-compatible integer, lower = more urgent) and `sla_latency_ms`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 8


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    # tierserve extensions
    priority: int | None = None
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
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("priority must be an integer 0..3 (0 = most urgent)")
        if not 0 <= v <= 3:
            raise ValueError(f"priority must be an integer 0..3 (0 = most urgent), got {v}")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("one prompt per request is supported; send a list of one")
            return v[0]
        if (isinstance(v, (list, str))) and len(v) == 0:
            raise ValueError("prompt must not be empty")
        return v
