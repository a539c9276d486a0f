"""Tools and chat templates through the official `openai` client, on a fake engine whose
model says a scripted text (tests/scripted_engine.py) and records the prompts it gets: tools and
tool messages reach the template (`--chat-template` override: a Hermes-style template), the
model's tool calls come back as OpenAI `tool_calls`, streamed and not."""

import json
from pathlib import Path

import httpx
import openai
import pytest
from transformers import PreTrainedTokenizerFast

from tests.scripted_engine import scripted_built
from tests.server_utils import running_server
from tierserve.api.settings import ServerSettings

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def server():
    built = scripted_built()
    settings = ServerSettings(chat_template=str(FIXTURES / "hermes_tools.jinja"))
    with running_server(built, settings) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0), built.executor


def chat(c, **kw):
    return c.chat.completions.create(model=MODEL, messages=kw.pop("messages", ASK), **kw)


def test_tools_reach_the_template_and_a_call_comes_back(server):
    c, ex = server
    ex.reply = HERMES_CALL
    r = chat(c, tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    prompt = ex.prompt_text(r.id)
    assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) in prompt  # transformers' dicts
    assert '{"type": "function", "function": {"name": "get_time"}}' in prompt


def test_streamed_tool_calls_arrive_as_deltas(server):
    c, ex = server
    ex.reply = "Checking both.\n" + HERMES_CALL + '\n<tool_call>{"name": "get_time"}</tool_call>'
    chunks = list(chat(c, tools=[WEATHER, TIME], stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert content == "Checking both."
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather"), (1, "get_time")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert json.loads(calls[1].function.arguments) == {}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    whole = chat(c, tools=[WEATHER, TIME]).choices[0]
    assert whole.message.content == content
    assert [t.function.name for t in whole.message.tool_calls] == ["get_weather", "get_time"]


def test_a_plain_json_call_counts_and_parallel_calls_can_be_limited(server):
    c, ex = server
    ex.reply = '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {}}]'
    r = chat(c, tools=[WEATHER, TIME])
    assert [t.function.name for t in r.choices[0].message.tool_calls] == [
        "get_time",
        "get_weather",
    ]
    r = chat(c, tools=[WEATHER, TIME], parallel_tool_calls=False)
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_time"]
    streamed = chat(c, tools=[WEATHER, TIME], parallel_tool_calls=False, stream=True)
    calls = [tc for ch in streamed if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_time"]


def test_tool_choice_none_hides_the_tools_and_parses_nothing(server):
    c, ex = server
    ex.reply = HERMES_CALL
    r = chat(c, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.content == HERMES_CALL
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
    assert "<tools>" not in ex.prompt_text(r.id)
    r = chat(c)  # no tools at all: a tool-call-looking answer is just text
    assert r.choices[0].message.content == HERMES_CALL and not r.choices[0].message.tool_calls


def test_tool_messages_are_kept_through_the_template(server):
    c, ex = server
    ex.reply = "It is 21 degrees."
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": '{"temp_c": 21}'},
    ]
    r = chat(c, messages=history, tools=[WEATHER])
    assert r.choices[0].message.content == "It is 21 degrees."
    prompt = ex.prompt_text(r.id)
    # arguments reach the template as an object (tojson renders it), not as escaped text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (
        prompt
    )
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>' in (
        prompt
    )
    # an agent loop: the SDK's own message object (with its tool call) goes back as history
    ex.reply = HERMES_CALL
    first = chat(c, tools=[WEATHER]).choices[0].message
    result = {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "21 C"}
    ex.reply = "Done."
    again = chat(c, messages=[*ASK, first, result], tools=[WEATHER])
    assert again.choices[0].message.content == "Done."
    assert '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in ex.prompt_text(again.id)


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ({"role": "tool", "content": "x"}, "needs tool_call_id"),
        ({"role": "user", "content": "x", "tool_call_id": "a"}, "only a tool message"),
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{"}}
                ],
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
    ],
)
def test_bad_tool_messages_are_400s(server, message, needle):
    c, _ = server
    with pytest.raises(openai.BadRequestError, match=needle.replace(".", r"\.")):
        chat(c, messages=[*ASK, message])


def _tokenize(c, **body) -> httpx.Response:
    return httpx.post(str(c.base_url.copy_with(path="/tokenize")), json=body)


def test_template_inputs_reach_the_template_as_transformers_passes_them():
    """`--chat-template` with a template that uses documents, template kwargs, tools, loop
    controls and tojson options: /tokenize renders exactly what transformers renders."""
    source = (FIXTURES / "features.jinja").read_text()
    built = scripted_built()
    settings = ServerSettings(chat_template=source)  # inline, as vLLM takes it too
    docs = [{"title": "A", "text": "one"}, {"title": "B", "text": "two"}]
    history = [*ASK, {"role": "assistant", "content": "Let me", "reasoning_content": "hm"}]
    ref = PreTrainedTokenizerFast(
        tokenizer_object=built.tokenizer.tokenizer, bos_token="<s>", eos_token="</s>"
    )
    want = ref.apply_chat_template(
        history,
        tools=[WEATHER],
        documents=docs,
        continue_final_message=True,
        enable_thinking=True,
        tokenize=False,
        chat_template=source,
    )
    with running_server(built, settings) as (url, state):
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        body = {
            "messages": history,
            "tools": [WEATHER],
            "documents": docs,
            "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": True},
            "return_token_strs": True,
        }
        r = _tokenize(c, **body).json()
        assert state.tokenizer.decode(r["tokens"], skip_special_tokens=False) == want
        assert "".join(r["token_strs"]) == want and r["count"] == len(r["tokens"])
        # the chat route renders the same prompt
        built.executor.reply = " goes"
        extra = {
            k: body[k] for k in ("documents", "continue_final_message", "chat_template_kwargs")
        }
        out = chat(c, messages=history, tools=[WEATHER], extra_body=extra)
        assert built.executor.prompt_text(out.id) == want
        bad = _tokenize(c, messages=ASK, chat_template_kwargs={"messages": []})
        assert bad.status_code == 400 and "may not set messages" in bad.json()["error"]["message"]


def test_without_any_template_chat_is_a_clear_400():
    built = scripted_built()
    with running_server(built) as (url, _):
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match=r"no chat template.*--chat-template"):
            chat(c)
