"""OpenAI-compatible request bodies (pydantic), plus tierserve's extensions: `priority`
(vLLM-compatible integer, lower = more urgent) and `sla_latency_ms`. Chat bodies are in
`chat_protocol.py`.

Validation is strict: a boolean is `true` or `false` (not "yes", not 1), a number is a JSON
number (not a string), an integer is a whole number (`8` or, as JSON Schema has it, `8.0`; not
`8.5`, not `"8"`), NaN and infinities are refused. An unknown field is refused with a 400 that
names it: nothing sent is silently ignored. A field the API defines but tierserve does not
implement yet would be declared here with its type and range, and refused by `unsupported.py`
when it asks for more than its neutral value. Every limit checked here appears in the OpenAPI
schema."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

MAX_N = 8
MAX_PROMPTS = 256  # prompts in one completions request
SEED_MAX = 2**63 - 1
BODY = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
Text = Annotated[str, Field(min_length=1)]


def _whole(v):
    """JSON Schema counts 8.0 as an integer: take it as 8 (anything else is left to strict
    validation, which refuses it)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _int(**bounds):
    """A strict integer within `bounds` (the bounds go first, so the schema shows them)."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole)]


AtLeast1 = _int(ge=1)
NonNegative = _int(ge=0)
_N = _int(ge=1, le=MAX_N)
_Seed = _int(ge=-SEED_MAX, le=SEED_MAX)
_Priority = _int(ge=0, le=3)
_Logprobs = _int(ge=0, le=5)
_Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
_TokenKey = Annotated[str, Field(pattern=r"^[0-9]+$")]
_Bias = Annotated[float, Field(ge=-100.0, le=100.0)]

# The prompt's four forms, with the limits the validator below enforces (the largest token id
# is added at start, from the vocabulary).
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_SCHEMA = {
    "title": "Prompt",
    "description": "a text, a list of texts, token ids, or a list of token-id lists; each "
    f"prompt gets `n` choices (at most {MAX_PROMPTS} prompts)",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": MAX_PROMPTS,
        },
        _IDS,
        {"type": "array", "items": _IDS, "minItems": 1, "maxItems": MAX_PROMPTS},
    ],
}


class StreamOptions(BaseModel):
    model_config = BODY

    include_usage: bool = False


class Common(BaseModel):
    model_config = BODY

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: NonNegative = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    n: _N = 1
    seed: _Seed | None = None
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = Field(None, description="the end user, for the client's own records")
    # Per-request logits processing (model/processors.py; vLLM's semantics, docs/api.md).
    presence_penalty: _Penalty = 0.0
    frequency_penalty: _Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0)] = 1.0
    logit_bias: dict[_TokenKey, _Bias] | None = None
    min_tokens: NonNegative = 0
    stop_token_ids: list[NonNegative] | None = None
    skip_special_tokens: bool = True
    # tierserve extensions
    priority: _Priority | None = None
    sla_latency_ms: Annotated[float, Field(gt=0)] | None = None
    speculative: bool = Field(
        True, description="false: never speculate for this request (when the server does)"
    )
    # OpenAI's: priority -> P0 (within the tenant's entitlement), flex -> P2, auto / default ->
    # the tenant's default. `priority` and the x-request-tier header win over it.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None,
        description="priority: realtime (P0) if the tenant is entitled; flex: batch (P2); "
        "auto/default: the tenant's default class. The response echoes the tier served.",
    )

    @model_validator(mode="after")
    def _service_tier(self):
        if self.stream_options is not None and not self.stream:
            # (OpenAI and vLLM refuse it: the options only shape a stream)
            raise ValueError("stream_options is only allowed when stream is true")
        asked = {"flex": 2, "priority": 0}.get(self.service_tier or "")
        if self.priority is None and asked is not None:
            self.priority = asked
        return self

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


class CompletionRequest(Common):
    prompt: Annotated[
        str | list[str] | list[NonNegative] | list[list[NonNegative]],
        WithJsonSchema(PROMPT_SCHEMA),
    ]
    max_tokens: NonNegative | None = None
    logprobs: _Logprobs | None = None
    echo: bool = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_form(cls, v):
        if isinstance(v, list) and v:
            number = all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
            same = (
                number or all(isinstance(x, str) for x in v) or all(isinstance(x, list) for x in v)
            )
            if not same:
                raise ValueError(
                    "a prompt list holds texts, token ids, or token-id lists, not a mix"
                )
        return v

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, v):
        if len(v) == 0:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and isinstance(v[0], str | list):
            if len(v) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(v)}")
            for i, p in enumerate(v):
                if len(p) == 0:
                    raise ValueError(f"prompt {i} is empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or not isinstance(p[0], str | list):
            return [p]
        return list(p)
