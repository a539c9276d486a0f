"""Requests the engine could only fail on are refused up front with a 400 that says, in the
request's terms, what is wrong; keys that could never authenticate are refused at load
(issue 23, items 3 and 6). Over the fake stack: no model needed."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tierserve.api.settings import ServerSettings
from tierserve.api.tenancy import TenantRegistry
from tierserve.config_file import ConfigFileError
from tierserve.grammar.engine import GrammarEngine
from tierserve.grammar.matchers import GrammarMatchers
from tierserve.grammar.spec import GrammarSpec
from tierserve.model.tokenizer import _BYTES, build_bpe_tokenizer

RECURSIVE = {
    "$ref": "#/$defs/n",
    "$defs": {
        "n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}
    },
}
TREE = {  # recursive, but a node may have no children: finite values exist
    "$ref": "#/$defs/n",
    "$defs": {
        "n": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "required": ["kids"],
        }
    },
}
WIDE = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"const": i}}} for i in range(5000)]}
INTERNALS = ("<state>", "<grammar>", "llguidance", "Parser:", "Error", "Recursion", "Undefined")


@pytest.fixture(scope="module")
def url():
    with running_server(fake_built()) as (u, _):
        yield u


def chat(url: str, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": words(3)}], "max_tokens": 3, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    for word in INTERNALS:
        assert word not in err["message"], err["message"]
    return err


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_with_no_finite_value_is_a_400_naming_why(url, stream):
    err = error(chat(url, response_format=schema_format(RECURSIVE), stream=stream))
    assert err["param"] == "response_format"
    assert "no finite value" in err["message"] and "#/$defs/n" in err["message"]


def test_an_anyof_past_the_limit_is_a_400_naming_the_limit(url):
    err = error(chat(url, response_format=schema_format(WIDE)))
    assert "5000 branches" in err["message"] and "at most 1000" in err["message"]


def test_a_recursive_schema_with_a_way_out_is_served(url):
    r = chat(url, response_format=schema_format(TREE))
    assert r.status_code == 200, r.text


def _tool(params: dict, strict: bool) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": params, "strict": strict}}


def test_a_strict_tools_schema_is_checked_and_a_free_ones_is_not(url):
    err = error(chat(url, tools=[_tool(RECURSIVE, strict=True)]))
    assert err["param"] == "tools" and "tools[0].function.parameters" in err["message"]
    # tool_choice auto, not strict: no grammar holds the call to it, so nothing to refuse.
    assert chat(url, tools=[_tool(RECURSIVE, strict=False)]).status_code == 200
    err = error(chat(url, tools=[_tool(WIDE, strict=False)], tool_choice="required"))
    assert "at most 1000" in err["message"]


def test_grammar_failures_while_generating_carry_no_engine_state():
    """What the API would refuse, forced through the engine: the error it reports is one
    line, without the parser's state or the grammar's text."""
    alphabet = sorted(_BYTES, key=_BYTES.get)  # byte-level BPE: one token per byte
    tk = build_bpe_tokenizer([*alphabet, "</s>"], [], [1] * 256 + [3], "gpt2")
    engine = GrammarEngine(tk.to_str(), [256], 257)
    matchers = GrammarMatchers(lambda: engine)
    wide = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"const": i}}, "required":
                      [f"k{i}"]} for i in range(2100)]}  # fmt: skip
    assert matchers.add("r", GrammarSpec.json_schema(wide), []) is None
    message = matchers.accept("r", tk.token_to_id("{"))
    assert message is not None and "\n" not in message
    assert "<state>" not in message and "non-verbose" not in message and "k2099" not in message


def test_deeply_nested_json_is_a_400_in_plain_words(url):
    body = '{"prompt": "w1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(
        f"{url}/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert "nested too deeply" in error(r)["message"]


def test_min_tokens_above_max_tokens_is_a_400(url):
    err = error(chat(url, max_tokens=2, min_tokens=5))
    assert err["param"] == "min_tokens" and "(5)" in err["message"] and "(2)" in err["message"]
    body = {"prompt": words(3), "max_tokens": 2, "min_tokens": 3}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert error(r)["param"] == "min_tokens"
    assert chat(url, max_tokens=3, min_tokens=3).status_code == 200


def test_a_chat_template_error_names_the_missing_field():
    template = "{% for m in messages %}{{ m['name'] + ': ' + m['content'] }} {% endfor %}"
    with running_server(fake_built(), ServerSettings(chat_template=template)) as (u, _):
        err = error(chat(u))
    assert err["param"] == "messages"
    assert "field 'name'" in err["message"] and "does not have" in err["message"]


# -- tenants and keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "problem"),
    [(" sk-a", "spaces"), ("sk-a\\t", "spaces"), ("sk-ä", "non-ASCII"), ("sk\\u0001a", "control")],
)
def test_tenant_keys_that_could_never_authenticate_are_refused_at_load(tmp_path, key, problem):
    path = tmp_path / "tenants.yaml"
    path.write_text(f'tenants:\n  acme:\n    keys: ["{key}"]\n', encoding="utf-8")
    with pytest.raises(ConfigFileError) as info:
        TenantRegistry.from_yaml(path)
    msg = str(info.value)
    assert "tenant 'acme'" in msg and problem in msg
    assert "sk-" not in msg and "sk\\u" not in msg  # the key is never echoed


def test_a_single_api_key_with_spaces_is_refused():
    with pytest.raises(ValueError, match="spaces"):
        TenantRegistry.single_key("sk-x ")


def test_keys_are_compared_in_constant_time(tmp_path, monkeypatch):
    import hmac

    from tierserve.api import tenancy

    seen, real = [], hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tenancy.hmac, "compare_digest", spy)
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  a: {keys: [sk-a1]}\n  b: {keys: [sk-b1, sk-b2]}\n")
    reg = TenantRegistry.from_yaml(path)
    assert reg.authenticate("Bearer sk-b2", None).name == "b"
    assert len(seen) == 3  # every key compared: no early exit that timing could reveal
    assert {a for a, _ in seen} == {b"sk-a1", b"sk-b1", b"sk-b2"}
    with pytest.raises(tenancy.AuthError):
        reg.authenticate("Bearer sk-b3", None)


def test_an_open_server_still_answers_json_errors_only(url):
    r = httpx.post(f"{url}/v1/completions", content=b"{", headers={"content-type": "x/y"})
    assert r.status_code == 400 and json.loads(r.text)["error"]


@pytest.mark.parametrize(
    ("schema", "refused"),
    [
        (RECURSIVE, True),
        (TREE, False),
        ({"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}, True),
        ({"type": ["object", "null"], "properties": {"me": {"$ref": "#"}},
          "required": ["me"]}, False),
        ({"$defs": {"a": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/a"}}},
          "$ref": "#/$defs/a"}, True),
        ({"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}},
          "$ref": "#/$defs/a"}, False),
        ({"type": "strin"}, False),  # not ours to judge: the engine names it (a 400 too)
        ({"anyOf": [{"type": "string"}] * 1001}, True),
    ],
)  # fmt: skip
def test_schema_limits_refuse_only_what_certainly_breaks(schema, refused):
    from tierserve.grammar.schema_check import SchemaLimitError, check_schema

    if refused:
        with pytest.raises(SchemaLimitError):
            check_schema(schema)
    else:
        check_schema(schema)
