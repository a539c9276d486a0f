"""Issue 15's sampler features through the official `openai` client on the embedded model:
lm-eval-style scoring (echo + max_tokens 0 + prompt logprobs) against transformers, top-k
logprobs, logit_bias, min_tokens, stop_token_ids, skip_special_tokens, penalties, structured
output validated against its schema, and forced or strict tool calls."""

import json
from pathlib import Path

import openai
import pytest
import torch

from tests.server_utils import running_server, small_engine_args
from tierserve.api.settings import ServerSettings
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
EOS = 2
FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_ARGS}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 20}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]


@pytest.fixture(scope="module")
def built():
    return build_engine(small_engine_args())


@pytest.fixture(scope="module")
def served(built):
    with running_server(built) as (url, state):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0), state


@pytest.fixture(scope="module")
def client(served):
    return served[0]


def ask(text):
    return [{"role": "user", "content": text}]


def test_lm_eval_loglikelihood_matches_transformers(served):
    """What lm-evaluation-harness's `local-completions` does: context and continuation token
    ids joined, echo=True, logprobs=1, max_tokens=0; the continuation's logprob is the sum of
    its tokens' logprobs, and it is greedy if each is the top token."""
    from tierserve.bench.engine_bench import build_hf
    from tierserve.model.loader import load_model

    client, state = served
    tok = state.tokenizer
    pairs = [
        ("The capital of France is", " Paris"),
        ("Question: What is two plus two?\nAnswer:", " Four, of course."),
        ("def add(a, b):\n    return", " a + b"),
    ]
    prompts = [tok.encode(c) + tok.encode(x) for c, x in pairs]
    r = client.completions.create(
        model=MODEL, prompt=prompts, echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    loaded = load_model()
    hf = build_hf(loaded.config, loaded.state_dict())
    for (ctx, _), ids, choice in zip(pairs, prompts, r.choices, strict=True):
        n_ctx = len(tok.encode(ctx))
        lp = choice.logprobs
        assert choice.finish_reason == "length"
        assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
        got = sum(lp.token_logprobs[n_ctx:])
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        want = sum(ref[i - 1, ids[i]].item() for i in range(n_ctx, len(ids)))
        assert got == pytest.approx(want, abs=1e-3)
        greedy = all(ref[i - 1].argmax().item() == ids[i] for i in range(n_ctx, len(ids)))
        top = [max(d, key=d.get) for d in lp.top_logprobs[n_ctx:]]
        assert (top == lp.tokens[n_ctx:]) == greedy
    assert r.usage.completion_tokens == 0
    assert not state.engine.core.has_unfinished()


def test_scoring_streams_one_terminal_chunk_with_the_prompt_logprobs(client):
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="One two three four", echo=True, logprobs=2, max_tokens=0,
            stream=True,
        )
    )  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "length"
    lp = chunks[0].choices[0].logprobs
    assert chunks[0].choices[0].text == "One two three four"
    assert lp.tokens == ["One", " two", " three", " four"] and lp.token_logprobs[0] is None
    assert lp.text_offset == [0, 3, 7, 13]
    assert all(2 <= len(d) <= 3 for d in lp.top_logprobs[1:])


def test_chat_top_logprobs_are_the_models_top_k(client):
    r = client.chat.completions.create(
        model=MODEL, messages=ask("Name a fruit."), max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=4,
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    text = b"".join(bytes(c.bytes) for c in content)
    assert text.decode() == r.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 4
        lps = [t.logprob for t in c.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert c.top_logprobs[0].token == c.token  # greedy: the chosen token is the top one
        assert c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6)


def test_completions_top_logprobs_streamed_and_not_agree(client):
    kw = dict(model=MODEL, prompt="The sky is", max_tokens=5, temperature=0, logprobs=3)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, **kw))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == whole.logprobs.tokens
    for token, lp, top in zip(whole.logprobs.tokens, whole.logprobs.token_logprobs,
                              whole.logprobs.top_logprobs, strict=True):  # fmt: skip
        assert len(top) == 3 and top[token] == pytest.approx(lp, abs=1e-6)
    assert whole.logprobs.text_offset[0] == 0


