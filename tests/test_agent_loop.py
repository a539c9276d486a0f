"""An agent's second turn: the assistant message that called tools (no `content`, or `content:
null`, as the OpenAI Agents SDK and the `openai` SDK send it) and the tool's result, through the
embedded model's own chat template (issue 23, item 2). vLLM and transformers users expect that
to render: content is always present, as text."""

from __future__ import annotations

import json

import openai
import pytest

from tests.scripted_engine import scripted_built
from tests.server_utils import running_server, small_engine_args

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def embedded_template() -> str:
    """The embedded model's chat template, read from its GGUF file (no weights loaded)."""
    import gguf

    from tierserve.model.loader import default_model_path

    reader = gguf.GGUFReader(str(default_model_path()))
    return reader.fields["tokenizer.chat_template"].contents()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def second_turn(first: openai.types.chat.ChatCompletion, as_sdk_sends: bool) -> list:
    """The conversation an agent sends back: its call, then the tool's answer."""
    msg = first.choices[0].message
    if as_sdk_sends:  # the SDK's own message object, as the openai client dumps it
        assistant = msg.model_dump(exclude_unset=True)
        assert assistant["content"] is None
    else:  # the Agents SDK builds the turn with no content key at all
        assistant = {
            "role": "assistant",
            "tool_calls": [c.model_dump() for c in msg.tool_calls],
        }
    result = {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"temp_c": 21}'}
    return [*ASK, assistant, result]


@pytest.fixture(scope="module")
def scripted():
    """The embedded template over the scripted model, which answers with a JSON tool call (the
    format a template without <tool_call> tags asks for)."""
    template = embedded_template()
    assert "message['content']" in template  # what broke: it reads content unconditionally
    built = scripted_built(template)
    with running_server(built) as (url, _):
        yield client(url), built.executor


@pytest.mark.parametrize("as_sdk_sends", [True, False])
def test_the_second_turn_of_a_tool_loop_renders_with_the_embedded_template(scripted, as_sdk_sends):
    c, ex = scripted
    ex.reply = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    first = c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    assert first.choices[0].finish_reason == "tool_calls"
    ex.reply = "It is 21 degrees."
    r = c.chat.completions.create(
        model=MODEL, messages=second_turn(first, as_sdk_sends), tools=[WEATHER]
    )
    assert r.choices[0].message.content == "It is 21 degrees."
    prompt = ex.prompt_text(r.id)
    # The assistant's turn renders empty (the template shows no calls), the result follows.
    assert '<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n{"temp_c": 21}' in prompt


def test_an_agent_tool_round_trip_with_the_real_model():
    from tierserve.engine.builder import build_engine

    with running_server(build_engine(small_engine_args())) as (url, _):
        c = client(url)
        first = c.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
            temperature=0, max_tokens=40,
        )  # fmt: skip
        calls = first.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")
        second = c.chat.completions.create(
            model=MODEL, messages=second_turn(first, True), tools=[WEATHER],
            temperature=0, max_tokens=8,
        )  # fmt: skip
        assert second.choices[0].finish_reason in ("stop", "length")
        assert second.usage.completion_tokens > 0
