"""The tool-call parser on strings: both formats, what is not a call, and the same answer
whether the text comes whole or in any chunks (streaming)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.chat.tool_parser import ParsedCall, ToolCallParser, parse_tool_calls

TOOLS = ["get_weather", "get_time"]


def args(call: ParsedCall) -> dict:
    return json.loads(call.arguments)


def test_hermes_call_alone_has_no_content():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, TOOLS)
    assert content is None
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_hermes_calls_with_text_around_them():
    text = (
        "Let me look both up.\n\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}</tool_call>\n'
    )
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "Let me look both up."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert args(calls[1]) == {"tz": "Europe/Oslo"}


def test_an_unclosed_last_call_counts_and_non_ascii_survives():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}'
    content, calls = parse_tool_calls(text, TOOLS)
    assert content is None and args(calls[0]) == {"city": "Zürich"}
    assert "Zürich" in calls[0].arguments  # not \\u-escaped


def test_arguments_given_as_a_json_string_are_an_object():
    text = '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>'
    _, calls = parse_tool_calls(text, TOOLS)
    assert args(calls[0]) == {"tz": "UTC"}


def test_plain_json_calls_in_the_llama_format():
    one = '  {"name": "get_weather", "parameters": {"city": "Rome"}}\n'
    content, calls = parse_tool_calls(one, TOOLS)
    assert content is None and args(calls[0]) == {"city": "Rome"}
    many = '```json\n[{"name": "get_weather", "arguments": {}}, {"name": "get_time"}]\n```'
    content, calls = parse_tool_calls(many, TOOLS)
    assert content is None and [(c.name, args(c)) for c in calls] == [
        ("get_weather", {}),
        ("get_time", {}),
    ]


def test_what_is_not_a_call_stays_text_unchanged():
    for text in [
        "Plain answer, no tools.",
        '{"name": "send_email", "arguments": {}}',  # not one of the tools
        '{"city": "Paris"}',  # JSON, but no call
        '[{"name": "get_time"}, {"name": "nope"}]',  # one of them is not a call
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # bad JSON
        '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>',  # not an object
        "Use <tool_call> tags to call",  # a tag, no call
        "",
    ]:
        assert parse_tool_calls(text, TOOLS) == (text, []), text


def test_without_tools_nothing_is_a_call():
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, []) == (text, [])


def _streamed(text: str, cuts: list[int]) -> tuple[str, list[ParsedCall]]:
    parser = ToolCallParser(TOOLS)
    events, start = [], 0
    for cut in [*sorted(cuts), len(text)]:
        events += parser.feed(text[start:cut])
        start = cut
    events += parser.finish()
    content = "".join(e for kind, e in events if kind == "content")
    return content, [e for kind, e in events if kind == "call"]


SAMPLES = [
    "Hello there! How can I help?\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Checking.\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>  ',
    '\n {"name": "get_weather", "parameters": {"city": "Rome"}}',
    '{"not": "a call"} and more',
    "a < b and <tool_ca is not a tag; <tool_call>{broken</tool_call> tail",
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SAMPLES), st.lists(st.integers(0, 120), max_size=12))
def test_streaming_in_any_chunks_gives_the_whole_texts_answer(text, cuts):
    cuts = [min(c, len(text)) for c in cuts]
    content, calls = _streamed(text, cuts)
    whole_content, whole_calls = parse_tool_calls(text, TOOLS)
    assert calls == whole_calls
    if calls:
        assert content.strip() == (whole_content or "")
    else:
        assert content == text  # every character said, in order


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.lists(st.integers(0, 60), max_size=8))
def test_any_text_without_calls_streams_back_exactly(text, cuts):
    content, calls = _streamed(text, [min(c, len(text)) for c in cuts])
    if not calls:
        assert content == text
