"""The chat completions body: messages (with tool calls and tool results), tools and
`tool_choice`, and the chat template's inputs (`add_generation_prompt`,
`continue_final_message`, `documents`, `chat_template_kwargs`). Strict like every body
(`protocol.py`): an unknown field, in the body or in a message, is a 400 naming it."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from tierserve.api.protocol import BODY, AtLeast1, Common, Text, _int

MAX_TOOLS = 128
# More messages than this is refused by the schema, before each is validated (pydantic stops
# at the limit): 100,000 messages cost the event loop 0.9 s to validate otherwise.
MAX_MESSAGES = 2048
_FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class TextPart(BaseModel):
    model_config = BODY

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = BODY

    name: Text
    arguments: str = Field(description="a JSON object, as text")

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, v):
        try:
            parsed = json.loads(v) if v.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments must be a JSON object (as text): {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must be a JSON object (as text)")
        return v


class ToolCall(BaseModel):
    model_config = BODY

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = BODY

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # What the OpenAI SDK sends back with an assistant message it received: null only.
    refusal: None = None
    audio: None = None
    function_call: None = None
    annotations: None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v):
        for i, part in enumerate(v if isinstance(v, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"content part {i} has type {kind!r}: only text is supported")
        return v

    @model_validator(mode="after")
    def _roles(self):
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only a tool message has tool_call_id")
        return self

    def text(self) -> str | None:
        if isinstance(self.content, list):  # content parts, joined as vLLM joins them
            return "\n".join(p.text for p in self.content)
        return self.content

    def for_template(self) -> dict:
        """The message as transformers' templates read it, normalised as vLLM normalises it:
        `content` always present, as text ("" for none: an assistant turn that only calls
        tools, as every agent's second turn sends it); tool calls with their arguments as
        objects (what tool-use templates expect), not JSON text."""
        out: dict[str, Any] = {"role": self.role, "content": self.text() or ""}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {
                        "name": c.function.name,
                        "arguments": json.loads(c.function.arguments or "{}"),
                    },
                }
                for c in self.tool_calls
            ]
        return out


class FunctionDefinition(BaseModel):
    model_config = BODY

    name: _FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema object")
    strict: bool | None = None


class Tool(BaseModel):
    model_config = BODY

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = BODY

    name: _FunctionName


class NamedToolChoice(BaseModel):
    model_config = BODY

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = BODY

    name: Text
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = BODY

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class TemplateInputs(BaseModel):
    """What the chat template gets besides the messages (chat completions and /tokenize)."""

    model_config = BODY

    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    documents: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _template_inputs(self):
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools have the same name")
        if self.continue_final_message and self.add_generation_prompt:
            if "add_generation_prompt" in self.model_fields_set:
                raise ValueError(
                    "continue_final_message and add_generation_prompt cannot both be true"
                )
            self.add_generation_prompt = False  # continuing the last message is no new turn
        return self

    def template_tools(self) -> list[dict] | None:
        """The tools as the template gets them (transformers: JSON-schema dicts), none with
        tool_choice 'none' (the model is not told of tools it may not call)."""
        if not self.tools or getattr(self, "tool_choice", None) == "none":
            return None
        return [t.model_dump(exclude_none=True, by_alias=True) for t in self.tools]


class ChatCompletionRequest(Common, TemplateInputs):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: AtLeast1 | None = None
    max_completion_tokens: AtLeast1 | None = None
    logprobs: bool = False
    top_logprobs: _int(ge=0, le=20) | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _tool_choice(self):
        names = [t.function.name for t in self.tools or ()]
        choice = self.tool_choice
        if choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not in tools")
        return self

    def parse_tools(self) -> list[str]:
        """Tool names to look for in the output (none: the output is all content)."""
        return [t.function.name for t in self.tools or ()] if self.template_tools() else []
