"""The grammars that enforce tool calls (`grammar/tools.py`), run by the grammar engine over the
embedded model's tokenizer: what they accept and what they refuse, for `tool_choice` required
and named and for strict tools under `auto`, in both the JSON and the Hermes call formats."""

import json

import pytest

from tierserve.grammar.engine import GrammarEngine
from tierserve.grammar.tools import ToolDef, forced_calls, strict_auto, template_format

WEATHER = ToolDef(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "kelvin"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    strict=True,
)
TIME = ToolDef("get_time", None)  # no parameters schema: any object


@pytest.fixture(scope="module")
def engine():
    from tierserve.model.loader import load_model

    loaded = load_model()
    c = loaded.config
    return GrammarEngine(loaded.tokenizer.tokenizer.to_str(), list(c.eos_token_ids), c.vocab_size)


@pytest.fixture(scope="module")
def accepts(engine):
    from tierserve.model.loader import load_model

    tok = load_model().tokenizer

    def check(spec, text: str) -> bool:
        """Does the grammar allow `text` as a whole answer?"""
        m = engine.matcher(spec)
        ids = tok.encode(text, add_special_tokens=False)
        return m.consume_tokens(ids) and m.is_accepting()

    return check


def call(name, args) -> str:
    return json.dumps({"name": name, "arguments": args}, separators=(", ", ": "))


GOOD = call("get_weather", {"city": "Paris", "unit": "celsius"})
BAD_ARGS = call("get_weather", {"city": "Paris", "unit": "fahrenheit"})


def hermes(*calls: str) -> str:
    return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)


def test_template_format_follows_the_template_text():
    assert template_format("{{ '<tool_call>' }}") == "hermes"
    assert template_format("{{ tools | tojson }}") == "json"
    assert template_format(None) == "json"


def test_required_in_json_format(accepts):
    spec = forced_calls([WEATHER, TIME], "json", many=True)
    assert accepts(spec, f"[{GOOD}]")
    assert accepts(spec, f"[{GOOD}, {call('get_time', {'zone': 'UTC'})}]")
    assert not accepts(spec, "[]")  # at least one call
    assert not accepts(spec, f"[{BAD_ARGS}]")  # arguments follow the schema
    assert not accepts(spec, f"[{call('get_date', {})}]")  # only declared functions
    assert not accepts(spec, "The weather is fine.")
    one = forced_calls([WEATHER, TIME], "json", many=False)  # parallel_tool_calls false
    assert accepts(one, GOOD) and not accepts(one, f"[{GOOD}]")


def test_named_function_in_hermes_format(accepts):
    spec = forced_calls([WEATHER], "hermes", many=False)
    assert accepts(spec, hermes(GOOD))
    assert not accepts(spec, hermes(GOOD, GOOD))  # exactly one call
    assert not accepts(spec, hermes(call("get_time", {})))
    assert not accepts(spec, hermes(BAD_ARGS))
    assert not accepts(spec, GOOD)  # the call must be in its tags
    many = forced_calls([WEATHER, TIME], "hermes", many=True)
    assert accepts(many, hermes(GOOD, call("get_time", {"zone": "UTC"})))


def test_auto_with_a_strict_tool_allows_text_or_calls_with_valid_arguments(accepts):
    assert strict_auto([TIME], "json") is None  # nothing strict: nothing forced
    for fmt, wrap in (("json", lambda c: f"[{c}]"), ("hermes", hermes)):
        spec = strict_auto([WEATHER, TIME], fmt)
        assert accepts(spec, "It is sunny in Paris today."), fmt
        assert accepts(spec, wrap(GOOD)), fmt
        assert not accepts(spec, wrap(BAD_ARGS)), fmt  # the strict tool's schema holds
        assert accepts(spec, wrap(call("get_time", {"anything": [1, 2]}))), fmt  # not strict


# A tool schema as pydantic writes it (issue 23): nested models under `$defs`, and a recursive
# one. Embedded in a call's schema, its "#/$defs/..." pointers must still find their targets.
ORDER = ToolDef(
    "place_order",
    {
        "type": "object",
        "properties": {
            "item": {"$ref": "#/$defs/Item"},
            "folder": {"$ref": "#/$defs/Folder"},
        },
        "required": ["item", "folder"],
        "additionalProperties": False,
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
            "Folder": {
                "type": "object",
                "properties": {"sub": {"type": "array", "items": {"$ref": "#/$defs/Folder"}}},
                "required": ["sub"],
                "additionalProperties": False,
            },
        },
    },
    strict=True,
)
ORDER_OK = call("place_order", {"item": {"sku": "a1", "qty": 2}, "folder": {"sub": [{"sub": []}]}})
ORDER_BAD = call("place_order", {"item": {"sku": "a1", "qty": "two"}, "folder": {"sub": []}})


@pytest.mark.parametrize("fmt", ["json", "hermes"])
def test_tool_schemas_with_their_own_defs_keep_their_references(accepts, fmt):
    wrap = hermes if fmt == "hermes" else (lambda c: f"[{c}]")
    for spec in (forced_calls([ORDER, TIME], fmt, many=True), strict_auto([ORDER, TIME], fmt)):
        assert accepts(spec, wrap(ORDER_OK)), spec.source[:200]
        assert not accepts(spec, wrap(ORDER_BAD))
    one = forced_calls([ORDER], fmt, many=False)
    assert accepts(one, hermes(ORDER_OK) if fmt == "hermes" else ORDER_OK)
