"""Nothing silent (issue 15): through the official `openai` client, an unknown field is a 400
naming it, a declared but not-yet-implemented feature is a 400 `not supported yet: <field>`, and
the neutral values clients send by default are accepted. Fake engine, no model."""

import httpx
import openai
import pytest

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tierserve.api.unsupported import NOT_SUPPORTED_YET

MODEL = "SmolLM2-135M-Instruct"
MSG = [{"role": "user", "content": "w1 w2"}]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


@pytest.fixture(scope="module")
def client():
    with running_server(fake_built()) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def chat(c, **kw):
    return c.chat.completions.create(model=MODEL, messages=kw.pop("messages", MSG), **kw)


def complete(c, **kw):
    return c.completions.create(model=MODEL, prompt=kw.pop("prompt", words(3)), **kw)


def refused(call, *needles) -> str:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    err = info.value.body
    for needle in needles:
        assert needle in err["message"], err
    return err


@pytest.mark.parametrize(
    ("route", "extra", "field"),
    [
        ("chat", {"extra_body": {"colour": "red"}}, "colour"),
        ("completions", {"extra_body": {"suffix": "!"}}, "suffix"),
        ("completions", {"extra_body": {"best_of": 2}}, "best_of"),
        (
            "chat",
            {"messages": [{"role": "user", "content": "w1", "weight": 1}]},
            "messages.0.weight",
        ),
        (
            "chat",
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
        ("chat", {"extra_body": {"chat_template": "{{ 1 }}"}}, "chat_template"),
    ],
)
def test_unknown_fields_are_a_400_naming_them(client, route, extra, field):
    call = chat if route == "chat" else complete
    err = refused(lambda: call(client, max_tokens=2, **extra), f"unknown field '{field}'")
    assert err["param"] == field


# One request per entry the not-supported-yet list had (keyed (field, route)). While an entry is
# on the list, its sample is refused by name; once implemented, the same request is served (the
# features themselves are tested on the model: test_api_sampling.py).
SAMPLES = {
    ("presence_penalty", "chat"): {"presence_penalty": 0.5},
    ("frequency_penalty", "completions"): {"frequency_penalty": -1.0},
    ("repetition_penalty", "chat"): {"extra_body": {"repetition_penalty": 1.2}},
    ("logit_bias", "completions"): {"logit_bias": {"5": 10}},
    ("min_tokens", "chat"): {"extra_body": {"min_tokens": 2}},  # at most max_tokens (2)
    ("stop_token_ids", "completions"): {"extra_body": {"stop_token_ids": [5]}},
    ("skip_special_tokens", "chat"): {"extra_body": {"skip_special_tokens": False}},
    ("response_format", "chat"): {"response_format": {"type": "json_object"}},
    ("tool_choice", "chat"): {"tools": [WEATHER], "tool_choice": "required"},
    ("tools", "chat"): {
        "tools": [{**WEATHER, "function": {**WEATHER["function"], "strict": True}}]
    },
    ("top_logprobs", "chat"): {"logprobs": True, "top_logprobs": 2},
    ("logprobs", "completions"): {"logprobs": 2},
    ("echo", "completions"): {"echo": True, "logprobs": 0},
    ("max_tokens", "completions"): {"max_tokens": 0},
}


def _pending(field, route):
    return [p for p in NOT_SUPPORTED_YET if p.field == field and route in p.routes]


def test_every_pending_entry_has_a_sample_request():
    for p in NOT_SUPPORTED_YET:
        assert any((p.field, r) in SAMPLES for r in p.routes), p.field


@pytest.mark.parametrize(("field", "route"), list(SAMPLES))
def test_pending_features_are_refused_by_name_and_implemented_ones_served(client, field, route):
    kw = {"max_tokens": 2, **SAMPLES[(field, route)]}
    call = chat if route == "chat" else complete
    if _pending(field, route):
        err = refused(lambda: call(client, **kw), f"not supported yet: {field}")
        assert err["param"] == field
        return
    r = call(client, **kw)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r


@pytest.mark.parametrize(
    ("route", "kw", "param", "needle"),
    [
        ("completions", {"extra_body": {"stop_token_ids": [1000]}}, "stop_token_ids", "1000"),
        ("chat", {"logit_bias": {"4000": 1}}, "logit_bias", "4000"),
        ("chat", {"top_logprobs": 2}, "top_logprobs", "logprobs: true"),
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "json_schema.schema",
        ),
        (
            "chat",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                }
            },
            "response_format",
            "strin",
        ),
        (
            "chat",
            {"response_format": {"type": "json_object"}, "tools": [WEATHER],
             "tool_choice": "required"},
            "response_format",
            "cannot be combined",
        ),
        (
            "chat",
            {"tools": [{**WEATHER, "function": {**WEATHER["function"],
                                                "parameters": {"type": "objekt"}}}],
             "tool_choice": "required"},
            "tools",
            "objekt",
        ),
        ("chat", {"response_format": {"type": "json_object"}, "extra_body": {"ignore_eos": True}},
         "ignore_eos", "ignore_eos"),
        ("chat", {"response_format": {"type": "json_object"}, "extra_body": {"min_tokens": 2}},
         "min_tokens", "min_tokens"),
    ],
)  # fmt: skip
def test_sampling_fields_that_cannot_be_served_are_a_400_naming_them(
    client, route, kw, param, needle
):
    call = chat if route == "chat" else complete
    err = refused(lambda: call(client, max_tokens=2, **kw), needle)
    assert err["param"] == param


def test_neutral_values_are_accepted(client):
    r = chat(
        client,
        max_tokens=2,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        logprobs=True,
        top_logprobs=0,
        response_format={"type": "text"},
        user="alice",
        tools=[WEATHER],
        tool_choice="auto",
        parallel_tool_calls=True,
        extra_body={
            "repetition_penalty": 1.0,
            "min_tokens": 0,
            "stop_token_ids": [],
            "skip_special_tokens": True,
        },
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    r = complete(client, max_tokens=2, logprobs=0, presence_penalty=0)
    assert r.choices[0].logprobs.token_logprobs
    assert complete(client, max_tokens=2, echo=True).choices[0].text.startswith(words(3))


def test_consistency_errors_name_the_problem(client):
    refused(lambda: chat(client, max_tokens=2, tool_choice="required"), "needs tools")
    choice = {"type": "function", "function": {"name": "nope"}}
    refused(lambda: chat(client, max_tokens=2, tools=[WEATHER], tool_choice=choice), "'nope'")
    refused(lambda: chat(client, max_tokens=2, tools=[WEATHER, WEATHER]), "same name")
    both = {"continue_final_message": True, "add_generation_prompt": True}
    refused(lambda: chat(client, max_tokens=2, extra_body=both), "cannot both be true")
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    refused(
        lambda: chat(client, max_tokens=2, messages=[{"role": "user", "content": image}]),
        "'image_url': only text",
    )


def test_text_parts_are_joined_by_newlines(client):
    parts = [{"type": "text", "text": "w1 w2"}, {"type": "text", "text": "w3"}]
    base = client.base_url.copy_with(path="/tokenize")
    r = httpx.post(str(base), json={"messages": [{"role": "user", "content": parts}]})
    whole = httpx.post(str(base), json={"messages": [{"role": "user", "content": "w1 w2\nw3"}]})
    assert r.json()["tokens"] == whole.json()["tokens"]