def test_logit_bias_min_tokens_stop_token_ids_and_skip_special_tokens(served):
    client, state = served
    tok = state.tokenizer
    the = tok.encode(" the")[0]
    r = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logit_bias={str(the): 100}
    )
    assert r.choices[0].text == " the" * 4
    r = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=10, temperature=0,
        logit_bias={str(EOS): 100}, extra_body={"min_tokens": 3},
    )  # fmt: skip
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 4
    plain = client.completions.create(
        model=MODEL, prompt="Count: 1, 2,", max_tokens=8, temperature=0, logprobs=0
    )
    ids = [tok.encode(t)[0] for t in plain.choices[0].logprobs.tokens]
    cut = client.completions.create(
        model=MODEL, prompt="Count: 1, 2,", max_tokens=8, temperature=0,
        extra_body={"stop_token_ids": [ids[2]]},
    )  # fmt: skip
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens == ids.index(ids[2]) + 1
    start = tok.tokenizer.token_to_id("<|im_start|>")
    kw = dict(model=MODEL, prompt="Hi", max_tokens=2, temperature=0, logit_bias={str(start): 100})
    kept = client.completions.create(extra_body={"skip_special_tokens": False}, **kw)
    assert kept.choices[0].text == "<|im_start|>" * 2
    assert client.completions.create(**kw).choices[0].text == ""


def test_penalties_discourage_repetition(served):
    client, _state = served
    prompt = "Write the word cat again and again: cat cat cat cat"

    def tokens(**kw):
        r = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, logprobs=0,
            extra_body={"ignore_eos": True, **kw.pop("extra_body", {})}, **kw,
        )  # fmt: skip
        return r.choices[0].logprobs.tokens

    def most_repeated(toks):
        return max(toks.count(t) for t in toks)

    plain = tokens()
    assert most_repeated(plain) >= 12  # the model does repeat itself here
    for kw in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ):
        assert most_repeated(tokens(**kw)) < most_repeated(plain) / 2, kw


def test_response_format_json_schema_output_validates(client):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "genre": {"enum": ["fiction", "poetry", "history", "science"]},
            "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
            "authors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 30},
                        "born": {"type": "integer"},
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["title", "genre", "year", "authors"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "book", "schema": schema}}
    for kw in ({"temperature": 0}, {"temperature": 1.0, "seed": 11}):
        r = client.chat.completions.create(
            model=MODEL, messages=ask("Describe a famous book as JSON."), max_tokens=200,
            response_format=fmt, **kw,
        )  # fmt: skip
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    chunks = client.chat.completions.create(
        model=MODEL, messages=ask("Give the name and age of a person as a JSON object."),
        max_tokens=120, temperature=0, response_format={"type": "json_object"}, stream=True,
    )  # fmt: skip
    chunks = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)


def _check_calls(calls, names):
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        assert c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])


@pytest.fixture(scope="module")
def hermes_client():
    """A second server, on its own engine (two servers must not share one), that renders chats
    with a Hermes-style template: tool calls are `<tool_call>` blocks."""
    settings = ServerSettings(chat_template=str(FIXTURES / "hermes_tools.jinja"))
    with running_server(build_engine(small_engine_args()), settings) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("template", ["model", "hermes"])
def test_forced_tool_calls_are_parsed_into_tool_calls(request, template):
    client = request.getfixturevalue("client" if template == "model" else "hermes_client")
    msg = ask("What is the weather in Paris?")
    r = client.chat.completions.create(
        model=MODEL, messages=msg, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    _check_calls(choice.message.tool_calls, {"get_weather", "get_time"})
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(
        model=MODEL, messages=msg, tools=TOOLS, tool_choice=named, max_tokens=120,
        temperature=0.7, seed=1,
    )  # fmt: skip
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1
    _check_calls(calls, {"get_time"})
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    r = client.chat.completions.create(
        model=MODEL, messages=msg, tools=strict, max_tokens=120, temperature=0
    )
    choice = r.choices[0]
    if choice.message.tool_calls:  # auto: text or calls, strict calls follow their schema
        _check_calls(choice.message.tool_calls, {"get_weather", "get_time"})
    else:
        assert choice.message.content
